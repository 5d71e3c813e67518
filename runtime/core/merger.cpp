#include "runtime/core/merger.hpp"

#include "runtime/core/immortal.hpp"
#include "runtime/core/json.hpp"
#include "runtime/core/merger_keys.hpp"
#include "runtime/core/merger_rows.hpp"
#include "runtime/core/merger_streams.hpp"
#include "runtime/core/strings.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_map>
#include <utility>

namespace chorus::core {

using namespace merging;

namespace {

constexpr std::int64_t no_step = -1;
// Valid steps are 0..max_step, so past_all sits above every row.
constexpr std::int64_t past_all = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t max_step = past_all - 1;
// Bounds on what one frame may make the Merger allocate.
constexpr std::uint32_t max_world = 1u << 16;
struct Rank {
  RunState state = RunState::running;
  bool joined = false;
  bool parked = false;       // waits at the open barrier; its later events wait in parked_events
  bool closed = false;       // its finish was processed: nothing after it counts
  bool finish_parked = false; // its finish came while it waited at a barrier, and waits behind it
  std::int64_t last_step = no_step; // the highest step any of its streams logged at
  std::int64_t cursor = no_step;    // where it stands for the watermark: streams.cursor()
  RankStreams streams;
  std::uint64_t barriers = 0;       // barrier events processed
  std::uint64_t barrier_seq = 0;
  std::uint64_t seq = 0; // the last seq of its frames: each event's is higher, and not by much
  std::uint32_t barrier_name = no_key;
  std::string end_message;          // why it ended, as the sink heard (not finished: why not)
  std::vector<char> parked_events; // encoded events, as they came, from parked_from on
  std::size_t parked_from = 0;
  std::vector<LocalKey> keys;
  std::unordered_map<std::uint32_t, std::uint32_t> canon_of; // global key -> its first local id
  std::string host;
};

std::string quote(std::string_view s) { return "'" + std::string(s) + "'"; }

/// `e` holds one key's values, in rank order.
double reduce_values(Reduce how, const Entry* e, std::size_t n) {
  if (how == Reduce::first) return e[0].value; // the lowest rank's, NaN or not: the others' do not count
  bool nan = false;
  for (std::size_t i = 0; i < n; ++i) nan = nan || std::isnan(e[i].value);
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  double r = e[0].value;
  switch (how) {
    case Reduce::sum:
    case Reduce::mean:
      for (std::size_t i = 1; i < n; ++i) r += e[i].value; // in rank order: the same bits on every replay
      return how == Reduce::mean ? r / static_cast<double>(n) : r;
    case Reduce::min:
      for (std::size_t i = 1; i < n; ++i) r = std::min(r, e[i].value);
      return r;
    case Reduce::max:
      for (std::size_t i = 1; i < n; ++i) r = std::max(r, e[i].value);
      return r;
    case Reduce::none:
    case Reduce::first:
    case Reduce::merge: // histograms only: a key declared so takes no scalars
      break;
  }
  return r;
}

} // namespace

struct Merger::State {
  explicit State(HistorySink& s) : sink(s) {}

  HistorySink& sink;
  bool started = false;
  bool ended = false;
  std::int64_t start_ts = 0;
  RunState end_state = RunState::running; // as run_end (or a later rank_exit) left it
  std::int64_t end_ts = 0;
  std::vector<Rank> ranks;
  int live = 0;        // ranks running (joined or not)
  int parked = 0;      // ranks parked at the open barrier, dead ones included
  int parked_live = 0; // of those, the running ones
  std::uint64_t released = 0; // barriers released so far; the open one has this index
  std::int64_t open_timeout_ms = 0;
  std::string committed_by;                  // what the last barrier release committed
  Watermark watermark;

  // What apply() does with the frame admit() decoded last, decided before
  // that frame changed anything: refused, taken without effect (late), or taken.
  enum class Admit { refuse, ignore, take };
  Admit admitted = Admit::refuse;
  bool admitted_ends = false; // and it is a rank's batch that holds the rank's end

  RunKeys names; // the run's keys: global ids in order of first sight

  PendingRows pending;
  EntrySorter sorter;
  std::int64_t last_committed = no_step;
  std::uint64_t rows_committed = 0;
  std::uint64_t values_rejected = 0;

  // Scratch, kept to spare allocations.
  Row out;
  std::vector<Histogram> merged; // the committing row's merged histograms
  FrameCheck frame_check;
  std::vector<std::pair<std::string_view, double>> refused;

  // ---- keys ---------------------------------------------------------------

  bool check_keys(Rank& r, std::span<const char> body) {
    return frame_check.run(body, r.keys, r.streams, r.seq, names);
  }

  void define_key(Rank& r, const wire::KeyDef& k) {
    LocalKey& lk = r.keys[k.id];
    if (lk.gid != key_in_frame) return; // known already
    lk.gid = names.intern(k.name);
    lk.step = no_step;
    lk.top = no_step;
    lk.canon = r.canon_of.try_emplace(lk.gid, k.id).first->second;
  }

