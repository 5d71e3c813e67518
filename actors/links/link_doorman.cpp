// The listener under every link a process accepts: see
// actors/links/link_doorman.hpp.
#include "actors/links/link_doorman.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace chorus::actors {

using caf::io::network::default_multiplexer;
using caf::io::network::native_socket;
using caf::io::network::operation;
using clock = std::chrono::steady_clock;

/// How handshake threads hand connections back to their doorman: a queue
/// and an eventfd that the multiplexer watches (Wakeup). A handshake thread
/// touches neither CAF nor the doorman: it queues and writes the eventfd,
/// which never blocks. Closed as the doorman stops taking connections: a
/// connection handed back after is closed.
class LinkDoorman::Gate {
public:
  Gate() : efd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~Gate() {
    close();
    if (efd_ >= 0) ::close(efd_);
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  [[nodiscard]] int efd() const noexcept { return efd_; }

  /// On a handshake thread.
  void pass(native_socket fd, std::unique_ptr<TlsSession> session, clock::time_point due) {
    {
      std::lock_guard lock(mutex_);
      if (closed_) {
        session.reset();
        ::close(fd);
        return;
      }
      ready_.push_back({fd, std::move(session), due});
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(efd_, &one, sizeof one);
  }

  struct Ready {
    native_socket fd;
    std::unique_ptr<TlsSession> session;
    clock::time_point due;
  };
  /// On the multiplexer thread: what was handed back since the last call.
  std::vector<Ready> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(ready_, {});
  }

  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    for (Ready& r : ready_) {
      r.session.reset();
      ::close(r.fd);
    }
    ready_.clear();
  }

private:
  const int efd_;
  std::mutex mutex_;
  std::vector<Ready> ready_;
  bool closed_ = false;
};

/// The gate's eventfd in the multiplexer's loop (a descriptor of its own,
/// which CAF closes with the handler). While it is in the loop it holds its
/// doorman, as CAF's acceptor does.
class LinkDoorman::Wakeup final : public caf::io::network::event_handler {
public:
  Wakeup(default_multiplexer& mx, native_socket fd) : event_handler(mx, fd) {}

  /// On the multiplexer thread, once.
  void start(LinkDoorman* doorman) {
    if (owner_ || fd() < 0) return;
    owner_.reset(doorman);
    activate();
  }
  void stop() {
    if (!owner_ || stopping_) return;
    stopping_ = true;
    passivate();
  }

  void handle_event(operation op) override {
    if (op != operation::read) return;
    std::uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(fd(), &count, sizeof count);
    if (owner_) owner_->arrived();
  }
  void removed_from_loop(operation op) override {
    if (op == operation::read) owner_.reset();
  }
  void graceful_shutdown() override { stop(); }

private:
  caf::intrusive_ptr<LinkDoorman> owner_;
  bool stopping_ = false; // taken out of the loop once
};

LinkDoorman::LinkDoorman(default_multiplexer& mx, native_socket fd, std::shared_ptr<LinkShared> shared)
    : doorman_impl(mx, fd), shared_(std::move(shared)), gate_(std::make_shared<Gate>()),
      wakeup_(std::make_unique<Wakeup>(mx, gate_->efd() >= 0 ? ::dup(gate_->efd()) : -1)) {}

LinkDoorman::~LinkDoorman() { gate_->close(); }

void LinkDoorman::graceful_shutdown() {
  gate_->close();
  wakeup_->stop();
  doorman_impl::graceful_shutdown();
}

void LinkDoorman::remove_from_loop() {
  gate_->close();
  wakeup_->stop();
  doorman_impl::remove_from_loop();
}

void LinkDoorman::arrived() {
  bool taking = true;
  for (Gate::Ready& r : gate_->take()) {
    if (taking) {
      taking = admitted(r.fd, std::move(r.session), r.due);
    } else {
      r.session.reset();
      ::close(r.fd);
    }
  }
}

bool LinkDoorman::new_connection() {
  if (detached()) return false;
  const native_socket fd = acceptor_.accepted_socket();
  caf::io::network::nonblocking(fd, true);
  std::unique_ptr<TlsSession> session;
  if (!admit(fd, session)) {
    ::close(fd);
    return true; // that connection only; the listener goes on
  }
  if (!session) return admitted(fd, nullptr, {});
  // Its TLS handshake on a handshake thread; it comes back through the gate,
  // with what is left of its deadline for its BASP handshake.
  wakeup_->start(this);
  const auto due = clock::now() + shared_->handshake_deadline();
  shared_->handshakes().start(fd, std::move(session), peer_of(fd), due,
                              [gate = gate_, due](int done, std::unique_ptr<TlsSession> s) {
                                gate->pass(done, std::move(s), due);
                              });
  return true;
}

bool LinkDoorman::admitted(native_socket fd, std::unique_ptr<TlsSession> session, clock::time_point due) {
  if (detached()) {
    ::close(fd);
    return false;
  }
  auto& mx = acceptor_.backend();
  auto scribe = make_link_scribe(mx, fd, std::move(session), true, shared_, due);
  auto hdl = scribe->hdl();
  parent()->add_scribe(std::move(scribe));
  return doorman::new_connection(&mx, hdl);
}

} // namespace chorus::actors
