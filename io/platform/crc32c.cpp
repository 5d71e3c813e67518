#include "io/platform/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define CHORUS_CRC32C_X86 1
#endif

namespace chorus::platform {
namespace {

constexpr std::uint32_t poly = 0x82F63B78u; // Castagnoli, reflected

using Tables = std::array<std::array<std::uint32_t, 256>, 8>;

// tables[k][b]: the CRC of byte b followed by k zero bytes, so eight bytes
// can be folded with eight independent lookups.
constexpr Tables make_tables() {
  Tables t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? poly : 0u);
    t[0][b] = c;
  }
  for (std::uint32_t b = 0; b < 256; ++b)
    for (std::size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

constexpr Tables tables = make_tables();

// a * b modulo the polynomial, reflected (bit 31 holds x^0), as in zlib.
constexpr std::uint32_t multmodp(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1u) ? (b >> 1) ^ poly : b >> 1;
  }
  return p;
}

// x2n[k] = x^(2^k) modulo the polynomial.
constexpr std::array<std::uint32_t, 32> make_x2n() {
  std::array<std::uint32_t, 32> t{};
  std::uint32_t p = 1u << 30; // x^1
  t[0] = p;
  for (std::size_t k = 1; k < t.size(); ++k) t[k] = p = multmodp(p, p);
  return t;
}

constexpr std::array<std::uint32_t, 32> x2n = make_x2n();

using CrcFn = std::uint32_t (*)(const void*, std::size_t, std::uint32_t) noexcept;

CrcFn choose() noexcept {
  return detail::crc32c_hardware_available() ? &detail::crc32c_hardware : &detail::crc32c_software;
}

} // namespace

namespace detail {

std::uint32_t crc32c_software(const void* data, std::size_t n, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  // Byte steps until aligned, eight at a time, then the rest.
  while (n != 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    c = (c >> 8) ^ tables[0][(c ^ *p++) & 0xFFu];
    --n;
  }
  while (n >= 8) {
    std::uint32_t lo;
    std::uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = tables[7][lo & 0xFFu] ^ tables[6][(lo >> 8) & 0xFFu] ^ tables[5][(lo >> 16) & 0xFFu] ^ tables[4][lo >> 24] ^
        tables[3][hi & 0xFFu] ^ tables[2][(hi >> 8) & 0xFFu] ^ tables[1][(hi >> 16) & 0xFFu] ^ tables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- != 0) c = (c >> 8) ^ tables[0][(c ^ *p++) & 0xFFu];
  return ~c;
}

#ifdef CHORUS_CRC32C_X86

bool crc32c_hardware_available() noexcept {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

// The target attribute lets only this function use SSE4.2, so the binary
// still runs on CPUs without it (the dispatcher never calls it there).
__attribute__((target("sse4.2"))) std::uint32_t crc32c_hardware(const void* data, std::size_t n,
                                                                std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t c = ~crc;
  while (n != 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    c = _mm_crc32_u8(static_cast<std::uint32_t>(c), *p++);
    --n;
  }
  while (n >= 32) {
    std::uint64_t w[4];
    std::memcpy(w, p, sizeof w);
    c = _mm_crc32_u64(c, w[0]);
    c = _mm_crc32_u64(c, w[1]);
    c = _mm_crc32_u64(c, w[2]);
    c = _mm_crc32_u64(c, w[3]);
    p += 32;
    n -= 32;
  }
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, sizeof w);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n-- != 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

#else

bool crc32c_hardware_available() noexcept { return false; }

std::uint32_t crc32c_hardware(const void* data, std::size_t n, std::uint32_t crc) noexcept {
  return crc32c_software(data, n, crc);
}

#endif

} // namespace detail

std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc) noexcept {
  static const CrcFn fn = choose();
  return fn(data, n, crc);
}

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) noexcept {
  // crc_a shifted past len_b zero bytes: times x^(8 len_b), a product of x^(2^k).
  std::uint32_t shift = 1u << 31; // x^0
  for (std::size_t k = 3; len_b != 0; len_b >>= 1, ++k)
    if (len_b & 1u) shift = multmodp(x2n[k % 32], shift);
  return multmodp(shift, crc_a) ^ crc_b;
}

} // namespace chorus::platform
