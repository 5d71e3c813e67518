#include "cli/serve/lines_index.hpp"

#include "cli/json_lines.hpp"
#include "io/platform/posix.hpp"
#include "io/store/history_row.hpp"
#include "io/store/line_reader.hpp"
#include "io/upload/tensorboard_run.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <fcntl.h>
#include <limits>
#include <mutex>
#include <cstring>
#include <memory>
#include <sys/stat.h>
#include <thread>

namespace chorus::cli::serve {
namespace {

constexpr double nan_v = std::numeric_limits<double>::quiet_NaN();
constexpr std::uint64_t never_overview = std::numeric_limits<std::uint64_t>::max();

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\r' || c == '\t'; });
}

/// N of a per-rank column `key/rank-N`, or -1.
std::int64_t rank_of(std::string_view key) {
  const auto at = key.rfind("/rank-");
  if (at == std::string_view::npos || at + 6 >= key.size()) return -1;
  std::int64_t n = 0;
  for (std::size_t i = at + 6; i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9' || n > 100'000'000) return -1;
    n = n * 10 + (key[i] - '0');
  }
  return n;
}

double number_or_nan(const simdjson::dom::object& row, std::string_view key) {
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

void put_number(std::string& out, double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 0x1p53) {
    out += std::to_string(static_cast<std::int64_t>(v));
    return;
  }
  io::append_json_number(out, v);
}

} // namespace

std::string_view trim_line_end(std::string_view line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  return line;
}

std::optional<XAxis> parse_x_axis(std::string_view s) {
  if (s == "step") return XAxis::step;
  if (s == "wall") return XAxis::wall;
  if (s == "rel") return XAxis::rel;
  return std::nullopt;
}

/// One line's object read as a row: its step and times, and its values by
/// key, with the keys the index adds: `_step` (the step, a run's progress),
/// `_count/min` (the fewest ranks behind a reduced value of the row) and
/// `_progress/rank-N` (the step, on rows where rank N has a per-rank value).
class LinesIndex::RowReader {
public:
  explicit RowReader(FileKind kind) : kind_(kind) {}

  std::int64_t step = 0;
  double wall = nan_v, rel = nan_v;

