#include "cli/json_lines.hpp"

#include "io/posix.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <vector>

namespace chorus::cli {
namespace {

constexpr std::size_t chunk_size = 4u << 20;
static_assert(max_line_bytes % chunk_size == 0);

bool blank(const char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != ' ' && p[i] != '\r' && p[i] != '\t') return false;
  return true;
}

} // namespace

JsonLines read_json_lines(const std::string& path, const TakeLine& take) {
  JsonLines out;
  Error err;
  const int fd = io::detail::open_regular(path, O_RDONLY, err);
  if (fd < 0) {
    out.problem = err.message();
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
    const ssize_t got = ::read(fd, buf.data() + have, cap - have);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      out.problem = io::detail::os_error("cannot read", path, errno).message();
      break;
    }
    have += static_cast<std::size_t>(got);
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
      if (cap >= max_line_bytes) {
        out.problem = path + ": line " + std::to_string(number + 1) + " runs past " +
                      std::to_string(max_line_bytes >> 20) +
                      " MiB without a newline, far longer than a line chorus writes: the file is damaged or is not "
                      "a JSON-lines file. Move it aside (chorus recover rebuilds history.jsonl from the WAL)";
        break;
      }
      cap = std::min(cap * 2, max_line_bytes);
      buf.resize(cap + simdjson::SIMDJSON_PADDING);
    }
  }
  io::detail::close_fd(fd);
  return out;
}

std::string load_json_file(const std::string& path, simdjson::dom::parser& parser, simdjson::dom::element& doc) {
  std::string text;
  if (Error e = io::detail::read_text(path, text)) return e.message();
  if (auto e = parser.parse(text).get(doc))
    return path + " is not valid JSON (" + simdjson::error_message(e) + "): it is damaged, or was cut short while being written";
  return {};
}

} // namespace chorus::cli
