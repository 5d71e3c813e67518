#include "actors/links/node_link.hpp"

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
using caf::io::network::rw_state;
using clock = std::chrono::steady_clock;

/// The accepted connections that have not proved themselves yet, each with
/// its deadline, and a thread that shuts down those whose deadline passed.
/// Shutting a socket down (rather than closing it) leaves it to its owner:
/// the multiplexer sees the end of the stream, the handshake or read fails,
/// and CAF drops the connection as it drops any that broke.
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

  void pending(native_socket fd) {
    std::lock_guard lock(mutex_);
    due_[fd] = clock::now() + deadline_;
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
      const std::size_t known = due_.size();
      // Woken by a new connection (it may be due sooner), by the next
      // deadline, or by the end.
      wake_.wait_until(lock, stop, next == clock::time_point::max() ? now + std::chrono::hours(1) : next,
                       [&] { return due_.size() > known; });
    }
  }

  const std::chrono::milliseconds deadline_;
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::map<native_socket, clock::time_point> due_;
  std::jthread reaper_; // last: stopped and joined before the rest goes
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
    if (state != rw_state::success || result == 0) return state;
    if (handshakes_) {
      handshakes_->settled(fd);
      handshakes_.reset();
    }
    return frame(static_cast<const unsigned char*>(buf), result, fd) ? state : rw_state::failure;
  }

  rw_state write_some(std::size_t& result, native_socket fd, const void* buf, std::size_t len) {
    return session_ ? session_->write_some(result, fd, buf, len) : caf::policy::tcp::write_some(result, fd, buf, len);
  }

  bool must_read_more(native_socket fd, std::size_t threshold) {
    return session_ && session_->must_read_more(fd, threshold);
  }

  /// Called as the connection's owner goes, before its socket is closed.
  void close(native_socket fd) {
    if (handshakes_) handshakes_->settled(fd);
  }

private:
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
};

/// A connection between nodes, for CAF's BASP broker.
class NodeScribe final : public caf::io::scribe {
public:
  NodeScribe(default_multiplexer& mx, native_socket fd, caf::openssl::session_ptr session,
             std::shared_ptr<Handshakes> handshakes)
      : scribe(caf::io::network::conn_hdl_from_socket(fd)),
        stream_(mx, fd, std::move(session), std::move(handshakes)) {}
  ~NodeScribe() override { stream_.policy().close(stream_.fd()); }

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
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
  /// caf::io::network::stream_impl, with the policy reachable for close().
  class Stream final : public caf::io::network::stream {
  public:
    template <class... Ts>
    Stream(default_multiplexer& mx, native_socket fd, Ts&&... xs) : stream(mx, fd), policy_(std::forward<Ts>(xs)...) {}
    void handle_event(caf::io::network::operation op) override { handle_event_impl(op, policy_); }
    LinkPolicy& policy() { return policy_; }

  private:
    LinkPolicy policy_;
  };

  void launch() {
    launched_ = true;
    stream_.start(this);
    // A TLS session may have to speak first (its handshake): one empty
    // write gets the multiplexer to call it.
    stream_.force_empty_write(this);
  }

  bool launched_ = false;
  Stream stream_;
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
    auto scribe = caf::make_counted<NodeScribe>(mx, fd, std::move(session), handshakes_);
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
    auto fd = caf::io::network::new_tcp_connection(host, port);
    if (!fd) return std::move(fd.error());
    caf::io::network::nonblocking(*fd, true);
    caf::openssl::session_ptr session;
    if (tls_ && !(session = caf::openssl::make_session(system(), *fd, false))) {
      ::close(*fd);
      return caf::make_error(caf::sec::cannot_connect_to_node, "cannot start a TLS session with the job's credentials");
    }
    // A link this process dialled needs no deadline here: the dial has its own.
    return caf::make_counted<NodeScribe>(multiplexer(), *fd, std::move(session), nullptr);
  }

  caf::expected<caf::io::doorman_ptr> open(std::uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    // The deadlines' thread runs only in a process that listens.
    if (!handshakes_) handshakes_ = std::make_shared<Handshakes>(deadline_);
    return caf::make_counted<NodeDoorman>(multiplexer(), *fd, tls_, handshakes_);
  }

private:
  default_multiplexer& multiplexer() {
    return static_cast<default_multiplexer&>(system().middleman().backend());
  }

  bool tls_;
  std::chrono::milliseconds deadline_;
  std::shared_ptr<Handshakes> handshakes_; // made by the first listener
};

} // namespace

caf::io::middleman_actor spawn_node_links(caf::actor_system& sys, bool tls, std::chrono::milliseconds deadline) {
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  return sys.spawn<NodeLinks, caf::hidden>(std::move(broker), tls, deadline);
}

} // namespace chorus::detail
