// A run's history.jsonl read as one series per key, streamed and downsampled
// as it is read: memory grows with the number of keys, not of rows.
#pragma once

#include "runtime/core/result.hpp"

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::cli {

/// Consecutive points of one key, folded together.
struct Bucket {
  std::int64_t step_lo = 0, step_hi = 0;
  double min = 0, max = 0, sum = 0, last = 0;
  std::uint64_t n = 0;
};

/// What a series' x stands for: the row's _step, or the time into the run
/// (its _runtime, kept in milliseconds).
enum class XAxis { step, time };

/// An x value as an axis label reads: "1200" (a step), "95.5s", "4m 02s".
[[nodiscard]] std::string x_text(std::int64_t x, XAxis axis);
/// What follows the last label of an axis: "_step", "into the run".
[[nodiscard]] std::string_view x_unit(XAxis axis);

class Series {
public:
  /// Buckets kept at most; past it, neighbours are merged pairwise.
  static constexpr std::size_t max_buckets = 1024;

  explicit Series(std::string key, XAxis x = XAxis::step) : key_(std::move(key)), x_(x) {}

  void add(std::int64_t step, double v);

  [[nodiscard]] const std::string& key() const noexcept { return key_; }
  [[nodiscard]] XAxis x_axis() const noexcept { return x_; }
  [[nodiscard]] const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  [[nodiscard]] std::uint64_t points() const noexcept { return points_; } // finite ones
  [[nodiscard]] std::uint64_t nans() const noexcept { return nans_; }
  [[nodiscard]] std::uint64_t infs() const noexcept { return infs_; }
  [[nodiscard]] double min() const noexcept { return min_; }
  [[nodiscard]] double max() const noexcept { return max_; }
  [[nodiscard]] double last() const noexcept { return last_; }
  [[nodiscard]] std::int64_t first_step() const noexcept { return first_step_; }
  [[nodiscard]] std::int64_t last_step() const noexcept { return last_step_; }
  /// A per-rank column (`key/rank-N`), as opposed to a plain or reduced key.
  [[nodiscard]] bool per_rank() const;

private:
  std::string key_;
  XAxis x_;
  std::vector<Bucket> buckets_;
  std::uint64_t per_bucket_ = 1;
  std::uint64_t points_ = 0, nans_ = 0, infs_ = 0;
  double min_ = 0, max_ = 0, last_ = 0;
  std::int64_t first_step_ = 0, last_step_ = 0;
};

struct History {
  std::vector<Series> series; // in the order keys first appear
  std::uint64_t rows = 0;
  std::uint64_t bad_lines = 0; // not a JSON object with a numeric _step
  std::string first_bad;       // what was wrong with the first of them
  Error problem;               // the file could not be read
};

/// A per-rank column (`key/rank-N`), as opposed to a plain or reduced key.
[[nodiscard]] bool per_rank_key(std::string_view key);

/// A row's own bookkeeping, not a key the user logged: _step, _timestamp, _runtime.
[[nodiscard]] inline bool bookkeeping_key(std::string_view key) {
  return key == "_step" || key == "_timestamp" || key == "_runtime";
}

/// Which keys to take: null takes every key.
using KeyFilter = std::function<bool(std::string_view)>;

/// The keys `--metric` picks, a key taken where any pattern takes it:
///  - a pattern with `*`, `?` or `[` is a glob over the whole key (`*`
///    crosses `/`: `train/*` takes `train/loss/rank-3`);
///  - `/REGEX/` is a POSIX extended regular expression found anywhere in the key;
///  - any other names a key, and its per-rank columns (`loss`: `loss`,
///    `loss/rank-0`, ...).
/// Null (every key) when none is given; an error for a regular expression
/// that does not compile, or an empty pattern.
[[nodiscard]] Result<KeyFilter> metric_filter(const std::vector<std::string>& metrics);

/// Whether each of `keys` gets a chart, at most `charts` of them: every key
/// while they fit (or when they were picked with --metric), else the plain
/// and reduced keys first; the rest get a sparkline or a mention.
std::vector<bool> chart_choice(const std::vector<std::string_view>& keys, std::size_t charts, bool picked);

/// TensorBoard's smoothing of one series: each value becomes the exponential
/// moving average of the series up to it, weight `weight` (0 to below 1) on
/// the past, debiased so that the first values are not pulled towards 0.
/// NaN and infinities pass as they are and leave the average alone.
class Smoothing {
public:
  explicit Smoothing(double weight = 0) : w_(weight) {}
  double operator()(double v) {
    if (w_ <= 0 || !std::isfinite(v)) return v;
    last_ = last_ * w_ + (1 - w_) * v;
    debias_ *= w_;
    return last_ / (1 - debias_);
  }

private:
  double w_;
  double last_ = 0, debias_ = 1; // debias_: w^n after n values
};

/// How a history is read into series.
struct HistoryShape {
  XAxis x = XAxis::step;
  /// TensorBoard's smoothing, 0 (none) to below 1: each point becomes the
  /// exponential moving average of its series up to it, weight `smooth` on
  /// the past, debiased (the first points are not pulled towards 0).
  double smooth = 0;
};

/// Streams `path`. Keys starting with `_` are bookkeeping and skipped; a value
/// is a number or one of "NaN", "Infinity", "-Infinity". `wanted(key)` is
/// asked once per key; the others are not kept. A last line without its
/// newline (being written right now) is left out. With XAxis::time a row
/// without a numeric _runtime is a bad line.
History read_history(const std::string& path, const std::function<bool(std::string_view)>& wanted,
                     const HistoryShape& shape = {});

} // namespace chorus::cli
