// The JSON-lines reader and the history's series on any bytes, as `chorus
// show` reads history.jsonl.
#include "cli/series.hpp"
#include "fuzz/input_file.hpp"
#include "io/store/json_lines.hpp"

using namespace chorus;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = fuzz::write_input("history.jsonl", data, size);
  const cli::History h = cli::read_history(path, [](std::string_view) { return true; });
  if (h.problem) std::abort(); // a regular file under the line bound always reads
  return 0;
}
