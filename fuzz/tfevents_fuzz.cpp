// The TensorBoard event-file scanner (io/upload/tensorboard_run.hpp's resume
// reads files an earlier writer left, whole or torn) on any bytes: it never
// fails on content, only on a file it cannot read; and a file made of a good
// writer's records followed by the input still counts every good record.
#include "fuzz/input_file.hpp"
#include "fuzz/seeds.hpp"
#include "io/upload/tfevents.hpp"

#include <filesystem>
#include <string>

using namespace chorus;

namespace {

/// The bytes of an events file TfEventsWriter writes: its file_version, 3
/// scalars of "loss" at steps 0..2 and a text at step 0.
const std::string& good_file() {
  static const std::string bytes = [] {
    const std::string dir = fuzz::scratch_dir() + "/good";
    std::filesystem::remove_all(dir);
    auto w = upload::TfEventsWriter::create(dir, 1.7e9);
    if (!w) std::abort();
    for (int s = 0; s < 3; ++s) (*w)->scalar("loss", s, 1.7e9 + s, 1.0 / (s + 1));
    (*w)->text("config", 0, 1.7e9, "| lr | 0.1 |");
    if ((*w)->close()) std::abort();
    std::ifstream in((*w)->path(), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  return bytes;
}

} // namespace

// Seeds: a whole file, the same torn and with a flipped bit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (std::getenv("CHORUS_FUZZ_SEEDS") == nullptr) return 0;
  const std::string whole = good_file();
  std::string flipped = whole;
  flipped[flipped.size() / 2] ^= 0x10;
  fuzz::write_seeds_if_asked({whole, whole.substr(0, whole.size() - 5), flipped});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* input, std::size_t size) {
  const std::string path = fuzz::write_input("tfevents", input, size);
  if (!upload::scan_events(path)) std::abort(); // content never makes it fail
  // A good writer's records, then the input: all four events of "loss" and
  // "config" are counted whatever follows.
  std::string both = good_file();
  both.append(reinterpret_cast<const char*>(input), size);
  const std::string joined = fuzz::write_input("tfevents-joined", reinterpret_cast<const std::uint8_t*>(both.data()),
                                               both.size());
  const auto tags = upload::scan_events(joined);
  if (!tags) std::abort();
  const auto loss = tags->find("loss");
  const auto config = tags->find("config");
  if (loss == tags->end() || loss->second.events < 3 || loss->second.max_step < 2) std::abort();
  if (config == tags->end() || config->second.events < 1) std::abort();
  return 0;
}
