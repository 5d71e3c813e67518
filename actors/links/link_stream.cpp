// The connection under every link: see actors/links/link_stream.hpp.
#include "actors/links/link_stream.hpp"

#include "runtime/core/immortal.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/basp/message_type.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/policy/tcp.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <stop_token>
#include <thread>
#include <utility>

namespace chorus::actors {

// The framing spells out CAF 0.17.6's BASP; these are CAF's own.
namespace {
using caf::io::basp::message_type;
constexpr auto op(message_type t) { return static_cast<std::uint8_t>(t); }
static_assert(caf::io::basp::header_size == basp_bytes::header_size);
static_assert(op(message_type::server_handshake) == basp_bytes::server_handshake);
static_assert(op(message_type::client_handshake) == basp_bytes::client_handshake);
static_assert(op(message_type::direct_message) == basp_bytes::direct_message);
static_assert(op(message_type::routed_message) == basp_bytes::routed_message);
static_assert(op(message_type::monitor_message) == basp_bytes::monitor_message);
static_assert(op(message_type::down_message) == basp_bytes::down_message);
static_assert(op(message_type::heartbeat) == basp_bytes::heartbeat);
static_assert(caf::link_atom::uint_value() == basp_bytes::link_atom);
static_assert(caf::unlink_atom::uint_value() == basp_bytes::unlink_atom);
static_assert(caf::io::basp::header::named_receiver_flag == 1);
} // namespace

using caf::io::network::default_multiplexer;
using caf::io::network::native_socket;
using caf::io::network::operation;
using caf::io::network::rw_state;
using clock = std::chrono::steady_clock;

namespace {

/// How long a link whose peer stopped reading may keep this process's
/// actor system from stopping: CAF's graceful shutdown waits until a link's
/// writes are out, for ever where the peer hangs.
constexpr auto linger = std::chrono::seconds(1);

/// The nodes this process's links are with, by actor system: a connection
/// this process accepted may not announce a node another link is with. (CAF
/// 0.17 would keep such a connection without a node of its own; a peer of
/// that node never sends one: where it dials a node it is linked with
/// already, it closes the connection as soon as the node answers.)
class LinkedNodes {
public:
  static LinkedNodes& get() {
    // The multiplexer releases a link that closes while the process exits
    // (its run still held): after the static destructors.
    static core::Immortal<LinkedNodes> nodes;
    return *nodes;
  }
  /// A link with `node` begins; false (and nothing held) where it is a
  /// connection this process accepted and another link is with the node.
  bool hold(const caf::actor_system* sys, const std::string& node, bool exclusive) {
    std::lock_guard lock(mutex_);
    auto& count = held_[{sys, node}];
    if (exclusive && count > 0) return false;
    ++count;
    return true;
  }
  void release(const caf::actor_system* sys, const std::string& node) {
    std::lock_guard lock(mutex_);
    const auto it = held_.find({sys, node});
    if (it != held_.end() && --it->second == 0) held_.erase(it);
  }

private:
  std::mutex mutex_;
  std::map<std::pair<const caf::actor_system*, std::string>, int> held_;
};

} // namespace

std::string peer_of(native_socket fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    char host[INET6_ADDRSTRLEN] = {};
    if (ss.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
      ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
    }
    if (ss.ss_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(&ss);
      ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof host);
      // Appended: GCC 12 at -O3 takes "lit" + std::string for an overlapping copy (-Wrestrict).
      std::string out = "[";
      out.append(host).append("]:").append(std::to_string(ntohs(in->sin6_port)));
      return out;
    }
    if (ss.ss_family == AF_UNIX) {
      ucred peer{};
      socklen_t n = sizeof peer;
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &n) == 0)
        return "process " + std::to_string(peer.pid) + " on the Unix socket";
    }
  }
  return "socket " + std::to_string(fd);
}

