#include "runtime/core/histogram.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

namespace chorus {

using detail::histogram::max_index;

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

/// Moves the dense table's counts (its normal keys and `zero`) into sorted
/// pairs, and leaves the table zero.
void take_dense(Dense& d, std::uint64_t zero, Buckets& out) {
  std::uint32_t* c = d.c;
  // Negative keys (0x8000 | ...) ascend in magnitude, so descend in index:
  // the most negative first.
  for (std::uint32_t k = 0xffffu; k >= 0x8000u; --k) {
    if (c[k] == 0) continue;
    const int e = exp8_of(k);
    if (e != 0 && e != 255) out.emplace_back(index_of_key16(k), c[k]);
    c[k] = 0;
  }
  if (zero != 0) out.emplace_back(0, zero);
  for (std::uint32_t k = 0; k < 0x8000u; ++k) {
    if (c[k] == 0) continue;
    const int e = exp8_of(k);
    if (e != 0 && e != 255) out.emplace_back(index_of_key16(k), c[k]);
    c[k] = 0;
  }
}

/// The zero bucket's count in the dense table (keys of exponent 0, both signs).
std::uint64_t dense_zero(const Dense& d) {
  std::uint64_t z = 0;
  for (std::uint32_t m = 0; m < 128; ++m) z += d.c[m] + d.c[0x8000u | m];
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

/// Sum, min and max of floats that are all finite; eight lanes, in a fixed
/// order, so the compiler can keep them in vector registers.
void finite_stats(const float* x, std::size_t n, Stats& st) {
  constexpr std::size_t lanes = 8;
  double s[lanes] = {};
  float lo[lanes], hi[lanes];
  for (std::size_t k = 0; k < lanes; ++k) lo[k] = hi[k] = n ? x[0] : 0.0f;
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t k = 0; k < lanes; ++k) {
      const float v = x[i + k];
      s[k] += static_cast<double>(v);
      lo[k] = lo[k] < v ? lo[k] : v;
      hi[k] = hi[k] > v ? hi[k] : v;
    }
  double sum = 0;
  for (std::size_t k = 0; k < lanes; ++k) {
    sum += s[k];
    st.min = std::min(st.min, static_cast<double>(lo[k]));
    st.max = std::max(st.max, static_cast<double>(hi[k]));
  }
  for (; i < n; ++i) {
    sum += static_cast<double>(x[i]);
    st.min = std::min(st.min, static_cast<double>(x[i]));
    st.max = std::max(st.max, static_cast<double>(x[i]));
  }
  st.sum += sum;
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
  std::uint32_t* c = d.c;
  // Counters are 32 bits: at most 2^31 values a pass.
  constexpr std::size_t pass = std::size_t{1} << 31;
  for (std::size_t at = 0; at < values.size(); at += pass) {
    const float* x = values.data() + at;
    const std::size_t n = std::min(pass, values.size() - at);
    for (std::size_t i = 0; i < n; ++i) ++c[std::bit_cast<std::uint32_t>(x[i]) >> 16];
    Stats st;
    if (!dense_special(d)) {
      finite_stats(x, n, st);
      st.finite = n;
    } else {
      // NaN or infinities among them: the slow way, value by value.
      for (std::size_t i = 0; i < n; ++i) {
        const float v = x[i];
        if (std::isnan(v))
          ++st.nan;
        else if (std::isinf(v))
          ++(v > 0 ? st.pos_inf : st.neg_inf);
        else {
          ++st.finite;
          st.sum += static_cast<double>(v);
          st.min = std::min(st.min, static_cast<double>(v));
          st.max = std::max(st.max, static_cast<double>(v));
        }
      }
    }
    Buckets fresh;
    fresh.reserve(1024);
    take_dense(d, dense_zero(d), fresh);
    merge_sorted(buckets_, fresh);
    nan_ += st.nan;
    pos_inf_ += st.pos_inf;
    neg_inf_ += st.neg_inf;
    if (st.finite != 0) {
      min_ = finite_ == 0 ? st.min : std::min(min_, st.min);
      max_ = finite_ == 0 ? st.max : std::max(max_, st.max);
      sum_ += st.sum;
      finite_ += st.finite;
    }
  }
}

void Histogram::add(std::span<const double> values) {
  Dense& d = dense();
  std::uint32_t* c = d.c;
  constexpr std::size_t pass = std::size_t{1} << 31;
  Buckets large; // beyond a float's range: rare, kept apart
  for (std::size_t at = 0; at < values.size(); at += pass) {
    const double* x = values.data() + at;
    const std::size_t n = std::min(pass, values.size() - at);
    Stats st;
    constexpr std::size_t lanes = 4;
    double s[lanes] = {};
    std::uint64_t zero = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double v = x[i];
      const auto b = std::bit_cast<std::uint64_t>(v);
      const auto e11 = static_cast<std::uint32_t>((b >> 52) & 0x7ffu);
      if (e11 - 897u < 254u) [[likely]] {
        ++c[static_cast<std::uint32_t>(b >> 63) << 15 | (e11 - 896u) << 7 | static_cast<std::uint32_t>((b >> 45) & 127u)];
      } else if (e11 < 897u) {
        ++zero;
      } else if (e11 == 0x7ffu) {
        if (std::isnan(v))
          ++st.nan;
        else
          ++(v > 0 ? st.pos_inf : st.neg_inf);
        continue;
      } else {
        large.emplace_back(index_of(v), 1);
      }
      s[i % lanes] += v;
      st.min = std::min(st.min, v);
      st.max = std::max(st.max, v);
      ++st.finite;
    }
    for (double part : s) st.sum += part;
    Buckets fresh;
    fresh.reserve(1024 + large.size());
    take_dense(d, zero, fresh);
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
      large.clear();
    }
    merge_sorted(buckets_, fresh);
    nan_ += st.nan;
    pos_inf_ += st.pos_inf;
    neg_inf_ += st.neg_inf;
    if (st.finite != 0) {
      min_ = finite_ == 0 ? st.min : std::min(min_, st.min);
      max_ = finite_ == 0 ? st.max : std::max(max_, st.max);
      sum_ += st.sum;
      finite_ += st.finite;
    }
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

namespace detail::histogram {

namespace {
template <class T>
void put(std::vector<char>& out, T v) {
  const std::size_t n = out.size();
  out.resize(n + sizeof(T));
  std::memcpy(out.data() + n, &v, sizeof(T));
}
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

} // namespace detail::histogram
} // namespace chorus
