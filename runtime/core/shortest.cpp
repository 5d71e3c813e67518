// Schubfach (R. Giulietti, "The Schubfach way to render doubles", 2020): the
// decimals d * 10^k nearest to v = c * 2^q are found from 4v / 10^k rounded
// to odd, and those of its rounding interval's ends, each one product with a
// 126-bit power of ten (shortest_table.inc). Of the decimals in the interval,
// the one with the fewest digits, then the nearest, is written in the form
// std::to_chars gives: fixed where that is no longer than scientific.
#include "runtime/core/shortest.hpp"

#include <bit>
#include <charconv>
#include <cstdint>
#include <cstring>

namespace chorus::core {

namespace {

struct G { std::uint64_t g1, g0; };
constexpr G table[] = {
#include "runtime/core/shortest_table.inc"
};
constexpr int k_min = -324;

__extension__ typedef unsigned __int128 u128;

inline int flog10pow2(int q) { return static_cast<int>((static_cast<std::int64_t>(q) * 661971961083LL) >> 41); }
inline int flog10_three_quarters_pow2(int q) {
  return static_cast<int>((static_cast<std::int64_t>(q) * 661971961083LL - 274743187321LL) >> 41);
}
inline int flog2pow10(int e) { return static_cast<int>((static_cast<std::int64_t>(e) * 913124641741LL) >> 38); }

inline std::uint64_t high(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint64_t>((u128{a} * b) >> 64); }

/// Round to odd of g * cp / 2^127.
inline std::uint64_t rop(std::uint64_t g1, std::uint64_t g0, std::uint64_t cp) {
  const std::uint64_t x1 = high(g0, cp);
  const std::uint64_t y0 = g1 * cp;
  const std::uint64_t y1 = high(g1, cp);
  const std::uint64_t z = (y0 >> 1) + x1;
  const std::uint64_t vbp = y1 + (z >> 63);
  return vbp | (((z & 0x7fffffffffffffffull) + 0x7fffffffffffffffull) >> 63);
}

struct Decimal { std::uint64_t f; int e; };

/// The shortest decimal in the rounding interval of c * 2^q (the closest, ties to even f).
Decimal to_decimal(int q, std::uint64_t c, int dk) {
  const std::uint64_t out = c & 1;
  const std::uint64_t cb = c << 2;
  const std::uint64_t cbr = cb + 2;
  std::uint64_t cbl;
  int k;
  if (c != (std::uint64_t{1} << 52) || q == -1074) {
    cbl = cb - 2;
    k = flog10pow2(q);
  } else {
    cbl = cb - 1;
    k = flog10_three_quarters_pow2(q);
  }
  const int h = q + flog2pow10(-k) + 2;
  const G& g = table[k - k_min];
  const std::uint64_t vb = rop(g.g1, g.g0, cb << h);
  const std::uint64_t vbl = rop(g.g1, g.g0, cbl << h);
  const std::uint64_t vbr = rop(g.g1, g.g0, cbr << h);
  const std::uint64_t s = vb >> 2;
  if (s >= 100) {
    const std::uint64_t sp10 = 10 * high(s, 115292150460684698ull << 4);
    const std::uint64_t tp10 = sp10 + 10;
    const bool upin = vbl + out <= sp10 << 2;
    const bool wpin = (tp10 << 2) + out <= vbr;
    if (upin != wpin) return {upin ? sp10 : tp10, k};
  }
  const std::uint64_t t = s + 1;
  const bool uin = vbl + out <= s << 2;
  const bool win = (t << 2) + out <= vbr;
  if (uin != win) return {uin ? s : t, k + dk};
  const std::uint64_t cmp = vb - ((s + t) << 1); // as signed
  return {static_cast<std::int64_t>(cmp) < 0 || (cmp == 0 && (s & 1) == 0) ? s : t, k + dk};
}

} // namespace

constexpr char two_digits[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/// The 8 digits of `v` (< 10^8, zeros in front) at `p`.
inline void eight_digits(std::uint32_t v, char* p) {
  const std::uint32_t hi = v / 10000, lo = v % 10000;
  std::memcpy(p, two_digits + 2 * (hi / 100), 2);
  std::memcpy(p + 2, two_digits + 2 * (hi % 100), 2);
  std::memcpy(p + 4, two_digits + 2 * (lo / 100), 2);
  std::memcpy(p + 6, two_digits + 2 * (lo % 100), 2);
}

/// The digits of `v` (< 10^9) ending at `end`: their count.
inline int small_digits(std::uint32_t v, char* end) {
  char* p = end;
  while (v >= 100) {
    p -= 2;
    std::memcpy(p, two_digits + 2 * (v % 100), 2);
    v /= 100;
  }
  if (v >= 10) {
    p -= 2;
    std::memcpy(p, two_digits + 2 * v, 2);
  } else {
    *--p = static_cast<char>('0' + v);
  }
  return static_cast<int>(end - p);
}

/// The digits of f (at most 17), right-aligned so that they end at `end`: their count.
inline int digits_of(std::uint64_t f, char* end) {
  if (f < 100000000) return small_digits(static_cast<std::uint32_t>(f), end);
  const std::uint64_t hi = f / 100000000;
  eight_digits(static_cast<std::uint32_t>(f - hi * 100000000), end - 8);
  if (hi < 100000000) return 8 + small_digits(static_cast<std::uint32_t>(hi), end - 8);
  const std::uint64_t top = hi / 100000000;
  eight_digits(static_cast<std::uint32_t>(hi - top * 100000000), end - 16);
  return 16 + small_digits(static_cast<std::uint32_t>(top), end - 16);
}

/// f / P and e + N where P (10^N) divides f.
template <std::uint64_t P, int N>
inline void drop_if_divides(std::uint64_t& f, int& e) {
  if (f % P == 0) {
    f /= P;
    e += N;
  }
}

/// f (a multiple of 10) without its trailing zeros, e raised by as many.
/// Most often there is one (the interval held a decimal of 16 digits); a
/// short decimal (0.85, 0.001) comes out of the interval's arithmetic with
/// 14 or 15, taken here in at most five divisions rather than one each.
inline void drop_zeros(std::uint64_t& f, int& e) {
  f /= 10;
  ++e;
  if (f % 10 != 0) return;
  while (f % 100000000 == 0) {
    f /= 100000000;
    e += 8;
  }
  drop_if_divides<10000, 4>(f, e);
  drop_if_divides<100, 2>(f, e);
  drop_if_divides<10, 1>(f, e);
}

char* shortest(char* out, double v) noexcept {
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(v);
  char* o = out;
  if (bits >> 63) *o++ = '-';
  const int bq = static_cast<int>((bits >> 52) & 0x7ff);
  const std::uint64_t t = bits & ((std::uint64_t{1} << 52) - 1);
  Decimal d;
  if (bq != 0) {
    const int mq = 1075 - bq; // -q
    const std::uint64_t c = (std::uint64_t{1} << 52) | t;
    if (0 < mq && mq < 53 && ((c >> mq) << mq) == c) d = {c >> mq, 0}; // an integer
    else d = to_decimal(-mq, c, 0);
  } else if (t >= 64) {
    d = to_decimal(-1074, t, 0);
  } else if (t != 0) {
    return std::to_chars(out, out + shortest_room, v).ptr; // the few smallest: fewer digits than the interval's arithmetic sees
  } else {
    *o++ = '0';
    return o;
  }
  if (d.f % 10 == 0) [[unlikely]]
    drop_zeros(d.f, d.e);
  char buf[48]; // the digits end at buf + 24; up to 17 bytes after the first are read at once
  const int n = digits_of(d.f, buf + 24);
  const char* digits = buf + 24 - n;
  const int x = d.e + n - 1; // the scientific exponent
  const int ax = x < 0 ? -x : x;
  const int sci_len = n + (n > 1 ? 1 : 0) + 2 + (ax >= 100 ? 3 : 2);
  const int fixed_len = x >= 0 ? (n <= x + 1 ? x + 1 : n + 1) : 1 - x + n; // "0." + zeros + digits
  if (fixed_len <= sci_len) {
    if (x < 0) {
      // "0.00ddd": at most 5 zeros (else the scientific form is shorter).
      std::memcpy(o, "0.00000", 8);
      o += 1 - x;
      std::memcpy(o, digits, 17);
      return o + n;
    }
    if (n <= x + 1) {
      if (x + 1 > n && (bits & 0x7fffffffffffffffull) >= 0x4340000000000000ull) // 2^53 and above: written exactly
        return std::to_chars(out, out + shortest_room, v).ptr;
      std::memcpy(o, digits, 17);
      std::memcpy(o + n, "00000", 5); // at most 5 zeros, as above
      return o + x + 1;
    }
    // The whole part, then the point, then the fraction (each copied from the digits).
    std::memcpy(o, digits, 16);
    o[x + 1] = '.';
    std::memcpy(o + x + 2, digits + x + 1, 16);
    return o + n + 1;
  }
  o[0] = digits[0];
  o[1] = '.';
  std::memcpy(o + 2, digits + 1, 16);
  o += n > 1 ? n + 1 : 1;
  *o++ = 'e';
  *o++ = x < 0 ? '-' : '+';
  if (ax >= 100) {
    *o++ = static_cast<char>('0' + ax / 100);
    std::memcpy(o, two_digits + 2 * (ax % 100), 2);
  } else {
    std::memcpy(o, two_digits + 2 * ax, 2);
  }
  return o + 2;
}

} // namespace chorus::core
