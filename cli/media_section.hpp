// The "media" section of `chorus show`: what a run's media.jsonl holds (its
// images, text and tables), counted per column, with the path of each
// column's latest file.
#pragma once

#include "cli/run_info.hpp"
#include "cli/series.hpp"

#include <string>

namespace chorus::cli {

/// A line per column that `wanted` takes (null: all): the key, or
/// `key/rank-N` where more than one rank logged the key; its kind, how many
/// files over how many steps, their size, and the path (relative to the run
/// directory) of its last step's file; lines clipped to `width`. Damaged
/// lines are counted and the first named. "" for a run without media.jsonl,
/// or none of whose columns `wanted` takes.
std::string media_section(const RunInfo& r, const KeyFilter& wanted, int width);

} // namespace chorus::cli
