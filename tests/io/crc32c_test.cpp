#define BOOST_TEST_MODULE io_crc32c
#include <boost/test/unit_test.hpp>

#include "io/platform/crc32c.hpp"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

using namespace chorus::platform;

namespace {
std::vector<unsigned char> bytes(std::size_t n, int (*gen)(std::size_t)) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(gen(i));
  return v;
}
} // namespace

BOOST_AUTO_TEST_CASE(known_vectors) {
  // The check value of CRC-32C and the vectors of RFC 3720 (iSCSI), B.4.
  BOOST_TEST(crc32c("123456789", 9) == 0xE3069283u);
  BOOST_TEST(crc32c("", 0) == 0u);
  BOOST_TEST(crc32c(bytes(32, [](std::size_t) { return 0; }).data(), 32) == 0x8A9136AAu);
  BOOST_TEST(crc32c(bytes(32, [](std::size_t) { return 0xFF; }).data(), 32) == 0x62A8AB43u);
  BOOST_TEST(crc32c(bytes(32, [](std::size_t i) { return static_cast<int>(i); }).data(), 32) == 0x46DD794Eu);
  BOOST_TEST(crc32c(bytes(32, [](std::size_t i) { return static_cast<int>(31 - i); }).data(), 32) == 0x113FDB5Cu);
}

BOOST_AUTO_TEST_CASE(software_path_matches_vectors) {
  BOOST_TEST(detail::crc32c_software("123456789", 9, 0) == 0xE3069283u);
  const auto z = bytes(32, [](std::size_t) { return 0; });
  BOOST_TEST(detail::crc32c_software(z.data(), z.size(), 0) == 0x8A9136AAu);
}

BOOST_AUTO_TEST_CASE(masked_as_tensorboard) {
  BOOST_TEST(masked_crc32c("", 0) == 0xA282EAD8u);
  BOOST_TEST(masked_crc32c("123456789", 9) == 0xC78AB0E5u);
  const std::uint32_t c = 0xE3069283u;
  BOOST_TEST(mask_crc32c(c) == static_cast<std::uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

BOOST_AUTO_TEST_CASE(extends_across_every_split) {
  std::mt19937_64 rng(42);
  std::vector<unsigned char> data(300);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  const std::uint32_t whole = crc32c(data.data(), data.size());
  for (std::size_t cut = 0; cut <= data.size(); ++cut) {
    const std::uint32_t a = crc32c(data.data(), cut);
    BOOST_TEST(crc32c(data.data() + cut, data.size() - cut, a) == whole);
  }
}

BOOST_AUTO_TEST_CASE(software_and_hardware_agree) {
  if (!detail::crc32c_hardware_available()) {
    BOOST_TEST_MESSAGE("no SSE4.2 on this CPU: the hardware path is not tested");
    return;
  }
  std::mt19937_64 rng(7);
  std::vector<unsigned char> data(1 << 16);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  BOOST_TEST(detail::crc32c_hardware("123456789", 9, 0) == 0xE3069283u);
  for (int i = 0; i < 2000; ++i) {
    // Odd offsets and lengths exercise the unaligned head and the tail.
    const std::size_t off = rng() % 64;
    const std::size_t len = i < 200 ? static_cast<std::size_t>(i) : rng() % (data.size() - off);
    const auto seed = static_cast<std::uint32_t>(rng());
    BOOST_TEST_CONTEXT("offset " << off << " length " << len) {
      BOOST_TEST(detail::crc32c_software(data.data() + off, len, seed) ==
                 detail::crc32c_hardware(data.data() + off, len, seed));
    }
  }
}

BOOST_AUTO_TEST_CASE(combine_joins_two_crcs_without_the_second_part) {
  std::mt19937 gen(7);
  std::vector<unsigned char> data(70000);
  for (auto& b : data) b = static_cast<unsigned char>(gen());
  for (std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{4096}, std::size_t{69999}, data.size()}) {
    const std::uint32_t a = crc32c(data.data(), cut);
    const std::uint32_t b = crc32c(data.data() + cut, data.size() - cut);
    BOOST_TEST(crc32c_combine(a, b, data.size() - cut) == crc32c(data.data(), data.size()));
  }
}
