#include "runtime/core/histogram.hpp"
#include "runtime/core/bytes.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace chorus {

using core::histogram::max_index;

namespace {

using Buckets = std::vector<std::pair<std::int32_t, std::uint64_t>>;

constexpr double nan_value = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();
// 2^-126: below it (in magnitude) a value lands in the zero bucket.
const double zero_bound = std::ldexp(1.0, -126);

// The float layout's 16-bit key of a value: sign, 8 exponent bits and the 7
// significand bits after the leading one, which are the top 16 bits of a
// float. A double in the float's normal range maps to the same key.
constexpr int exp8_of(std::uint32_t key16) { return static_cast<int>((key16 >> 7) & 0xffu); }

/// The layout's index of a 16-bit key whose exponent is normal (1..254).
constexpr std::int32_t index_of_key16(std::uint32_t key16) {
  const auto i = static_cast<std::int32_t>((exp8_of(key16) - 1) * 128 + static_cast<int>(key16 & 127u) + 1);
  return (key16 & 0x8000u) ? -i : i;
}

/// The index of a finite double.
std::int32_t index_of(double x) noexcept {
  const auto b = std::bit_cast<std::uint64_t>(x);
  const auto e11 = static_cast<int>((b >> 52) & 0x7ffu);
  if (e11 < 897) return 0; // |x| < 2^-126
  const auto i = static_cast<std::int32_t>((e11 - 897) * 128 + static_cast<int>((b >> 45) & 127u) + 1);
  return (b >> 63) ? -i : i;
}

/// A thread's table of counters by 16-bit key, all zero between calls.
struct Dense {
  std::uint32_t c[65536];
};
Dense& dense() {
  thread_local std::unique_ptr<Dense> d;
  if (!d) d = std::make_unique<Dense>(); // value-initialised: zeros
  return *d;
}

/// Adds sorted (index, count) pairs into sorted `into`.
void merge_sorted(Buckets& into, const Buckets& add) {
  if (add.empty()) return;
  if (into.empty()) {
    into = add;
    return;
  }
  Buckets out;
  out.reserve(into.size() + add.size());
  auto a = into.cbegin();
  auto b = add.cbegin();
  while (a != into.cend() && b != add.cend()) {
    if (a->first < b->first)
      out.push_back(*a++);
    else if (b->first < a->first)
      out.push_back(*b++);
    else {
      out.emplace_back(a->first, a->second + b->second);
      ++a;
      ++b;
    }
  }
  out.insert(out.end(), a, into.cend());
  out.insert(out.end(), b, add.cend());
  into = std::move(out);
}

/// The table's keys in blocks of 1024 (4 KiB of counters): a bulk add
/// marks the blocks it touched in a 64-bit mask, and only those are read
/// back, so a small add does not pay for the whole 256 KiB table.
constexpr unsigned block_shift = 10;

/// Moves the dense table's counts in the blocks of `touched` (its normal
/// keys, and `zero`) into sorted pairs, and leaves the table zero.
void take_dense(std::uint32_t* c, std::uint64_t touched, std::uint64_t zero, Buckets& out) {
  auto take = [&](std::uint32_t k) {
    if (c[k] == 0) return;
    const int e = exp8_of(k);
    if (e != 0 && e != 255) out.emplace_back(index_of_key16(k), c[k]);
    c[k] = 0;
  };
  // Negative keys (0x8000 | ...) ascend in magnitude, so descend in index:
  // the most negative first.
  for (int b = 63; b >= 32; --b) {
    if ((touched >> b & 1u) == 0) continue;
    for (std::uint32_t k = (static_cast<std::uint32_t>(b) + 1) << block_shift; k-- > static_cast<std::uint32_t>(b) << block_shift;)
      take(k);
  }
  if (zero != 0) out.emplace_back(0, zero);
  for (int b = 0; b < 32; ++b) {
    if ((touched >> b & 1u) == 0) continue;
    for (std::uint32_t k = static_cast<std::uint32_t>(b) << block_shift; k < (static_cast<std::uint32_t>(b) + 1) << block_shift; ++k)
      take(k);
  }
}

/// The zero bucket's count in the dense table (keys of exponent 0, both signs).
std::uint64_t dense_zero(const std::uint32_t* c) {
  std::uint64_t z = 0;
  for (std::uint32_t m = 0; m < 128; ++m) z += c[m] + c[0x8000u | m];
  return z;
}

/// Whether the dense table holds keys of exponent 255 (NaN or infinities).
bool dense_special(const Dense& d) {
  std::uint32_t any = 0;
  for (std::uint32_t m = 0; m < 128; ++m) any |= d.c[0x7f80u | m] | d.c[0xff80u | m];
  return any != 0;
}

struct Stats {
  std::uint64_t nan = 0, pos_inf = 0, neg_inf = 0, finite = 0;
  double sum = 0;
  double min = inf, max = -inf;
};

/// Sum, min and max of values that are all finite, in a fixed order (the
/// same bits for the same values), in vector registers where the target
/// has them (SSE2 on x86-64).
void finite_stats(const float* x, std::size_t n, Stats& st) {
  if (n == 0) return;
  std::size_t i = 0;
  double sum = 0;
  double lo = x[0], hi = x[0];
#if defined(__SSE2__)
  __m128d s0 = _mm_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  __m128 lo_a = _mm_set1_ps(x[0]), hi_a = lo_a, lo_b = lo_a, hi_b = lo_a;
  for (; i + 8 <= n; i += 8) {
    const __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
    lo_a = _mm_min_ps(lo_a, a);
    hi_a = _mm_max_ps(hi_a, a);
    lo_b = _mm_min_ps(lo_b, b);
    hi_b = _mm_max_ps(hi_b, b);
    s0 = _mm_add_pd(s0, _mm_cvtps_pd(a));
    s1 = _mm_add_pd(s1, _mm_cvtps_pd(_mm_movehl_ps(a, a)));
    s2 = _mm_add_pd(s2, _mm_cvtps_pd(b));
    s3 = _mm_add_pd(s3, _mm_cvtps_pd(_mm_movehl_ps(b, b)));
  }
  alignas(16) double part[2];
  alignas(16) float l[4], h[4];
  _mm_store_pd(part, _mm_add_pd(_mm_add_pd(s0, s1), _mm_add_pd(s2, s3)));
  _mm_store_ps(l, _mm_min_ps(lo_a, lo_b));
  _mm_store_ps(h, _mm_max_ps(hi_a, hi_b));
  sum = part[0] + part[1];
  for (int k = 0; k < 4; ++k) {
    lo = std::min(lo, static_cast<double>(l[k]));
    hi = std::max(hi, static_cast<double>(h[k]));
  }
#endif
  for (; i < n; ++i) {
    const double v = x[i];
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  st.sum += sum;
  st.min = std::min(st.min, lo);
  st.max = std::max(st.max, hi);
}

void finite_stats(const double* x, std::size_t n, Stats& st) {
  if (n == 0) return;
  std::size_t i = 0;
  double sum = 0;
  double lo = x[0], hi = x[0];
#if defined(__SSE2__)
  __m128d s0 = _mm_setzero_pd(), s1 = s0;
  __m128d lo_a = _mm_set1_pd(x[0]), hi_a = lo_a, lo_b = lo_a, hi_b = lo_a;
  for (; i + 4 <= n; i += 4) {
    const __m128d a = _mm_loadu_pd(x + i), b = _mm_loadu_pd(x + i + 2);
    lo_a = _mm_min_pd(lo_a, a);
    hi_a = _mm_max_pd(hi_a, a);
    lo_b = _mm_min_pd(lo_b, b);
    hi_b = _mm_max_pd(hi_b, b);
    s0 = _mm_add_pd(s0, a);
    s1 = _mm_add_pd(s1, b);
  }
  alignas(16) double part[2], l[2], h[2];
  _mm_store_pd(part, _mm_add_pd(s0, s1));
  _mm_store_pd(l, _mm_min_pd(lo_a, lo_b));
  _mm_store_pd(h, _mm_max_pd(hi_a, hi_b));
  sum = part[0] + part[1];
  lo = std::min({lo, l[0], l[1]});
  hi = std::max({hi, h[0], h[1]});
#endif
  for (; i < n; ++i) {
    sum += x[i];
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  st.sum += sum;
  st.min = std::min(st.min, lo);
  st.max = std::max(st.max, hi);
}

/// The same over values some of which are NaN or infinite: value by value.
template <class T>
void mixed_stats(const T* x, std::size_t n, Stats& st) {
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x[i];
    if (std::isnan(v))
      ++st.nan;
    else if (std::isinf(v))
      ++(v > 0 ? st.pos_inf : st.neg_inf);
    else {
      ++st.finite;
      st.sum += v;
      st.min = std::min(st.min, v);
      st.max = std::max(st.max, v);
    }
  }
}

/// Counts each float under its 16-bit key; four at a time, so that the
/// increments of neighbouring values overlap. Returns the blocks touched:
/// marked one by one for a small add (whose cost the table's scan would
/// otherwise be), all of them for a large one (which the scan costs little).
template <bool Mark>
std::uint64_t count_keys_as(const float* x, std::size_t n, std::uint32_t* c) {
  std::uint64_t touched = Mark ? 0 : ~std::uint64_t{0};
  auto count = [&](std::uint32_t k) {
    ++c[k];
    if constexpr (Mark) touched |= std::uint64_t{1} << (k >> block_shift);
  };
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    count(std::bit_cast<std::uint32_t>(x[i]) >> 16);
    count(std::bit_cast<std::uint32_t>(x[i + 1]) >> 16);
    count(std::bit_cast<std::uint32_t>(x[i + 2]) >> 16);
    count(std::bit_cast<std::uint32_t>(x[i + 3]) >> 16);
  }
  for (; i < n; ++i) count(std::bit_cast<std::uint32_t>(x[i]) >> 16);
  return touched;
}
constexpr std::size_t small_add = 32768;
std::uint64_t count_keys(const float* x, std::size_t n, std::uint32_t* c) {
  return n < small_add ? count_keys_as<true>(x, n, c) : count_keys_as<false>(x, n, c);
}

/// Adds what a bulk add counted to `h`.
void take(Histogram& h, const Buckets& fresh, const Stats& st) {
  merge_sorted(core::HistogramAccess::buckets(h), fresh);
  const std::uint64_t had = h.finite_count();
  const double lo = had == 0 ? st.min : std::min(h.min(), st.min);
  const double hi = had == 0 ? st.max : std::max(h.max(), st.max);
  if (st.finite == 0)
    core::HistogramAccess::set(h, had, h.nan_count() + st.nan, h.pos_inf_count() + st.pos_inf,
                                 h.neg_inf_count() + st.neg_inf, h.sum(), had ? h.min() : 0.0, had ? h.max() : 0.0);
  else
    core::HistogramAccess::set(h, had + st.finite, h.nan_count() + st.nan, h.pos_inf_count() + st.pos_inf,
                                 h.neg_inf_count() + st.neg_inf, h.sum() + st.sum, lo, hi);
}

} // namespace

