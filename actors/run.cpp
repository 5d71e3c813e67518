#include "actors/run.hpp"
#include "actors/job_secret.hpp"
#include "actors/run_state.hpp"
#include "io/platform/posix.hpp"

#include "io/store/barrier_log.hpp"
#include "io/store/lease.hpp"
#include "io/store/wal.hpp"
#include "io/store/wal_replay.hpp"
#include "runtime/client/channel.hpp"
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

using namespace run_host;

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
    // Every rank's end in the log makes the run's (store::derived_end); else its host died.
    const RunState state = store::derived_end(*st.merger).value_or(
        noted && *noted != RunState::running ? *noted : RunState::crashed);
    for (const auto& frame : store::closing_frames(*st.merger, replay.last_ts, state,
                                                "the run host died before this rank finished (found when the run "
                                                "resumed)"))
      record(self, frame);
  }
  // What the replay completed belongs to the earlier attempt, whose ranks
  // are gone: the sync in flight acknowledges none of it to this attempt's
  // ranks, which number their calls afresh (and would refuse such an ack).
  for (SyncRounds::Round& r : st.rounds.under_way()) r.acks.clear();
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
  // fdatasync blocks: it runs on a thread of its own, beside the merge. The
  // process's kept system lends its syncers (taken as the rounds come,
  // open_round); else the actor makes its own, helpers that stop when it does.
  st.lent_syncers = host->syncers;
  if (!st.lent_syncers) {
    for (syncer_actor& syncer : st.syncers) {
      syncer = spawn_wal_syncer(self->system(), host->blocking, self->address());
      host->helpers->add(caf::actor_cast<caf::actor>(syncer));
    }
  }
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
    if (st.ended) {
      // A rank gone while the end waits for its sync: the end's last acks
      // and pings (confirm_told) pass it by, rather than wait on it.
      if (auto gone = st.rank_of.find(dm.source); gone != st.rank_of.end()) st.proxies[gone->second] = nullptr;
      return confirmed(self, dm.source);
    }
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
        if (!durable_if_synced(self)) {
          st.poke_after_sync = true;
          request_sync(self, true);
        }
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
      [self](answered_atom) {
        // The end's room goes once the trainer has its answer, not when the
        // actor stops: a run still held when its process exits keeps its
        // actors to the end, and its directory would keep the reserve.
        auto& st = self->state;
        if (from_this_process(self) && st.ended && !st.end_waits) st.sink->writer.release_room();
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
