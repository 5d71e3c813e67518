#include "runtime/client/ingest.hpp"

#include "runtime/core/fnv.hpp"
#include "runtime/core/immortal.hpp"
#include "runtime/core/json.hpp"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace chorus::client {

namespace {

/// The slots of the last ring that ended wait for the next ring of their
/// size (one at a time): a process that runs one run after another reuses
/// them, faulted in once, and clears again only the ones the last ring
/// wrote (a short run's few). Their count waits in the first one's step,
/// and how many of them were written in the second one's. A pointer swapped
/// atomically, not a lock: a fork can never leave the child with it held.
constinit std::atomic<Slot*> spare_slots{nullptr};

/// `n` slots, each published for no position yet. A ring of 2 MiB or more
/// (the default queue's size) lies in huge pages where the kernel lends them
/// on request (transparent huge pages, "madvise"): written through once here,
/// so that no log call meets a page fault, it then takes one fault a 2 MiB
/// instead of 512, several milliseconds of init on a virtual machine.
Slot* allocate_slots(std::size_t n) {
  std::size_t dirty = n; // the first slots that may hold a word other than 0
  Slot* slots = spare_slots.exchange(nullptr, std::memory_order_acq_rel);
  if (slots != nullptr && static_cast<std::size_t>(slots[0].step) != n) {
    // Not this ring's size: back it goes, for a ring of its own (whatever waited meanwhile goes).
    std::free(spare_slots.exchange(slots, std::memory_order_acq_rel));
    slots = nullptr;
  } else if (slots != nullptr) {
    // The others still hold the 0 they were cleared to; the two that kept the counts are cleared again.
    dirty = std::max(static_cast<std::size_t>(slots[1].step), std::size_t{2});
  }
  if (slots == nullptr) {
    constexpr std::size_t huge_page = std::size_t{2} << 20;
    const std::size_t bytes = n * sizeof(Slot);
    const std::size_t align = bytes >= huge_page ? huge_page : alignof(Slot);
    const std::size_t size = (bytes + align - 1) / align * align;
    void* memory = std::aligned_alloc(align, size);
    if (memory == nullptr) throw std::bad_alloc();
    if (align == huge_page) (void)::madvise(memory, size, MADV_HUGEPAGE); // a hint: without it, small pages
    slots = static_cast<Slot*>(memory);
  }
  for (std::size_t i = 0; i < dirty; ++i) { // one pass over the memory
    Slot* slot = ::new (static_cast<void*>(slots + i)) Slot;
    slot->ready.store(0, std::memory_order_relaxed);
  }
  return slots;
}

} // namespace

void Ring::wait_for_room(std::uint32_t n, std::chrono::microseconds at_most) noexcept {
  waiting_.fetch_add(1, std::memory_order_seq_cst);
  const std::uint32_t seen = freed_.load(std::memory_order_seq_cst);
  if (head_.load(std::memory_order_relaxed) + n - tail_.load(std::memory_order_seq_cst) > capacity()) {
    // Asleep until a release after `seen` (the word moved: no wait at all) or the time is up.
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at_most).count();
    timespec t{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    ::syscall(SYS_futex, &freed_, FUTEX_WAIT_PRIVATE, seen, &t, nullptr, 0);
  }
  waiting_.fetch_sub(1, std::memory_order_relaxed);
}

