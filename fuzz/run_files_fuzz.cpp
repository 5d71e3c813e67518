// run.json and group.json on any bytes, read as `chorus ls` and `show` read
// them. The first byte picks the file.
#include "cli/cli.hpp"
#include "cli/run_info.hpp"
#include "fuzz/input_file.hpp"
#include "io/store/group_file.hpp"

using namespace chorus;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool group = data[0] & 1u;
  (void)fuzz::write_input(group ? "group.json" : "run.json", data + 1, size - 1);
  if (group) {
    if (const auto g = store::read_group_file(fuzz::scratch_dir())) (void)store::group_json(*g); // what was read writes back
  } else {
    const cli::RunInfo r = cli::read_run(fuzz::scratch_dir());
    (void)r.shown_state();
    (void)r.crashed_ranks();
    // What show prints of its times (UBSan checks the casts).
    (void)cli::format_time(r.start_time.value_or(0));
    (void)cli::format_time(r.end_time.value_or(0));
    (void)cli::format_duration(r.duration().value_or(0));
  }
  return 0;
}
