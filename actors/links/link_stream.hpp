// The connection under every link of chorus's, within a node (a Unix socket,
// local_link.hpp) or between nodes (TCP, with TLS where the job has
// credentials, node_link.hpp): a scribe for CAF's BASP broker of our own,
// whose reads pass through LinkFraming (link_framing.hpp) before CAF sees a
// byte, and the deadlines of the connections a listener (link_doorman.hpp)
// accepts.
//
//  - A connection this process accepted proves itself within a deadline: it
//    finishes its TLS handshake where it has one (on a handshake thread,
//    tls_handshakes.hpp, not on the multiplexer's), and its BASP handshake
//    (which the framing judges), or it is shut down. CAF 0.17's own doormen
//    wait forever on a peer that never speaks, so a few hundred such
//    connections would hold a run host at its fd limit. A link that has
//    proved itself and then goes silent is closed by CAF's connection
//    timeout, which runs where a process accepts links (links.cpp).
//  - A message the framing refuses (a routed message, a node's name taken in
//    vain, a header claiming more than max_message_bytes, ...) closes its
//    link with one line on stderr saying why, before CAF sizes a buffer for
//    it or acts on it.
//  - A closing link whose peer takes nothing is cut after a second: CAF's
//    graceful shutdown would wait for it for ever.
#pragma once

#include "actors/links/link_framing.hpp"
#include "actors/links/tls_handshakes.hpp"
#include "actors/links/tls_session.hpp"

#include <caf/fwd.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/scribe.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace chorus::actors {

class Deadlines;

/// What the links of one middleman actor share: this process's node as CAF
/// writes it, and the thread that enforces their deadlines. Made by the
/// middleman actor with its first link, on its own thread.
class LinkShared {
public:
  LinkShared(caf::actor_system& sys, std::chrono::milliseconds handshake_deadline);
  ~LinkShared();
  LinkShared(const LinkShared&) = delete;
  LinkShared& operator=(const LinkShared&) = delete;

  caf::actor_system& system() const noexcept { return sys_; }
  const std::string& this_node() const noexcept { return this_node_; }
  Deadlines& deadlines() const noexcept { return *deadlines_; }
  /// How long an accepted connection has to prove itself.
  std::chrono::milliseconds handshake_deadline() const noexcept;
  /// The threads that make accepted connections' TLS handshakes, started
  /// with the first such connection (on the multiplexer thread).
  TlsHandshakes& handshakes();

private:
  caf::actor_system& sys_;
  std::string this_node_;
  std::unique_ptr<Deadlines> deadlines_;
  std::unique_ptr<TlsHandshakes> handshakes_;
};

/// A link's connection on socket `fd` (non-blocking), for CAF's BASP broker:
/// through TLS where `session` is given, with a handshake deadline where the
/// connection was `accepted` (`due`, where it was set before, as the TLS
/// handshake began; else the deadline from now).
caf::io::scribe_ptr make_link_scribe(caf::io::network::default_multiplexer& mx, caf::io::network::native_socket fd,
                                     std::unique_ptr<TlsSession> session, bool accepted,
                                     const std::shared_ptr<LinkShared>& shared,
                                     std::chrono::steady_clock::time_point due = {});

/// Who is at the other end of `fd`, for a line: a process of this user on a
/// Unix socket, an address and port on TCP.
[[nodiscard]] std::string peer_of(caf::io::network::native_socket fd);

} // namespace chorus::actors
