// What the parts of `chorus serve`'s line index share, and nothing outside
// them includes: small helpers, the reading of one line as a row (RowReader,
// which adds the index's own keys, or reads a few keys only), the overview read while a long file is
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
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
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

/// Where `pieces` pieces of [from, end) of the file start, each just after a
/// newline at about equal distances, and `end` last (fewer pieces where the
/// lines are long); none where the file cannot be read so.
std::vector<std::uint64_t> piece_starts(const std::string& path, std::uint64_t from, std::uint64_t end,
                                        unsigned pieces);

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

  /// Reads `line` (its end trimmed, not empty, in a buffer with
  /// simdjson's padding after it): why it is no row (the parser's words,
  /// or store::HistoryRow's), or "". `value(key, v, place)` gets each
  /// value; `place` is its place among the line's values (npos for the
  /// added keys).
  template <class F>
  std::string_view read(std::string_view line, std::uint64_t row_number, F&& value) {
    simdjson::dom::object row;
    if (auto e = parser_.parse(line.data(), line.size(), false).get(row)) return simdjson::error_message(e);
    if (kind_ == FileKind::system) {
      const auto each = [&](auto&& metric, auto&&) {
        for (const store::RowValue& v : store::RowValues(row)) metric(v.key, v.value);
      };
      take(0, row_number, seconds(row, "_timestamp"), seconds(row, "_runtime"), each, value);
      return {};
    }
    const store::HistoryRow r(row);
    if (!r) return r.why();
    const auto each = [&](auto&& metric, auto&& count) {
      r.each([&](const store::RowValue& v) { metric(v.key, v.value); },
             [&](const store::RowValue& n) { count(n.key, n.value); });
    };
    take(r.step(), row_number, r.timestamp(), r.runtime(), each, value);
    return {};
  }

  /// Whether read_only() can read `keys`: metric keys only (not the keys
  /// the index adds, nor any other starting with '_').
  [[nodiscard]] static bool only_metrics(const std::vector<std::string_view>& keys) {
    return std::none_of(keys.begin(), keys.end(), [](std::string_view k) { return k.empty() || store::reserved_key(k); });
  }

  /// read() for a few metric keys (only_metrics) of a line: their values
  /// alone are converted, the others passed over unread (simdjson's On
  /// Demand), so a long file is read for a chart's keys several times
  /// faster. The line's _step and times are read as HistoryRow reads them;
  /// a value passed over is not checked, so a damaged line that read()
  /// refuses may give its wanted values here. `value(key, v)` gets each
  /// value of a key in `keys`.
  template <class F>
  std::string_view read_only(std::string_view line, std::uint64_t row_number, const std::vector<std::string_view>& keys,
                             F&& value) {
    using namespace simdjson;
    ondemand::document doc;
    ondemand::object row;
    if (auto e = on_demand_.iterate(line.data(), line.size(), line.size() + SIMDJSON_PADDING).get(doc))
      return error_message(e);
    if (auto e = doc.get_object().get(row)) return error_message(e);
    const bool history = kind_ != FileKind::system;
    bool stepped = false, timed = false, ran = false;
    std::optional<double> timestamp, runtime;
    std::int64_t row_step = 0;
    found_.clear();
    // A key written with an escape may read as a wanted one: where the line has no backslash, none is.
    const bool escapes = std::memchr(line.data(), '\\', line.size()) != nullptr;
    for (auto member : row) {
      ondemand::field field;
      if (auto e = std::move(member).get(field)) return error_message(e);
      // The key as written, compared without unescaping it: a key written
      // with escapes (which no wanted key is) is still unescaped.
      const ondemand::raw_json_string raw = field.key();
      std::string_view key;
      if (const char* k = raw.raw(); *k == '_' && !escapes) {
        // A row's own field, or another reserved key, passed over.
        const auto own = std::find_if(std::begin(own_fields), std::end(own_fields),
                                      [&](std::string_view x) { return raw.unsafe_is_equal(x); });
        if (own == std::end(own_fields)) continue;
        key = *own;
      } else if (*k != '_' && *k != '"') {
        const auto w = std::find_if(keys.begin(), keys.end(), [&](std::string_view x) { return raw.unsafe_is_equal(x); });
        if (w == keys.end()) {
          bool plain = true;
          if (escapes)
            for (; *k != '"'; ++k) plain = plain && *k != '\\';
          if (plain) continue; // no key wanted
        } else {
          key = *w;
        }
      }
      if (key.empty() && field.unescaped_key().get(key) != SUCCESS) return error_message(STRING_ERROR);
      ondemand::value& v = field.value();
      if (!store::reserved_key(key)) {
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
        std::optional<double> m;
        if (auto e = metric(v, m)) return error_message(e);
        if (m) found_.emplace_back(key, *m);
      } else if (key == "_step") {
        if (stepped || !history) continue; // the first, as HistoryRow reads it
        stepped = true;
        // The common case, the number parsed once: a whole number within 63 bits.
        if (ondemand::number n{}; v.get_number().get(n) == SUCCESS &&
                                  n.get_number_type() == ondemand::number_type::signed_integer) {
          row_step = n.get_int64();
          if (row_step > store::HistoryRow::max_step) return "a _step above 9223372036854775806";
          if (row_step < 0) return "a _step below 0";
          continue;
        }
        ondemand::json_type t{};
        bool whole = false;
        if (v.type().get(t) != SUCCESS || t != ondemand::json_type::number) return "a _step that is not a number";
        if (v.is_integer().get(whole) != SUCCESS || !whole) return "a _step not written as a whole number";
        if (v.get_int64().get(row_step) != SUCCESS || row_step > store::HistoryRow::max_step)
          return "a _step above 9223372036854775806";
        if (row_step < 0) return "a _step below 0";
      } else if (key == "_timestamp" || key == "_runtime") {
        bool& seen = key == "_timestamp" ? timed : ran;
        if (seen) continue; // the first, as HistoryRow reads it
        seen = true;
        // A number (else nothing), read and checked as a metric's value is.
        ondemand::json_type t{};
        std::optional<double> s;
        if (auto e = v.type().get(t)) return error_message(e);
        if (auto e = metric(v, s)) return error_message(e);
        if (t == ondemand::json_type::number) (key == "_timestamp" ? timestamp : runtime) = s;
      }
    }
    if (line.back() != '}') return error_message(TRAILING_CONTENT);
    if (history && !stepped) return "no _step";
    const auto each = [&](auto&& metric, auto&&) {
      for (const auto& [k, v] : found_) metric(k, v);
    };
    take(row_step, row_number, timestamp, runtime, each, [&](std::string_view k, double v, std::size_t place) {
      if (place != std::string_view::npos) value(k, v);
    });
    return {};
  }

