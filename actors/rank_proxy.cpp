#include "actors/rank_proxy.hpp"
#include "actors/keepalive.hpp"
#include "io/platform/posix.hpp"

#include "runtime/client/refusals.hpp"
#include "runtime/client/run_impl.hpp"
#include "runtime/core/backoff.hpp"
#include "runtime/core/wire.hpp"

#include <chorus/caf.hpp>

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <optional>

namespace chorus::actors {

using platform::this_host;

namespace {

constexpr std::size_t max_slots_per_frame = 16384;
// A frame closes once it holds this many bytes (a few config texts can be
// large), far below what a link takes (actors/links/link_framing.hpp).
constexpr std::size_t max_frame_bytes = std::size_t{32} << 20;
// A frame's buffer is reserved at once for the slots waiting (this many
// bytes a slot, about a value's), so that its pages are touched only as
// bytes are written, never twice by a doubling's copy: a page fault costs
// several µs on a VM, and a burst's frame is made inside the finish.
constexpr std::size_t frame_bytes_per_slot = 16;
// With nothing to send the proxy polls its ring every millisecond, and after
// a while parks: it polls every 50 ms and producers wake it (Channel::wake).
// Polling every millisecond for ever would keep CAF's scheduler threads out of
// their sleep and cost an idle process a third of a core.
constexpr auto idle_poll = std::chrono::milliseconds(1);
constexpr int idle_polls_before_parking = 20;
constexpr auto parked_poll = std::chrono::milliseconds(50);

/// A message of an actor of this process that logs by message
/// (<chorus/caf.hpp>), until it is in the ring.
struct ActorCall {
  enum class Kind : std::uint8_t { open, log, leave, gone } kind;
  caf::actor_addr sender;
  std::optional<std::int64_t> step;
  Values values;
  caf::response_promise reply; // none for `gone`
};

/// A reply that waits for the run host to acknowledge the call's ticket.
struct ActorReply {
  Pending ticket;
  caf::response_promise reply;
};

caf::error to_caf_error(const Error& e) {
  return caf::error(static_cast<std::uint8_t>(e.code()), error_category, caf::make_message(e.message()));
}

void deliver(caf::response_promise& reply, const Error& e) {
  if (!reply.pending()) return;
  if (e)
    reply.deliver(to_caf_error(e));
  else
    reply.deliver(caf::ok_atom::value);
}

struct ProxyState {
  /// Runs as the proxy stops, before anyone waiting for it is told (CAF
  /// destroys an actor's state before it runs what was attached to it, the
  /// latest first, a waiter's among them): the Run may be freed right after.
  ~ProxyState() {
    fail_actor_calls(Error(Errc::finished, "the rank's proxy stopped (its run ended) before this call was "
                                           "acknowledged: log before finish(), and keep the Run alive while actors "
                                           "log into it"));
    // Once the proxy stops, no event reaches this rank any more: its next_event ends.
    if (run != nullptr) run->events().close();
  }

  /// Every actor call not yet answered gets `e` (its ticket's own error where it has one).
  void fail_actor_calls(const Error& e) {
    for (ActorReply& r : replies) deliver(r.reply, r.ticket.ready() ? r.ticket.wait() : e);
    replies.clear();
    for (ActorCall& c : held) deliver(c.reply, e);
    held.clear();
  }

