// What the run host tells while a run goes on (README, "When something goes
// wrong"): the EventWatch looks at what the merge does (rows, ranks' steps,
// barriers, ends) and at the run host's clock, and drafts chorus::Events.
// CAF-free and deterministic in its input, clock included, so that its
// rules are tested without processes. The Run actor feeds it and turns each
// draft into an events.jsonl line (io/store/event_log.hpp) that goes
// through the WAL (core::wire::HostEvent::event): a replay (resume, `chorus
// recover`) writes the lines again and never detects anew.
//
// Rules (times are the run host's clock, unix microseconds):
// - stalled: a joined, running rank, not parked at a barrier, whose step has
//   not moved for stall_after while some other live rank stands at a higher
//   step or waits for it at an open barrier. The stall's clock starts at the
//   later of its last move and the moment another rank got ahead of it (or
//   parked at a barrier it had not reached), so a rank that is one step
//   behind after a long pause of everyone is not stalled at once. Once per
//   stall: `resumed` when its step moves (or it reaches the barrier); a rank
//   that ends while stalled gets its end's event only. stall_after 0: off;
// - nonfinite: a committed column whose value is NaN or ±Inf (a reduced key:
//   the ranks whose values were; a rank's column: that rank); once per
//   column until it is finite again;
// - rank_failed, rank_killed, rank_lost: a rank's state turns failed,
//   killed, or crashed (its process or connection vanished, or it never
//   joined); once per rank and state;
// - barrier_timeout: a barrier released with an error while ranks were
//   missing (`ranks`: the missing ones);
// - run_finished: the run ended (its state); the last event of an attempt,
//   but where a finished rank's process exits non-zero after it: that rank's
//   rank_failed, and run_finished again where the end state changed with it
//   (a run_end again with another state);
// - threshold: a rule of Run::alert_when. above/below: a committed value of
//   the key's column (or of each rank's column) beyond the bound fires once,
//   and again only after a value within it; no_change: the column's value
//   the same (or the key not committed) for the rule's seconds while rows
//   commit or ranks run, once until it changes;
// - straggler: a rank that came last to at least straggler_share of the
//   last straggler_window barriers, each of which it kept the others
//   waiting at least straggler_floor (the absolute floor: a healthy run
//   waits milliseconds); or whose step lags the median live rank's by more
//   than lag_steps for lag_for running. Once until it no longer does.
#pragma once

#include "runtime/core/history.hpp"

#include <chorus/chorus.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::core {

/// An event as the watch drafts it; io/store/event_log.hpp writes its line.
/// The fields past `ranks` are the kind's details (left at their defaults
/// where they do not apply).
struct EventDraft {
  EventKind kind = EventKind::run_finished;
  std::int64_t ts_us = 0;
  int rank = -1;
  std::int64_t step = -1;
  RunState state = RunState::running; // run_finished, and a rank's end
  std::string key;
  std::string message;
  std::vector<std::int32_t> ranks;
  // Details.
  std::string host;             // the rank's host (stalled, resumed, rank_*, straggler)
  std::int64_t pid = -1;        // the rank's process id, as it joined
  std::int64_t others_step = -1; // stalled/straggler: the step the others reached (the highest; for lag, the median)
  std::int64_t seconds_us = -1; // stalled/resumed: how long; no_change: the rule's time
  double value = 0;             // nonfinite, threshold: the value
  bool has_value = false;
  std::string rule;             // threshold: "above", "below", "no_change"
  double limit = 0;             // threshold: the bound, or seconds for no_change
  std::string barrier;          // barrier_timeout, straggler: the barrier's name
  std::int64_t index = -1;      // barrier_timeout: its index
  std::string reason;           // rank_*: why it ended; straggler: "barriers" or "steps"
};

struct WatchSettings {
  std::int64_t stall_after_us = 300'000'000; // 0: off
  std::size_t straggler_window = 20;
  double straggler_share = 0.8;
  std::int64_t straggler_floor_us = 1'000'000;
  std::int64_t lag_steps = 1000;
  std::int64_t lag_for_us = 60'000'000;
};

class EventWatch {
public:
  explicit EventWatch(WatchSettings settings);
  ~EventWatch();
  EventWatch(const EventWatch&) = delete;
  EventWatch& operator=(const EventWatch&) = delete;

  // What the merge did, as the run host's HistorySink hears it (a live
  // attempt only: the Run actor passes nothing while it replays a WAL).
  void run_start(int world_size, std::int64_t now_us);
  void rank_joined(int rank, std::string_view host, std::int64_t pid, std::int64_t now_us);
  /// After each frame of `rank`: its last step (Merger::rank_last_step).
  void progress(int rank, std::int64_t step, std::int64_t now_us);
  void rank_state(int rank, RunState state, std::int64_t last_step, std::string_view reason, std::int64_t now_us);
  void barrier_reached(int rank, std::uint64_t index, std::string_view name, std::int64_t now_us);
  void barrier_released(std::uint64_t index, std::string_view name, std::span<const int> waiters,
                        std::span<const int> missing, const Error* err, std::int64_t now_us);
  /// A committed row; `key_name` names its key ids.
  void row(const Row& row, const std::function<std::string_view(std::uint32_t)>& key_name, std::int64_t now_us);
  /// A rule of Run::alert_when (a replayed one too: rules are state).
  void rule(std::uint32_t key, std::string_view key_name, AlertRule rule);
  void run_end(RunState state, std::int64_t now_us);
  /// The clock moved (the Run actor calls it every second): stalls,
  /// no_change rules and lagging ranks are found here.
  void tick(std::int64_t now_us);

  /// The drafts since the last take, in the order they happened; one about
  /// a rank that joined names its host and process.
  [[nodiscard]] std::vector<EventDraft> take();
  [[nodiscard]] bool has_drafts() const noexcept;

private:
  struct State;
  std::unique_ptr<State> s_;
};

} // namespace chorus::core
