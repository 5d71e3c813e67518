#include "cli/serve/histogram_index.hpp"

#include "io/platform/posix.hpp"
#include "io/store/json_lines.hpp"
#include "runtime/core/histogram.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fcntl.h>
#include <limits>
#include <mutex>
#include <unistd.h>

namespace chorus::cli::serve {
namespace {

void rank_json(core::JsonWriter& w, const std::optional<int>& rank) {
  w.key("rank");
  if (rank) w.integer(*rank);
  else w.null();
}

} // namespace

std::vector<Histogram::Bucket> rebin(const Histogram& h, std::size_t bins) {
  std::vector<Histogram::Bucket> out;
  if (h.finite_count() == 0 || bins == 0) return out;
  const double lo = h.min(), hi = h.max();
  // In halves: hi - lo overflows where the values span the doubles.
  const double span = hi / 2 - lo / 2;
  const std::size_t parts = span > 0 ? bins : 1;
  out.assign(parts, {lo, hi, 0});
  // Each part's buckets: the first one's lower bound and the last one's upper, within [lo, hi] (NaN: none).
  const double none = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<double, double>> ends(parts, {none, none});
  for (const Histogram::Bucket& b : h.buckets()) {
    const double mid = std::clamp(b.lo / 2 + b.hi / 2, lo, hi);
    const std::size_t at =
        span > 0 ? std::min(parts - 1, static_cast<std::size_t>((mid / 2 - lo / 2) / span * static_cast<double>(parts)))
                 : 0;
    out[at].count += b.count;
    if (std::isnan(ends[at].first)) ends[at].first = std::max(b.lo, lo);
    ends[at].second = std::min(b.hi, hi);
  }
  // Between parts k - 1 and k: the even cut, moved onto the buckets' edges where a bucket lies across it.
  double below = lo; // the upper bound of the last bucket before the cut
  for (std::size_t k = 1; k < parts; ++k) {
    if (!std::isnan(ends[k - 1].second)) below = ends[k - 1].second;
    double above = hi; // the lower bound of the first bucket after it
    for (std::size_t j = k; j < parts; ++j)
      if (!std::isnan(ends[j].first)) {
        above = ends[j].first;
        break;
      }
    const double even = 2 * (lo / 2 + span * static_cast<double>(k) / static_cast<double>(parts));
    const double cut = std::clamp(even, below, above);
    out[k - 1].hi = cut;
    out[k].lo = cut;
  }
  return out;
}

HistogramIndex::HistogramIndex(std::string path, std::uint64_t step_bytes_)
    : file_(path), path_(std::move(path)), step_bytes_(std::max<std::uint64_t>(step_bytes_, store::max_line_bytes + 1)) {}

bool HistogramIndex::refresh() {
  std::unique_lock lock(mutex_);
  IndexState& s = file_.counts();
  simdjson::dom::parser parser;
  const auto forget = [&] {
    columns_.clear();
    points_ = 0;
  };
  const bool changed = file_.follow(step_bytes_, forget, [&](std::string_view line, std::uint64_t offset) -> std::string {
    simdjson::dom::element doc;
    if (auto e = parser.parse(line.data(), line.size(), false).get(doc)) return simdjson::error_message(e);
    const Result<store::HistogramLine> h = store::read_histogram_line(doc);
    if (!h) return h.error().message();
    Point p{.step = h->step,
            .wall = h->timestamp,
            .rel = h->runtime,
            .offset = offset,
            .length = static_cast<std::uint32_t>(line.size()), // a line is at most 16 MiB
            .ranks = h->ranks,
            .count = h->value.count(),
            .nan = h->value.nan_count(),
            .inf = h->value.pos_inf_count(),
            .ninf = h->value.neg_inf_count()};
    for (std::size_t i = 0; i < quantiles.size(); ++i) p.q[i] = h->value.quantile(quantiles[i]);
    std::string name = h->column();
    auto it = columns_.find(name);
    if (it == columns_.end()) it = columns_.emplace(std::move(name), Column{std::string(h->key), h->rank, {}}).first;
    it->second.points.push_back(p);
    ++points_;
    s.last_step = std::max(s.last_step, h->step);
    ++s.rows;
    return {};
  });
  s.keys = columns_.size();
  return changed;
}

IndexState HistogramIndex::state() const {
  std::shared_lock lock(mutex_);
  return file_.state();
}

std::size_t HistogramIndex::memory() const {
  std::shared_lock lock(mutex_);
  std::size_t bytes = sizeof *this;
  for (const auto& [name, c] : columns_)
    bytes += sizeof(Column) + 64 + name.capacity() + c.key.capacity() + c.points.capacity() * sizeof(Point);
  return bytes;
}

void HistogramIndex::columns_json(core::JsonWriter& w) const {
  std::shared_lock lock(mutex_);
  // By key, its merged column first, then its ranks in order.
  std::vector<const std::pair<const std::string, Column>*> order;
  for (const auto& entry : columns_) order.push_back(&entry);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->second.key, a->second.rank) < std::tie(b->second.key, b->second.rank);
  });
  w.begin_array();
  for (const auto* entry : order) {
    const Column& c = entry->second;
    w.begin_object().key("column").string(entry->first).key("key").string(c.key);
    rank_json(w, c.rank);
    w.key("steps").uinteger(c.points.size());
    w.key("first_step").integer(c.points.front().step).key("last_step").integer(c.points.back().step);
    w.end_object();
  }
  w.end_array();
}

