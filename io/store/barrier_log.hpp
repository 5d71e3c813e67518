// barriers.jsonl: one line per released barrier of a run, with when each
// rank reached it and how long it waited there (README, "The run
// directory"). The Run actor times the barriers the merge releases and
// appends them through the RunWriter; `chorus serve` and `chorus show` read
// them back. The file is a diagnostic, not part of the WAL: a replay
// (resume, `chorus recover`) neither rewrites nor empties it, and a resumed
// run appends its own barriers after the earlier attempts'.
//
// A line:
//   {"name":"epoch-1","index":3,"step":1999,"opened":1700000000.25,
//    "released":1700000002.5,"error":null,
//    "ranks":[{"rank":0,"arrived":1700000000.25,"waited":2.25},
//             {"rank":1,"arrived":null,"waited":null}]}
// Times are unix seconds (exact decimal microseconds). `opened` is when the
// first rank reached the barrier; `step` the last step committed when it
// released (-1: none). Every rank that was live at the release is listed:
// one that never reached it (it hung, or died at the barrier's timeout) has
// `"arrived":null` and `"waited":null`, and `error` names it. Ranks that had
// finished or died before are left out.
#pragma once

#include "runtime/core/result.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::platform {
class AppendFile;
}

namespace chorus::store {

struct BarrierRank {
  int rank = 0;
  std::optional<std::int64_t> arrived_us; // unix microseconds; none: it never arrived
};

struct BarrierRecord {
  std::string name;
  std::uint64_t index = 0;
  std::int64_t step = -1;
  std::int64_t opened_us = 0, released_us = 0;
  std::string error; // empty: every live rank reached it and their names agreed
  std::vector<BarrierRank> ranks;

  /// How long `r` waited (microseconds), none where it never arrived.
  [[nodiscard]] std::optional<std::int64_t> waited_us(const BarrierRank& r) const {
    if (!r.arrived_us) return std::nullopt;
    return released_us - *r.arrived_us;
  }
};

/// The record's line, without its newline.
[[nodiscard]] std::string barrier_line(const BarrierRecord& r);
/// A line read back: the record, or why the line is none.
[[nodiscard]] Result<BarrierRecord> parse_barrier_line(std::string_view line);

/// What a run's barriers.jsonl holds, read in bounded memory: the last
/// `keep` records, and per rank totals over all of them.
struct BarrierSummary {
  struct Rank {
    int rank = 0;
    std::uint64_t barriers = 0;  // barriers it was listed at
    std::uint64_t absent = 0;    // of them, those it never reached
    std::uint64_t last = 0;      // those the others waited for it at: it came last, or never
    double waited_s = 0;         // its own waits, in seconds
    double caused_s = 0;         // the others' waits it caused: until it came, or the release where it never did
  };
  std::vector<BarrierRecord> records; // the last `keep`, in file order
  std::uint64_t total = 0;            // records read
  std::uint64_t failed = 0;           // of them, those released with an error (a timeout, ...)
  std::uint64_t skipped = 0;          // complete lines that are no record
  std::string first_skipped;          // "line N: why"
  std::vector<Rank> ranks;            // by rank
  bool missing = true;                // no barriers.jsonl (no barrier released yet)
  Error problem;                      // the file could not be read to its end
};

class BarrierLog {
public:
  static constexpr const char* file_name = "barriers.jsonl";

  /// The log of the run directory `dir`; the file is opened (created 0600,
  /// appended to) by the first append.
  explicit BarrierLog(std::string dir);
  ~BarrierLog();
  BarrierLog(const BarrierLog&) = delete;
  BarrierLog& operator=(const BarrierLog&) = delete;

  /// Appends one record (buffered until flush()).
  [[nodiscard]] Error append(const BarrierRecord& r);
  [[nodiscard]] Error flush();
  /// flush(), then fdatasync (where anything was written since the last).
  [[nodiscard]] Error sync();
  /// flush(), and sync()'s writes started (AppendFile::start_sync).
  [[nodiscard]] Error start_sync();

  /// Reads the barriers.jsonl of the run directory `dir`.
  [[nodiscard]] static BarrierSummary read(const std::string& dir, std::size_t keep = 1000);

private:
  std::string dir_;
  std::unique_ptr<platform::AppendFile> file_;
};

} // namespace chorus::store
