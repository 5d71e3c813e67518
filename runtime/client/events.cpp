#include "runtime/client/events.hpp"

namespace chorus::client {
namespace {

/// One callback's call, posted to the trainer's executor as a coroutine
/// that frees itself when it ends.
struct CallOnce {
  struct promise_type {
    CallOnce get_return_object() noexcept { return {std::coroutine_handle<promise_type>::from_promise(*this)}; }
    std::suspend_always initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
  std::coroutine_handle<promise_type> h;
};

CallOnce call(std::shared_ptr<const std::function<void(const Event&)>> fn, Event event) {
  (*fn)(event);
  co_return;
}

void resume_on(std::coroutine_handle<> h, Executor* ex) {
  if (ex)
    ex->post(h);
  else
    h.resume();
}

} // namespace

std::optional<Event> EventHub::pop() {
  if (queue_.empty()) return std::nullopt;
  Event e = std::move(queue_.front());
  queue_.pop_front();
  return e;
}

void EventHub::deliver(const Event& event) {
  std::vector<std::shared_ptr<Callback>> callbacks;
  std::vector<std::function<void(const Event&)>> sinks;
  std::optional<Waiter> woken;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    callbacks = callbacks_;
    sinks = sinks_;
    if (!waiters_.empty()) {
      woken = waiters_.front();
      waiters_.pop_front();
      handed_[woken->key] = event;
    } else {
      if (queue_.size() == keep) {
        queue_.pop_front();
        ++dropped_;
      }
      queue_.push_back(event);
    }
  }
  cv_.notify_all();
  for (const auto& sink : sinks) sink(event);
  for (const auto& cb : callbacks) {
    auto fn = std::shared_ptr<const std::function<void(const Event&)>>(cb, &cb->fn);
    cb->ex->post(call(std::move(fn), event).h);
  }
  if (woken) resume_on(woken->h, woken->ex);
}

void EventHub::close() {
  std::deque<Waiter> woken;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    woken.swap(waiters_);
    for (const Waiter& w : woken) handed_[w.key] = std::nullopt;
  }
  cv_.notify_all();
  for (const Waiter& w : woken) resume_on(w.h, w.ex);
}

void EventHub::on_event(std::function<void(const Event&)> fn, Executor& executor) {
  if (!fn) return;
  std::lock_guard lock(mu_);
  callbacks_.push_back(std::make_shared<Callback>(Callback{std::move(fn), &executor}));
}

void EventHub::add_sink(std::function<void(const Event&)> fn) {
  if (!fn) return;
  std::lock_guard lock(mu_);
  sinks_.push_back(std::move(fn));
}

bool EventHub::ready(const void* awaiter) {
  std::lock_guard lock(mu_);
  if (auto e = pop()) {
    handed_[awaiter] = std::move(e);
    return true;
  }
  if (closed_) {
    handed_[awaiter] = std::nullopt;
    return true;
  }
  return false;
}

void EventHub::suspend(const void* awaiter, std::coroutine_handle<> h, Executor* ex) {
  {
    std::lock_guard lock(mu_);
    if (auto e = pop()) {
      handed_[awaiter] = std::move(e);
    } else if (closed_) {
      handed_[awaiter] = std::nullopt;
    } else {
      waiters_.push_back({awaiter, h, ex});
      return;
    }
  }
  resume_on(h, ex); // it came meanwhile
}

std::optional<Event> EventHub::resume(const void* awaiter) {
  std::lock_guard lock(mu_);
  auto it = handed_.find(awaiter);
  if (it == handed_.end()) return std::nullopt;
  std::optional<Event> e = std::move(it->second);
  handed_.erase(it);
  return e;
}

std::optional<Event> EventHub::wait(std::optional<std::chrono::steady_clock::time_point> until) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (auto e = pop()) return e;
    if (closed_) return std::nullopt;
    if (!until)
      cv_.wait(lock);
    else if (cv_.wait_until(lock, *until) == std::cv_status::timeout && queue_.empty())
      return std::nullopt;
  }
}

std::uint64_t EventHub::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

} // namespace chorus::client

namespace chorus {

std::optional<Event> EventPending::wait() const { return hub_ ? hub_->wait(std::nullopt) : std::nullopt; }

std::optional<Event> EventPending::wait_for(std::chrono::milliseconds d) const {
  return hub_ ? hub_->wait(std::chrono::steady_clock::now() + d) : std::nullopt;
}

bool EventPending::await_ready() const noexcept { return !hub_ || hub_->ready(this); }

void EventPending::suspend(std::coroutine_handle<> h, Executor* ex) const {
  if (hub_) return hub_->suspend(this, h, ex);
  if (ex)
    ex->post(h);
  else
    h.resume();
}

std::optional<Event> EventPending::await_resume() const { return hub_ ? hub_->resume(this) : std::nullopt; }

} // namespace chorus