void Histogram::add(double value) {
  if (std::isnan(value)) {
    ++nan_;
    return;
  }
  if (std::isinf(value)) {
    ++(value > 0 ? pos_inf_ : neg_inf_);
    return;
  }
  const std::int32_t i = index_of(value);
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), i,
                             [](const std::pair<std::int32_t, std::uint64_t>& b, std::int32_t k) { return b.first < k; });
  if (it != buckets_.end() && it->first == i)
    ++it->second;
  else
    buckets_.insert(it, {i, 1});
  min_ = finite_ == 0 ? value : std::min(min_, value);
  max_ = finite_ == 0 ? value : std::max(max_, value);
  sum_ += value;
  ++finite_;
}

void Histogram::add(std::span<const float> values) {
  Dense& d = dense();
  // Counters are 32 bits: at most 2^31 values a pass.
  constexpr std::size_t pass = std::size_t{1} << 31;
  for (std::size_t at = 0; at < values.size(); at += pass) {
    const float* x = values.data() + at;
    const std::size_t n = std::min(pass, values.size() - at);
    const std::uint64_t touched = count_keys(x, n, d.c);
    Stats st;
    if (!dense_special(d)) {
      finite_stats(x, n, st);
      st.finite = n;
    } else {
      mixed_stats(x, n, st); // NaN or infinities among them
    }
    Buckets fresh;
    fresh.reserve(1024);
    take_dense(d.c, touched, dense_zero(d.c), fresh);
    take(*this, fresh, st);
  }
}

