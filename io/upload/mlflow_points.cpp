// MlflowPoints (io/upload/mlflow_points.hpp): history and system lines → log-batch
// requests, a window of them in flight at once.
#include "io/upload/mlflow_points.hpp"
#include "io/store/history_row.hpp"

#include "runtime/core/json.hpp"

#include <algorithm>
#include <cmath>

namespace chorus::io::detail {
namespace {

constexpr std::uint64_t end_of_line = ~std::uint64_t{0}; // a Point that only moves past its line
constexpr const char* offset_tag = "chorus.upload.offset"; // one request at a time, before (read only)

/// The whole lines of a file's slice before `at`.
std::size_t lines_before(std::span<const Cursor> after, const Place& at) {
  std::size_t n = 0;
  while (n < after.size() && after[n].bytes <= at.at.bytes) ++n;
  return n;
}

} // namespace

Sent mlflow_failed(const HttpResponse& r, const std::string& what) {
  return not_delivered(r, "MLflow", what, "set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD");
}

/// One metric to send, and where it sits in the run directory.
struct MlflowPoints::Point {
  std::string key; // mapped
  double value;
  std::int64_t ts_ms;
  std::int64_t step;
  bool history;     // else system
  std::size_t line; // index in the Batch's slice
  std::uint64_t index; // value index within its line
};

void MlflowPoints::take_up(simdjson::dom::element doc, const std::string& run_dir, UploadState& st) {
  std::vector<Span> spans;
  std::optional<Prefix> prefix;
  read_span_tags(doc, spans, prefix);
  // The server got batches whose answers were lost (or the offsets file is
  // new: the same server spelled another way): take its word, and count
  // what it got as delivered.
  if (prefix && beyond(prefix->history, Place{st.history, st.history_part})) {
    st.points += values_between(run_dir + "/history.jsonl", true, st.history, st.history_part, prefix->history.at,
                                prefix->history.part);
    st.history = prefix->history.at, st.history_part = prefix->history.part;
  }
  if (prefix && beyond(prefix->system, Place{st.system, st.system_part})) {
    st.points += values_between(run_dir + "/system.jsonl", false, st.system, st.system_part, prefix->system.at,
                                prefix->system.part);
    st.system = prefix->system.at, st.system_part = prefix->system.part;
  }
  // Spans of batches sent several at once: settled against the slice by the first send.
  uncertain_ = !spans.empty();
}

/// The values of a JSON-lines file from one position (cursor and values
/// of its line already counted) to another, as gather() counts them.
std::uint64_t MlflowPoints::values_between(const std::string& path, bool history, Cursor from, std::uint64_t from_part,
                                           Cursor to, std::uint64_t to_part) {
  std::uint64_t n = 0;
  LineSlice slice;
  while (from.bytes < to.bytes) {
    if (read_lines(path, from, 1u << 20, slice) || slice.lines.empty()) return n;
    for (std::size_t i = 0; i < slice.lines.size() && from.bytes < to.bytes; ++i) {
      const std::uint64_t v = count_values(slice.lines[i], history);
      n += v - std::min(v, from_part);
      from_part = 0;
      from = slice.after[i];
    }
  }
  return n + (to_part > from_part ? to_part - from_part : 0);
}

/// Reads up to `limit` points from the Batch, history first.
void MlflowPoints::gather(const Batch& b, const UploadState& st, std::size_t limit, std::vector<Point>& points,
                          std::vector<std::string>& bad) {
  std::size_t metrics = 0; // points to send; the end-of-line markers are not sent and not counted
  auto take = [&](std::span<const std::string_view> lines, Cursor from, bool history, std::uint64_t part) {
    for (std::size_t i = 0; i < lines.size() && metrics < limit; ++i) {
      simdjson::dom::element doc;
      simdjson::dom::object obj;
      std::optional<HistoryRow> row;
      std::string_view why;
      if (parser_.parse(lines[i].data(), lines[i].size()).get(doc) != simdjson::SUCCESS ||
          doc.get(obj) != simdjson::SUCCESS)
        why = "not a JSON object";
      else if (history)
        why = row.emplace(obj).why();
      if (!why.empty()) {
        std::string line = "{\"part\":\"";
        line += history ? "history" : "system";
        line += "\",\"line\":" + std::to_string(from.lines + i) + ",\"why\":";
        append_json_string(line, why);
        line += '}';
        bad.push_back(std::move(line));
        points.push_back(Point{{}, 0, 0, 0, history, i, end_of_line}); // a marker that consumes the line
        continue;
      }
      double ts = 0;
      if (row) ts = row->timestamp().value_or(0);
      else if (obj["_timestamp"].get(ts) != simdjson::SUCCESS) ts = 0;
      const auto step = row ? row->step() : static_cast<std::int64_t>(from.lines + i);
      std::uint64_t index = 0;
      for (const RowValue& f : row ? row->metrics() : RowValues(obj)) {
        const std::uint64_t at = index++;
        if (i == 0 && at < part) continue; // sent before
        std::string key;
        if (!history && f.key.starts_with("system.")) {
          key = "system/";
          key.append(f.key.substr(7));
        } else {
          key = std::string(f.key);
        }
        points.push_back(Point{api_.map_key(key), f.value, static_cast<std::int64_t>(std::llround(ts * 1000.0)), step, history, i, at});
        if (++metrics >= limit) return;
      }
      // A line whose every value fitted: a marker so the line counts as consumed even with no values.
      points.push_back(Point{{}, 0, 0, 0, history, i, end_of_line});
    }
  };
  take(b.history, b.history_from, true, st.history_part);
  if (metrics < limit) take(b.system, b.system_from, false, st.system_part);
}

/// Where a file stands once `p` is sent.
Place MlflowPoints::after_point(const Batch& b, const Point& p) {
  const std::span<const Cursor> after = p.history ? b.history_after : b.system_after;
  if (p.index == end_of_line) return {after[p.line], 0};
  return {p.line == 0 ? (p.history ? b.history_from : b.system_from) : after[p.line - 1], p.index + 1};
}

/// The values of a line, as gather() counts them.
std::uint64_t MlflowPoints::count_values(std::string_view line, bool history) {
  simdjson::dom::object obj;
  if (parser_.parse(line.data(), line.size()).get(obj) != simdjson::SUCCESS) return 0;
  return static_cast<std::uint64_t>(std::ranges::distance(line_values(obj, history)));
}

/// The spans the run's tags on the server record, and the greatest prefix
/// they (or the offset tag of one request at a time, before) name.
void MlflowPoints::read_span_tags(simdjson::dom::element doc, std::vector<Span>& spans, std::optional<Prefix>& prefix) {
  simdjson::dom::array tags;
  slots_ = {}; // a slot without a tag is free
  if (doc["run"]["data"]["tags"].get(tags) != simdjson::SUCCESS) return;
  auto raise = [&prefix](const Prefix& p) {
    if (!prefix) return void(prefix = p);
    if (beyond(p.history, prefix->history)) prefix->history = p.history;
    if (beyond(p.system, prefix->system)) prefix->system = p.system;
  };
  for (auto t : tags) {
    std::string_view k, v;
    if (t["key"].get(k) != simdjson::SUCCESS || t["value"].get(v) != simdjson::SUCCESS) continue;
    if (k == offset_tag)
      if (const auto p = decode_prefix(v)) raise(*p);
    for (std::size_t slot = 0; slot < mlflow_window; ++slot) {
      if (k != slot_tag(slot)) continue;
      const auto record = decode_slot(v);
      slots_[slot] = record ? std::optional<Span>(record->span) : std::nullopt;
      if (!record) continue;
      spans.push_back(record->span);
      raise(record->prefix);
    }
  }
}

/// After a log-batch whose answer did not come (or an error the server may
/// still have acted on), or on taking up a run again: the run's tags say
/// which spans the server stored. What it holds from the offsets on is
/// counted as delivered, and spans it holds beyond a gap are kept in
/// `ahead_`, to be skipped when the offsets reach them.
Sent MlflowPoints::reconcile(const Batch& b, UploadState& st) {
  Sent s;
  HttpRequest get = api_.request("GET", "runs/get?run_id=" + url_encode(st.remote_run), {});
  HttpResponse r = perform_capped(http_, get, mlflow_request_cap);
  if (!r.ok()) return mlflow_failed(r, "reading run " + st.remote_run + " back");
  simdjson::dom::element doc;
  if (parser_.parse(r.body).get(doc) != simdjson::SUCCESS) return s;
  std::vector<Span> spans;
  std::optional<Prefix> prefix;
  read_span_tags(doc, spans, prefix);
  ahead_.clear();
  bool beyond_slice = false;
  for (const bool history : {true, false}) {
    const Place from = history ? Place{st.history, st.history_part} : Place{st.system, st.system_part};
    Place at = from;
    if (prefix && beyond(history ? prefix->history : prefix->system, at)) at = history ? prefix->history : prefix->system;
    at = chain_end(spans, history, at);
    for (const Span& sp : spans)
      if (sp.history == history && beyond(sp.from, at)) ahead_.push_back(sp);
    if (!beyond(at, from)) continue;
    // Consume [from, at) of the slice: whole lines, then the values of the next one.
    const auto lines = history ? b.history : b.system;
    const auto after = history ? b.history_after : b.system_after;
    const std::size_t n = lines_before(after, at);
    const Cursor line_start = n > 0 ? after[n - 1] : from.at;
    const std::uint64_t part = line_start.bytes == at.at.bytes ? at.part : 0;
    beyond_slice = beyond_slice || line_start.bytes != at.at.bytes;
    std::uint64_t values = part;
    for (std::size_t i = 0; i < n; ++i) values += count_values(lines[i], history);
    s.points += values - std::min(values, from.part);
    (history ? s.history : s.system) = n;
    (history ? st.history_part : st.system_part) = part;
  }
  uncertain_ = beyond_slice; // the rest on the next slice
  return s;
}

/// One request of a window: a run of points of one file.
struct MlflowPoints::Planned {
  enum class Kind { send, stored, empty } kind = Kind::send; // stored: the server holds it (ahead_)
  std::size_t lo = 0, hi = 0, values = 0;
  Span span;
  std::size_t slot = 0;
};

/// Cuts points[lo, hi) of one file (from `at`) into log-batches of at most
/// mlflow_max_metrics values, each ending where a span the server holds begins,
/// and each with a slot of its own; skips the spans the server holds.
void MlflowPoints::plan(const Batch& b, const std::vector<Point>& points, std::size_t lo, std::size_t hi, bool history,
                        Place at, std::array<bool, mlflow_window>& busy, std::vector<Planned>& out) {
  std::size_t i = lo;
  while (i < hi) {
    const Span* stored = nullptr;
    const Span* next = nullptr; // the nearest stored span beyond `at`
    for (const Span& sp : ahead_) {
      if (sp.history != history) continue;
      if (sp.from == at) stored = &sp;
      else if (beyond(sp.from, at) && (!next || beyond(next->from, sp.from))) next = &sp;
    }
    Planned p;
    p.lo = i;
    p.span = {history, at, at};
    while (i < hi) {
      const bool value = points[i].index != end_of_line;
      if (stored && p.span.to == stored->to) break;
      if (!stored && value && p.values == mlflow_max_metrics) break;
      p.span.to = after_point(b, points[i++]);
      p.values += value;
      if (!stored && next && !beyond(next->from, p.span.to)) break;
    }
    p.hi = i;
    if (stored) {
      if (p.span.to != stored->to) return; // it ends past what was read: on the next slice
      p.kind = Planned::Kind::stored;
    } else if (p.values == 0) {
      p.kind = Planned::Kind::empty;
    } else {
      const auto free = std::find(busy.begin(), busy.end(), false);
      if (free == busy.end()) return;
      *free = true;
      p.slot = static_cast<std::size_t>(free - busy.begin());
    }
    at = p.span.to;
    out.push_back(p);
  }
}

HttpRequest MlflowPoints::log_batch(const std::vector<Point>& points, std::size_t lo, std::size_t hi,
                                    std::size_t slot, const Span& span, const UploadState& st) {
  const Prefix acknowledged{{st.history, st.history_part}, {st.system, st.system_part}};
  std::string body;
  JsonWriter w(body);
  w.begin_object().key("run_id").string(st.remote_run).key("metrics").begin_array();
  for (std::size_t i = lo; i < hi; ++i) {
    const Point& p = points[i];
    if (p.index == end_of_line) continue;
    w.begin_object().key("key").string(p.key).key("value").number(p.value);
    w.key("timestamp").integer(p.ts_ms).key("step").integer(p.step).end_object();
  }
  w.end_array().key("tags").begin_array();
  w.begin_object().key("key").string(slot_tag(slot)).key("value").string(encode_slot({span, acknowledged})).end_object();
  w.end_array().end_object();
  slots_[slot] = span; // its fate is unknown until answered; the slot is not reused before the offsets pass it
  return api_.request("POST", "runs/log-batch", std::move(body));
}

/// Sends a window of log-batches at once, each on its own connection, and
/// moves each file's offsets over the contiguous prefix of what the server
/// acknowledged (or refused, value by value).
Sent MlflowPoints::send(const Batch& b, UploadState& st) {
  if (uncertain_) {
    Sent s = reconcile(b, st);
    if (s.delivery != Delivery::ok || s.history > 0 || s.system > 0 || s.points > 0) return s;
  }
  std::vector<Point> points;
  Sent s;
  gather(b, st, mlflow_window * mlflow_max_metrics, points, s.refused);
  api_.save_keys();
  const Place start[2] = {{st.history, st.history_part}, {st.system, st.system_part}};
  std::array<bool, mlflow_window> busy{};
  for (std::size_t k = 0; k < mlflow_window; ++k)
    busy[k] = slots_[k] && beyond(slots_[k]->to, start[slots_[k]->history ? 0 : 1]);
  const auto split = static_cast<std::size_t>(
      std::find_if(points.begin(), points.end(), [](const Point& p) { return !p.history; }) - points.begin());
  std::vector<Planned> window;
  plan(b, points, 0, split, true, start[0], busy, window);
  plan(b, points, split, points.size(), false, start[1], busy, window);
  if (std::none_of(window.begin(), window.end(), [](const Planned& p) { return p.kind == Planned::Kind::send; }) &&
      std::none_of(window.begin(), window.end(), [&](const Planned& p) { return beyond(p.span.to, p.span.from); })) {
    // Nothing to send and nothing to skip (cannot happen: a free slot is
    // always left): read the tags back before going on.
    uncertain_ = true;
    Sent s = reconcile(b, st);
    if (s.delivery == Delivery::ok && s.history == 0 && s.system == 0 && s.points == 0) {
      s.delivery = Delivery::retry;
      s.message = "MLflow: no log-batch slot is free; reading the run's tags back again";
    }
    return s;
  }
  std::vector<HttpRequest> requests;
  for (const Planned& p : window)
    if (p.kind == Planned::Kind::send) requests.push_back(log_batch(points, p.lo, p.hi, p.slot, p.span, st));
  const std::vector<HttpResponse> answers = http_.perform_all(requests);

  Place done[2] = {start[0], start[1]};
  bool stopped[2] = {false, false};
  std::optional<Sent> failure;
  for (std::size_t i = 0, next = 0; i < window.size(); ++i) {
    const Planned& p = window[i];
    const int f = p.span.history ? 0 : 1;
    const HttpResponse* r = p.kind == Planned::Kind::send ? &answers[next++] : nullptr;
    if (stopped[f]) continue; // stored or not, it is settled by reading the tags back
    if (!r || r->ok()) {
      done[f] = p.span.to;
      s.points += p.values;
      continue;
    }
    std::optional<Sent> fail;
    if (classify(*r) == Delivery::refused && r->status == 400) fail = find_refused(b, points, p, *r, st, s, done[f]);
    else fail = mlflow_failed(*r, "logging metrics");
    if (!fail) continue;
    if (!failure) failure = std::move(fail);
    stopped[f] = true;
    uncertain_ = true; // batches after it in the window may be stored: the next call reads the tags back
  }
  s.history = lines_before(b.history_after, done[0]);
  s.system = lines_before(b.system_after, done[1]);
  st.history_part = done[0].part;
  st.system_part = done[1].part;
  if (!failure) return s;
  failure->points = s.points;
  failure->history = s.history;
  failure->system = s.system;
  failure->refused = std::move(s.refused);
  failure->refused_points = s.refused_points;
  return *failure;
}

/// A log-batch the server refused (400): its halves go one at a time until
/// the refused values are alone, and those are listed. Moves `at` over what
/// is settled; the failure that stopped it, if one did.
std::optional<Sent> MlflowPoints::find_refused(const Batch& b, const std::vector<Point>& points, const Planned& p,
                                               const HttpResponse& refusal, const UploadState& st, Sent& s,
                                               Place& at) {
  std::vector<std::pair<std::size_t, std::size_t>> todo{{p.lo, p.hi}}; // last first
  std::optional<HttpResponse> known = refusal; // the answer to todo.back(), when already had
  while (!todo.empty()) {
    const auto [lo, hi] = todo.back();
    todo.pop_back();
    std::size_t values = 0;
    for (std::size_t i = lo; i < hi; ++i) values += points[i].index != end_of_line;
    const Span span{p.span.history, at, after_point(b, points[hi - 1])};
    if (values == 0) {
      at = span.to;
      continue;
    }
    HttpResponse r;
    if (known) r = std::move(*known);
    else {
      HttpRequest req = log_batch(points, lo, hi, p.slot, span, st);
      r = perform_capped(http_, req, mlflow_request_cap);
    }
    known.reset();
    if (r.ok()) {
      s.points += values;
      at = span.to;
      continue;
    }
    if (classify(r) != Delivery::refused || r.status != 400) return mlflow_failed(r, "logging metrics");
    if (values > 1) {
      // Each half on its own, the first half first.
      const std::size_t mid = lo + (hi - lo) / 2;
      todo.emplace_back(mid, hi);
      todo.emplace_back(lo, mid);
      continue;
    }
    for (std::size_t i = lo; i < hi; ++i) {
      const Point& pt = points[i];
      if (pt.index == end_of_line) continue;
      std::string line;
      JsonWriter lw(line);
      lw.begin_object().key("part").string(pt.history ? "history" : "system").key("key").string(pt.key);
      lw.key("step").integer(pt.step).key("value").number(pt.value).key("why").string(describe(r)).end_object();
      s.refused.push_back(std::move(line));
      ++s.refused_points;
    }
    if (s.message.empty())
      s.message = "MLflow refused a value (" + describe(r) + "); such values are listed in upload/" + target_id_ +
                  ".refused.jsonl";
    // Not on the server, so in no span of its tags: if this process dies
    // before its offsets are saved, these values are refused (and listed)
    // once more, and nothing is sent twice.
    at = span.to;
  }
  return std::nullopt;
}
} // namespace chorus::io::detail