  /// Why the object is no row (io::HistoryRow), or "". `value(key, v,
  /// place)` gets each value; `place` is its place among the line's values
  /// (npos for the added keys).
  template <class F>
  std::string_view read(const simdjson::dom::object& row, std::uint64_t row_number, F&& value) {
    if (kind_ == FileKind::system) {
      step = static_cast<std::int64_t>(row_number);
      wall = number_or_nan(row, "_timestamp");
      rel = number_or_nan(row, "_runtime");
      std::size_t place = 0;
      for (const io::RowValue& v : io::RowValues(row)) value(v.key, v.value, place++);
      return {};
    }
    const io::HistoryRow r(row);
    if (!r) return r.why();
    step = r.step();
    wall = r.timestamp().value_or(nan_v);
    rel = r.runtime().value_or(nan_v);
    ranks_.clear();
    std::size_t place = 0;
    double fewest = nan_v;
    r.each(
        [&](const io::RowValue& v) {
          value(v.key, v.value, place++);
          if (const std::int64_t k = rank_of(v.key);
              k >= 0 && std::find(ranks_.begin(), ranks_.end(), k) == ranks_.end())
            ranks_.push_back(k);
        },
        [&](const io::RowValue& n) {
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
  std::vector<std::int64_t> ranks_;
  std::string name_;
};

/// The points of one key that a request draws, within [lo, hi]: kept as
/// they are while there are at most two a pixel, else the smallest and
/// largest of each pixel.
class LinesIndex::Collector {
public:
  Collector(double lo, double hi, std::size_t width) : lo_(lo), hi_(hi), width_(std::max<std::size_t>(width, 1)) {}

  void add(double x, double v) {
    ++n_;
    if (buckets_.empty()) {
      points_.push_back({x, v});
      if (points_.size() > 2 * width_) bucket();
      return;
    }
    put(x, v);
  }
  /// Where blocks stand in for the points: how many there are.
  void count(std::uint64_t n) { counted_ = n; }
  [[nodiscard]] std::uint64_t n() const { return counted_ ? counted_ : n_; }

  void json(std::string& out) {
    std::vector<Pt> pts;
    if (buckets_.empty()) {
      pts = std::move(points_);
    } else {
      for (const Bucket& b : buckets_) {
        if (b.n == 0) continue;
        const bool min_first = b.lo.x <= b.hi.x;
        pts.push_back(min_first ? b.lo : b.hi);
        if (b.n > 1 && !(b.lo.x == b.hi.x && b.lo.v == b.hi.v)) pts.push_back(min_first ? b.hi : b.lo);
      }
    }
    std::stable_sort(pts.begin(), pts.end(), [](const Pt& a, const Pt& b) { return a.x < b.x; });
    out += "{\"n\":" + std::to_string(n()) + ",\"full\":" + (buckets_.empty() && counted_ == 0 ? "true" : "false");
    out += ",\"x\":[";
    for (std::size_t i = 0; i < pts.size(); ++i) {
      if (i) out += ',';
      put_number(out, pts[i].x);
    }
    out += "],\"y\":[";
    for (std::size_t i = 0; i < pts.size(); ++i) {
      if (i) out += ',';
      io::append_json_number(out, pts[i].v);
    }
    out += "]";
  }

private:
  struct Pt {
    double x, v;
  };
  struct Bucket {
    Pt lo{}, hi{};
    std::uint64_t n = 0;
  };
  void bucket() {
    buckets_.resize(width_);
    for (const Pt& p : points_) put(p.x, p.v);
    points_.clear();
    points_.shrink_to_fit();
  }
  void put(double x, double v) {
    const double span = hi_ - lo_;
    double f = span > 0 ? (x - lo_) / span * static_cast<double>(width_) : 0;
    const std::size_t i = f <= 0 ? 0 : std::min(width_ - 1, static_cast<std::size_t>(f));
    Bucket& b = buckets_[i];
    if (b.n++ == 0) {
      b.lo = b.hi = {x, v};
      return;
    }
    if (v < b.lo.v) b.lo = {x, v};
    if (v > b.hi.v) b.hi = {x, v};
  }

  double lo_, hi_;
  std::size_t width_;
  std::uint64_t n_ = 0, counted_ = 0;
  std::vector<Pt> points_;
  std::vector<Bucket> buckets_;
};

namespace {

/// Writes a series answer: the range drawn, the rows, `extra` (members of
/// its own), the problem met, then per key its collected points followed by
/// what `tail(i)` appends.
template <class Collectors, class Tail>
void put_answer(std::string& out, double lo, double hi, std::uint64_t rows, std::string_view extra,
                const Error& problem, const std::vector<std::string>& keys, Collectors& collectors, Tail&& tail) {
  out += "{\"from\":";
  put_number(out, lo);
  out += ",\"to\":";
  put_number(out, hi);
  out += ",\"rows\":" + std::to_string(rows);
  out += extra;
  if (problem) {
    out += ",\"error\":";
    io::append_json_string(out, problem.message());
  }
  out += ",\"series\":{";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ',';
    io::append_json_string(out, keys[i]);
    out += ':';
    collectors[i].json(out);
    tail(i);
    out += '}';
  }
  out += "}}";
}

} // namespace

/// The lines an overview read: each line's start, its step and times, and
/// per key the lines that have a finite value of it.
struct LinesIndex::Overview {
  struct Line {
    std::uint64_t byte = 0;
    std::int64_t step = 0;
    double wall = nan_v, rel = nan_v;
    [[nodiscard]] double x(XAxis a) const { return a == XAxis::step ? static_cast<double>(step) : a == XAxis::wall ? wall : rel; }
  };
  struct Series {
    std::string name;
    std::vector<std::pair<std::uint32_t, double>> points; // (line, value)
  };
  std::vector<Line> lines;
  std::vector<Series> keys;
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> by_name;
  std::uint64_t end = 0;  // the bytes of complete lines the file held
  std::uint64_t rows = 0; // the rows it holds, estimated from the lines' lengths
  bool unfinished = false;

  [[nodiscard]] double scale() const { return lines.empty() ? 0 : static_cast<double>(rows) / static_cast<double>(lines.size()); }
};

namespace {

/// Reads from `fd` into `buf` the bytes [at, at + n), fewer at the end of the file.
std::string_view read_at(int fd, std::uint64_t at, std::size_t n, std::string& buf) {
  buf.resize(n);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(at + got));
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  return {buf.data(), got};
}

/// The whole line that starts first at or after byte `at` (just after a
/// newline, or at 0) and ends before `end`: its start and text, or nothing
/// where none does within a line's greatest length.
std::optional<std::pair<std::uint64_t, std::string_view>> line_after(int fd, std::uint64_t at, std::uint64_t end,
                                                                     std::string& buf) {
  std::uint64_t start = at;
  if (at > 0) { // the newline at or after at - 1 ends the line `at` falls in
    std::uint64_t from = at - 1;
    for (;;) {
      if (from >= end || from - (at - 1) > max_line_bytes) return std::nullopt;
      const std::string_view b = read_at(fd, from, static_cast<std::size_t>(std::min<std::uint64_t>(8192, end - from)), buf);
      if (b.empty()) return std::nullopt;
      if (const auto nl = b.find('\n'); nl != std::string_view::npos) {
        start = from + nl + 1;
        break;
      }
      from += b.size();
    }
  }
  for (std::size_t n = 8192;; n *= 4) {
    if (start >= end) return std::nullopt;
    const std::string_view b = read_at(fd, start, static_cast<std::size_t>(std::min<std::uint64_t>(n, end - start)), buf);
    if (const auto nl = b.find('\n'); nl != std::string_view::npos) return std::pair{start, b.substr(0, nl)};
    if (b.size() < n || n > max_line_bytes) return std::nullopt; // the line runs past `end`, or too long
  }
}

} // namespace

LinesIndex::LinesIndex(std::string path, FileKind kind, std::uint64_t parallel_from, unsigned pieces,
                       std::uint64_t overview_from)
    : path_(std::move(path)), kind_(kind), parallel_from_(parallel_from),
      pieces_(pieces != 0 ? pieces : std::min(4u, std::thread::hardware_concurrency())), overview_from_(overview_from) {}

LinesIndex::~LinesIndex() { stop_building(); }

void LinesIndex::hold_indexing(bool hold) {
  {
    std::lock_guard lock(gate_mutex_);
    hold_ = hold;
  }
  gate_.notify_all();
}

void LinesIndex::stop_building() {
  if (builder_.joinable()) {
    {
      std::lock_guard lock(gate_mutex_);
      stop_ = true; // a held building lets go, a running one stops at its next line
    }
    gate_.notify_all();
    builder_.join();
    stop_ = false;
  }
  next_.reset();
  built_ = false;
  overview_.reset();
  state_.indexing = false;
}

bool LinesIndex::start_overview(int fd, std::uint64_t size) {
  auto o = std::make_unique<Overview>();
  std::string buf;
  // The complete lines end at the last newline.
  std::uint64_t end = size;
  for (std::uint64_t back = 0;;) {
    if (end == 0 || back > max_line_bytes) return false;
    const std::uint64_t from = end > 65536 ? end - 65536 : 0;
    const std::string_view b = read_at(fd, from, static_cast<std::size_t>(end - from), buf);
    if (b.size() != end - from) return false;
    if (const auto nl = b.rfind('\n'); nl != std::string_view::npos) {
      o->unfinished = !blank(b.substr(nl + 1)) || end != size;
      end = from + nl + 1;
      break;
    }
    back += end - from;
    end = from;
  }
  o->end = end;
  simdjson::dom::parser parser;
  RowReader reader(kind_);
  std::uint64_t sampled_bytes = 0, sampled = 0;
  auto take = [&](std::uint64_t start, std::string_view line) {
    if (!o->lines.empty() && start <= o->lines.back().byte) return;
    ++sampled;
    sampled_bytes += line.size() + 1;
    line = trim_line_end(line);
    simdjson::dom::object obj;
    if (line.empty() || parser.parse(line.data(), line.size(), false).get(obj) != simdjson::SUCCESS) return;
    const auto at = static_cast<std::uint32_t>(o->lines.size());
    std::vector<std::pair<std::uint32_t, double>> values;
    const std::string_view why = reader.read(obj, at, [&](std::string_view name, double v, std::size_t) {
      if (!std::isfinite(v)) return;
      auto it = o->by_name.find(name);
      if (it == o->by_name.end()) {
        it = o->by_name.emplace(std::string(name), static_cast<std::uint32_t>(o->keys.size())).first;
        o->keys.push_back({std::string(name), {}});
      }
      values.emplace_back(it->second, v);
    });
    if (!why.empty()) return; // a damaged line: the index names it once it is built
    for (const auto& [k, v] : values) o->keys[k].points.emplace_back(at, v);
    o->lines.push_back({start, reader.step, reader.wall, reader.rel});
  };
  for (std::size_t i = 0; i < overview_lines; ++i) {
    const std::uint64_t at = end / overview_lines * i + end % overview_lines * i / overview_lines;
    if (const auto line = line_after(fd, at, end, buf)) take(line->first, line->second);
  }
  // The last line: the run's end, as far as it has come.
  {
    const std::uint64_t from = end > 65536 ? end - 65536 : 0;
    const std::string_view b = read_at(fd, from, static_cast<std::size_t>(end - from), buf);
    const std::string_view body = b.substr(0, b.empty() ? 0 : b.size() - 1);
    const auto nl = body.rfind('\n');
    if (nl != std::string_view::npos || from == 0) {
      const std::uint64_t start = nl == std::string_view::npos ? 0 : from + nl + 1;
      const std::string last(body.substr(nl == std::string_view::npos ? 0 : nl + 1));
      take(start, last);
    }
  }
  if (o->lines.empty() || sampled == 0) return false;
  o->rows = static_cast<std::uint64_t>(std::llround(static_cast<double>(end) * static_cast<double>(sampled) /
                                                    static_cast<double>(sampled_bytes)));
  o->rows = std::max<std::uint64_t>(o->rows, o->lines.size());
  state_.indexing = true;
  state_.rows = o->rows;
  state_.keys = o->keys.size();
  state_.last_step = o->lines.back().step;
  state_.unfinished = o->unfinished;
  overview_ = std::move(o);

  // The index itself, read on threads of its own up to the overview's end.
  auto next = std::make_unique<LinesIndex>(path_, kind_, parallel_from_, pieces_, never_overview);
  next->state_.missing = false;
  next->dev_ = dev_, next->ino_ = ino_;
  next->stopped_ = &stop_;
  next->keep_ = keep_;
  next_ = std::move(next);
  builder_ = std::thread([this, end] {
    {
      std::unique_lock lock(gate_mutex_);
      gate_.wait(lock, [this] { return !hold_ || stop_; });
    }
    LinesIndex& n = *next_;
    const Result<int> in = io::detail::open_regular(path_, O_RDONLY);
    if (!in) {
      n.state_.problem = in.error();
    } else if (end >= parallel_from_ && pieces_ > 1 && n.read_in_parallel(end, pieces_)) {
      io::detail::close_fd(*in);
    } else {
      n.read_lines(*in, end);
    }
    built_.store(true, std::memory_order_release);
  });
  return true;
}

void LinesIndex::adopt(LinesIndex& built) {
  step_ = std::move(built.step_);
  wall_ = std::move(built.wall_);
  rel_ = std::move(built.rel_);
  marks_ = std::move(built.marks_);
  keys_ = std::move(built.keys_);
  by_name_ = std::move(built.by_name_);
  guess_ = std::move(built.guess_);
  pseudo_ = std::move(built.pseudo_);
  lines_ = built.lines_;
  first_skipped_line_ = built.first_skipped_line_;
  stuck_size_ = built.stuck_size_;
  state_ = built.state_;
  state_.keys = keys_.size();
  state_.missing = false;
  state_.indexing = false;
}

void LinesIndex::reset() {
  stop_building();
  release(step_);
  release(wall_);
  release(rel_);
  release(marks_);
  release(keys_);
  release(by_name_);
  release(guess_);
  release(pseudo_);
  lines_ = 0;
  first_skipped_line_ = 0;
  stuck_size_ = 0;
  state_ = IndexState{};
}

LinesIndex::Key& LinesIndex::key(std::string_view name) {
  if (auto it = by_name_.find(name); it != by_name_.end()) return keys_[it->second];
  by_name_.emplace(std::string(name), static_cast<std::uint32_t>(keys_.size()));
  keys_.push_back(Key{.name = std::string(name)});
  keys_.back().keep = std::find(keep_.begin(), keep_.end(), name) != keep_.end();
  return keys_.back();
}

void LinesIndex::add(Key& k, std::uint32_t row, double v) {
  if (std::isnan(v)) {
    ++k.nans;
    return;
  }
  if (std::isinf(v)) {
    ++k.infs;
    return;
  }
  if (k.points == 0) {
    k.min = k.max = v;
    k.first_row = row;
  } else {
    k.min = std::min(k.min, v);
    k.max = std::max(k.max, v);
  }
  k.last = v;
  k.last_row = row;
  ++k.points;
  if (k.blocks.empty() || k.blocks.back().n == block_points) {
    room(k.blocks);
    k.blocks.push_back({row, row, row, row, 0, v, v});
  }
  Block& b = k.blocks.back();
  if (v < b.min) b.min = v, b.min_row = row;
  if (v > b.max) b.max = v, b.max_row = row;
  b.last_row = row;
  ++b.n;
  if (!k.exact) return;
  if (k.exact_rows.size() < exact_points || k.keep) {
    k.exact_rows.push_back(row);
    k.exact_values.push_back(v);
    return;
  }
  k.exact = false;
  release(k.exact_rows);
  release(k.exact_values);
}

bool LinesIndex::refresh() {
  std::unique_lock lock(mutex_);
  const Result<int> fd = io::detail::open_regular(path_, O_RDONLY, true);
  if (!fd) {
    const bool changed = state_.problem.message() != fd.error().message();
    state_.problem = fd.error();
    return changed;
  }
  if (*fd < 0) {
    if (state_.missing && !state_.problem) return false;
    reset();
    return true;
  }
  struct stat st {};
  if (::fstat(*fd, &st) != 0) {
    io::detail::close_fd(*fd);
    return false;
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  bool changed = false;
  if (overview_ && built_.load(std::memory_order_acquire)) {
    // The index built in the background is whole: it takes the overview's place.
    builder_.join();
    std::unique_ptr<LinesIndex> built = std::move(next_);
    overview_.reset();
    built_ = false;
    adopt(*built);
    changed = true;
  }
  if (overview_) {
    // Still being built: the overview stands, unless the file was replaced or cut.
    if (st.st_dev == dev_ && st.st_ino == ino_ && size >= overview_->end) {
      io::detail::close_fd(*fd);
      return changed;
    }
    reset(); // stops the building; the file is read afresh below
  }
  if (state_.missing || st.st_dev != dev_ || st.st_ino != ino_ || size < state_.bytes) {
    // A new file, or one replaced (chorus recover rewrites it) or cut: read it afresh.
    reset();
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    state_.missing = false;
    changed = true;
  }
  if (size == state_.bytes || (stuck_size_ != 0 && size == stuck_size_)) {
    io::detail::close_fd(*fd);
    if (state_.unfinished && size == state_.bytes) {
      state_.unfinished = false;
      changed = true;
    }
    return changed;
  }
  const std::uint64_t rows_before = state_.rows;
  state_.problem = {};
  // A long history opened for the first time: an overview now, the index in the background.
  if (kind_ == FileKind::history && state_.bytes == 0 && size >= overview_from_ && start_overview(*fd, size)) {
    io::detail::close_fd(*fd);
    return true;
  }
  // A long stretch to read (a run opened for the first time) is read by
  // several threads, a piece each.
  if (size - state_.bytes >= parallel_from_ && pieces_ > 1 && read_in_parallel(size, pieces_)) {
    io::detail::close_fd(*fd);
  } else {
    read_lines(*fd, size);
  }
  state_.keys = keys_.size();
  return changed || state_.rows != rows_before || state_.problem;
}

void LinesIndex::read_lines(int fd, std::uint64_t end) {
  io::LineReader lines(fd, path_, {lines_, state_.bytes}, {.chunk = 4u << 20, .max_line = max_line_bytes, .end = end});
  simdjson::dom::parser parser;
  RowReader reader(kind_);
  std::vector<std::uint32_t> ids;
  for (std::string_view line;;) {
    if (stopped_->load(std::memory_order_relaxed)) {
      state_.problem = Error(Errc::io_error, path_ + ": indexing stopped");
      break;
    }
    const io::LineReader::Next next = lines.next(line);
    if (next == io::LineReader::Next::end) {
      state_.unfinished = !blank(lines.rest());
      break;
    }
    if (next == io::LineReader::Next::too_long) {
      stuck_size_ = end;
      state_.problem = lines.error(); // io::line_too_long: the lines after it are not read
      break;
    }
    if (next == io::LineReader::Next::failed) {
      state_.problem = lines.error();
      break;
    }
    const std::uint64_t line_start = lines.cursor().bytes - line.size() - 1;
    line = trim_line_end(line);
    if (line.empty()) continue;
    if (state_.rows >= std::numeric_limits<std::uint32_t>::max()) {
      state_.problem = Error(Errc::io_error, path_ + " holds more rows than chorus serve indexes (2^32)");
      break;
    }
    auto skip = [&](std::string_view why) {
      if (state_.skipped++ == 0) {
        first_skipped_line_ = lines.cursor().lines;
        state_.first_skipped = std::string(why);
      }
    };
    simdjson::dom::object obj;
    if (auto e = parser.parse(line.data(), line.size(), false).get(obj)) {
      skip(simdjson::error_message(e));
      continue;
    }
    const auto row = static_cast<std::uint32_t>(state_.rows);
    ids.clear();
    const std::string_view why = reader.read(obj, row, [&](std::string_view name, double v, std::size_t place) {
      // The keys of a row mostly come in the same order as in the row before.
      Key* k = nullptr;
      if (place != std::string_view::npos && place < guess_.size() && keys_[guess_[place]].name == name) {
        k = &keys_[guess_[place]];
      } else if (place == std::string_view::npos) {
        auto it = pseudo_.find(name);
        if (it == pseudo_.end()) {
          Key& made = key(name);
          it = pseudo_.emplace(made.name, static_cast<std::uint32_t>(&made - keys_.data())).first;
        }
        k = &keys_[it->second];
      } else {
        k = &key(name);
        if (place >= guess_.size()) guess_.resize(place + 1, 0);
        guess_[place] = static_cast<std::uint32_t>(k - keys_.data());
      }
      ids.push_back(static_cast<std::uint32_t>(k - keys_.data()));
      values_.push_back(v);
    });
    if (!why.empty()) {
      values_.clear();
      skip(why);
      continue;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) add(keys_[ids[i]], row, values_[i]);
    values_.clear();
    if (marks_.empty() || row - marks_.back().row >= mark_every) {
      room(marks_);
      marks_.push_back({.row = row, .byte = line_start});
    }
    Mark& m = marks_.back();
    m.take(XAxis::step, static_cast<double>(reader.step));
    m.take(XAxis::wall, reader.wall);
    m.take(XAxis::rel, reader.rel);
    room(step_);
    room(wall_);
    room(rel_);
    step_.push_back(reader.step);
    wall_.push_back(reader.wall);
    rel_.push_back(reader.rel);
    state_.last_step = reader.step;
    ++state_.rows;
  }
  state_.bytes = lines.cursor().bytes;
  lines_ = lines.cursor().lines;
}

bool LinesIndex::read_in_parallel(std::uint64_t end, unsigned threads) {
  // Pieces start just after a newline, at about equal distances.
  std::vector<std::uint64_t> starts{state_.bytes};
  {
    const Result<int> fd = io::detail::open_regular(path_, O_RDONLY);
    if (!fd) return false;
    const std::uint64_t piece = (end - state_.bytes) / threads;
    char buf[1 << 16];
    for (unsigned i = 1; i < threads; ++i) {
      std::uint64_t at = std::max(starts.back(), state_.bytes + piece * i);
      for (bool found = false; !found;) {
        const ssize_t n = ::pread(*fd, buf, sizeof buf, static_cast<off_t>(at));
        if (n <= 0 || at >= end || at - (state_.bytes + piece * i) > max_line_bytes) {
          io::detail::close_fd(*fd);
          return false;
        }
        if (const void* nl = std::memchr(buf, '\n', static_cast<std::size_t>(n))) {
          at += static_cast<std::uint64_t>(static_cast<const char*>(nl) - buf) + 1;
          found = true;
        } else {
          at += static_cast<std::uint64_t>(n);
        }
      }
      if (at >= end) break;
      starts.push_back(at);
    }
    io::detail::close_fd(*fd);
  }
  starts.push_back(end);
  std::vector<std::unique_ptr<LinesIndex>> parts;
  for (std::size_t i = 0; i + 1 < starts.size(); ++i) {
    parts.push_back(std::make_unique<LinesIndex>(path_, kind_, parallel_from_, 1));
    parts.back()->state_.bytes = starts[i];
    parts.back()->state_.missing = false;
    parts.back()->stopped_ = stopped_;
    parts.back()->keep_ = keep_;
  }
  std::vector<std::thread> workers;
  for (std::size_t i = 0; i < parts.size(); ++i)
    workers.emplace_back([&, i] {
      const Result<int> fd = io::detail::open_regular(path_, O_RDONLY);
      if (!fd) {
        parts[i]->state_.problem = fd.error();
        return;
      }
      parts[i]->read_lines(*fd, starts[i + 1]);
    });
  for (std::thread& t : workers) t.join();
  // Each piece but the last must have been read to its end (the last may end
  // in a line being written); anything else is read again the plain way.
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (parts[i]->state_.problem || (i + 1 < parts.size() && parts[i]->state_.bytes != starts[i + 1])) return false;
  // Room for every piece at once, then each in turn, its memory given back.
  std::size_t rows = step_.size(), marks = marks_.size();
  for (const auto& p : parts) rows += p->step_.size(), marks += p->marks_.size();
  step_.reserve(rows);
  wall_.reserve(rows);
  rel_.reserve(rows);
  marks_.reserve(marks);
  for (auto& p : parts) {
    merge(std::move(*p));
    p.reset();
  }
  return true;
}

void LinesIndex::merge(LinesIndex&& part) {
  const auto base = static_cast<std::uint32_t>(state_.rows);
  const std::size_t had = step_.size();
  step_.insert(step_.end(), part.step_.begin(), part.step_.end());
  // System samples count their lines as their steps: the piece's count on.
  if (kind_ == FileKind::system)
    for (std::size_t i = had; i < step_.size(); ++i) step_[i] += base;
  wall_.insert(wall_.end(), part.wall_.begin(), part.wall_.end());
  rel_.insert(rel_.end(), part.rel_.begin(), part.rel_.end());
  for (Mark m : part.marks_) {
    m.row += base;
    if (kind_ == FileKind::system)
      for (double* v : {&m.range[0].first, &m.range[0].second}) *v += base;
    marks_.push_back(m);
  }
  for (Key& pk : part.keys_) {
    Key& k = key(pk.name);
    k.blocks.reserve(k.blocks.size() + pk.blocks.size());
    for (Block b : pk.blocks) {
      b.first_row += base, b.last_row += base, b.min_row += base, b.max_row += base;
      k.blocks.push_back(b);
    }
    if (k.exact && pk.exact && (k.keep || k.exact_rows.size() + pk.exact_rows.size() <= exact_points)) {
      for (const std::uint32_t r : pk.exact_rows) k.exact_rows.push_back(r + base);
      k.exact_values.insert(k.exact_values.end(), pk.exact_values.begin(), pk.exact_values.end());
    } else if (k.exact) {
      k.exact = false;
      release(k.exact_rows);
      release(k.exact_values);
    }
    if (pk.points > 0) {
      if (k.points == 0) {
        k.min = pk.min, k.max = pk.max, k.first_row = pk.first_row + base;
      } else {
        k.min = std::min(k.min, pk.min), k.max = std::max(k.max, pk.max);
      }
      k.last = pk.last, k.last_row = pk.last_row + base;
    }
    k.points += pk.points, k.nans += pk.nans, k.infs += pk.infs;
  }
  if (state_.skipped == 0 && part.state_.skipped > 0) {
    first_skipped_line_ = lines_ + part.first_skipped_line_;
    state_.first_skipped = part.state_.first_skipped;
  }
  state_.skipped += part.state_.skipped;
  state_.rows += part.state_.rows;
  if (part.state_.rows > 0) state_.last_step = step_.back();
  state_.bytes = part.state_.bytes;
  state_.unfinished = part.state_.unfinished;
  lines_ += part.lines_;
}

IndexState LinesIndex::state() const {
  std::shared_lock lock(mutex_);
  IndexState s = state_;
  if (s.skipped > 0) s.first_skipped = "line " + std::to_string(first_skipped_line_) + ": " + s.first_skipped;
  return s;
}

double LinesIndex::x_of(XAxis x, std::size_t row) const {
  switch (x) {
  case XAxis::step: return static_cast<double>(step_[row]);
  case XAxis::wall: return wall_[row];
  case XAxis::rel: return rel_[row];
  }
  return nan_v;
}

void LinesIndex::Mark::take(XAxis x, double v) {
  if (std::isnan(v)) return;
  auto& [lo, hi] = range[static_cast<int>(x)];
  if (std::isnan(lo) || v < lo) lo = v;
  if (std::isnan(hi) || v > hi) hi = v;
}

std::pair<std::size_t, std::size_t> LinesIndex::rows_in(XAxis x, double lo, double hi) const {
  // Every mark knows the smallest and largest x of its rows: the rows to look
  // at run from the first mark that reaches into [lo, hi] to the last.
  std::size_t first = marks_.size(), last = 0;
  for (std::size_t b = 0; b < marks_.size(); ++b) {
    const auto& [blo, bhi] = marks_[b].range[static_cast<int>(x)];
    if (std::isnan(blo) || bhi < lo || blo > hi) continue;
    first = std::min(first, b);
    last = b + 1;
  }
  if (first >= last) return {0, 0};
  return {marks_[first].row, last < marks_.size() ? marks_[last].row : step_.size()};
}

double LinesIndex::value_at(const Key& k, std::size_t row) {
  if (!k.exact) return nan_v;
  const auto at = std::lower_bound(k.exact_rows.begin(), k.exact_rows.end(), row);
  if (at == k.exact_rows.end() || *at != row) return nan_v;
  return k.exact_values[static_cast<std::size_t>(at - k.exact_rows.begin())];
}

std::pair<std::size_t, std::size_t> LinesIndex::rows_in(const Key& k, double lo, double hi) {
  std::size_t first = std::numeric_limits<std::size_t>::max(), last = 0;
  if (k.exact) {
    for (std::size_t i = 0; i < k.exact_rows.size(); ++i) {
      if (k.exact_values[i] < lo || k.exact_values[i] > hi) continue;
      first = std::min<std::size_t>(first, k.exact_rows[i]);
      last = std::size_t{k.exact_rows[i]} + 1;
    }
  } else {
    // Its blocks know the smallest and largest value of their rows.
    for (const Block& b : k.blocks) {
      if (b.max < lo || b.min > hi) continue;
      first = std::min<std::size_t>(first, b.first_row);
      last = std::size_t{b.last_row} + 1;
    }
  }
  if (first >= last) return {0, 0};
  return {first, last};
}

std::pair<double, double> LinesIndex::x_range(XAxis x) const {
  double lo = nan_v, hi = nan_v;
  for (const Mark& b : marks_) {
    const auto& [blo, bhi] = b.range[static_cast<int>(x)];
    if (std::isnan(blo)) continue;
    if (std::isnan(lo) || blo < lo) lo = blo;
    if (std::isnan(hi) || bhi > hi) hi = bhi;
  }
  return {lo, hi};
}

Error LinesIndex::scan(std::size_t first, std::size_t last, const std::vector<std::string_view>& keys,
                       const std::vector<Collector*>& into, XAxis x, std::string_view x_key, double lo,
                       double hi) const {
  // From the last mark at or before the first row.
  const auto mark = std::partition_point(marks_.begin(), marks_.end(), [&](const Mark& m) { return m.row <= first; });
  if (mark == marks_.begin()) return {};
  const Mark& from = *(mark - 1);
  return scan_lines(from.byte, state_.bytes, from.row, first, last, keys, into, x, x_key, lo, hi);
}

Error LinesIndex::scan_lines(std::uint64_t from, std::uint64_t end, std::size_t row, std::size_t first,
                             std::size_t last, const std::vector<std::string_view>& keys,
                             const std::vector<Collector*>& into, XAxis x, std::string_view x_key, double lo,
                             double hi) const {
  std::unordered_map<std::string_view, std::size_t> wanted;
  for (std::size_t i = 0; i < keys.size(); ++i) wanted.emplace(keys[i], i);
  const Result<int> fd = io::detail::open_regular(path_, O_RDONLY);
  if (!fd) return fd.error();
  io::LineReader lines(*fd, path_, {0, from}, {.chunk = 1u << 20, .max_line = max_line_bytes, .end = end});
  simdjson::dom::parser parser;
  RowReader reader(kind_);
  std::vector<std::pair<std::size_t, double>> got; // the line's values of the keys wanted
  for (std::string_view line; row < last;) {
    const io::LineReader::Next next = lines.next(line);
    if (next == io::LineReader::Next::failed) return lines.error();
    if (next != io::LineReader::Next::line) break;
    line = trim_line_end(line);
    simdjson::dom::object obj;
    if (line.empty() || parser.parse(line.data(), line.size(), false).get(obj) != simdjson::SUCCESS) continue;
    const bool take = row >= first;
    double at = nan_v;
    got.clear();
    const std::string_view why = reader.read(obj, row, [&](std::string_view name, double v, std::size_t) {
      if (!take || !std::isfinite(v)) return;
      if (!x_key.empty() && name == x_key) at = v; // the x key may come after the keys it is the x of
      const auto it = wanted.find(name);
      if (it != wanted.end()) got.emplace_back(it->second, v);
    });
    if (!why.empty()) continue;
    if (x_key.empty())
      at = x == XAxis::step ? static_cast<double>(reader.step) : x == XAxis::wall ? reader.wall : reader.rel;
    if (at >= lo && at <= hi)
      for (const auto& [i, v] : got) into[i]->add(at, v);
    ++row;
  }
  return {};
}

void LinesIndex::overview_json(const SeriesRequest& r, std::string& out) const {
  const Overview& o = *overview_;
  // Each overview line's x: its step or time, or the x key's value on it (NaN: none).
  const auto x_key = r.x_key.empty() ? o.by_name.end() : o.by_name.find(r.x_key);
  std::vector<double> keyed;
  if (x_key != o.by_name.end()) {
    keyed.assign(o.lines.size(), nan_v);
    for (const auto& [line, v] : o.keys[x_key->second].points) keyed[line] = v;
  }
  const auto line_x = [&](std::size_t i) {
    return r.x_key.empty() ? o.lines[i].x(r.x) : keyed.empty() ? nan_v : keyed[i];
  };
  double all_lo = nan_v, all_hi = nan_v;
  for (std::size_t i = 0; i < o.lines.size(); ++i) {
    const double v = line_x(i);
    if (std::isnan(v)) continue;
    if (std::isnan(all_lo) || v < all_lo) all_lo = v;
    if (std::isnan(all_hi) || v > all_hi) all_hi = v;
  }
  double lo = r.from.value_or(all_lo), hi = r.to.value_or(all_hi);
  if (std::isnan(lo)) lo = 0;
  if (std::isnan(hi)) hi = lo;
  if (hi < lo) std::swap(lo, hi);
  const std::size_t width = std::max<std::size_t>(r.width, 1);
  std::vector<Collector> collectors;
  collectors.reserve(r.keys.size());
  for (std::size_t i = 0; i < r.keys.size(); ++i) collectors.emplace_back(lo, hi, width);
  const bool whole = !r.from && !r.to;
  Error problem;
  if (whole) {
    // The whole run: the overview's lines stand for it.
    for (std::size_t i = 0; i < r.keys.size(); ++i) {
      const auto it = o.by_name.find(r.keys[i]);
      if (it == o.by_name.end()) continue;
      std::uint64_t n = 0;
      for (const auto& [line, v] : o.keys[it->second].points) {
        const double at = line_x(line);
        if (at >= lo && at <= hi) collectors[i].add(at, v), ++n;
      }
      collectors[i].count(std::max<std::uint64_t>(n, static_cast<std::uint64_t>(std::llround(static_cast<double>(n) * o.scale()))));
    }
  } else {
    // A range: every line of the file between the overview's lines around it.
    // Lines are in step order and times nearly so, as a step metric (an
    // epoch) mostly is: one overview line more on each side.
    std::size_t before = 0, after = o.lines.size();
    for (std::size_t i = 0; i < o.lines.size(); ++i) {
      const double v = line_x(i);
      if (std::isnan(v)) continue;
      if (v < lo) before = i;
      if (v > hi && after == o.lines.size()) after = i;
    }
    const std::uint64_t from = before > 0 ? o.lines[before - 1].byte : 0;
    const std::uint64_t end = after + 1 < o.lines.size() ? o.lines[after + 1].byte : o.end;
    std::vector<std::string_view> keys(r.keys.begin(), r.keys.end());
    std::vector<Collector*> into;
    for (Collector& c : collectors) into.push_back(&c);
    problem =
        scan_lines(from, end, 0, 0, std::numeric_limits<std::size_t>::max(), keys, into, r.x, r.x_key, lo, hi);
  }
  std::string extra = whole ? ",\"overview\":true" : ",\"overview\":false";
  const bool none = std::all_of(collectors.begin(), collectors.end(), [](const Collector& c) { return c.n() == 0; });
  if (!r.x_key.empty() && x_key == o.by_name.end() && (whole || none)) extra += ",\"x_missing\":true";
  put_answer(out, lo, hi, o.rows, extra, problem, r.keys, collectors,
             [&](std::size_t i) {
               // A key no line of the overview has, nor any line of the range read.
               if (!o.by_name.contains(r.keys[i]) && (whole || collectors[i].n() == 0)) out += ",\"missing\":true";
             });
}

void LinesIndex::series_json(const SeriesRequest& r, std::string& out) const {
  std::shared_lock lock(mutex_);
  if (overview_) {
    overview_json(r, out);
    return;
  }
  // Against a key (a step metric): a row's x is that key's value on it, from
  // the points the index keeps of it; where it keeps none, every key's points
  // are read back from the file, x and all.
  const Key* x_key = nullptr;
  if (!r.x_key.empty())
    if (const auto it = by_name_.find(r.x_key); it != by_name_.end() && keys_[it->second].points > 0)
      x_key = &keys_[it->second];
  const bool keyed = !r.x_key.empty();
  const auto x_at = [&](std::size_t row) { return keyed ? value_at(*x_key, row) : x_of(r.x, row); };
  const auto [all_lo, all_hi] =
      !keyed ? x_range(r.x) : x_key ? std::pair{x_key->min, x_key->max} : std::pair{nan_v, nan_v};
  double lo = r.from.value_or(all_lo), hi = r.to.value_or(all_hi);
  if (std::isnan(lo)) lo = 0;
  if (std::isnan(hi)) hi = lo;
  if (hi < lo) std::swap(lo, hi);
  const std::size_t width = std::max<std::size_t>(r.width, 1);
  const auto [first, last] =
      !keyed ? rows_in(r.x, lo, hi) : x_key ? rows_in(*x_key, lo, hi) : std::pair<std::size_t, std::size_t>{0, 0};
  // A range of at most this many points of a key is read from the file:
  // every point is then there, or the exact smallest and largest of each pixel.
  const std::uint64_t read_at_most = std::max<std::uint64_t>(4096, std::uint64_t(block_points) * width);

  std::vector<Collector> collectors;
  collectors.reserve(r.keys.size());
  std::vector<const Key*> found(r.keys.size(), nullptr);
  std::vector<std::string_view> to_read;
  std::vector<Collector*> read_into;
  std::size_t read_first = last, read_last = first;
  for (std::size_t i = 0; i < r.keys.size(); ++i) {
    Collector& c = collectors.emplace_back(lo, hi, width);
    const auto it = by_name_.find(r.keys[i]);
    if (it == by_name_.end() || first >= last) continue;
    const Key& k = keys_[it->second];
    found[i] = &k;
    if (keyed && !x_key->exact) {
      to_read.push_back(k.name);
      read_into.push_back(&c);
      read_first = first, read_last = last;
      continue;
    }
    if (k.exact) {
      const auto b = std::lower_bound(k.exact_rows.begin(), k.exact_rows.end(), first);
      const auto e = std::lower_bound(b, k.exact_rows.end(), last);
      for (auto p = b; p != e; ++p) {
        const double at = x_at(*p);
        if (at >= lo && at <= hi) c.add(at, k.exact_values[static_cast<std::size_t>(p - k.exact_rows.begin())]);
      }
      continue;
    }
    const auto b = std::partition_point(k.blocks.begin(), k.blocks.end(), [&](const Block& bl) { return bl.last_row < first; });
    std::uint64_t n = 0;
    auto e = b;
    for (; e != k.blocks.end() && e->first_row < last; ++e) n += e->n;
    // Against a key, a block's smallest and largest value stand for it only
    // where their rows have an x: an x sparser than the key (an epoch beside
    // a loss on every row) would leave most of them out, so it is read.
    const auto x_points = [&] {
      const auto xb = std::lower_bound(x_key->exact_rows.begin(), x_key->exact_rows.end(), first);
      return static_cast<std::uint64_t>(std::lower_bound(xb, x_key->exact_rows.end(), last) - xb);
    };
    if (n <= read_at_most || (keyed && x_points() < n)) {
      to_read.push_back(k.name);
      read_into.push_back(&c);
      if (b != e) {
        read_first = std::min<std::size_t>(read_first, std::max<std::size_t>(first, b->first_row));
        read_last = std::max<std::size_t>(read_last, std::min<std::size_t>(last, (e - 1)->last_row + 1));
      }
      continue;
    }
    for (auto p = b; p != e; ++p)
      for (const auto& [row, v] : {std::pair{p->min_row, p->min}, std::pair{p->max_row, p->max}}) {
        if (row < first || row >= last) continue;
        const double at = x_at(row);
        if (at >= lo && at <= hi) c.add(at, v);
      }
    c.count(n);
  }
  Error problem;
  if (!to_read.empty() && read_first < read_last)
    problem = scan(read_first, read_last, to_read, read_into, r.x, r.x_key, lo, hi);
  const std::string_view extra = keyed && !x_key ? ",\"x_missing\":true" : "";
  put_answer(out, lo, hi, step_.size(), extra, problem, r.keys, collectors, [&](std::size_t i) {
    if (found[i]) out += ",\"nan\":" + std::to_string(found[i]->nans) + ",\"inf\":" + std::to_string(found[i]->infs);
    else out += ",\"missing\":true";
  });
}

void LinesIndex::keys_json(std::string& out) const {
  std::shared_lock lock(mutex_);
  out += '[';
  if (overview_) {
    // While the index is built: the keys of the overview's lines, their points estimated.
    const Overview& o = *overview_;
    for (std::size_t i = 0; i < o.keys.size(); ++i) {
      const Overview::Series& k = o.keys[i];
      if (i) out += ',';
      out += "{\"key\":";
      io::append_json_string(out, k.name);
      out += ",\"points\":" + std::to_string(std::llround(static_cast<double>(k.points.size()) * o.scale()));
      out += ",\"nan\":0,\"inf\":0,\"estimated\":true";
      if (!k.points.empty()) {
        double lo = k.points.front().second, hi = lo;
        for (const auto& p : k.points) lo = std::min(lo, p.second), hi = std::max(hi, p.second);
        out += ",\"min\":";
        io::append_json_number(out, lo);
        out += ",\"max\":";
        io::append_json_number(out, hi);
        out += ",\"last\":";
        io::append_json_number(out, k.points.back().second);
        out += ",\"first_step\":" + std::to_string(o.lines[k.points.front().first].step) +
               ",\"last_step\":" + std::to_string(o.lines[k.points.back().first].step);
      }
      out += '}';
    }
    out += ']';
    return;
  }
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    const Key& k = keys_[i];
    if (i) out += ',';
    out += "{\"key\":";
    io::append_json_string(out, k.name);
    out += ",\"points\":" + std::to_string(k.points) + ",\"nan\":" + std::to_string(k.nans) +
           ",\"inf\":" + std::to_string(k.infs);
    if (k.points > 0) {
      out += ",\"min\":";
      io::append_json_number(out, k.min);
      out += ",\"max\":";
      io::append_json_number(out, k.max);
      out += ",\"last\":";
      io::append_json_number(out, k.last);
      if (kind_ == FileKind::history) {
        out += ",\"first_step\":" + std::to_string(step_[k.first_row]) +
               ",\"last_step\":" + std::to_string(step_[k.last_row]);
      } else {
        out += ",\"first_time\":";
        io::append_json_number(out, wall_[k.first_row]);
        out += ",\"last_time\":";
        io::append_json_number(out, wall_[k.last_row]);
      }
    }
    out += '}';
  }
  out += ']';
}

std::vector<std::pair<std::string, std::int64_t>> LinesIndex::last_steps(std::string_view prefix) const {
  std::shared_lock lock(mutex_);
  std::vector<std::pair<std::string, std::int64_t>> out;
  if (overview_) {
    for (const Overview::Series& k : overview_->keys)
      if (k.name.starts_with(prefix) && !k.points.empty()) out.emplace_back(k.name, overview_->lines[k.points.back().first].step);
    return out;
  }
  for (const Key& k : keys_)
    if (k.name.starts_with(prefix) && k.points > 0) out.emplace_back(k.name, step_[k.last_row]);
  return out;
}

void LinesIndex::keep_points(std::vector<std::string> keys) {
  std::unique_lock lock(mutex_);
  if (keys == keep_) return;
  keep_ = std::move(keys);
  bool lost = false;
  for (Key& k : keys_) {
    k.keep = std::find(keep_.begin(), keep_.end(), k.name) != keep_.end();
    lost = lost || (k.keep && !k.exact);
  }
  // An index built in the background meanwhile was told the keys of before.
  if (lost || overview_) reset();
}

std::size_t LinesIndex::memory() const {
  std::shared_lock lock(mutex_);
  std::size_t n = step_.capacity() * sizeof(std::int64_t) + (wall_.capacity() + rel_.capacity()) * sizeof(double) +
                  marks_.capacity() * sizeof(Mark) +
                  keys_.capacity() * sizeof(Key);
  for (const Key& k : keys_)
    n += k.name.capacity() * 2 + k.blocks.capacity() * sizeof(Block) +
         k.exact_rows.capacity() * sizeof(std::uint32_t) + k.exact_values.capacity() * sizeof(double) + 64;
  if (overview_) {
    n += overview_->lines.capacity() * sizeof(Overview::Line);
    for (const Overview::Series& k : overview_->keys) n += k.name.capacity() * 2 + k.points.capacity() * 16 + 64;
  }
  return n;
}

} // namespace chorus::cli::serve