  [[nodiscard]] std::string key_names(const Rank& r, const wire::Values& v) const {
    if (v.n == 0) return "an empty log call";
    std::string out;
    std::vector<std::uint32_t> seen;
    for (std::uint32_t i = 0; i < v.n; ++i) {
      const std::uint32_t gid = r.keys[v.key(i)].gid;
      if (std::find(seen.begin(), seen.end(), gid) != seen.end()) continue;
      if (seen.size() == 3) {
        out += " and more";
        break;
      }
      out += (seen.empty() ? "" : ", ") + quote(names[gid]);
      seen.push_back(gid);
    }
    return out;
  }

  // ---- the watermark ------------------------------------------------------

  void place(int rank) {
    const Rank& r = ranks[rank];
    watermark.set(static_cast<std::size_t>(rank),
                  r.state == RunState::running && !r.parked ? r.cursor : past_all);
  }

  /// Re-reads where rank `rank` stands after its streams moved.
  void restand(int rank) {
    Rank& r = ranks[rank];
    if (r.cursor == r.streams.cursor()) return;
    r.cursor = r.streams.cursor();
    place(rank);
  }

  /// A barrier committed everything through `last_committed`: the rank's
  /// streams go on past it, and the rank (no longer parked) stands where they do.
  void pass_barrier(int rank) {
    Rank& r = ranks[rank];
    r.streams.raise(last_committed);
    r.cursor = r.streams.cursor();
    place(rank);
  }

  void leave(int rank, RunState state, std::string_view reason) {
    Rank& r = ranks[rank];
    r.state = state;
    r.end_message = reason;
    --live;
    if (r.parked) --parked_live;
    place(rank);
    sink.rank_state(rank, state, r.last_step, r.host, reason);
  }

  // ---- events of a rank ---------------------------------------------------

  void process(int rank, const wire::RankEvent& ev) {
    Rank& r = ranks[rank];
    if (const auto* v = std::get_if<wire::Values>(&ev)) {
      log_values(rank, *v);
    } else if (const auto* h = std::get_if<wire::HistogramValue>(&ev)) {
      log_histogram(rank, *h);
    } else if (const auto* m = std::get_if<wire::MediaValue>(&ev)) {
      log_media(rank, *m);
    } else if (const auto* d = std::get_if<wire::Define>(&ev)) {
      const std::uint32_t gid = r.keys[d->key].gid;
      if (d->reduce == Reduce::merge) {
        RunKeys::Kind& kind = names.kind(gid);
        if (kind != RunKeys::Kind::unset && kind != RunKeys::Kind::histogram) {
          const Error why{Errc::invalid_argument,
                          "define_metric(" + quote(names[gid]) + ", Reduce::merge) refused: the key holds " +
                              std::string(kind_name(kind)) + ", and merge is for histograms; "
                              "declare the scalars with mean, sum, min, max or first, or log the histograms "
                              "under a key of their own"};
          sink.completed(rank, d->seq, &why);
          return;
        }
        kind = RunKeys::Kind::histogram;
      }
      names.reduction(gid) = d->reduce;
      declared(gid);
      sink.completed(rank, d->seq, nullptr);
    } else if (const auto* m = std::get_if<wire::MetricView>(&ev)) {
      const std::uint32_t gid = r.keys[m->key].gid;
      RunKeys::View& view = names.view(gid);
      if (m->summary != wire::unchanged_summary) view.summary = static_cast<Summary>(m->summary);
      if (m->step_key != wire::no_step_metric) view.step = r.keys[m->step_key].gid;
      declared(gid);
      sink.completed(rank, m->seq, nullptr);
    } else if (const auto* a = std::get_if<wire::AlertRuleDef>(&ev)) {
      sink.alert_rule(rank, r.keys[a->key].gid, a->rule);
      sink.completed(rank, a->seq, nullptr);
    } else if (const auto* x = std::get_if<wire::Refused>(&ev)) {
      values_rejected += x->n;
      sink.refused(rank, x->seq, x->step, Error(x->code, std::string(x->message)), x->values, x->n);
      sink.completed(rank, x->seq, nullptr);
    } else if (const auto* b = std::get_if<wire::Barrier>(&ev)) {
      reach_barrier(rank, *b);
    } else if (const auto* c = std::get_if<wire::Config>(&ev)) {
      sink.config(rank, c->json);
      sink.completed(rank, c->seq, nullptr);
    } else if (const auto* s = std::get_if<wire::Summary>(&ev)) {
      sink.summary(rank, s->json);
      sink.completed(rank, s->seq, nullptr);
    } else if (const auto* st = std::get_if<wire::Stream>(&ev)) {
      if (st->open)
        r.streams.open(st->id, last_committed);
      else
        r.streams.close(st->id);
      restand(rank);
      sink.completed(rank, st->seq, nullptr);
    } else if (const auto* f = std::get_if<wire::Finish>(&ev)) {
      r.closed = true;
      if (r.state == RunState::running) leave(rank, f->state, end_reason(*f));
      sink.completed(rank, f->seq, nullptr);
    }
  }

  /// Why a rank ended as its finish says: "" for finished.
  static std::string end_reason(const wire::Finish& f) {
    std::string why;
    if (f.state == RunState::failed) {
      why = "ended its run with exit code ";
      why += std::to_string(f.code);
    } else if (f.state == RunState::killed) {
      why = "stopped by ";
      why += signal_name(f.code);
    }
    if (!why.empty() && !f.message.empty()) why.append(": ").append(f.message);
    return why;
  }

