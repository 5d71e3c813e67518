// The trainer-side half of logging: a bounded multi-producer ring of fixed
// slots that `Run::log` fills without locks or allocation, and the process's
// key table that turns key strings into small ids once per thread and key.
#pragma once

#include <chorus/chorus.hpp>

#include "io/platform/fences.hpp"
#include "runtime/client/known_keys.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

namespace chorus::client {

enum class SlotKind : std::uint8_t {
  values_head, // first value of one log call; count = values in the call
  value,       // a further value of the same call
  define,      // key = metric, reduce
  barrier,     // key = barrier name, step = timeout in ms
  config,      // text = JSON object (owned, freed by the consumer)
  summary,     // text = JSON object
  finish,      // count = RunState (finished, failed or killed), step = exit code or signal, text = why (or null)
  device_head, // like values_head; the values are in `capture` once its event fires
  step_mark,   // an empty log call: moves the rank's step (reduce_device off the run host)
  // A Writer's log call: key = stream id, count = values, which follow in
  // `count` value slots. One slot more than a Run::log call, as a slot has no
  // room for the id; the default stream's calls stay as they were.
  stream_head,
  stream_open,  // key = stream id (Run::writer)
  stream_close, // key = stream id (Writer::close)
  refused,      // refusal = values refused before the ring (owned, freed by the consumer); step = the call's
  metric_view,  // key = metric, count = Summary or core::wire::unchanged_summary, step = step metric's key or -1
  histogram,    // key = metric, count = stream id (0: the default stream), step, histogram (owned, freed by the consumer)
  media,        // as histogram, with a MediaJob (owned): sent once it is ready (runtime/client/media_encoder.hpp)
  device_histogram, // as histogram, with a DeviceHistogramJob (the DeviceBuckets' pool's): sent once its event fires
  alert_rule,   // key = metric, count = AlertRule::Kind, value = its limit
};

struct Capture;
struct MediaJob;
struct DeviceHistogramJob;

/// Values refused before they reached the ring, on their way to rejected.jsonl.
struct Refusal {
  Errc code;
  std::uint32_t n;      // values refused
  std::string message;
  std::string values;   // a JSON object of them
};

/// One ring slot: 32 bytes, two per cache line.
struct alignas(32) Slot {
  // Published: the lap bit of its position (Ring::lap_bit) in bit 0, and
  // above it the call's stamp (log_clock.hpp) where the slot heads a call
  // that carries a time, so the time costs the ring no byte.
  std::atomic<std::uint64_t> ready;
  std::uint32_t key;
  SlotKind kind;
  Reduce reduce;
  std::uint16_t count;
  std::int64_t step;
  union {
    double value;
    std::string* text;   // config, summary; finish: why (or null)
    Capture* capture;
    Refusal* refusal;
    Histogram* histogram;
    MediaJob* media;
    DeviceHistogramJob* device_histogram;
  };
};
static_assert(sizeof(Slot) == 32);

/// A spinning thread's hint to the CPU (x86's `pause`) between its looks at
/// a word another thread will change: a producer waiting for room, or for
/// the ring's owner to leave its reservation.
inline void cpu_pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// Bounded MPSC ring. Producers reserve a run of slots, fill and publish
/// them; the single consumer (the RankProxy) reads them in position order and
/// releases them in bulk.
///
/// The owner. The first thread to reserve owns the ring, and while it is the
/// only producer it moves the head with a plain store: no locked instruction
/// on the trainer's call. The first other thread to reserve makes the ring
/// shared for good: it raises `shared_`, passes a heavy fence
/// (io/platform/fences.hpp) and waits out a reservation the owner may be in
/// (`busy_`); then it raises `handed_over_`, and from then on every
/// producer, the owner too, reserves with a CAS. The owner raises `busy_`
/// before it looks at `shared_` (a light fence between), so that either it
/// sees the ring shared or the other thread sees it busy. Other threads
/// wait for `handed_over_`, not `shared_`: a CAS that came before the
/// owner's last plain store would be lost under it. A process where the
/// kernel has no such fence has rings handed over at their first
/// reservation, before anyone owns them. The owner's reservation is not
/// reentrant: a signal handler that logged on the owner's thread, inside its
/// reservation, would take the same position (no Run call is
/// async-signal-safe: chorus.hpp, "Thread safety").
///
/// A slot is published for position p when its lap bit is p's: a producer
/// writes p only once p - capacity was consumed (try_reserve), and the
/// consumer reads p only after p - capacity, so the slot holds p's word or
/// p - capacity's, whose bits differ. Slots start at 0, which no position of
/// the first lap has.
class Ring {
public:
  explicit Ring(std::size_t capacity); // rounded up to a power of two
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  [[nodiscard]] std::size_t capacity() const noexcept { return mask_ + 1; }

