#include "runtime/client/ingest.hpp"

#include "runtime/core/fnv.hpp"
#include "runtime/core/json.hpp"

#include <bit>
#include <cstring>

namespace chorus::detail {

Ring::Ring(std::size_t capacity)
    : mask_(std::bit_ceil(capacity < 2 ? std::size_t{2} : capacity) - 1), slots_(new Slot[mask_ + 1]) {
  for (std::size_t i = 0; i <= mask_; ++i) slots_[i].ready.store(0, std::memory_order_relaxed);
}

KeyTable& KeyTable::instance() {
  static KeyTable table;
  return table;
}

namespace {

// FNV-1a over 8-byte words: keys are short, and this is on the hot path.
inline std::uint64_t hash_key(std::string_view s) noexcept {
  std::uint64_t h = fnv1a64_basis ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = fnv1a64_step(h, w);
    h ^= h >> 29;
  }
  std::uint64_t tail = 0;
  if (i < s.size()) std::memcpy(&tail, s.data() + i, s.size() - i); // an empty key may have no data
  h = fnv1a64_step(h, tail);
  return h ^ (h >> 32);
}

// A small per-thread cache in front of the shared table: the steady state of
// a training loop logs the same few keys, found here without a lock.
struct CacheEntry {
  std::uint64_t hash = 0;
  const char* data = nullptr;
  std::uint32_t size = 0;
  std::uint32_t id = KeyTable::invalid;
};
constexpr std::size_t cache_size = 512;
thread_local CacheEntry key_cache[cache_size];

} // namespace

std::string quoted(std::string_view s) {
  std::string out;
  io::append_json_string(out, s);
  return out;
}

Error validate_metric_key(std::string_view key) {
  if (key.empty())
    return {Errc::invalid_key, "empty metric key: every logged value needs a non-empty key such as \"loss\""};
  if (key.size() > KeyTable::max_key_bytes)
    return {Errc::invalid_key, "metric key of " + std::to_string(key.size()) + " bytes starting " +
                                   quoted(key.substr(0, 32)) + " is too long: keys take at most " +
                                   std::to_string(KeyTable::max_key_bytes) + " bytes; shorten it"};
  if (!io::valid_utf8(key))
    return {Errc::invalid_key, "metric key " + quoted(key) +
                                   " is not valid UTF-8: keys must be UTF-8 text; re-encode it"};
  for (char c : key)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      return {Errc::invalid_key, "metric key " + quoted(key) +
                                     " holds a control character: use printable characters only"};
  if (key.front() == '_')
    return {Errc::invalid_key, "metric key \"" + std::string(key) +
                                   "\" starts with '_', which is reserved for chorus's own fields (_step, "
                                   "_timestamp, _runtime, _count): rename it"};
  return {};
}

std::uint32_t KeyTable::intern_metric(std::string_view key) noexcept {
  const std::uint64_t h = hash_key(key);
  for (std::size_t probe = 0; probe < 4; ++probe) {
    CacheEntry& e = key_cache[(h + probe) & (cache_size - 1)];
    if (e.data == nullptr) break;
    if (e.hash == h && e.size == key.size() && (key.empty() || std::memcmp(e.data, key.data(), key.size()) == 0))
      return e.id; // an empty key may have no data to compare
  }
  std::uint32_t id;
  try {
    id = intern_slow(key, true);
  } catch (...) {
    return invalid; // out of memory: the caller reports the key as refused
  }
  std::string_view stored = name(id == invalid ? intern(key) : id);
  for (std::size_t probe = 0; probe < 4; ++probe) {
    CacheEntry& e = key_cache[(h + probe) & (cache_size - 1)];
    if (e.data == nullptr || probe == 3) {
      e = CacheEntry{h, stored.data(), static_cast<std::uint32_t>(stored.size()), id};
      break;
    }
  }
  return id;
}

std::uint32_t KeyTable::intern(std::string_view name) { return intern_slow(name, false); }

std::uint32_t KeyTable::intern_slow(std::string_view key, bool metric) {
  std::lock_guard lock(mu_);
  std::uint32_t id;
  if (auto it = ids_.find(key); it != ids_.end()) {
    id = it->second;
  } else {
    id = static_cast<std::uint32_t>(names_.size());
    names_.emplace_back(key);
    metric_ok_.push_back(!validate_metric_key(key));
    ids_.emplace(names_.back(), id);
  }
  if (metric && !metric_ok_[id]) return invalid;
  return id;
}

std::string_view KeyTable::name(std::uint32_t id) const {
  std::lock_guard lock(mu_);
  return id < names_.size() ? std::string_view(names_[id]) : std::string_view();
}

} // namespace chorus::detail
