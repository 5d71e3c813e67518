// What this process reads of its own surroundings for options and topology:
// its environment variables and, under MPICH's Hydra, the proxy it descends
// from (read from /proc by io/procfs, hence built into chorus_io).
#include "runtime/core/options.hpp"

#include "io/platform/procfs.hpp"

#include <cstdlib>

namespace chorus::core {

Env process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    if (name == hydra_proxy) {
      const std::optional<platform::ProcessId> proxy = platform::find_ancestor("hydra_pmi_proxy");
      if (!proxy) return std::nullopt;
      return std::to_string(proxy->pid) + "-" + std::to_string(proxy->start_ticks);
    }
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

} // namespace chorus::core

namespace chorus {

Topology detect_topology(Error& error) {
  // The public form (chorus.hpp): the topology, and the error beside it
  // (where there is one, a single process's).
  Result<Topology> t = core::detect_topology(core::process_env());
  error = t.error();
  if (t) return std::move(*t);
  Topology single;
  single.launcher = "none";
  return single;
}

} // namespace chorus
