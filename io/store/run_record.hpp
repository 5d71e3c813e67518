// run.json, a run's record: who the run is (its host's identity object,
// which the WAL's run_start also carries) and how it went (rewritten by the
// RunWriter as ranks join and end, and by `chorus launch` with the ranks'
// exit codes). RunRecord is the only code that parses or serializes it;
// `chorus ls` and `show` (cli/run_info.cpp), the Uploader (io/upload/upload.cpp),
// log_artifact (io/store/artifacts.cpp), `chorus recover` and launch read it
// through here.
//
//   {"id":..,"name":..,"project":..,"group":..,"job_type":..,"notes":..,
//    "mode":..,"scope":..,"host":..,"pid":N,"dir":..,"launcher":..,"job_id":..,
//    "nodes":N, ["group_index":N,"rank":N,"node":N,]
//    "state":"finished","start_time":S,"end_time":S|null,
//    "segments":[{"start_time":S,"end_time":S|null,"state":..,["exit_codes":{..}]}],
//    ["exit_codes":{"RANK":CODE,..},] "world_size":N,"rows":N,"rejected":N,
//    ["lengths":{"history.jsonl":N,..},] ["error":..,] "ranks":[{"rank":N,"state":..,"last_step":N,"host":..,"message":..,["joined":S]}]}
//
// Times are unix seconds, written exactly to the microsecond; a rank's
// "joined" (when the run host accepted its join in the last attempt, absent
// for a rank that never joined) to the millisecond.
#pragma once

#include "runtime/core/result.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::store {

/// The exit codes `chorus launch` records for an attempt: (global rank,
/// code), in the order written.
using ExitCodes = std::vector<std::pair<std::int64_t, std::int64_t>>;

/// A finished run fails when a rank's process then exits non-zero: the run's
/// `error` for the first such rank of `codes`, or "" where every code is 0.
[[nodiscard]] std::string failure_of_exit_codes(const ExitCodes& codes);

/// The files of a run directory whose every line the WAL holds, which the
/// run's end writes without waiting for the disk where the WAL's sync makes
/// it durable (RunRecord::lengths): the line files, which only grow, and
/// the JSON files, which are replaced whole (`replaced`).
struct BackedFile {
  std::string_view name;
  bool replaced;
};
inline constexpr BackedFile backed_files[] = {
    {"history.jsonl", false}, {"histograms.jsonl", false}, {"media.jsonl", false}, {"rejected.jsonl", false},
    {"events.jsonl", false},  {"summary.json", true},      {"config.json", true},  {"metrics.json", true}};

/// The length in bytes of the regular file `name` in `run_dir` (a link is
/// not followed): none where there is no such file.
[[nodiscard]] std::optional<std::uint64_t> file_length(const std::string& run_dir, std::string_view name);

/// Who a run is, as its host knew it at the start: run.json's identity.
struct RunIdentity {
  std::string id, name, project, group, job_type, notes;
  std::string mode, scope; // as CHORUS_MODE and CHORUS_SCOPE spell them
  std::string host;        // the run host's machine
  std::int64_t pid = 0;    // and its process
  std::string dir;         // the run directory
  std::string launcher, job_id;
  std::int64_t nodes = 0;
  /// In a job of several runs: its place in the group, the global rank of
  /// its first place, its host's node. Absent otherwise.
  std::optional<std::int64_t> group_index, rank, node;

  bool operator==(const RunIdentity&) const = default;
};

/// The RunState spelled `name` as run.json and events.jsonl write it
/// (to_string(RunState)), if it is one: running, finished, failed, crashed or killed.
[[nodiscard]] std::optional<RunState> run_state_named(std::string_view name);

