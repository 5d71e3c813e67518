#include "actors/links/node_link.hpp"
#include "actors/links/link_doorman.hpp"
#include "actors/links/link_stream.hpp"
#include "io/platform/posix.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>

#include <unistd.h>

#include <memory>

namespace chorus::actors {
namespace {

using caf::io::network::default_multiplexer;
using caf::io::network::native_socket;

/// How long a dial's TCP connect may take before the dial tries again.
constexpr auto connect_limit = std::chrono::milliseconds(1000);

/// A TCP listener whose connections get a TLS session, where the links have one.
class NodeDoorman final : public LinkDoorman {
public:
  NodeDoorman(default_multiplexer& mx, native_socket fd, std::shared_ptr<const TlsContext> tls,
              std::shared_ptr<LinkShared> shared)
      : LinkDoorman(mx, fd, std::move(shared)), tls_(std::move(tls)) {}

protected:
  bool admit(native_socket fd, std::unique_ptr<TlsSession>& session) override {
    return !tls_ || (session = TlsSession::make(tls_, fd, true));
  }

private:
  std::shared_ptr<const TlsContext> tls_;
};

class NodeLinks final : public caf::io::middleman_actor_impl {
public:
  NodeLinks(caf::actor_config& cfg, caf::actor broker, std::shared_ptr<const TlsContext> tls,
            std::chrono::milliseconds deadline)
      : middleman_actor_impl(cfg, std::move(broker)), tls_(std::move(tls)), deadline_(deadline) {}

  const char* name() const override { return tls_ ? "chorus.tls_links" : "chorus.tcp_links"; }

protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, std::uint16_t port) override {
    // Bounded: this runs on one of the actor system's threads, and a host
    // that does not answer (a node cut off) would hold it for the kernel's
    // whole SYN timeout; the dial tries again.
    int fd = -1;
    if (Error e = platform::tcp_connect(host, port, connect_limit, fd))
      return caf::make_error(caf::sec::cannot_connect_to_node, e.message());
    std::unique_ptr<TlsSession> session;
    if (tls_ && !(session = TlsSession::make(tls_, fd, false))) {
      ::close(fd);
      return caf::make_error(caf::sec::cannot_connect_to_node, "cannot start a TLS session with the job's credentials");
    }
    // A link this process dialled needs no handshake deadline here: the dial has its own.
    return make_link_scribe(multiplexer(), fd, std::move(session), false, shared());
  }

  caf::expected<caf::io::doorman_ptr> open(std::uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    return caf::make_counted<NodeDoorman>(multiplexer(), *fd, tls_, shared());
  }

private:
  /// What this actor's links share; made with the first link.
  const std::shared_ptr<LinkShared>& shared() {
    if (!shared_) shared_ = std::make_shared<LinkShared>(system(), deadline_);
    return shared_;
  }

  default_multiplexer& multiplexer() {
    return static_cast<default_multiplexer&>(system().middleman().backend());
  }

  std::shared_ptr<const TlsContext> tls_; // null: plain TCP
  std::chrono::milliseconds deadline_;
  std::shared_ptr<LinkShared> shared_;
};

} // namespace

caf::io::middleman_actor spawn_node_links(caf::actor_system& sys, std::shared_ptr<const TlsContext> tls,
                                          std::chrono::milliseconds deadline) {
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  return sys.spawn<NodeLinks, caf::hidden>(std::move(broker), std::move(tls), deadline);
}

} // namespace chorus::actors
