// The run host's events (README, "When something goes wrong"): the Run
// actor's HostSink passes what the merge does to the EventWatch
// (runtime/core/event_watch.hpp), and the Run actor turns each of its
// drafts into a frame here: its events.jsonl line (io/store/event_log.hpp),
// numbered, with the rank's host and process filled in, as the
// wire::HostEvent::event that the WAL records and every rank is told.
#pragma once

#include "runtime/core/event_watch.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::detail {

class RunEvents {
public:
  explicit RunEvents(WatchSettings settings) : watch(settings) {}

  /// Where `rank`'s process runs, as it joined.
  void joined(int rank, std::string host, std::int64_t pid, std::int64_t now_us);
  /// The drafts so far as event frames, numbered from `next_seq`.
  [[nodiscard]] std::vector<std::vector<char>> frames(std::uint64_t next_seq);

  EventWatch watch;

private:
  struct Where {
    std::string host;
    std::int64_t pid = -1;
  };
  std::vector<Where> where_; // by rank
};

} // namespace chorus::detail
