// The downsampling of one key's points for a chart of `chorus serve`
// (LinesIndex::Collector, declared in lines_detail.hpp): at most two points
// a pixel, the smallest and largest of each of width - 1 buckets and the
// range's first and last point; the pixels where the key was NaN or
// infinite; and the JSON of one series of a /api/series answer.
#include "cli/serve/lines_detail.hpp"

#include "runtime/core/json.hpp"

namespace chorus::cli::serve {
namespace lines {

void put_number(std::string& out, double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 0x1p53) {
    out += std::to_string(static_cast<std::int64_t>(v));
    return;
  }
  core::append_json_number(out, v);
}

} // namespace lines

std::size_t LinesIndex::Collector::part_of(double x, std::size_t parts) const {
  const double span = hi_ - lo_;
  const double f = span > 0 ? (x - lo_) / span * static_cast<double>(parts) : 0;
  return f <= 0 ? 0 : std::min(parts - 1, static_cast<std::size_t>(f));
}

std::size_t LinesIndex::Collector::buckets() const {
  // One bucket fewer than pixels: with the range's first and last point, an
  // answer holds at most two points a pixel.
  return std::max<std::size_t>(width_ - 1, 1);
}

void LinesIndex::Collector::add(double x, double v) {
  ++n_;
  edge(x, v);
  if (buckets_.empty()) {
    points_.push_back({x, v});
    if (points_.size() > 2 * width_) bucket();
    return;
  }
  put(x, v);
}

void LinesIndex::Collector::edge(double x, double v) {
  // The first of the smallest x, the last of the largest: rows come in order.
  if (!edged_ || x < first_.x) first_ = {x, v};
  if (!edged_ || x >= last_.x) last_ = {x, v};
  edged_ = true;
}

void LinesIndex::Collector::edge_to(Collector& to, bool first) const {
  if (!edged_) return;
  const Pt& p = first ? first_ : last_;
  to.edge(p.x, p.v);
}

void LinesIndex::Collector::mark(double x, double v) {
  if (std::isnan(x)) return;
  std::vector<double>& m = marks_[std::isnan(v) ? 0 : v > 0 ? 1 : 2];
  if (m.empty()) m.assign(width_, lines::nan_v);
  double& at = m[part_of(x, width_)];
  if (std::isnan(at) || x < at) at = x;
}

void LinesIndex::Collector::merge(Collector&& later) {
  n_ += later.n_;
  counted_ += later.counted_;
  if (later.edged_) {
    if (!edged_ || later.first_.x < first_.x) first_ = later.first_;
    if (!edged_ || later.last_.x >= last_.x) last_ = later.last_;
    edged_ = true;
  }
  for (int k = 0; k < 3; ++k) {
    if (later.marks_[k].empty()) continue;
    if (marks_[k].empty()) marks_[k].assign(width_, lines::nan_v);
    for (std::size_t i = 0; i < width_; ++i)
      if (!std::isnan(later.marks_[k][i]) && !(later.marks_[k][i] >= marks_[k][i])) marks_[k][i] = later.marks_[k][i];
  }
  if (buckets_.empty() && later.buckets_.empty()) {
    points_.insert(points_.end(), later.points_.begin(), later.points_.end());
    if (points_.size() > 2 * width_) bucket();
    return;
  }
  if (buckets_.empty()) bucket();
  if (later.buckets_.empty()) later.bucket();
  // A bucket keeps the first of its smallest and of its largest values: this one's, where they tie.
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    const Bucket& l = later.buckets_[i];
    if (l.n == 0) continue;
    if (b.n == 0) {
      b = l;
      continue;
    }
    b.n += l.n;
    if (l.lo.v < b.lo.v) b.lo = l.lo;
    if (l.hi.v > b.hi.v) b.hi = l.hi;
  }
}

void LinesIndex::Collector::bucket() {
  buckets_.resize(buckets());
  for (const Pt& p : points_) put(p.x, p.v);
  points_.clear();
  points_.shrink_to_fit();
}

void LinesIndex::Collector::put(double x, double v) {
  Bucket& b = buckets_[part_of(x, buckets_.size())];
  if (b.n++ == 0) {
    b.lo = b.hi = {x, v};
    return;
  }
  if (v < b.lo.v) b.lo = {x, v};
  if (v > b.hi.v) b.hi = {x, v};
}

void LinesIndex::Collector::json(std::string& out) {
  const auto has = [](const std::vector<Pt>& pts, const Pt& e) {
    return std::any_of(pts.begin(), pts.end(), [&](const Pt& p) { return p.x == e.x && p.v == e.v; });
  };
  // Points standing for blocks (count()), with edges that are not among
  // them, may be more than two a pixel: bucketed then.
  if (buckets_.empty() && edged_ &&
      points_.size() + !has(points_, first_) + !has(points_, last_) > 2 * width_)
    bucket();
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
  // The range's first and last point, where a pixel's smallest and largest left them out.
  if (edged_)
    for (const Pt& e : {first_, last_})
      if (!has(pts, e)) pts.push_back(e);
  std::stable_sort(pts.begin(), pts.end(), [](const Pt& a, const Pt& b) { return a.x < b.x; });
  out += "{\"n\":" + std::to_string(n()) + ",\"full\":" + (buckets_.empty() && counted_ == 0 ? "true" : "false");
  out += ",\"x\":[";
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (i) out += ',';
    lines::put_number(out, pts[i].x);
  }
  out += "],\"y\":[";
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (i) out += ',';
    core::append_json_number(out, pts[i].v);
  }
  out += "]";
  if (std::all_of(std::begin(marks_), std::end(marks_), [](const std::vector<double>& m) { return m.empty(); }))
    return;
  out += ",\"nonfinite\":{";
  bool first_kind = true;
  for (int k = 0; k < 3; ++k) {
    if (marks_[k].empty()) continue;
    out += first_kind ? "" : ",";
    first_kind = false;
    out += k == 0 ? "\"nan\":[" : k == 1 ? "\"inf\":[" : "\"-inf\":[";
    bool first_x = true;
    for (const double x : marks_[k]) { // in pixel order: sorted by x
      if (std::isnan(x)) continue;
      if (!first_x) out += ',';
      first_x = false;
      lines::put_number(out, x);
    }
    out += ']';
  }
  out += '}';
}

} // namespace chorus::cli::serve
