// Files for tests and benchmarks: a fresh directory that goes away with the
// test, and a whole file read back.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>

namespace chorus::test {

/// A fresh directory under $TMPDIR (or /tmp), removed with what is in it at
/// the end of its scope, unless CHORUS_KEEP_TEST_DIRS is set (to look at
/// what a failed test left).
class TempDir {
public:
  explicit TempDir(std::string_view prefix = "chorus-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (std::getenv("CHORUS_KEEP_TEST_DIRS") == nullptr) std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  [[nodiscard]] std::string str() const { return path.string(); }
  /// The path of `name` in it, as a string.
  [[nodiscard]] std::string operator/(std::string_view name) const { return (path / name).string(); }

  std::filesystem::path path;
};

/// The whole file at `path` (empty if it cannot be read).
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace chorus::test
