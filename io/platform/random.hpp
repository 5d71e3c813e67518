// Secrets from the kernel's random source.
#pragma once

#include "runtime/core/result.hpp"

#include <cstddef>
#include <string>
#include <string_view>

namespace chorus::platform {

/// Fills `out` with `bytes` random bytes from getrandom(2); the error names
/// `what` was being made.
[[nodiscard]] Error random_bytes(void* out, std::size_t bytes, std::string_view what);

/// `bytes` random bytes from getrandom(2), as 2 * bytes lowercase hex
/// digits; the error names `what` was being made.
[[nodiscard]] Result<std::string> random_hex(std::size_t bytes, std::string_view what);

} // namespace chorus::platform
