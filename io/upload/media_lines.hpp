// media.jsonl's lines as the upload backends take them (docs/UPLOADS.md,
// "Images, text and tables"): each read through store::read_media_line, and
// shown under one column for the whole run.
#pragma once

#include "io/store/histogram_log.hpp"
#include "io/store/media_log.hpp"
#include "io/upload/upload.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <optional>
#include <string>
#include <vector>

namespace chorus::upload {

/// The column a media line goes under: its key in a run of one rank, else
/// `key/rank-N`. The histograms' rule (HistogramLine::column), decided by
/// the run's ranks, never by which of them logged the key so far: so a
/// media's name is the same whenever it is sent, and sending it again
/// replaces it.
[[nodiscard]] inline std::string media_column(const store::MediaLine& m, std::int64_t world_size) {
  store::HistogramLine named;
  named.key = m.key;
  if (world_size > 1) named.rank = m.rank;
  return named.column();
}

/// Line `i` of the Batch's media, read; where it cannot be, nothing, and
/// the refused.jsonl line saying why is added to `refused`.
[[nodiscard]] inline std::optional<store::MediaLine> read_media(simdjson::dom::parser& parser, const Batch& b, std::size_t i,
                                                         std::vector<std::string>& refused) {
  const std::string_view text = b.media[i];
  simdjson::dom::element doc;
  Result<store::MediaLine> line = Error(Errc::invalid_argument, "a media.jsonl line that is not JSON");
  if (parser.parse(text.data(), text.size()).get(doc) == simdjson::SUCCESS) line = store::read_media_line(doc);
  if (line) return *line;
  std::string why = "{\"part\":\"media\",\"line\":" + std::to_string(b.media_from.lines + i) + ",\"why\":";
  core::append_json_string(why, line.error().message());
  refused.push_back(why + "}");
  return std::nullopt;
}

/// The refused.jsonl line of a media left out, and why.
[[nodiscard]] inline std::string refused_media(const store::MediaLine& m, std::string_view why) {
  std::string out = "{\"part\":\"media\",\"step\":" + std::to_string(m.step) + ",\"path\":";
  core::append_json_string(out, m.path);
  out += ",\"why\":";
  core::append_json_string(out, why);
  return out + "}";
}

} // namespace chorus::upload