  /// A metric's declaration changed: the sink hears the whole of it.
  void declared(std::uint32_t gid) {
    const RunKeys::View& view = names.view(gid);
    sink.metric(gid, names.reduction(gid), view.summary, view.step);
  }

  /// "rank 3", or "rank 3 writer 2" for a call of a writer stream.
  static std::string producer(int rank, std::uint32_t sid) {
    return "rank " + std::to_string(rank) + (sid == 0 ? "" : " writer " + std::to_string(sid));
  }

  /// Places a call of `rank`'s stream `sid` at its step (`asked`: the
  /// call's step, or core::wire::auto_step / core::wire::same_step), moving the stream
  /// there. False when the step is refused: `why` says why, `step` what it
  /// was. `what` names the call's keys, for the messages.
  template <class What>
  bool place_call(int rank, std::uint32_t sid, std::int64_t asked, What&& what, std::int64_t& step, Error& why) {
    Rank& r = ranks[rank];
    RankStreams::Stream& stream = sid == 0 ? r.streams.default_stream(last_committed) : r.streams.at(sid);
    const bool automatic = asked == wire::auto_step || (asked == wire::same_step && stream.last_step < 0);
    if (automatic && stream.cursor >= max_step) {
      step = stream.cursor;
      why = {Errc::invalid_argument, producer(rank, sid) + ": the automatic step would pass the largest step"};
      return false;
    }
    step = automatic ? stream.cursor + 1 : asked == wire::same_step ? stream.last_step : asked;
    if (step < 0 || step > max_step) {
      why = {Errc::invalid_argument, producer(rank, sid) + " logged " + what() + " at step " + std::to_string(step) +
                                         ", outside 0.." + std::to_string(max_step) + ": steps start at 0"};
      return false;
    }
    if (step < stream.last_step) {
      why = backwards(rank, sid, what(), step, stream.last_step);
      return false;
    }
    stream.last_step = step;
    r.last_step = std::max(r.last_step, step);
    r.streams.advance(stream, step);
    restand(rank);
    if (step <= last_committed) {
      why = {Errc::step_committed,
             producer(rank, sid) + " logged " + what() + " at step " + std::to_string(step) + ", but steps up to " +
                 std::to_string(last_committed) + " are already committed" +
                 (committed_by.empty() ? "" : " (by " + committed_by + ")") + ": log at a step above " +
                 std::to_string(last_committed) + ", or leave the step out to use automatic steps"};
      return false;
    }
    return true;
  }

  void log_values(int rank, const wire::Values& v) {
    Rank& r = ranks[rank];
    std::int64_t step = v.step;
    Error why;
    if (!scalars_allowed(rank, v, why) ||
        !place_call(rank, v.stream, v.step, [&] { return key_names(r, v); }, step, why))
      return refuse(rank, v, step, why);
    if (v.n > 0) {
      PendingRow& row = pending.at(step);
      row.ts_us = std::min(row.ts_us, v.ts_us);
      LocalKey* keys = r.keys.data();
      for (std::uint32_t i = 0; i < v.n; ++i) {
        const std::uint32_t id = v.key(i);
        LocalKey& slot = keys[keys[id].canon];
        if (slot.step == step) { // the same rank and step again: the later value wins
          row.entries[slot.entry].value = v.value(i);
        } else {
          // Back at or below its highest step (a rank's writers take turns at
          // steps of their own), the row may hold this key of this rank
          // already, out of the slot's sight: the commit keeps the later value.
          row.repeats = row.repeats || step <= slot.top;
          slot.step = step;
          slot.top = std::max(slot.top, step);
          slot.entry = static_cast<std::uint32_t>(row.entries.size());
          row.entries.push_back({sort_key(keys[id].gid, static_cast<std::uint32_t>(rank)), v.value(i)});
        }
      }
    }
    sink.completed(rank, v.seq, nullptr);
  }

  /// A key holds scalars or histograms, never both: false (and why) when
  /// one of the call's keys holds histograms. The first call of a rank with
  /// a key checks it; later ones pass on a flag of the rank's own.
  bool scalars_allowed(int rank, const wire::Values& v, Error& why) {
    LocalKey* keys = ranks[rank].keys.data();
    bool all = true;
    for (std::uint32_t i = 0; i < v.n; ++i) all = all && keys[keys[v.key(i)].canon].scalar;
    if (all) [[likely]]
      return true;
    for (std::uint32_t i = 0; i < v.n; ++i) {
      const std::uint32_t gid = keys[v.key(i)].gid;
      if (names.kind(gid) != RunKeys::Kind::unset && names.kind(gid) != RunKeys::Kind::scalar) {
        why = {Errc::invalid_argument,
               producer(rank, v.stream) + " logged a scalar under " + quote(names[gid]) + ", which holds " +
                   std::string(kind_name(names.kind(gid))) +
                   (names.reduction(gid) == Reduce::merge ? " (it is declared Reduce::merge)" : "") +
                   ": a key holds one kind; log the scalar under a key of its own"};
        return false;
      }
    }
    for (std::uint32_t i = 0; i < v.n; ++i) {
      LocalKey& slot = keys[keys[v.key(i)].canon];
      slot.scalar = true;
      names.kind(slot.gid) = RunKeys::Kind::scalar;
    }
    return true;
  }

