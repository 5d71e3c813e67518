// `chorus launch`: what the command line asks for, and the environment each
// rank gets from it.
#pragma once

#include "runtime/core/result.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace chorus::cli {

/// What launch does when a run it started tells that a rank stalled (its
/// events.jsonl's `stalled`): nothing (wait), or stop the job (kill).
enum class OnStall { wait, kill };

/// Launch's exit code where --on-stall=kill stopped the job.
inline constexpr int exit_stalled = 124;

struct LaunchArgs {
  int nproc = 0;   // ranks on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0; // resolved before the ranks start
  std::string run_id;  // resolved before the ranks start
  bool prefix = true;
  bool fail_fast = false;
  OnStall on_stall = OnStall::wait;
  double grace_s = 10.0;
  std::vector<std::string> program;
  /// Where run hosts among the ranks note their run directories
  /// (CHORUS_LAUNCH_RUNS), so that launch can record the exit codes there.
  std::string runs_file;
  /// Where launch notes each rank that exited, "RANK CODE" a line
  /// (CHORUS_LAUNCH_EXITS): a rank still dialing its run host stops once the
  /// host's rank is there, instead of waiting out init_timeout.
  std::string exits_file;
  /// The job's secret (CHORUS_JOB_SECRET), which every join of its ranks
  /// carries: the caller's, else one made for a job of one node.
  std::string job_secret;
};

/// The environment of local rank `local_rank`: this process's own, with
/// torchrun's variables set (replacing any inherited values).
std::vector<std::string> rank_environment(const LaunchArgs& args, int local_rank);

/// The first stop signal launch got and passed on to the ranks (0: none),
/// and when it came (unix microseconds); or the SIGTERM launch sent them
/// itself when a rank stalled (--on-stall=kill), `reason` saying so.
struct StopSignal {
  int signal = 0;
  std::int64_t at_us = 0;
  std::string reason; // "": a signal launch got
};

/// Starts the ranks, relays their output and signals, and waits for them.
/// With --on-stall=kill it follows the events.jsonl of every run the ranks
/// note in `runs_file`, and stops the job at a stalled rank.
/// Returns the worst rank's exit code (128 + signal for a signal death;
/// exit_stalled where it stopped the job at a stall);
/// `codes`, if given, receives each rank's code by local rank; `stop`, the
/// stop signal.
int run_ranks(const LaunchArgs& args, std::vector<int>* codes = nullptr, StopSignal* stop = nullptr);

/// Adds "exit_codes": {"<global rank>": code, ...} to DIR/run.json (the
/// ranks launch started, or only `only_rank` for a per-rank run); an error
/// where run.json cannot be read, is damaged or cannot be written.
[[nodiscard]] Error record_exit_codes(const std::string& dir, const LaunchArgs& args, const std::vector<int>& codes,
                        std::optional<int> only_rank = std::nullopt);

} // namespace chorus::cli
