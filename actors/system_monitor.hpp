// SystemMonitor: one per logging rank when Options::system_interval is not 0.
// Every interval it samples its rank's process and GPU (and, on the node's
// local rank 0, the node) and sends one system.jsonl line to the Run actor.
// Sampling runs on an actor thread, never the trainer's.
#pragma once

#include "actors/protocol.hpp"

#include <chorus/chorus.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace chorus::sampling {
class SystemSampler;
}

namespace chorus::actors {

/// Makes its sampler with `make` (loading NVML can take a while: it happens
/// on the actor's thread, not in init), samples at once, then every
/// `interval`, and sends (system_atom, rank, line) to `run`. Tells the
/// sampler's notes once on stderr when `speak`.
system_monitor_actor spawn_system_monitor(caf::actor_system& sys, run_actor run,
                                          std::function<std::unique_ptr<sampling::SystemSampler>()> make,
                                          std::chrono::microseconds interval, std::uint32_t rank,
                                          std::int64_t start_us, bool speak);

} // namespace chorus::actors
