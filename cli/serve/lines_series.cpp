// The answers of the line index (cli/serve/lines_index.hpp): the rows an x
// range spans (by step, wall or run time, or a step metric's value), a
// chart's series drawn from the index, from its blocks, or read back from
// the file (series_json), or from the overview while the index is built
// (overview_json; or, asked `exact`, the whole file read for the keys asked,
// in pieces side by side: read_pieces), with the range's first and last point and where its
// values were NaN or infinite; and the keys' list (keys_json).
#include "cli/serve/lines_detail.hpp"

#include "io/platform/posix.hpp"
#include "io/store/history_blocks.hpp"
#include "io/store/json_lines.hpp"
#include "io/store/line_reader.hpp"
#include "runtime/core/json.hpp"

#include <fcntl.h>

#include <thread>

namespace chorus::cli::serve {

using lines::nan_v;
using lines::put_number;

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
    core::append_json_string(out, problem.message());
  }
  out += ",\"series\":{";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ',';
    core::append_json_string(out, keys[i]);
    out += ':';
    collectors[i].json(out);
    tail(i);
    out += '}';
  }
  out += "}}";
}

/// The range asked for: [from, to], the whole of [all_lo, all_hi] where unset.
std::pair<double, double> range_of(const SeriesRequest& r, double all_lo, double all_hi) {
  double lo = r.from.value_or(all_lo), hi = r.to.value_or(all_hi);
  if (std::isnan(lo)) lo = 0;
  if (std::isnan(hi)) hi = lo;
  if (hi < lo) std::swap(lo, hi);
  return {lo, hi};
}

} // namespace

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

template <class X>
void LinesIndex::mark_nonfinite(const Key& k, std::size_t first, std::size_t last, double lo, double hi, X&& x_at,
                                Collector& c) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  for (const auto& [rows, v] : {std::pair{&k.nan_rows, nan_v}, std::pair{&k.inf_rows, inf}, std::pair{&k.ninf_rows, -inf}}) {
    const auto b = std::lower_bound(rows->begin(), rows->end(), first);
    for (auto p = b; p != rows->end() && *p < last; ++p) {
      const double at = x_at(*p);
      if (at >= lo && at <= hi) c.mark(at, v);
    }
  }
}

Error LinesIndex::scan(std::size_t first, std::size_t last, const std::vector<std::string_view>& keys,
                       const std::vector<Collector*>& into, XAxis x, std::string_view x_key, double lo,
                       double hi) const {
  // From the last mark at or before the first row.
  const auto mark = std::partition_point(marks_.begin(), marks_.end(), [&](const Mark& m) { return m.row <= first; });
  if (mark == marks_.begin()) return {};
  const Mark& from = *(mark - 1);
  return read_range(uncounted_, from.byte, state_.bytes, from.row, first, last, keys, into, x, x_key, lo, hi);
}

Error LinesIndex::read_pieces(const std::vector<std::string>& uncounted, std::uint64_t from, std::uint64_t end,
                              const std::vector<std::string_view>& keys, std::vector<Collector>& into,
                              std::size_t width, XAxis x, std::string_view x_key, double lo, double hi) const {
  const auto all = [](std::vector<Collector>& c) {
    std::vector<Collector*> p;
    for (Collector& one : c) p.push_back(&one);
    return p;
  };
  constexpr std::size_t every = std::numeric_limits<std::size_t>::max();
  std::vector<std::uint64_t> starts =
      pieces_ > 1 && end - from >= parallel_from_ ? lines::piece_starts(path_, from, end, pieces_) : std::vector<std::uint64_t>{};
  if (starts.size() < 2) starts = {from, end};
  // The first piece here, each other on a thread of its own (at the
  // request's priority: the page waits for it), then each piece's points
  // taken in, in the file's order.
  std::vector<std::vector<Collector>> parts(starts.size() - 1);
  std::vector<Error> problems(parts.size());
  const auto read = [&](std::size_t i) {
    problems[i] = read_range(uncounted, starts[i], starts[i + 1], 0, 0, every, keys, all(i ? parts[i] : into), x,
                             x_key, lo, hi);
  };
  std::vector<std::thread> workers;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    for (std::size_t k = 0; k < keys.size(); ++k) parts[i].emplace_back(lo, hi, width);
    workers.emplace_back(read, i);
  }
  read(0);
  for (std::thread& t : workers) t.join();
  for (std::size_t i = 1; i < parts.size(); ++i)
    for (std::size_t k = 0; k < keys.size(); ++k) into[k].merge(std::move(parts[i][k]));
  for (Error& e : problems)
    if (e) return e;
  return {};
}

