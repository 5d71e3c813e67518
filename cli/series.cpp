#include "cli/series.hpp"

#include "cli/cli.hpp"
#include "io/store/history_row.hpp"
#include "io/store/json_lines.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace chorus::cli {
namespace {

// Folds each pair of neighbours into one: half the buckets, twice the points each.
void halve(std::vector<Bucket>& b) {
  std::size_t out = 0;
  for (std::size_t i = 0; i < b.size(); i += 2, ++out) {
    Bucket m = b[i];
    if (i + 1 < b.size()) {
      const Bucket& n = b[i + 1];
      m.step_hi = n.step_hi;
      m.min = std::min(m.min, n.min);
      m.max = std::max(m.max, n.max);
      m.sum += n.sum;
      m.last = n.last;
      m.n += n.n;
    }
    b[out] = m;
  }
  b.resize(out);
}

// Folds the rows' values into one series per key.
class Reader {
public:
  Reader(History& h, const std::function<bool(std::string_view)>& wanted, const HistoryShape& shape)
      : h_(h), wanted_(wanted), shape_(shape) {}

  std::string_view take(const simdjson::dom::object& row) {
    const store::HistoryRow r(row);
    if (!r) return r.why();
    std::int64_t x = r.step();
    if (shape_.x == XAxis::time) {
      const std::optional<double> runtime = r.runtime();
      if (!runtime || !(*runtime >= 0 && *runtime <= 1e15)) return "no numeric _runtime";
      x = std::llround(*runtime * 1000);
    }
    ++h_.rows;
    for (const store::RowValue& m : r.metrics()) {
      const std::string_view key = m.key;
      auto it = index_.find(key);
      if (it == index_.end()) {
        const bool keep = !wanted_ || wanted_(key);
        it = index_.emplace(std::string(key), keep ? static_cast<std::ptrdiff_t>(h_.series.size()) : -1).first;
        if (keep) {
          h_.series.emplace_back(std::string(key), shape_.x);
          smoothing_.emplace_back(shape_.smooth);
        }
      }
      if (it->second < 0) continue;
      const auto i = static_cast<std::size_t>(it->second);
      h_.series[i].add(x, smoothing_[i](m.value));
    }
    return {};
  }

private:
  History& h_;
  const std::function<bool(std::string_view)>& wanted_;
  const HistoryShape& shape_;
  std::map<std::string, std::ptrdiff_t, std::less<>> index_; // -1: not wanted
  std::vector<Smoothing> smoothing_; // by series
};

} // namespace

bool per_rank_key(std::string_view key) {
  const auto at = key.rfind("/rank-");
  if (at == std::string_view::npos || at + 6 == key.size()) return false;
  return std::all_of(key.begin() + static_cast<std::ptrdiff_t>(at + 6), key.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

std::string_view base_key(std::string_view key) {
  return per_rank_key(key) ? key.substr(0, key.rfind("/rank-")) : key;
}

bool Series::per_rank() const { return per_rank_key(key_); }

std::string x_text(std::int64_t x, XAxis axis) {
  if (axis == XAxis::step) return std::to_string(x);
  return format_duration(static_cast<double>(x) / 1000.0);
}

std::string_view x_unit(XAxis axis) { return axis == XAxis::step ? "_step" : "into the run"; }

std::vector<bool> chart_choice(const std::vector<std::string_view>& keys, std::size_t charts, bool picked) {
  const bool all = picked || keys.size() <= charts;
  std::vector<bool> chart(keys.size(), false);
  std::size_t n = 0;
  for (std::size_t i = 0; i < keys.size() && n < charts; ++i)
    if (all || !per_rank_key(keys[i])) chart[i] = true, ++n;
  return chart;
}

void Series::add(std::int64_t step, double v) {
  if (std::isnan(v)) {
    ++nans_;
    return;
  }
  if (std::isinf(v)) {
    ++infs_;
    return;
  }
  if (points_ == 0) {
    min_ = max_ = v;
    first_step_ = step;
  }
  ++points_;
  min_ = std::min(min_, v);
  max_ = std::max(max_, v);
  last_ = v;
  last_step_ = step;
  if (buckets_.empty() || buckets_.back().n >= per_bucket_) {
    if (buckets_.size() == max_buckets) {
      halve(buckets_);
      per_bucket_ *= 2;
    }
    if (buckets_.empty() || buckets_.back().n >= per_bucket_) {
      buckets_.push_back(Bucket{step, step, v, v, v, v, 1});
      return;
    }
  }
  Bucket& b = buckets_.back();
  b.step_hi = step;
  b.min = std::min(b.min, v);
  b.max = std::max(b.max, v);
  b.sum += v;
  b.last = v;
  ++b.n;
}

History read_history(const std::string& path, const std::function<bool(std::string_view)>& wanted,
                     const HistoryShape& shape) {
  History h;
  Reader reader(h, wanted, shape);
  const store::JsonLines lines = store::read_json_lines(path, [&](const simdjson::dom::object& row) { return reader.take(row); });
  h.bad_lines = lines.skipped;
  if (lines.skipped > 0)
    h.first_bad.append("line ").append(std::to_string(lines.first_skipped_line)).append(": ").append(
        lines.first_skipped_why);
  h.problem = lines.problem;
  return h;
}

} // namespace chorus::cli
