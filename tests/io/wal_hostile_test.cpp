// The WAL reader on files made to hurt it: headers planted to make a resync
// quadratic, a link where the log belongs, a FIFO that would block the reader.
#define BOOST_TEST_MODULE io_wal_hostile
#include <boost/test/unit_test.hpp>

#include "io/platform/crc32c.hpp"
#include "io/store/wal.hpp"
#include "tests/io/files.hpp"
#include "tests/temp_dir.hpp"
#include "tests/io/wal_read.hpp"

#include <cstring>
#include <random>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace chorus;
using namespace chorus::platform;
using namespace chorus::store;
using chorus::test::files::slurp;
using chorus::test::files::spit;
using chorus::test::files::read_all;
using chorus::test::TempDir;

namespace {

void put_u32(std::string& s, std::size_t at, std::uint32_t v) { std::memcpy(s.data() + at, &v, 4); }

std::string frame(const std::string& payload) {
  std::string f(wal_header_size, '\0');
  put_u32(f, 0, wal_magic);
  put_u32(f, 4, static_cast<std::uint32_t>(payload.size()));
  put_u32(f, 8, crc32c(payload.data(), payload.size(), crc32c(f.data() + 4, 4)));
  return f + payload;
}

// A header every 8 bytes over `n` bytes, each claiming a payload that reaches
// `reach` bytes past the region (so each overlaps all that follow it), with
// a CRC field that is the next header's magic.
std::string planted(std::size_t n, std::size_t reach) {
  std::string s(n, '\0');
  for (std::size_t at = 0; at + 8 <= n; at += 8) {
    put_u32(s, at, wal_magic);
    put_u32(s, at + 4, static_cast<std::uint32_t>(n - at - wal_header_size + reach));
  }
  return s;
}

// The frames a reader must find, found the plain way: every candidate's
// whole claimed frame summed.
std::vector<std::uint64_t> reference_offsets(const std::string& b) {
  auto good = [&](std::size_t p, std::uint32_t& len) {
    if (b.size() - p < wal_header_size) return false;
    std::uint32_t magic, crc;
    std::memcpy(&magic, b.data() + p, 4);
    std::memcpy(&len, b.data() + p + 4, 4);
    std::memcpy(&crc, b.data() + p + 8, 4);
    if (magic != wal_magic || len > wal_max_payload || wal_header_size + len > b.size() - p) return false;
    return crc32c(b.data() + p + wal_header_size, len, crc32c(b.data() + p + 4, 4)) == crc;
  };
  std::vector<std::uint64_t> out;
  for (std::size_t p = 0; p < b.size();) {
    std::uint32_t len = 0;
    if (good(p, len)) {
      out.push_back(p);
      p += wal_header_size + len;
    } else {
      ++p;
    }
  }
  return out;
}

// Turns a hang on a FIFO into a failure instead of a test that never ends.
struct Deadline {
  explicit Deadline(unsigned s) { ::alarm(s); }
  ~Deadline() { ::alarm(0); }
};

} // namespace

BOOST_AUTO_TEST_CASE(planted_headers_are_scanned_in_linear_work) {
  TempDir dir;
  const std::string path = dir / "wal";
  const std::size_t n = 4u << 20;
  const std::string last = frame("the frame after the damage");
  // Each planted header claims a payload that covers the good frame after it.
  spit(path, frame("first") + planted(n, last.size()) + last);
  const auto r = read_all(path);
  BOOST_TEST(r.scan.frames == 2u);
  BOOST_TEST(r.payloads.back() == "the frame after the damage");
  BOOST_TEST(r.scan.corrupt_regions == 1u);
  BOOST_TEST(!r.scan.torn_tail);
  // Summing each candidate's claimed payload would be about n * n / 16 bytes.
  const auto size = static_cast<std::uint64_t>(slurp(path).size());
  BOOST_TEST(r.scan.summed_bytes <= 64 * size);
}