std::optional<Error> LinesIndex::read_blocks(const std::vector<std::string>& uncounted, std::uint64_t end,
                                             const std::vector<std::string_view>& keys, std::vector<Collector>& into,
                                             std::size_t width, XAxis x, std::string_view x_key, double lo,
                                             double hi) const {
  if (kind_ != FileKind::history || x != XAxis::step || !x_key.empty() || !RowReader::only_metrics(keys))
    return std::nullopt;
  const std::string dir = path_.substr(0, path_.rfind('/'));
  // Read only where this server may show it, as any file of the run.
  if (shown_ && !shown_(dir + "/" + store::history_blocks_file)) return std::nullopt;
  const Result<store::HistoryBlocks> read = store::read_history_blocks(dir, end);
  // A summary that cannot be read is no loss: the file says the same.
  if (!read || read->blocks.empty()) return std::nullopt;
  const store::HistoryBlocks& b = *read;
  // Four blocks a pixel or more: each block's extremes, drawn where they
  // are, then stand for its rows within a quarter of a pixel.
  if (b.rows() / std::max<std::size_t>(width, 1) < blocks_a_pixel * store::HistoryBlockWriter::rows_per_block)
    return std::nullopt;
  const auto at = [&](std::int64_t step) { return static_cast<double>(step); };
  const auto in = [&](std::int64_t step) { return at(step) >= lo && at(step) <= hi; };
  std::vector<std::uint64_t> counted(keys.size(), 0);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto it = b.stats.find(std::string(keys[i]));
    if (it == b.stats.end()) continue;
    Collector& c = into[i];
    const store::BlockStat* first = nullptr;
    const store::BlockStat* last = nullptr;
    for (const store::HistoryBlocks::KeyBlock& kb : it->second) {
      const store::BlockStat& s = kb.stat;
      if (s.n > 0) {
        if (first == nullptr) first = &s;
        last = &s;
        for (const auto& [step, v] : {std::pair{s.min_step, s.min}, std::pair{s.max_step, s.max}})
          if (in(step)) c.add(at(step), v);
        counted[i] += s.n;
      }
      constexpr double kinds[] = {lines::nan_v, std::numeric_limits<double>::infinity(),
                                  -std::numeric_limits<double>::infinity()};
      for (std::size_t k = 0; k < 3; ++k)
        if (s.nonfinite[k].n > 0)
          for (const std::int64_t step : {s.nonfinite[k].first_step, s.nonfinite[k].last_step})
            if (in(step)) c.mark(at(step), kinds[k]);
    }
    // The key's first and last value within the blocks, as the range's edges.
    if (first != nullptr && in(first->first_step)) c.edge(at(first->first_step), first->first);
    if (last != nullptr && in(last->last_step)) c.edge(at(last->last_step), last->last);
  }
  // The rows after the last block, read; their points follow the blocks'.
  std::vector<Collector> tail;
  std::vector<Collector*> tail_into;
  for (std::size_t i = 0; i < keys.size(); ++i) tail.emplace_back(lo, hi, width);
  for (Collector& c : tail) tail_into.push_back(&c);
  Error problem;
  if (b.covered() < end)
    problem = read_range(uncounted, b.covered(), end, 0, 0, std::numeric_limits<std::size_t>::max(), keys, tail_into,
                         x, x_key, lo, hi);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    // Counted: the blocks' values, and the rows read after them.
    if (counted[i] > 0) into[i].count(counted[i] + tail[i].n());
    into[i].merge(std::move(tail[i]));
  }
  return problem;
}

