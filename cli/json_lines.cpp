#include "cli/json_lines.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace chorus::cli {
namespace {

constexpr std::size_t chunk_size = 4u << 20;

bool blank(const char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != ' ' && p[i] != '\r' && p[i] != '\t') return false;
  return true;
}

} // namespace

JsonLines read_json_lines(const std::string& path, const TakeLine& take) {
  JsonLines out;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    out.problem = path + ": " + std::strerror(errno);
    return out;
  }
  simdjson::dom::parser parser;
  std::uint64_t number = 0;
  auto skip = [&](std::string_view why) {
    if (out.skipped++ > 0) return;
    out.first_skipped_line = number;
    out.first_skipped_why = why;
  };
  // `p` is followed by simdjson::SIMDJSON_PADDING readable bytes: the buffer has them past its end.
  auto line = [&](const char* p, std::size_t n) {
    ++number;
    while (n > 0 && (p[n - 1] == '\r' || p[n - 1] == ' ')) --n;
    if (n == 0) return;
    simdjson::dom::object obj;
    if (auto e = parser.parse(p, n, false).get(obj)) {
      ++out.not_json;
      return skip(simdjson::error_message(e));
    }
    if (std::string_view why = take(obj); !why.empty()) return skip(why);
    ++out.used;
  };
  std::vector<char> buf(chunk_size + simdjson::SIMDJSON_PADDING);
  std::size_t cap = chunk_size, have = 0;
  for (;;) {
    const std::size_t got = std::fread(buf.data() + have, 1, cap - have, f);
    have += got;
    std::size_t start = 0;
    for (const char* nl; (nl = static_cast<const char*>(std::memchr(buf.data() + start, '\n', have - start)));) {
      const auto end = static_cast<std::size_t>(nl - buf.data());
      line(buf.data() + start, end - start);
      start = end + 1;
    }
    if (got == 0) { // what is left has no newline yet
      out.unfinished = !blank(buf.data() + start, have - start);
      break;
    }
    std::memmove(buf.data(), buf.data() + start, have - start);
    have -= start;
    if (have == cap) { // one line longer than the buffer
      cap *= 2;
      buf.resize(cap + simdjson::SIMDJSON_PADDING);
    }
  }
  if (std::ferror(f)) out.problem = path + ": read error";
  std::fclose(f);
  return out;
}

} // namespace chorus::cli
