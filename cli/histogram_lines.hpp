// histograms.jsonl and media.jsonl read as a stream, each line through its
// one reader (store::read_histogram_line, store::read_media_line): the path
// `chorus show`, `chorus export` and the Python reader take. Inline, because
// the Python package's reader (python/reader.cpp) reads through it and links
// io/store/json_lines.cpp only.
#pragma once

#include "io/store/histogram_log.hpp"
#include "io/store/json_lines.hpp"
#include "io/store/media_log.hpp"

#include <string>
#include <string_view>
#include <utility>

namespace chorus::cli {

/// Hands each line of the JSON-lines file at `path` that the store's reader
/// `read` (store::read_histogram_line, store::read_media_line) reads to
/// `take(line&)` (its value may be moved from); a line that is no JSON
/// object, or that `read` refuses, is skipped and counted in the result, the
/// first with its words (JsonLines::first_skipped_why).
template <class Read, class Take>
store::JsonLines read_store_lines(const std::string& path, Read&& read, Take&& take) {
  std::string why; // read_json_lines copies the words of the first refusal before the next line
  return store::read_json_lines(path, [&](const simdjson::dom::object& line) -> std::string_view {
    // An empty JSON pointer is the object itself, as the element the reader takes.
    auto r = read(line.at_pointer("").value_unsafe());
    if (!r) return why = r.error().message();
    take(*r);
    return {};
  });
}

/// histograms.jsonl's lines, each through store::read_histogram_line.
template <class Take>
store::JsonLines read_histogram_lines(const std::string& path, Take&& take) {
  return read_store_lines(path, [](const simdjson::dom::element& e) { return store::read_histogram_line(e); },
                          std::forward<Take>(take));
}

/// media.jsonl's lines, each through store::read_media_line.
template <class Take>
store::JsonLines read_media_lines(const std::string& path, Take&& take) {
  return read_store_lines(path, [](const simdjson::dom::element& e) { return store::read_media_line(e); },
                          std::forward<Take>(take));
}

} // namespace chorus::cli