  static std::string_view kind_name(RunKeys::Kind k) {
    switch (k) {
      case RunKeys::Kind::scalar: return "scalars";
      case RunKeys::Kind::histogram: return "histograms";
      case RunKeys::Kind::image: return "images";
      case RunKeys::Kind::text: return "text";
      case RunKeys::Kind::table: return "tables";
      case RunKeys::Kind::unset: break;
    }
    return "nothing";
  }

  void log_media(int rank, const wire::MediaValue& m) {
    Rank& r = ranks[rank];
    const std::uint32_t gid = r.keys[m.key].gid;
    const std::string& name = names[gid];
    Media value;
    (void)media::decode(m.body, value); // checked with its frame
    const RunKeys::Kind want = value.kind == MediaKind::image  ? RunKeys::Kind::image
                               : value.kind == MediaKind::text ? RunKeys::Kind::text
                                                               : RunKeys::Kind::table;
    std::int64_t step = m.step;
    Error why;
    RunKeys::Kind& kind = names.kind(gid);
    const std::string what = std::string(value.kind == MediaKind::image ? "an image" : value.kind == MediaKind::text ? "text" : "a table") +
                             " under " + quote(name);
    if (kind != RunKeys::Kind::unset && kind != want) {
      why = {Errc::invalid_argument, producer(rank, m.stream) + " logged " + what + ", which holds " +
                                         std::string(kind_name(kind)) +
                                         ": a key holds one kind; log it under a key of its own"};
    } else if (place_call(rank, m.stream, m.step, [&] { return what; }, step, why)) {
      kind = want;
      PendingRow& row = pending.at(step);
      row.ts_us = std::min(row.ts_us, m.ts_us);
      const std::uint64_t sort = sort_key(gid, static_cast<std::uint32_t>(rank));
      entry_of(row.media, sort).value = std::move(value);
      sink.completed(rank, m.seq, nullptr);
      return;
    }
    std::string json;
    JsonWriter w(json);
    w.begin_object().key(name).begin_object().key(to_string(value.kind)).begin_object();
    w.key("format").string(value.format).key("bytes").uinteger(value.data.size()).end_object().end_object().end_object();
    values_rejected += 1;
    sink.refused(rank, m.seq, step, why, json, 1);
    sink.completed(rank, m.seq, &why);
  }

  void log_histogram(int rank, const wire::HistogramValue& h) {
    Rank& r = ranks[rank];
    const std::uint32_t gid = r.keys[h.key].gid;
    const std::string& name = names[gid];
    std::int64_t step = h.step;
    Error why;
    RunKeys::Kind& kind = names.kind(gid);
    if (kind != RunKeys::Kind::unset && kind != RunKeys::Kind::histogram) {
      why = {Errc::invalid_argument, producer(rank, h.stream) + " logged a histogram under " + quote(name) +
                                         ", which holds " + std::string(kind_name(kind)) +
                                         ": a key holds one kind; log the histogram under a key of its own, such as " +
                                         quote(name + "_hist")};
      return refuse_histogram(rank, h, step, why);
    }
    if (!place_call(rank, h.stream, h.step, [&] { return "a histogram under " + quote(name); }, step, why))
      return refuse_histogram(rank, h, step, why);
    kind = RunKeys::Kind::histogram;
    PendingRow& row = pending.at(step);
    row.ts_us = std::min(row.ts_us, h.ts_us);
    const std::uint64_t sort = sort_key(gid, static_cast<std::uint32_t>(rank));
    (void)histogram::decode(h.body, entry_of(row.histograms, sort).value); // checked with its frame: a later one replaces
    sink.completed(rank, h.seq, nullptr);
  }

  void refuse_histogram(int rank, const wire::HistogramValue& h, std::int64_t step, const Error& why) {
    Histogram value;
    (void)histogram::decode(h.body, value);
    std::string json;
    JsonWriter w(json);
    w.begin_object().key(names[ranks[rank].keys[h.key].gid]).begin_object().key("histogram").begin_object();
    w.key("count").uinteger(value.count()).key("min").number(value.min()).key("max").number(value.max());
    w.end_object().end_object().end_object();
    values_rejected += 1;
    sink.refused(rank, h.seq, step, why, json, 1);
    sink.completed(rank, h.seq, &why);
  }

  [[nodiscard]] static Error backwards(int rank, std::uint32_t sid, const std::string& what, std::int64_t step,
                                       std::int64_t last) {
    const std::string tail = " or above, or leave the step out to use automatic steps";
    if (sid == 0)
      return {Errc::backwards_step,
              "rank " + std::to_string(rank) + " logged " + what + " at step " + std::to_string(step) +
                  ", lower than its last step " + std::to_string(last) +
                  ": a rank's steps must not decrease; log at step " + std::to_string(last) + tail};
    return {Errc::backwards_step, producer(rank, sid) + " logged " + what + " at step " +
                                      std::to_string(step) + ", lower than that writer's last step " +
                                      std::to_string(last) + ": a writer's steps must not decrease; log at step " +
                                      std::to_string(last) + tail};
  }

