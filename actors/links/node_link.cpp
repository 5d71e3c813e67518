#include "actors/links/node_link.hpp"
#include "io/platform/posix.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/openssl/session.hpp>
#include <caf/policy/tcp.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>

namespace chorus::detail {
namespace {

using caf::io::network::default_multiplexer;
using caf::io::network::native_socket;
using caf::io::network::operation;
using caf::io::network::rw_state;
using clock = std::chrono::steady_clock;

/// How long a link whose peer stopped reading may keep this process's
/// actor system from stopping: CAF's graceful shutdown waits until a link's
/// writes are out, for ever where the peer hangs.
constexpr auto linger = std::chrono::seconds(1);

/// How long a dial's TCP connect may take before the dial tries again.
constexpr auto connect_limit = std::chrono::milliseconds(1000);

/// Links with a deadline, and a thread that shuts down those whose deadline
/// passed: an accepted connection that has not proved itself yet, and a
/// link that is closing with writes its peer does not take. Shutting a
/// socket down (rather than closing it) leaves it to its owner: the
/// multiplexer sees the end of the stream, the handshake or read fails, and
/// CAF drops the connection as it drops any that broke.
class Handshakes {
public:
  explicit Handshakes(std::chrono::milliseconds deadline) : deadline_(deadline) {
    reaper_ = std::jthread([this](std::stop_token stop) { reap(stop); });
  }
  Handshakes(const Handshakes&) = delete;
  Handshakes& operator=(const Handshakes&) = delete;
  ~Handshakes() {
    reaper_.request_stop();
    reaper_.join();
  }

  void pending(native_socket fd) { due(fd, clock::now() + deadline_); }
  /// `fd` is shut down at `when` unless settled before.
  void due(native_socket fd, clock::time_point when) {
    std::lock_guard lock(mutex_);
    due_[fd] = when;
    ++added_;
    wake_.notify_one();
  }
  /// The connection proved itself, or is about to be closed. Its owner calls
  /// this before the socket is closed, so the reaper never shuts down a
  /// descriptor that has been closed and reused.
  void settled(native_socket fd) {
    std::lock_guard lock(mutex_);
    due_.erase(fd);
  }

private:
  void reap(std::stop_token stop) {
    std::unique_lock lock(mutex_);
    while (!stop.stop_requested()) {
      const auto now = clock::now();
      auto next = clock::time_point::max();
      for (auto it = due_.begin(); it != due_.end();) {
        if (it->second <= now) {
          ::shutdown(it->first, SHUT_RDWR);
          it = due_.erase(it);
        } else {
          next = std::min(next, it->second);
          ++it;
        }
      }
      const std::uint64_t seen = added_;
      // Woken by a new deadline (it may be sooner), by the next one, or by the end.
      wake_.wait_until(lock, stop, next == clock::time_point::max() ? now + std::chrono::hours(1) : next,
                       [&] { return added_ != seen; });
    }
  }

  const std::chrono::milliseconds deadline_;
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::map<native_socket, clock::time_point> due_;
  std::uint64_t added_ = 0; // deadlines set so far: the reaper wakes for each
  std::jthread reaper_;     // last: stopped and joined before the rest goes
};

/// Reads and writes a link's bytes, through TLS where it has a session, and
/// follows BASP's framing (a 32-byte header, then payload_len bytes) to
/// refuse a message larger than max_message_bytes before CAF sizes a buffer
/// for it. An accepted connection is settled with its first bytes.
class LinkPolicy {
public:
  LinkPolicy(caf::openssl::session_ptr session, std::shared_ptr<Handshakes> handshakes)
      : session_(std::move(session)), handshakes_(std::move(handshakes)) {}

  rw_state read_some(std::size_t& result, native_socket fd, void* buf, std::size_t len) {
    const rw_state state = session_ ? session_->read_some(result, fd, buf, len)
                                    : caf::policy::tcp::read_some(result, fd, buf, len);
    read_failed_ = state == rw_state::failure;
    if (state != rw_state::success || result == 0) return state;
    established_ = true;
    if (handshakes_) {
      handshakes_->settled(fd);
      handshakes_.reset();
    }
    return frame(static_cast<const unsigned char*>(buf), result, fd) ? state : rw_state::failure;
  }

  rw_state write_some(std::size_t& result, native_socket fd, const void* buf, std::size_t len) {
    if (!session_) return caf::policy::tcp::write_some(result, fd, buf, len);
    const rw_state state = session_->write_some(result, fd, buf, len);
    // CAF 0.17's TLS session reports a handshake that waits for the peer
    // (SSL_ERROR_WANT_READ) as a write of nothing that succeeded. The socket
    // stays writable, so the multiplexer would call it again at once, a core
    // spinning for as long as the peer is silent: the stream parks its writes
    // until the peer speaks (NodeScribe::Stream). Only during the handshake
    // (no byte went through yet): a socket that cannot take more (its buffer
    // full) is no such case, as it gives no write event.
    if (state == rw_state::success && result > 0) established_ = true;
    stalled_ = !established_ && state == rw_state::success && result == 0 && len > 0 && writable(fd);
    return state;
  }
  /// The last write could not go on until the peer speaks.
  [[nodiscard]] bool stalled() const noexcept { return stalled_; }
  /// The last read ended the link (an error, or the peer gone).
  [[nodiscard]] bool read_failed() const noexcept { return read_failed_; }

