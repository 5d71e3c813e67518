#include "actors/run.hpp"
#include "actors/keepalive.hpp"
#include "actors/host_sink.hpp"
#include "actors/job_secret.hpp"
#include "actors/run_events.hpp"
#include "io/platform/posix.hpp"

#include "actors/group.hpp"
#include "actors/uploader.hpp"
#include "io/store/barrier_log.hpp"
#include "io/store/lease.hpp"
#include "io/store/run_writer.hpp"
#include "io/store/wal.hpp"
#include "io/store/wal_replay.hpp"
#include "runtime/client/channel.hpp"
#include "runtime/core/merger.hpp"
#include "runtime/core/upload_url.hpp"
#include "runtime/core/wire.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>
#include <map>
#include <optional>
#include <set>
#include <unordered_set>

namespace chorus::actors {

using platform::unix_now_us;

namespace {

struct RunActorState {
  std::shared_ptr<RunHost> host;
  std::unique_ptr<HostSink> sink;
  std::unique_ptr<core::Merger> merger;
  std::unique_ptr<RunEvents> events;        // what the run tells (stalled ranks, NaN, ends...)
  std::vector<proxy_actor> proxies;         // by rank
  std::vector<std::string> joined_from;     // by rank: "process PID on HOST", once it joined
  std::map<caf::actor_addr, std::uint32_t> rank_of;
  std::set<caf::actor_addr> unconfirmed; // the ranks the run's end waits for (confirm_told)
  std::int64_t armed_barrier = -1;
  bool finishing = false;
  bool finish_armed = false; // the finish deadline runs before the host's finish is processed
  bool ended = false;
  std::int64_t lease_renewed_us = 0; // when the lease was last renewed (io/store/lease.hpp)
  bool lease_error = false;          // a renewal failed, and said so once
  syncer_actor syncer;        // fdatasyncs the WAL on a thread of its own
  bool sync_in_flight = false; // the syncer is at it: what comes meanwhile waits for the next round
  bool unsynced = false;       // appended since the last sync was asked for
  bool sync_put_off = false;   // a sync_atom to itself is queued (request_sync)
  std::vector<HostSink::Progress> syncing; // the acks the sync in flight will release
  // How far the synced WAL backs the line files: the live upload reads no
  // further (io/upload/upload.hpp). The files' ends when the sync in flight
  // was asked for; and whether the Uploader waits for that sync to be poked.
  std::shared_ptr<upload::DurableBounds> durable = std::make_shared<upload::DurableBounds>();
  store::RunWriter::LineEnds syncing_ends;
  bool poke_after_sync = false;
  Error wal_error;           // the WAL could not be written: nothing more is acknowledged
  caf::response_promise finish_promise;
  GroupLink group;                       // where the job has several runs
  std::uint64_t reported_generation = 0; // the rank states the group last heard
  uploader_actor uploader; // when the run uploads (Options::upload)
  beacon_actor beacon;     // answers the ranks' keepalive pings (actors/keepalive.hpp)
  std::vector<char> nccl_id;                         // from rank 0, once it has made one
  std::vector<caf::response_promise> nccl_id_waiters; // ranks that asked before
  static inline const char* name = "chorus.run";

