// The WAL reader on any bytes: it delivers exactly the frames a plain scan
// (every candidate's whole claimed frame summed) finds, every delivered
// payload verifies, its work stays linear, and cutting a torn tail leaves a
// log that scans clean.
#include "fuzz/input_file.hpp"
#include "fuzz/seeds.hpp"
#include "io/platform/crc32c.hpp"
#include "io/store/wal.hpp"

#include <cstring>
#include <vector>

using namespace chorus;

namespace {

bool verifies(const std::uint8_t* b, std::size_t size, std::size_t p, std::uint32_t& len) {
  if (size - p < store::wal_header_size) return false;
  std::uint32_t magic, crc;
  std::memcpy(&magic, b + p, 4);
  std::memcpy(&len, b + p + 4, 4);
  std::memcpy(&crc, b + p + 8, 4);
  if (magic != store::wal_magic || len > store::wal_max_payload || store::wal_header_size + len > size - p) return false;
  return platform::crc32c(b + p + store::wal_header_size, len, platform::crc32c(b + p + 4, 4)) == crc;
}

// A good frame around `payload`, as WalWriter writes it.
std::string frame(const std::string& payload) {
  std::string f(store::wal_header_size, '\0');
  const auto len = static_cast<std::uint32_t>(payload.size());
  std::memcpy(f.data(), &store::wal_magic, 4);
  std::memcpy(f.data() + 4, &len, 4);
  const std::uint32_t crc = platform::crc32c(payload.data(), payload.size(), platform::crc32c(f.data() + 4, 4));
  std::memcpy(f.data() + 8, &crc, 4);
  return f + payload;
}

std::vector<std::uint64_t> plain_scan(const std::uint8_t* b, std::size_t size) {
  std::vector<std::uint64_t> out;
  for (std::size_t p = 0; p < size;) {
    std::uint32_t len = 0;
    if (verifies(b, size, p, len)) {
      out.push_back(p);
      p += store::wal_header_size + len;
    } else {
      ++p;
    }
  }
  return out;
}

} // namespace

// The log to read from the input. Its first byte picks how: odd, the rest is
// the log as is; even, the rest is a recipe of pieces, each a byte (its kind
// and length) and its bytes: a good frame made of them, the bytes raw, or a
// header planted to claim them and more, so that good frames, damage and
// false starts nest in ways random bytes rarely reach (a CRC is hard to guess).
std::string log_of(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return {};
  const char* p = reinterpret_cast<const char*>(data) + 1;
  if (data[0] & 1u) return std::string(p, size - 1);
  std::string out;
  for (std::size_t at = 1; at < size;) {
    const std::uint8_t op = data[at++];
    const std::size_t n = std::min<std::size_t>(op >> 2, size - at);
    const std::string bytes(reinterpret_cast<const char*>(data) + at, n);
    at += n;
    switch (op & 3u) {
    case 0: out += frame(bytes); break;
    case 1: out += bytes; break;
    default: {
      std::string h = frame(bytes).substr(0, store::wal_header_size);
      const std::uint32_t claim = static_cast<std::uint32_t>(n) * ((op & 1u) ? 7u : 1u) + (op & 2u);
      std::memcpy(h.data() + 4, &claim, 4);
      out += h + bytes;
    }
    }
  }
  return out;
}

// Seeds: a whole log, the same with a torn tail and with a flipped bit (as
// logs), and a recipe.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (std::getenv("CHORUS_FUZZ_SEEDS") == nullptr) return 0;
  std::string whole;
  for (const auto& f : fuzz::sample_frames()) whole += frame(std::string(f.data(), f.size()));
  std::string flipped = whole;
  flipped[flipped.size() / 2] ^= 0x10;
  std::string recipe(1, '\0');
  for (std::uint8_t op : {0x40, 0x21, 0x32, 0x40, 0x13, 0x40})
    recipe += static_cast<char>(op) + std::string(op >> 2, static_cast<char>(0xF5 ^ op));
  fuzz::write_seeds_if_asked({"\x01" + whole, "\x01" + whole.substr(0, whole.size() - 5), "\x01" + flipped, recipe});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* input, std::size_t input_size) {
  const std::string log = log_of(input, input_size);
  const auto* data = reinterpret_cast<const std::uint8_t*>(log.data());
  const std::size_t size = log.size();
  const std::string path = fuzz::write_input("wal", data, size);
  std::vector<std::uint64_t> offsets;
  const Result<store::WalScan> scanned = store::scan_wal(
      path,
      [&](std::span<const char> payload, std::uint64_t off) {
        std::uint32_t len = 0;
        if (!verifies(data, size, off, len) || len != payload.size() ||
            std::memcmp(payload.data(), data + off + store::wal_header_size, len) != 0)
          std::abort();
        offsets.push_back(off);
      });
  if (!scanned) std::abort();
  const store::WalScan& s = *scanned;
  // Linear work: each byte summed once, plus at most two partial checkpoint
  // steps (2 x 255 bytes) for each candidate (a magic, so 4 bytes apart at
  // the closest) and each frame start (12 bytes apart).
  if (offsets != plain_scan(data, size) || s.good_end > size || s.summed_bytes > 192 * size + 4096) std::abort();
  if (!store::truncate_torn_tail(path)) std::abort();
  const Result<store::WalScan> cut = store::scan_wal(path, {});
  if (!cut || cut->torn_tail || cut->frames != s.frames) std::abort();
  return 0;
}
