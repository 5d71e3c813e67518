// MlflowPoints (io/upload/mlflow_points.hpp): history and system lines → log-batch
// requests, a sliding window of them in flight.
#include "io/upload/mlflow_points.hpp"
#include "io/store/history_row.hpp"

#include "runtime/core/json.hpp"

#include <algorithm>
#include <cmath>

namespace chorus::upload {
namespace {

constexpr std::uint64_t end_of_line = ~std::uint64_t{0}; // a Point that only moves past its line
constexpr const char* offset_tag = "chorus.upload.offset"; // one request at a time, before (read only)

/// The whole lines of a file's slice before `at`.
std::size_t lines_before(std::span<const store::Cursor> after, const Place& at) {
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
std::uint64_t MlflowPoints::values_between(const std::string& path, bool history, store::Cursor from, std::uint64_t from_part,
                                           store::Cursor to, std::uint64_t to_part) {
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

/// Reads up to `limit` points from the Batch from `at` on, history first,
/// and moves `at` past them; whether the Batch is read to its end.
bool MlflowPoints::gather(const Batch& b, GatherAt& at, std::size_t limit, std::vector<Point>& points,
                          std::vector<std::string>& bad) {
  std::size_t metrics = 0; // points to send; the end-of-line markers are not sent and not counted
  auto take = [&](std::span<const std::string_view> lines, store::Cursor from, bool history) {
    std::size_t& line = at.line[history ? 0 : 1];
    std::uint64_t& part = at.part[history ? 0 : 1];
    for (std::size_t i = line; i < lines.size() && metrics < limit; ++i) {
      simdjson::dom::element doc;
      simdjson::dom::object obj;
      std::optional<store::HistoryRow> row;
      std::string_view why;
      if (parser_.parse(lines[i].data(), lines[i].size()).get(doc) != simdjson::SUCCESS ||
          doc.get(obj) != simdjson::SUCCESS)
        why = "not a JSON object";
      else if (history)
        why = row.emplace(obj).why();
      if (!why.empty()) {
        std::string text = "{\"part\":\"";
        text += history ? "history" : "system";
        text += "\",\"line\":" + std::to_string(from.lines + i) + ",\"why\":";
        core::append_json_string(text, why);
        text += '}';
        bad.push_back(std::move(text));
        points.push_back(Point{{}, 0, 0, 0, history, i, end_of_line}); // a marker that consumes the line
        line = i + 1, part = 0;
        continue;
      }
      double ts = 0;
      if (row) ts = row->timestamp().value_or(0);
      else if (obj["_timestamp"].get(ts) != simdjson::SUCCESS) ts = 0;
      const auto step = row ? row->step() : static_cast<std::int64_t>(from.lines + i);
      std::uint64_t index = 0;
      for (const store::RowValue& f : row ? row->metrics() : store::RowValues(obj)) {
        const std::uint64_t value_at = index++;
        if (i == line && value_at < part) continue; // sent before, or gathered before
        std::string key;
        if (!history && f.key.starts_with("system.")) {
          key = "system/";
          key.append(f.key.substr(7));
        } else {
          key = std::string(f.key);
        }
        points.push_back(Point{api_.map_key(key), f.value, static_cast<std::int64_t>(std::llround(ts * 1000.0)), step,
                               history, i, value_at});
        if (++metrics >= limit) {
          line = i, part = value_at + 1;
          return;
        }
      }
      // A line whose every value fitted: a marker so the line counts as consumed even with no values.
      points.push_back(Point{{}, 0, 0, 0, history, i, end_of_line});
      line = i + 1, part = 0;
    }
  };
  take(b.history, b.history_from, true);
  if (metrics < limit) take(b.system, b.system_from, false);
  return at.line[0] >= b.history.size() && at.line[1] >= b.system.size();
}

/// Where a file stands once `p` is sent.
Place MlflowPoints::after_point(const Batch& b, const Point& p) {
  const std::span<const store::Cursor> after = p.history ? b.history_after : b.system_after;
  if (p.index == end_of_line) return {after[p.line], 0};
  return {p.line == 0 ? (p.history ? b.history_from : b.system_from) : after[p.line - 1], p.index + 1};
}

/// The values of a line, as gather() counts them.
std::uint64_t MlflowPoints::count_values(std::string_view line, bool history) {
  simdjson::dom::object obj;
  if (parser_.parse(line.data(), line.size()).get(obj) != simdjson::SUCCESS) return 0;
  return static_cast<std::uint64_t>(std::ranges::distance(store::line_values(obj, history)));
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
    for (std::size_t slot = 0; slot < mlflow_slots; ++slot) {
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
    const store::Cursor line_start = n > 0 ? after[n - 1] : from.at;
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

/// One log-batch of a Batch: a run of points of one file, sent, or skipped
/// as the server holds it.
struct MlflowPoints::Planned {
  enum class Kind { send, stored, empty } kind = Kind::send; // stored: the server holds it (ahead_)
  Points points; // the points it is cut from
  std::size_t lo = 0, hi = 0, values = 0;
  Span span;
  std::size_t slot = 0;
  std::optional<HttpRequest> request; // once sent
  std::chrono::steady_clock::time_point sent_at;
  std::uint64_t sent_in = 0; // the window's epoch when it was sent
  std::optional<HttpResponse> answer; // once answered
};

/// Cuts points[lo, hi) of one file (from `at`, moved on) into log-batches of
/// at most mlflow_max_metrics values, each ending where a span the server
/// holds begins; skips the spans the server holds. False where it stops
/// short: a span the server holds ends past what was read (on the next slice).
bool MlflowPoints::plan(const Batch& b, const Points& points, std::size_t lo, std::size_t hi, bool history, Place& at,
                        std::deque<Planned>& out) {
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
    p.points = points;
    p.lo = i;
    p.span = {history, at, at};
    while (i < hi) {
      const bool value = (*points)[i].index != end_of_line;
      if (stored && p.span.to == stored->to) break;
      if (!stored && value && p.values == mlflow_max_metrics) break;
      p.span.to = after_point(b, (*points)[i++]);
      p.values += value;
      if (!stored && next && !beyond(next->from, p.span.to)) break;
    }
    p.hi = i;
    if (stored) {
      if (p.span.to != stored->to) return false;
      p.kind = Planned::Kind::stored;
    } else if (p.values == 0) {
      p.kind = Planned::Kind::empty;
    }
    at = p.span.to;
    out.push_back(std::move(p));
  }
  return true;
}

/// A slot whose tag may be written over: none names a span, or its span is
/// within `acked`, which the new batch's tag names, so the record moves on.
std::optional<std::size_t> MlflowPoints::free_slot(const Prefix& acked) const {
  for (std::size_t k = 0; k < mlflow_slots; ++k)
    if (!slots_[k] || !beyond(slots_[k]->to, slots_[k]->history ? acked.history : acked.system)) return k;
  return std::nullopt;
}

HttpRequest MlflowPoints::log_batch(const std::vector<Point>& points, std::size_t lo, std::size_t hi,
                                    std::size_t slot, const Span& span, const Prefix& acked, const UploadState& st) {
  std::string body;
  core::JsonWriter w(body);
  w.begin_object().key("run_id").string(st.remote_run).key("metrics").begin_array();
  for (std::size_t i = lo; i < hi; ++i) {
    const Point& p = points[i];
    if (p.index == end_of_line) continue;
    w.begin_object().key("key").string(p.key).key("value").number(p.value);
    w.key("timestamp").integer(p.ts_ms).key("step").integer(p.step).end_object();
  }
  w.end_array().key("tags").begin_array();
  w.begin_object().key("key").string(slot_tag(slot)).key("value").string(encode_slot({span, acked})).end_object();
  w.end_array().end_object();
  slots_[slot] = span; // its fate is unknown until answered; the slot is not reused before the offsets pass it
  HttpRequest req = api_.request("POST", "runs/log-batch", std::move(body));
  req.timeout = mlflow_request_cap;
  return req;
}

/// Sends the Batch's points, a sliding window of log-batches in flight:
/// each answer's connection takes the next batch at once. The offsets move
/// over the contiguous prefix of each file's batches answered 2xx; the
/// first other answer stops new sends, and once those in flight are
/// answered, a refusal (400) is searched value by value, and anything else
/// ends the call (the batches after it, stored or not, are settled by
/// reading the tags back).
Sent MlflowPoints::send(const Batch& b, UploadState& st) {
  if (uncertain_) {
    Sent s = reconcile(b, st);
    if (s.delivery != Delivery::ok || s.history > 0 || s.system > 0 || s.points > 0) return s;
  }
  Sent s;
  const auto began = std::chrono::steady_clock::now();
  Place done[2] = {{st.history, st.history_part}, {st.system, st.system_part}}; // settled, in order
  Prefix acked{done[0], done[1]}; // within `done`, what the server holds (no refused value in it)
  Place planned[2] = {done[0], done[1]};
  std::deque<Planned> queue[2]; // per file, planned and not settled, in order
  std::size_t unsent[2] = {0, 0}; // where the batches not yet sent begin in queue[f]
  GatherAt gathered;
  gathered.part[0] = st.history_part, gathered.part[1] = st.system_part;
  bool all_planned = false, stop_sending = false, moved = false, sent_any = false;
  std::vector<Planned*> by_ticket(http_.parallel(), nullptr);

  // Settles each file's batches from the front while they are answered 2xx
  // (or need no request).
  auto settle_front = [&] {
    for (int f = 0; f < 2; ++f) {
      while (unsent[f] > 0) {
        Planned& p = queue[f].front();
        if (p.kind == Planned::Kind::send && (!p.answer || !p.answer->ok())) break;
        done[f] = p.span.to;
        (f == 0 ? acked.history : acked.system) = done[f];
        s.points += p.values; // sent, or held by the server already: delivered either way
        queue[f].pop_front();
        --unsent[f];
        moved = true;
      }
    }
  };
  for (;;) {
    // Plan more once fewer batches wait than the window sends at once.
    while (!all_planned && !stop_sending &&
           queue[0].size() - unsent[0] + queue[1].size() - unsent[1] < window_.max()) {
      auto points = std::make_shared<std::vector<Point>>();
      all_planned = gather(b, gathered, mlflow_slots * mlflow_max_metrics, *points, s.refused);
      api_.save_keys();
      const auto split = static_cast<std::size_t>(
          std::find_if(points->begin(), points->end(), [](const Point& p) { return !p.history; }) - points->begin());
      const Points shared = std::move(points);
      // A span the server holds that ends past what was read stops the planning here.
      if (!plan(b, shared, 0, split, true, planned[0], queue[0]) ||
          !plan(b, shared, split, shared->size(), false, planned[1], queue[1]))
        all_planned = true;
    }
    settle_front();
    // Fill the window, history first.
    bool no_slot = false;
    while (!stop_sending && http_.in_flight() < window_.size()) {
      const int f = unsent[0] < queue[0].size() ? 0 : unsent[1] < queue[1].size() ? 1 : -1;
      if (f < 0) break;
      Planned& p = queue[f][unsent[f]];
      if (p.kind != Planned::Kind::send) {
        ++unsent[f];
        continue;
      }
      const std::optional<std::size_t> slot = free_slot(acked);
      if (!slot) { // every slot names a batch beyond the acknowledged prefix: wait for answers
        no_slot = true;
        break;
      }
      p.slot = *slot;
      p.request = log_batch(*p.points, p.lo, p.hi, p.slot, p.span, acked, st);
      p.sent_at = std::chrono::steady_clock::now();
      p.sent_in = window_.epoch();
      const std::optional<std::size_t> ticket = http_.start(*p.request);
      if (!ticket) break; // cannot happen: the window is within the client's connections
      by_ticket[*ticket] = &p;
      ++unsent[f];
      sent_any = true;
    }
    settle_front();
    auto answer = http_.next_answer();
    if (!answer) {
      if (!all_planned && !stop_sending && !no_slot) continue; // only batches the server holds so far: plan on
      break;
    }
    Planned& p = *by_ticket[answer->first];
    p.answer = std::move(answer->second);
    if (p.answer->ok()) {
      window_.answered(std::chrono::steady_clock::now() - p.sent_at, p.values * 2 >= mlflow_max_metrics, p.sent_in);
    } else {
      if (classify(*p.answer) == Delivery::retry) window_.backed_off();
      stop_sending = true; // settled in order below, once the rest is answered
    }
    if (std::chrono::steady_clock::now() - began >= mlflow_send_budget) stop_sending = true;
  }
  settle_front();

  if (!moved && !sent_any) {
    // Nothing sent and nothing settled: no slot was free (cannot happen, a
    // slot is always left): read the tags back before going on.
    uncertain_ = true;
    Sent r = reconcile(b, st);
    if (r.delivery == Delivery::ok && r.history == 0 && r.system == 0 && r.points == 0) {
      r.delivery = Delivery::retry;
      r.message = "MLflow: no log-batch slot is free; reading the run's tags back again";
    }
    return r;
  }
  // What is not 2xx, in order: a refusal searched, a failure stops its file.
  std::optional<Sent> failure;
  for (int f = 0; f < 2; ++f) {
    for (std::size_t i = 0; i < unsent[f]; ++i) {
      const Planned& p = queue[f][i];
      if (!p.answer || p.answer->ok()) {
        done[f] = p.span.to;
        s.points += p.values;
        continue;
      }
      std::optional<Sent> fail;
      if (classify(*p.answer) == Delivery::refused && p.answer->status == 400)
        fail = find_refused(b, p, *p.answer, acked, st, s, done[f]);
      else
        fail = mlflow_failed(*p.answer, "logging metrics");
      if (!fail) continue;
      if (!failure) failure = std::move(fail);
      uncertain_ = true; // batches after it may be stored: the next call reads the tags back
      break;
    }
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
/// is settled; the failure that stopped it, if one did. Each half's tag
/// names `acked`, which holds no refused value.
std::optional<Sent> MlflowPoints::find_refused(const Batch& b, const Planned& p, const HttpResponse& refusal,
                                               const Prefix& acked, const UploadState& st, Sent& s, Place& at) {
  const std::vector<Point>& points = *p.points;
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
    else r = http_.perform(log_batch(points, lo, hi, p.slot, span, acked, st));
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
      core::JsonWriter lw(line);
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
} // namespace chorus::upload