/// Links with a deadline, and a thread that shuts down those whose deadline
/// passed: an accepted connection that has not proved itself yet, and a
/// link that is closing with writes its peer does not take. Shutting a
/// socket down (rather than closing it) leaves it to its owner: the
/// multiplexer sees the end of the stream, the handshake or read fails, and
/// CAF drops the connection as it drops any that broke.
class Deadlines {
public:
  explicit Deadlines(std::chrono::milliseconds deadline) : deadline_(deadline) {
    reaper_ = std::jthread([this](std::stop_token stop) { reap(stop); });
  }
  Deadlines(const Deadlines&) = delete;
  Deadlines& operator=(const Deadlines&) = delete;
  ~Deadlines() {
    reaper_.request_stop();
    reaper_.join();
  }

  [[nodiscard]] std::chrono::milliseconds deadline() const noexcept { return deadline_; }
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

LinkShared::LinkShared(caf::actor_system& sys, std::chrono::milliseconds handshake_deadline)
    : sys_(sys), deadlines_(std::make_unique<Deadlines>(handshake_deadline)) {
  std::vector<char> bytes;
  caf::binary_serializer sink{sys, bytes};
  if (auto err = sink(sys.node())) bytes.clear(); // no handshake will match: every link is refused, saying why
  this_node_.assign(bytes.begin(), bytes.end());
}

LinkShared::~LinkShared() = default;

std::chrono::milliseconds LinkShared::handshake_deadline() const noexcept { return deadlines_->deadline(); }

TlsHandshakes& LinkShared::handshakes() {
  if (!handshakes_) handshakes_ = std::make_unique<TlsHandshakes>(TlsHandshakes::default_threads());
  return *handshakes_;
}

namespace {

/// Reads and writes a link's bytes, through TLS where it has a session, and
/// hands every byte read to the link's framing (link_framing.hpp) before CAF
/// sees it: a message it refuses fails the read, which closes the link. An
/// accepted connection is settled once its handshake went through.
class LinkPolicy {
public:
  LinkPolicy(std::unique_ptr<TlsSession> session, bool accepted, std::shared_ptr<LinkShared> shared)
      : session_(std::move(session)), shared_(std::move(shared)),
        framing_(accepted ? LinkFraming::Side::accepted : LinkFraming::Side::dialled, shared_->this_node()),
        accepted_(accepted), pending_(accepted) {}

  /// Who the peer is, for a line; a TLS link's is taken as it opens (a
  /// failed handshake is said once the peer may have gone).
  const std::string& peer(native_socket fd) {
    if (peer_.empty()) peer_ = peer_of(fd);
    return peer_;
  }

  void opened(native_socket fd) {
    if (session_) peer(fd);
  }

  rw_state read_some(std::size_t& result, native_socket fd, void* buf, std::size_t len) {
    const rw_state state = session_ ? tls_read(result, fd, buf, len) : caf::policy::tcp::read_some(result, fd, buf, len);
    read_failed_ = state == rw_state::failure;
    if (state != rw_state::success || result == 0) return state;
    switch (framing_.feed(static_cast<const unsigned char*>(buf), result)) {
    case LinkFraming::Verdict::ok:
      return state;
    case LinkFraming::Verdict::refused:
      return refuse(fd, framing_.why());
    case LinkFraming::Verdict::handshake:
      if (!LinkedNodes::get().hold(&shared_->system(), framing_.peer(), accepted_))
        return refuse(fd, "a handshake in the name of a node that another link of this process is with");
      held_ = true;
      settle(fd);
      return state;
    }
    return state;
  }

