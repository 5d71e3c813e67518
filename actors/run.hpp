// Run actor: one per run, on its run host. Appends every frame to the WAL,
// merges the ranks' streams (Merger), writes the run directory (RunWriter),
// acknowledges each rank, times barriers, notices dead and missing ranks,
// and finishes the run within finish_timeout.
#pragma once

#include "actors/protocol.hpp"
#include "runtime/core/options.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace chorus::store {
class WalWriter;
}
namespace chorus::client {
struct FinishState;
}

namespace chorus::actors {

class WalSyncers;

/// The actors a Run actor starts to help it (the WAL's own syncers, the Uploader
/// and its sender, the beacon), which stop when it does: where the actor
/// system outlives the run, its System waits for them as well as for the
/// Run actor, so that nothing of the run is left running once it is freed.
class Helpers {
public:
  void add(caf::actor a) {
    if (!a) return;
    std::lock_guard lock(mu_);
    actors_.push_back(std::move(a));
  }
  std::vector<caf::actor> take() {
    std::lock_guard lock(mu_);
    return std::exchange(actors_, {});
  }

private:
  std::mutex mu_;
  std::vector<caf::actor> actors_;
};

struct RunHost {
  core::Settings settings;
  std::string run_id;
  std::string run_dir;
  std::string run_json; // the identity object of run.json
  std::string job;      // job_identity(): the joins of other jobs' ranks are refused
  std::string secret;   // the job's secret (actors/job_secret.hpp) every join must carry; "" asks none
  std::string group_secret; // ... and what the run's reports to the job's group carry
  std::int64_t start_us = 0;
  /// The run directory held this run already (Options::resume): its WAL is
  /// replayed before the new attempt starts. The Run actor answers
  /// resume_atom with "" once the attempt started, or why it was refused.
  bool resumed = false;
  std::shared_ptr<store::WalWriter> wal; // shared with a sync under way (WalToSync)
  client::FinishState* finish = nullptr; // the host process's; filled when the run ends
  /// The WAL's syncers and the Uploader's sender: detached, but in tests/actors.
  Blocking blocking = Blocking::detached;
  /// The syncers kept by the process's own actor system (actors/wal_syncers.hpp);
  /// null: the Run actor makes its own, which stop when it does.
  std::shared_ptr<WalSyncers> syncers;

  /// The actors the Run actor starts to help it (see Helpers).
  std::shared_ptr<Helpers> helpers = std::make_shared<Helpers>();
};

run_host_actor spawn_run_actor(caf::actor_system& sys, std::shared_ptr<RunHost> host);

} // namespace chorus::actors
