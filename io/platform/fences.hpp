// Asymmetric fences: a handoff between one thread that passes a point many
// millions of times a second and others that come rarely. The frequent side
// costs a compiler barrier; the rare side makes every running thread of the
// process pass a full memory barrier (membarrier(2), private expedited), a
// few microseconds. Between them they order a store before a load as a
// full fence on both sides would (Dekker's handoff): the frequent side
// stores its flag, light_fence(), loads the other's; the rare side stores
// its flag, heavy_fence(), loads the frequent side's.
//
// The process registers for them once, as the library is loaded (a few
// microseconds in a process of one thread, a few milliseconds in one that
// already runs others); a fork's child keeps the registration. Where the
// kernel refuses membarrier (an old kernel, a seccomp profile that blocks
// it) asymmetric_fences() is false and the frequent side must take a path
// that needs none. The ring of a Run's log calls is the user
// (runtime/client/ingest.hpp, "the owner").
#pragma once

#include <atomic>

namespace chorus::platform {

/// Whether heavy_fence() works in this process (decided once, at load).
[[nodiscard]] bool asymmetric_fences() noexcept;

/// The frequent side: orders this thread's earlier stores before its later
/// loads, against a heavy_fence() on another thread. No instruction.
inline void light_fence() noexcept { std::atomic_signal_fence(std::memory_order_seq_cst); }

/// The order of the frequent side's flag store and load on either side of
/// light_fence(): relaxed, except under ThreadSanitizer, which knows
/// neither membarrier nor fences: there they are sequentially consistent
/// (with the rare side's store and load), a handoff it can follow.
inline constexpr std::memory_order light_order =
#if defined(__SANITIZE_THREAD__)
    std::memory_order_seq_cst;
#else
    std::memory_order_relaxed;
#endif

/// The rare side: when it returns, every thread of the process has passed a
/// full memory barrier after this thread's earlier stores. Only where
/// asymmetric_fences() is true.
void heavy_fence() noexcept;

} // namespace chorus::platform
