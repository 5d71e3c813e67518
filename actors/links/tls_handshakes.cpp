// TLS handshakes off the multiplexer thread: see actors/links/tls_handshakes.hpp.
#include "actors/links/tls_handshakes.hpp"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stop_token>
#include <thread>

namespace chorus::actors {

/// One thread, its epoll set, and the connections whose handshakes it makes.
class TlsHandshakes::Worker {
public:
  Worker() : epoll_(::epoll_create1(EPOLL_CLOEXEC)), wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wake_;
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
    thread_ = std::jthread([this](std::stop_token stop) { run(stop); });
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ~Worker() {
    thread_.request_stop();
    poke();
    thread_.join();
    for (auto& [fd, c] : live_) ::close(fd);
    for (auto& c : incoming_) ::close(c.fd);
    ::close(epoll_);
    ::close(wake_);
  }

  void add(int fd, std::unique_ptr<TlsSession> session, std::string peer, clock::time_point deadline, Done done) {
    {
      std::lock_guard lock(mutex_);
      incoming_.push_back({fd, std::move(session), std::move(peer), deadline, std::move(done)});
    }
    poke();
  }

private:
  struct Connection {
    int fd = -1;
    std::unique_ptr<TlsSession> session;
    std::string peer;
    clock::time_point deadline;
    Done done;
    std::uint32_t events = 0; // what epoll watches for it (0: not in the set)
  };

  void poke() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_, &one, sizeof one);
  }

  void run(const std::stop_token& stop) {
    ::pthread_setname_np(::pthread_self(), "chorus.tls");
    std::vector<epoll_event> events(64);
    while (!stop.stop_requested()) {
      std::vector<Connection> arrived;
      {
        std::lock_guard lock(mutex_);
        arrived.swap(incoming_);
      }
      for (auto& c : arrived) {
        const int fd = c.fd;
        if (step(c)) live_.emplace(fd, std::move(c));
      }
      // Those past their deadline are closed; the next deadline bounds the wait.
      const auto now = clock::now();
      auto next = clock::time_point::max();
      for (auto it = live_.begin(); it != live_.end();) {
        if (it->second.deadline <= now) {
          forget(it->second);
          ::close(it->first);
          it = live_.erase(it);
        } else {
          next = std::min(next, it->second.deadline);
          ++it;
        }
      }
      const int timeout =
          next == clock::time_point::max()
              ? -1
              : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count());
      const int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), timeout);
      for (int i = 0; i < n; ++i) {
        const int fd = events[static_cast<std::size_t>(i)].data.fd;
        if (fd == wake_) {
          std::uint64_t count = 0;
          [[maybe_unused]] const ssize_t r = ::read(wake_, &count, sizeof count);
          continue;
        }
        const auto it = live_.find(fd);
        if (it != live_.end() && !step(it->second)) live_.erase(it);
      }
    }
  }

  /// Moves `c`'s handshake on: true while it waits for its socket (epoll
  /// watches it then); false once it is handed over or closed.
  bool step(Connection& c) {
    std::size_t n = 0;
    // A write of nothing is done once the handshake is over.
    const TlsSession::Io io = c.session->write(nullptr, 0, n);
    if (io == TlsSession::Io::done) {
      forget(c);
      c.done(c.fd, std::move(c.session));
      return false;
    }
    if (io == TlsSession::Io::wait) {
      watch(c, EPOLLIN | (c.session->wants_write() ? EPOLLOUT : 0u));
      return true;
    }
    if (io == TlsSession::Io::failed) say_handshake_failed(c.peer, c.session->why());
    forget(c);
    ::close(c.fd);
    return false;
  }

  void watch(Connection& c, std::uint32_t events) {
    if (c.events == events) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = c.fd;
    ::epoll_ctl(epoll_, c.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd, &ev);
    c.events = events;
  }

  /// Out of the epoll set, before the socket is closed or handed over.
  void forget(Connection& c) {
    if (c.events != 0) ::epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
    c.events = 0;
  }

  const int epoll_;
  const int wake_;
  std::mutex mutex_;
  std::vector<Connection> incoming_; // handed over, not yet seen by the thread
  std::map<int, Connection> live_;   // the thread's own
  std::jthread thread_;              // last: stopped and joined before the rest goes
};

TlsHandshakes::TlsHandshakes(unsigned threads) {
  for (unsigned i = 0; i < std::max(threads, 1u); ++i) workers_.push_back(std::make_unique<Worker>());
}

TlsHandshakes::~TlsHandshakes() = default;

void TlsHandshakes::start(int fd, std::unique_ptr<TlsSession> session, std::string peer, clock::time_point deadline,
                          Done done) {
  const unsigned i = next_.fetch_add(1, std::memory_order_relaxed) % static_cast<unsigned>(workers_.size());
  workers_[i]->add(fd, std::move(session), std::move(peer), deadline, std::move(done));
}

unsigned TlsHandshakes::default_threads() {
  const unsigned cores = std::thread::hardware_concurrency();
  return std::clamp(cores > 1 ? cores - 1 : 1u, 1u, 8u);
}

} // namespace chorus::actors
