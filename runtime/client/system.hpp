// The actor side of a Run, behind a CAF-free interface: it owns the CAF
// actor system (or uses an orchestrator's, <chorus/caf.hpp>), the RankProxy
// of this process and, on the run host, the Run actor and its listening port.
#pragma once

#include "runtime/core/result.hpp"

#include <memory>
#include <vector>

namespace caf {
class actor;
class actor_system;
} // namespace caf

namespace chorus::client {

class RunImpl;

/// The actor side of a Run. The client never names the actors: the actor
/// layer provides the factory that makes one (actors/system.hpp) and
/// registers it as libchorus loads (set_system_factory).
class System {
public:
  virtual ~System() = default;

  /// This process's RankProxy.
  virtual caf::actor proxy() const = 0;

  /// The run's NCCL unique id: the run host hands it to its Run actor
  /// (`provide`), every other rank fetches it from there, waiting up to
  /// init_timeout for the host to have sent it.
  virtual Error exchange_nccl_id(bool provide, std::vector<char>& id) = 0;

  /// The process exited with `status` (not 0) after this rank finished:
  /// tells the run host, which records the rank failed; waits for its
  /// answer a short while (a host that is gone is not waited for).
  virtual void report_exit(int status) = 0;

protected:
  System() = default;
};

/// Starts the actor system. On the run host: creates the run directory,
/// spawns the Run actor and (for several ranks) listens; elsewhere: dials
/// the run host until init_timeout. Then spawns this process's RankProxy
/// and joins the run. Sets run.run_id / run.run_dir. The actors run in
/// `actors` where given (its configuration prepared by <chorus/caf.hpp>'s
/// configure), else in an actor system of the System's own.
using SystemFactory = Result<std::unique_ptr<System>> (*)(RunImpl& run, caf::actor_system* actors);

/// Registers the factory; once, as the library that links the actors loads.
void set_system_factory(SystemFactory factory) noexcept;
/// The factory registered, or null where no actor layer is linked.
[[nodiscard]] SystemFactory system_factory() noexcept;

} // namespace chorus::client