void Histogram::add(std::span<const double> values) {
  Dense& d = dense();
  std::uint32_t* c = d.c;
  constexpr std::size_t pass = std::size_t{1} << 31;
  for (std::size_t at = 0; at < values.size(); at += pass) {
    const double* x = values.data() + at;
    const std::size_t n = std::min(pass, values.size() - at);
    std::uint64_t zero = 0, special = 0, touched = n < small_add ? 0 : ~std::uint64_t{0};
    Buckets large; // beyond a float's range: rare, kept apart
    for (std::size_t i = 0; i < n; ++i) {
      const auto b = std::bit_cast<std::uint64_t>(x[i]);
      const auto e11 = static_cast<std::uint32_t>((b >> 52) & 0x7ffu);
      if (e11 - 897u < 254u) [[likely]] {
        const std::uint32_t k =
            static_cast<std::uint32_t>(b >> 63) << 15 | (e11 - 896u) << 7 | static_cast<std::uint32_t>((b >> 45) & 127u);
        ++c[k];
        if (n < small_add) touched |= std::uint64_t{1} << (k >> block_shift);
      } else if (e11 < 897u)
        ++zero;
      else if (e11 == 0x7ffu)
        ++special;
      else
        large.emplace_back(index_of(x[i]), 1);
    }
    Stats st;
    if (special == 0) {
      finite_stats(x, n, st);
      st.finite = n;
    } else {
      mixed_stats(x, n, st);
    }
    Buckets fresh;
    fresh.reserve(1024 + large.size());
    take_dense(d.c, touched, zero, fresh);
    if (!large.empty()) {
      std::sort(large.begin(), large.end());
      Buckets folded;
      for (const auto& [i, k] : large) {
        if (!folded.empty() && folded.back().first == i)
          folded.back().second += k;
        else
          folded.emplace_back(i, k);
      }
      merge_sorted(fresh, folded);
    }
    take(*this, fresh, st);
  }
}

