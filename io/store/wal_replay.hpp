// A run's write-ahead log replayed through a Merger: how `chorus recover`
// rebuilds a run's files, and how a resumed run's host brings them up to
// date before its new attempt starts. The Merger is deterministic in its
// input, so the replay reproduces what the host had committed.
#pragma once

#include "io/store/wal.hpp"
#include "runtime/core/merger.hpp"
#include "runtime/core/wire.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::store {

struct WalReplay {
  WalScan scan;
  std::uint64_t malformed = 0; // frames that did not decode, or that the merge refused
  std::int64_t last_ts = 0;    // the latest time a frame carries: where a crashed attempt is taken to have ended
  bool ended = false;          // the log's last attempt has its run_end
  RunState end_state = RunState::crashed; // that run_end's state
};

/// Called with each decoded frame before the Merger applies it, with the
/// time it carries and its offset in the log.
using ReplayFrameFn = std::function<void(const core::wire::Frame&, std::int64_t ts_us, std::uint64_t offset)>;

/// Applies every good frame of the log at `path` to `merger`, in order.
/// An error only where the log cannot be read.
[[nodiscard]] Result<WalReplay> replay_wal(const std::string& path, chorus::core::Merger& merger,
                                           const ReplayFrameFn& before);

/// The end state of an attempt the log leaves open whose every rank has
/// ended in it: the run's end follows from how they ended
/// (Merger::end_state). Its host synced the log up to the last rank's end
/// before it answered finish, and the end's own frame after it may not have
/// reached the disk. None while a rank still runs.
[[nodiscard]] std::optional<RunState> derived_end(const chorus::core::Merger& merger);

/// The frames that close an attempt the log leaves open (its host died):
/// each rank still running dies with `reason`, then the run ends in `state`,
/// all at `ts_us`. The caller applies them (and a live host logs them).
std::vector<std::vector<char>> closing_frames(const chorus::core::Merger& merger, std::int64_t ts_us, RunState state,
                                              std::string_view reason);

} // namespace chorus::store