  bool must_read_more(native_socket fd, std::size_t threshold) {
    return session_ && session_->must_read_more(fd, threshold);
  }

  /// Called as the connection's owner goes, before its socket is closed.
  void close(native_socket fd) {
    if (handshakes_) handshakes_->settled(fd);
  }

private:
  static bool writable(native_socket fd) {
    pollfd p{fd, POLLOUT, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) != 0;
  }

  /// Follows the framing over `n` bytes just read; false on a header over the bound.
  bool frame(const unsigned char* p, std::size_t n, native_socket fd) {
    constexpr std::size_t header_size = caf::io::basp::header_size;
    static_assert(header_size == 32, "the BASP header of CAF 0.17: payload_len at offset 4");
    while (n > 0) {
      if (payload_left_ > 0) {
        const std::size_t k = std::min<std::uint64_t>(n, payload_left_);
        payload_left_ -= k;
        p += k;
        n -= k;
        continue;
      }
      const std::size_t k = std::min(n, header_size - header_have_);
      std::memcpy(header_ + header_have_, p, k);
      header_have_ += k;
      p += k;
      n -= k;
      if (header_have_ < header_size) break;
      header_have_ = 0;
      // Serialized in network byte order, as every integer CAF 0.17 writes.
      const std::uint32_t len = std::uint32_t{header_[4]} << 24 | std::uint32_t{header_[5]} << 16 |
                                std::uint32_t{header_[6]} << 8 | std::uint32_t{header_[7]};
      if (len > max_message_bytes) {
        std::fprintf(stderr,
                     "chorus: a link's peer (socket %d) sent a message header claiming %u bytes, over the %zu MiB "
                     "that chorus's messages can take: link closed\n",
                     fd, len, max_message_bytes >> 20);
        return false;
      }
      payload_left_ = len;
    }
    return true;
  }

  caf::openssl::session_ptr session_;
  std::shared_ptr<Handshakes> handshakes_; // until the connection proved itself
  unsigned char header_[caf::io::basp::header_size] = {};
  std::size_t header_have_ = 0;
  std::uint64_t payload_left_ = 0;
  bool established_ = false; // bytes went through: the TLS handshake is over
  bool stalled_ = false;
  bool read_failed_ = false;
};

/// A connection between nodes, for CAF's BASP broker.
class NodeScribe final : public caf::io::scribe {
public:
  /// `handshakes`: where the connection must prove itself (accepted ones),
  /// else null; `deadlines`: where the link's shutdown is bounded.
  NodeScribe(default_multiplexer& mx, native_socket fd, caf::openssl::session_ptr session,
             std::shared_ptr<Handshakes> handshakes, std::shared_ptr<Handshakes> deadlines)
      : scribe(caf::io::network::conn_hdl_from_socket(fd)),
        stream_(mx, fd, std::move(session), std::move(handshakes)), deadlines_(std::move(deadlines)) {}
  ~NodeScribe() override {
    // Before the descriptor is closed, and may be reused by another link.
    deadlines_->settled(stream_.fd());
    stream_.policy().close(stream_.fd());
  }

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    // CAF closes a link once its writes are out. A TLS handshake its peer
    // never answers (writes parked) cannot get them out: shut it at once.
    // Otherwise the peer has `linger` to take them; a hung one is cut off,
    // so that no link keeps this process from ending (a failed init, a
    // finish, an exit).
    if (stream_.parked())
      ::shutdown(stream_.fd(), SHUT_RDWR);
    else
      deadlines_->due(stream_.fd(), clock::now() + linger);
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  std::uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

private:
  /// caf::io::network::stream_impl, with the policy reachable for close(),
  /// whose writes wait without spinning while a TLS handshake waits for the
  /// peer (LinkPolicy::stalled): the write events stop, and the first read
  /// that does not end the link starts them again.
  class Stream final : public caf::io::network::stream {
  public:
    template <class... Ts>
    Stream(default_multiplexer& mx, native_socket fd, Ts&&... xs) : stream(mx, fd), policy_(std::forward<Ts>(xs)...) {}
    void handle_event(operation op) override {
      handle_event_impl(op, policy_);
      if (op == operation::write && policy_.stalled() && !parked_) {
        parked_ = true;
        backend().del(operation::write, fd(), this);
      } else if (op == operation::read && parked_ && !policy_.read_failed()) {
        spoke_ = true;
        resume_writes();
      }
    }
    // The multiplexer takes a handler's write events away after the event
    // that asked it to, and the stream forgets its writer then: writes
    // resume once that happened and the peer spoke (CAF's force_empty_write
    // gives the stream its writer again, and keeps what it has to write).
    void removed_from_loop(operation op) override {
      // The base drops the stream's reference to its scribe, which may be
      // the last: the scribe, and this stream inside it, are gone then.
      if (op != operation::write || !parked_) return stream::removed_from_loop(op);
      const caf::intrusive_ptr<caf::io::network::stream_manager> keep{owner_};
      stream::removed_from_loop(op);
      removed_ = true;
      resume_writes();
    }
    /// Writes wait for the peer to speak.
    [[nodiscard]] bool parked() const noexcept { return parked_; }
    void owner(caf::io::network::stream_manager* mgr) { owner_ = mgr; }
    LinkPolicy& policy() { return policy_; }