  /// Reserves n consecutive positions; false if they do not fit now. The
  /// owner's path is inline in the trainer's call; the rest is out of line.
  [[gnu::always_inline]] bool try_reserve(std::uint32_t n, std::uint64_t& pos) noexcept {
    switch (try_owner(n, pos)) {
    case Owned::reserved: return true;
    case Owned::full: return false;
    case Owned::not_owned: break;
    }
    return try_reserve_shared(n, pos);
  }
  /// try_reserve's owner path alone: false where the positions do not fit,
  /// or this thread does not own the ring (or it is shared).
  [[gnu::always_inline]] bool try_reserve_owned(std::uint32_t n, std::uint64_t& pos) noexcept {
    return try_owner(n, pos) == Owned::reserved;
  }
  Slot& at(std::uint64_t pos) noexcept { return slots_[pos & mask_]; }
  /// Publishes the slot at `pos` with `stamp` (63 bits; 0 where the slot carries no time).
  void publish(Slot& s, std::uint64_t pos, std::uint64_t stamp = 0) const noexcept {
    s.ready.store(stamp << 1 | lap_bit(pos), std::memory_order_release);
  }
  /// Asks for the slot at `pos` ahead of writing it (a hint; nothing waits for it).
  void prefetch(std::uint64_t pos) const noexcept { __builtin_prefetch(&slots_[pos & mask_], 1, 3); }

  // Consumer side.
  /// The slot at `pos` if it is published, else nullptr.
  Slot* peek(std::uint64_t pos) noexcept {
    Slot& s = at(pos);
    return published(s.ready.load(std::memory_order_acquire), pos) ? &s : nullptr;
  }
  /// Whether a slot's word `ready` is the one published for `pos`.
  [[nodiscard]] bool published(std::uint64_t ready, std::uint64_t pos) const noexcept {
    return (ready & 1) == lap_bit(pos);
  }
  /// The stamp a published slot carries.
  static std::uint64_t stamp(const Slot& s) noexcept { return s.ready.load(std::memory_order_relaxed) >> 1; }
  /// Frees the slots before `pos`, and wakes the producers that wait for room.
  void release_to(std::uint64_t pos) noexcept {
    // Sequentially consistent with wait_for_room's count and look at the
    // tail: a producer that saw no room is counted here, and woken.
    tail_.store(pos, std::memory_order_seq_cst);
    if (waiting_.load(std::memory_order_seq_cst) != 0) [[unlikely]]
      wake_waiting();
  }
  /// A producer's wait until `n` positions may fit, or `at_most` passed
  /// (Overflow::block): asleep, not spinning, while the consumer frees none.
  void wait_for_room(std::uint32_t n, std::chrono::microseconds at_most) noexcept;
  [[nodiscard]] std::uint64_t tail() const noexcept { return tail_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t head() const noexcept { return head_.load(std::memory_order_acquire); }

  /// Whether every producer reserves with a CAS now (a second thread has reserved).
  [[nodiscard]] bool shared() const noexcept { return handed_over_.load(std::memory_order_acquire); }

private:
  enum class Owned : std::uint8_t { reserved, full, not_owned };
  /// The owner's reservation, with the plain store (see the class comment).
  [[gnu::always_inline]] Owned try_owner(std::uint32_t n, std::uint64_t& pos) noexcept {
    if (owner_.load(std::memory_order_relaxed) != thread_token()) [[unlikely]]
      return Owned::not_owned;
    busy_.store(true, platform::light_order);
    platform::light_fence();
    if (shared_.load(platform::light_order)) [[unlikely]] {
      busy_.store(false, std::memory_order_release);
      return Owned::not_owned;
    }
    const std::uint64_t h = head_.load(std::memory_order_relaxed);
    const bool fits = h + n - tail_.load(std::memory_order_acquire) <= capacity();
    if (fits) head_.store(h + n, std::memory_order_relaxed);
    busy_.store(false, std::memory_order_release);
    pos = h;
    return fits ? Owned::reserved : Owned::full;
  }
  /// try_reserve where this thread does not own the ring, or it is shared:
  /// the first reservation claims it (claim), the others use the CAS.
  [[gnu::noinline]] bool try_reserve_shared(std::uint32_t n, std::uint64_t& pos) noexcept;
  /// This thread's identity: its thread pointer, one register read.
  static const void* thread_token() noexcept { return __builtin_thread_pointer(); }
  /// A reservation by a thread that is not the owner while the ring is not
  /// shared: true where it became the owner (the first to reserve), false
  /// where it made the ring shared.
  [[gnu::cold, gnu::noinline]] bool claim() noexcept;
  /// Bumps freed_ and wakes every producer asleep in wait_for_room.
  void wake_waiting() noexcept;
  /// 1 on even laps (the first is lap 0), 0 on odd ones.
  [[nodiscard]] std::uint64_t lap_bit(std::uint64_t pos) const noexcept { return ((pos >> lap_shift_) & 1) ^ 1; }

  struct FreeSlots {
    std::size_t n;           // slots
    std::size_t written = n; // how many of the first were ever written (all, once the ring went round)
    void operator()(Slot* s) const noexcept;
  };

  std::size_t mask_;
  unsigned lap_shift_; // log2(capacity)
  std::unique_ptr<Slot[], FreeSlots> slots_;
  // The producers' line: the owner reads and writes only these.
  alignas(64) std::atomic<std::uint64_t> head_{0};
  std::atomic<const void*> owner_{nullptr}; // the thread that reserved first (thread_token)
  std::atomic<bool> busy_{false};           // the owner is inside a reservation
  std::atomic<bool> shared_{false};         // a second thread reserved: the owner uses the CAS
  std::atomic<bool> handed_over_{false};    // and the owner is out of its last plain reservation
  alignas(64) std::atomic<std::uint64_t> tail_{0};
  std::atomic<std::uint32_t> waiting_{0}; // producers in wait_for_room
  std::atomic<std::uint32_t> freed_{0};   // bumped by a release that had waiters: their futex word
};

/// Process-wide key ids. Names live as long as the process; ids are dense.
class KeyTable {
public:
  static constexpr std::uint32_t invalid = 0xffffffffu;
  static constexpr std::size_t max_key_bytes = 250; // MLflow's limit, so every key uploads

