// A kept index of `chorus serve` (cli/serve/lines_store.cpp) on any bytes, as
// a server opening a long history finds it in its index directory. The
// input is the file after its header: this target puts the header of the
// history it made in front (its identity and ends, so that the input is
// read on) and the hash after, so that the fuzzer reaches the keys, blocks
// and rows. A file taken is then asked what a page asks.
#include "cli/serve/index_store.hpp"
#include "cli/serve/lines_index.hpp"
#include "fuzz/input_file.hpp"
#include "fuzz/seeds.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sys/stat.h>

using namespace chorus;
using cli::serve::FileKind;
using cli::serve::IndexStore;
using cli::serve::LinesIndex;
using cli::serve::XAxis;

namespace {

constexpr std::uint64_t never = ~std::uint64_t{0};
/// The header's bytes: magic, version, byte order, kind, device, inode, bytes, two hashes.
constexpr std::size_t header = 8 + 4 + 4 + 1 + 5 * 8;

struct Made {
  std::string history, kept;
  std::shared_ptr<IndexStore> store;
  std::string head, body; // a real kept file of `history`: its header, and the rest without the hash
};

const Made& made() {
  static const Made m = [] {
    Made m;
    // The store takes absolute paths only ($TMPDIR may be relative).
    const std::string base = std::filesystem::absolute(fuzz::scratch_dir()).string();
    m.history = base + "/history.jsonl";
    std::ofstream h(m.history);
    for (int s = 0; s < 400; ++s)
      h << "{\"_step\":" << s << ",\"_timestamp\":" << 1.7e9 + s << ",\"_runtime\":" << s << ",\"loss\":" << 1.0 / (s + 1)
        << (s % 3 ? ",\"acc/rank-1\":0.5" : "") << (s == 7 ? ",\"odd\":\"NaN\"" : "") << ",\"_count\":{\"loss\":2}}\n";
    h.close();
    const std::string dir = base + "/kept";
    ::mkdir(dir.c_str(), 0700);
    m.store = std::make_shared<IndexStore>(dir, 1u << 30);
    m.kept = m.store->file_for(m.history, FileKind::history);
    {
      LinesIndex index(m.history, FileKind::history, never, 1, 1024);
      index.keep_in(m.store);
      index.refresh();
      for (int i = 0; i < 5000 && index.state().indexing; ++i) {
        ::usleep(1000);
        index.refresh();
      }
      m.store->flush();
    }
    std::ifstream in(m.kept, std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (file.size() < header + 8) { // the index was not kept: nothing to fuzz from
      std::fprintf(stderr, "fuzz_kept_index: no index was kept in %s (%s)\n", dir.c_str(), m.store->why().c_str());
      std::abort();
    }
    m.head = file.substr(0, header);
    m.body = file.substr(header, file.size() - header - 8);
    return m;
  }();
  return m;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::write_seeds_if_asked({made().body});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Made& m = made();
  std::string kept = m.head + std::string(reinterpret_cast<const char*>(data), size);
  const std::uint64_t sum = cli::serve::word_hash(kept);
  kept.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  {
    std::ofstream out(m.kept, std::ios::binary | std::ios::trunc);
    out << kept;
  }
  LinesIndex index(m.history, FileKind::history, never, 1, 1024);
  index.keep_in(m.store);
  index.hold_indexing(true); // refused: the overview answers, the index is not built
  index.refresh();
  if (index.state().indexing) return 0;
  // Taken: what a page asks of it.
  std::string out;
  index.keys_json(out);
  for (const XAxis x : {XAxis::step, XAxis::wall, XAxis::rel}) {
    index.series_json({{"loss", "acc/rank-1", "_count/min", "_step", "odd"}, x, std::nullopt, std::nullopt, 50}, out);
    index.series_json({{"loss", "acc/rank-1"}, x, 10.0, 60.0, 1000}, out);
  }
  index.series_json({{"loss"}, XAxis::step, std::nullopt, std::nullopt, 20, "acc/rank-1"}, out);
  (void)index.last_steps("acc");
  return 0;
}
