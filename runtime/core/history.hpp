// What the merge of the ranks' streams produces: committed history rows and
// the run's other state changes, handed to a HistorySink (the run directory
// writer, the uploader, tests).
#pragma once

#include <chorus/chorus.hpp>
#include "runtime/core/media.hpp"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace chorus::core::wire {
struct EventRecord;
}

namespace chorus::core {

/// One value of a committed row. `rank` is -1 when the value is stored under
/// its plain key (a key with a reduction, or any key in a run of one rank);
/// else it is stored as `key/rank-N`. `count` is the number of ranks a reduced
/// value was computed from (0 for unreduced values).
struct RowValue {
  std::uint32_t key; // Merger key id, see Merger::key_name
  std::int32_t rank;
  double value;
  std::uint32_t count;
};

/// One histogram of a committed row: as a RowValue, `rank` -1 for the merge
/// of the ranks (`count` of them) or a run of one rank. `value` lives as
/// long as the sink's row() call.
struct RowHistogram {
  std::uint32_t key;
  std::int32_t rank;
  const Histogram* value;
  std::uint32_t count;
};

/// One image, text or table of a committed row: always its rank's (the
/// readers show a key that one rank logs under its plain name).
struct RowMedia {
  std::uint32_t key;
  std::int32_t rank;
  const Media* value;
};

/// A reduced value of a row that is NaN or ±Inf, and the ranks whose values
/// were (in rank order): `value` indexes Row::values.
struct RowNonfinite {
  std::uint32_t value;
  std::vector<std::int32_t> ranks;
};

/// One committed history row. Rows reach the sink strictly increasing in step.
struct Row {
  std::int64_t step = 0;
  std::int64_t ts_us = 0;      // when its first value was taken (unix microseconds)
  std::int64_t runtime_us = 0; // ts_us minus the run's start
  std::vector<RowValue> values; // sorted by (key name, rank)
  std::vector<RowHistogram> histograms; // sorted by (key name, rank); a row may hold only these
  std::vector<RowMedia> media;          // likewise
  std::vector<RowNonfinite> nonfinite;  // its reduced values that are not finite (rare: empty)
};

class HistorySink {
public:
  virtual ~HistorySink() = default;
  /// The run began: `run_json` is the identity object the run host wrote
  /// (id, project, group, name, mode, scope, world_size, host, dir, ...).
  virtual void run_start(std::string_view run_json, std::int64_t ts_us, std::uint32_t world_size) = 0;
  /// A committed row (key names through the Merger passed alongside).
  virtual void row(const Row& row) = 0;
  /// A config / summary object (JSON object text) set by `rank`, in stream order.
  virtual void config(int rank, std::string_view json_object) = 0;
  virtual void summary(int rank, std::string_view json_object) = 0;
  /// Values the merge refused, with the reason (they go to rejected.jsonl).
  virtual void rejected(int rank, std::uint64_t seq, std::int64_t step, std::span<const std::pair<std::string_view, double>> values,
                        const Error& why) = 0;
  /// Values `rank` refused before they reached the run (a bad key, a value
  /// that is no number): `n` of them, `values` a JSON object of them (key ->
  /// value as JSON); they go to rejected.jsonl too. `step`: core::wire::auto_step
  /// where the call gave none.
  virtual void refused(int /*rank*/, std::uint64_t /*seq*/, std::int64_t /*step*/, const Error& /*why*/,
                       std::string_view /*values*/, std::uint32_t /*n*/) {}
  /// A metric's declaration, whole, as it stands after a define_metric
  /// call: its reduction, its summary, and the key its charts take as x
  /// (`no_step_key`: _step). Key ids as in a Row.
  static constexpr std::uint32_t no_step_key = 0xffffffffu;
  virtual void metric(std::uint32_t /*key*/, Reduce /*reduce*/, Summary /*summary*/, std::uint32_t /*step_key*/) {}
  /// A rule of Run::alert_when on `key` (a key id as in a Row), from `rank`.
  virtual void alert_rule(int /*rank*/, std::uint32_t /*key*/, AlertRule /*rule*/) {}
  /// An event the run host told (core::wire::HostEvent::event), in WAL order; its
  /// strings live as long as the call.
  virtual void event(const wire::EventRecord& /*event*/) {}
  /// `rank` joined the current attempt at `ts_us` (the run host's clock,
  /// unix microseconds, as its rank_joined event says): once a rank an
  /// attempt, before the rank_state that says it runs.
  virtual void rank_joined(int /*rank*/, std::int64_t /*ts_us*/) {}
  /// A rank's state changed (joined, finished, crashed, timed out).
  virtual void rank_state(int rank, RunState state, std::int64_t last_step, std::string_view host, std::string_view reason) = 0;
  /// Everything `rank` sent up to and including `seq` is processed; `err`
  /// is non-null when the event `seq` itself was refused or failed (a
  /// rejected step, a barrier that timed out).
  virtual void completed(int rank, std::uint64_t seq, const Error* err) = 0;
  /// The run ended (a run_end host event); again, with the state amended,
  /// where a rank's process exited non-zero after the run ended.
  virtual void run_end(RunState state, std::int64_t ts_us) = 0;
  /// `rank` reached barrier `index` (named `name`) and waits there; a rank
  /// that reaches it after it was released passes through unreported.
  virtual void barrier_reached(int /*rank*/, std::uint64_t /*index*/, std::string_view /*name*/) {}
  /// Barrier `index` released `waiters` (the ranks that reached it, in rank
  /// order) after committing every row through `step` (-1: none); `missing`
  /// are the live ranks that had not reached it, `err` why it did not release
  /// cleanly (a timeout, the run's end, names that differ). The sink that
  /// owns a clock times them (the Run actor); the merge has none.
  virtual void barrier_released(std::uint64_t /*index*/, std::string_view /*name*/, std::int64_t /*step*/,
                                std::span<const int> /*waiters*/, std::span<const int> /*missing*/,
                                const Error* /*err*/) {}
};

} // namespace chorus::core