  static KeyTable& instance();

  /// The id of a metric key, without a lock once it is known; `invalid`
  /// when the key is not a valid metric key (see validate_metric_key).
  static std::uint32_t intern_metric(std::string_view key) noexcept;
  /// intern_metric of each value's key into `ids`, inline in a log call
  /// (the call's keys): how many are valid. No lock once the keys are known.
  [[gnu::always_inline]] static std::uint32_t intern_metrics(std::span<const Metric> values,
                                                             std::uint32_t* ids) noexcept {
    std::uint32_t good = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      ids[i] = metric_id(values[i].key);
      good += ids[i] != invalid;
    }
    return good;
  }
  /// The id of a metric key that every thread knows already, without the
  /// lock (`invalid` for a key known to be refused), else false; `h` is its
  /// hash either way. intern_metric's look-up, without interning a new key.
  [[gnu::always_inline]] static bool known_metric(std::string_view key, std::uint64_t& h,
                                                  std::uint32_t& id) noexcept {
    h = known::hash_key(key);
    return known::find(h, key, id);
  }
  /// The id of any name (barrier names); no validation.
  std::uint32_t intern(std::string_view name);
  [[nodiscard]] std::string_view name(std::uint32_t id) const;

private:
  /// intern_metric's body, inlined into both calls.
  [[gnu::always_inline]] static std::uint32_t metric_id(std::string_view key) noexcept {
    std::uint64_t h;
    std::uint32_t id;
    if (known_metric(key, h, id)) [[likely]]
      return id;
    return instance().intern_unknown(key, h);
  }
  std::uint32_t intern_slow(std::string_view key, bool metric);
  /// A key not yet known without the lock (`h` its hash): interned, and made known.
  [[gnu::noinline]] std::uint32_t intern_unknown(std::string_view key, std::uint64_t h) noexcept;

  mutable std::mutex mu_;
  std::deque<std::string> names_;
  std::deque<bool> metric_ok_;
  std::unordered_map<std::string_view, std::uint32_t> ids_;
};

/// Why `key` cannot be a metric key (empty, too long, not UTF-8, control
/// characters, a leading '_' reserved for chorus), or an empty Error.
Error validate_metric_key(std::string_view key);

/// `s` as a quoted, escaped JSON string: safe to put in any message.
std::string quoted(std::string_view s);

} // namespace chorus::client
