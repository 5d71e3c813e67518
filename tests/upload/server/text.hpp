// Text helpers of the tracking server's parts: case, blanks, integers,
// percent-encoding (paths and queries) and base64 (Basic credentials, MLflow
// page tokens, W&B run ids).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::test::server {

std::string lower(std::string_view s);
/// The whole of `s` as a decimal integer, or nothing.
std::optional<std::int64_t> parse_int(std::string_view s);
/// Without its leading and trailing spaces and tabs.
std::string_view trim(std::string_view s);
/// %XX decoded (a malformed escape kept as it is); '+' as a space where `plus_is_space` (queries).
std::string percent_decode(std::string_view s, bool plus_is_space);
/// Every byte but letters, digits, "-._~" and '/' as %XX: a path, its slashes kept.
std::string percent_encode_path(std::string_view s);
std::string base64_encode(std::string_view in);
/// Nothing if `in` holds a character outside the alphabet.
std::optional<std::string> base64_decode(std::string_view in);

} // namespace chorus::test::server
