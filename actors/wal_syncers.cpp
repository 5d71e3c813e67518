// The WAL syncers of a Run actor: see actors/wal_syncers.hpp.
#include "actors/wal_syncers.hpp"

#include "io/store/wal.hpp"

#include <utility>

namespace chorus::actors {

/// Answers each sync_atom once the WAL it names is fdatasync'ed: no error,
/// or why it failed. (Its argument is passed, not captured: CAF 0.17
/// dereferences a null argument tuple for a function spawned without arguments.)
static syncer_actor::behavior_type wal_syncer(syncer_actor::pointer self, caf::actor_addr parent) {
  stop_with(self, parent);
  return {[](sync_atom, const WalToSync& w) {
    if (!w.wal) return WireError(Error(Errc::internal, "a WAL sync was asked for without a WAL"));
    return WireError(w.wal->sync());
  }};
}

syncer_actor spawn_wal_syncer(caf::actor_system& sys, Blocking where, caf::actor_addr parent) {
  return spawn_blocking(sys, where, wal_syncer, std::move(parent));
}

syncer_actor WalSyncers::take() {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      syncer_actor s = std::move(idle_.back());
      idle_.pop_back();
      return s;
    }
  }
  return spawn_wal_syncer(sys_, where_);
}

void WalSyncers::fill(std::size_t n) {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (idle_.size() >= n) return;
    }
    give_back(spawn_wal_syncer(sys_, where_));
  }
}

void WalSyncers::give_back(syncer_actor s) {
  if (!s) return;
  std::lock_guard lock(mu_);
  idle_.push_back(std::move(s));
}

std::size_t WalSyncers::idle() {
  std::lock_guard lock(mu_);
  return idle_.size();
}

void WalSyncers::retire(const syncer_actor& s) {
  if (!s) return;
  // Guarded actors obey an exit sent in the name of an actor of this process only.
  caf::scoped_actor stopper{sys_};
  stopper->send_exit(s, caf::exit_reason::user_shutdown);
}

} // namespace chorus::actors
