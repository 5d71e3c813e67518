// What a command's RUN|GROUP argument names: a run's directory (or its
// run.json), a group's directory, or a group's name or a run id looked up
// under --dir; for `chorus show` and `chorus export`.
#pragma once

#include "runtime/core/result.hpp"

#include <string>

namespace chorus::cli {

/// Where a name leads: a run's directory, or a group's.
struct Located {
  std::string run, group;
};

/// Where `arg` leads: a run.json, a run or group directory, or a group's
/// name or a run id under `dir_option` (--dir; "": $CHORUS_DIR, else
/// ./chorus-runs).
[[nodiscard]] Result<Located> locate(const std::string& arg, const std::string& dir_option);

} // namespace chorus::cli
