// A history row: see io/store/history_row.hpp.
#include "io/store/history_row.hpp"

namespace chorus::store {
namespace {

/// Why `row`'s _step is not a step, or "" with `step` set.
std::string_view read_step(const simdjson::dom::object& row, std::int64_t& step) {
  simdjson::dom::element e;
  if (row["_step"].get(e) != simdjson::SUCCESS) return "no _step";
  switch (e.type()) {
  case simdjson::dom::element_type::INT64: {
    const std::int64_t s = e.get_int64().value_unsafe();
    if (s < 0) return "a _step below 0";
    if (s > HistoryRow::max_step) return "a _step above 9223372036854775806";
    step = s;
    return {};
  }
  case simdjson::dom::element_type::UINT64: return "a _step above 9223372036854775806";
  case simdjson::dom::element_type::DOUBLE: return "a _step not written as a whole number";
  default: return "a _step that is not a number";
  }
}

} // namespace

HistoryRow::HistoryRow(const simdjson::dom::object& row) noexcept : row_(row) {
  why_ = read_step(row, step_);
}

RowValues HistoryRow::counts() const noexcept {
  simdjson::dom::object counts;
  if (row_["_count"].get(counts) != simdjson::SUCCESS) return {};
  return {counts, true};
}

std::optional<double> HistoryRow::count(std::string_view key) const noexcept {
  double n = 0;
  if (key.empty() || reserved_key(key) || row_["_count"][key].get_double().get(n) != simdjson::SUCCESS)
    return std::nullopt;
  return n;
}

std::optional<double> HistoryRow::seconds(std::string_view key) const noexcept {
  double s = 0;
  if (row_[key].get_double().get(s) != simdjson::SUCCESS) return std::nullopt;
  return s;
}

RowValues line_values(const simdjson::dom::object& line, bool history) noexcept {
  if (!history) return RowValues(line);
  const HistoryRow row(line);
  return row ? row.metrics() : RowValues();
}

} // namespace chorus::store