  rw_state write_some(std::size_t& result, native_socket fd, const void* buf, std::size_t len) {
    if (!session_) return caf::policy::tcp::write_some(result, fd, buf, len);
    const rw_state state = tls(session_->write(buf, len, result), fd);
    // A handshake that waits for the peer is a write of nothing that
    // succeeded, and the socket stays writable: the multiplexer would call
    // it again at once, a core spinning for as long as the peer is silent.
    // The stream parks its writes until the peer speaks (LinkScribe::Stream).
    // Only during the handshake: a socket that cannot take more (its buffer
    // full) is no such case, as it gives no write event.
    stalled_ = state == rw_state::success && result == 0 && len > 0 && !session_->established() && writable(fd);
    return state;
  }
  /// The last write could not go on until the peer speaks.
  [[nodiscard]] bool stalled() const noexcept { return stalled_; }
  /// The last read ended the link (an error, the peer gone, or a refusal).
  [[nodiscard]] bool read_failed() const noexcept { return read_failed_; }

  bool must_read_more(native_socket, std::size_t threshold) {
    return session_ && session_->buffered() >= threshold;
  }

  /// Called as the connection's owner goes, before its socket is closed.
  void close(native_socket fd) {
    settle(fd);
    if (held_) LinkedNodes::get().release(&shared_->system(), framing_.peer());
    held_ = false;
  }

  Deadlines& deadlines() { return shared_->deadlines(); }

private:
  rw_state tls_read(std::size_t& result, native_socket fd, void* buf, std::size_t len) {
    result = 0;
    return len == 0 ? rw_state::success : tls(session_->read(buf, len, result), fd);
  }

  /// CAF's state for what the session did; a handshake that failed is said.
  rw_state tls(TlsSession::Io io, native_socket fd) {
    switch (io) {
    case TlsSession::Io::done:
    case TlsSession::Io::wait:
      return rw_state::success;
    case TlsSession::Io::closed:
      return rw_state::failure;
    case TlsSession::Io::failed:
      if (!session_->established()) say_handshake_failed(peer(fd), session_->why());
      return rw_state::failure;
    }
    return rw_state::failure;
  }

  static bool writable(native_socket fd) {
    pollfd p{fd, POLLOUT, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) != 0;
  }

  void settle(native_socket fd) {
    if (!pending_) return;
    pending_ = false;
    shared_->deadlines().settled(fd);
  }

  rw_state refuse(native_socket fd, const std::string& why) {
    std::fprintf(stderr, "chorus: a link's peer (%s) sent %s: link closed\n", peer(fd).c_str(), why.c_str());
    read_failed_ = true;
    return rw_state::failure;
  }

  std::unique_ptr<TlsSession> session_;
  std::shared_ptr<LinkShared> shared_;
  LinkFraming framing_;
  bool accepted_;
  bool pending_;             // an accepted connection whose handshake deadline runs
  bool held_ = false; // its node is in LinkedNodes
  bool stalled_ = false;
  std::string peer_; // peer_of the socket (see peer())
  bool read_failed_ = false;
};

/// A link's connection, for CAF's BASP broker.
class LinkScribe final : public caf::io::scribe {
public:
  LinkScribe(default_multiplexer& mx, native_socket fd, std::unique_ptr<TlsSession> session, bool accepted,
             std::shared_ptr<LinkShared> shared)
      : scribe(caf::io::network::conn_hdl_from_socket(fd)), stream_(mx, fd, std::move(session), accepted,
                                                                     std::move(shared)) {
    stream_.policy().opened(fd);
  }
  ~LinkScribe() override {
    // Before the descriptor is closed, and may be reused by another link.
    stream_.policy().deadlines().settled(stream_.fd());
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
      stream_.policy().deadlines().due(stream_.fd(), clock::now() + linger);
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
};

} // namespace

caf::io::scribe_ptr make_link_scribe(default_multiplexer& mx, native_socket fd, std::unique_ptr<TlsSession> session,
                                     bool accepted, const std::shared_ptr<LinkShared>& shared, clock::time_point due) {
  if (accepted) {
    if (due == clock::time_point{})
      shared->deadlines().pending(fd);
    else
      shared->deadlines().due(fd, due);
  }
  return caf::make_counted<LinkScribe>(mx, fd, std::move(session), accepted, shared);
}

} // namespace chorus::actors
