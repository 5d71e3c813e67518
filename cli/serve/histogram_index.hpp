// A run's histograms.jsonl indexed for `chorus serve`: per histogram column
// (`key`, or `key/rank-N`), per step, the figures a distributions chart
// draws (seven quantiles, the counts of values, NaN and infinities) and where
// the step's line lies in the file. The buckets themselves are not kept: a
// step's are read back from its line when they are asked for, and re-binned
// for drawing. Lines are read through store::read_histogram_line, the format's
// one reader; a line it refuses is skipped and counted.
//
// The index grows with the file: each refresh reads the complete lines
// appended since the last one, at most `step_bytes` of them, so that no
// request waits on a long file: one opened for the first time is read over
// several refreshes (IndexState::indexing says so meanwhile).
#pragma once

#include "cli/serve/followed_file.hpp"
#include "cli/serve/lines_index.hpp"
#include "io/store/histogram_log.hpp"
#include "runtime/core/json.hpp"

#include <chorus/chorus.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

namespace chorus::cli::serve {

/// What a histogram chart asks for: a column, how many of its steps at the
/// most (spread evenly over them, the first and the last among them; 0: none),
/// and the step whose buckets it draws (the last where unset; else the last
/// step of the column at or before it, or its first) in at most `bins` bins.
struct HistogramRequest {
  std::string column;
  std::size_t points = 500;
  std::optional<std::int64_t> step;
  std::size_t bins = 60;
};

/// The buckets of `h` (its finite values) merged into `bins` bins for
/// drawing (one where all its values are one): the range from its smallest
/// to its largest value cut into `bins` equal parts, each bucket put whole
/// into the part that holds its middle, so that no count is split. A cut
/// that a bucket lies across moves onto the bucket's edge, so that each bin
/// holds its buckets whole; the bins tile the range, an empty part a bin of
/// 0. The counts add up to h.finite_count().
[[nodiscard]] std::vector<Histogram::Bucket> rebin(const Histogram& h, std::size_t bins);

class HistogramIndex {
public:
  /// The quantiles kept per step: p0 (the smallest), p5, p25, p50, p75, p95, p100 (the largest).
  static constexpr std::array<double, 7> quantiles{0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0};
  static constexpr std::array<const char*, 7> quantile_names{"p0", "p5", "p25", "p50", "p75", "p95", "p100"};
  /// The most one refresh reads.
  static constexpr std::uint64_t step_bytes = 64u << 20;

  explicit HistogramIndex(std::string path, std::uint64_t step_bytes_ = step_bytes);
  HistogramIndex(const HistogramIndex&) = delete;
  HistogramIndex& operator=(const HistogramIndex&) = delete;

  /// Takes in the complete lines appended since the last call (at most
  /// step_bytes of them); starts over where the file was replaced or cut.
  /// Returns whether anything changed.
  bool refresh();

  /// `rows`: lines taken; `keys`: columns; `indexing`: the file is longer
  /// than what was read of it (the next refresh reads on).
  [[nodiscard]] IndexState state() const;
  /// Writes the columns as a JSON array, sorted by key, the merged column
  /// first: column, key, rank (null: merged), steps, first and last step.
  void columns_json(core::JsonWriter& w) const;
  /// Writes the answer to `r` into the object `w` is in (docs/DASHBOARD.md,
  /// /api/histograms); false, with nothing written, where the file has no
  /// such column; an error where the chosen step's line could not be read back.
  [[nodiscard]] Result<bool> column_json(const HistogramRequest& r, core::JsonWriter& w) const;
  /// The bytes the index holds.
  [[nodiscard]] std::size_t memory() const;

private:
  /// One step of a column.
  struct Point {
    std::int64_t step = 0;
    double wall = 0, rel = 0;
    std::uint64_t offset = 0; // the line's first byte in the file
    std::uint32_t length = 0; // its bytes, the newline left out
    std::uint32_t ranks = 0;  // `_count`: ranks merged (0: one rank's own)
    std::uint64_t count = 0, nan = 0, inf = 0, ninf = 0;
    std::array<double, quantiles.size()> q{};
  };
  struct Column {
    std::string key;
    std::optional<int> rank;
    std::vector<Point> points;
  };

  /// Reads a point's line back from the file.
  [[nodiscard]] Result<store::HistogramLine> line_at(const Point& p, const std::string& column, simdjson::dom::parser& parser,
                                                  std::string& text) const;

  FollowedFile file_;
  const std::string path_;
  const std::uint64_t step_bytes_;
  mutable std::shared_mutex mutex_;
  std::map<std::string, Column, std::less<>> columns_;
  std::size_t points_ = 0;
};

} // namespace chorus::cli::serve
