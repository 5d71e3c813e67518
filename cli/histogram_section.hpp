// The "histograms" section of `chorus show`: a line per histogram column of
// a run's histograms.jsonl, its last step's figures and its quantiles over
// the steps.
#pragma once

#include "cli/run_info.hpp"
#include "cli/series.hpp"

#include <string>

namespace chorus::cli {

/// A line per column (`key`, or `key/rank-N`) that `wanted` takes (null:
/// all): its steps, the last step's count, min, median and max, and
/// sparklines of its median and of its 5th to 95th percentile spread over
/// the steps; lines clipped to `width`. Damaged lines are counted and the
/// first named. "" for a run without histograms.jsonl, or none of whose
/// columns `wanted` takes.
std::string histogram_section(const RunInfo& r, const KeyFilter& wanted, int width, bool ascii);

} // namespace chorus::cli
