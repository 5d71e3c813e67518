// chorus serve's reading of a history.jsonl (cli/serve/lines_*.cpp) on any
// bytes, as a server finds a damaged or foreign file in a run directory:
// the overview of a long file and the charts' keys read from the whole file
// while its index is held back (RowReader::read_only, or the writer's block
// summary beside it: io/store/history_blocks.hpp), then the index itself,
// in one piece or two, each asked what a page asks. The input is the
// history, and after its first NUL byte (where it has one) the summary.
#include "cli/serve/lines_index.hpp"
#include "io/store/history_blocks.hpp"
#include "fuzz/input_file.hpp"
#include "fuzz/seeds.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace chorus;
using cli::serve::FileKind;
using cli::serve::LinesIndex;
using cli::serve::SeriesRequest;
using cli::serve::XAxis;

namespace {

constexpr std::uint64_t never = ~std::uint64_t{0};

/// What a page asks: the charts' keys (metric keys alone, and with the keys
/// the index adds, which the file is read whole for), against each x.
void ask(const LinesIndex& index, bool exact, std::string& out) {
  const std::vector<std::vector<std::string>> asked = {{"loss", "acc/rank-1", "odd"}, {"loss", "_count/min", "_step"}};
  for (const XAxis x : {XAxis::step, XAxis::wall, XAxis::rel})
    for (const std::vector<std::string>& keys : asked)
      for (const std::size_t width : {std::size_t{1}, std::size_t{50}}) { // 1: a summary's blocks serve from 1,024 rows
        SeriesRequest r{keys, x, std::nullopt, std::nullopt, width};
        r.exact = exact;
        index.series_json(r, out);
      }
  index.series_json({{"loss"}, XAxis::step, 2.0, 40.0, 1000}, out);
  index.series_json({{"loss"}, XAxis::step, std::nullopt, std::nullopt, 20, "acc/rank-1"}, out);
  index.keys_json(out);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string rows;
  for (int s = 0; s < 40; ++s)
    rows += "{\"_step\":" + std::to_string(s) + ",\"_timestamp\":1.7e9,\"_runtime\":" + std::to_string(s) +
            ",\"loss\":" + std::to_string(1.0 / (s + 1)) + (s % 3 ? ",\"acc/rank-1\":0.5" : "") +
            (s == 7 ? ",\"odd\":\"NaN\"" : "") + ",\"_count\":{\"loss\":2}}\n";
  // A history of 1,100 rows with its summary, as chorus's writer leaves them (one block of 1,024 rows claimed).
  std::string long_rows, summary;
  for (int s = 0; s < 1100; ++s) {
    if (s == 1024) summary = R"({"rows":[0,1024],"bytes":[0,)" + std::to_string(long_rows.size()) +
                             R"(],"steps":[0,1023],"keys":{"loss":[1023,0.5,3,9.5,900,0,1,1023,2]},)"
                             R"("nonfinite":{"loss":[1,77,77,0,-1,-1,0,-1,-1]}})" "\n";
    long_rows += "{\"_step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(s % 10) + "}\n";
  }
  fuzz::write_seeds_if_asked(
      {long_rows + std::string(1, '\0') + summary, rows,
       "{\"_step\":0,\"d\\u0065nse\":1,\"c\\/rank-2\":2}\n{\"\\u005fstep\":1,\"loss\":-0}\n"
       "{\"_stepx\":1,\"_step\":2,\"_timestampz\":\"a\",\"_count\":{\"_step\":2},\"loss\":18446744073709551615}\n"
       "{\"_step\":3,\"loss\":18446744073709551616}\n{\"_step\":4,\"_runtime\":fals,\"loss\":1}\n"
       "{\"_step\":5.0,\"loss\":1}\n{\"_step\":6,\"loss\":1e400}\n{\"_step\":7,\"loss\":1}x\n{\"_step\":8,\"loss\":"});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::size_t nul = std::find(data, data + size, std::uint8_t{0}) - data;
  const std::string path = fuzz::write_input("history.jsonl", data, nul);
  if (nul < size)
    (void)fuzz::write_input(store::history_blocks_file, data + nul + 1, size - nul - 1);
  else
    std::remove((fuzz::scratch_dir() + "/" + store::history_blocks_file).c_str());
  // One piece or two, by the input's length.
  const unsigned pieces = 1 + size % 2;
  std::string out;
  {
    // An overview from 64 bytes on, its index held back (and stopped unread as it goes).
    LinesIndex held(path, FileKind::history, 256, pieces, 64);
    held.hold_indexing(true);
    held.refresh();
    ask(held, /*exact=*/true, out);
  }
  // The index itself, read at once (in pieces from 256 bytes on).
  LinesIndex index(path, FileKind::history, 256, pieces, never);
  index.refresh();
  ask(index, /*exact=*/false, out);
  return 0;
}
