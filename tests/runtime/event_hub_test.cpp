// A rank's side of the run's events (runtime/client/events.hpp): next_event
// awaited in a chorus::task (resumed on the awaiting thread), waited on, and
// ended by the run's end; on_event's callbacks posted to the trainer's own
// executor, in order; a sink called at once; the queue's bound.
#define BOOST_TEST_MODULE runtime_event_hub
#include <boost/test/unit_test.hpp>

#include "runtime/client/events.hpp"

#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

using namespace chorus;
using chorus::client::EventHub;
using namespace std::chrono_literals;

namespace {

Event event(EventKind kind, std::int64_t step) {
  Event e;
  e.kind = kind;
  e.step = step;
  e.message = "step " + std::to_string(step);
  return e;
}

/// Awaits the hub's next event in a chorus::task, noting the thread it resumed on.
task<std::optional<Event>> next(EventHub& hub, std::thread::id& resumed_on) {
  std::optional<Event> e = co_await EventPending(&hub);
  resumed_on = std::this_thread::get_id();
  co_return e;
}

/// An executor of the test's: posted handles wait until run() (on the caller's thread).
class Queue final : public Executor {
public:
  void post(std::coroutine_handle<> h) override {
    std::lock_guard lock(mu_);
    q_.push_back(h);
  }
  std::size_t run() {
    std::deque<std::coroutine_handle<>> q;
    {
      std::lock_guard lock(mu_);
      q.swap(q_);
    }
    for (auto h : q) h.resume();
    return q.size();
  }

private:
  std::mutex mu_;
  std::deque<std::coroutine_handle<>> q_;
};

} // namespace

BOOST_AUTO_TEST_CASE(an_awaited_event_resumes_the_task_on_its_own_thread) {
  EventHub hub;
  std::thread teller([&] {
    std::this_thread::sleep_for(50ms); // the task waits first
    hub.deliver(event(EventKind::stalled, 12));
  });
  std::thread::id resumed_on;
  const std::optional<Event> e = sync_wait(next(hub, resumed_on));
  teller.join();
  BOOST_REQUIRE(e.has_value());
  BOOST_TEST((e->kind == EventKind::stalled));
  BOOST_TEST(e->step == 12);
  BOOST_TEST((resumed_on == std::this_thread::get_id()));
}

BOOST_AUTO_TEST_CASE(events_told_before_they_are_awaited_wait_in_order) {
  EventHub hub;
  for (int s = 0; s < 3; ++s) hub.deliver(event(EventKind::nonfinite, s));
  std::thread::id resumed_on;
  for (int s = 0; s < 3; ++s) {
    const std::optional<Event> e = sync_wait(next(hub, resumed_on));
    BOOST_REQUIRE(e.has_value());
    BOOST_TEST(e->step == s);
  }
  BOOST_TEST(!EventPending(&hub).wait_for(10ms).has_value()); // none left
}

BOOST_AUTO_TEST_CASE(the_end_resumes_a_waiting_task_with_nothing) {
  EventHub hub;
  std::thread closer([&] {
    std::this_thread::sleep_for(50ms);
    hub.close();
  });
  std::thread::id resumed_on;
  const std::optional<Event> e = sync_wait(next(hub, resumed_on));
  closer.join();
  BOOST_TEST(!e.has_value());
  BOOST_TEST(!EventPending(&hub).wait().has_value()); // and every later wait
  hub.deliver(event(EventKind::stalled, 1));          // nothing comes after the end
  BOOST_TEST(!EventPending(&hub).wait().has_value());
  BOOST_TEST(!EventPending(nullptr).wait().has_value()); // an inactive run's
}

BOOST_AUTO_TEST_CASE(two_waiters_each_take_one_event) {
  EventHub hub;
  std::optional<Event> a, b;
  std::thread ta([&] { a = EventPending(&hub).wait(); });
  std::thread tb([&] { b = EventPending(&hub).wait(); });
  std::this_thread::sleep_for(50ms);
  hub.deliver(event(EventKind::stalled, 1));
  hub.deliver(event(EventKind::resumed, 2));
  ta.join();
  tb.join();
  BOOST_REQUIRE(a.has_value());
  BOOST_REQUIRE(b.has_value());
  BOOST_TEST(a->step + b->step == 3);
}

BOOST_AUTO_TEST_CASE(callbacks_run_on_the_trainers_executor_in_order_and_sinks_at_once) {
  EventHub hub;
  Queue executor;
  std::vector<std::int64_t> called;
  std::vector<std::thread::id> threads;
  hub.on_event(
      [&](const Event& e) {
        called.push_back(e.step);
        threads.push_back(std::this_thread::get_id());
      },
      executor);
  std::vector<std::int64_t> sunk;
  hub.add_sink([&](const Event& e) { sunk.push_back(e.step); });
  std::thread teller([&] {
    for (int s = 0; s < 5; ++s) hub.deliver(event(EventKind::threshold, s));
  });
  teller.join();
  BOOST_TEST(called.empty()); // nothing runs on the teller's thread
  BOOST_TEST((sunk == std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  BOOST_TEST(executor.run() == 5u);
  BOOST_TEST((called == std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  for (const auto& t : threads) BOOST_TEST((t == std::this_thread::get_id()));
}

BOOST_AUTO_TEST_CASE(the_queue_keeps_the_last_events_and_counts_the_others) {
  EventHub hub;
  for (std::size_t s = 0; s < EventHub::keep + 3; ++s) hub.deliver(event(EventKind::nonfinite, static_cast<std::int64_t>(s)));
  BOOST_TEST(hub.dropped() == 3u);
  const std::optional<Event> first = EventPending(&hub).wait();
  BOOST_REQUIRE(first.has_value());
  BOOST_TEST(first->step == 3);
}
