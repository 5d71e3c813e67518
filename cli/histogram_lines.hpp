// histograms.jsonl read as a stream, each line through its one reader
// (io::read_histogram_line): the path `chorus show`, `chorus export` and the
// Python reader take. Inline, because the Python package's reader
// (python/reader.cpp) reads through it and links cli/json_lines.cpp only.
#pragma once

#include "cli/json_lines.hpp"
#include "io/store/histogram_log.hpp"

#include <string>
#include <string_view>

namespace chorus::cli {

/// Hands each line of the histograms.jsonl at `path` that
/// io::read_histogram_line reads to `take(io::HistogramLine&)` (its value may
/// be moved from); a line
/// that is no JSON object, or that it refuses, is skipped and counted in the
/// result, the first with its words (JsonLines::first_skipped_why).
template <class Take>
JsonLines read_histogram_lines(const std::string& path, Take&& take) {
  std::string why; // read_json_lines copies the words of the first refusal before the next line
  return read_json_lines(path, [&](const simdjson::dom::object& line) -> std::string_view {
    // An empty JSON pointer is the object itself, as the element the reader takes.
    Result<io::HistogramLine> h = io::read_histogram_line(line.at_pointer("").value_unsafe());
    if (!h) return why = h.error().message();
    take(*h);
    return {};
  });
}

} // namespace chorus::cli
