// Completion of tickets. The RankProxy reports how far the run host has
// committed this process's stream; the Channel turns that into ready
// Pendings, woken threads and resumed coroutines. Coroutines resume on the
// executor they awaited from, else on chorus's completion thread — never on
// an actor-runtime thread.
#pragma once

#include <chorus/chorus.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

namespace chorus::client {

/// Immediate errors (nothing was enqueued) get ids in their own space.
inline constexpr std::uint64_t immediate_bit = 1ull << 63;
/// So do deferred tickets: work done on a chorus thread of this process
/// (artifact copies), which settles them one by one, in the order handed out.
inline constexpr std::uint64_t deferred_bit = 1ull << 62;

/// Runs callbacks and coroutine resumptions on one chorus-owned thread.
class CompletionThread {
public:
  static CompletionThread& instance();
  void post(std::function<void()> fn);

private:
  CompletionThread();
  struct State;
  State* s_; // leaked on purpose: it must outlive static destructors
};

class Channel {
public:
  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  [[nodiscard]] bool ready(std::uint64_t seq) const noexcept {
    if ((seq & immediate_bit) != 0) return true;
    if ((seq & deferred_bit) != 0) return settled_.load(std::memory_order_acquire) >= seq;
    return completed_.load(std::memory_order_acquire) >= seq || failed_.load(std::memory_order_acquire);
  }
  [[nodiscard]] Error result(std::uint64_t seq, bool has_error) const;
  Error wait(std::uint64_t seq, bool has_error, std::optional<std::chrono::milliseconds> limit);
  void suspend(std::uint64_t seq, std::coroutine_handle<> h, Executor* ex);
  void on_done(std::uint64_t seq, bool has_error, std::function<void(Error)> fn);

  /// Records an error for an enqueued call (seq) or a fresh immediate one.
  void set_error(std::uint64_t seq, Error e);
  std::uint64_t immediate(Error e);

  /// Everything through `seq` is done; earlier set_error calls hold the errors.
  void complete(std::uint64_t seq);
  /// Nothing more will complete normally: every waiter, present and future,
  /// gets `e` unless its own error was recorded first. Deferred tickets are
  /// not the run host's: they still wait to be settled.
  void fail(Error e);

  /// A deferred ticket's id; settle() completes it.
  std::uint64_t defer();
  /// Completes the deferred ticket `id` with `e` (ok if empty). Tickets are
  /// settled in the order defer() handed them out.
  void settle(std::uint64_t id, Error e);

  [[nodiscard]] std::uint64_t completed() const noexcept { return completed_.load(std::memory_order_acquire); }
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  /// Why nothing completes any more (after fail()); ok before.
  [[nodiscard]] Error failure() const {
    std::lock_guard lock(mu_);
    return failure_;
  }

  /// Wakes the consumer of this process's ring, once its RankProxy said how
  /// (set_nudge); before, nothing: the proxy drains what the ring holds from
  /// its start.
  void nudge() const noexcept;
  /// How to wake the ring's consumer: set once, by the thread that spawned
  /// the RankProxy, which may be another than the trainer's (a run of one
  /// process starts its actors behind init: actors/system.cpp).
  void set_nudge(std::function<void()> fn);

  /// Set while the consumer polls slowly (idle for a while): producers wake
  /// it after publishing. One relaxed load on the hot path; a wake-up that
  /// races with parking is caught by the parked poll.
  /// On a cache line of its own (sizeof is 64): the trainer reads it on
  /// every log call, and the other members change with every acknowledgement.
  struct alignas(64) ParkedFlag : std::atomic<bool> {
    using std::atomic<bool>::atomic;
  };
  ParkedFlag consumer_parked{false};
  void wake() noexcept {
    if (consumer_parked.load(std::memory_order_relaxed)) [[unlikely]]
      wake_slow();
  }

private:
  void wake_slow() noexcept;

public:

private:
  struct Waiter {
    std::coroutine_handle<> h;
    Executor* ex;
    std::function<void(Error)> fn;
    bool has_error;
  };
  using Waiters = std::multimap<std::uint64_t, Waiter>;
  void run(Waiter& w, std::uint64_t seq);
  /// Runs `w` now if `seq` is ready, else keeps it until complete(), fail() or settle().
  void run_or_park(std::uint64_t seq, Waiter w);
  /// Takes the waiters in [first, last) out, unlocks, wakes waiting threads and runs them.
  void resume(std::unique_lock<std::mutex>& lock, Waiters::iterator first, Waiters::iterator last);
  /// Keeps `e` as the error of `seq` (under mu_), forgetting the oldest past a bound.
  void keep_error(std::uint64_t seq, Error e);

  std::unique_ptr<const std::function<void()>> nudge_fn_; // owned here, read through nudge_
  std::atomic<const std::function<void()>*> nudge_{nullptr};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<std::uint64_t> completed_{0};
  std::atomic<bool> failed_{false};
  Error failure_;
  std::map<std::uint64_t, Error> errors_; // bounded, see keep_error
  Waiters waiters_;
  std::uint64_t next_immediate_ = 0;
  std::atomic<std::uint64_t> settled_{deferred_bit}; // the last deferred ticket settled
  std::uint64_t next_deferred_ = 0;
};

/// Holds what `finish` reports, filled before the finish ticket completes.
struct FinishState {
  std::mutex mu;
  FinishResult result;
};

} // namespace chorus::client
