// The run host's lease (lease.json in the run directory): while a run is
// live its host renews the lease every lease_interval; a reader that finds
// run.json saying "running" with the lease older than lease_expiry (or, on
// the host's own machine, no process holding the run's WAL) knows the host
// is gone, and reports the run crashed. So no run reads "running" forever,
// on the host's node or on any node that sees the directory, without
// anyone running `chorus recover`. This file is the lease's one owner, and
// apply_liveness() the one place where a reader turns it into a state.
//
//   {"host":"node-1","pid":4242,"renewed":1764294000.123456,"interval":5,"expires":1764294030.123456}
//
// Times are unix seconds, written to the microsecond, on the host's clock:
// a reader on another node trusts its own clock to within lease_expiry.
#pragma once

#include "io/store/run_record.hpp"
#include "runtime/core/result.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::store {

/// How often the run host renews its lease, and how long a lease holds past
/// its renewal (six renewals missed).
inline constexpr std::chrono::seconds lease_interval{5};
inline constexpr std::chrono::seconds lease_expiry{30};

/// The lease's file in a run directory.
inline constexpr std::string_view lease_file = "lease.json";

struct Lease {
  std::string host;            // the run host's machine
  std::int64_t pid = 0;        // and its process
  std::int64_t renewed_us = 0; // unix microseconds
  std::int64_t expires_us = 0; // renewed_us + lease_expiry, as the host wrote it

  bool operator==(const Lease&) const = default;
};

/// The lease of a run host on this machine, renewed now (`now_us`).
[[nodiscard]] Lease lease_now(std::int64_t now_us);

/// Writes `lease` as run_dir/lease.json, replacing it atomically (a
/// temporary file and a rename; no fsync: a lease that a crash of the
/// machine loses has expired anyway).
[[nodiscard]] Error renew_lease(const std::string& run_dir, const Lease& lease);

/// The run ended (run.json says how): its lease goes.
void end_lease(const std::string& run_dir);

/// run_dir/lease.json: none where the file is absent (a run of an earlier
/// version, or one that ended); an error where it is damaged or unreadable.
[[nodiscard]] Result<std::optional<Lease>> read_lease(const std::string& run_dir);

/// Whether the process that hosts a run still lives, as far as this machine can tell.
enum class HostLife {
  unknown, // cannot tell from here (another machine, and no lease to go by)
  alive,   // a process holds the run's WAL lock, or its lease holds
  gone,    // its lease expired, or on its machine nobody holds its WAL lock
};

/// What a reader knows of a run's host: the WAL lock on the host's own
/// machine (from /proc/locks, never taking the lock), else its pid there,
/// else the lease, at `now_us`. `why` says how it is known to be gone (or,
/// where it is unknown, what kept the lease from telling: a damaged file).
/// A lease of another host or pid than run.json's is an earlier attempt's
/// (a resumed run whose new host has not renewed yet) and is not gone by.
struct Liveness {
  HostLife life = HostLife::unknown;
  std::string why;
  std::optional<Lease> lease; // the run's lease, where it has a readable one
  /// For a run that has ended: the files its end wrote that are shorter now
  /// than run.json records them (RunRecord::lengths), and how to rebuild
  /// them; "" where none is.
  std::string cut;
};
[[nodiscard]] Liveness host_liveness(const RunIdentity& run, const std::string& run_dir, std::int64_t now_us);

/// The run's last committed step: summary.json's `_step`, which the run
/// writer rewrites at every flush, read as a row's (store::HistoryRow); none
/// before the first row (or where the file cannot be read).
[[nodiscard]] std::optional<std::int64_t> last_committed_step(const std::string& run_dir);

/// run.json `r` (read from `run_dir`) as every reader reports it: where it
/// says "running" but its host is gone (host_liveness), the run, its last
/// attempt and each of its ranks still "running" read "crashed", the ranks
/// with a message naming the lost host and the run's last committed step
/// (summary.json's _step) where theirs is behind it; `error` (unless run.json
/// has one) says why, names that step and `chorus recover`; the end is the
/// lease's last renewal, where there is one. A run.json in any other state
/// is left as it is, except that where a file its end wrote is shorter than
/// run.json records it (Liveness::cut: the machine stopped before the file
/// reached its disk), `error` says which and names `chorus recover`. The
/// files are left as they are: `chorus recover` rebuilds them, and a command
/// that writes run.json back (`chorus launch`) reads it with
/// RunRecord::read, never through here.
/// Returns the liveness it went by (unknown, not asked, for a run not
/// "running", with `cut` filled in for one that ended).
Liveness apply_liveness(RunRecord& r, const std::string& run_dir, std::int64_t now_us);

/// RunRecord::read(run_dir + "/run.json"), then apply_liveness at the
/// current time; `liveness`, where given, takes what that went by.
[[nodiscard]] Result<RunRecord> read_run_record(const std::string& run_dir, Liveness* liveness = nullptr);

} // namespace chorus::store
