// The device histogram without a GPU: the host half (counts by a float's top
// 16 bits become the same chorus::Histogram as the host's bucketing), and the
// kernel's source compiled by NVRTC where NVRTC is installed. The kernel
// itself runs in the `gpu` tests (tests/e2e/device_test.cpp).
#define BOOST_TEST_MODULE device_histogram
#include <boost/test/unit_test.hpp>

#include "runtime/client/device_histogram.hpp"
#include "runtime/core/histogram.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace chorus;
using core::histogram::dense_keys;

namespace {

/// What the kernel leaves in a job's buffer for `x`, counted as it counts
/// (device_histogram.cpp): the histogram from_dense makes of it.
Histogram as_the_gpu_counts(const std::vector<float>& x) {
  std::vector<std::uint32_t> counts(dense_keys, 0);
  std::uint64_t nan = 0, pinf = 0, ninf = 0;
  double sum = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (float v : x) {
    const auto u = std::bit_cast<std::uint32_t>(v);
    if (((u >> 23) & 0xffu) == 0xffu) {
      if (u & 0x7fffffu)
        ++nan;
      else
        ++(u >> 31 ? ninf : pinf);
      continue;
    }
    ++counts[u >> 16];
    sum += v;
    lo = std::min<double>(lo, v);
    hi = std::max<double>(hi, v);
  }
  Histogram h = core::histogram::from_dense(counts.data(), nan, pinf, ninf, sum, lo, hi);
  for (std::uint32_t c : counts) BOOST_REQUIRE_EQUAL(c, 0u); // left zero
  return h;
}

void same(const Histogram& a, const Histogram& b) {
  BOOST_TEST(a.count() == b.count());
  BOOST_TEST(a.nan_count() == b.nan_count());
  BOOST_TEST(a.pos_inf_count() == b.pos_inf_count());
  BOOST_TEST(a.neg_inf_count() == b.neg_inf_count());
  BOOST_TEST(std::bit_cast<std::uint64_t>(a.min()) == std::bit_cast<std::uint64_t>(b.min()));
  BOOST_TEST(std::bit_cast<std::uint64_t>(a.max()) == std::bit_cast<std::uint64_t>(b.max()));
  BOOST_TEST(std::fabs(a.sum() - b.sum()) <= 1e-9 * std::max(1.0, std::fabs(b.sum())));
  const auto ab = a.buckets(), bb = b.buckets();
  BOOST_REQUIRE_EQUAL(ab.size(), bb.size());
  for (std::size_t i = 0; i < ab.size(); ++i) {
    BOOST_TEST(ab[i].lo == bb[i].lo);
    BOOST_TEST(ab[i].count == bb[i].count);
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(counts_by_the_top_16_bits_are_the_hosts_histogram) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) x.push_back(normal(rng));
  // Every kind of float: zeros of both signs, subnormals, the extremes,
  // NaN of any payload and both infinities.
  for (float v : {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), -std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
                  std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7f800001u),
                  std::bit_cast<float>(0xffc00000u), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), 1e-40f, -3e-39f})
    x.push_back(v);
  for (int i = 0; i < 5000; ++i) x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  same(as_the_gpu_counts(x), Histogram(std::span<const float>(x)));
}

BOOST_AUTO_TEST_CASE(no_finite_value_and_no_value) {
  same(as_the_gpu_counts({std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}),
       Histogram(std::vector<float>{std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}));
  const Histogram none = as_the_gpu_counts({});
  BOOST_TEST(none.count() == 0u);
  BOOST_TEST(none.buckets().empty());
  BOOST_TEST(std::isnan(none.min()));
}

BOOST_AUTO_TEST_CASE(nvrtc_compiles_the_kernel_where_it_is_installed) {
  Result<std::string> ptx = client::device_histogram_ptx(0);
  if (!ptx && ptx.error().message().find("could not be loaded") != std::string::npos) {
    BOOST_TEST_MESSAGE("skipped: " << ptx.error().message());
    return;
  }
  BOOST_TEST_INFO_SCOPE(ptx.error().message());
  BOOST_REQUIRE(ptx.has_value());
  BOOST_TEST(ptx->find(".entry chorus_histogram") != std::string::npos);
  BOOST_TEST(ptx->find("match.any.sync") != std::string::npos); // lanes of one bucket add once
  // An H200's architecture (9.0), and one older than any NVRTC takes.
  Result<std::string> hopper = client::device_histogram_ptx(90);
  BOOST_REQUIRE(hopper.has_value());
  BOOST_TEST(hopper->find(".target sm_90") != std::string::npos);
  Result<std::string> ancient = client::device_histogram_ptx(20);
  BOOST_REQUIRE(!ancient.has_value());
  BOOST_TEST(ancient.error().message().find("older than every architecture") != std::string::npos);
}