  void refuse(int rank, const wire::Values& v, std::int64_t step, const Error& why) {
    const Rank& r = ranks[rank];
    refused.clear();
    for (std::uint32_t i = 0; i < v.n; ++i) refused.emplace_back(names[r.keys[v.key(i)].gid], v.value(i));
    values_rejected += v.n;
    sink.rejected(rank, v.seq, step, refused, why);
    sink.completed(rank, v.seq, &why);
  }

  void reach_barrier(int rank, const wire::Barrier& b) {
    Rank& r = ranks[rank];
    const std::uint64_t index = r.barriers++;
    const std::uint32_t name = r.keys[b.name_key].gid;
    if (index < released) { // it timed out before this rank came: pass straight through
      pass_barrier(rank);
      const Error late{Errc::barrier_timeout,
                       "rank " + std::to_string(rank) + " reached barrier " + quote(names[name]) + " (#" +
                           std::to_string(index) +
                           ") after it had timed out; the other ranks went on without it and so does this one: "
                           "look for what slowed this rank, or raise the barrier timeout"};
      sink.completed(rank, b.seq, &late);
      return;
    }
    r.parked = true;
    r.barrier_seq = b.seq;
    r.barrier_name = name;
    open_timeout_ms = parked == 0 ? b.timeout_ms : std::max(open_timeout_ms, b.timeout_ms);
    ++parked;
    if (r.state == RunState::running) ++parked_live;
    sink.barrier_reached(rank, released, names[name]);
    place(rank);
  }

  // ---- barriers -----------------------------------------------------------

  enum class Release { arrived, timeout, run_end };

  /// Commits everything pending, completes the barrier's waiters, then
  /// processes what each waiter logged after it, in rank order.
  void release(Release why) {
    commit_below(past_all);
    std::vector<int> waiters, missing;
    for (int i = 0; i < static_cast<int>(ranks.size()); ++i) {
      if (ranks[i].parked)
        waiters.push_back(i);
      else if (ranks[i].state == RunState::running)
        missing.push_back(i);
    }
    const std::uint32_t name = ranks[waiters.front()].barrier_name;
    const std::string what = "barrier " + quote(names[name]);
    Error err;
    if (why == Release::arrived) {
      if (std::any_of(waiters.begin(), waiters.end(), [&](int i) { return ranks[i].barrier_name != name; }))
        err = Error(Errc::barrier_mismatch, mismatch_message(waiters));
      committed_by = what;
    } else if (why == Release::timeout) {
      err = Error(Errc::barrier_timeout,
                  what + " timed out after " + std::to_string(open_timeout_ms) + " ms: " + rank_list(missing) +
                      " did not reach it and the ranks that did went on without them; look for a hang or a "
                      "missing barrier() call on those ranks, or raise the barrier timeout");
      committed_by = what + ", which timed out";
    } else {
      err = Error(Errc::barrier_timeout, "the run ended before " + rank_list(missing) + " reached " + what +
                                             "; the ranks that reached it were released without them");
      committed_by = what + ", released at the end of the run";
    }
    sink.barrier_released(released, names[name], last_committed, waiters, missing, err ? &err : nullptr);
    ++released;
    parked = 0;
    parked_live = 0;
    open_timeout_ms = 0;
    for (int i : waiters) {
      Rank& r = ranks[i];
      r.parked = false;
      pass_barrier(i);
      sink.completed(i, r.barrier_seq, err ? &err : nullptr);
    }
    for (int i : waiters) drain(i);
  }

  [[nodiscard]] std::string mismatch_message(const std::vector<int>& waiters) const {
    std::vector<std::pair<std::string_view, int>> by_name;
    for (int i : waiters) by_name.emplace_back(names[ranks[i].barrier_name], i);
    std::sort(by_name.begin(), by_name.end());
    std::string out = "ranks reached barrier #" + std::to_string(released) + " under different names: ";
    for (std::size_t i = 0; i < by_name.size();) {
      std::vector<int> group;
      std::size_t j = i;
      for (; j < by_name.size() && by_name[j].first == by_name[i].first; ++j) group.push_back(by_name[j].second);
      out += (i ? ", " : "") + quote(by_name[i].first) + " (" + rank_list(group) + ")";
      i = j;
    }
    return out + ". It still acted as one barrier; call barrier() with the same names in the same order on every rank";
  }

  /// Processes a released rank's waiting events until it parks again; no
  /// commit or release happens meanwhile, so each drained rank sees the
  /// state the release left.
  void drain(int rank) {
    Rank& r = ranks[rank];
    std::vector<char>& waiting = r.parked_events;
    wire::EventReader in(std::span<const char>(waiting).subspan(r.parked_from));
    wire::RankEvent ev;
    for (std::size_t at = 0; in.next(ev); at = in.offset()) {
      if (std::holds_alternative<wire::KeyDef>(ev)) continue; // applied when it arrived
      if (r.closed) break;
      if (r.parked) { // keep the rest where it is: a rank far ahead must not cost a copy per barrier
        r.parked_from += at;
        if (r.parked_from * 2 > waiting.size()) {
          waiting.erase(waiting.begin(), waiting.begin() + static_cast<std::ptrdiff_t>(r.parked_from));
          r.parked_from = 0;
        }
        return;
      }
      process(rank, ev);
    }
    waiting.clear();
    r.parked_from = 0;
  }

