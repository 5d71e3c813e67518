// histograms.jsonl: the run's committed histograms, one a line, in step
// order (Run::log_histogram; README, "Histograms"). Its one owner: the
// RunWriter writes its lines with append_histogram_line, and every reader
// (the CLI, the dashboard, the export, the upload backends, Python) reads
// them with read_histogram_line.
//
//   {"_step":3,"_timestamp":1700000000.25,"_runtime":12.5,"key":"grad","rank":null,"_count":4,
//    "count":4000,"sum":1.5,"min":-0.2,"max":0.3,"nan":0,"inf":0,"-inf":0,
//    "buckets":[[-1234,7],[0,2],[15000,40],...]}
//
// `rank` is null for a merged histogram (`_count` ranks merged) or a run of
// one rank, else the rank whose column (`key/rank-N`) it is. `buckets`
// holds the non-empty buckets as [index, count], ascending, in
// chorus::Histogram's layout (Histogram::bucket_bounds gives an index's
// bounds). `min` and `max` are null when no value was finite; `sum` may be
// "Infinity" where finite values overflowed.
#pragma once

#include <chorus/chorus.hpp>
#include "runtime/core/result.hpp"

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::store {

/// Appends one line (with its newline) to `out`.
void append_histogram_line(std::string& out, std::int64_t step, std::int64_t ts_us, std::int64_t runtime_us,
                           std::string_view key, std::int32_t rank, std::uint32_t ranks, const Histogram& h);

/// One line read back. Views point into the parsed document.
struct HistogramLine {
  std::int64_t step = 0;
  double timestamp = 0;
  double runtime = 0;
  std::string_view key;
  std::optional<int> rank;  // nothing: merged, or the run's one rank
  std::uint32_t ranks = 0;  // merged from this many ranks (0: one rank's own)
  Histogram value;

  /// The column it is: `key`, or `key/rank-N`.
  [[nodiscard]] std::string column() const;
};

/// Reads one parsed line; an error names what is wrong with it.
[[nodiscard]] Result<HistogramLine> read_histogram_line(const simdjson::dom::element& line);

} // namespace chorus::store
