// sync_wait's run loop and the ticket types' out-of-line members.
#include "runtime/client/channel.hpp"

#include <chorus/chorus.hpp>

#include <condition_variable>
#include <deque>
#include <mutex>

namespace chorus {
namespace detail {

struct Loop::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::coroutine_handle<>> ready;
};

Loop::Loop() : state_(std::make_unique<State>()) {}
Loop::~Loop() = default;

void Loop::post(std::coroutine_handle<> h) {
  // Told under the lock: once another thread posts the handle that ends
  // sync_wait's task, this Loop may be gone as soon as the lock is released
  // (run_until takes it before it returns).
  std::lock_guard lock(state_->mu);
  state_->ready.push_back(h);
  state_->cv.notify_one();
}

void Loop::run_until(const bool& done) {
  std::unique_lock lock(state_->mu);
  while (!done) {
    state_->cv.wait(lock, [&] { return !state_->ready.empty(); });
    auto h = state_->ready.front();
    state_->ready.pop_front();
    lock.unlock();
    h.resume();
    lock.lock();
  }
}

void Loop::stop() {}

} // namespace detail

bool Pending::ready() const noexcept { return ch_ == nullptr || ch_->ready(seq_); }

Error Pending::wait() const { return ch_ ? ch_->wait(seq_, has_error_, std::nullopt) : Error{}; }

Error Pending::wait_for(std::chrono::milliseconds d) const { return ch_ ? ch_->wait(seq_, has_error_, d) : Error{}; }

void Pending::on_done(std::function<void(Error)> fn) const {
  if (!ch_) {
    fn({});
    return;
  }
  ch_->on_done(seq_, has_error_, std::move(fn));
}

void Pending::suspend(std::coroutine_handle<> h, Executor* ex) const {
  if (!ch_) {
    if (ex)
      ex->post(h);
    else
      h.resume();
    return;
  }
  ch_->suspend(seq_, h, ex);
}

Error Pending::result() const { return ch_ ? ch_->result(seq_, has_error_) : Error{}; }

FinishResult FinishPending::result() const {
  if (!st_) {
    FinishResult inactive;
    inactive.state = RunState::inactive;
    return inactive;
  }
  std::lock_guard lock(st_->mu);
  FinishResult r = st_->result;
  if (!r.error)
    if (Error e = p_.await_resume()) r.error = std::move(e);
  return r;
}

FinishResult FinishPending::wait() const {
  (void)p_.wait();
  return result();
}

void FinishPending::on_done(std::function<void(FinishResult)> fn) const {
  p_.on_done([self = *this, fn = std::move(fn)](const Error&) { fn(self.result()); });
}

} // namespace chorus
