// Retry pauses with jitter: hundreds of ranks that start together and retry
// together would otherwise hit their run host in lockstep, each wave as
// large as the job.
#pragma once

#include <chrono>
#include <random>
#include <unistd.h>

namespace chorus::core {

/// A pause drawn uniformly from [d/2, d] ("equal jitter"): retries spread
/// over half their interval, and none comes sooner than half of it.
inline std::chrono::milliseconds jittered(std::chrono::milliseconds d) {
  thread_local std::minstd_rand engine(static_cast<unsigned>(std::random_device{}()) ^
                                       static_cast<unsigned>(::getpid()));
  if (d.count() < 2) return d;
  std::uniform_int_distribution<std::chrono::milliseconds::rep> half(0, d.count() / 2);
  return std::chrono::milliseconds(d.count() - half(engine));
}

} // namespace chorus::core