BOOST_AUTO_TEST_CASE(a_planted_torn_tail_is_cut_in_linear_work) {
  TempDir dir;
  const std::string path = dir / "wal";
  const std::string first = frame("first");
  spit(path, first + planted(4u << 20, 0));
  const Result<WalScan> cut = truncate_torn_tail(path);
  BOOST_REQUIRE_MESSAGE(cut, cut.error().message());
  const WalScan& s = *cut;
  BOOST_TEST(s.torn_tail);
  BOOST_TEST(s.good_end == first.size());
  BOOST_TEST(s.summed_bytes <= 64 * (first.size() + (4u << 20)));
  BOOST_TEST(slurp(path) == first);
}

BOOST_AUTO_TEST_CASE(good_frames_between_long_bad_ones_cost_linear_work) {
  // Each bad frame claims a payload to the end of the file: checked one by
  // one, they would sum the rest of the file once each.
  std::string b;
  const std::size_t pairs = 20000;
  for (std::size_t i = 0; i < pairs; ++i) b += frame("g" + std::to_string(i)) + std::string(wal_header_size, '\0');
  for (std::size_t i = 0, at = 0; i < pairs; ++i) {
    at += frame("g" + std::to_string(i)).size();
    put_u32(b, at, wal_magic);
    put_u32(b, at + 4, static_cast<std::uint32_t>(b.size() - at - wal_header_size));
    at += wal_header_size;
  }
  TempDir dir;
  spit(dir / "wal", b);
  const auto r = read_all(dir / "wal");
  BOOST_TEST(r.scan.frames == pairs);
  BOOST_TEST(r.scan.summed_bytes <= 64 * b.size());
}

BOOST_AUTO_TEST_CASE(resync_finds_what_a_plain_scan_finds) {
  std::mt19937_64 rng(std::random_device{}());
  TempDir dir;
  for (int round = 0; round < 200; ++round) {
    std::string b;
    while (b.size() < 20000) {
      switch (rng() % 4) {
      case 0: b += frame(std::string(rng() % 900, static_cast<char>(rng()))); break;
      case 1: b += planted(8 * (1 + rng() % 40), rng() % 3000); break;
      case 2: b += std::string(rng() % 50, static_cast<char>(0xF5)); break;
      default: {
        std::string f = frame(std::string(1 + rng() % 600, 'x'));
        f[rng() % f.size()] ^= static_cast<char>(1 + rng() % 255);
        b += f;
      }
      }
    }
    spit(dir / "wal", b);
    const auto r = read_all(dir / "wal");
    BOOST_TEST_CONTEXT("round " << round) { BOOST_TEST(r.offsets == reference_offsets(b)); }
  }
}

BOOST_AUTO_TEST_CASE(a_linked_wal_is_refused_and_its_target_left_alone) {
  TempDir dir;
  const std::string outside = dir / "precious", wal = dir / "wal";
  spit(outside, frame("a") + std::string(3000, 'x'));
  BOOST_REQUIRE(::symlink(outside.c_str(), wal.c_str()) == 0);
  for (const Error& e : {truncate_torn_tail(wal).error(), scan_wal(wal, {}).error(), WalWriter::open(wal).error()})
    BOOST_TEST(e.message().find("symbolic link") != std::string::npos, e.message());
  BOOST_TEST(slurp(outside).size() == frame("a").size() + 3000);
}

BOOST_AUTO_TEST_CASE(a_fifo_wal_is_refused_without_blocking) {
  TempDir dir;
  const std::string wal = dir / "wal";
  BOOST_REQUIRE(::mkfifo(wal.c_str(), 0600) == 0);
  const Deadline deadline(30);
  for (const Error& e : {scan_wal(wal, {}).error(), truncate_torn_tail(wal).error(), WalWriter::open(wal).error()})
    BOOST_TEST(e.message().find("not a regular file (a FIFO)") != std::string::npos, e.message());
}
