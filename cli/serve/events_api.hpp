// A run's events (events.jsonl, io/store/event_log.hpp) as `chorus serve`
// answers them: GET /api/run/events?run=PATH[&after=N], and an `events`
// message on the page's event stream when the file changes (docs/DASHBOARD.md).
//
// The file is followed as the other run files are (FollowedFile): each look
// reads only the complete lines appended since the last one, a line being
// written is taken once it is whole, and a file replaced or cut is read
// afresh. Each line is read with store::parse_event_line; one it refuses is
// skipped and counted, the first named with its line number. A run keeps
// its last `max_events` events (and at most `max_bytes` of them); the older
// ones are counted as left out. The runs' event logs together hold at most
// `max_total_bytes`, the least recently asked for given up first.
#pragma once

#include "cli/serve/api.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace chorus::cli::serve {

/// What an event stream has told a page of a run's events so far.
struct EventsSeen {
  bool started = false;
  std::uint64_t lines = 0;      // lines taken or skipped
  std::uint64_t generation = 0; // which reading of the file (a new one where it was replaced or cut)
  bool unfinished = false;
  bool missing = true;
  std::string problem;
};

class EventsApi {
public:
  /// Events one run keeps (its last), and the most bytes their JSON may hold.
  static constexpr std::size_t max_events = 10'000;
  static constexpr std::size_t max_bytes = 4u << 20;
  /// The most the event logs of all runs hold together.
  static constexpr std::size_t max_total_bytes = 64u << 20;
  /// The most one look at a file reads.
  static constexpr std::uint64_t step_bytes = 64u << 20;

  /// Runs are named and found as `api` names and finds them (Api::resolve_run).
  explicit EventsApi(const Api& api);
  ~EventsApi();
  EventsApi(const EventsApi&) = delete;
  EventsApi& operator=(const EventsApi&) = delete;

  /// GET /api/run/events?run=REL[&after=N]: the file's state and the events
  /// kept, oldest first; with `after`, only those after the file's first N
  /// (N: `rows` of an earlier answer of the same `generation`).
  Reply events(std::string_view rel, std::string_view after);

  /// An `events` server-sent event where the run's events.jsonl changed
  /// since `seen` (and one at the start); "" where nothing did, or the run
  /// cannot be read.
  std::string changes(std::string_view rel, EventsSeen& seen);

  /// Bytes the event logs hold.
  [[nodiscard]] std::size_t cached_bytes();

private:
  struct Log;
  /// The event log of the run in `dir`, with the lines appended since the last look read.
  std::shared_ptr<Log> log(const std::string& dir);
  void evict();

  const Api& api_;
  std::mutex mutex_; // guards logs_ and clock_
  std::map<std::string, std::shared_ptr<Log>> logs_;
  std::uint64_t clock_ = 0;
};

} // namespace chorus::cli::serve
