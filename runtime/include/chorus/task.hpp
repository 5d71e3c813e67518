// chorus's coroutines: chorus::task, the Executor its awaiters resume on,
// and sync_wait. The plumbing behind `co_await run.log(...)`: a trainer
// names chorus::task and sync_wait, and needs nothing else from here.
// Included by <chorus/chorus.hpp>; it includes no CAF, Asio or CUDA header.
#pragma once

#include <chorus/export.hpp>

#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

namespace chorus {

/// Where a suspended chorus awaiter resumes. User code is never resumed on a
/// chorus-internal thread when it awaits from a chorus::task or sync_wait.
class CHORUS_API Executor {
public:
  virtual ~Executor() = default;
  virtual void post(std::coroutine_handle<> h) = 0;
};

namespace detail {

/// The executor a coroutine promise names, or nullptr.
template <class P>
Executor* executor_of(P& promise) noexcept {
  if constexpr (requires { promise.executor(); })
    return promise.executor();
  else
    return nullptr;
}

/// A single-threaded run loop for sync_wait.
class CHORUS_API Loop final : public Executor {
public:
  Loop();
  ~Loop() override;
  void post(std::coroutine_handle<> h) override;
  void run_until(const bool& done);
  void stop();

private:
  struct State;
  std::unique_ptr<State> state_;
};
} // namespace detail

template <class T = void>
class task;

namespace detail {
struct task_promise_base {
  std::coroutine_handle<> continuation = std::noop_coroutine();
  Executor* executor_ = nullptr;
  std::exception_ptr error;

  Executor* executor() const noexcept { return executor_; }
  std::suspend_always initial_suspend() noexcept { return {}; }
  struct final_awaiter {
    bool await_ready() noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      return h.promise().continuation;
    }
    void await_resume() noexcept {}
  };
  final_awaiter final_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { error = std::current_exception(); }
};

template <class T>
struct task_promise : task_promise_base {
  std::optional<T> value;
  task<T> get_return_object() noexcept;
  template <class U>
  void return_value(U&& v) {
    value.emplace(std::forward<U>(v));
  }
  T take() {
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }
};

template <>
struct task_promise<void> : task_promise_base {
  task<void> get_return_object() noexcept;
  void return_void() noexcept {}
  void take() {
    if (error) std::rethrow_exception(error);
  }
};
} // namespace detail

/// A lazy coroutine. Awaiting it from another task runs it on the awaiting
/// task's executor; `sync_wait` runs it on the calling thread.
template <class T>
class [[nodiscard]] task {
public:
  using promise_type = detail::task_promise<T>;
  using handle_type = std::coroutine_handle<promise_type>;

  task() noexcept = default;
  explicit task(handle_type h) noexcept : h_(h) {}
  task(task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  task& operator=(task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  task(const task&) = delete;
  task& operator=(const task&) = delete;
  ~task() {
    if (h_) h_.destroy();
  }

  bool await_ready() const noexcept { return !h_ || h_.done(); }
  template <class P>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<P> awaiting) noexcept {
    h_.promise().continuation = awaiting;
    h_.promise().executor_ = detail::executor_of(awaiting.promise());
    return h_;
  }
  T await_resume() { return h_.promise().take(); }

  /// Starts the task on `ex`; used by sync_wait and spawn.
  handle_type handle() const noexcept { return h_; }

private:
  handle_type h_;
};

namespace detail {
template <class T>
task<T> task_promise<T>::get_return_object() noexcept {
  return task<T>{std::coroutine_handle<task_promise<T>>::from_promise(*this)};
}
inline task<void> task_promise<void>::get_return_object() noexcept {
  return task<void>{std::coroutine_handle<task_promise<void>>::from_promise(*this)};
}

struct sync_flag_task {
  struct promise_type {
    bool* done = nullptr;
    Executor* ex = nullptr;
    Executor* executor() const noexcept { return ex; }
    sync_flag_task get_return_object() noexcept {
      return {std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    std::suspend_always initial_suspend() noexcept { return {}; }
    struct final_awaiter {
      bool await_ready() noexcept { return false; }
      void await_suspend(std::coroutine_handle<promise_type> h) noexcept { *h.promise().done = true; }
      void await_resume() noexcept {}
    };
    final_awaiter final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  std::coroutine_handle<promise_type> h;
};

/// Awaits a task's completion without taking its result, which sync_wait
/// takes afterwards (taking it twice would hand back a moved-from value).
template <class T>
struct completion_of {
  task<T>& t;
  bool await_ready() const noexcept { return t.await_ready(); }
  template <class P>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
    return t.await_suspend(h);
  }
  void await_resume() const noexcept {}
};

template <class T>
sync_flag_task sync_driver(task<T>& t) {
  co_await completion_of<T>{t};
}
} // namespace detail

/// Runs `t` to completion on the calling thread; chorus awaiters inside it
/// resume on this thread. Rethrows what the task threw.
template <class T>
T sync_wait(task<T> t) {
  detail::Loop loop;
  bool done = false;
  auto driver = detail::sync_driver(t);
  driver.h.promise().done = &done;
  driver.h.promise().ex = &loop;
  loop.post(driver.h);
  loop.run_until(done);
  driver.h.destroy();
  return t.await_resume();
}

} // namespace chorus
