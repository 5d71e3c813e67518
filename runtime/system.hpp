// The actor side of a Run, behind a CAF-free interface: it owns the CAF
// actor system, the RankProxy of this process and, on the run host, the Run
// actor and its listening port.
#pragma once

#include <chorus/chorus.hpp>

#include <memory>
#include <vector>

namespace chorus::detail {

class RunImpl;

class System {
public:
  /// Starts the actor system. On the run host: creates the run directory,
  /// spawns the Run actor and (for several ranks) listens; elsewhere: dials
  /// the run host until init_timeout. Then spawns this process's RankProxy
  /// and joins the run. Sets run.run_id / run.run_dir.
  static std::unique_ptr<System> start(RunImpl& run, Error& error);
  virtual ~System() = default;

  /// The run's NCCL unique id: the run host hands it to its Run actor
  /// (`provide`), every other rank fetches it from there, waiting up to
  /// init_timeout for the host to have sent it.
  virtual Error exchange_nccl_id(bool provide, std::vector<char>& id) = 0;

protected:
  System() = default;
};

} // namespace chorus::detail
