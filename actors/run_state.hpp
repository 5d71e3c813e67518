// The Run actor's state, and what its two files share (actors/run.cpp: its
// behaviour, the joins, a resumed run's replay; actors/run_wal.cpp: each
// frame into the WAL, the WAL's sync rounds and acks, and the run's end).
// Internal to those two files.
#pragma once

#include "actors/group.hpp"
#include "actors/host_sink.hpp"
#include "actors/keepalive.hpp"
#include "actors/protocol.hpp"
#include "actors/run.hpp"
#include "actors/run_events.hpp"
#include "actors/sync_rounds.hpp"
#include "actors/uploader.hpp"
#include "actors/wal_syncers.hpp"
#include "io/store/run_writer.hpp"
#include "runtime/core/merger.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace chorus::actors::run_host {

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
  std::array<syncer_actor, SyncRounds::syncers> syncers; // fdatasync the WAL, each on a thread of its own
  std::shared_ptr<WalSyncers> lent_syncers; // whose syncers they are, where the actor system lent them
  SyncRounds rounds;         // their rounds under way (actors/sync_rounds.hpp)
  bool unsynced = false;     // appended since the last round was asked for
  bool sync_put_off = false; // a sync_atom to itself is queued (request_sync)
  // How far the synced WAL backs the line files: the live upload reads no
  // further (io/upload/upload.hpp); and whether the Uploader waits for the
  // round under way to be poked.
  std::shared_ptr<upload::DurableBounds> durable = std::make_shared<upload::DurableBounds>();
  bool poke_after_sync = false;
  // The run's end waits for the WAL to be durable up to `end_needs` (end_run),
  // then finish_end writes run.json and answers. `end_ends`: the files' ends
  // before the end's own lines.
  bool end_waits = false;
  std::uint64_t end_needs = 0;
  store::RunWriter::LineEnds end_ends;
  Error wal_error;           // the WAL could not be written: nothing more is acknowledged
  caf::response_promise finish_promise;
  GroupLink group;                       // where the job has several runs
  std::uint64_t reported_generation = 0; // the rank states the group last heard
  uploader_actor uploader; // when the run uploads (Options::upload)
  beacon_actor beacon;     // answers the ranks' keepalive pings (actors/keepalive.hpp)
  std::vector<char> nccl_id;                         // from rank 0, once it has made one
  std::vector<caf::response_promise> nccl_id_waiters; // ranks that asked before
  static inline const char* name = "chorus.run";

  /// Lent syncers serve the system's next run: each idle one goes back at
  /// once; one still at a sync of this run is kept (and answers it), or,
  /// `retire_busy`, stopped once it has, a new one taking its place.
  void return_syncers(bool retire_busy) {
    if (!lent_syncers) return;
    for (std::size_t k = 0; k < syncers.size(); ++k) {
      if (!syncers[k]) continue;
      if (!rounds.busy(static_cast<int>(k)))
        lent_syncers->give_back(std::exchange(syncers[k], nullptr));
      else if (retire_busy)
        lent_syncers->retire(std::exchange(syncers[k], nullptr));
    }
  }

  ~RunActorState() {
    if (sink) sink->writer.flush();
    return_syncers(true); // a run stopped before its end was durable
  }
};

using run_ptr = run_self::stateful_pointer<RunActorState>;

/// The WAL failed (`e`): the run keeps nothing more, and ends failed.
void fail_wal(run_ptr self, const Error& e);
/// With nothing appended and no sync under way, everything the files hold is
/// synced: the live upload may send it all. False where a sync must come first.
bool durable_if_synced(run_ptr self);
/// Asks for a round of the WAL's syncers where a rank waits for an ack
/// (`at_once`: whether or not one does, and now).
void request_sync(run_ptr self, bool at_once = false);
/// Appends a frame to the WAL, then applies it; false if it was refused.
bool record(run_ptr self, const std::vector<char>& frame);
/// The events the watch drafted go into the WAL, and to every rank.
void tell_events(run_ptr self);
/// Ends the run: once the WAL holds every rank's end durably, finish returns.
void end_run(run_ptr self);
/// `proxy` has what the run's end sent it, or is gone.
void confirmed(run_ptr self, const caf::actor_addr& proxy);

} // namespace chorus::actors::run_host
