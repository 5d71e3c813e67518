#include "io/platform/fences.hpp"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace chorus::platform {

namespace {

long membarrier(int command) noexcept { return ::syscall(__NR_membarrier, command, 0, 0); }

bool register_once() noexcept {
  const long commands = membarrier(MEMBARRIER_CMD_QUERY);
  if (commands < 0 || (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
         membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0; // and it works
}

/// Decided as the library is loaded: a process that links it, or a
/// dlopen that brings it, has registered before any ring is made.
const bool registered = register_once();

} // namespace

bool asymmetric_fences() noexcept { return registered; }

void heavy_fence() noexcept {
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  // Registered and tried at load (a fork's child keeps the registration,
  // an exec loads the library afresh), so this is not refused; were it
  // ever, the global barrier (every CPU, through an RCU grace period,
  // milliseconds) orders as much.
  if (membarrier(MEMBARRIER_CMD_GLOBAL) == 0) return;
  // Neither: a thread switched out and in again has passed a barrier, and a
  // sleep of a scheduler tick lets every other thread of the process be switched.
  timespec tick{0, 10'000'000};
  ::nanosleep(&tick, nullptr);
  ::sched_yield();
}

} // namespace chorus::platform