  /// After every event: release a barrier every live rank waits at, then
  /// commit the rows every live rank is past.
  void settle() {
    while (parked > 0 && parked_live == live) release(Release::arrived);
    commit_below(watermark.min());
  }

  // ---- rows ---------------------------------------------------------------

  void commit_below(std::int64_t mark) {
    pending.take_below(mark, [this](PendingRow& row) { commit(row); });
  }

  void commit(PendingRow& p) {
    const std::vector<std::uint32_t>& order = names.order();
    const std::vector<std::uint32_t>& by_order = names.by_order();
    for (Entry& e : p.entries) e.sort = sort_key(order[e.sort >> 32], static_cast<std::uint32_t>(e.sort));
    sorter.sort(p.entries, ranks.size(), names.size(), p.repeats);
    if (p.repeats) keep_last(p.entries);

    out.step = p.step;
    out.ts_us = p.ts_us;
    // Wrapping: timestamps come from the ranks' clocks, and nothing here may overflow on odd ones.
    out.runtime_us =
        static_cast<std::int64_t>(static_cast<std::uint64_t>(p.ts_us) - static_cast<std::uint64_t>(start_ts));
    out.values.clear();
    out.nonfinite.clear();
    // A value's column depends on its key, the key's declaration and its rank
    // only, never on which other ranks logged at this step: so each key is one
    // series (or one per rank) for the whole run.
    const bool one_rank = ranks.size() == 1;
    const Entry* e = p.entries.data();
    each_key_run(e, p.entries.size(), [&](std::size_t i, std::size_t j) {
      const std::uint32_t gid = by_order[static_cast<std::uint32_t>(e[i].sort >> 32)];
      const Reduce how = names.reduction(gid);
      if (how != Reduce::none) {
        const double v = reduce_values(how, e + i, j - i);
        if (!std::isfinite(v)) [[unlikely]] {
          RowNonfinite& bad = out.nonfinite.emplace_back();
          bad.value = static_cast<std::uint32_t>(out.values.size());
          for (std::size_t k = i; k < j; ++k)
            if (!std::isfinite(e[k].value)) bad.ranks.push_back(static_cast<std::int32_t>(static_cast<std::uint32_t>(e[k].sort)));
        }
        out.values.push_back({gid, -1, v, static_cast<std::uint32_t>(j - i)});
      } else {
        for (std::size_t k = i; k < j; ++k) {
          const auto rank = static_cast<std::int32_t>(static_cast<std::uint32_t>(e[k].sort));
          out.values.push_back({gid, one_rank ? -1 : rank, e[k].value, 0});
        }
      }
    });
    out.histograms.clear();
    if (!p.histograms.empty()) commit_histograms(p, order, by_order, one_rank);
    out.media.clear();
    if (!p.media.empty()) {
      sort_by_name(p.media, order);
      for (const MediaEntry& e : p.media)
        out.media.push_back({by_order[static_cast<std::uint32_t>(e.sort >> 32)],
                             static_cast<std::int32_t>(static_cast<std::uint32_t>(e.sort)), &e.value});
    }
    last_committed = p.step;
    ++rows_committed;
    sink.row(out);
  }

  /// A row's histograms as its columns: a key declared `first` takes the
  /// lowest rank's, one declared with another reduction the merge of the
  /// ranks' (in rank order: the same bits on every replay), an undeclared
  /// one a column per rank.
  void commit_histograms(PendingRow& p, const std::vector<std::uint32_t>& order,
                         const std::vector<std::uint32_t>& by_order, bool one_rank) {
    sort_by_name(p.histograms, order);
    merged.clear();
    merged.reserve(p.histograms.size()); // the row points into it: it must not move
    const HistogramEntry* e = p.histograms.data();
    each_key_run(e, p.histograms.size(), [&](std::size_t i, std::size_t j) {
      const std::uint32_t gid = by_order[static_cast<std::uint32_t>(e[i].sort >> 32)];
      const Reduce how = names.reduction(gid);
      const auto ranks_in = static_cast<std::uint32_t>(j - i);
      if (how == Reduce::none) {
        for (std::size_t k = i; k < j; ++k)
          out.histograms.push_back(
              {gid, one_rank ? -1 : static_cast<std::int32_t>(static_cast<std::uint32_t>(e[k].sort)), &e[k].value, 0});
      } else if (how == Reduce::first) {
        out.histograms.push_back({gid, -1, &e[i].value, ranks_in});
      } else {
        Histogram& all = merged.emplace_back(e[i].value);
        for (std::size_t k = i + 1; k < j; ++k) all.merge(e[k].value);
        out.histograms.push_back({gid, -1, &all, ranks_in});
      }
    });
  }

  // ---- frames -------------------------------------------------------------

