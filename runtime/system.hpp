// The actor side of a Run, behind a CAF-free interface: it owns the CAF
// actor system, the RankProxy of this process and, on the run host, the Run
// actor and its listening port.
#pragma once

#include <chorus/chorus.hpp>

#include <memory>

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

protected:
  System() = default;
};

} // namespace chorus::detail