Error LinesIndex::read_range(const std::vector<std::string>& uncounted, std::uint64_t from, std::uint64_t end,
                             std::size_t row, std::size_t first, std::size_t last,
                             const std::vector<std::string_view>& keys, const std::vector<Collector*>& into, XAxis x,
                             std::string_view x_key, double lo, double hi) const {
  std::unordered_map<std::string_view, std::size_t> wanted;
  for (std::size_t i = 0; i < keys.size(); ++i) wanted.emplace(keys[i], i);
  const Result<int> fd = platform::open_regular(path_, O_RDONLY);
  if (!fd) return fd.error();
  store::LineReader lines(*fd, path_, {0, from}, {.chunk = 1u << 20, .max_line = store::max_line_bytes, .end = end});
  RowReader reader(kind_, &uncounted);
  std::vector<std::pair<std::size_t, double>> got; // the line's values of the keys wanted
  // Metric keys alone: each line read for them only (RowReader::read_only).
  std::vector<std::string_view> read_for(keys);
  if (!x_key.empty()) read_for.push_back(x_key);
  const bool only = RowReader::only_metrics(read_for);
  for (std::string_view line; row < last;) {
    const store::LineReader::Next next = lines.next(line);
    if (next == store::LineReader::Next::failed) return lines.error();
    if (next != store::LineReader::Next::line) break;
    line = trim_line_end(line);
    if (line.empty()) continue;
    const bool take = row >= first;
    double at = nan_v;
    got.clear();
    const auto value = [&](std::string_view name, double v) {
      if (!take) return;
      // The x key may come after the keys it is the x of.
      if (!x_key.empty() && name == x_key && std::isfinite(v)) at = v;
      const auto it = wanted.find(name);
      if (it != wanted.end()) got.emplace_back(it->second, v);
    };
    const std::string_view why =
        only ? reader.read_only(line, row, read_for, value)
             : reader.read(line, row, [&](std::string_view name, double v, std::size_t) { value(name, v); });
    if (!why.empty()) continue;
    if (x_key.empty())
      at = x == XAxis::step ? static_cast<double>(reader.step) : x == XAxis::wall ? reader.wall : reader.rel;
    if (at >= lo && at <= hi)
      for (const auto& [i, v] : got) std::isfinite(v) ? into[i]->add(at, v) : into[i]->mark(at, v);
    ++row;
  }
  return {};
}

void LinesIndex::overview_json(const SeriesRequest& r, std::string& out,
                               std::shared_lock<std::shared_mutex>& lock) const {
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
  const auto [lo, hi] = range_of(r, all_lo, all_hi);
  const std::size_t width = std::max<std::size_t>(r.width, 1);
  std::vector<Collector> collectors;
  collectors.reserve(r.keys.size());
  for (std::size_t i = 0; i < r.keys.size(); ++i) collectors.emplace_back(lo, hi, width);
  const bool whole = !r.from && !r.to && !r.exact;
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
      for (const auto& [line, v] : o.keys[it->second].nonfinite) {
        const double at = line_x(line);
        if (at >= lo && at <= hi) collectors[i].mark(at, v);
      }
      collectors[i].count(
          std::max<std::uint64_t>(n, static_cast<std::uint64_t>(std::llround(static_cast<double>(n) * o.scale()))));
    }
  } else {
    // A range (or, `exact`, the whole run): every line of the file between
    // the overview's lines around it.
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
    // A system sample's step is its line's number: that of the first line read, as the overview estimates it.
    const std::size_t row = kind_ == FileKind::system && before > 0 ? static_cast<std::size_t>(o.lines[before - 1].step) : 0;
    std::vector<std::string_view> keys(r.keys.begin(), r.keys.end());
    std::vector<Collector*> into;
    for (Collector& c : collectors) into.push_back(&c);
    // The lock is let go for the reading (the whole file, where `exact`):
    // what the answer takes of the overview is kept first.
    const std::uint64_t rows = o.rows;
    const bool x_known = x_key != o.by_name.end();
    std::vector<bool> known;
    for (const std::string& k : r.keys) known.push_back(o.by_name.contains(k));
    // What the reading needs of the index besides (path_ and kind_ never change).
    const std::vector<std::string> uncounted = uncounted_;
    lock.unlock();
    if (r.exact && kind_ == FileKind::history) {
      // The whole of a history: from the writer's block summary where it
      // serves, else in pieces read side by side where it is long (a system
      // sample's step is its line's number: that file is read in one).
      std::optional<Error> summed;
      if (from == 0) summed = read_blocks(uncounted, end, keys, collectors, width, r.x, r.x_key, lo, hi);
      problem = summed ? *summed : read_pieces(uncounted, from, end, keys, collectors, width, r.x, r.x_key, lo, hi);
    } else {
      problem = read_range(uncounted, from, end, row, 0, std::numeric_limits<std::size_t>::max(), keys, into, r.x,
                           r.x_key, lo, hi);
    }
    const bool none = std::all_of(collectors.begin(), collectors.end(), [](const Collector& c) { return c.n() == 0; });
    const std::string extra =
        std::string(",\"overview\":false") + (!r.x_key.empty() && !x_known && none ? ",\"x_missing\":true" : "");
    put_answer(out, lo, hi, rows, extra, problem, r.keys, collectors, [&](std::size_t i) {
      // A key no line of the overview has, nor any line of the range read.
      if (!known[i] && collectors[i].n() == 0) out += ",\"missing\":true";
    });
    return;
  }
  std::string extra = ",\"overview\":true";
  if (!r.x_key.empty() && x_key == o.by_name.end()) extra += ",\"x_missing\":true";
  put_answer(out, lo, hi, o.rows, extra, problem, r.keys, collectors, [&](std::size_t i) {
    // A key no line of the overview has.
    if (!o.by_name.contains(r.keys[i])) out += ",\"missing\":true";
  });
}

