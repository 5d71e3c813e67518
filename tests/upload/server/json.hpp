// JSON in the MLflow and W&B doubles: string literals written, request
// members read as protobuf's JSON mapping reads them, and the Refusal that a
// bad request throws. Validation unwinds to its API's entry point, which
// renders the Refusal in that API's error shape.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace chorus::test::server {

using simdjson::dom::element;

// ------------------------------------------------------------ writing

/// Appends a JSON string literal for `s` (UTF-8 passes through; control characters are escaped).
void put_string(std::string& out, std::string_view s);
std::string json_quoted(std::string_view s);

// ------------------------------------------------------------ refusals

/// A request the server refuses.
struct Refusal {
  int status = 400;
  std::string code = "INVALID_PARAMETER_VALUE";
  std::string message;
};

[[noreturn]] void refuse(int status, std::string code, std::string message);
/// 400 INVALID_PARAMETER_VALUE.
[[noreturn]] void invalid(std::string message);
/// MLflow's words for a required parameter left out, and for one of the wrong type.
[[noreturn]] void missing(std::string_view param);
[[noreturn]] void invalid_param(std::string_view param);

// ------------------------------------------------------------ reading

/// One connection's parsers, reused from request to request.
struct Parsers {
  simdjson::dom::parser doc;   // the request body
  simdjson::dom::parser inner; // JSON held in its strings (config, history lines, page tokens)
};

/// A member, or nothing when it is absent or null.
std::optional<element> member(simdjson::dom::object o, std::string_view key);
std::optional<std::string> optional_string(simdjson::dom::object o, std::string_view key);
/// A required string: absent, null or "" is missing (as protobuf's empty
/// default reads); `path` names it in the refusal (`key` if empty).
std::string required_string(simdjson::dom::object o, std::string_view key, std::string_view path = {});
/// A 64-bit integer as protobuf's JSON reads one: a number with no fraction,
/// or a string holding one.
std::optional<std::int64_t> as_int64(element e);
std::optional<std::int64_t> optional_int(simdjson::dom::object o, std::string_view key);
/// A JSON array member: nothing when absent or null.
std::optional<simdjson::dom::array> optional_array(simdjson::dom::object o, std::string_view key);

/// The value of a simdjson result whose type was checked already.
template <class T>
T checked(simdjson::simdjson_result<T> r) {
  T v{};
  if (std::move(r).get(v) != simdjson::SUCCESS) return T{};
  return v;
}

} // namespace chorus::test::server
