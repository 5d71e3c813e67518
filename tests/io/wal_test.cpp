#define BOOST_TEST_MODULE io_wal
#include <boost/test/unit_test.hpp>

#include "io/store/wal.hpp"
#include "tests/temp_dir.hpp"
#include "tests/io/wal_read.hpp"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace chorus;
using namespace chorus::store;

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)
using chorus::test::files::Read;
using chorus::test::files::read_all;
using chorus::test::slurp;
using chorus::test::TempDir;

namespace {

std::span<const char> as_span(const std::string& s) { return {s.data(), s.size()}; }

std::string random_payload(std::mt19937_64& rng, std::size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  // Plant the magic now and then so a resync has false starts to reject.
  if (n >= 8 && rng() % 4 == 0) std::memcpy(s.data() + rng() % (n - 3), &wal_magic, 4);
  return s;
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A writer on `path`, which must open.
std::unique_ptr<WalWriter> open_writer(const std::string& path) {
  auto w = WalWriter::open(path);
  BOOST_REQUIRE_MESSAGE(w, w.error().message());
  return std::move(*w);
}

// Writes `payloads` to a fresh WAL at `path`; returns each frame's offset.
std::vector<std::uint64_t> write_wal(const std::string& path, const std::vector<std::string>& payloads) {
  auto w = open_writer(path);
  std::vector<std::uint64_t> offsets;
  for (const auto& p : payloads) {
    offsets.push_back(w->size());
    const Error e = w->append(as_span(p));
    BOOST_REQUIRE_MESSAGE(!e, e.message());
  }
  return offsets;
}

std::vector<std::string> some_payloads(std::mt19937_64& rng, std::size_t n, std::size_t max_len) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(random_payload(rng, rng() % (max_len + 1)));
  return v;
}

} // namespace

BOOST_AUTO_TEST_CASE(round_trip_many_frames) {
  TempDir dir;
  const std::string path = dir / "wal";
  std::mt19937_64 rng(1);
  std::vector<std::string> payloads = some_payloads(rng, 500, 3000);
  payloads.insert(payloads.begin() + 10, std::string());
  payloads.insert(payloads.begin() + 20, random_payload(rng, 1u << 20));
  payloads.push_back(std::string());

  const mode_t old = ::umask(0);
  auto opened = WalWriter::open(path);
  ::umask(old);
  BOOST_REQUIRE_MESSAGE(opened, opened.error().message());
  auto& w = *opened;
  for (const auto& p : payloads) BOOST_REQUIRE(!w->append(as_span(p)));
  // append_many across more than one IOV_MAX chunk.
  std::vector<std::string> batch = some_payloads(rng, 1500, 100);
  batch[3].clear();
  std::vector<std::span<const char>> spans;
  for (const auto& p : batch) spans.push_back(as_span(p));
  BOOST_REQUIRE(!w->append_many(spans));
  BOOST_REQUIRE(!w->sync());
  payloads.insert(payloads.end(), batch.begin(), batch.end());

  struct stat st {};
  BOOST_REQUIRE(::stat(path.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 07777) == 0600u);
  BOOST_TEST(static_cast<std::uint64_t>(st.st_size) == w->size());

  const Read r = read_all(path);
  BOOST_TEST(r.scan.frames == payloads.size());
  BOOST_TEST(r.scan.good_end == w->size());
  BOOST_TEST(r.scan.corrupt_regions == 0u);
  BOOST_TEST(r.scan.skipped_bytes == 0u);
  BOOST_TEST(!r.scan.torn_tail);
  BOOST_TEST(r.scan.problems.empty());
  BOOST_REQUIRE(r.payloads.size() == payloads.size());
  for (std::size_t i = 0; i < payloads.size(); ++i) BOOST_TEST_REQUIRE(r.payloads[i] == payloads[i], "frame " << i);
  BOOST_TEST(r.offsets.front() == 0u);
}

BOOST_AUTO_TEST_CASE(frame_layout_is_as_documented) {
  TempDir dir;
  write_wal(dir / "wal", {"abc"});
  const std::string b = slurp(dir / "wal");
  BOOST_REQUIRE(b.size() == wal_header_size + 3);
  std::uint32_t magic, len;
  std::memcpy(&magic, b.data(), 4);
  std::memcpy(&len, b.data() + 4, 4);
  BOOST_TEST(magic == wal_magic);
  BOOST_TEST(len == 3u);
  BOOST_TEST(b.substr(12) == "abc");
}

