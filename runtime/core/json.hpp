// JSON output that is always valid, whatever the input: strings are escaped
// and their invalid UTF-8 replaced, and non-finite numbers become the strings
// "NaN", "Infinity" and "-Infinity" (the spellings MLflow and W&B accept).
#pragma once

#include <chorus/chorus.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace chorus::core {

/// True if `s` is well-formed UTF-8: no overlong forms, no surrogates,
/// nothing above U+10FFFF, no truncated sequence.
[[nodiscard]] bool valid_utf8(std::string_view s) noexcept;

/// Appends `s` as a quoted JSON string: `"` `\` and control characters
/// escaped, each maximal invalid UTF-8 subsequence replaced by U+FFFD.
void append_json_string(std::string& out, std::string_view s);

/// Appends `v` as JSON: the shortest text that reads back as the same double,
/// or a string for NaN and the infinities.
void append_json_number(std::string& out, double v);

/// Appends `v` as a JSON integer.
void append_json_int(std::string& out, std::int64_t v);

/// Appends unix or run-relative microseconds as seconds, exactly (no binary
/// rounding): "1700000000.25", "12.000001", "3".
void append_json_seconds(std::string& out, std::int64_t us);

/// Writes JSON into a std::string, placing the commas itself. Calls must nest
/// properly (a key before each value inside an object); the writer does not
/// check this in release builds.
class JsonWriter {
public:
  explicit JsonWriter(std::string& out) noexcept : out_(out) {}

  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  JsonWriter& key(std::string_view k);

  JsonWriter& string(std::string_view s);
  JsonWriter& number(double v);
  JsonWriter& integer(std::int64_t v);
  JsonWriter& uinteger(std::uint64_t v);
  /// Microseconds as seconds (append_json_seconds).
  JsonWriter& seconds(std::int64_t us);
  JsonWriter& boolean(bool b);
  JsonWriter& null();
  /// A value that is already JSON text (the caller vouches for it).
  JsonWriter& raw(std::string_view json);
  /// A config or summary value: null, bool, integer, number or string.
  JsonWriter& value(const Value& v);

  /// key(k) followed by the value.
  JsonWriter& field(std::string_view k, const Value& v) { return key(k).value(v); }

  [[nodiscard]] std::string& out() noexcept { return out_; }

private:
  template <class I>
  JsonWriter& whole(I v);
  void separate() {
    if (after_key_)
      after_key_ = false;
    else if (need_comma_)
      out_.push_back(',');
  }
  JsonWriter& open(char c) {
    separate();
    out_.push_back(c);
    need_comma_ = false;
    return *this;
  }
  JsonWriter& close(char c) {
    out_.push_back(c);
    need_comma_ = true;
    return *this;
  }

  std::string& out_;
  bool need_comma_ = false;
  bool after_key_ = false;
};

/// `{"key": value, ...}` for config and summary fields, as one JSON object.
[[nodiscard]] std::string fields_to_json(std::span<const Field> fields);

} // namespace chorus::core
