#include "python/events.hpp"

#include "python/convert.hpp"
#include "python/ticket.hpp"

#include "io/store/event_log.hpp"

#include "runtime/client/run_impl.hpp"

#include <pybind11/stl.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <coroutine>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chorus::python {
namespace {

/// Text chorus wrote, as a str (a byte that is not UTF-8 shown as U+FFFD
/// rather than failing the event).
py::object text(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

// ---------------------------------------------------------------------------
// Run.on_event: a feed that one Python thread takes the events from.

/// The executor on_event's calls are posted to. chorus posts a coroutine per
/// event (it calls the feed's function, which only queues the event) and
/// goes on; the Python thread resumes it in take(), without the GIL.
struct FeedState final : Executor {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::coroutine_handle<>> posted; // calls not resumed yet
  std::deque<Event> events;                   // what resumed calls handed over
  bool ending = false; // what is posted is taken, then the end
  bool closed = false; // the end: nothing more is taken

  void post(std::coroutine_handle<> h) override {
    {
      std::lock_guard lock(mu);
      if (!closed) {
        posted.push_back(h);
        cv.notify_one();
        return;
      }
    }
    h.destroy(); // not started: frees its copy of the event (outside the lock: it may end the feed)
  }

  void end() {
    {
      std::lock_guard lock(mu);
      ending = true;
    }
    cv.notify_all();
  }

  void close() {
    std::deque<std::coroutine_handle<>> dropped;
    {
      std::lock_guard lock(mu);
      closed = true;
      dropped.swap(posted);
      events.clear();
    }
    cv.notify_all();
    for (std::coroutine_handle<> h : dropped) h.destroy();
  }

  /// The next event, or nothing at the end; blocks until one of them.
  std::optional<Event> take() {
    std::unique_lock lock(mu);
    for (;;) {
      if (closed) return std::nullopt;
      if (!events.empty()) {
        Event e = std::move(events.front());
        events.pop_front();
        return e;
      }
      if (!posted.empty()) {
        const std::coroutine_handle<> h = posted.front();
        posted.pop_front();
        lock.unlock();
        h.resume(); // the call queues its event and frees itself
        lock.lock();
        continue;
      }
      if (ending) {
        closed = true;
        return std::nullopt;
      }
      cv.wait(lock);
    }
  }
};

/// Held by the function chorus keeps for the feed: once chorus lets go of
/// it (the run's handle was dropped, or the run is inactive and kept none),
/// no more events come and the feed ends.
struct FeedEnder {
  explicit FeedEnder(std::shared_ptr<FeedState> f) noexcept : feed(std::move(f)) {}
  FeedEnder(const FeedEnder&) = delete;
  FeedEnder& operator=(const FeedEnder&) = delete;
  ~FeedEnder() { feed->end(); }
  std::shared_ptr<FeedState> feed;
};

struct EventFeed {
  std::shared_ptr<FeedState> state;
};

/// The feed ends, once what was posted is taken, when the run's finish
/// completes: on the run host the run's last event (run_finished) is
/// delivered before it. Nothing where the run is not finishing.
void end_after_finish(Run& run, const std::shared_ptr<FeedState>& feed) {
  client::RunImpl* impl = client::live(client::RunAccess::impl(run));
  if (impl == nullptr) return feed->end();
  if (!impl->finishing()) return;
  // A second finish() returns the first's ticket (chorus.hpp).
  run.finish().on_done([feed](const FinishResult&) { feed->end(); });
}

EventFeed event_feed(Run& run) {
  auto feed = std::make_shared<FeedState>();
  auto ender = std::make_shared<FeedEnder>(feed);
  run.on_event(
      [feed, ender](const Event& e) {
        std::lock_guard lock(feed->mu);
        feed->events.push_back(e);
      },
      *feed);
  end_after_finish(run, feed);
  return EventFeed{std::move(feed)};
}

// ---------------------------------------------------------------------------
// run.events() in asyncio: the run's next_event, resumed on the event loop.

/// The executor a fetch resumes on: chorus posts the coroutine and writes
/// the eventfd, which the event loop watches; the loop resumes it (drain).
struct FetchState final : Executor {
  int fd = -1;
  std::mutex mu;
  std::vector<std::coroutine_handle<>> posted;
  bool in_flight = false; // a fetch waits for the next event
  bool has = false;       // it came: `result` (nothing: the end)
  std::optional<Event> result;

  FetchState() {
    fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) throw std::runtime_error("eventfd failed: " + std::string(std::strerror(errno)));
  }
  FetchState(const FetchState&) = delete;
  FetchState& operator=(const FetchState&) = delete;
  ~FetchState() override { ::close(fd); }

  void post(std::coroutine_handle<> h) override {
    {
      std::lock_guard lock(mu);
      posted.push_back(h);
    }
    const std::uint64_t one = 1;
    while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }
};

/// One co_await of Run::next_event, resumed on its FetchState.
struct Fetch {
  struct promise_type {
    Executor* ex;
    promise_type(const std::shared_ptr<FetchState>& s, const EventPending&) noexcept : ex(s.get()) {}
    Executor* executor() const noexcept { return ex; }
    Fetch get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

Fetch fetch(std::shared_ptr<FetchState> s, EventPending p) {
  std::optional<Event> e = co_await p;
  std::lock_guard lock(s->mu);
  s->result = std::move(e);
  s->has = true;
  s->in_flight = false;
}

struct EventFetch {
  std::shared_ptr<FetchState> state = std::make_shared<FetchState>();
};

// ---------------------------------------------------------------------------
// Run.next_event(timeout): a blocking wait, in slices, for Ctrl-C.

py::object next_event(Run& run, std::optional<double> timeout) {
  using clock = std::chrono::steady_clock;
  std::optional<clock::time_point> until;
  if (timeout) {
    if (!std::isfinite(*timeout) || *timeout < 0) invalid("timeout " + seconds_text(*timeout) + ": give seconds >= 0");
    until = clock::now() + std::chrono::microseconds(static_cast<long long>(*timeout * 1e6));
  }
  const EventPending p = run.next_event();
  for (;;) {
    // An event queued, or the end: taken without blocking.
    if (p.await_ready()) {
      std::optional<Event> e = p.await_resume();
      return e ? py::object(event_tuple(*e)) : py::object(py::none());
    }
    auto slice = std::chrono::milliseconds(100);
    if (until) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*until - clock::now());
      if (left.count() <= 0) return py::none();
      slice = std::min(slice, left + std::chrono::milliseconds(1));
    }
    std::optional<Event> e;
    {
      py::gil_scoped_release unlocked;
      e = p.wait_for(slice);
    }
    if (e) return event_tuple(*e);
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

/// Adds `f` to `cls` as its method `name`.
template <class F, class... Extra>
void add_method(py::handle cls, const char* name, F&& f, const Extra&... extra) {
  py::cpp_function method(std::forward<F>(f), py::name(name), py::is_method(cls),
                          py::sibling(py::getattr(cls, name, py::none())), extra...);
  py::setattr(cls, name, method);
}

} // namespace

py::tuple event_tuple(const Event& e) {
  py::list ranks;
  for (const int r : e.ranks) ranks.append(r);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(e.time.time_since_epoch()).count();
  const py::object none = py::none();
  return py::make_tuple(std::string(to_string(e.kind)), e.step >= 0 ? py::object(py::int_(e.step)) : none,
                        e.rank >= 0 ? py::object(py::int_(e.rank)) : none, e.key.empty() ? none : text(e.key),
                        static_cast<double>(us) / 1e6, text(e.message), ranks,
                        store::event_has_state(e.kind) ? py::object(py::str(std::string(to_string(e.state)))) : none,
                        text(e.json));
}

void bind_events(py::module_& m, py::handle run_class, RunOf run_of) {
  py::class_<EventFeed>(m, "EventFeed", "A run's events for Run.on_event's thread (chorus/_events.py).")
      .def(
          "take",
          [](const EventFeed& f) -> py::object {
            // Ended (at the interpreter's exit, say): answered without letting go of the
            // GIL, which a daemon thread could not take back once the interpreter finalizes.
            {
              std::lock_guard lock(f.state->mu);
              if (f.state->closed) return py::none();
            }
            std::optional<Event> e;
            {
              py::gil_scoped_release unlocked;
              e = f.state->take();
            }
            return e ? py::object(event_tuple(*e)) : py::object(py::none());
          },
          "The next event as a tuple, or None at the feed's end; blocks (without the GIL) until one.")
      .def(
          "close", [](const EventFeed& f) { f.state->close(); },
          "Ends the feed now: take() gives None, and later events are dropped.");

  py::class_<EventFetch>(m, "EventFetch", "A run's next_event() resumed on an asyncio loop (chorus/_events.py).")
      .def(py::init<>())
      .def("fileno", [](const EventFetch& f) { return f.state->fd; })
      .def(
          "start",
          [run_of](const EventFetch& f, py::handle run) {
            Run& r = run_of(run);
            {
              std::lock_guard lock(f.state->mu);
              if (f.state->in_flight || f.state->has) return;
              f.state->in_flight = true;
            }
            fetch(f.state, r.next_event());
          },
          py::arg("run"), "Asks for the run's next event, unless a request is in flight or answered.")
      .def(
          "drain",
          [](const EventFetch& f) {
            std::uint64_t count = 0;
            while (::read(f.state->fd, &count, sizeof count) < 0 && errno == EINTR) {
            }
            std::vector<std::coroutine_handle<>> posted;
            {
              std::lock_guard lock(f.state->mu);
              posted.swap(f.state->posted);
            }
            for (std::coroutine_handle<> h : posted) h.resume();
          },
          "Resumes what chorus posted (the event loop calls it when the fd is readable).")
      .def(
          "take",
          [](const EventFetch& f) -> py::tuple {
            std::optional<Event> e;
            {
              std::lock_guard lock(f.state->mu);
              if (!f.state->has) return py::make_tuple(false, py::none());
              f.state->has = false;
              e = std::move(f.state->result);
              f.state->result.reset();
            }
            return py::make_tuple(true, e ? py::object(event_tuple(*e)) : py::object(py::none()));
          },
          "(True, event tuple or None at the end) once the request is answered, else (False, None).");

  add_method(
      run_class, "_alert_when",
      [run_of](py::handle self, std::string_view key, int kind, double limit) {
        Run& run = run_of(self);
        const AlertRule rule{static_cast<AlertRule::Kind>(kind), limit};
        Pending p;
        {
          py::gil_scoped_release unlocked;
          p = run.alert_when(key, rule);
        }
        return ticket(self, p);
      },
      py::arg("key"), py::arg("kind"), py::arg("limit"));
  add_method(
      run_class, "_next_event",
      [run_of](py::handle self, py::handle timeout) {
        std::optional<double> seconds;
        if (!timeout.is_none()) {
          seconds = PyFloat_AsDouble(timeout.ptr());
          if (*seconds == -1.0 && PyErr_Occurred()) throw py::error_already_set();
        }
        return next_event(run_of(self), seconds);
      },
      py::arg("timeout") = py::none());
  add_method(run_class, "_event_feed", [run_of](py::handle self) {
    Run& run = run_of(self);
    py::gil_scoped_release unlocked;
    return event_feed(run);
  });
  add_method(run_class, "_end_event_feed", [run_of](py::handle self, const EventFeed& f) {
    Run& run = run_of(self);
    py::gil_scoped_release unlocked;
    end_after_finish(run, f.state);
  });
}

} // namespace chorus::python