  /// Whether a rank batch is taken. Its check marks the keys it defines and
  /// moves the rank's seq on (FrameCheck): a `take` is applied next.
  Admit admit_batch(const wire::Frame& f) {
    if (!started || f.rank >= ranks.size()) return Admit::refuse;
    if (ended) return Admit::ignore;
    Rank& r = ranks[f.rank];
    if (r.state != RunState::running) return Admit::ignore; // sent after its death or finish
    if (!r.joined || !check_keys(r, f.body)) return Admit::refuse;
    return Admit::take;
  }

  /// Whether host_event() takes `h`: the checks it makes before any change.
  [[nodiscard]] Admit admit_host_event(const wire::HostEventData& h) const {
    if (const auto* s = std::get_if<wire::RunStart>(&h))
      return (started && !ended) || s->world_size == 0 || s->world_size > max_world ? Admit::refuse : Admit::take;
    if (!started) return Admit::refuse;
    const auto in_range = [this](std::uint32_t rank) { return rank < ranks.size() ? Admit::take : Admit::refuse; };
    if (const auto* j = std::get_if<wire::RankJoined>(&h)) return in_range(j->rank);
    if (const auto* d = std::get_if<wire::RankDead>(&h)) return in_range(d->rank);
    if (const auto* x = std::get_if<wire::RankExit>(&h)) return in_range(x->rank);
    if (std::holds_alternative<wire::BarrierTimeout>(h) || std::holds_alternative<wire::FinishTimeout>(h) ||
        std::holds_alternative<wire::RunEnd>(h) || std::holds_alternative<wire::EventRecord>(h))
      return Admit::take;
    return Admit::refuse;
  }

  Admit admit(const wire::Frame& f) {
    return f.type == wire::FrameType::host_event ? admit_host_event(f.host) : admit_batch(f);
  }

  void apply(const wire::Frame& f) {
    if (f.type == wire::FrameType::host_event) host_event(f.host);
    else rank_batch(f);
  }

  // The events of a batch that admit_batch took.
  void rank_batch(const wire::Frame& f) {
    const int rank = static_cast<int>(f.rank);
    Rank& r = ranks[rank];
    wire::EventReader in(f.body);
    wire::RankEvent ev;
    for (std::size_t at = 0; in.next(ev); at = in.offset()) {
      if (const auto* k = std::get_if<wire::KeyDef>(&ev)) {
        define_key(r, *k); // at once, even behind a barrier: it names, it does not happen
        continue;
      }
      if (r.closed) continue;
      if (r.parked) {
        r.parked_events.insert(r.parked_events.end(), f.body.begin() + static_cast<std::ptrdiff_t>(at),
                               f.body.begin() + static_cast<std::ptrdiff_t>(in.offset()));
        if (std::holds_alternative<wire::Finish>(ev)) r.finish_parked = true;
        continue;
      }
      process(rank, ev);
      settle();
    }
  }

