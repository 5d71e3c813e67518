// The "system" section of `chorus show`: what a run's machines did, from the
// system.jsonl lines its ranks' SystemMonitors wrote.
#pragma once

#include "cli/run_info.hpp"

#include <string>

namespace chorus::cli {

/// A table of the nodes and one of the ranks (with a sparkline of each rank's
/// GPU use, else CPU use, where `width` leaves room), lines clipped to `width`.
std::string system_section(const RunInfo& r, int width, bool ascii);

} // namespace chorus::cli
