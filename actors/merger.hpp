// The Run actor's core, free of CAF: it turns the frames of every rank (and
// the host's own decisions) into one history, committed in step order.
// Deterministic in its input: replaying a run's WAL through a fresh Merger
// yields the same rows, which is what `chorus recover` does.
//
// Rules (DESIGN.md section 4):
// - a rank's steps are non-decreasing; an auto step is the rank's previous
//   step + 1 (0 first); an explicit lower step is rejected (backwards_step);
// - a row for step s commits once every live rank is past s: a rank is past s
//   when its last step is > s, or it waits at a barrier, has finished or died;
//   a rank that has not joined yet holds every row back;
// - a barrier parks each rank that reaches it (its later events wait); when
//   every live rank is parked at it, or it times out, every pending row
//   commits, the barrier completes (with an error naming the missing ranks on
//   timeout, or a name mismatch), the parked ranks' auto steps move past the
//   last committed step, and their later events are processed;
// - a value at or below the last committed step is rejected (step_committed);
// - a key with a reduction is reduced over the ranks that logged it at that
//   step (count kept); without one, one rank's value is stored under the key,
//   several ranks' values as key/rank-N; within one rank and step the later
//   value of a key replaces the earlier;
// - a dead rank leaves the watermark and never blocks again; events of a rank
//   after its death or finish are ignored.
#pragma once

#include "runtime/history.hpp"
#include "runtime/wire.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::detail {

class Merger {
public:
  Merger(HistorySink& sink);
  ~Merger();
  Merger(const Merger&) = delete;
  Merger& operator=(const Merger&) = delete;

  /// Applies one frame (see wire.hpp). Returns false, changing nothing, if
  /// the frame is malformed.
  bool apply(std::span<const char> frame);

  /// The name of a key id that appears in a Row.
  [[nodiscard]] std::string_view key_name(std::uint32_t key) const;

  // State, for the Run actor's timers and finish.
  [[nodiscard]] int world_size() const noexcept;
  [[nodiscard]] bool started() const noexcept; // a run_start frame was applied
  [[nodiscard]] std::int64_t start_ts_us() const noexcept;
  [[nodiscard]] RunState rank_state(int rank) const;
  [[nodiscard]] bool rank_joined(int rank) const;
  [[nodiscard]] std::int64_t rank_last_step(int rank) const;
  /// Every rank has finished or died.
  [[nodiscard]] bool all_done() const noexcept;
  /// The index of the barrier ranks are gathering at, and the ranks (live,
  /// not finished) that have not reached it; index -1 when none is open.
  [[nodiscard]] std::int64_t open_barrier() const noexcept;
  [[nodiscard]] std::vector<int> missing_at_barrier() const;
  /// The longest timeout (ms) asked by the ranks parked at the open barrier.
  [[nodiscard]] std::int64_t open_barrier_timeout_ms() const noexcept;
  [[nodiscard]] std::int64_t last_committed_step() const noexcept; // -1 if none
  [[nodiscard]] std::uint64_t rows_committed() const noexcept;
  [[nodiscard]] std::uint64_t values_rejected() const noexcept;

private:
  struct State;
  std::unique_ptr<State> s_;
};

} // namespace chorus::detail