void Histogram::merge(const Histogram& other) {
  merge_sorted(buckets_, other.buckets_);
  nan_ += other.nan_;
  pos_inf_ += other.pos_inf_;
  neg_inf_ += other.neg_inf_;
  if (other.finite_ != 0) {
    min_ = finite_ == 0 ? other.min_ : std::min(min_, other.min_);
    max_ = finite_ == 0 ? other.max_ : std::max(max_, other.max_);
    sum_ += other.sum_;
    finite_ += other.finite_;
  }
}

double Histogram::min() const noexcept { return finite_ != 0 ? min_ : nan_value; }
double Histogram::max() const noexcept { return finite_ != 0 ? max_ : nan_value; }

double Histogram::quantile(double q) const noexcept {
  const std::uint64_t n = finite_ + pos_inf_ + neg_inf_;
  if (n == 0 || !(q >= 0.0 && q <= 1.0)) return nan_value;
  // The nearest rank, 0-based.
  const auto rank = static_cast<std::uint64_t>(std::llround(q * static_cast<double>(n - 1)));
  if (rank < neg_inf_) return -inf;
  // The smallest and largest finite values are known exactly.
  if (finite_ != 0 && rank == neg_inf_) return min_;
  if (finite_ != 0 && rank == neg_inf_ + finite_ - 1) return max_;
  std::uint64_t seen = neg_inf_;
  for (const auto& [i, k] : buckets_) {
    seen += k;
    if (rank < seen) {
      const Bucket b = bucket_bounds(i);
      // The midpoint is within half a bucket of every value in it; the
      // exact extremes narrow it further.
      const double mid = i == 0 ? 0.0 : b.lo + (b.hi - b.lo) / 2;
      return std::clamp(mid, min_, max_);
    }
  }
  return inf;
}

std::vector<Histogram::Bucket> Histogram::buckets() const {
  std::vector<Bucket> out;
  out.reserve(buckets_.size());
  for (const auto& [i, k] : buckets_) {
    Bucket b = bucket_bounds(i);
    b.count = k;
    out.push_back(b);
  }
  return out;
}

namespace core::histogram {

Histogram from_dense(std::uint32_t* counts, std::uint64_t nan, std::uint64_t pos_inf, std::uint64_t neg_inf, double sum,
                     double min, double max) {
  Histogram h;
  Buckets fresh;
  const std::uint64_t zero = dense_zero(counts);
  take_dense(counts, ~std::uint64_t{0}, zero, fresh);
  std::uint64_t finite = 0;
  for (const auto& b : fresh) finite += b.second;
  HistogramAccess::buckets(h) = std::move(fresh);
  HistogramAccess::set(h, finite, nan, pos_inf, neg_inf, finite ? sum : 0.0, finite ? min : 0.0, finite ? max : 0.0);
  return h;
}

} // namespace core::histogram

