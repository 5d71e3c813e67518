#include "runtime/client/ingest.hpp"
#include "io/platform/posix.hpp"

#include "runtime/core/immortal.hpp"
#include "runtime/core/json.hpp"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdlib>
#include <new>
#include <thread>
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

constexpr std::size_t huge_page = std::size_t{2} << 20;

/// Whether a ring of `n` slots lies in memory mapped for it alone (2 MiB or
/// more: the default queue's size), and how many bytes.
bool mapped(std::size_t n) noexcept { return n * sizeof(Slot) >= huge_page; }
std::size_t mapped_bytes(std::size_t n) noexcept { return (n * sizeof(Slot) + huge_page - 1) / huge_page * huge_page; }

/// Gives back slots made by allocate_slots, their count in the first one's step.
void release_slots(Slot* slots) noexcept {
  if (slots == nullptr) return;
  const auto n = static_cast<std::size_t>(slots[0].step);
  if (mapped(n))
    (void)::munmap(slots, mapped_bytes(n));
  else
    std::free(slots);
}

/// `bytes` (a multiple of 2 MiB) of zeroed memory on a 2 MiB boundary, in
/// transparent huge pages where the kernel lends them ("madvise"), each
/// page faulted in here so that no log call meets a fault: one fault a
/// 2 MiB, or one a 4 KiB page where no huge page was lent.
void* map_zeroed(std::size_t bytes) {
  void* raw = ::mmap(nullptr, bytes + huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto at = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (at + huge_page - 1) / huge_page * huge_page;
  if (start != at) (void)::munmap(raw, start - at);
  if (const std::size_t tail = at + bytes + huge_page - (start + bytes); tail != 0)
    (void)::munmap(reinterpret_cast<void*>(start + bytes), tail);
  auto* memory = reinterpret_cast<char*>(start);
  (void)::madvise(memory, bytes, MADV_HUGEPAGE); // a hint: without it, small pages
  // Every page at once where the kernel can: where no huge page is lent,
  // faulting 512 small pages one by one costs a trap each, 5.8 ms on a VM
  // whose fault costs 10-20 us, against 0.3-0.8 ms in one call
  // (BENCHMARKS.md, "Init's actors behind it").
  if (platform::populate_for_write(memory, bytes)) return memory;
  const long small = ::sysconf(_SC_PAGESIZE);
  const std::size_t page = small > 0 ? static_cast<std::size_t>(small) : 4096;
  for (std::size_t off = 0; off < bytes; off += huge_page) {
    static_cast<volatile char*>(memory)[off] = 0;
    unsigned char resident = 0;
    // A huge page made the whole 2 MiB resident with that one write; else each small page is written.
    if (::mincore(memory + off + page, page, &resident) == 0 && (resident & 1) != 0) continue;
    for (std::size_t p = off + page; p < off + huge_page; p += page) static_cast<volatile char*>(memory)[p] = 0;
  }
  return memory;
}

/// `n` slots, each published for no position yet. A ring of 2 MiB or more
/// (the default queue's size) is memory mapped for it, which the kernel
/// hands out zeroed (a slot of zeros is published for no position): only
/// faulted in, not written through, which halves what it costs an init.
/// A smaller ring is written through.
Slot* allocate_slots(std::size_t n) {
  std::size_t dirty = n; // the first slots that may hold a word other than 0
  Slot* slots = spare_slots.exchange(nullptr, std::memory_order_acq_rel);
  if (slots != nullptr && static_cast<std::size_t>(slots[0].step) != n) {
    // Not this ring's size: back it goes, for a ring of its own (whatever waited meanwhile goes).
    release_slots(spare_slots.exchange(slots, std::memory_order_acq_rel));
    slots = nullptr;
  } else if (slots != nullptr) {
    // The others still hold the 0 they were cleared to; the two that kept the counts are cleared again.
    dirty = std::max(static_cast<std::size_t>(slots[1].step), std::size_t{2});
  }
  if (slots == nullptr && mapped(n)) {
    // Zeroed by the kernel: Slot is trivially destructible and all its
    // fields are plain integers (the atomic's too), so zero bytes are a
    // slot whose word reads 0.
    static_assert(std::is_trivially_destructible_v<Slot> && sizeof(std::atomic<std::uint64_t>) == 8);
    return static_cast<Slot*>(map_zeroed(mapped_bytes(n)));
  }
  if (slots == nullptr) {
    void* memory = std::aligned_alloc(alignof(Slot), n * sizeof(Slot));
    if (memory == nullptr) throw std::bad_alloc();
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

bool Ring::try_reserve_shared(std::uint32_t n, std::uint64_t& pos) noexcept {
  if (owner_.load(std::memory_order_relaxed) != thread_token() && !handed_over_.load(std::memory_order_acquire) &&
      claim())
    return try_reserve(n, pos); // the first reservation: this thread owns the ring now
  std::uint64_t h = head_.load(std::memory_order_relaxed);
  for (;;) {
    if (h + n - tail_.load(std::memory_order_acquire) > capacity()) return false;
    if (head_.compare_exchange_weak(h, h + n, std::memory_order_relaxed, std::memory_order_relaxed)) {
      pos = h;
      return true;
    }
  }
}

bool Ring::claim() noexcept {
  if (platform::asymmetric_fences()) {
    const void* none = nullptr;
    if (owner_.compare_exchange_strong(none, thread_token(), std::memory_order_acq_rel)) return true;
  }
  // A second producer (or no fence to hand the ring over with): every
  // reservation from now on is a CAS. The owner may be between its look at
  // shared_ and its store of the head; once it is out, the CAS starts from
  // its head. Every thread that comes before the handover is done waits
  // here as well.
  shared_.store(true, std::memory_order_seq_cst);
  if (platform::asymmetric_fences()) { // else no thread ever owned the ring
    platform::heavy_fence();
    // The owner is out within a few instructions unless it was switched
    // out inside them: spin briefly, then yield, then sleep, so that an
    // owner held off its CPU for long (a debugger, a starved machine) is
    // not waited for with a core.
    for (unsigned i = 0; busy_.load(std::memory_order_seq_cst); ++i) {
      if (i < 64)
        cpu_pause();
      else if (i < 1024)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  handed_over_.store(true, std::memory_order_release);
  return false;
}

Ring::~Ring() {
  // Every producer is done: the positions below the head are all that was written.
  slots_.get_deleter().written = static_cast<std::size_t>(std::min<std::uint64_t>(head_.load(), mask_ + 1));
}

void Ring::FreeSlots::operator()(Slot* s) const noexcept {
  static_assert(std::is_trivially_destructible_v<Slot>);
  s[0].step = static_cast<std::int64_t>(n);
  s[1].step = static_cast<std::int64_t>(written); // a ring has two slots or more
  release_slots(spare_slots.exchange(s, std::memory_order_acq_rel)); // one kept at a time: the one kept before goes
}

Ring::Ring(std::size_t capacity)
    : mask_(std::bit_ceil(capacity < 2 ? std::size_t{2} : capacity) - 1),
      lap_shift_(static_cast<unsigned>(std::countr_zero(mask_ + 1))),
      slots_(allocate_slots(mask_ + 1), FreeSlots{mask_ + 1}) {}

KeyTable& KeyTable::instance() {
  static core::Immortal<KeyTable> table; // a run's threads read names while the process exits
  return *table;
}

namespace known {
KnownKey keys[size];
} // namespace known

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

std::uint32_t KeyTable::intern_metric(std::string_view key) noexcept { return metric_id(key); }

std::uint32_t KeyTable::intern_unknown(std::string_view key, std::uint64_t h) noexcept {
  std::uint32_t id;
  try {
    id = intern_slow(key, true);
  } catch (...) {
    return invalid; // out of memory: the caller reports the key as refused
  }
  std::lock_guard lock(mu_);
  std::uint32_t found;
  if (known::find(h, key, found)) return id; // another thread made it known meanwhile
  const std::string_view stored = names_[ids_.find(key)->second];
  for (std::size_t probe = 0; probe < known::probes; ++probe) {
    known::KnownKey& e = known::keys[(h + probe) & (known::size - 1)];
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