private:
  [[nodiscard]] static std::optional<double> seconds(const simdjson::dom::object& row, std::string_view key) {
    double v = 0;
    if (row[key].get_double().get(v) != simdjson::SUCCESS) return std::nullopt;
    return v;
  }

  /// The row's step and times, and its values with the keys the index
  /// adds; `each(metric, count)` walks its values and counts.
  template <class Each, class F>
  void take(std::int64_t row_step, std::uint64_t row_number, std::optional<double> timestamp,
            std::optional<double> runtime, Each&& each, F&& value) {
    const auto finite = [](std::optional<double> s) { return s && std::isfinite(*s) ? *s : lines::nan_v; };
    wall = finite(timestamp);
    rel = finite(runtime);
    std::size_t place = 0;
    if (kind_ == FileKind::system) {
      step = static_cast<std::int64_t>(row_number);
      each([&](std::string_view key, double v) { value(key, v, place++); }, [](std::string_view, double) {});
      return;
    }
    step = row_step;
    ranks_.clear();
    double fewest = lines::nan_v;
    each(
        [&](std::string_view key, double v) {
          value(key, v, place++);
          if (const std::int64_t k = lines::rank_of(key);
              k >= 0 && std::find(ranks_.begin(), ranks_.end(), k) == ranks_.end())
            ranks_.push_back(k);
        },
        [&](std::string_view key, double n) {
          if (uncounted_ && std::binary_search(uncounted_->begin(), uncounted_->end(), key, std::less<>())) return;
          if (!(n >= fewest)) fewest = n;
        });
    if (!std::isnan(fewest)) value(std::string_view("_count/min"), fewest, std::string_view::npos);
    value(std::string_view("_step"), static_cast<double>(step), std::string_view::npos);
    std::sort(ranks_.begin(), ranks_.end());
    for (const std::int64_t k : ranks_) {
      name_ = "_progress/rank-" + std::to_string(k);
      value(std::string_view(name_), static_cast<double>(step), std::string_view::npos);
    }
  }

  /// A value as store::metric_value reads it (`out`: a number, or "NaN",
  /// "Infinity", "-Infinity"; nothing for any other value), or why it
  /// cannot be read (a number or string the DOM refuses: the line is no row).
  [[nodiscard]] static simdjson::error_code metric(simdjson::ondemand::value& v, std::optional<double>& out) {
    using namespace simdjson;
    out.reset();
    ondemand::json_type t{};
    if (auto e = v.type().get(t)) return e;
    switch (t) {
    case ondemand::json_type::number: {
      // As the DOM holds it: a whole number as an integer (-0 is 0), within
      // 64 bits; the number parsed once.
      ondemand::number n{};
      if (auto e = v.get_number().get(n)) return e;
      switch (n.get_number_type()) {
      case ondemand::number_type::signed_integer: out = static_cast<double>(n.get_int64()); break;
      case ondemand::number_type::unsigned_integer: out = static_cast<double>(n.get_uint64()); break;
      default: out = n.get_double();
      }
      return SUCCESS;
    }
    case ondemand::json_type::string: {
      std::string_view s;
      if (auto e = v.get_string().get(s)) return e;
      if (s == "NaN") out = std::numeric_limits<double>::quiet_NaN();
      if (s == "Infinity") out = std::numeric_limits<double>::infinity();
      if (s == "-Infinity") out = -std::numeric_limits<double>::infinity();
      return SUCCESS;
    }
    case ondemand::json_type::boolean: {
      bool b = false;
      return v.get_bool().get(b);
    }
    default: return SUCCESS;
    }
  }

  /// A row's own fields that read_only() reads.
  static constexpr std::string_view own_fields[] = {"_step", "_timestamp", "_runtime"};

  FileKind kind_;
  const std::vector<std::string>* uncounted_;
  simdjson::dom::parser parser_;
  simdjson::ondemand::parser on_demand_;
  std::vector<std::pair<std::string_view, double>> found_;
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

  /// Takes in what `later` collected of the points that follow this one's,
  /// as if they had been added here in turn.
  void merge(Collector&& later);
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