void Ring::wake_waiting() noexcept {
  freed_.fetch_add(1, std::memory_order_seq_cst);
  ::syscall(SYS_futex, &freed_, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

Ring::~Ring() {
  // Every producer is done: the positions below the head are all that was written.
  slots_.get_deleter().written = static_cast<std::size_t>(std::min<std::uint64_t>(head_.load(), mask_ + 1));
}

void Ring::FreeSlots::operator()(Slot* s) const noexcept {
  static_assert(std::is_trivially_destructible_v<Slot>);
  s[0].step = static_cast<std::int64_t>(n);
  s[1].step = static_cast<std::int64_t>(written); // a ring has two slots or more
  std::free(spare_slots.exchange(s, std::memory_order_acq_rel)); // one kept at a time: the one kept before goes
}

Ring::Ring(std::size_t capacity)
    : mask_(std::bit_ceil(capacity < 2 ? std::size_t{2} : capacity) - 1),
      lap_shift_(static_cast<unsigned>(std::countr_zero(mask_ + 1))),
      slots_(allocate_slots(mask_ + 1), FreeSlots{mask_ + 1}) {}

KeyTable& KeyTable::instance() {
  static core::Immortal<KeyTable> table; // a run's threads read names while the process exits
  return *table;
}

namespace {

template <class T>
[[gnu::always_inline]] inline std::uint64_t load(const char* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v); // a fixed size: one load, no call
  return v;
}

// FNV-1a over 8-byte words: keys are short, and this is on the hot path. A
// key's last bytes are read as whole words that may overlap the ones before
// (never a copy of a few bytes, which costs a call and a stalled load).
inline std::uint64_t hash_key(std::string_view s) noexcept {
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
inline bool same_bytes(const char* a, const char* b, std::size_t n) noexcept {
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

// The keys already interned, readable without a lock by every thread: the
// steady state of a training loop logs the same few keys, found here. Entries
// are only added (under KeyTable's mutex), each published by its `data`, and
// never changed: a reader that sees `data` sees the rest. No thread-local
// storage, whose look-up is a call in a shared library.
struct KnownKey {
  std::atomic<const char*> data{nullptr}; // the name in the table
  std::uint64_t hash = 0;
  std::uint32_t size = 0;
  std::uint32_t id = KeyTable::invalid; // invalid: not a valid metric key
};
constexpr std::size_t known_size = 16384; // 384 KiB of zeros, touched where keys land
constexpr std::size_t known_probes = 16;  // a key that finds no room is looked up under the lock
KnownKey known_keys[known_size];

} // namespace

std::string quoted(std::string_view s) {
  std::string out;
  core::append_json_string(out, s);
  return out;
}

Error validate_metric_key(std::string_view key) {
  if (key.empty())
    return {Errc::invalid_key, "empty metric key: every logged value needs a non-empty key such as \"loss\""};
  if (key.size() > KeyTable::max_key_bytes)
    return {Errc::invalid_key, "metric key of " + std::to_string(key.size()) + " bytes starting " +
                                   quoted(key.substr(0, 32)) + " is too long: keys take at most " +
                                   std::to_string(KeyTable::max_key_bytes) + " bytes; shorten it"};
  if (!core::valid_utf8(key))
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

namespace {
/// The id of `key` (hash `h`) where it is known, else false.
[[gnu::always_inline]] inline bool known_id(std::uint64_t h, std::string_view key, std::uint32_t& id) noexcept {
  for (std::size_t probe = 0; probe < known_probes; ++probe) {
    const KnownKey& e = known_keys[(h + probe) & (known_size - 1)];
    const char* data = e.data.load(std::memory_order_acquire);
    if (data == nullptr) return false;
    if (e.hash == h && e.size == key.size() && same_bytes(data, key.data(), key.size())) {
      id = e.id;
      return true;
    }
  }
  return false;
}
} // namespace

[[gnu::always_inline]] inline std::uint32_t KeyTable::metric_id(std::string_view key) noexcept {
  const std::uint64_t h = hash_key(key);
  std::uint32_t id;
  if (known_id(h, key, id)) [[likely]]
    return id;
  return instance().intern_unknown(key, h);
}

std::uint32_t KeyTable::intern_metric(std::string_view key) noexcept { return metric_id(key); }

std::uint32_t KeyTable::intern_metrics(std::span<const Metric> values, std::uint32_t* ids) noexcept {
  std::uint32_t good = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    ids[i] = metric_id(values[i].key);
    good += ids[i] != invalid;
  }
  return good;
}

std::uint32_t KeyTable::intern_unknown(std::string_view key, std::uint64_t h) noexcept {
  std::uint32_t id;
  try {
    id = intern_slow(key, true);
  } catch (...) {
    return invalid; // out of memory: the caller reports the key as refused
  }
  std::lock_guard lock(mu_);
  std::uint32_t found;
  if (known_id(h, key, found)) return id; // another thread made it known meanwhile
  const std::string_view stored = names_[ids_.find(key)->second];
  for (std::size_t probe = 0; probe < known_probes; ++probe) {
    KnownKey& e = known_keys[(h + probe) & (known_size - 1)];
    if (e.data.load(std::memory_order_relaxed) != nullptr) continue;
    e.hash = h;
    e.size = static_cast<std::uint32_t>(stored.size());
    e.id = id;
    e.data.store(stored.empty() ? "" : stored.data(), std::memory_order_release);
    break;
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

} // namespace chorus::client
