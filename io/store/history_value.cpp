// A history value as a number: see io/store/history_value.hpp.
#include "io/store/history_value.hpp"

#include <limits>
#include <string_view>

namespace chorus::store {

std::optional<double> metric_value(const simdjson::dom::element& value) {
  double v = 0;
  if (value.get(v) == simdjson::SUCCESS) return v; // a double, or a whole number
  std::string_view s;
  if (value.get(s) != simdjson::SUCCESS) return std::nullopt;
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (s == "Infinity") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

} // namespace chorus::store