  // A host event that admit_host_event took.
  void host_event(const wire::HostEventData& h) {
    if (const auto* s = std::get_if<wire::RunStart>(&h)) {
      // A run_start after run_end is a resumed attempt: fresh ranks, the
      // history, keys and counts go on, and so does the runtime's origin.
      // Its ranks' auto steps start past the last committed step.
      if (!started) start_ts = s->ts_us;
      started = true;
      ended = false;
      ranks.assign(s->world_size, Rank{});
      for (Rank& r : ranks) {
        r.streams.raise(last_committed); // every stream's auto steps go on past it
        r.cursor = r.streams.cursor();
      }
      live = static_cast<int>(s->world_size);
      parked = parked_live = 0;
      released = 0;
      open_timeout_ms = 0;
      watermark.reset(s->world_size, last_committed);
      sink.run_start(s->run_json, s->ts_us, s->world_size);
      return;
    }
    if (const auto* j = std::get_if<wire::RankJoined>(&h)) {
      Rank& r = ranks[j->rank];
      if (ended || r.joined || r.state != RunState::running) return;
      r.joined = true;
      r.host = j->host;
      sink.rank_joined(static_cast<int>(j->rank), j->ts_us);
      sink.rank_state(static_cast<int>(j->rank), RunState::running, r.last_step, r.host, {});
      return;
    }
    if (const auto* d = std::get_if<wire::RankDead>(&h)) {
      if (ended || ranks[d->rank].state != RunState::running) return;
      leave(static_cast<int>(d->rank), RunState::crashed, d->reason);
      settle();
      return;
    }
    if (const auto* b = std::get_if<wire::BarrierTimeout>(&h)) {
      if (ended || parked == 0 || b->index != released) return; // a stale timer
      release(Release::timeout);
      settle();
      return;
    }
    if (std::holds_alternative<wire::FinishTimeout>(h)) {
      if (ended) return;
      // The run is ending: an open barrier lets its waiters through first, so
      // that a rank that finished while it waited there (interrupted at the
      // barrier, say) ends as it asked, with everything it logged before.
      while (parked > 0) release(parked_live == live ? Release::arrived : Release::run_end);
      for (int i = 0; i < static_cast<int>(ranks.size()); ++i) {
        if (ranks[i].state != RunState::running) continue;
        leave(i, RunState::crashed,
              ranks[i].joined
                  ? "did not finish within finish_timeout: still running (last step " +
                        std::to_string(ranks[i].last_step) +
                        ") when the run host gave up waiting; look for a hang on this rank, or raise finish_timeout"
                  : std::string("did not finish within finish_timeout: it never connected to the run host"));
      }
      settle();
      return;
    }
    if (const auto* e = std::get_if<wire::RunEnd>(&h)) {
      if (ended) return;
      // Nothing logged is lost: each open barrier lets its waiters through.
      while (parked > 0) release(parked_live == live ? Release::arrived : Release::run_end);
      commit_below(past_all);
      ended = true;
      end_state = e->state;
      end_ts = e->ts_us;
      sink.run_end(e->state, e->ts_us);
      return;
    }
    if (const auto* ev = std::get_if<wire::EventRecord>(&h)) {
      sink.event(*ev); // told, not merged: a replay tells it again
      return;
    }
    if (const auto* x = std::get_if<wire::RankExit>(&h)) {
      Rank& r = ranks[x->rank];
      // Only a finish that said "finished" is taken back: a rank that ended
      // otherwise says so already, and one still running is yet to end.
      if (r.state != RunState::finished) return;
      r.state = RunState::failed;
      r.end_message = "its process exited with status " + std::to_string(x->status) + " after it finished";
      sink.rank_state(static_cast<int>(x->rank), r.state, r.last_step, r.host, r.end_message);
      if (ended && end_state == RunState::finished) {
        end_state = RunState::failed;
        sink.run_end(end_state, end_ts);
      }
      return;
    }
  }
};

Merger::Merger(HistorySink& sink) : s_(std::make_unique<State>(sink)) {}
Merger::~Merger() = default;

bool Merger::admit(std::span<const char> frame, wire::Frame& out) {
  s_->admitted = State::Admit::refuse;
  if (!wire::decode(frame, out)) return false;
  s_->admitted = s_->admit(out);
  s_->admitted_ends = s_->admitted == State::Admit::take && out.type == wire::FrameType::rank_batch &&
                      s_->frame_check.ends_rank();
  return s_->admitted != State::Admit::refuse;
}

void Merger::apply(const wire::Frame& admitted) {
  assert(s_->admitted != State::Admit::refuse);
  if (s_->admitted == State::Admit::take) s_->apply(admitted);
  s_->admitted = State::Admit::refuse;
  s_->admitted_ends = false;
}

bool Merger::admitted_ends_rank() const noexcept {
  return s_->admitted_ends;
}

bool Merger::apply(std::span<const char> frame) {
  wire::Frame f;
  if (!admit(frame, f)) return false;
  apply(f);
  return true;
}

std::string_view Merger::key_name(std::uint32_t key) const {
  return key < s_->names.size() ? std::string_view(s_->names[key]) : std::string_view();
}

int Merger::world_size() const noexcept { return static_cast<int>(s_->ranks.size()); }
bool Merger::started() const noexcept { return s_->started; }
std::int64_t Merger::start_ts_us() const noexcept { return s_->start_ts; }

RunState Merger::rank_state(int rank) const {
  return rank >= 0 && rank < world_size() ? s_->ranks[rank].state : RunState::running;
}
bool Merger::rank_joined(int rank) const { return rank >= 0 && rank < world_size() && s_->ranks[rank].joined; }
std::int64_t Merger::rank_last_step(int rank) const {
  return rank >= 0 && rank < world_size() ? s_->ranks[rank].last_step : no_step;
}

bool Merger::all_done() const noexcept { return s_->started && s_->live == 0; }

RunState Merger::end_state() const noexcept {
  // The worst way a rank ended names the run: a failure, else a rank gone
  // without a word, else a signal.
  RunState worst = RunState::finished;
  for (const Rank& r : s_->ranks) {
    if (r.state == RunState::failed) return RunState::failed;
    if (r.state == RunState::crashed) worst = RunState::crashed;
    if (r.state == RunState::killed && worst == RunState::finished) worst = RunState::killed;
  }
  return worst;
}

const std::string& Merger::rank_message(int rank) const {
  static const Immortal<std::string> none; // the Run actor may ask while the process exits
  if (rank >= 0 && rank < world_size()) return s_->ranks[rank].end_message;
  return *none;
}
bool Merger::finish_waiting(int rank) const {
  return rank >= 0 && rank < world_size() && s_->ranks[rank].parked && s_->ranks[rank].finish_parked &&
         s_->ranks[rank].state == RunState::running;
}

std::int64_t Merger::open_barrier() const noexcept {
  return s_->parked > 0 && !s_->ended ? static_cast<std::int64_t>(s_->released) : -1;
}

std::vector<int> Merger::missing_at_barrier() const {
  std::vector<int> out;
  if (open_barrier() < 0) return out;
  for (int i = 0; i < world_size(); ++i)
    if (s_->ranks[i].state == RunState::running && !s_->ranks[i].parked) out.push_back(i);
  return out;
}

std::int64_t Merger::open_barrier_timeout_ms() const noexcept { return open_barrier() < 0 ? 0 : s_->open_timeout_ms; }
std::int64_t Merger::last_committed_step() const noexcept { return s_->last_committed; }
std::uint64_t Merger::rows_committed() const noexcept { return s_->rows_committed; }
std::uint64_t Merger::values_rejected() const noexcept { return s_->values_rejected; }

} // namespace chorus::core
