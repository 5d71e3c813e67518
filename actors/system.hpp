// The actor side of a Run (runtime/client/system.hpp's System): what the
// actor layer provides to the client, which never names it.
#pragma once

#include "runtime/client/system.hpp"

namespace caf {
class actor_system_config;
} // namespace caf

namespace chorus::core {
struct Settings;
}

namespace chorus::actors {


/// The actor layer's SystemFactory. It is registered (set_system_factory)
/// as the program that links the actors starts, before any run can.
[[nodiscard]] Result<std::unique_ptr<client::System>> start_system(client::RunImpl& run, caf::actor_system* actors);

/// Prepares an orchestrator's configuration for the run `s`: what its links
/// between processes need (<chorus/caf.hpp>'s configure).
[[nodiscard]] Error configure_system(caf::actor_system_config& cfg, const core::Settings& s);

} // namespace chorus::actors
