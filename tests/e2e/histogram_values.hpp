// What each rank of the e2e worker puts into its histograms (--histograms),
// and so what the tests expect: deterministic in (rank, step), spread over
// many buckets of both signs, with a NaN and both infinities at every
// fifth step.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

namespace e2e {

inline std::vector<float> histogram_values(int rank, long step) {
  std::vector<float> v(2000 + static_cast<std::size_t>(rank) * 101);
  std::uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(rank * 100003 + step + 1);
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    // Uniform in (-1, 1), scaled by a power of two from 2^-10 to 2^9.
    const double u = static_cast<double>(x >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0;
    f = static_cast<float>(u * static_cast<double>(1u << (x % 20)) / 1024.0);
  }
  if (step % 5 == 0) {
    v[1] = std::numeric_limits<float>::quiet_NaN();
    v[2] = std::numeric_limits<float>::infinity();
    v[3] = -std::numeric_limits<float>::infinity();
  }
  return v;
}

} // namespace e2e