BOOST_AUTO_TEST_CASE(torn_tail_at_every_byte_of_the_last_frame) {
  TempDir dir;
  const std::string path = dir / "wal";
  std::mt19937_64 rng(2);
  std::vector<std::string> payloads = some_payloads(rng, 6, 200);
  payloads.push_back(random_payload(rng, 300));
  const auto offsets = write_wal(path, payloads);
  const std::string full = slurp(path);
  const std::uint64_t last = offsets.back();

  for (std::uint64_t len = last; len < full.size(); ++len) {
    BOOST_TEST_CONTEXT("file cut to " << len << " of " << full.size() << " bytes") {
      spit(path, full.substr(0, len));
      const Read r = read_all(path);
      BOOST_TEST(r.scan.frames == payloads.size() - 1);
      BOOST_TEST(r.scan.good_end == last);
      BOOST_TEST(r.scan.torn_tail == (len > last));
      BOOST_TEST(r.scan.corrupt_regions == 0u);
      BOOST_TEST(r.scan.skipped_bytes == len - last);
      BOOST_REQUIRE(r.payloads.size() == payloads.size() - 1);
      for (std::size_t i = 0; i + 1 < payloads.size(); ++i) BOOST_TEST(r.payloads[i] == payloads[i]);

      const Result<WalScan> cut = truncate_torn_tail(path);
      BOOST_REQUIRE(cut);
      BOOST_TEST(cut->torn_tail == (len > last));
      BOOST_TEST(slurp(path).size() == last);
      const Read again = read_all(path);
      BOOST_TEST(!again.scan.torn_tail);
      BOOST_TEST(again.scan.frames == payloads.size() - 1);
    }
  }
}

