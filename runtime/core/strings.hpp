// Words chorus's messages share: lists of ranks, and signals by name.
#pragma once

#include <string>
#include <vector>

namespace chorus::core {

/// "rank 3" or "ranks 0-2, 5": short even for a thousand ranks (`ranks` in order).
[[nodiscard]] std::string rank_list(const std::vector<int>& ranks);

/// A signal's name: "SIGTERM" for 15, "signal 64" for one without a name here.
[[nodiscard]] std::string signal_name(int sig);

} // namespace chorus::core
