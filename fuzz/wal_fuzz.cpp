// The WAL reader on any bytes: it delivers exactly the frames a plain scan
// (every candidate's whole claimed frame summed) finds, every delivered
// payload verifies, its work stays linear, and cutting a torn tail leaves a
// log that scans clean.
#include "fuzz/input_file.hpp"
#include "fuzz/seeds.hpp"
#include "io/crc32c.hpp"
#include "io/wal.hpp"

#include <cstring>
#include <iterator>
#include <vector>

using namespace chorus;

namespace {

bool verifies(const std::uint8_t* b, std::size_t size, std::size_t p, std::uint32_t& len) {
  if (size - p < io::wal_header_size) return false;
  std::uint32_t magic, crc;
  std::memcpy(&magic, b + p, 4);
  std::memcpy(&len, b + p + 4, 4);
  std::memcpy(&crc, b + p + 8, 4);
  if (magic != io::wal_magic || len > io::wal_max_payload || io::wal_header_size + len > size - p) return false;
  return io::crc32c(b + p + io::wal_header_size, len, io::crc32c(b + p + 4, 4)) == crc;
}

std::vector<std::uint64_t> plain_scan(const std::uint8_t* b, std::size_t size) {
  std::vector<std::uint64_t> out;
  for (std::size_t p = 0; p < size;) {
    std::uint32_t len = 0;
    if (verifies(b, size, p, len)) {
      out.push_back(p);
      p += io::wal_header_size + len;
    } else {
      ++p;
    }
  }
  return out;
}

} // namespace

// Seeds: a whole log, the same with a torn tail, and with a flipped bit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (std::getenv("CHORUS_FUZZ_SEEDS") == nullptr) return 0;
  const std::string path = fuzz::scratch_dir() + "/seed-wal";
  {
    Error err;
    auto w = io::WalWriter::open(path, err);
    if (!w) std::abort();
    for (const auto& f : fuzz::sample_frames())
      if (w->append(f)) std::abort();
  }
  std::ifstream in(path, std::ios::binary);
  const std::string whole{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::string flipped = whole;
  flipped[flipped.size() / 2] ^= 0x10;
  fuzz::write_seeds_if_asked({whole, whole.substr(0, whole.size() - 5), flipped});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = fuzz::write_input("wal", data, size);
  std::vector<std::uint64_t> offsets;
  Error err;
  const io::WalScan s = io::scan_wal(
      path,
      [&](std::span<const char> payload, std::uint64_t off) {
        std::uint32_t len = 0;
        if (!verifies(data, size, off, len) || len != payload.size() ||
            std::memcmp(payload.data(), data + off + io::wal_header_size, len) != 0)
          std::abort();
        offsets.push_back(off);
      },
      err);
  if (err) std::abort();
  if (offsets != plain_scan(data, size) || s.good_end > size || s.summed_bytes > 64 * size + 4096) std::abort();
  if (io::truncate_torn_tail(path)) std::abort();
  Error again;
  const io::WalScan cut = io::scan_wal(path, {}, again);
  if (again || cut.torn_tail || cut.frames != s.frames) std::abort();
  return 0;
}