BOOST_AUTO_TEST_CASE(flipped_bit_loses_one_frame) {
  TempDir dir;
  const std::string path = dir / "wal";
  std::mt19937_64 rng(3);
  std::vector<std::string> payloads = some_payloads(rng, 12, 400);
  payloads[5] = random_payload(rng, 200); // the victim: never empty
  const auto offsets = write_wal(path, payloads);
  const std::string clean = slurp(path);
  const std::uint64_t at = offsets[5];

  // Every bit of the header (magic, length, CRC), and bits of the payload.
  std::vector<std::uint64_t> bits;
  for (std::uint64_t b = 0; b < wal_header_size * 8; ++b) bits.push_back(at * 8 + b);
  for (std::uint64_t b : {0u, 7u, 100u, 1599u}) bits.push_back((at + wal_header_size) * 8 + b);

  for (const std::uint64_t bit : bits) {
    BOOST_TEST_CONTEXT("bit " << bit - at * 8 << " of frame 5") {
      std::string bad = clean;
      bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
      spit(path, bad);
      const Read r = read_all(path);
      BOOST_TEST(r.scan.frames == payloads.size() - 1);
      BOOST_TEST(r.scan.corrupt_regions == 1u);
      BOOST_TEST(!r.scan.torn_tail);
      BOOST_TEST(r.scan.skipped_bytes == offsets[6] - at);
      BOOST_TEST(r.scan.good_end == clean.size());
      BOOST_REQUIRE(r.scan.problems.size() == 1u);
      BOOST_TEST(r.scan.problems[0].find("offset " + std::to_string(at)) == 0u);
      std::vector<std::string> want = payloads;
      want.erase(want.begin() + 5);
      BOOST_TEST(r.payloads == want, boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(resync_past_a_large_damaged_frame) {
  TempDir dir;
  const std::string path = dir / "wal";
  std::mt19937_64 rng(4);
  std::vector<std::string> payloads = {"first", random_payload(rng, 3u << 20), "third", "fourth"};
  const auto offsets = write_wal(path, payloads);
  std::string bad = slurp(path);
  bad[offsets[1] + wal_header_size + 2'000'000] ^= 0x10;
  spit(path, bad);
  const Read r = read_all(path);
  BOOST_TEST(r.payloads == (std::vector<std::string>{"first", "third", "fourth"}), boost::test_tools::per_element());
  BOOST_TEST(r.scan.corrupt_regions == 1u);
}

BOOST_AUTO_TEST_CASE(reopen_after_torn_tail_appends_cleanly) {
  TempDir dir;
  const std::string path = dir / "wal";
  const auto offsets = write_wal(path, {"one", "two", "three"});
  const std::string full = slurp(path);
  spit(path, full.substr(0, full.size() - 2)); // the write of "three" was cut short

  auto w = open_writer(path);
  BOOST_TEST(w->size() == offsets[2]);
  BOOST_REQUIRE(!w->append(as_span(std::string("four"))));
  BOOST_REQUIRE(!w->append(as_span(std::string("five"))));
  const Read r = read_all(path);
  BOOST_TEST(r.payloads == (std::vector<std::string>{"one", "two", "four", "five"}), boost::test_tools::per_element());
  BOOST_TEST(!r.scan.torn_tail);
  BOOST_TEST(r.scan.corrupt_regions == 0u);
  BOOST_TEST(r.scan.good_end == w->size());
}

BOOST_AUTO_TEST_CASE(one_writer_at_a_time) {
  TempDir dir;
  auto first = open_writer(dir / "wal");
  auto second = WalWriter::open(dir / "wal");
  BOOST_TEST(!second);
  BOOST_TEST(second.error().code() == Errc::io_error);
  BOOST_TEST(second.error().message().find("another process") != std::string::npos);
  first.reset();
  auto third = WalWriter::open(dir / "wal");
  BOOST_TEST((third && *third != nullptr));
}

BOOST_AUTO_TEST_CASE(errors_name_the_path_and_a_fix) {
  auto w = WalWriter::open("/nonexistent-chorus-dir/wal");
  BOOST_TEST(!w);
  const Error err = w.error();
  BOOST_TEST(err.code() == Errc::io_error);
  BOOST_TEST(err.message().find("/nonexistent-chorus-dir/wal") != std::string::npos);
  BOOST_TEST(err.message().find("No such file") != std::string::npos);
  BOOST_TEST(scan_wal("/nonexistent-chorus-dir/wal", {}).error().code() == Errc::io_error);
}

BOOST_AUTO_TEST_CASE(oversized_payload_is_refused) {
  TempDir dir;
  auto w = open_writer(dir / "wal");
  // Address space only: the writer refuses before it reads a byte.
  const std::size_t n = std::size_t{wal_max_payload} + 1;
  void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  BOOST_REQUIRE(m != MAP_FAILED);
  const Error e = w->append(std::span<const char>(static_cast<const char*>(m), n));
  ::munmap(m, n);
  BOOST_TEST(e.code() == Errc::invalid_argument);
  BOOST_TEST(w->size() == 0u);
}

BOOST_AUTO_TEST_CASE(random_corruption_never_delivers_garbage) {
  std::uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("CHORUS_FUZZ_SEED")) seed = std::strtoull(s, nullptr, 10);
  BOOST_TEST_MESSAGE("fuzz seed " << seed << " (rerun with CHORUS_FUZZ_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::string path = dir / "wal";

  for (int round = 0; round < 300; ++round) {
    BOOST_TEST_CONTEXT("seed " << seed << " round " << round) {
      ::unlink(path.c_str());
      const std::vector<std::string> payloads = some_payloads(rng, 1 + rng() % 40, rng() % 2 ? 64 : 700);
      write_wal(path, payloads);
      std::string b = slurp(path);
      bool reordered = false;
      const int ops = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < ops && !b.empty(); ++k) {
        const std::size_t at = rng() % b.size();
        switch (rng() % 5) {
        case 0: // flipped bits
          for (int j = 0; j < 1 + static_cast<int>(rng() % 3); ++j) b[rng() % b.size()] ^= static_cast<char>(1 << (rng() % 8));
          break;
        case 1: // a stretch overwritten
          for (std::size_t j = at; j < std::min(b.size(), at + rng() % 64); ++j) b[j] = static_cast<char>(rng());
          break;
        case 2: // cut short
          b.resize(at);
          break;
        case 3: // garbage inserted
          b.insert(at, random_payload(rng, rng() % 40));
          break;
        case 4: // a stretch duplicated (a replayed write)
          b.insert(at, b.substr(rng() % b.size(), rng() % 200));
          reordered = true;
          break;
        }
      }
      spit(path, b);
      const Read r = read_all(path);
      const std::set<std::string> written(payloads.begin(), payloads.end());
      std::size_t next = 0; // without duplication, delivery keeps the written order
      for (const auto& p : r.payloads) {
        BOOST_TEST_REQUIRE(written.contains(p), "a payload that was never written was delivered");
        if (!reordered) {
          while (next < payloads.size() && payloads[next] != p) ++next;
          BOOST_TEST_REQUIRE(next < payloads.size(), "frames delivered out of order");
          ++next;
        }
      }
      BOOST_TEST(r.scan.frames == r.payloads.size());
      BOOST_TEST(r.scan.good_end <= b.size());

      // A writer reopened on the wreck appends after the last good frame.
      auto w = open_writer(path);
      BOOST_REQUIRE(!w->append(as_span(std::string("after"))));
      w.reset();
      const Read after = read_all(path);
      BOOST_TEST(!after.scan.torn_tail);
      BOOST_REQUIRE(!after.payloads.empty());
      BOOST_TEST(after.payloads.back() == "after");
      BOOST_TEST(after.payloads.size() == r.payloads.size() + 1);
    }
  }
}
