// A run directory as `chorus ls`, `show`, `serve`, `export` and `sync` read
// it: run.json, whether its host still lives, and where runs are found under
// a root.
#pragma once

#include "io/store/lease.hpp"
#include "io/store/run_record.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chorus::cli {

struct RankInfo {
  std::int64_t rank = 0;
  std::string state;
  std::int64_t last_step = -1;
  std::string host;
  std::string message;
  /// When the run host accepted its join in the last attempt (unix
  /// seconds, run.json's "joined"); none for a rank that never joined.
  std::optional<double> joined;
  /// last_step is the run's last committed step, not one the rank reported:
  /// run.json learns a rank's own only when it ends, so while it runs this
  /// is the best known (it may be ahead).
  bool committed = false;
};

/// A run as run.json has it (store::RunRecord), for the commands that show it:
/// `dir` is where it was found, `id` its directory's name where run.json has none.
/// What a reader reports goes through store::apply_liveness: a run whose host is
/// gone (io/store/lease.hpp) reads crashed, and so do its ranks that were
/// running, at the run's last committed step.
struct RunInfo : store::RunIdentity {
  Error problem;       // set: run.json could not be read, and why
  std::optional<double> start_time, end_time; // unix seconds
  /// As run.json records it ("running" for a run whose host is gone): what
  /// `chorus launch` decides on, and what `chorus recover` would rewrite.
  /// reported_state() is what the readers show.
  std::string state;
  std::optional<std::int64_t> world_size, rows, rejected;
  std::vector<RankInfo> ranks; // as reported
  /// (global rank, exit code) as `chorus launch` recorded them; empty if not.
  std::vector<std::pair<std::int64_t, std::int64_t>> exit_codes;
  /// Whether its host lives, and how it is known to be gone (run.json's
  /// "running" only; store::host_liveness).
  store::Liveness liveness;
  /// run.json's error, or why a run whose host is gone reads crashed.
  std::optional<std::string> error;
  /// The run's attempts, one a job that ran it (a resumed run has several).
  struct Segment {
    std::optional<double> start_time, end_time;
    std::string state;
  };
  std::vector<Segment> segments;

  [[nodiscard]] bool readable() const noexcept { return !problem; }
  /// run.json says running, but its host is gone: the run crashed, and
  /// `chorus recover` rebuilds its files.
  [[nodiscard]] bool host_lost() const noexcept { return state == "running" && liveness.life == store::HostLife::gone; }
  /// The state every reader reports: "crashed" for a run whose host is lost, else run.json's.
  [[nodiscard]] std::string reported_state() const { return host_lost() ? "crashed" : state; }
  [[nodiscard]] std::int64_t crashed_ranks() const;
  /// The state to show: reported_state(), with its attempts where there are several.
  [[nodiscard]] std::string shown_state() const;
  /// Seconds from start to end (or to now while the host runs), if known.
  [[nodiscard]] std::optional<double> duration() const;
};

/// Reads DIR/run.json and, where it says running, whether its host lives
/// (store::apply_liveness); never fails: a problem is kept in RunInfo::problem.
RunInfo read_run(const std::string& dir);

/// True if `dir` looks like a run directory (it holds run.json or a WAL).
bool is_run_dir(const std::string& dir);

/// Runs under a root, grouped as the root lays them out: ROOT/PROJECT/GROUP/RUN
/// (and ROOT/PROJECT/RUN for runs without a group).
struct RunGroup {
  std::string project;
  std::string group; // empty: runs directly under the project
  std::vector<std::string> run_dirs;
  std::string dir;   // the group's directory (empty for runs directly under the project)
};
/// `look`, where given, is called with every directory looked into or at on
/// the way, before it is read: the root, its projects, their groups, and the
/// directories below those (runs, and those not yet runs), so that a caller
/// can tell from their times, taken then, whether another look would find
/// anything new (a run's files are replaced by rename, which changes its
/// directory's time), or watch them from then on.
std::vector<RunGroup> find_runs(const std::string& root, const std::function<void(const std::string&)>& look = {});

/// The run directories under `root` whose directory name is `id` or, when
/// none is, starts with it.
std::vector<std::string> find_run_by_id(const std::string& root, const std::string& id);

/// The directory `arg` names: itself if it is a directory, else the one run
/// under `root` with that id (or id prefix); an error naming the fix where
/// there is none, or several.
[[nodiscard]] Result<std::string> locate_run(const std::string& arg, const std::string& root);

} // namespace chorus::cli
