// histograms.jsonl's lines: see io/store/histogram_log.hpp.
#include "io/store/histogram_log.hpp"
#include "io/store/history_value.hpp"
#include "runtime/core/bytes.hpp"
#include "runtime/core/histogram.hpp"
#include "runtime/core/json.hpp"

#include <cmath>
#include <cstring>
#include <vector>

namespace chorus::store {

void append_histogram_line(std::string& out, std::int64_t step, std::int64_t ts_us, std::int64_t runtime_us,
                           std::string_view key, std::int32_t rank, std::uint32_t ranks, const Histogram& h) {
  core::JsonWriter w(out);
  w.begin_object();
  w.key("_step").integer(step).key("_timestamp").seconds(ts_us).key("_runtime").seconds(runtime_us);
  w.key("key").string(key).key("rank");
  if (rank < 0)
    w.null();
  else
    w.integer(rank);
  if (ranks != 0) w.key("_count").uinteger(ranks);
  w.key("count").uinteger(h.count()).key("sum").number(h.sum());
  w.key("min");
  if (h.finite_count() != 0)
    w.number(h.min());
  else
    w.null();
  w.key("max");
  if (h.finite_count() != 0)
    w.number(h.max());
  else
    w.null();
  w.key("nan").uinteger(h.nan_count()).key("inf").uinteger(h.pos_inf_count()).key("-inf").uinteger(h.neg_inf_count());
  w.key("buckets").begin_array();
  for (const auto& [i, k] : core::HistogramAccess::buckets(h)) w.begin_array().integer(i).uinteger(k).end_array();
  w.end_array().end_object();
  out.push_back('\n');
}

std::string HistogramLine::column() const {
  std::string out(key);
  if (rank) out += "/rank-" + std::to_string(*rank);
  return out;
}

namespace {
using chorus::core::bytes::put;

Error bad(std::string_view what) {
  return {Errc::invalid_argument, "a histograms.jsonl line " + std::string(what) +
                                      ": the file was not written by chorus, or was damaged; `chorus recover RUN` "
                                      "rebuilds it from the run's WAL"};
}
} // namespace

Result<HistogramLine> read_histogram_line(const simdjson::dom::element& line) {
  using simdjson::SUCCESS;
  simdjson::dom::object o;
  if (line.get(o) != SUCCESS) return bad("is not a JSON object");
  HistogramLine out;
  if (o["_step"].get(out.step) != SUCCESS || out.step < 0) return bad("has no whole _step of 0 or more");
  if (o["key"].get(out.key) != SUCCESS || out.key.empty()) return bad("has no key");
  if (o["_timestamp"].get(out.timestamp) != SUCCESS) out.timestamp = 0; // optional, as in history rows
  if (o["_runtime"].get(out.runtime) != SUCCESS) out.runtime = 0;
  simdjson::dom::element rank;
  if (o["rank"].get(rank) == SUCCESS && !rank.is_null()) {
    std::int64_t r = 0;
    if (rank.get(r) != SUCCESS || r < 0 || r > INT32_MAX) return bad("has a rank that is no whole number");
    out.rank = static_cast<int>(r);
  }
  std::uint64_t ranks = 0;
  if (o["_count"].get(ranks) == SUCCESS) out.ranks = static_cast<std::uint32_t>(std::min<std::uint64_t>(ranks, UINT32_MAX));

  // The histogram travels through its binary encoding, whose decoder checks it whole.
  std::uint64_t nan = 0, pinf = 0, ninf = 0;
  if (o["nan"].get(nan) != SUCCESS || o["inf"].get(pinf) != SUCCESS || o["-inf"].get(ninf) != SUCCESS)
    return bad("lacks its nan, inf or -inf counts");
  simdjson::dom::element sum_el, min_el, max_el;
  if (o["sum"].get(sum_el) != SUCCESS || o["min"].get(min_el) != SUCCESS || o["max"].get(max_el) != SUCCESS)
    return bad("lacks its sum, min or max");
  const std::optional<double> sum = metric_value(sum_el);
  const std::optional<double> lo = min_el.is_null() ? std::optional<double>(0.0) : metric_value(min_el);
  const std::optional<double> hi = max_el.is_null() ? std::optional<double>(0.0) : metric_value(max_el);
  if (!sum || !lo || !hi) return bad("has a sum, min or max that is no number");
  simdjson::dom::array buckets;
  if (o["buckets"].get(buckets) != SUCCESS) return bad("has no buckets array");
  std::vector<char> bytes;
  bytes.reserve(core::histogram::head_bytes + buckets.size() * core::histogram::bucket_bytes);
  put(bytes, nan);
  put(bytes, pinf);
  put(bytes, ninf);
  put(bytes, *sum);
  put(bytes, *lo);
  put(bytes, *hi);
  put(bytes, static_cast<std::uint32_t>(buckets.size()));
  for (simdjson::dom::element b : buckets) {
    simdjson::dom::array pair;
    std::int64_t i = 0;
    std::uint64_t k = 0;
    if (b.get(pair) != SUCCESS || pair.size() != 2 || pair.at(0).get(i) != SUCCESS || pair.at(1).get(k) != SUCCESS ||
        i < INT32_MIN || i > INT32_MAX)
      return bad("has a bucket that is not [index, count]");
    put(bytes, static_cast<std::int32_t>(i));
    put(bytes, k);
  }
  if (!core::histogram::decode(bytes, out.value))
    return bad("has buckets out of order or outside the layout, or a min or max outside them");
  std::uint64_t count = 0;
  if (o["count"].get(count) != SUCCESS || count != out.value.count())
    return bad("has a count that is not the sum of its buckets and non-finite counts");
  return out;
}

} // namespace chorus::store
