// What a run host does before its Run actor exists, and what it tells
// others about its run: the run's id and directory, the resume check, the
// WAL and its signal handlers, the identity of run.json, the line for
// `chorus launch`. Nothing here touches an actor.
#pragma once

#include "actors/run.hpp"
#include "runtime/core/options.hpp"
#include "runtime/core/result.hpp"

#include <memory>
#include <string>

namespace chorus::actors {

/// The run host of this process's run, with its directory made, checked
/// against Options::resume, and its WAL open: what spawn_run_actor takes.
/// `finish` receives how the run ended.
[[nodiscard]] Result<std::shared_ptr<RunHost>> prepare_run_host(const core::Settings& s, client::FinishState& finish);

/// Under `chorus launch`, tells it where this run lives (CHORUS_LAUNCH_RUNS),
/// so that it can add the ranks' exit codes to run.json once they exited.
void note_run_for_launcher(const core::Settings& s, const std::string& run_dir);

/// Where `chorus launch` started this rank: why the run host's process is
/// known to have exited (CHORUS_LAUNCH_EXITS), else "".
[[nodiscard]] std::string launched_host_exit(const core::Settings& s);

} // namespace chorus::actors