  ~RunActorState() {
    if (sink) sink->writer.flush();
  }
};

using run_ptr = run_self::stateful_pointer<RunActorState>;

void end_run(run_ptr self);
void confirm_told(run_ptr self);
void confirmed(run_ptr self, const caf::actor_addr& proxy);
void drain_uploads(run_ptr self);

/// The line files up to `ends` hold only what the synced WAL holds: the
/// live upload may send them.
void durable_to(run_ptr self, const store::RunWriter::LineEnds& ends) {
  self->state.durable->raise(ends.history, ends.histograms, ends.media, ends.events);
}

/// With nothing appended and no sync under way, everything the files hold is
/// synced: the live upload may send it all. False where a sync must come first.
bool durable_if_synced(run_ptr self) {
  auto& st = self->state;
  if (st.unsynced || st.sync_in_flight || st.wal_error) return false;
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

void synced(run_ptr self, const Error& failure);

/// The run host's lease (io/store/lease.hpp), renewed every lease_interval
/// while the run is live, so that readers anywhere can tell a live host
/// from a dead one.
void renew_lease(run_ptr self) {
  auto& st = self->state;
  const std::int64_t now = unix_now_us();
  if (now - st.lease_renewed_us < std::chrono::duration_cast<std::chrono::microseconds>(store::lease_interval).count())
    return;
  st.lease_renewed_us = now;
  if (Error e = store::renew_lease(st.host->run_dir, store::lease_now(now)); e && !st.lease_error) {
    st.lease_error = true;
    std::fprintf(stderr, "chorus: the run host could not renew its lease in %s (%s): readers elsewhere may take "
                         "the run for crashed; it goes on\n",
                 st.host->run_dir.c_str(), e.message().c_str());
  }
}

/// Acks go out once the WAL holding what they acknowledge is on disk. The
/// syncer fdatasyncs while the actor merges on; what is appended meanwhile
/// waits for the next round, so one fdatasync serves every frame of a round.
/// The run's end syncs everything itself (end_run), so no round starts once
/// it began; and once every rank has finished, a round waits behind the
/// messages already queued, where the host's finish comes right behind its
/// last frames: the end's one sync then covers them (a round of their own
/// would be a journal commit more before the end's).
/// `at_once`: the round put off, which waits no more.
void request_sync(run_ptr self, bool at_once = false) {
  auto& st = self->state;
  // Nothing appended since the last round was asked for: nothing to sync, and no ack waits.
  if (!st.unsynced || st.sync_in_flight || st.wal_error || !st.syncer || st.ended) return;
  if (!at_once && st.merger->all_done()) {
    if (!std::exchange(st.sync_put_off, true)) self->send(self, sync_atom::value);
    return;
  }
  st.sync_in_flight = true;
  st.unsynced = false;
  // The acks of what is appended so far, released by this sync; and the
  // files as they stand, which hold nothing that is not appended (record).
  st.syncing = st.sink->progress;
  st.syncing_ends = st.sink->writer.written();
  for (auto& p : st.sink->progress) p.acked();
  self->request(st.syncer, caf::infinite, sync_atom::value)
      .then([self](const WireError& failure) { synced(self, failure.error()); },
            [self](caf::error& e) {
              synced(self, Error(Errc::io_error, "the WAL's syncer stopped: " + self->system().render(e)));
            });
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
  // A WAL that cannot be written ends the run (fail_wal), which applies
  // more frames: this one goes first, as it came. What it brings is then in
  // the files only, and the ranks are told that nothing since their last
  // ack is kept.
  st.merger->apply(admitted);
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
void send_acks(run_ptr self, std::vector<HostSink::Progress>& acks) {
  auto& st = self->state;
  if (st.wal_error) return;
  for (std::size_t r = 0; r < acks.size(); ++r) {
    auto& p = acks[r];
    if ((!p.changed && p.frames == 0) || r >= st.proxies.size() || !st.proxies[r]) continue;
    self->send(st.proxies[r], ack_atom::value, p.frames, p.completed, p.errors);
    p.acked();
  }
}

/// The syncer's answer: what it synced is acknowledged, and the next round starts.
void synced(run_ptr self, const Error& failure) {
  auto& st = self->state;
  st.sync_in_flight = false;
  if (failure) return fail_wal(self, failure);
  send_acks(self, st.syncing);
  durable_to(self, st.syncing_ends);
  durable_if_synced(self); // nothing appended since this round was asked for
  if (std::exchange(st.poke_after_sync, false) && st.uploader) self->send(st.uploader, upload_atom::value);
  if (st.unsynced) request_sync(self);
}

/// Makes everything appended durable now (the run's end), or fails the WAL.
void sync_now(run_ptr self) {
  auto& st = self->state;
  if (st.wal_error) return;
  if (Error e = st.host->wal->sync()) return fail_wal(self, e);
  st.unsynced = false;
}

/// Acknowledges what sync_now made durable.
void ack_synced(run_ptr self) {
  auto& st = self->state;
  if (st.wal_error) return;
  send_acks(self, st.syncing);
  send_acks(self, st.sink->progress);
  durable_to(self, st.sink->writer.written());
}

void end_run(run_ptr self) {
  auto& st = self->state;
  if (st.ended) return;
  st.ended = true;
  const int world = st.merger->world_size();
  // How the ranks ended names the run (Merger::end_state): failed, crashed, killed or finished.
  const RunState state = st.wal_error ? RunState::failed : st.merger->end_state();
  st.sink->hold_run_end = true;
  record(self, core::wire::run_end(state, unix_now_us()));
  tell_events(self); // run_finished, the last, and what the end brought (ranks lost at finish_timeout)
  // One sync of the WAL makes the end durable, with every frame before it.
  // Only then are the end's files written: those the WAL holds without a
  // sync of their own (a crash of the machine that cuts one short is told
  // by run.json's lengths, and `chorus recover` rebuilds it), run.json last.
  // A WAL that failed leaves the files to make the end durable themselves.
  sync_now(self);
  st.sink->writer.end_backed_by_wal(!st.wal_error);
  st.sink->release_run_end();
  st.sink->writer.flush();
  ack_synced(self);
  // The end is synced with all before it (or the WAL failed, and the bounds are lifted): the upload may send it.
  st.durable->ended = true;
  // run.json says how the run ended: readers need no lease any more.
  store::end_lease(st.host->run_dir);
  if (client::FinishState* fs = st.host->finish) {
    std::lock_guard lock(fs->mu);
    FinishResult& r = fs->result;
    r.state = st.wal_error ? RunState::failed : state;
    // What could not be written is the run's error: the WAL's, else the first of its files'.
    if (!r.error && st.wal_error) r.error = st.wal_error;
    if (!r.error && st.sink->writer.error().code() == Errc::io_error) r.error = st.sink->writer.error();
    r.rows = st.merger->rows_committed();
    r.rejected = st.merger->values_rejected();
    r.ranks.clear();
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
void confirm_told(run_ptr self) {
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
void drain_uploads(run_ptr self) {
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

/// After every applied frame: acks (once synced), barrier timers, the end of the run.
void after_frame(run_ptr self) {
  auto& st = self->state;
  request_sync(self);
  const std::int64_t open = st.merger->open_barrier();
  if (open >= 0 && open != st.armed_barrier) {
    st.armed_barrier = open;
    self->delayed_send(self, std::chrono::milliseconds(st.merger->open_barrier_timeout_ms()), barrier_tmo_atom::value,
                       open);
  }
  if (st.finishing && st.merger->all_done()) end_run(self);
  // The host's own rank finished while it waited at a barrier (interrupted
  // there, say): its finish waits behind the barrier and reaches the run only
  // once that releases, so the run's finish deadline starts now.
  if (!st.finishing && !st.finish_armed && !st.ended && st.merger->finish_waiting(0)) {
    st.finish_armed = true;
    self->delayed_send(self, st.host->settings.opts.finish_timeout, finish_tmo_atom::value);
  }
  if (!st.ended) tell_events(self);
  if (!st.ended && st.host->settings.group_size > 0 && st.sink->generation != st.reported_generation) {
    st.reported_generation = st.sink->generation;
    st.group.report(self, member_report(*st.host, *st.merger));
  }
}

/// Answers each sync_atom once `host`'s WAL is fdatasync'ed: no error, or why it failed.
/// (Its argument is passed, not captured: CAF 0.17 dereferences a null argument
/// tuple for a function spawned without arguments.)
syncer_actor::behavior_type wal_syncer(syncer_actor::pointer self, std::shared_ptr<RunHost> host, caf::actor_addr run) {
  stop_with(self, run);
  return {[host](sync_atom) { return WireError(host->wal->sync()); }};
}

/// A resumed run: its WAL replayed through the merge, which rewrites the
/// readable files from it (bringing up to date what a crashed host left
/// behind, as `chorus recover` does); an attempt the log leaves open is
/// closed, in the log too, as its run.json had it (killed, where launch
/// stopped it) or else crashed. Returns why the new attempt is refused, or no error.
Error replay_previous(run_ptr self) {
  auto& st = self->state;
  const RunHost& h = *st.host;
  const std::optional<RunState> noted = st.sink->writer.carry_over(h.run_dir + "/run.json");
  st.sink->timing = false;
  const Result<store::WalReplay> replayed = store::replay_wal(h.wal->path(), *st.merger, {});
  st.sink->timing = true;
  if (!replayed)
    return {Errc::io_error, "cannot resume run " + h.run_id + ": its write-ahead log cannot be read (" +
                                replayed.error().message() +
                                "). Fix the disk, or start a new run (another CHORUS_RUN_ID, or leave it unset)"};
  const store::WalReplay& replay = *replayed;
  if (!st.merger->started()) return {}; // its host died before the run began: it starts now
  if (st.merger->world_size() != h.settings.run_world)
    return {Errc::invalid_argument,
            "cannot resume run " + h.run_id + " in " + h.run_dir + ": it has " +
                std::to_string(st.merger->world_size()) + " ranks and this job " +
                std::to_string(h.settings.run_world) + " (a shared run keeps its world size). Start the job with " +
                std::to_string(st.merger->world_size()) +
                " ranks, or start a new run (another CHORUS_RUN_ID, or leave it unset)"};
  if (!replay.ended) {
    const RunState state = noted && *noted != RunState::running ? *noted : RunState::crashed;
    for (const auto& frame : store::closing_frames(*st.merger, replay.last_ts, state,
                                                "the run host died before this rank finished (found when the run "
                                                "resumed)"))
      record(self, frame);
  }
  // What the replay completed belongs to the earlier attempt, whose ranks
  // are gone: the sync in flight acknowledges none of it to this attempt's
  // ranks, which number their calls afresh (and would refuse such an ack).
  st.syncing.clear();
  return {};
}

run_self::behavior_type run_actor_fn(run_ptr self, std::shared_ptr<RunHost> host) {
  auto& st = self->state;
  st.host = host;
  st.sink = std::make_unique<HostSink>(host->run_dir);
  st.merger = std::make_unique<core::Merger>(*st.sink);
  st.sink->merger = st.merger.get();
  core::WatchSettings watch;
  watch.stall_after_us = std::chrono::duration_cast<std::chrono::microseconds>(host->settings.opts.stall_after).count();
  st.events = std::make_unique<RunEvents>(watch);
  st.sink->events = st.events.get();
  st.proxies.resize(host->settings.run_world);
  st.joined_from.resize(host->settings.run_world);
  // fdatasync blocks: it runs on a thread of its own, beside the merge.
  // The Run actor's helpers stop when it does (stop_with).
  st.syncer = spawn_blocking(self->system(), host->blocking, wal_syncer, host, self->address());
  host->helpers->add(caf::actor_cast<caf::actor>(st.syncer));
  const Error refusal = host->resumed ? replay_previous(self) : Error();
  if (refusal) {
    // Nothing of this attempt is logged: the host stops this actor. It
    // answers resume_atom only, which no typed behaviour can say (protocol.hpp).
    return {run_self::behavior_type::unsafe_init{}, caf::behavior{[refusal](resume_atom) { return WireError(refusal); }}};
  }
  // The lease first: a reader that finds run.json running (a resumed run's
  // again) finds this host's lease beside it.
  renew_lease(self);
  record(self, core::wire::run_start(host->start_us, static_cast<std::uint32_t>(host->settings.run_world), host->run_json));
  self->delayed_send(self, host->settings.opts.init_timeout, join_tmo_atom::value);
  self->delayed_send(self, std::chrono::seconds(1), flush_atom::value);
  if (host->settings.run_world > 1) {
    st.beacon = spawn_beacon(self->system(), self->address());
    host->helpers->add(caf::actor_cast<caf::actor>(st.beacon));
  }
  if (!host->settings.opts.upload.empty()) {
    caf::actor sender;
    st.uploader = spawn_uploader(self->system(), host->run_dir, host->settings.opts.upload,
                                 upload::UploadSettings{.read_bytes = host->settings.opts.upload_buffer, .durable = st.durable},
                                 host->blocking, self->address(), &sender);
    host->helpers->add(caf::actor_cast<caf::actor>(st.uploader));
    host->helpers->add(std::move(sender));
  }

  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.group.down(dm)) return;
    if (st.ended) return confirmed(self, dm.source);
    auto it = st.rank_of.find(dm.source);
    if (it == st.rank_of.end()) return;
    const std::uint32_t rank = it->second;
    st.proxies[rank] = nullptr;
    if (st.merger->rank_state(static_cast<int>(rank)) == RunState::running)
      record(self, core::wire::rank_dead(rank, unix_now_us(), "its process exited or its connection was lost (" +
                                                       caf::to_string(dm.reason) + ") at step " +
                                                       std::to_string(st.merger->rank_last_step(static_cast<int>(rank)))));
    after_frame(self);
  });

  return {
      [self](join_atom, std::uint32_t rank, const std::string& hostname, std::int64_t pid, const std::string& job,
             const std::string& secret) {
        auto& st = self->state;
        // A join without a sender (CAF lost it, see protocol.hpp) is
        // repeated by its proxy: only one that names its sender is taken.
        auto proxy = caf::actor_cast<proxy_actor>(self->current_sender());
        if (!proxy) return;
        auto refuse = [&](std::string why) {
          self->send(proxy, joined_atom::value, WireError(Error(Errc::connect_failed, std::move(why))), std::string(),
                     std::string(), caf::actor());
        };
        auto accept = [&] {
          self->send(proxy, joined_atom::value, WireError(), st.host->run_id, st.host->run_dir,
                     caf::actor_cast<caf::actor>(st.beacon));
        };
        const std::string& ours = st.host->job;
        const core::Settings& settings = st.host->settings;
        const std::string port = core::port_name(settings, settings.port);
        if (job != ours) {
          // Ranks of one job that disagree (a project set on one rank only)
          // are told so; a rank of another job met this one on its port.
          if (std::string differ = core::job_disagreement(job, ours); !differ.empty())
            return refuse("rank " + std::to_string(rank) + " and the run host belong to one job but disagree: " +
                          differ + ". Every rank of a job logs into the same run: give every rank the same settings");
          return refuse("rank " + std::to_string(rank) + " belongs to another job (" + core::job_text(job) + ") than this run (" +
                        core::job_text(ours) + "): two jobs on one node met on the same port (" + port +
                        "); give each job its own CHORUS_PORT (or MASTER_PORT), or check that every rank sees the "
                        "same CHORUS_* settings");
        }
        // Before anything is looked up for the rank: a process outside the
        // job learns nothing, and takes no rank's place.
        if (!same_secret(secret, st.host->secret))
          return refuse("process " + std::to_string(pid) + " on " + hostname + " claims rank " + std::to_string(rank) +
                        " without this job's secret: only the job's own processes may join its run. A rank of the "
                        "job sees another secret where CHORUS_JOB_SECRET differs between ranks, or where its "
                        "socket directory (CHORUS_SOCKET_DIR) is not the host's: give every rank the same");
        const auto world = static_cast<std::uint32_t>(st.merger->world_size());
        if (rank >= world)
          return refuse("rank " + std::to_string(rank) + " is outside this run of " + std::to_string(world) +
                        " ranks: every rank must see the same WORLD_SIZE");
        if (st.merger->rank_joined(static_cast<int>(rank))) {
          // The same proxy again: its answer was lost on the way; answer again.
          if (st.proxies[rank] == proxy) return accept();
          // Two jobs whose identities read alike (no launcher job id) can
          // meet on one port too: the message names both processes.
          return refuse("rank " + std::to_string(rank) + " already joined this run from " + st.joined_from[rank] +
                        ", and process " + std::to_string(pid) + " on " + hostname + " claims it too: two processes "
                        "of one job claim the same RANK, or two jobs alike (" + ours + ") met on one port (" + port +
                        "): give each job its own CHORUS_PORT; a restarted rank needs a new run id");
        }
        if (st.ended) return refuse("the run has ended: start a new run (another run id) to log more");
        if (st.wal_error) return refuse(st.wal_error.message());
        if (st.merger->rank_state(static_cast<int>(rank)) != RunState::running)
          return refuse("rank " + std::to_string(rank) + " came later than init_timeout (" +
                        std::to_string(st.host->settings.opts.init_timeout.count()) +
                        " ms) after the run host started, and the run went on without it: start every rank "
                        "within init_timeout of the host, or raise init_timeout (CHORUS_INIT_TIMEOUT)");
        st.proxies[rank] = proxy;
        st.joined_from[rank] = "process " + std::to_string(pid) + " on " + hostname;
        st.rank_of[proxy.address()] = rank;
        self->monitor(proxy);
        // The watch learns where the rank runs before the merge says it runs.
        st.events->watch.rank_joined(static_cast<int>(rank), hostname, pid, unix_now_us());
        record(self, core::wire::rank_joined(rank, unix_now_us(), pid, hostname));
        after_frame(self);
        accept();
      },
      [self](batch_atom, const std::vector<char>& frame) {
        auto& st = self->state;
        // Only a joined rank's own proxy sends frames, and only for its rank.
        auto it = st.rank_of.find(caf::actor_cast<caf::actor_addr>(self->current_sender()));
        if (it == st.rank_of.end()) return;
        const std::uint32_t rank = it->second;
        std::uint32_t claimed = 0;
        if (frame.size() >= 5) std::memcpy(&claimed, frame.data() + 1, 4);
        if (claimed != rank || !st.proxies[rank]) return;
        if (st.wal_error) return; // the rank was told (fail_atom)
        if (st.ended) {
          // Nothing waits for ever: the proxy learns that its values came too late.
          return self->send(st.proxies[rank], fail_atom::value,
                            WireError(Error(Errc::host_lost,
                                            "the run ended before these values reached it (this rank is recorded as " +
                                                std::string(to_string(st.merger->rank_state(static_cast<int>(rank)))) +
                                                "); they are not in the run")));
        }
        // Counted before it is recorded: the sync round its append starts acknowledges it.
        ++st.sink->progress[rank].frames;
        if (!record(self, frame)) {
          // Its own proxy sent what the merge cannot read: it is told, rather than left waiting for an ack.
          return self->send(st.proxies[rank], fail_atom::value,
                            WireError(Error(Errc::internal,
                                            "the run host refused a malformed frame from this rank (are every rank "
                                            "and the host built against the same chorus?); its values are not in "
                                            "the run")));
        }
        st.events->watch.progress(static_cast<int>(rank), st.merger->rank_last_step(static_cast<int>(rank)),
                                  st.sink->now_us);
        after_frame(self);
      },
      [self](barrier_tmo_atom, std::int64_t index) {
        auto& st = self->state;
        if (!from_self(self) || st.ended || st.merger->open_barrier() != index) return;
        record(self, core::wire::barrier_timeout(static_cast<std::uint32_t>(index), unix_now_us()));
        after_frame(self);
      },
      [self](join_tmo_atom) {
        auto& st = self->state;
        if (!from_self(self) || st.ended) return;
        for (int r = 0; r < st.merger->world_size(); ++r)
          if (!st.merger->rank_joined(r) && st.merger->rank_state(r) == RunState::running)
            record(self, core::wire::rank_dead(static_cast<std::uint32_t>(r), unix_now_us(),
                                         "never connected to the run host within init_timeout (" +
                                             std::to_string(st.host->settings.opts.init_timeout.count()) + " ms)"));
        after_frame(self);
      },
      [self](flush_atom) {
        auto& st = self->state;
        if (!from_self(self) || st.ended) return;
        st.sink->writer.flush();
        renew_lease(self);
        st.events->watch.tick(unix_now_us());
        tell_events(self);
        // What the flush wrote is the upload's once the WAL that holds it is synced: now, or after the round under way.
        if (!durable_if_synced(self)) st.poke_after_sync = true;
        if (st.uploader) self->send(st.uploader, upload_atom::value);
        self->delayed_send(self, std::chrono::seconds(1), flush_atom::value);
      },
      [self](system_atom, std::uint32_t rank, const std::string& line) {
        auto& st = self->state;
        // One JSON object a line, from the process of a joined rank (its SystemMonitor).
        if (st.ended || rank >= st.proxies.size() || !st.proxies[rank] || !self->current_sender() ||
            self->current_sender()->node() != st.proxies[rank].node() || line.size() < 2 || line.size() > 65536 ||
            line.front() != '{' || line.find('\n') != std::string::npos)
          return;
        st.sink->writer.system_line(line);
      },
      [self](group_atom, group_actor group) -> caf::delegated<caf::ok_atom> {
        // Registers with the group before the run takes values: a run that dies early is still known there.
        auto& st = self->state;
        if (!from_this_process(self)) return drop_request<caf::ok_atom>(self);
        st.reported_generation = st.sink->generation;
        st.group.secret(st.host->group_secret);
        st.group.report(self, member_report(*st.host, *st.merger));
        const Options& opts = st.host->settings.opts;
        st.group.connect(self, std::move(group), self->make_response_promise(), opts.heartbeat_interval,
                         opts.connection_timeout);
        return {};
      },
      [self](group_atom) -> caf::delegated<caf::ok_atom> {
        if (!from_this_process(self)) return drop_request<caf::ok_atom>(self);
        self->state.group.when_settled(self->make_response_promise());
        return {};
      },
      [self](member_ok_atom, std::int64_t seq) {
        if (self->state.group.is(self->current_sender())) self->state.group.acked(seq);
      },
      [self](member_retry_atom) {
        if (from_self(self)) self->state.group.retry(self);
      },
      [self](keepalive_atom) {
        if (from_self(self)) self->state.group.keepalive(self);
      },
      [](ping_atom) { return caf::ok_atom::value; },
      [](resume_atom) { return WireError(); },
      [self](exited_atom, std::uint32_t rank, std::int32_t status) -> caf::delegated<caf::ok_atom> {
        auto& st = self->state;
        // Only the rank's own proxy says how its process exits.
        if (rank >= st.proxies.size() || !st.proxies[rank] || !from(self, st.proxies[rank]) || status == 0)
          return drop_request<caf::ok_atom>(self);
        auto rp = self->make_response_promise();
        if (!st.wal_error) {
          record(self, core::wire::rank_exit(rank, unix_now_us(), status));
          tell_events(self); // the rank's failure, and the run's end it changes (even after the end)
          st.sink->writer.flush();
          // On disk before the answer: the process that asked is exiting.
          if (Error e = st.host->wal->sync()) fail_wal(self, e);
        }
        rp.deliver(caf::ok_atom::value);
        return {};
      },
      [self](nccl_id_atom, const std::vector<char>& id) {
        // The id comes from the host's own process (run rank 0).
        auto& st = self->state;
        if (!from_this_process(self) || id.empty() || id.size() > 4096) return;
        st.nccl_id = id;
        for (auto& rp : st.nccl_id_waiters) rp.deliver(id);
        st.nccl_id_waiters.clear();
      },
      [self](nccl_id_atom) -> caf::delegated<std::vector<char>> {
        auto& st = self->state;
        // Only the processes of the run's ranks are told the id.
        const auto& sender = self->current_sender();
        const bool member = sender && std::any_of(st.proxies.begin(), st.proxies.end(), [&](const proxy_actor& p) {
                              return p && p.node() == sender->node();
                            });
        if (!member) return drop_request<std::vector<char>>(self);
        auto rp = self->make_response_promise();
        if (!st.nccl_id.empty())
          rp.deliver(st.nccl_id);
        else
          st.nccl_id_waiters.push_back(std::move(rp));
        return {};
      },
      [self](finish_atom) -> caf::delegated<caf::ok_atom> {
        auto& st = self->state;
        // Only the host's own RankProxy finishes the run.
        if (!from_this_process(self)) return drop_request<caf::ok_atom>(self);
        auto rp = self->make_response_promise();
        if (st.ended) {
          rp.deliver(caf::ok_atom::value);
          return {};
        }
        st.finishing = true;
        st.finish_promise = rp;
        self->delayed_send(self, st.host->settings.opts.finish_timeout, finish_tmo_atom::value);
        after_frame(self);
        return {};
      },
      [self](finish_tmo_atom) {
        auto& st = self->state;
        if (!from_self(self) || st.ended) return;
        record(self, core::wire::finish_timeout(unix_now_us()));
        end_run(self);
      },
      [self](sync_atom) {
        // The round put off (request_sync): what the end has not synced meanwhile.
        if (!from_self(self)) return;
        self->state.sync_put_off = false;
        request_sync(self, true);
      },
  };
}

} // namespace

run_host_actor spawn_run_actor(caf::actor_system& sys, std::shared_ptr<RunHost> host) {
  return spawn_guarded(sys, run_actor_fn, std::move(host));
}

} // namespace chorus::actors
