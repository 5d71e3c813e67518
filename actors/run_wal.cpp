// The Run actor's log (actors/run_state.hpp): each frame into the WAL
// before the merge applies it, the WAL's sync rounds on the syncers'
// threads and the acks they release, and the run's end, durable once the
// WAL holds every rank's end synced.
#include "actors/run_state.hpp"

#include "io/platform/posix.hpp"
#include "io/store/lease.hpp"
#include "io/store/wal.hpp"
#include "runtime/client/channel.hpp"
#include "runtime/core/upload_url.hpp"
#include "runtime/core/wire.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <optional>
#include <utility>

namespace chorus::actors::run_host {

using platform::unix_now_us;

static void confirm_told(run_ptr self);
static void drain_uploads(run_ptr self);

/// The line files up to `ends` hold only what the synced WAL holds: the
/// live upload may send them.
static void durable_to(run_ptr self, const store::RunWriter::LineEnds& ends) {
  self->state.durable->raise(ends.history, ends.histograms, ends.media, ends.events);
}

/// With nothing appended and no sync under way, everything the files hold is
/// synced: the live upload may send it all. False where a sync must come first.
bool durable_if_synced(run_ptr self) {
  auto& st = self->state;
  if (st.unsynced || st.rounds.in_flight() || st.wal_error) return false;
  durable_to(self, st.sink->writer.written());
  return true;
}

/// The WAL failed (`e`): the run keeps nothing more. Every rank learns at
/// once that what it sent since the last ack, and all it sends later, is
/// lost; run.json and the run's FinishResult carry the reason.
void fail_wal(run_ptr self, const Error& e) {
  auto& st = self->state;
  if (st.wal_error) return;
  st.wal_error = Error(Errc::io_error, "the run's write-ahead log could not be written (" + e.message() +
                                           "): values sent since the last acknowledgement, and every later one, are "
                                           "not kept; everything acknowledged before is on disk (chorus recover " +
                                           st.host->run_dir + " rebuilds the run's files once the disk is fixed)");
  std::fprintf(stderr, "chorus: %s\n", st.wal_error.message().c_str());
  st.sink->writer.note_error(st.wal_error);
  // Nothing more will be synced: the files hold what the run has, and the upload may take it all.
  st.durable->lift();
  for (const auto& proxy : st.proxies)
    if (proxy) self->send(proxy, fail_atom::value, WireError(st.wal_error));
  // The run is over: its state (failed) and the reason go to run.json where the disk still takes them.
  end_run(self);
}

static void synced(run_ptr self, std::uint64_t round, int syncer, const Error& failure);

/// Asks a free syncer for a round over all that is appended; nullptr where
/// both are at it. Its acks and ends are taken by take_round(), before
/// anything else is appended.
static SyncRounds::Round* open_round(run_ptr self) {
  auto& st = self->state;
  const std::optional<int> k = st.rounds.free_syncer();
  if (!k) return nullptr;
  // A lent syncer is taken as its first round comes (the system's own
  // threads may still be starting it: StartingSystem), and given back at the end.
  syncer_actor& s = st.syncers[static_cast<std::size_t>(*k)];
  if (!s && st.lent_syncers) s = st.lent_syncers->take();
  if (!s) return nullptr;
  SyncRounds::Round& r = st.rounds.open(*k, st.host->wal->size());
  st.unsynced = false;
  const std::uint64_t id = r.id;
  const int syncer = *k;
  self->request(st.syncers[static_cast<std::size_t>(syncer)], caf::infinite, sync_atom::value, WalToSync{st.host->wal})
      .then([self, id, syncer](const WireError& failure) { synced(self, id, syncer, failure.error()); },
            [self, id, syncer](caf::error& e) {
              synced(self, id, syncer, Error(Errc::io_error, "the WAL's syncer stopped: " + self->system().render(e)));
            });
  return &r;
}

/// What `r` releases once done: the acks of all that is applied so far,
/// and the files as they stand, which hold nothing that is not appended (record).
static void take_round(run_ptr self, SyncRounds::Round& r) {
  auto& st = self->state;
  r.acks = st.sink->progress;
  r.ends = st.sink->writer.written();
  for (auto& p : st.sink->progress) p.acked();
}

/// Acks go out once the WAL holding what they acknowledge is on disk. The
/// syncer fdatasyncs while the actor merges on; what is appended meanwhile
/// waits for the next round, so one fdatasync serves every frame of a round.
/// The run's end asks for what it needs itself (end_run), so no round starts
/// here once it began; and once every rank has finished, a round waits
/// behind the messages already queued, where the host's finish comes right
/// behind its last frames: the end then waits for the round that the frame
/// ending the last rank started as it came (record), which covers them.
/// Nor does a round start for the host's own frames alone (the run's start,
/// a rank's join, the events): no rank waits for them, and the next round,
/// or the flush's every second, covers them.
/// `at_once`: the round put off, or the flush's, which waits no more.
void request_sync(run_ptr self, bool at_once) {
  auto& st = self->state;
  // Nothing appended since the last round was asked for: nothing to sync, and no ack waits.
  if (!st.unsynced || st.rounds.in_flight() || st.wal_error || st.ended) return;
  const auto waits = [](const HostSink::Progress& p) { return p.changed || p.frames != 0; };
  if (!at_once && std::none_of(st.sink->progress.begin(), st.sink->progress.end(), waits)) return;
  if (!at_once && st.merger->all_done()) {
    if (!std::exchange(st.sync_put_off, true)) self->send(self, sync_atom::value);
    return;
  }
  if (SyncRounds::Round* r = open_round(self)) take_round(self, *r);
}

/// Appends a frame to the WAL, then applies it; false if it was refused (a
/// malformed frame changes nothing and never reaches the WAL). Logged
/// first, so that whatever a frame brings to the run's files, and so to an
/// upload, is in the log should the host die a moment later: a replay
/// (chorus recover) then rebuilds what readers and servers saw. Its ack
/// waits for the sync.
bool record(run_ptr self, const std::vector<char>& frame) {
  auto& st = self->state;
  st.sink->now_us = unix_now_us();
  core::wire::Frame admitted;
  if (!st.merger->admit(frame, admitted)) {
    std::fprintf(stderr, "chorus: run host refused a malformed frame\n");
    return false;
  }
  Error failed;
  if (!st.wal_error) {
    failed = st.host->wal->append(frame);
    if (!failed) st.unsynced = true;
  }
  // A frame that ends a rank is synced at once, beside its merge, even
  // while a round is under way: the run's end waits for that sync alone
  // (end_run), and its merge need not come first.
  SyncRounds::Round* early = nullptr;
  if (!failed && !st.wal_error && !st.ended && st.merger->admitted_ends_rank()) early = open_round(self);
  // A WAL that cannot be written ends the run (fail_wal), which applies
  // more frames: this one goes first, as it came. What it brings is then in
  // the files only, and the ranks are told that nothing since their last
  // ack is kept.
  st.merger->apply(admitted);
  if (early) take_round(self, *early);
  if (failed) fail_wal(self, failed);
  else if (!st.wal_error) request_sync(self);
  return true;
}

/// The events the watch drafted go into the WAL (and so events.jsonl), and
/// to every rank's proxy, for its Run::on_event and next_event.
void tell_events(run_ptr self) {
  auto& st = self->state;
  if (!st.events || !st.events->watch.has_drafts()) return;
  for (const std::vector<char>& frame : st.events->frames(st.sink->events_told)) {
    if (!record(self, frame)) continue;
    for (const auto& proxy : st.proxies)
      if (proxy) self->send(proxy, event_atom::value, frame);
  }
}

/// Sends the acks of `acks` (per rank) and clears them.
static void send_acks(run_ptr self, std::vector<HostSink::Progress>& acks) {
  auto& st = self->state;
  if (st.wal_error) return;
  for (std::size_t r = 0; r < acks.size(); ++r) {
    auto& p = acks[r];
    if ((!p.changed && p.frames == 0) || r >= st.proxies.size() || !st.proxies[r]) continue;
    self->send(st.proxies[r], ack_atom::value, p.frames, p.completed, p.errors);
    p.acked();
  }
}

static void finish_end(run_ptr self);

/// A syncer's answer: what its round and those before it synced is
/// acknowledged, the run's end goes on if it waited for it, and the next round starts.
static void synced(run_ptr self, std::uint64_t round, int syncer, const Error& failure) {
  auto& st = self->state;
  st.rounds.done(round, syncer, [&](SyncRounds::Round& r) {
    if (failure) return;
    send_acks(self, r.acks);
    durable_to(self, r.ends);
  });
  // Once the run's end is durable no round starts again: each lent syncer
  // goes back once it has answered its last.
  if (st.ended && !st.end_waits) st.return_syncers(false);
  if (failure) {
    fail_wal(self, failure);
    return finish_end(self); // where the end waited for this round
  }
  if (st.end_waits) {
    if (st.rounds.covers(st.end_needs)) {
      if (st.rounds.synced() >= st.end_needs) finish_end(self);
    } else if (SyncRounds::Round* r = open_round(self)) {
      take_round(self, *r);
    }
    return;
  }
  durable_if_synced(self); // nothing appended since this round was asked for
  if (std::exchange(st.poke_after_sync, false) && st.uploader) self->send(st.uploader, upload_atom::value);
  if (st.unsynced) request_sync(self);
}

/// Sends every ack held back: what the run's end waited for is durable.
static void ack_all(run_ptr self) {
  auto& st = self->state;
  if (st.wal_error) return;
  for (SyncRounds::Round& r : st.rounds.under_way()) send_acks(self, r.acks);
  send_acks(self, st.sink->progress);
}

/// The run's end. Its state follows from how the ranks ended (Merger::end_state),
/// which the WAL holds by now: once the WAL is durable up to here, so is
/// the end, and `chorus recover` finds it there should the end's own frame
/// (and the events after it) not reach the disk. So the end waits for the
/// round that the frame ending the last rank started beside its merge
/// (record), or for one of its own, and writes its files meanwhile; then
/// run.json, and the answer (finish_end). A run that uploads waits for
/// the end's own frame and events as well: the upload sends what the WAL holds.
/// A WAL that failed leaves the files to make the end durable themselves.
void end_run(run_ptr self) {
  auto& st = self->state;
  if (st.ended) return;
  st.ended = true;
  // How the ranks ended names the run (Merger::end_state): failed, crashed, killed or finished.
  const RunState state = st.wal_error ? RunState::failed : st.merger->end_state();
  st.sink->hold_run_end = true;
  const std::uint64_t wal_before_end = st.host->wal->size();
  const store::RunWriter::LineEnds files_before_end = st.sink->writer.written();
  record(self, core::wire::run_end(state, unix_now_us()));
  tell_events(self); // run_finished, the last, and what the end brought (ranks lost at finish_timeout)
  // What the end waits for: the WAL up to its own frame, or, for a run that uploads, with it and its events.
  st.end_needs = st.uploader ? st.host->wal->size() : wal_before_end;
  st.end_ends = st.uploader ? st.sink->writer.written() : files_before_end;
  st.end_waits = true;
  if (st.wal_error) return finish_end(self);
  st.sink->writer.end_backed_by_wal(true);
  st.sink->writer.end_files();
  st.sink->stage_run_end(); // renamed into place once the sync returned (finish_end)
  if (st.rounds.synced() >= st.end_needs) return finish_end(self);
  if (!st.rounds.covers(st.end_needs))
    if (SyncRounds::Round* r = open_round(self)) take_round(self, *r);
  // Else the rounds under way cover it, or the next does (synced).
}

/// What the end waited for is durable (or the WAL failed): run.json says
/// how the run ended, the ranks have their last acks, and finish returns.
static void finish_end(run_ptr self) {
  auto& st = self->state;
  if (!std::exchange(st.end_waits, false)) return;
  const RunState state = st.wal_error ? RunState::failed : st.merger->end_state();
  // A WAL that failed leaves the files to make the end durable themselves.
  st.sink->writer.end_backed_by_wal(!st.wal_error);
  st.sink->release_run_end();
  st.sink->writer.flush();
  ack_all(self);
  // What the synced WAL backs may be uploaded; the end, once the WAL holds it
  // synced (or the WAL failed, and the bounds are lifted).
  if (st.wal_error || st.rounds.synced() >= st.host->wal->size()) {
    if (!st.wal_error) durable_to(self, st.sink->writer.written());
    st.durable->ended = true;
  } else {
    durable_to(self, st.end_ends);
  }
  st.return_syncers(false); // no round starts again
  // run.json says how the run ended: readers need no lease any more.
  store::end_lease(st.host->run_dir);
  if (client::FinishState* fs = st.host->finish) {
    std::lock_guard lock(fs->mu);
    FinishResult& r = fs->result;
    r.state = state;
    // What could not be written is the run's error: the WAL's, else the first of its files'.
    if (!r.error && st.wal_error) r.error = st.wal_error;
    if (!r.error && st.sink->writer.error().code() == Errc::io_error) r.error = st.sink->writer.error();
    r.rows = st.merger->rows_committed();
    r.rejected = st.merger->values_rejected();
    r.ranks.clear();
    const int world = st.merger->world_size();
    for (int rank = 0; rank < world; ++rank) {
      RankResult rr;
      rr.rank = rank;
      rr.state = st.merger->rank_state(rank);
      rr.last_step = st.merger->rank_last_step(rank);
      if (static_cast<std::size_t>(rank) < st.sink->hosts.size()) rr.host = st.sink->hosts[rank];
      rr.message = st.merger->rank_message(rank);
      r.ranks.push_back(std::move(rr));
    }
  }
  if (st.host->settings.group_size > 0)
    st.group.report(self, member_report(*st.host, *st.merger, state, st.sink->writer.summary_json()));
  // The run's end is on disk, and every rank told: the Uploader sends what
  // is left (bounded), then finish returns. What it could not send stays
  // for `chorus sync`.
  confirm_told(self);
}

/// Finish returns once every rank in another process has what the run's
/// end sent it (its last acks and events), or is gone, or
/// connection_timeout passed: the host's process would otherwise stop its
/// network layer with those messages still queued, and a rank waiting for
/// its last ack would read a normal end as its host lost. A ping sent after
/// them is answered after them (messages between two actors keep their
/// order); a rank whose process ended first answers with its down message.
static void confirm_told(run_ptr self) {
  auto& st = self->state;
  const auto bound = std::min(st.host->settings.opts.connection_timeout, st.host->settings.opts.finish_timeout);
  for (const auto& proxy : st.proxies) {
    if (!proxy || !is_remote(self, proxy)) continue;
    const caf::actor_addr addr = proxy.address();
    st.unconfirmed.insert(addr);
    self->request(proxy, bound, ping_atom::value)
        .then([self, addr](caf::ok_atom) { confirmed(self, addr); },
              [self, addr](caf::error&) { confirmed(self, addr); });
  }
  if (st.unconfirmed.empty()) drain_uploads(self);
}

/// `proxy` has what the run's end sent it, or is gone.
void confirmed(run_ptr self, const caf::actor_addr& proxy) {
  auto& st = self->state;
  if (st.unconfirmed.erase(proxy) != 0 && st.unconfirmed.empty()) drain_uploads(self);
}

/// The run's last step before finish returns: what the Uploader has left
/// goes out, within upload_timeout.
static void drain_uploads(run_ptr self) {
  auto& st = self->state;
  auto done = [self] {
    auto& st = self->state;
    if (st.uploader) self->send_exit(st.uploader, caf::exit_reason::user_shutdown);
    st.uploader = nullptr;
    if (st.finish_promise.pending()) st.finish_promise.deliver(caf::ok_atom::value);
  };
  if (!st.uploader) return done();
  // What the upload left for `chorus sync` goes in the finish's result.
  auto left = [self](std::uint64_t bytes, Error why) {
    client::FinishState* fs = self->state.host->finish;
    if (!fs) return;
    std::lock_guard lock(fs->mu);
    fs->result.upload_left = bytes;
    fs->result.upload_error = std::move(why);
  };
  const auto ms = st.host->settings.opts.upload_timeout;
  self->request(st.uploader, ms + std::chrono::seconds(5), upload_drain_atom::value, static_cast<std::int64_t>(ms.count()))
      .then(
          [done, left](std::uint64_t bytes, const WireError& failure) {
            if (failure) left(bytes, failure.error());
            done();
          },
          [self, done, left](caf::error& e) {
            const auto& host = *self->state.host;
            const std::string url = core::shown_upload_url(host.settings.opts.upload);
            left(0, Error(Errc::upload_incomplete,
                          "upload to " + url + ": the uploader did not say how far it got (" + caf::to_string(e) +
                              "); what is left stays in the run directory, and `chorus sync " + host.run_dir +
                              " --to " + url + "` sends it"));
            done();
          });
}


} // namespace chorus::actors::run_host