  private:
    void resume_writes() {
      if (!removed_ || !spoke_) return;
      parked_ = removed_ = spoke_ = false;
      // Not for a link on its way out (its reads are gone too). The stream
      // still counts itself writing (what it has to write waits in its
      // buffer): force_empty_write registers it again only where it does not.
      if (owner_ != nullptr && (eventbf() & caf::io::network::input_mask) != 0) {
        state_.writing = false;
        force_empty_write(caf::io::network::stream::manager_ptr{owner_});
      }
    }

    LinkPolicy policy_;
    caf::io::network::stream_manager* owner_ = nullptr; // the scribe, which holds this stream
    bool parked_ = false;  // write events stopped (asked for)
    bool removed_ = false; // ... and taken away by the multiplexer
    bool spoke_ = false;   // the peer spoke since
  };

  void launch() {
    launched_ = true;
    stream_.owner(this);
    stream_.start(this);
    // A TLS session may have to speak first (its handshake): one empty
    // write gets the multiplexer to call it.
    stream_.force_empty_write(this);
  }

  bool launched_ = false;
  Stream stream_;
  std::shared_ptr<Handshakes> deadlines_;
};

/// A TCP listener whose connections get a TLS session (where the links have
/// one) and a deadline to prove themselves.
class NodeDoorman final : public caf::io::network::doorman_impl {
public:
  NodeDoorman(default_multiplexer& mx, native_socket fd, bool tls, std::shared_ptr<Handshakes> handshakes)
      : doorman_impl(mx, fd), tls_(tls), handshakes_(std::move(handshakes)) {}

  bool new_connection() override {
    if (detached()) return false;
    auto& mx = acceptor_.backend();
    const native_socket fd = acceptor_.accepted_socket();
    caf::io::network::nonblocking(fd, true);
    caf::openssl::session_ptr session;
    if (tls_ && !(session = caf::openssl::make_session(parent()->system(), fd, true))) {
      ::close(fd);
      return true; // that connection only; the listener goes on
    }
    handshakes_->pending(fd);
    auto scribe = caf::make_counted<NodeScribe>(mx, fd, std::move(session), handshakes_, handshakes_);
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return doorman::new_connection(&mx, hdl);
  }

private:
  bool tls_;
  std::shared_ptr<Handshakes> handshakes_;
};

class NodeLinks final : public caf::io::middleman_actor_impl {
public:
  NodeLinks(caf::actor_config& cfg, caf::actor broker, bool tls, std::chrono::milliseconds deadline)
      : middleman_actor_impl(cfg, std::move(broker)), tls_(tls), deadline_(deadline) {}

  const char* name() const override { return tls_ ? "chorus.tls_links" : "chorus.tcp_links"; }

protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, std::uint16_t port) override {
    // Bounded: this runs on one of the actor system's threads, and a host
    // that does not answer (a node cut off) would hold it for the kernel's
    // whole SYN timeout; the dial tries again.
    int fd = -1;
    if (Error e = io::detail::tcp_connect(host, port, connect_limit, fd))
      return caf::make_error(caf::sec::cannot_connect_to_node, e.message());
    caf::openssl::session_ptr session;
    if (tls_ && !(session = caf::openssl::make_session(system(), fd, false))) {
      ::close(fd);
      return caf::make_error(caf::sec::cannot_connect_to_node, "cannot start a TLS session with the job's credentials");
    }
    // A link this process dialled needs no handshake deadline here: the dial has its own.
    return caf::make_counted<NodeScribe>(multiplexer(), fd, std::move(session), nullptr, deadlines());
  }

  caf::expected<caf::io::doorman_ptr> open(std::uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    return caf::make_counted<NodeDoorman>(multiplexer(), *fd, tls_, deadlines());
  }

private:
  /// The deadlines of this actor's links; its thread starts with the first link.
  const std::shared_ptr<Handshakes>& deadlines() {
    if (!handshakes_) handshakes_ = std::make_shared<Handshakes>(deadline_);
    return handshakes_;
  }

  default_multiplexer& multiplexer() {
    return static_cast<default_multiplexer&>(system().middleman().backend());
  }

  bool tls_;
  std::chrono::milliseconds deadline_;
  std::shared_ptr<Handshakes> handshakes_; // made with the first link
};

} // namespace

caf::io::middleman_actor spawn_node_links(caf::actor_system& sys, bool tls, std::chrono::milliseconds deadline) {
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  return sys.spawn<NodeLinks, caf::hidden>(std::move(broker), tls, deadline);
}

} // namespace chorus::detail
