// Files in tests: writing one, and reading back a file's mode, bytes and lines.
#pragma once

#include "tests/temp_dir.hpp"

#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace chorus::test::files {

using chorus::test::slurp;
using chorus::test::TempDir;

/// The permission bits of `path` (0600, 0700, ...); throws if there is none.
inline unsigned mode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("no " + path);
  return st.st_mode & 07777;
}

/// Replaces `path` with `content`.
inline void spit(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

/// `n` bytes that are the same for a `seed` and compress badly.
inline std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

inline std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

} // namespace chorus::test::files
