// What the tests of `chorus serve`'s line index share: a history of many
// kinds of rows, a chart's answer without its whole-file counts, and the
// wait for an index built in the background.
#pragma once

#include "cli/serve/lines_index.hpp"

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

namespace chorus::test {

/// History rows [first, last): `dense` every row (NaN and infinities now and
/// then), `sparse` every 7th, a per-rank column for 3 ranks (rank 2 only on
/// even steps), `_count`, and a damaged line every 5,000 rows.
inline std::string history_rows(int first, int last) {
  std::string h;
  for (int s = first; s < last; ++s) {
    if (s % 5000 == 2500) h += s % 10000 == 2500 ? "{\"_step\": oops}\n" : "{\"no_step\": 1}\n";
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s * 0.5) +
         R"(,"_runtime":)" + std::to_string(s * 0.5) + R"(,"dense":)";
    h += s % 997 == 5 ? "\"NaN\"" : s % 1999 == 7 ? "\"-Infinity\"" : std::to_string(std::sin(s * 0.001) + (s % 13) * 0.01);
    if (s % 7 == 0) h += R"(,"sparse":)" + std::to_string(s * 0.25);
    for (int r = 0; r < 3; ++r)
      if (r < 2 || s % 2 == 0) h += ",\"c/rank-" + std::to_string(r) + "\":" + std::to_string(s + r);
    h += R"(,"_count":{"dense":)" + std::string(s % 2 == 0 ? "3" : "2") + "}}\n";
  }
  return h;
}

/// The answer's points from its "series" on, without each key's counts of
/// NaN and infinities over the whole file (the index's, not the range's).
inline std::string series_part(const cli::serve::LinesIndex& index, const cli::serve::SeriesRequest& r) {
  std::string out;
  index.series_json(r, out);
  const auto at = out.find("\"series\"");
  out = at == std::string::npos ? out : out.substr(at);
  for (std::size_t p; (p = out.find(",\"nan\":")) != std::string::npos;) {
    const std::size_t end = out.find('}', p);
    out.erase(p, end - p);
  }
  for (std::size_t p; (p = out.find(",\"missing\":true")) != std::string::npos;) out.erase(p, 15);
  return out;
}

/// Refreshes `index` until its background indexing is over (a minute at most).
inline void wait_indexed(cli::serve::LinesIndex& index) {
  for (int i = 0; i < 6000 && index.state().indexing; ++i) {
    index.refresh();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  index.refresh();
}

} // namespace chorus::test
