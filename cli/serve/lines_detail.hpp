// What the parts of `chorus serve`'s line index share, and nothing outside
// them includes: small helpers, the reading of one line as a row (RowReader,
// which adds the index's own keys), the overview read while a long file is
// indexed in the background (Overview), and the downsampling of one key's
// points for a chart (Collector, cli/serve/lines_collector.cpp). The index
// itself is in lines_index.cpp, the reading of the file in lines_read.cpp,
// and the answers in lines_series.cpp.
#pragma once

#include "cli/serve/lines_index.hpp"
#include "io/store/history_row.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::cli::serve::lines {

inline constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();

/// Whether `s` is only spaces, tabs and '\r'.
[[nodiscard]] inline bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\r' || c == '\t'; });
}

/// N of a per-rank column `key/rank-N`, or -1.
[[nodiscard]] inline std::int64_t rank_of(std::string_view key) {
  const auto at = key.rfind("/rank-");
  if (at == std::string_view::npos || at + 6 >= key.size()) return -1;
  std::int64_t n = 0;
  for (std::size_t i = at + 6; i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9' || n > 100'000'000) return -1;
    n = n * 10 + (key[i] - '0');
  }
  return n;
}

[[nodiscard]] inline double number_or_nan(const simdjson::dom::object& row, std::string_view key) {
  double v = 0;
  if (row[key].get_double().get(v) != simdjson::SUCCESS || !std::isfinite(v)) return nan_v;
  return v;
}

/// Room for one more element in `v`, grown by a quarter rather than doubled:
/// the index of a long run grows by little once it is read.
template <class V>
void room(V& v) {
  if (v.size() == v.capacity()) v.reserve(v.size() + v.size() / 4 + 64);
}

/// Empties `v` and gives its memory back (assigning {} keeps the capacity).
template <class V>
void release(V& v) {
  V().swap(v);
}

/// A number of an answer: whole numbers as integers, the rest as JSON numbers.
void put_number(std::string& out, double v);

/// Reads from `fd` into `buf` the bytes [at, at + n), fewer at the end of the file.
std::string_view read_at(int fd, std::uint64_t at, std::size_t n, std::string& buf);

} // namespace chorus::cli::serve::lines

namespace chorus::cli::serve {

/// One line's object read as a row: its step and times, and its values by
/// key, with the keys the index adds: `_step` (the step, a run's progress),
/// `_count/min` (the fewest ranks behind a reduced value of the row, the
/// keys declared `first` left out: one rank's value by design) and
/// `_progress/rank-N` (the step, on rows where rank N has a per-rank value).
class LinesIndex::RowReader {
public:
  /// `uncounted`: sorted keys that `_count/min` leaves out (none where null).
  explicit RowReader(FileKind kind, const std::vector<std::string>* uncounted = nullptr)
      : kind_(kind), uncounted_(uncounted && !uncounted->empty() ? uncounted : nullptr) {}

  std::int64_t step = 0;
  double wall = lines::nan_v, rel = lines::nan_v;

