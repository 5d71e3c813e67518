// The WAL syncers of a Run actor: see actors/wal_syncers.hpp.
#include "actors/wal_syncers.hpp"

#include "io/store/wal.hpp"

#include <utility>

namespace chorus::actors {

namespace {

/// Answers each sync_atom once the WAL it names is fdatasync'ed: no error,
/// or why it failed.
class WalSyncer : public syncer_actor::base {
public:
  WalSyncer(caf::actor_config& cfg, caf::actor_addr parent) : syncer_actor::base(cfg), parent_(std::move(parent)) {}

  const char* name() const override { return "chorus.wal_syncer"; }

  behavior_type make_behavior() override {
    stop_with(this, parent_);
    return {[](sync_atom, const WalToSync& w) {
      if (!w.wal) return WireError(Error(Errc::internal, "a WAL sync was asked for without a WAL"));
      return WireError(w.wal->sync());
    }};
  }

private:
  caf::actor_addr parent_;
};

} // namespace

syncer_actor WalSyncers::take() {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      syncer_actor s = std::move(idle_.back());
      idle_.pop_back();
      return s;
    }
  }
  return spawn();
}

void WalSyncers::fill(std::size_t n) {
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (idle_.size() >= n) return;
    }
    give_back(spawn());
  }
}

syncer_actor WalSyncers::spawn() {
  if (where_ == Blocking::scheduled_for_tests) return spawn_guarded_class<WalSyncer>(sys_, parent_);
  return spawn_guarded_class<WalSyncer, caf::detached>(sys_, parent_);
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
