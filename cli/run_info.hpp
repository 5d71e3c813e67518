// A run directory as `chorus ls` and `chorus show` read it: run.json,
// whether its host still lives, and where runs are found under a root.
#pragma once

#include "io/store/run_record.hpp"

#include <cstdint>
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
  /// last_step is the run's last committed step, not one the rank reported:
  /// run.json learns a rank's own only when it ends, so while it runs this
  /// is the best known (it may be ahead).
  bool committed = false;
};

/// Whether the process that hosts a "running" run is still there.
enum class HostLife {
  unknown, // cannot tell from this machine
  alive,   // a process holds the run's WAL lock
  gone,    // nobody holds it, on the machine that hosted the run: it crashed
};

/// A run as run.json has it (io::RunRecord), for the commands that show it:
/// `dir` is where it was found, `id` its directory's name where run.json has none.
struct RunInfo : io::RunIdentity {
  Error problem;       // set: run.json could not be read, and why
  std::optional<double> start_time, end_time; // unix seconds
  std::string state;
  std::optional<std::int64_t> world_size, rows, rejected;
  std::vector<RankInfo> ranks;
  /// (global rank, exit code) as `chorus launch` recorded them; empty if not.
  std::vector<std::pair<std::int64_t, std::int64_t>> exit_codes;
  HostLife host_life = HostLife::unknown; // meaningful while state is "running"
  /// The run's attempts, one a job that ran it (a resumed run has several).
  struct Segment {
    std::optional<double> start_time, end_time;
    std::string state;
  };
  std::vector<Segment> segments;

  [[nodiscard]] bool readable() const noexcept { return !problem; }
  /// run.json says running, but its host is gone: `chorus recover` applies.
  [[nodiscard]] bool host_crashed() const noexcept { return state == "running" && host_life == HostLife::gone; }
  [[nodiscard]] std::int64_t crashed_ranks() const;
  /// The state to show: "crashed?" for a running run whose host is gone.
  [[nodiscard]] std::string shown_state() const;
  /// Seconds from start to end (or to now while the host runs), if known.
  [[nodiscard]] std::optional<double> duration() const;
};

/// Reads DIR/run.json; never fails: a problem is kept in RunInfo::problem.
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
std::vector<RunGroup> find_runs(const std::string& root);

/// The run directories under `root` whose directory name is `id` or, when
/// none is, starts with it.
std::vector<std::string> find_run_by_id(const std::string& root, const std::string& id);

/// The directory `arg` names: itself if it is a directory, else the one run
/// under `root` with that id (or id prefix); an error naming the fix where
/// there is none, or several.
[[nodiscard]] Result<std::string> locate_run(const std::string& arg, const std::string& root);

} // namespace chorus::cli
