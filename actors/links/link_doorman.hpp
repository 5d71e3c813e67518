// The listener under every link a process accepts, within a node (a Unix
// socket, local_link.hpp) or between nodes (TCP, node_link.hpp): CAF's
// doorman, whose connections become link scribes (link_stream.hpp) with a
// deadline to prove themselves. A connection with a TLS session makes its
// handshake on a handshake thread first (tls_handshakes.hpp), and comes
// back to the multiplexer once it is over, through a queue and an eventfd
// that the multiplexer watches: a handshake thread never touches CAF.
#pragma once

#include "actors/links/link_stream.hpp"
#include "actors/links/tls_session.hpp"

#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>

#include <chrono>
#include <memory>

namespace chorus::actors {

/// A listener whose connections become link scribes (make_link_scribe) with
/// a deadline to prove themselves; admit() decides first whether one may. A
/// connection with a TLS session makes its handshake on a handshake thread
/// first, and comes back to the multiplexer once it is over.
class LinkDoorman : public caf::io::network::doorman_impl {
public:
  LinkDoorman(caf::io::network::default_multiplexer& mx, caf::io::network::native_socket fd,
              std::shared_ptr<LinkShared> shared);
  ~LinkDoorman() override;

  bool new_connection() override;
  void graceful_shutdown() override;
  void remove_from_loop() override;

protected:
  /// Whether the connection just accepted on `fd` may become a link, and
  /// its TLS session where the links have one. A connection refused here is
  /// closed by the doorman, and the listener goes on.
  virtual bool admit(caf::io::network::native_socket fd, std::unique_ptr<TlsSession>& session) = 0;

private:
  class Gate;
  class Wakeup;
  /// On the multiplexer thread: the connections the handshake threads handed back.
  void arrived();
  /// On the multiplexer thread: a connection admitted, whose TLS handshake
  /// (where it has one) is over, becomes a link; false where the doorman's
  /// broker takes no more.
  bool admitted(caf::io::network::native_socket fd, std::unique_ptr<TlsSession> session,
                std::chrono::steady_clock::time_point due);

  std::shared_ptr<LinkShared> shared_;
  std::shared_ptr<Gate> gate_;     // how handshake threads hand connections back; closed as the doorman goes
  std::unique_ptr<Wakeup> wakeup_; // the gate in the multiplexer's loop, from the first TLS connection
};

} // namespace chorus::actors
