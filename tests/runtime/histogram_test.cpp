// chorus::Histogram: its bucket layout, bulk and single adds, merge,
// quantiles, non-finite values, and the codec that carries it in frames.
#define BOOST_TEST_MODULE histogram
#include <boost/test/unit_test.hpp>

#include "runtime/core/histogram.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

using chorus::Histogram;
namespace hg = chorus::core::histogram;

namespace {

std::uint64_t seed_from_env() {
  const char* s = std::getenv("CHORUS_SEED");
  return s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
}

/// Whether bucket `b` holds `x` under the layout's rule (positive [lo, hi),
/// negative (lo, hi], zero (lo, hi)).
bool holds(std::int32_t index, const Histogram::Bucket& b, double x) {
  if (index == 0) return x > b.lo && x < b.hi;
  if (index > 0) return x >= b.lo && x < b.hi;
  return x > b.lo && x <= b.hi;
}

/// Doubles from all over the layout: random bits (every exponent), values
/// at bucket bounds and next to them, tiny and huge ones.
double any_double(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0: return std::bit_cast<double>(rng());
    case 1: {
      const auto i = static_cast<std::int32_t>(rng() % (2 * hg::max_index + 1)) - hg::max_index;
      const Histogram::Bucket b = Histogram::bucket_bounds(i);
      const double edge = rng() % 2 ? b.lo : b.hi;
      const int nudge = static_cast<int>(rng() % 3) - 1;
      return nudge == 0 ? edge : std::nextafter(edge, nudge > 0 ? HUGE_VAL : -HUGE_VAL);
    }
    case 2: return std::ldexp(static_cast<double>(rng() % 1000) - 500.0, static_cast<int>(rng() % 2100) - 1075);
    default: {
      std::normal_distribution<double> n(0.0, 1.0);
      return n(rng);
    }
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(every_double_lands_in_one_bucket_that_holds_it) {
  const std::uint64_t seed = seed_from_env();
  BOOST_TEST_MESSAGE("seed " << seed << " (set CHORUS_SEED to replay)");
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 200000; ++i) {
    const double x = any_double(rng);
    if (!std::isfinite(x)) {
      BOOST_TEST(Histogram::bucket_index(x) == std::numeric_limits<std::int32_t>::min());
      continue;
    }
    const std::int32_t k = Histogram::bucket_index(x);
    BOOST_TEST_REQUIRE((k >= -hg::max_index && k <= hg::max_index), "index " << k << " of " << x);
    const Histogram::Bucket b = Histogram::bucket_bounds(k);
    BOOST_TEST_REQUIRE(holds(k, b, x), x << " not in bucket " << k << " [" << b.lo << ", " << b.hi << ")");
    // Exactly one: the neighbours do not hold it.
    if (k > -hg::max_index) BOOST_TEST_REQUIRE(!holds(k - 1, Histogram::bucket_bounds(k - 1), x));
    if (k < hg::max_index) BOOST_TEST_REQUIRE(!holds(k + 1, Histogram::bucket_bounds(k + 1), x));
    // Buckets are at most 1/128 of their lower bound wide (the zero bucket aside).
    if (k != 0 && std::isfinite(b.hi) && std::isfinite(b.lo)) // the outermost bounds are 2^1024: infinite
      BOOST_TEST_REQUIRE(std::abs(b.hi - b.lo) <= std::min(std::abs(b.lo), std::abs(b.hi)) / 128 * (1 + 1e-12));
  }
  // The layout's ends and the zero bucket.
  BOOST_TEST(Histogram::bucket_index(0.0) == 0);
  BOOST_TEST(Histogram::bucket_index(-0.0) == 0);
  BOOST_TEST(Histogram::bucket_index(std::numeric_limits<double>::denorm_min()) == 0);
  BOOST_TEST(Histogram::bucket_index(std::ldexp(1.0, -126)) == 1);
  BOOST_TEST(Histogram::bucket_index(std::numeric_limits<double>::max()) == hg::max_index);
  BOOST_TEST(Histogram::bucket_index(-std::numeric_limits<double>::max()) == -hg::max_index);
  BOOST_TEST(Histogram::bucket_index(1.0) == Histogram::bucket_index(1.0f));
}

BOOST_AUTO_TEST_CASE(bulk_adds_equal_adds_one_by_one) {
  const std::uint64_t seed = seed_from_env();
  BOOST_TEST_MESSAGE("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 40; ++round) {
    std::vector<double> d(rng() % 5000);
    std::vector<float> f(d.size());
    for (std::size_t i = 0; i < d.size(); ++i) {
      d[i] = rng() % 50 == 0 ? (rng() % 3 == 0   ? std::numeric_limits<double>::quiet_NaN()
                                : rng() % 2 == 0 ? HUGE_VAL
                                                 : -HUGE_VAL)
                             : any_double(rng);
      f[i] = std::bit_cast<float>(static_cast<std::uint32_t>(rng())); // every float, NaNs of any payload too
    }
    Histogram one_by_one_d, one_by_one_f;
    for (double x : d) one_by_one_d.add(x);
    for (float x : f) one_by_one_f.add(static_cast<double>(x));
    const Histogram bulk_d{std::span<const double>(d)};
    const Histogram bulk_f{std::span<const float>(f)};
    BOOST_TEST(bulk_d.buckets().size() == one_by_one_d.buckets().size());
    BOOST_TEST(bulk_d.count() == one_by_one_d.count());
    BOOST_TEST(bulk_d.nan_count() == one_by_one_d.nan_count());
    BOOST_TEST(bulk_d.pos_inf_count() == one_by_one_d.pos_inf_count());
    BOOST_TEST(bulk_d.neg_inf_count() == one_by_one_d.neg_inf_count());
    BOOST_TEST(std::bit_cast<std::uint64_t>(bulk_d.min()) == std::bit_cast<std::uint64_t>(one_by_one_d.min()));
    BOOST_TEST(std::bit_cast<std::uint64_t>(bulk_d.max()) == std::bit_cast<std::uint64_t>(one_by_one_d.max()));
    // Sums add in another order: equal up to rounding, relative to the magnitudes summed.
    double magnitude = 0;
    for (double x : d)
      if (std::isfinite(x)) magnitude += std::abs(x);
    if (std::isfinite(magnitude))
      BOOST_TEST(std::abs(bulk_d.sum() - one_by_one_d.sum()) <= magnitude * 1e-12);
    const auto bd = bulk_d.buckets(), od = one_by_one_d.buckets();
    BOOST_TEST(std::equal(bd.begin(), bd.end(), od.begin(), od.end(),
                          [](const auto& a, const auto& b) { return a.lo == b.lo && a.count == b.count; }));
    const auto bf = bulk_f.buckets(), of = one_by_one_f.buckets();
    BOOST_TEST(std::equal(bf.begin(), bf.end(), of.begin(), of.end(),
                          [](const auto& a, const auto& b) { return a.lo == b.lo && a.count == b.count; }));
    BOOST_TEST(bulk_f.count() == f.size());
    BOOST_TEST(bulk_f.nan_count() == one_by_one_f.nan_count());
    BOOST_TEST(std::bit_cast<std::uint64_t>(bulk_f.min()) == std::bit_cast<std::uint64_t>(one_by_one_f.min()));
    BOOST_TEST(std::bit_cast<std::uint64_t>(bulk_f.max()) == std::bit_cast<std::uint64_t>(one_by_one_f.max()));
  }
}

BOOST_AUTO_TEST_CASE(merge_is_associative_and_commutative) {
  const std::uint64_t seed = seed_from_env();
  BOOST_TEST_MESSAGE("seed " << seed);
  std::mt19937_64 rng(seed);
  // Values whose sums are exact in a double, so every order sums to the same bits.
  auto part = [&] {
    std::vector<double> v(rng() % 300);
    for (double& x : v) x = rng() % 20 == 0 ? std::numeric_limits<double>::quiet_NaN()
                                            : std::ldexp(static_cast<double>(static_cast<int>(rng() % 2001) - 1000), -8);
    return v;
  };
  for (int round = 0; round < 200; ++round) {
    const auto va = part(), vb = part(), vc = part();
    const Histogram a{std::span<const double>(va)}, b{std::span<const double>(vb)}, c{std::span<const double>(vc)};
    Histogram ab_c = a;
    ab_c.merge(b);
    ab_c.merge(c);
    Histogram bc = b;
    bc.merge(c);
    Histogram a_bc = a;
    a_bc.merge(bc);
    Histogram c_b_a = c;
    c_b_a.merge(b);
    c_b_a.merge(a);
    BOOST_TEST((ab_c == a_bc));
    BOOST_TEST((ab_c == c_b_a));
    std::vector<double> all = va;
    all.insert(all.end(), vb.begin(), vb.end());
    all.insert(all.end(), vc.begin(), vc.end());
    const Histogram whole{std::span<const double>(all)};
    BOOST_TEST((ab_c == whole)); // the merge is the histogram of all the values
  }
}

BOOST_AUTO_TEST_CASE(quantiles_are_within_the_stated_error) {
  const std::uint64_t seed = seed_from_env();
  BOOST_TEST_MESSAGE("seed " << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 30; ++round) {
    std::lognormal_distribution<double> dist(0.0, 3.0);
    std::vector<double> v(1 + rng() % 20000);
    for (double& x : v) x = (rng() % 2 ? 1 : -1) * dist(rng);
    const Histogram h{std::span<const double>(v)};
    std::sort(v.begin(), v.end());
    for (double q : {0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0}) {
      const auto rank = static_cast<std::size_t>(std::llround(q * static_cast<double>(v.size() - 1)));
      const double exact = v[rank];
      const double got = h.quantile(q);
      BOOST_TEST_REQUIRE(std::abs(got - exact) <= std::abs(exact) * Histogram::relative_error * (1 + 1e-12),
                         "q " << q << ": " << got << " for " << exact);
    }
    BOOST_TEST(h.quantile(0.0) == v.front()); // the extremes are exact
    BOOST_TEST(h.quantile(1.0) == v.back());
  }
  const Histogram empty;
  BOOST_TEST(std::isnan(empty.quantile(0.5)));
  BOOST_TEST(std::isnan(empty.min()));
  const double one = 3.0;
  BOOST_TEST(std::isnan(Histogram(std::span<const double>(&one, 1)).quantile(1.5)));
}

BOOST_AUTO_TEST_CASE(non_finite_values_never_reach_sum_min_or_max) {
  const std::vector<float> f = {1.0f, std::numeric_limits<float>::quiet_NaN(), -2.0f,
                                std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::bit_cast<float>(0x7f800001u) /* a NaN the top bits call infinity */, 0.0f};
  const Histogram h{std::span<const float>(f)};
  BOOST_TEST(h.count() == 7u);
  BOOST_TEST(h.finite_count() == 3u);
  BOOST_TEST(h.nan_count() == 2u);
  BOOST_TEST(h.pos_inf_count() == 1u);
  BOOST_TEST(h.neg_inf_count() == 1u);
  BOOST_TEST(h.sum() == -1.0);
  BOOST_TEST(h.min() == -2.0);
  BOOST_TEST(h.max() == 1.0);
  BOOST_TEST(h.quantile(0.0) == -HUGE_VAL);
  BOOST_TEST(h.quantile(1.0) == HUGE_VAL);
  BOOST_TEST(h.buckets().size() == 3u); // -2, 0, 1
  Histogram only_nan;
  only_nan.add(std::numeric_limits<double>::quiet_NaN());
  BOOST_TEST(std::isnan(only_nan.min()));
  BOOST_TEST(only_nan.sum() == 0.0);
  BOOST_TEST(std::isnan(only_nan.quantile(0.5)));
}

BOOST_AUTO_TEST_CASE(codec_round_trips_and_refuses_what_it_did_not_write) {
  std::mt19937_64 rng(seed_from_env());
  for (int round = 0; round < 200; ++round) {
    Histogram h;
    for (std::uint64_t i = rng() % 100; i > 0; --i) h.add(any_double(rng));
    std::vector<char> bytes;
    hg::encode(h, bytes);
    BOOST_TEST(bytes.size() == hg::encoded_size(h));
    Histogram back;
    BOOST_TEST_REQUIRE(hg::decode(bytes, back));
    BOOST_TEST((back == h));
    // Every one-byte change the decoder takes still decodes to a consistent histogram.
    std::vector<char> bad = bytes;
    bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    Histogram maybe;
    if (hg::decode(bad, maybe)) {
      std::uint64_t in_buckets = 0;
      for (const auto& b : maybe.buckets()) in_buckets += b.count;
      BOOST_TEST(in_buckets == maybe.finite_count());
      if (maybe.finite_count() != 0) BOOST_TEST(maybe.min() <= maybe.max());
    }
    // A short or long body never decodes.
    BOOST_TEST(!hg::decode(std::span<const char>(bytes.data(), bytes.size() - 1), maybe));
    bytes.push_back(0);
    BOOST_TEST(!hg::decode(bytes, maybe));
  }
  // Out of order, an empty bucket, an index outside the layout, a min outside its bucket.
  auto with = [](std::vector<std::pair<std::int32_t, std::uint64_t>> buckets, double lo, double hi) {
    Histogram h;
    chorus::core::HistogramAccess::buckets(h) = buckets;
    std::uint64_t n = 0;
    for (auto& b : buckets) n += b.second;
    chorus::core::HistogramAccess::set(h, n, 0, 0, 0, 0.0, lo, hi);
    std::vector<char> out;
    hg::encode(h, out);
    Histogram back;
    return hg::decode(out, back);
  };
  const std::int32_t one = Histogram::bucket_index(1.0), two = Histogram::bucket_index(2.0);
  BOOST_TEST(with({{one, 1}, {two, 1}}, 1.0, 2.0));
  BOOST_TEST(!with({{two, 1}, {one, 1}}, 1.0, 2.0));
  BOOST_TEST(!with({{one, 0}, {two, 1}}, 1.0, 2.0));
  BOOST_TEST(!with({{one, 1}, {hg::max_index + 1, 1}}, 1.0, 2.0));
  BOOST_TEST(!with({{one, 1}, {two, 1}}, 0.5, 2.0));
  BOOST_TEST(!with({{one, 1}, {two, 1}}, 1.0, 5.0));
}