  client::RunImpl* run = nullptr;
  run_actor host;
  std::string host_label;
  std::string secret; // the job's, which the join carries (actors/job_secret.hpp)
  std::uint32_t rank = 0;
  std::uint64_t read_pos = 0;
  std::vector<bool> key_sent;
  FrameWindow window; // the frames sent and not yet acknowledged
  bool window_full = false; // the drain loop stopped on a full window; an ack starts it again
  int idle_polls = 0;
  bool parked = false;
  std::uint64_t loop = 0; // the drain loop's generation: a restart ends the old loop
  std::uint64_t finish_seq = 0; // the finish ticket, once seen
  std::uint64_t acked = 0;      // the seq the host's acks completed so far
  RunState finish_state = RunState::finished; // how the trainer's finish ends the rank (failed, killed)
  bool finish_started = false;  // the run host is finishing the run for us
  bool finish_bounded = false;  // finish's bound (finish_tmo_atom) is running
  bool host_stalled = false;    // ... and ran out: the host did not confirm in time
  bool done = false;            // the finish ticket completed
  std::vector<char> frame; // the frame being made: sent by move, so each frame reserves its own
  // The run's stamps as Unix time (set with `run`).
  client::StampConverter stamps{client::LogClock(client::LogClock::Source::steady)};
  // Joining: repeated until answered or init_timeout runs out.
  std::function<void(JoinResult)> on_join; // emptied once called
  std::chrono::steady_clock::time_point join_deadline;
  std::chrono::milliseconds join_retry{200};
  std::optional<Keepalive> keepalive; // a run host in another process
  beacon_actor beacon;                // where pings go once joined (else to the host)
  // Actors of this process that log by message, a stream each.
  std::deque<ActorCall> held;                           // not yet in the ring (no room), in arrival order
  std::map<caf::actor_addr, std::uint32_t> actor_streams; // sender -> its stream
  std::deque<ActorReply> replies;                       // in the ring, in ticket order
  static inline const char* name = "chorus.rank_proxy";
};

using proxy_ptr = rank_proxy_self::stateful_pointer<ProxyState>;

/// Reports the join's outcome, once.
void joined(proxy_ptr self, JoinResult r) {
  auto& st = self->state;
  if (!st.on_join) return;
  auto fn = std::move(st.on_join);
  st.on_join = nullptr;
  fn(std::move(r));
}

void send_join(proxy_ptr self) {
  auto& st = self->state;
  self->send(st.host, join_atom::value, st.rank, this_host(), static_cast<std::int64_t>(::getpid()),
             core::job_identity(st.run->settings()), st.secret);
  // The last retry comes at the deadline, where the join gives up.
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(st.join_deadline - std::chrono::steady_clock::now());
  self->delayed_send(self, std::clamp(core::jittered(st.join_retry), std::chrono::milliseconds(0), left), join_retry_atom::value);
  st.join_retry = std::min(st.join_retry * 2, std::chrono::milliseconds(2000));
}

void settle_actor_calls(ProxyState& st);
void bound_finish(proxy_ptr self);
void request_finish(proxy_ptr self);

/// Fills in the process's FinishResult (`err`, if any, is its error) and,
/// once the finish ticket was seen, completes it.
void complete_finish(proxy_ptr self, Error err) {
  auto& st = self->state;
  if (st.done) return;
  const bool clean = !err;
  st.done = st.finish_seq != 0 || !clean;
  {
    std::lock_guard lock(st.run->finish_state().mu);
    FinishResult& r = st.run->finish_state().result;
    if (err && !r.error) r.error = err;
    // A run host's end_run has set the run's state; another rank's is its own.
    if (r.state == RunState::running) r.state = r.error ? RunState::failed : st.finish_state;
    r.run_id = st.run->run_id;
    r.run_dir = st.run->run_dir;
    r.dropped = st.run->dropped();
  }
  if (!clean) {
    // Nothing the host did not confirm reads as logged: what it has not
    // acknowledged (and the finish, even one a full window kept from going
    // out) ends with the error.
    st.run->channel().fail(std::move(err));
    settle_actor_calls(st);
    return;
  }
  if (st.finish_seq == 0) return;
  st.run->channel().complete(st.finish_seq);
  // The run's host, in this process, frees what its end held while the trainer goes on.
  if (st.run->settings().is_host && st.host) self->send(st.host, answered_atom::value);
  // A call another thread made while finish() ran may sit behind the finish
  // in the queue; the run takes nothing after it, so its ticket must not wait
  // for ever.
  st.run->channel().fail(Error(Errc::finished, "this call reached the run after finish(), which another thread "
                                                 "called while it was made: it was not logged; call finish() once "
                                                 "every producer is done"));
  settle_actor_calls(st);
}

/// The run host is gone (`e` says how): every waiting caller gets `e`, and the proxy stops.
void lose_host(proxy_ptr self, Error e) {
  auto& st = self->state;
  st.host = nullptr;
  joined(self, JoinResult{e, {}, {}});
  complete_finish(self, e);
  st.run->channel().fail(e);
  st.fail_actor_calls(e);
  self->quit();
}

/// Answers the actor calls whose tickets completed.
void settle_actor_calls(ProxyState& st) {
  while (!st.replies.empty() && st.replies.front().ticket.ready()) {
    ActorReply& r = st.replies.front();
    deliver(r.reply, r.ticket.wait());
    st.replies.pop_front();
  }
}

/// The reply to a call that went into the ring as `ticket`: now where it is
/// already complete (a refusal), else once the run host acknowledges it.
void answer_when_done(ProxyState& st, Pending ticket, caf::response_promise reply) {
  if (ticket.ready() && st.replies.empty())
    deliver(reply, ticket.wait());
  else
    st.replies.push_back(ActorReply{ticket, std::move(reply)});
}

/// Moves held actor calls into the ring, in order, while they fit.
void offer_actor_calls(proxy_ptr self) {
  auto& st = self->state;
  client::RunImpl& run = *st.run;
  std::vector<Metric> metrics;
  while (!st.held.empty()) {
    ActorCall& c = st.held.front();
    auto stream = st.actor_streams.find(c.sender);
    if (c.kind == ActorCall::Kind::open || c.kind == ActorCall::Kind::log) {
      if (stream == st.actor_streams.end()) {
        std::uint32_t id = 0;
        if (!run.offer_open(id)) return;
        if (id != 0) {
          stream = st.actor_streams.emplace(c.sender, id).first;
          self->monitor(c.sender); // its stream closes when it terminates
        }
      }
      if (c.kind == ActorCall::Kind::open && stream != st.actor_streams.end()) {
        answer_when_done(st, Pending{}, std::move(c.reply));
        st.held.pop_front();
        continue;
      }
      metrics.clear();
      for (const auto& [key, value] : c.values) metrics.push_back(Metric{key, value});
      LogOptions opts;
      opts.step = c.step;
      Pending ticket;
      // No stream (none left, or the run finished): the call's refusal says which.
      if (!run.offer_log(stream == st.actor_streams.end() ? 0 : stream->second, metrics, opts, ticket)) return;
      answer_when_done(st, ticket, std::move(c.reply));
    } else if (stream == st.actor_streams.end()) {
      deliver(c.reply, {}); // it logged nothing, or left already
    } else {
      Pending ticket;
      if (!run.offer_close(stream->second, ticket)) return;
      st.actor_streams.erase(stream);
      if (c.kind == ActorCall::Kind::leave) {
        self->demonitor(c.sender);
        answer_when_done(st, ticket, std::move(c.reply));
      }
    }
    st.held.pop_front();
  }
}

void ensure_key(ProxyState& st, core::wire::BatchWriter& w, std::uint32_t id) {
  if (id >= st.key_sent.size()) st.key_sent.resize(std::max<std::size_t>(id + 1, st.key_sent.size() * 2), false);
  if (!st.key_sent[id]) {
    w.key(id, client::KeyTable::instance().name(id));
    st.key_sent[id] = true;
  }
}

/// Writes one log call of `head.count` values into `stream`, the first at
/// `first`: its keys (announced once), then its values, `value_of(i)` for
/// the i-th.
template <class ValueOf>
void write_call(ProxyState& st, core::wire::BatchWriter& w, client::Ring& ring, std::uint64_t first, const client::Slot& head,
                std::int64_t ts, ValueOf&& value_of, std::uint32_t stream = 0) {
  const std::uint32_t n = head.count;
  for (std::uint32_t i = 0; i < n; ++i) ensure_key(st, w, ring.at(first + i).key);
  w.values(first + n, head.step, ts, n, stream);
  for (std::uint32_t i = 0; i < n; ++i) w.value(ring.at(first + i).key, value_of(i));
}

/// Moves what the ring holds into one frame and sends it; false if nothing was sent.
bool drain(proxy_ptr self) {
  auto& st = self->state;
  if (!st.held.empty() && st.host) offer_actor_calls(self);
  if (!st.window.open() || !st.host) return false;
  client::Ring& ring = st.run->ring();
  std::uint64_t pos = st.read_pos;
  if (ring.peek(pos) == nullptr) return false;
  st.frame.clear();
  const std::size_t want =
      static_cast<std::size_t>(std::min<std::uint64_t>(ring.head() - pos, max_slots_per_frame)) * frame_bytes_per_slot;
  if (st.frame.capacity() < want) st.frame.reserve(want);
  core::wire::BatchWriter w(st.frame, st.rank);
  st.stamps.anchor(); // after the first slot was seen: the frame's slots were stamped before it, or barely after
  const std::uint64_t end = pos + max_slots_per_frame;
  while (pos < end && st.frame.size() < max_frame_bytes) {
    client::Slot* s = ring.peek(pos);
    if (s == nullptr) break;
    // When the call was made, on the trainer's thread (a head's or a single slot's stamp).
    const std::int64_t ts = st.stamps.unix_us(client::Ring::stamp(*s));
    switch (s->kind) {
      case client::SlotKind::values_head: {
        const std::uint32_t n = s->count;
        if (ring.peek(pos + n - 1) == nullptr) goto full; // the call is still being written
        write_call(st, w, ring, pos, *s, ts, [&](std::uint32_t i) { return ring.at(pos + i).value; });
        pos += n;
        break;
      }
      case client::SlotKind::stream_head: {
        // A writer's call: this slot names the stream, its values follow.
        const std::uint32_t n = s->count;
        if (ring.peek(pos + n) == nullptr) goto full;
        const std::uint64_t first = pos + 1;
        write_call(st, w, ring, first, *s, ts, [&](std::uint32_t i) { return ring.at(first + i).value; }, s->key);
        pos += n + 1;
        break;
      }
      case client::SlotKind::stream_open:
      case client::SlotKind::stream_close:
        w.stream(pos + 1, s->key, s->kind == client::SlotKind::stream_open);
        pos += 1;
        break;
      case client::SlotKind::device_head: {
        // Device values wait in the ring, in order, until their copy has
        // landed: this loop is the poller that completes them.
        const std::uint32_t n = s->count;
        if (ring.peek(pos + n - 1) == nullptr) goto full;
        client::Capture* c = s->capture;
        client::DeviceCapture& device = *st.run->device();
        Result<bool> landed = device.poll(*c);
        if (landed && !*landed) goto full;
        if (landed) {
          // The copied values come first; host values logged in the same
          // call (at the same step) follow in their slots.
          write_call(st, w, ring, pos, *s, ts, [&](std::uint32_t i) {
            return i < c->copied ? static_cast<double>(c->pinned[i]) : ring.at(pos + i).value;
          });
        } else {
          // The values are lost with the stream; the step still moves on.
          st.run->channel().set_error(pos + n, std::move(landed).error());
          w.values(pos + n, s->step, ts, 0);
        }
        device.release(c);
        pos += n;
        break;
      }
      case client::SlotKind::step_mark:
        w.values(pos + 1, s->step, ts, 0);
        pos += 1;
        break;
      case client::SlotKind::value: // a value slot is always consumed with its head
        pos += 1;
        break;
      case client::SlotKind::define:
        ensure_key(st, w, s->key);
        w.define(pos + 1, s->key, s->reduce);
        pos += 1;
        break;
      case client::SlotKind::barrier:
        ensure_key(st, w, s->key);
        w.barrier(pos + 1, s->key, s->step);
        pos += 1;
        break;
      case client::SlotKind::config:
      case client::SlotKind::summary: {
        std::unique_ptr<std::string> text(s->text);
        if (s->kind == client::SlotKind::config)
          w.config(pos + 1, *text);
        else
          w.summary(pos + 1, *text);
        pos += 1;
        break;
      }
      case client::SlotKind::refused: {
        std::unique_ptr<client::Refusal> r(s->refusal);
        w.refused(pos + 1, s->step, r->code, r->n, r->message, r->values);
        pos += 1;
        break;
      }
      case client::SlotKind::histogram: {
        std::unique_ptr<Histogram> h(s->histogram);
        ensure_key(st, w, s->key);
        w.histogram(pos + 1, s->count, s->step, ts, s->key, *h);
        pos += 1;
        break;
      }
      case client::SlotKind::media: {
        // An image waits, in order, for its PNG (runtime/client/media_encoder.hpp).
        const int state = s->media->state.load(std::memory_order_acquire);
        if (state == client::MediaJob::pending) goto full;
        std::unique_ptr<client::MediaJob> job(s->media);
        if (state == client::MediaJob::ready) {
          ensure_key(st, w, s->key);
          w.media(pos + 1, s->count, s->step, ts, s->key, job->media);
        } else {
          // Not encoded: the ticket says why; the step still moves on.
          st.run->channel().set_error(pos + 1, std::move(job->error));
          w.values(pos + 1, s->step, ts, 0, s->count);
        }
        pos += 1;
        break;
      }
      case client::SlotKind::device_histogram: {
        // A histogram counted on the GPU waits, in order, for its counts
        // (runtime/client/device_histogram.hpp): this loop polls its event.
        client::DeviceHistogramJob* job = s->device_histogram;
        client::DeviceBuckets* buckets = job != nullptr ? &st.run->device()->buckets() : nullptr;
        Result<bool> landed = buckets != nullptr
                                  ? buckets->poll(*job)
                                  : Result<bool>(Error(Errc::internal, "a device histogram went missing"));
        if (landed && !*landed) goto full;
        if (landed) {
          const Histogram h = client::DeviceBuckets::take(*job);
          ensure_key(st, w, s->key);
          w.histogram(pos + 1, s->count, s->step, ts, s->key, h);
        } else {
          // The counts are lost with the stream; the step still moves on.
          st.run->channel().set_error(pos + 1, std::move(landed).error());
          w.values(pos + 1, s->step, ts, 0, s->count);
        }
        if (buckets != nullptr) buckets->release(job);
        pos += 1;
        break;
      }
      case client::SlotKind::alert_rule:
        ensure_key(st, w, s->key);
        w.alert_rule(pos + 1, s->key, AlertRule{static_cast<AlertRule::Kind>(s->count), s->value});
        pos += 1;
        break;
      case client::SlotKind::metric_view:
        ensure_key(st, w, s->key);
        if (s->step >= 0) ensure_key(st, w, static_cast<std::uint32_t>(s->step));
        w.metric_view(pos + 1, s->key, static_cast<std::uint8_t>(s->count),
                      s->step >= 0 ? static_cast<std::uint32_t>(s->step) : core::wire::no_step_metric);
        pos += 1;
        break;
      case client::SlotKind::finish: {
        // Artifact copies in flight complete first (at most finish_timeout).
        if (st.run->artifacts().holds_finish()) goto full;
        std::unique_ptr<std::string> why(s->text);
        st.finish_state = static_cast<RunState>(s->count);
        if (st.finish_state == RunState::finished)
          w.finish(pos + 1);
        else
          w.finish_ended(pos + 1, st.finish_state, static_cast<std::int32_t>(s->step), why ? *why : std::string());
        st.finish_seq = pos + 1;
        pos += 1;
        bound_finish(self);
        break;
      }
    }
  }
full:
  if (pos == st.read_pos) return false;
  ring.release_to(pos);
  st.read_pos = pos;
  // Moved, not copied: the message takes the buffer, and the next frame
  // reserves its own (a copy would touch as many fresh pages again).
  st.window.sent(st.frame.size());
  self->send(st.host, batch_atom::value, std::move(st.frame));
  st.frame = {};
  if (st.finish_seq != 0) request_finish(self);
  return true;
}

/// The run host's own rank asks the Run actor to end the run, once, as soon
/// as its finish frame is out: the Run actor takes the two in the order they
/// were sent, and ends the run with one sync that acknowledges the frames as
/// well (their acks come before the answer). Waiting for the frame's own ack
/// first would add a sync and a round trip to every finish.
void request_finish(proxy_ptr self) {
  auto& st = self->state;
  if (st.finish_started || !st.run->settings().is_host) return;
  st.finish_started = true;
  self->request(st.host, caf::infinite, finish_atom::value)
      .then([self](caf::ok_atom) { complete_finish(self, {}); },
            [self](caf::error& err) {
              complete_finish(self, Error(Errc::internal, "finishing the run failed: " + self->system().render(err)));
            });
}

/// Starts finish's bound, once: when the trainer's finish is first seen,
/// not when its slot goes out, which a host that takes nothing more (its
/// window full) would put off until the link is declared lost.
void bound_finish(proxy_ptr self) {
  auto& st = self->state;
  if (st.finish_bounded) return;
  st.finish_bounded = true;
  const auto& opts = st.run->settings().opts;
  const bool host = st.run->settings().is_host;
  // The host's finish also drains the Uploader (bounded by upload_timeout).
  const auto limit = opts.finish_timeout + std::chrono::seconds(host ? 5 : 2) +
                     (host && !opts.upload.empty() ? opts.upload_timeout : std::chrono::milliseconds(0));
  self->delayed_send(self, limit, finish_tmo_atom::value);
}

/// Drains now; a parked proxy starts a fresh loop at full speed instead,
/// which replaces the parked one.
void wake(proxy_ptr self) {
  auto& st = self->state;
  if (st.run->finishing()) bound_finish(self);
  if (!st.parked) return (void)drain(self);
  st.parked = false;
  st.run->channel().consumer_parked.store(false, std::memory_order_relaxed);
  st.idle_polls = 0;
  self->send(self, drain_atom::value, ++st.loop);
}

/// A message of <chorus/caf.hpp>'s rank_proxy interface: it is answered once
/// its ticket completes. Only actors of this process log through the proxy.
caf::delegated<caf::ok_atom> take_actor_call(proxy_ptr self, ActorCall::Kind kind, std::optional<std::int64_t> step,
                                             const Values& values) {
  auto& st = self->state;
  // Read before the promise is made: making it takes the sender out of the message.
  const bool ours = from_this_process(self);
  auto sender = caf::actor_cast<caf::actor_addr>(self->current_sender());
  caf::response_promise reply = self->make_response_promise();
  if (!ours) {
    deliver(reply, Error(Errc::invalid_argument, "only the actors of the rank's own process log through its proxy"));
    return {};
  }
  if (!st.host) {
    deliver(reply, st.run->channel().failure());
    return {};
  }
  st.held.push_back(ActorCall{kind, std::move(sender), step, values, std::move(reply)});
  wake(self);
  return {};
}

rank_proxy_self::behavior_type rank_proxy_behavior(proxy_ptr self, client::RunImpl* run, run_actor host, std::string host_label,
                                          std::string secret, std::chrono::steady_clock::time_point join_deadline,
                                          std::function<void(JoinResult)> on_join) {
  auto& st = self->state;
  st.run = run;
  st.stamps = client::StampConverter(run->clock());
  st.host = host;
  st.host_label = std::move(host_label);
  st.secret = std::move(secret);
  st.rank = static_cast<std::uint32_t>(run->settings().run_rank);
  self->monitor(host);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.actor_streams.count(dm.source) != 0) {
      // An actor that logged by message terminated: its stream leaves the rank's minimum.
      st.held.push_back(ActorCall{ActorCall::Kind::gone, dm.source, {}, {}, {}});
      return wake(self);
    }
    if (dm.source != st.host.address()) return;
    lose_host(self, Error(Errc::host_lost, "the run host (" + st.host_label + ") went away (" +
                                               caf::to_string(dm.reason) +
                                               "): values not yet acknowledged are lost to the run; check the host "
                                               "rank's output"));
  });
  if (is_remote(self, host)) {
    const auto& opts = run->settings().opts;
    st.keepalive.emplace(opts.heartbeat_interval, opts.connection_timeout);
    self->send(self, keepalive_atom::value);
  }
  st.on_join = std::move(on_join);
  st.join_deadline = join_deadline;
  send_join(self);
  return {
      [self](joined_atom, const WireError& refusal, const std::string& id, const std::string& dir,
             const caf::actor& beacon) {
        auto& st = self->state;
        if (!from(self, st.host)) return;
        if (st.keepalive) st.keepalive->heard();
        if (beacon) st.beacon = caf::actor_cast<beacon_actor>(beacon);
        if (!st.on_join) return; // an answer to a repeated join
        if (refusal) {
          const Error why = refusal.error();
          joined(self, JoinResult{Error(why.code(), "the run host at " + st.host_label + " refused rank " +
                                                        std::to_string(st.rank) + ": " + why.message()),
                                  {},
                                  {}});
          self->quit();
          return;
        }
        // The host's own rank knew them before it joined, and may be
        // reading them (its init does not wait for this join: actors/system.cpp).
        if (st.run->run_id != id) st.run->run_id = id;
        if (st.run->run_dir != dir) st.run->run_dir = dir;
        joined(self, JoinResult{{}, id, dir});
        self->send(self, drain_atom::value, st.loop);
      },
      [self](join_retry_atom) {
        auto& st = self->state;
        if (!from_self(self) || !st.on_join) return;
        if (std::chrono::steady_clock::now() < st.join_deadline) return send_join(self);
        joined(self, JoinResult{Error(Errc::connect_failed,
                                      "the run host at " + st.host_label +
                                          " accepted the connection but did not answer rank " +
                                          std::to_string(st.rank) + "'s join within init_timeout (" +
                                          std::to_string(st.run->settings().opts.init_timeout.count()) +
                                          " ms); check the host rank's output"),
                                {},
                                {}});
        self->quit();
      },
      [self](drain_atom, std::uint64_t loop) {
        // The proxy's own loop: back-to-back while there is data, else a
        // short sleep, else parked (see idle_poll).
        auto& st = self->state;
        if (!from_self(self) || loop != st.loop) return;
        client::Channel& ch = st.run->channel();
        if (drain(self)) {
          st.idle_polls = 0;
          if (st.parked) {
            st.parked = false;
            ch.consumer_parked.store(false, std::memory_order_relaxed);
          }
          self->send(self, drain_atom::value, loop);
          return;
        }
        // A full window waits for the host's ack, which starts the loop
        // again: no poll meanwhile (a stalled host would keep it spinning).
        if (!st.window.open() && st.host) {
          st.window_full = true;
          return;
        }
        // Something published but not ready (device values in flight, a call
        // half written) keeps the short poll.
        if (st.parked || ++st.idle_polls < idle_polls_before_parking || st.run->ring().peek(st.read_pos) != nullptr) {
          self->delayed_send(self, st.parked ? parked_poll : idle_poll, drain_atom::value, loop);
          return;
        }
        st.parked = true;
        ch.consumer_parked.store(true, std::memory_order_seq_cst);
        // A producer that published before seeing the flag did not wake us: look once more.
        if (st.run->ring().peek(st.read_pos) != nullptr) {
          st.parked = false;
          ch.consumer_parked.store(false, std::memory_order_relaxed);
          st.idle_polls = 0;
          self->send(self, drain_atom::value, loop);
          return;
        }
        self->delayed_send(self, parked_poll, drain_atom::value, loop);
      },
      [self](nudge_atom) { wake(self); },
      [self](log_atom, const Values& values) {
        return take_actor_call(self, ActorCall::Kind::log, std::nullopt, values);
      },
      [self](log_atom, std::int64_t step, const Values& values) {
        return take_actor_call(self, ActorCall::Kind::log, step, values);
      },
      [self](open_atom) { return take_actor_call(self, ActorCall::Kind::open, std::nullopt, {}); },
      [self](leave_atom) { return take_actor_call(self, ActorCall::Kind::leave, std::nullopt, {}); },
      [self](ack_atom, std::uint32_t frames, std::uint64_t completed, const AckErrors& errors) {
        auto& st = self->state;
        if (!from(self, st.host)) return;
        if (st.keepalive) st.keepalive->heard();
        // Nothing reads as logged that the rank did not send, or that an
        // earlier ack did not leave open: such an ack ends the link.
        if (std::string bad = bad_ack(AckWindow{st.window.in_flight(), st.read_pos, st.acked},
                                      frames, completed, errors);
            !bad.empty())
          return lose_host(self, Error(Errc::host_lost, "the run host (" + st.host_label + ") sent an acknowledgement " +
                                                            bad + ": it is refused, and values not yet acknowledged "
                                                                  "are reported lost; check that every rank runs the "
                                                                  "same chorus as the host"));
        st.acked = completed;
        st.window.acked(frames);
        for (const AckError& e : errors) {
          st.run->channel().set_error(e.seq, e.error());
          if (e.warn) client::print_refusal(st.run->settings().topo.rank, e.error(), true);
        }
        if (st.finish_seq != 0 && completed >= st.finish_seq) {
          st.run->channel().complete(st.finish_seq - 1);
          // The host's own rank asked for the run's end with its finish frame (request_finish).
          if (!st.run->settings().is_host) complete_finish(self, {});
        } else {
          st.run->channel().complete(completed);
        }
        settle_actor_calls(st);
        if (frames == 0) return;
        if (st.window_full) {
          st.window_full = false;
          self->send(self, drain_atom::value, ++st.loop);
        } else {
          drain(self);
        }
      },
      [self](exited_atom, std::int32_t status) -> caf::delegated<caf::ok_atom> {
        auto& st = self->state;
        // Only this process's System says how the process exits.
        if (!from_this_process(self)) return drop_request<caf::ok_atom>(self);
        auto rp = self->make_response_promise();
        // A host that let finish time out would keep the exit waiting too.
        if (!st.host || status == 0 || st.host_stalled) {
          rp.deliver(caf::ok_atom::value);
          return {};
        }
        self->request(st.host, std::chrono::seconds(4), exited_atom::value, st.rank, status)
            .then([rp](caf::ok_atom) mutable { rp.deliver(caf::ok_atom::value); },
                  [rp](caf::error&) mutable { rp.deliver(caf::ok_atom::value); });
        return {};
      },
      [self](event_atom, const std::vector<char>& frame) {
        auto& st = self->state;
        if (!from(self, st.host)) return;
        core::wire::Frame f;
        if (!core::wire::decode(frame, f) || f.type != core::wire::FrameType::host_event) return;
        const auto* e = std::get_if<core::wire::EventRecord>(&f.host);
        if (!e) return;
        st.run->events().deliver(e->to_event());
        // The run's last event: nothing follows it.
        if (e->kind == EventKind::run_finished) st.run->events().close();
      },
      // The run's end asks: what it sent before has arrived (acks and events are handled in order).
      [](ping_atom) { return caf::ok_atom::value; },
      [self](fail_atom, const WireError& why) {
        // The run keeps nothing more (its WAL failed, or it ended): every ticket learns why.
        if (from(self, self->state.host)) lose_host(self, error_from_peer(why.code, why.message));
      },
      [self](keepalive_atom) {
        auto& st = self->state;
        if (!from_self(self) || st.done || !st.host) return;
        // Until the join is answered, init_timeout bounds the wait (join_retry_atom), not
        // the host's silence: a host still starting up answers late. The pings still go,
        // to keep the link alive.
        if (st.on_join) st.keepalive->heard();
        if (st.keepalive->tick(self, st.beacon ? st.beacon : beacon_actor{st.host})) return;
        lose_host(self, Error(Errc::host_lost,
                              "the run host (" + st.host_label + ") was not heard from for connection_timeout (" +
                                  std::to_string(st.keepalive->limit().count()) +
                                  " ms): its node is unreachable or it hangs; values not yet acknowledged are lost "
                                  "to the run. On a slow or loaded network raise connection_timeout (CHORUS_CONNECTION_TIMEOUT, "
                                  "or Options::connection_timeout)"));
      },
      [self](finish_tmo_atom) {
        auto& st = self->state;
        if (!from_self(self) || st.done) return;
        st.host_stalled = true;
        complete_finish(self, Error(Errc::timeout, "finish did not complete within finish_timeout (" +
                                                       std::to_string(st.run->settings().opts.finish_timeout.count()) +
                                                       " ms): the run host did not confirm; data it acknowledged is "
                                                       "safe in its WAL"));
      },
  };
}

} // namespace

std::string bad_ack(const AckWindow& w, std::uint32_t frames, std::uint64_t completed, const AckErrors& errors) {
  if (frames > w.in_flight)
    return "for " + std::to_string(frames) + " frames while " + std::to_string(w.in_flight) + " were in flight";
  if (completed > w.sent)
    return "completing call " + std::to_string(completed) + ", beyond the last one the rank sent (" +
           std::to_string(w.sent) + ")";
  if (completed < w.acked)
    return "completing call " + std::to_string(completed) + " after one that completed call " + std::to_string(w.acked);
  for (const AckError& e : errors)
    if (e.seq == 0 || e.seq > completed)
      return "with an error for call " + std::to_string(e.seq) + ", outside the calls it completes (up to " +
             std::to_string(completed) + ")";
  return {};
}

rank_proxy_actor spawn_rank_proxy(caf::actor_system& sys, client::RunImpl& run, run_actor host, std::string host_label,
                                  std::string secret, std::chrono::steady_clock::time_point join_deadline,
                                  std::function<void(JoinResult)> on_join) {
  return spawn_guarded(sys, rank_proxy_behavior, &run, std::move(host), std::move(host_label), std::move(secret), join_deadline,
                       std::move(on_join));
}

} // namespace chorus::actors