Result<store::HistogramLine> HistogramIndex::line_at(const Point& p, const std::string& column,
                                                  simdjson::dom::parser& parser, std::string& text) const {
  const Result<int> fd = platform::open_regular(path_, O_RDONLY);
  if (!fd) return fd.error();
  text.assign(p.length + simdjson::SIMDJSON_PADDING, '\0');
  std::size_t got = 0;
  while (got < p.length) {
    const ssize_t n = ::pread(*fd, text.data() + got, p.length - got, static_cast<off_t>(p.offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  platform::close_fd(*fd);
  const Error changed(Errc::io_error, path_ + " changed while it was read (rewritten by chorus recover?): ask again");
  simdjson::dom::element doc;
  if (got < p.length || parser.parse(text.data(), p.length, false).get(doc) != simdjson::SUCCESS) return changed;
  Result<store::HistogramLine> line = store::read_histogram_line(doc);
  if (!line || line->step != p.step || line->column() != column) return changed;
  return line;
}

Result<bool> HistogramIndex::column_json(const HistogramRequest& r, core::JsonWriter& w) const {
  std::shared_lock lock(mutex_);
  const auto it = columns_.find(r.column);
  if (it == columns_.end()) return false;
  const Column& c = it->second;
  const std::vector<Point>& ps = c.points;

  // The step whose buckets are drawn: read back first, so that an error leaves nothing written.
  std::size_t at = ps.size() - 1;
  if (r.step) {
    const auto after = std::upper_bound(ps.begin(), ps.end(), *r.step,
                                        [](std::int64_t s, const Point& p) { return s < p.step; });
    at = after == ps.begin() ? 0 : static_cast<std::size_t>(after - ps.begin()) - 1;
  }
  simdjson::dom::parser parser;
  std::string text;
  const Result<store::HistogramLine> line = line_at(ps[at], r.column, parser, text);
  if (!line) return line.error();

  w.key("column").string(r.column).key("key").string(c.key);
  rank_json(w, c.rank);
  w.key("steps").uinteger(ps.size());
  w.key("first_step").integer(ps.front().step).key("last_step").integer(ps.back().step);

  // The steps drawn: evenly spread, the first and the last among them.
  const std::size_t n = std::min(r.points, ps.size());
  std::vector<std::size_t> picks(n);
  for (std::size_t i = 0; i < n; ++i)
    picks[i] = n == 1 ? ps.size() - 1 : (i * (ps.size() - 1) + (n - 1) / 2) / (n - 1);
  w.key("full").boolean(n == ps.size());
  auto series = [&](const char* name, auto value) {
    w.key(name).begin_array();
    for (const std::size_t i : picks) value(ps[i]);
    w.end_array();
  };
  w.key("series").begin_object();
  series("step", [&](const Point& p) { w.integer(p.step); });
  series("wall", [&](const Point& p) { w.number(p.wall); });
  series("rel", [&](const Point& p) { w.number(p.rel); });
  for (std::size_t q = 0; q < quantiles.size(); ++q)
    series(quantile_names[q], [&](const Point& p) { w.number(p.q[q]); });
  series("count", [&](const Point& p) { w.uinteger(p.count); });
  series("nan", [&](const Point& p) { w.uinteger(p.nan); });
  series("inf", [&](const Point& p) { w.uinteger(p.inf); });
  series("-inf", [&](const Point& p) { w.uinteger(p.ninf); });
  series("ranks", [&](const Point& p) { w.uinteger(p.ranks); });
  w.end_object();

  const Histogram& h = line->value;
  w.key("at").begin_object().key("step").integer(line->step).key("timestamp").number(line->timestamp);
  w.key("runtime").number(line->runtime).key("ranks").uinteger(line->ranks);
  w.key("count").uinteger(h.count()).key("finite").uinteger(h.finite_count()).key("sum").number(h.sum());
  for (const auto& [name, v] : {std::pair{"min", h.min()}, std::pair{"max", h.max()}}) {
    w.key(name);
    if (h.finite_count() != 0) w.number(v);
    else w.null();
  }
  w.key("nan").uinteger(h.nan_count()).key("inf").uinteger(h.pos_inf_count()).key("-inf").uinteger(h.neg_inf_count());
  w.key("buckets").uinteger(core::HistogramAccess::buckets(h).size());
  w.key("bins").begin_array();
  for (const Histogram::Bucket& b : rebin(h, r.bins))
    w.begin_array().number(b.lo).number(b.hi).uinteger(b.count).end_array();
  w.end_array().end_object();
  return true;
}

} // namespace chorus::cli::serve