  /// Why the object is no row (store::HistoryRow), or "". `value(key, v,
  /// place)` gets each value; `place` is its place among the line's values
  /// (npos for the added keys).
  template <class F>
  std::string_view read(const simdjson::dom::object& row, std::uint64_t row_number, F&& value) {
    if (kind_ == FileKind::system) {
      step = static_cast<std::int64_t>(row_number);
      wall = lines::number_or_nan(row, "_timestamp");
      rel = lines::number_or_nan(row, "_runtime");
      std::size_t place = 0;
      for (const store::RowValue& v : store::RowValues(row)) value(v.key, v.value, place++);
      return {};
    }
    const store::HistoryRow r(row);
    if (!r) return r.why();
    step = r.step();
    wall = r.timestamp().value_or(lines::nan_v);
    rel = r.runtime().value_or(lines::nan_v);
    ranks_.clear();
    std::size_t place = 0;
    double fewest = lines::nan_v;
    r.each(
        [&](const store::RowValue& v) {
          value(v.key, v.value, place++);
          if (const std::int64_t k = lines::rank_of(v.key);
              k >= 0 && std::find(ranks_.begin(), ranks_.end(), k) == ranks_.end())
            ranks_.push_back(k);
        },
        [&](const store::RowValue& n) {
          if (uncounted_ && std::binary_search(uncounted_->begin(), uncounted_->end(), n.key, std::less<>()))
            return;
          if (!(n.value >= fewest)) fewest = n.value;
        });
    if (!std::isnan(fewest)) value(std::string_view("_count/min"), fewest, std::string_view::npos);
    value(std::string_view("_step"), static_cast<double>(step), std::string_view::npos);
    std::sort(ranks_.begin(), ranks_.end());
    for (const std::int64_t k : ranks_) {
      name_ = "_progress/rank-" + std::to_string(k);
      value(std::string_view(name_), static_cast<double>(step), std::string_view::npos);
    }
    return {};
  }

private:
  FileKind kind_;
  const std::vector<std::string>* uncounted_;
  std::vector<std::int64_t> ranks_;
  std::string name_;
};

/// The lines an overview read: each line's start, its step and times, and
/// per key the lines that have a finite value of it, and those that have a
/// NaN or an infinity.
struct LinesIndex::Overview {
  struct Line {
    std::uint64_t byte = 0;
    std::int64_t step = 0;
    double wall = lines::nan_v, rel = lines::nan_v;
    [[nodiscard]] double x(XAxis a) const {
      return a == XAxis::step ? static_cast<double>(step) : a == XAxis::wall ? wall : rel;
    }
  };
  struct Series {
    std::string name;
    std::vector<std::pair<std::uint32_t, double>> points;    // (line, value)
    std::vector<std::pair<std::uint32_t, double>> nonfinite; // (line, NaN or an infinity)
  };
  std::vector<Line> lines;
  std::vector<Series> keys;
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> by_name;
  std::uint64_t end = 0;  // the bytes of complete lines the file held
  std::uint64_t rows = 0; // the rows it holds, estimated from the lines' lengths
  bool unfinished = false;

  [[nodiscard]] double scale() const {
    return lines.empty() ? 0 : static_cast<double>(rows) / static_cast<double>(lines.size());
  }
  [[nodiscard]] std::size_t memory() const {
    std::size_t n = lines.capacity() * sizeof(Line);
    for (const Series& k : keys) n += k.name.capacity() * 2 + (k.points.capacity() + k.nonfinite.capacity()) * 16 + 64;
    return n;
  }
};

/// The points of one key that a request draws, within [lo, hi]: kept as
/// they are while there are at most two a pixel, else the smallest and
/// largest of each of width - 1 buckets, and the range's first and last
/// point (at most two points a pixel in all). Its NaN and infinities are
/// marked apart: the first x of each kind in each pixel.
class LinesIndex::Collector {
public:
  Collector(double lo, double hi, std::size_t width)
      : lo_(lo), hi_(hi), width_(std::max<std::size_t>(width, 1)) {}

  /// A finite point.
  void add(double x, double v);
  /// A point that may be the range's first or last, counted elsewhere
  /// (where the index's blocks stand for the points in between).
  void edge(double x, double v);
  /// Hands this one's first point (`first`), or its last, to `to` as an edge.
  void edge_to(Collector& to, bool first) const;
  /// A NaN or an infinity at x.
  void mark(double x, double v);
  /// Where blocks stand in for the points: how many there are.
  void count(std::uint64_t n) { counted_ = n; }
  [[nodiscard]] std::uint64_t n() const { return counted_ ? counted_ : n_; }

  /// Appends `{"n":..,"full":..,"x":[..],"y":[..]` and, where the range has
  /// any NaN or infinity, `,"nonfinite":{"nan":[x..],"inf":[x..],"-inf":[x..]}`
  /// (a kind only where it has some); the object is left open.
  void json(std::string& out);

private:
  struct Pt {
    double x, v;
  };
  struct Bucket {
    Pt lo{}, hi{};
    std::uint64_t n = 0;
  };
  /// Which of `parts` even parts of [lo, hi] x falls in.
  [[nodiscard]] std::size_t part_of(double x, std::size_t parts) const;
  /// How many buckets the points are put in once there are more than two a pixel.
  [[nodiscard]] std::size_t buckets() const;
  void bucket();
  void put(double x, double v);

  double lo_, hi_;
  std::size_t width_;
  std::uint64_t n_ = 0, counted_ = 0;
  std::vector<Pt> points_;
  std::vector<Bucket> buckets_;
  bool edged_ = false;
  Pt first_{}, last_{};
  std::vector<double> marks_[3]; // NaN, +Inf, -Inf: per pixel the first x of one (NaN: none); empty until one
};

} // namespace chorus::cli::serve
