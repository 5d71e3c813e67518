// Rebuilding a run's readable files from its write-ahead log, for `chorus
// recover` and for `chorus launch` after a signal stopped a run's host.
#pragma once

#include "runtime/core/result.hpp"

#include <cstdint>
#include <string>

namespace chorus::cli {

struct RecoverOptions {
  bool dry_run = false;
  bool backup = true; // keep the replaced files as NAME.bak
  // How a run whose log stops before its end ended, and why its running ranks did.
  RunState unended = RunState::crashed;
  std::string unended_reason = "the run host died before this rank finished (marked by chorus recover)";
  /// When a stop signal went to the job (unix microseconds; 0: none): a rank
  /// that the host saw die at or after it is recorded as `unended` (killed),
  /// not crashed.
  std::int64_t stopped_at_us = 0;
};

/// Rebuilds the run in `dir`; returns the report of what it read and did, or
/// why it could not.
[[nodiscard]] Result<std::string> recover_run(const std::string& dir, const RecoverOptions& options);

} // namespace chorus::cli