void LinesIndex::series_json(const SeriesRequest& r, std::string& out) const {
  std::shared_lock lock(mutex_);
  if (overview_) {
    overview_json(r, out, lock);
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
  // Plain variables, not structured bindings: the lambdas below capture them (clang before 16 cannot).
  const std::pair<double, double> range = range_of(r, all_lo, all_hi);
  const double lo = range.first, hi = range.second;
  const std::size_t width = std::max<std::size_t>(r.width, 1);
  const std::pair<std::size_t, std::size_t> rows =
      !keyed ? rows_in(r.x, lo, hi) : x_key ? rows_in(*x_key, lo, hi) : std::pair<std::size_t, std::size_t>{0, 0};
  const std::size_t first = rows.first, last = rows.second;
  // A range of at most this many points of a key is read from the file:
  // every point is then there, or the exact smallest and largest of each pixel.
  const std::uint64_t read_at_most = std::max<std::uint64_t>(4096, std::uint64_t(block_points) * width);

  std::vector<Collector> collectors;
  collectors.reserve(r.keys.size());
  std::vector<const Key*> found(r.keys.size(), nullptr);
  std::vector<std::string_view> to_read;
  std::vector<Collector*> read_into;
  std::size_t read_first = last, read_last = first;
  // Keys drawn from their blocks: the blocks at the range's ends, whose rows
  // hold its first and last point.
  struct Edges {
    std::size_t key;
    std::vector<Block>::const_iterator begin, end;
  };
  std::vector<Edges> edges;
  for (std::size_t i = 0; i < r.keys.size(); ++i) {
    Collector& c = collectors.emplace_back(lo, hi, width);
    const auto it = by_name_.find(r.keys[i]);
    if (it == by_name_.end() || first >= last) continue;
    const Key& k = keys_[it->second];
    found[i] = &k;
    // Its NaN and infinities, where the index knows their x (else the file read gives them).
    if (!keyed || x_key->exact) mark_nonfinite(k, first, last, lo, hi, x_at, c);
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
    edges.push_back({i, b, e});
  }
  Error problem;
  if (!to_read.empty() && read_first < read_last)
    problem = scan(read_first, read_last, to_read, read_into, r.x, r.x_key, lo, hi);
  // The range's first and last point of a key drawn from its blocks: read
  // from the file, a block at a time from each end until one lies in the
  // range (a few blocks at most: the rows found for the range reach out of
  // it by less than a mark's).
  constexpr int edge_blocks = 4;
  for (const Edges& g : edges) {
    const std::vector<std::string_view> name{found[g.key]->name};
    const auto read_block = [&](const Block& bl, Collector& into) {
      const std::size_t from = std::max<std::size_t>(first, bl.first_row);
      const std::size_t to = std::min<std::size_t>(last, std::size_t{bl.last_row} + 1);
      if (from >= to) return;
      const Error e = scan(from, to, name, {&into}, r.x, r.x_key, lo, hi);
      if (e && !problem) problem = e;
    };
    Collector head(lo, hi, 1), tail(lo, hi, 1);
    int n = 0;
    for (auto p = g.begin; p != g.end && head.n() == 0 && n < edge_blocks; ++p, ++n) read_block(*p, head);
    n = 0;
    for (auto p = g.end; p != g.begin && tail.n() == 0 && n < edge_blocks; ++n) read_block(*--p, tail);
    head.edge_to(collectors[g.key], true);
    tail.edge_to(collectors[g.key], false);
  }
  const std::string_view extra = keyed && !x_key ? ",\"x_missing\":true" : "";
  put_answer(out, lo, hi, step_.size(), extra, problem, r.keys, collectors, [&](std::size_t i) {
    if (found[i]) out += ",\"nan\":" + std::to_string(found[i]->nans) + ",\"inf\":" + std::to_string(found[i]->infs);
    else out += ",\"missing\":true";
  });
}

void LinesIndex::keys_json(std::string& out) const {
  std::shared_lock lock(mutex_);
  out += '[';
  // The first and last step of a history's key; the first and last time of a system key.
  const auto put_ends = [&](std::int64_t first_step, std::int64_t last_step, double first_time, double last_time) {
    if (kind_ == FileKind::history) {
      out += ",\"first_step\":" + std::to_string(first_step) + ",\"last_step\":" + std::to_string(last_step);
    } else {
      out += ",\"first_time\":";
      core::append_json_number(out, first_time);
      out += ",\"last_time\":";
      core::append_json_number(out, last_time);
    }
  };
  if (overview_) {
    // While the index is built: the keys of the overview's lines, their points
    // estimated, their NaN and infinities those met on its lines.
    const Overview& o = *overview_;
    for (std::size_t i = 0; i < o.keys.size(); ++i) {
      const Overview::Series& k = o.keys[i];
      if (i) out += ',';
      out += "{\"key\":";
      core::append_json_string(out, k.name);
      out += ",\"points\":" + std::to_string(std::llround(static_cast<double>(k.points.size()) * o.scale()));
      const auto nans = std::count_if(k.nonfinite.begin(), k.nonfinite.end(), [](const auto& p) { return std::isnan(p.second); });
      out += ",\"nan\":" + std::to_string(nans) +
             ",\"inf\":" + std::to_string(static_cast<std::int64_t>(k.nonfinite.size()) - nans) + ",\"estimated\":true";
      if (!k.points.empty()) {
        double lo = k.points.front().second, hi = lo;
        for (const auto& p : k.points) lo = std::min(lo, p.second), hi = std::max(hi, p.second);
        out += ",\"min\":";
        core::append_json_number(out, lo);
        out += ",\"max\":";
        core::append_json_number(out, hi);
        out += ",\"last\":";
        core::append_json_number(out, k.points.back().second);
        const Overview::Line &a = o.lines[k.points.front().first], &b = o.lines[k.points.back().first];
        put_ends(a.step, b.step, a.wall, b.wall);
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
    core::append_json_string(out, k.name);
    out += ",\"points\":" + std::to_string(k.points) + ",\"nan\":" + std::to_string(k.nans) +
           ",\"inf\":" + std::to_string(k.infs);
    if (k.points > 0) {
      out += ",\"min\":";
      core::append_json_number(out, k.min);
      out += ",\"max\":";
      core::append_json_number(out, k.max);
      out += ",\"last\":";
      core::append_json_number(out, k.last);
      put_ends(step_[k.first_row], step_[k.last_row], wall_[k.first_row], wall_[k.last_row]);
    }
    out += '}';
  }
  out += ']';
}

} // namespace chorus::cli::serve
