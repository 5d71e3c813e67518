// The WAL syncers of a Run actor. A syncer fdatasyncs the WAL it is given,
// on a thread of its own, while its Run actor merges on
// (actors/sync_rounds.hpp). Starting a thread is no small part of a short
// run: 0.4-0.8 ms a thread on some virtual machines, on the Run actor's
// thread, before it takes its first frame. So the actor system that a
// process keeps for its runs (actors/system.cpp) keeps their syncers too:
// a first run's are started beside its actors, by the thread that starts
// them; a run takes one as each of its rounds comes and gives them back
// once its end is durable (actors/run_wal.cpp), so that the next run starts
// no thread unless it runs beside another. A Run actor of any other system
// spawns its own (spawn_wal_syncer), which stop when it does.
#pragma once

#include "actors/protocol.hpp"

#include <cstddef>
#include <mutex>
#include <vector>

namespace chorus::actors {

/// A syncer spawned `where` (detached, but in tests/actors), which stops
/// when `parent` does, where one is given (a Run actor's own).
syncer_actor spawn_wal_syncer(caf::actor_system& sys, Blocking where, caf::actor_addr parent = {});

/// The syncers an actor system keeps for its runs.
class WalSyncers {
public:
  /// Syncers of `sys`, spawned `where` (detached, but in tests/actors).
  WalSyncers(caf::actor_system& sys, Blocking where) : sys_(sys), where_(where) {}
  WalSyncers(const WalSyncers&) = delete;
  WalSyncers& operator=(const WalSyncers&) = delete;

  /// An idle syncer, else a new one.
  syncer_actor take();
  /// Starts syncers until `n` are idle: a process's first run has them
  /// started beside its actors' start, not on the Run actor's thread.
  void fill(std::size_t n);
  /// `s`, idle, serves the next run that asks.
  void give_back(syncer_actor s);
  /// How many are idle.
  [[nodiscard]] std::size_t idle();
  /// `s` may be at a sync still (of a run that ended before its answer): it
  /// stops once that returns, so that no run waits behind a sync not its own.
  void retire(const syncer_actor& s);

private:
  caf::actor_system& sys_;
  const Blocking where_;
  std::mutex mu_;
  std::vector<syncer_actor> idle_;
};

} // namespace chorus::actors
