#include "io/store/json_lines.hpp"

#include "io/platform/posix.hpp"
#include "io/store/line_reader.hpp"

#include <algorithm>
#include <fcntl.h>

namespace chorus::store {
namespace {

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\r' || c == '\t'; });
}

} // namespace

JsonLines read_json_lines(const std::string& path, const TakeLine& take) {
  JsonLines out;
  const Result<int> fd = platform::open_regular(path, O_RDONLY);
  if (!fd) {
    out.problem = fd.error();
    return out;
  }
  LineReader lines(*fd, path, {}, {.chunk = 4u << 20, .max_line = max_line_bytes});
  simdjson::dom::parser parser;
  auto skip = [&](std::string_view why) {
    if (out.skipped++ > 0) return;
    out.first_skipped_line = lines.cursor().lines;
    out.first_skipped_why = why;
  };
  for (std::string_view line;;) {
    switch (lines.next(line)) {
    case LineReader::Next::line: break;
    case LineReader::Next::end: out.unfinished = !blank(lines.rest()); return out;
    case LineReader::Next::too_long: // the lines after it are not read (store::line_too_long)
    case LineReader::Next::failed: out.problem = lines.error(); return out;
    }
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
    if (line.empty()) continue;
    // The line is followed by LineReader::padding readable bytes: parsed in place.
    simdjson::dom::object obj;
    if (auto e = parser.parse(line.data(), line.size(), false).get(obj)) {
      ++out.not_json;
      skip(simdjson::error_message(e));
      continue;
    }
    if (std::string_view why = take(obj); !why.empty()) {
      skip(why);
      continue;
    }
    ++out.used;
  }
}

Result<simdjson::dom::element> load_json_file(const std::string& path, simdjson::dom::parser& parser) {
  const Result<std::string> text = platform::read_text(path);
  if (!text) return text.error();
  simdjson::dom::element doc;
  if (auto e = parser.parse(*text).get(doc))
    return Error(Errc::io_error, path + " is not valid JSON (" + simdjson::error_message(e) +
                                     "): it is damaged, or was cut short while being written");
  return doc;
}

} // namespace chorus::store
