// FNV-1a, the one non-cryptographic hash of chorus: derived group names and
// ports (runtime/core/options.cpp), interned keys (runtime/client/ingest.cpp), MLflow key
// suffixes (io/upload/mlflow.cpp), the digests of delivered files (io/upload/upload.cpp),
// and chorus serve's content-hashed file names and runs-list versions (cli/serve/).
// Its values are written into run directories and sent to servers: never
// change the constants.
#pragma once

#include <cstdint>
#include <string_view>

namespace chorus::core {

inline constexpr std::uint64_t fnv1a64_basis = 0xcbf29ce484222325ull;
inline constexpr std::uint64_t fnv1a64_prime = 0x100000001b3ull;
inline constexpr std::uint32_t fnv1a32_basis = 2166136261u;
inline constexpr std::uint32_t fnv1a32_prime = 16777619u;

/// One step of the 64-bit hash: `h` with `v` (a byte, or a word for a
/// word-at-a-time variant) mixed in.
[[nodiscard]] constexpr std::uint64_t fnv1a64_step(std::uint64_t h, std::uint64_t v) noexcept {
  return (h ^ v) * fnv1a64_prime;
}

/// FNV-1a 64 of the bytes of `s`, from `basis` (the standard offset basis
/// unless a stored value was made from another).
[[nodiscard]] constexpr std::uint64_t fnv1a64(std::string_view s, std::uint64_t basis = fnv1a64_basis) noexcept {
  std::uint64_t h = basis;
  for (const char c : s) h = fnv1a64_step(h, static_cast<unsigned char>(c));
  return h;
}

/// FNV-1a 32 of the bytes of `s`.
[[nodiscard]] constexpr std::uint32_t fnv1a32(std::string_view s) noexcept {
  std::uint32_t h = fnv1a32_basis;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * fnv1a32_prime;
  return h;
}

static_assert(fnv1a64("") == fnv1a64_basis && fnv1a64("a") == 0xaf63dc4c8601ec8cull);
static_assert(fnv1a32("") == fnv1a32_basis && fnv1a32("a") == 0xe40c292cu);

} // namespace chorus::core
