#include "runtime/client/channel.hpp"

#include <deque>
#include <thread>

namespace chorus::client {

// ---------------------------------------------------------------------------
// CompletionThread

struct CompletionThread::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
};

CompletionThread::CompletionThread() : s_(new State) {
  std::thread([s = s_] {
    std::unique_lock lock(s->mu);
    for (;;) {
      s->cv.wait(lock, [&] { return !s->queue.empty(); });
      auto fn = std::move(s->queue.front());
      s->queue.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }).detach();
}

CompletionThread& CompletionThread::instance() {
  static CompletionThread* t = new CompletionThread;
  return *t;
}

void CompletionThread::post(std::function<void()> fn) {
  {
    std::lock_guard lock(s_->mu);
    s_->queue.push_back(std::move(fn));
  }
  s_->cv.notify_one();
}

// ---------------------------------------------------------------------------
// Channel

namespace {
constexpr std::size_t max_kept_errors = 4096;
}

Error Channel::result(std::uint64_t seq, bool has_error) const {
  std::lock_guard lock(mu_);
  if (auto it = errors_.find(seq); it != errors_.end()) return it->second;
  if ((seq & immediate_bit) != 0)
    return has_error ? Error{Errc::internal, "the error of this call was discarded: more than 4096 errors are kept"}
                     : Error{Errc::dropped, "the queue was full (Overflow::drop_newest): raise Options::queue_capacity "
                                            "or use Overflow::block"};
  if ((seq & deferred_bit) == 0 && completed_.load(std::memory_order_acquire) < seq &&
      failed_.load(std::memory_order_acquire))
    return failure_;
  return {};
}

void Channel::keep_error(std::uint64_t seq, Error e) {
  if (errors_.size() >= max_kept_errors) errors_.erase(errors_.begin());
  errors_.emplace(seq, std::move(e));
}

void Channel::set_error(std::uint64_t seq, Error e) {
  std::lock_guard lock(mu_);
  keep_error(seq, std::move(e));
}

std::uint64_t Channel::immediate(Error e) {
  std::lock_guard lock(mu_);
  const std::uint64_t id = immediate_bit | ++next_immediate_;
  keep_error(id, std::move(e));
  return id;
}

std::uint64_t Channel::defer() {
  std::lock_guard lock(mu_);
  return deferred_bit | ++next_deferred_;
}

Error Channel::wait(std::uint64_t seq, bool has_error, std::optional<std::chrono::milliseconds> limit) {
  if (!ready(seq)) {
    nudge();
    std::unique_lock lock(mu_);
    auto done = [&] { return ready(seq); };
    if (limit) {
      if (!cv_.wait_for(lock, *limit, done))
        return {Errc::timeout, "still not committed after " + std::to_string(limit->count()) +
                                   " ms: the run host is slow or unreachable; wait longer or check the host rank"};
    } else {
      cv_.wait(lock, done);
    }
  }
  return result(seq, has_error);
}

void Channel::run(Waiter& w, std::uint64_t seq) {
  if (w.h) {
    if (w.ex)
      w.ex->post(w.h);
    else
      CompletionThread::instance().post([h = w.h] { h.resume(); });
  } else if (w.fn) {
    CompletionThread::instance().post(
        [this, fn = std::move(w.fn), seq, has_error = w.has_error] { fn(result(seq, has_error)); });
  }
}

void Channel::run_or_park(std::uint64_t seq, Waiter w) {
  {
    std::lock_guard lock(mu_);
    if (!ready(seq)) {
      waiters_.emplace(seq, std::move(w));
      nudge();
      return;
    }
  }
  run(w, seq);
}

void Channel::suspend(std::uint64_t seq, std::coroutine_handle<> h, Executor* ex) {
  run_or_park(seq, Waiter{h, ex, {}, false});
}

void Channel::on_done(std::uint64_t seq, bool has_error, std::function<void(Error)> fn) {
  run_or_park(seq, Waiter{{}, nullptr, std::move(fn), has_error});
}

void Channel::resume(std::unique_lock<std::mutex>& lock, Waiters::iterator first, Waiters::iterator last) {
  Waiters due;
  due.insert(std::make_move_iterator(first), std::make_move_iterator(last));
  waiters_.erase(first, last);
  lock.unlock();
  cv_.notify_all();
  for (auto& [s, w] : due) run(w, s);
}

void Channel::complete(std::uint64_t seq) {
  std::unique_lock lock(mu_);
  if (seq <= completed_.load(std::memory_order_relaxed)) return;
  completed_.store(seq, std::memory_order_release);
  resume(lock, waiters_.begin(), waiters_.upper_bound(seq));
}

void Channel::fail(Error e) {
  std::unique_lock lock(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  failure_ = std::move(e);
  failed_.store(true, std::memory_order_release);
  resume(lock, waiters_.begin(), waiters_.lower_bound(deferred_bit));
}

void Channel::settle(std::uint64_t id, Error e) {
  std::unique_lock lock(mu_);
  if (e) keep_error(id, std::move(e));
  if (id <= settled_.load(std::memory_order_relaxed)) return;
  settled_.store(id, std::memory_order_release);
  resume(lock, waiters_.lower_bound(deferred_bit), waiters_.upper_bound(id));
}

void Channel::wake_slow() noexcept {
  if (consumer_parked.exchange(false, std::memory_order_acq_rel)) nudge();
}

void Channel::nudge() const noexcept {
  const std::function<void()>* fn = nudge_.load(std::memory_order_acquire);
  if (fn == nullptr) return;
  try {
    (*fn)();
  } catch (...) {
    // The proxy's own poll picks the values up.
  }
}

void Channel::set_nudge(std::function<void()> fn) {
  nudge_fn_ = std::make_unique<const std::function<void()>>(std::move(fn));
  nudge_.store(nudge_fn_.get(), std::memory_order_release);
}

} // namespace chorus::client
