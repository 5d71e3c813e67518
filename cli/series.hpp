// A run's history.jsonl read as one series per key, streamed and downsampled
// as it is read: memory grows with the number of keys, not of rows.
#pragma once

#include "runtime/core/result.hpp"

#include <fnmatch.h>
#include <regex.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
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
  std::uint64_t bad_lines = 0; // not a JSON object, or no row (store::HistoryRow)
  std::string first_bad;       // what was wrong with the first of them
  Error problem;               // the file could not be read
};

/// A per-rank column (`key/rank-N`), as opposed to a plain or reduced key.
[[nodiscard]] bool per_rank_key(std::string_view key);
/// The key a per-rank column is of (`loss` of `loss/rank-3`), whose
/// declaration it follows; any other key itself.
[[nodiscard]] std::string_view base_key(std::string_view key);

/// Which keys to take: null takes every key.
using KeyFilter = std::function<bool(std::string_view)>;

/// The keys `--metric` picks, a key taken where any pattern takes it:
///  - a pattern with `*`, `?` or `[` is a glob over the whole key (`*`
///    crosses `/`: `train/*` takes `train/loss/rank-3`);
///  - `/REGEX/` is a POSIX extended regular expression found anywhere in the key;
///  - any other names a key, and its per-rank columns (`loss`: `loss`,
///    `loss/rank-0`, ...).
/// Null (every key) when none is given; an error for a regular expression
/// that does not compile, or an empty pattern, naming the patterns as
/// `what` ("--metric"; the Python reader's `keys`).
/// Defined here, inline, because the Python package's reader (python/reader.cpp)
/// picks keys by the same rules and does not link the command's code.
[[nodiscard]] inline Result<KeyFilter> metric_filter(const std::vector<std::string>& metrics,
                                                     std::string_view what = "--metric") {
  if (metrics.empty()) return KeyFilter();
  struct Pattern {
    enum class Kind { name, glob, regex } kind;
    std::string text;
    std::shared_ptr<regex_t> re; // POSIX extended
  };
  const auto refuse = [&](const std::string& why) {
    std::string msg(what);
    return Error(Errc::invalid_argument, msg.append(why));
  };
  std::vector<Pattern> patterns;
  for (const std::string& m : metrics) {
    if (m.empty()) return refuse(" takes a key, a glob (train/*) or /REGEX/, not an empty word");
    if (m.size() >= 2 && m.front() == '/' && m.back() == '/') {
      auto compiled = std::make_unique<regex_t>();
      const std::string expr = m.substr(1, m.size() - 2);
      if (const int rc = ::regcomp(compiled.get(), expr.c_str(), REG_EXTENDED | REG_NOSUB); rc != 0) {
        char why[256];
        ::regerror(rc, compiled.get(), why, sizeof why);
        std::string msg = " ";
        msg.append(m).append(" is no regular expression (").append(why);
        msg.append("): write /REGEX/ as a POSIX extended one (/^val/, /loss|acc/), or a glob such as train/*");
        return refuse(msg);
      }
      // Compiled: freed with regfree from here on.
      std::shared_ptr<regex_t> re(compiled.release(), [](regex_t* r) {
        ::regfree(r);
        delete r;
      });
      patterns.push_back({Pattern::Kind::regex, m, std::move(re)});
    } else if (m.find_first_of("*?[") != std::string::npos) {
      patterns.push_back({Pattern::Kind::glob, m, {}});
    } else {
      patterns.push_back({Pattern::Kind::name, m, {}});
    }
  }
  return KeyFilter([patterns = std::move(patterns)](std::string_view key) {
    const std::string k(key);
    for (const Pattern& p : patterns) {
      switch (p.kind) {
      case Pattern::Kind::name:
        if (key == p.text || (key.starts_with(p.text) && key.substr(p.text.size()).starts_with("/rank-"))) return true;
        break;
      case Pattern::Kind::glob:
        if (::fnmatch(p.text.c_str(), k.c_str(), 0) == 0) return true;
        break;
      case Pattern::Kind::regex:
        if (::regexec(p.re.get(), k.c_str(), 0, nullptr, 0) == 0) return true;
        break;
      }
    }
    return false;
  });
}

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

/// Streams `path`, each line read as a row by store::HistoryRow (which passes
/// over the keys starting with `_`; a value is a number or one of "NaN",
/// "Infinity", "-Infinity"). `wanted(key)` is
/// asked once per key; the others are not kept. A last line without its
/// newline (being written right now) is left out. With XAxis::time a row
/// without a numeric _runtime is a bad line.
History read_history(const std::string& path, const std::function<bool(std::string_view)>& wanted,
                     const HistoryShape& shape = {});

} // namespace chorus::cli
