// JSON in the MLflow and W&B doubles (json.hpp).
#include "tests/upload/server/json.hpp"
#include "tests/upload/server/text.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace chorus::test::server {

using simdjson::dom::element_type;

void put_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (const char c : s) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        out += buf;
      } else {
        out.push_back(c);
      }
    }
  }
  out.push_back('"');
}

std::string json_quoted(std::string_view s) {
  std::string out;
  put_string(out, s);
  return out;
}

void refuse(int status, std::string code, std::string message) {
  throw Refusal{status, std::move(code), std::move(message)};
}
void invalid(std::string message) { refuse(400, "INVALID_PARAMETER_VALUE", std::move(message)); }

namespace {
constexpr std::string_view see_docs = " See the API docs for more information about request parameters.";
}

void missing(std::string_view param) {
  invalid("Missing value for required parameter '" + std::string(param) + "'." + std::string(see_docs));
}
void invalid_param(std::string_view param) {
  invalid("Invalid value for parameter '" + std::string(param) + "' supplied." + std::string(see_docs));
}

std::optional<element> member(simdjson::dom::object o, std::string_view key) {
  element e;
  if (o.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
  return e;
}

std::optional<std::string> optional_string(simdjson::dom::object o, std::string_view key) {
  const auto e = member(o, key);
  if (!e) return std::nullopt;
  std::string_view s;
  if (e->get_string().get(s) != simdjson::SUCCESS) invalid_param(key);
  return std::string(s);
}

std::string required_string(simdjson::dom::object o, std::string_view key, std::string_view path) {
  auto s = optional_string(o, key);
  if (!s || s->empty()) missing(path.empty() ? key : path);
  return *s;
}

std::optional<std::int64_t> as_int64(element e) {
  switch (e.type()) {
  case element_type::INT64: return checked(e.get_int64());
  case element_type::UINT64: {
    const std::uint64_t v = checked(e.get_uint64());
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(v);
  }
  case element_type::DOUBLE: {
    const double d = checked(e.get_double());
    if (d != std::floor(d) || d < -9.2e18 || d > 9.2e18) return std::nullopt;
    return static_cast<std::int64_t>(d);
  }
  case element_type::STRING: return parse_int(checked(e.get_string()));
  default: return std::nullopt;
  }
}

std::optional<std::int64_t> optional_int(simdjson::dom::object o, std::string_view key) {
  const auto e = member(o, key);
  if (!e) return std::nullopt;
  const auto v = as_int64(*e);
  if (!v) invalid_param(key);
  return v;
}

std::optional<simdjson::dom::array> optional_array(simdjson::dom::object o, std::string_view key) {
  const auto e = member(o, key);
  if (!e) return std::nullopt;
  simdjson::dom::array a;
  if (e->get_array().get(a) != simdjson::SUCCESS) invalid_param(key);
  return a;
}

} // namespace chorus::test::server