std::int32_t Histogram::bucket_index(double value) noexcept {
  if (!std::isfinite(value)) return std::numeric_limits<std::int32_t>::min();
  return index_of(value);
}

Histogram::Bucket Histogram::bucket_bounds(std::int32_t index) noexcept {
  if (index == 0) return {-zero_bound, zero_bound, 0};
  if (index > max_index || index < -max_index) return {nan_value, nan_value, 0};
  const std::int32_t k = (index < 0 ? -index : index) - 1;
  const int e = k / 128 - 126;
  const int m = k % 128;
  const double lo = std::ldexp(1.0 + m / 128.0, e);
  const double hi = std::ldexp(1.0 + (m + 1) / 128.0, e);
  return index > 0 ? Bucket{lo, hi, 0} : Bucket{-hi, -lo, 0};
}

namespace core::histogram {

namespace {
using bytes::put;
template <class T>
T get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}
} // namespace

void encode(const Histogram& h, std::vector<char>& out) {
  const auto& b = HistogramAccess::buckets(h);
  out.reserve(out.size() + encoded_size(h));
  put<std::uint64_t>(out, h.nan_count());
  put<std::uint64_t>(out, h.pos_inf_count());
  put<std::uint64_t>(out, h.neg_inf_count());
  put<double>(out, h.sum());
  put<double>(out, h.finite_count() ? h.min() : 0.0);
  put<double>(out, h.finite_count() ? h.max() : 0.0);
  put<std::uint32_t>(out, static_cast<std::uint32_t>(b.size()));
  const std::size_t at = out.size();
  out.resize(at + b.size() * bucket_bytes);
  char* p = out.data() + at;
  for (const auto& [i, k] : b) {
    std::memcpy(p, &i, 4);
    std::memcpy(p + 4, &k, 8);
    p += bucket_bytes;
  }
}

namespace {
/// Reads an encoding, checking it; `out` (when given) takes the histogram.
bool read(std::span<const char> body, Histogram* out) {
  if (body.size() < head_bytes) return false;
  const char* p = body.data();
  const auto nan = get<std::uint64_t>(p);
  const auto pinf = get<std::uint64_t>(p);
  const auto ninf = get<std::uint64_t>(p);
  const auto sum = get<double>(p);
  const auto lo = get<double>(p);
  const auto hi = get<double>(p);
  const auto n = get<std::uint32_t>(p);
  if (n > 2u * max_index + 1 || body.size() != head_bytes + std::size_t{n} * bucket_bytes) return false;
  std::uint64_t total = 0;
  if (__builtin_add_overflow(nan, pinf, &total) || __builtin_add_overflow(total, ninf, &total)) return false;
  std::vector<std::pair<std::int32_t, std::uint64_t>>* b = nullptr;
  if (out) {
    *out = Histogram();
    b = &HistogramAccess::buckets(*out);
    b->resize(n);
  }
  std::uint64_t finite = 0;
  std::int32_t first = 0, prev = std::numeric_limits<std::int32_t>::min();
  for (std::uint32_t j = 0; j < n; ++j) {
    const auto i = get<std::int32_t>(p);
    const auto k = get<std::uint64_t>(p);
    if (i <= prev || i > max_index || i < -max_index || k == 0) return false;
    if (__builtin_add_overflow(finite, k, &finite) || __builtin_add_overflow(total, k, &total)) return false;
    if (b) (*b)[j] = {i, k};
    if (j == 0) first = i;
    prev = i;
  }
  if (finite != 0) {
    if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi || index_of(lo) != first || index_of(hi) != prev)
      return false;
  } else if (lo != 0 || hi != 0 || sum != 0) {
    return false;
  }
  if (out) HistogramAccess::set(*out, finite, nan, pinf, ninf, sum, lo, hi);
  return true;
}
} // namespace

bool valid(std::span<const char> body) { return read(body, nullptr); }
bool decode(std::span<const char> body, Histogram& out) { return read(body, &out); }

} // namespace core::histogram
} // namespace chorus
