// The keys already interned, read by every thread without a lock: the
// steady state of a training loop logs the same few keys, found here.
// Inline, so that a log call's look-up is part of the call (runtime/client/
// run.cpp) rather than a call of its own. Entries are only added, by
// KeyTable (ingest.cpp) under its mutex, each published by its `data`, and
// never changed: a reader that sees `data` sees the rest. No thread-local
// storage, whose look-up is a call in a shared library.
#pragma once

#include "runtime/core/fnv.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace chorus::client::known {

template <class T>
[[gnu::always_inline]] inline std::uint64_t load(const char* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v); // a fixed size: one load, no call
  return v;
}

// FNV-1a over 8-byte words: keys are short, and this is on the hot path. A
// key's last bytes are read as whole words that may overlap the ones before
// (never a copy of a few bytes, which costs a call and a stalled load).
[[gnu::always_inline]] inline std::uint64_t hash_key(std::string_view s) noexcept {
  const char* p = s.data();
  const std::size_t n = s.size();
  std::uint64_t h = core::fnv1a64_basis ^ n;
  std::uint64_t tail = 0;
  if (n >= 8) {
    for (std::size_t i = 0; i + 8 < n; i += 8) {
      h = core::fnv1a64_step(h, load<std::uint64_t>(p + i));
      h ^= h >> 29;
    }
    tail = load<std::uint64_t>(p + n - 8);
  } else if (n >= 4) {
    tail = load<std::uint32_t>(p) | load<std::uint32_t>(p + n - 4) << 32;
  } else if (n > 0) { // an empty key may have no data
    tail = static_cast<unsigned char>(p[0]) | static_cast<unsigned char>(p[n / 2]) << 8 |
           static_cast<unsigned char>(p[n - 1]) << 16;
  }
  h = core::fnv1a64_step(h, tail);
  return h ^ (h >> 32);
}

/// Whether the `n` bytes at `a` and `b` are equal, read as hash_key reads them.
[[gnu::always_inline]] inline bool same_bytes(const char* a, const char* b, std::size_t n) noexcept {
  if (n >= 8) {
    for (std::size_t i = 0; i + 8 < n; i += 8)
      if (load<std::uint64_t>(a + i) != load<std::uint64_t>(b + i)) return false;
    return load<std::uint64_t>(a + n - 8) == load<std::uint64_t>(b + n - 8);
  }
  if (n >= 4)
    return load<std::uint32_t>(a) == load<std::uint32_t>(b) && load<std::uint32_t>(a + n - 4) == load<std::uint32_t>(b + n - 4);
  for (std::size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

struct KnownKey {
  std::atomic<const char*> data{nullptr}; // the name in the table
  std::uint64_t hash = 0;
  std::uint32_t size = 0;
  std::uint32_t id = 0xffffffffu; // KeyTable::invalid: not a valid metric key
};
inline constexpr std::size_t size = 16384; // 384 KiB of zeros, touched where keys land
inline constexpr std::size_t probes = 16;  // a key that finds no room is looked up under the lock
extern KnownKey keys[size];                // ingest.cpp

/// The id of `key` (hash `h`) where it is known, else false.
[[gnu::always_inline]] inline bool find(std::uint64_t h, std::string_view key, std::uint32_t& id) noexcept {
  for (std::size_t probe = 0; probe < probes; ++probe) {
    const KnownKey& e = keys[(h + probe) & (size - 1)];
    const char* data = e.data.load(std::memory_order_acquire);
    if (data == nullptr) return false;
    if (e.hash == h && e.size == key.size() && same_bytes(data, key.data(), key.size())) {
      id = e.id;
      return true;
    }
  }
  return false;
}

} // namespace chorus::client::known
