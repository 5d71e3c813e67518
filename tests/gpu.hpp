// GPU tests (ctest label `gpu`) skip, rather than fail, where the machine has
// no device: the test prints why and exits with 77, which ctest reports as
// "Skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace chorus::test {

inline constexpr int skip_exit_code = 77;

/// Ends the test program as skipped, saying why.
[[noreturn]] inline void skip_test(std::string_view why) {
  std::fprintf(stderr, "SKIPPED: %.*s\n", static_cast<int>(why.size()), why.data());
  std::fflush(nullptr);
  std::_Exit(skip_exit_code);
}

} // namespace chorus::test
