// The run host's events (README, "When something goes wrong"): the Run
// actor's HostSink passes what the merge does to the EventWatch
// (runtime/core/event_watch.hpp), and the Run actor turns each of its
// drafts into a frame here: its events.jsonl line (io/store/event_log.hpp),
// numbered, as the core::wire::HostEvent::event that the WAL records and every rank is told.
#pragma once

#include "runtime/core/event_watch.hpp"

#include <cstdint>
#include <vector>

namespace chorus::actors {

class RunEvents {
public:
  explicit RunEvents(core::WatchSettings settings) : watch(settings) {}

  /// The drafts so far as event frames, numbered from `next_seq`.
  [[nodiscard]] std::vector<std::vector<char>> frames(std::uint64_t next_seq);

  core::EventWatch watch;
};

} // namespace chorus::actors
