// A run's events.jsonl (io/store/event_log.hpp) followed as the run host
// appends to it: `chorus watch` prints what it reads, `chorus launch
// --on-stall=kill` looks for a stalled rank. The file is followed as `chorus
// serve` follows a run file (cli/serve/followed_file.hpp: complete lines
// only, a file rebuilt by `chorus recover` read afresh), and each line is
// read through store::parse_event_line. An event is handed out once: after a
// file read afresh, only the events numbered past the last one handed out.
#pragma once

#include "cli/serve/followed_file.hpp"
#include "io/store/event_log.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace chorus::cli {

class RunEvents {
public:
  explicit RunEvents(const std::string& run_dir);

  /// An event read, with its line as the file has it (its line end cut).
  struct Read {
    store::EventLine event;
    std::string line;
  };
  /// The events appended since the last call, in the file's order. A line
  /// that is no event is passed over (skipped() counts it); a file that is
  /// not there yet has none.
  [[nodiscard]] std::vector<Read> poll();

  /// Why the file cannot be read on (not a regular file, a line past the
  /// longest a run host writes); empty while it reads.
  [[nodiscard]] Error problem() const;
  /// Complete lines that are no event, and why the first was not ("line 3:
  /// not JSON (...)").
  [[nodiscard]] std::uint64_t skipped() const;
  [[nodiscard]] std::string first_skipped() const;

  /// The last event read, if it is a run_finished: how the run (or its
  /// attempt that it ends) ended.
  [[nodiscard]] const std::optional<Event>& last_finish() const noexcept { return last_finish_; }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
  std::string path_;
  serve::FollowedFile file_;
  std::optional<std::uint64_t> last_seq_; // the highest seq handed out
  std::optional<Event> last_finish_;
};

/// "2025-03-01 14:22:33": an event's time in local time.
[[nodiscard]] std::string event_time(const Event& e);

} // namespace chorus::cli
