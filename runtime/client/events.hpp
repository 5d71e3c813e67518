// A rank's side of the run's events (README, "When something goes wrong"):
// the RankProxy hands each event the run host tells to the rank's EventHub,
// which passes it on to what the trainer asked for: `Run::on_event`
// callbacks (posted to the trainer's executor, never run on a chorus
// thread), `Run::next_event` (a queue of the run's events, one consumer
// cursor, awaited or waited on), and sinks called on the delivering thread
// (<chorus/caf.hpp>'s subscribe, which only enqueues a CAF message).
#pragma once

#include <chorus/chorus.hpp>

#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace chorus::client {

class EventHub {
public:
  /// The events next_event keeps for its consumer; older ones are dropped
  /// (counted in dropped()).
  static constexpr std::size_t keep = 4096;

  EventHub() = default;
  EventHub(const EventHub&) = delete;
  EventHub& operator=(const EventHub&) = delete;

  // The RankProxy's side.
  /// One event of the run, in the order the run host told them.
  void deliver(const Event& event);
  /// Nothing more comes (the run ended, or this rank's part of it did):
  /// waiting consumers get nothing.
  void close();

  // The trainer's side.
  void on_event(std::function<void(const Event&)> fn, Executor& executor);
  /// `fn` is called on the delivering thread: it must only hand the event on.
  void add_sink(std::function<void(const Event&)> fn);

  // EventPending's (keyed by the awaiter's address while it waits).
  bool ready(const void* awaiter);
  void suspend(const void* awaiter, std::coroutine_handle<> h, Executor* ex);
  std::optional<Event> resume(const void* awaiter);
  std::optional<Event> wait(std::optional<std::chrono::steady_clock::time_point> until);

  [[nodiscard]] std::uint64_t dropped() const;

private:
  struct Waiter {
    const void* key;
    std::coroutine_handle<> h;
    Executor* ex;
  };
  struct Callback {
    std::function<void(const Event&)> fn;
    Executor* ex;
  };
  /// Under mu_: the next queued event for a consumer, or nothing.
  std::optional<Event> pop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> queue_;
  std::uint64_t dropped_ = 0;
  bool closed_ = false;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<std::function<void(const Event&)>> sinks_;
  std::deque<Waiter> waiters_;
  // Awaiters handed an event (or the end, nullopt) before they resume.
  std::map<const void*, std::optional<Event>> handed_;
};

} // namespace chorus::client
