// The Run actor's core, free of CAF: it turns the frames of every rank (and
// the host's own decisions) into one history, committed in step order.
// Deterministic in its input: replaying a run's WAL through a fresh Merger
// yields the same rows, which is what `chorus recover` does.
//
// Rules (README: "Many producers in one rank", the columns table, barriers):
// - each producer's steps are non-decreasing; an auto step is its previous
//   step + 1 (0 first); an explicit lower step is rejected (backwards_step).
//   A rank's producers are its default stream (live from its first values)
//   and the writer streams it opens (live from their open, at the last
//   committed step, to their close; at most core::wire::max_streams at once);
// - a rank stands at the minimum over its live streams (with none live, at
//   the furthest any got); a row for step s commits once every live rank is
//   past s: a rank is past s when it stands > s, or it waits at a barrier,
//   has finished or died;
//   a rank that has not joined yet holds every row back;
// - a barrier parks each rank that reaches it (its later events wait); when
//   every live rank is parked at it, or it times out, every pending row
//   commits, the barrier completes (with an error naming the missing ranks on
//   timeout, or a name mismatch), the parked ranks' auto steps move past the
//   last committed step, and their later events are processed;
// - a value at or below the last committed step is rejected (step_committed);
// - a value's column depends only on its key, the key's reduction and its
//   rank, never on which other ranks logged at that step: a key with a
//   reduction is one column `key`, reduced over the ranks that logged it at
//   that step (count kept; `first` takes the lowest rank's value); a key
//   without one is a column per rank, key/rank-N, in a run of several ranks,
//   and `key` in a run of one; within one rank and step the later value of a
//   key replaces the earlier;
// - a run_start after run_end begins a resumed attempt (Options::resume): its
//   ranks start afresh (joined, keys, seqs, barriers), their auto steps
//   after the last committed step; rows, keys, their reductions and the
//   runtime's origin carry on, so a step at or below the last committed one
//   is refused (step_committed) as always, never written twice;
// - a dead rank leaves the watermark and never blocks again; events of a rank
//   after its death or finish are ignored. A rank ends as its finish says:
//   finished, failed (with its exit code) or killed (by its signal), with
//   why; a rank_exit (its process exited non-zero after a finish that said
//   finished, even after run_end) turns it failed, and a run that ended
//   finished failed (the sink hears run_end again);
// - values a rank refused before they reached it (a refused event) are
//   counted as rejected and go to the sink, taking no step;
// - a rank's alert rule (Run::alert_when) goes to the sink in its stream's
//   order; an event the run host told (HostEvent::event) goes to the sink
//   as it is and changes nothing else, so a replay tells it again;
//
// Consequences of those rules, which the Run actor and the tests rely on:
// - barriers match by order: a rank's k-th barrier is barrier k. A rank that
//   reaches barrier k after it timed out passes straight through (its
//   completion carries barrier_timeout) and its auto steps move past the last
//   committed step. A released barrier drains its waiters in rank order;
// - what a rank sent before it died (or was given up on by finish_timeout)
//   and that waits behind a barrier is processed when the barrier releases;
//   run_end releases every open barrier (barrier_timeout for its waiters),
//   processes what waited, and commits every pending row;
// - a key's reduction is the one in force when its row commits, so a key
//   declared late changes column from that row on; a reduced value sums in
//   rank order, so replays give the same bits; NaN propagates (through
//   `first` only when it is the lowest rank's value);
// - a row's ts_us is the earliest ts_us of the values logged into it;
// - the sink hears of each rank parking at a barrier (barrier_reached) and
//   of each release, with the ranks that waited and those missing
//   (barrier_released), before the waiters' completions;
// - completed(rank, seq) follows each rank's seq order: values, define,
//   config, summary and finish when processed, a barrier when it releases;
// - a rank batch is malformed (apply() returns false, nothing changes) before
//   run_start, so is a run_start while the run is running, from a rank outside world_size or not joined yet, or when it
//   uses a key id before naming it or names one id twice differently (or
//   names an id of 2^22 or more), opens a writer stream already open, closes
//   or logs into one not open, or whose seqs do not go up from the rank's
//   last (by at most 2^17 an event); so is a run_start for 0 or more than 65536
//   ranks. A joined event for a rank already dead is ignored: it stays crashed;
//   so is one for a rank that joined the attempt already: the sink hears a
//   rank's join (rank_joined, with the event's time) once an attempt;
// - a step outside 0..INT64_MAX-1 (or an auto step past it) is refused with
//   invalid_argument.
#pragma once

#include "runtime/core/history.hpp"
#include "runtime/core/wire.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::core {

class Merger {
public:
  Merger(HistorySink& sink);
  ~Merger();
  Merger(const Merger&) = delete;
  Merger& operator=(const Merger&) = delete;

  /// Applies one frame (see wire.hpp). Returns false, changing nothing, if
  /// the frame is malformed.
  bool apply(std::span<const char> frame);

  /// apply() in two halves, for a caller that must log a frame between its
  /// check and its effects (the Run actor writes it to the WAL there, so
  /// that nothing reaches the run's files, nor an upload, before its frame
  /// is in the log). admit decodes `frame` into `out` and checks it,
  /// changing nothing the run shows; false if apply() would refuse it. A
  /// true answer is followed by apply(out), before any other frame, while
  /// the bytes `out` points into live.
  [[nodiscard]] bool admit(std::span<const char> frame, wire::Frame& out);
  void apply(const wire::Frame& admitted);
  /// The frame admit() took last (before its apply) holds a rank's end:
  /// its finish, of any kind. The Run actor syncs such a frame at once.
  [[nodiscard]] bool admitted_ends_rank() const noexcept;

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
  /// The state the run ends in, from how its ranks ended: failed where one
  /// failed, else crashed where one was lost, else killed where a signal
  /// stopped one, else finished.
  [[nodiscard]] RunState end_state() const noexcept;
  /// Why the rank ended other than finished ("" while it runs, or finished).
  [[nodiscard]] const std::string& rank_message(int rank) const;
  /// The rank's finish came while it waited at the open barrier, and waits
  /// behind it (a FinishTimeout lets it through).
  [[nodiscard]] bool finish_waiting(int rank) const;
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

} // namespace chorus::core
