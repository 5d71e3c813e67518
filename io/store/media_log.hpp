// media.jsonl and media/: the run's images, text and tables (Run::log_image,
// log_text, log_table; README, "Images, text and tables"). Its one owner:
// the RunWriter writes each file under media/ and then its line with
// append_media_line, from the WAL (so `chorus recover` rebuilds both, and a
// line never names a file that is not there); every reader reads the lines
// with read_media_line.
//
//   {"_step":3,"_timestamp":1700000000.25,"_runtime":12.5,"key":"samples","rank":0,"kind":"image",
//    "format":"png","path":"media/samples-1a2b3c4d/3-rank0.png","size":5123,"caption":"a cat",
//    "width":64,"height":48}
//
// `rank` is the rank that logged it (readers show a key that one rank logs
// under its plain name); `path` is relative to the run directory; `width`
// and `height` are an image's only.
#pragma once

#include <chorus/chorus.hpp>
#include "runtime/core/media.hpp"
#include "runtime/core/result.hpp"

#include <simdjson.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace chorus::store {

/// Where the run directory keeps the media of `key` from `rank` at `step`:
/// media/<the key, its characters other than letters, digits, '.', '-',
/// '_' made '_'>-<8 hex digits of its hash>/<step>-rank<rank>.<ext>.
[[nodiscard]] std::string media_path(std::string_view key, int rank, std::int64_t step, std::string_view ext);

/// Appends one line (with its newline) to `out`.
void append_media_line(std::string& out, std::int64_t step, std::int64_t ts_us, std::int64_t runtime_us,
                       std::string_view key, int rank, const chorus::core::Media& m, std::string_view path);

/// One line read back. Views point into the parsed document.
struct MediaLine {
  std::int64_t step = 0;
  double timestamp = 0;
  double runtime = 0;
  std::string_view key;
  int rank = 0;
  std::string_view kind;   // "image", "text", "table"
  std::string_view format; // "png", "jpeg", "md", "json"
  std::string_view path;   // relative to the run directory
  std::uint64_t size = 0;
  std::string_view caption;
  std::uint32_t width = 0, height = 0;
};

/// Reads one parsed line; an error names what is wrong with it (a path
/// outside media/ among them).
[[nodiscard]] Result<MediaLine> read_media_line(const simdjson::dom::element& line);

} // namespace chorus::store