struct RunRecord : RunIdentity {
  // How it went.
  std::string state; // "running", "finished", "failed", "crashed", "killed"
  /// Unix microseconds: the first attempt's start, the last one's end (none while it runs).
  std::optional<std::int64_t> start_us, end_us;
  /// One attempt of the run (Options::resume runs it again).
  struct Segment {
    std::optional<std::int64_t> start_us, end_us;
    std::string state;
    std::optional<ExitCodes> exit_codes; // an earlier attempt's, as launch recorded them
    bool operator==(const Segment&) const = default;
  };
  std::vector<Segment> segments;
  /// The last attempt's exit codes, once launch has recorded them.
  std::optional<ExitCodes> exit_codes;
  std::optional<std::int64_t> world_size, rows, rejected;
  /// The files the WAL holds (backed_files) that the run's end left, and
  /// their lengths in bytes then: the live host's end writes them without
  /// waiting for the disk (its WAL's sync made the end durable;
  /// RunWriter::end_backed_by_wal), `chorus recover` and a host whose WAL
  /// failed sync them. A reader that finds one shorter (a crash of the
  /// machine cut it) says so and names `chorus recover`
  /// (store::apply_liveness). Written only once the run has ended.
  std::vector<std::pair<std::string, std::uint64_t>> lengths;
  /// Why the run failed, or what of its files could not be written.
  std::optional<std::string> error;
  struct Rank {
    std::int64_t rank = -1;
    std::string state;
    std::int64_t last_step = -1;
    std::string host, message;
    /// Unix microseconds: when the run host accepted the rank's join in the
    /// last attempt. Written to the millisecond (joined_ms).
    std::optional<std::int64_t> joined_us;
    bool operator==(const Rank&) const = default;
  };
  std::vector<Rank> ranks;

  /// Top-level members this version does not know (a later version's), as
  /// JSON text in the order met: written back after the identity.
  std::vector<std::pair<std::string, std::string>> unknown;

  /// What parse() met that no field can hold (a whole number beyond 64
  /// bits), the first of it: the file is damaged. "" if nothing.
  std::string damage;

  bool operator==(const RunRecord&) const = default;

  /// Parses run.json's text, or a run_start's identity object. A member of
  /// the wrong type is left at its default (a whole number beyond 64 bits is
  /// named in `damage`). Where `json` is not a JSON object, an
  /// Errc::invalid_argument whose message is a predicate for the text's
  /// name ("is not valid JSON (...): ...", "is not a JSON object").
  [[nodiscard]] static Result<RunRecord> parse(std::string_view json);

  /// Reads the run.json at `path`. Fails where it cannot be read
  /// (Errc::io_error, as platform::read_text says) or is damaged
  /// (Errc::invalid_argument, naming the file and `chorus recover`).
  [[nodiscard]] static Result<RunRecord> read(const std::string& path);

  /// Who the run is only: the identity, and the members not known here.
  [[nodiscard]] RunRecord identity() const;

  /// The identity object a run host records at the start (the WAL's
  /// run_start): the identity and start_time.
  [[nodiscard]] std::string identity_json() const;

  /// The whole of run.json, without its final newline.
  [[nodiscard]] std::string json() const;
  /// run.json's text as written: json() and a newline.
  [[nodiscard]] std::string text() const { return json() + '\n'; }

  /// Replaces the file at `path` with text(), atomically and,
  /// where `durable`, durably (write_file_atomic: a temporary file, fsync, rename).
  [[nodiscard]] Error write(const std::string& path, bool durable = true) const;

  /// `state` as a RunState, if it is one's spelling.
  [[nodiscard]] std::optional<RunState> run_state() const { return run_state_named(state); }

  /// Microseconds as unix seconds.
  [[nodiscard]] static double seconds(std::int64_t us) noexcept { return static_cast<double>(us) / 1e6; }

  /// Microseconds rounded to the nearest millisecond (halves away from
  /// zero), as a rank's "joined" is written.
  [[nodiscard]] static constexpr std::int64_t joined_ms(std::int64_t us) noexcept {
    const std::int64_t q = us / 1000, r = us % 1000; // r takes us's sign
    return (q + (r >= 500 ? 1 : 0) - (r <= -500 ? 1 : 0)) * 1000;
  }

private:
  /// identity_json(), or the `whole` of run.json.
  [[nodiscard]] std::string render(bool whole) const;

  /// The members always written (the identity's, "state", "end_time",
  /// "segments", "ranks") that the parsed text lacked, by their place in
  /// run_record.cpp's table: such a member is written back only once it has
  /// a value, so that a record read is written as it was.
  std::uint32_t lacking_ = 0;
};

} // namespace chorus::store
