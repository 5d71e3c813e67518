// A JSON-lines file (history.jsonl, system.jsonl) read as a stream, one line
// parsed at a time whatever the file's length: the one checked path the
// sections of `chorus show` read their lines through.
#pragma once

#include "io/store/line_reader.hpp"
#include "runtime/core/result.hpp"

#include <simdjson.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace chorus::store {

struct JsonLines {
  std::uint64_t used = 0;     // lines handed over and taken
  std::uint64_t skipped = 0;  // complete lines not taken: not JSON, or refused
  std::uint64_t not_json = 0; // of them, not a JSON object
  std::uint64_t first_skipped_line = 0; // the first of them (lines count from 1)
  std::string first_skipped_why;        // "TAPE_ERROR: ...", "no _step"
  bool unfinished = false;    // the last line lacks its newline: being written, or its writer stopped mid-line
  Error problem;              // the file could not be read, or was cut off at a line too long
                              // (line_too_long: the lines after it are not read): why
};

/// Hands each complete line of `path` that is a JSON object to `take`, which
/// returns why it refuses it, or nothing. Blank lines are passed over; an
/// unfinished last line is left out. `path` is opened as a regular file only
/// (platform::open_regular): a link or a FIFO there is a problem.
using TakeLine = std::function<std::string_view(const simdjson::dom::object&)>;
JsonLines read_json_lines(const std::string& path, const TakeLine& take);

/// Parses the JSON file `path` (run.json, config.json, summary.json) with
/// `parser` (which holds the document), read through platform::read_text:
/// a regular file only, at most platform::run_file_max_bytes. An error
/// names the path.
[[nodiscard]] Result<simdjson::dom::element> load_json_file(const std::string& path, simdjson::dom::parser& parser);

} // namespace chorus::store
