// events.jsonl: one line per event the run host told (chorus::Event; README,
// "When something goes wrong"), in the order it told them. The Run actor
// makes each line here (`event_line`) and logs it through the WAL
// (core::wire::HostEvent::event); the RunWriter appends what the WAL holds, so
// `chorus recover` and a resume rebuild the file. Its readers (`chorus
// watch`, `chorus serve`, the webhook target, the Python reader) read it
// through `parse_event_line`.
//
// A line (fields in this order; the details only where the kind has them):
//   {"seq":0,"kind":"stalled","time":1700000000.25,"rank":3,"step":12,
//    "key":null,"message":"rank 3 (process 4242 on node-a) has not ...",
//    "ranks":[],"state":null,
//    "host":"node-a","pid":4242,"others_step":40,"seconds":301.5}
// - seq: the event's number in the run, from 0, across resumed attempts;
// - kind: stalled, resumed, nonfinite, rank_failed, rank_killed, rank_lost,
//   barrier_timeout, run_finished, threshold, straggler;
// - time: unix seconds (exact decimal microseconds) on the run host's clock;
// - rank, step, key: what it concerns (null: none); ranks: the ranks it
//   names (non-finite values, missing at a barrier); state: run_finished's
//   end state, and the state a rank_* event's rank ended in;
// - details: host, pid (the rank's process), others_step (the step other
//   ranks reached), seconds (how long stalled; a no_change rule's time),
//   value (nonfinite, threshold: a number, or "NaN", "Infinity",
//   "-Infinity"), rule and limit (threshold), barrier and index
//   (barrier_timeout; barrier for a straggler of barriers), reason (why a
//   rank ended; "barriers" or "steps" for a straggler).
#pragma once

#include "runtime/core/event_watch.hpp"
#include "runtime/core/result.hpp"

#include <chorus/chorus.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::store {

inline constexpr const char* events_file = "events.jsonl";

/// The draft's line, numbered `seq`, without its newline.
[[nodiscard]] std::string event_line(const chorus::core::EventDraft& draft, std::uint64_t seq);

/// An events.jsonl line read back.
struct EventLine {
  std::uint64_t seq = 0;
  Event event;                 // kind, step, rank, key, time, message, ranks, state; json: the line
  std::string host;            // details, where the line has them
  std::int64_t pid = -1;
  std::int64_t others_step = -1;
  std::optional<double> seconds;
};
/// The line, or why it is none (not JSON, an unknown kind, a missing field).
[[nodiscard]] Result<EventLine> parse_event_line(std::string_view line);

/// EventKind by its name in the file; nothing for an unknown one.
[[nodiscard]] std::optional<EventKind> event_kind(std::string_view name) noexcept;

/// Whether a line of `kind` says a state (its `state` field is not null):
/// run_finished, and a rank's end (rank_failed, rank_killed, rank_lost).
[[nodiscard]] bool event_has_state(EventKind kind) noexcept;

} // namespace chorus::store
