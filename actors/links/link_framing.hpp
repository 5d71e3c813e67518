// What a link takes from its peer, checked on the bytes as they are read,
// before CAF's BASP broker acts on any of them (no CAF here: the bytes of
// CAF 0.17.6's BASP are spelled out below, and link_stream.cpp checks them
// against CAF's own at compile time and start).
//
// BASP frames every message as a 32-byte header, then payload_len bytes:
//
//   offset 0   operation (message_type: 0 server handshake, 1 client
//              handshake, 2 direct, 3 routed, 4 monitor, 5 down, 6 heartbeat)
//   offset 3   flags (1: the receiver is named by an atom)
//   offset 4   payload_len, 4 bytes
//   offset 8   operation_data, source_actor, dest_actor: 8 bytes each
//
// every integer in network byte order. A node, as CAF 0.17.6 writes it, is
// its implementation's atom (8 bytes), then for CAF's default implementation,
// the only one chorus's processes have, a process id (4 bytes) and a host id
// (20 bytes): 32 bytes in all.
//
// CAF 0.17.6 believes what a payload says of nodes: a routed message's source
// and destination nodes, a monitor or down message's, the node a handshake
// announces. A routed message naming this process's node as its source is
// delivered as if one of this process's own actors had sent it (the Run
// actor's finish timer, say), one naming another node's actor as if that
// actor had sent it (rank 1's RankProxy), and one for another node is
// forwarded there; a down message in the name of another node kills this
// process's proxies of that node's actors. chorus links every pair of its
// processes directly and routes nothing, so a link takes:
//
//  - first, the peer's handshake and nothing else: a client handshake on a
//    connection this process accepted, a server handshake on one it dialled;
//    the node it announces must be of CAF's default kind, and a client
//    handshake must not announce this process's own node;
//  - then direct messages, monitor and down messages, and heartbeats; never a
//    routed message, an operation BASP does not have, or a second handshake
//    other than the one CAF 0.17.6's client sends on the same connection
//    (with select_connection_flag) for the same node: with another node's
//    name, it would have CAF route that node's messages to this connection;
//  - a monitor or down message only from the node the handshake announced,
//    and only for this process's node;
//  - a direct message with no forwarding stack (CAF would send the answer
//    to the actor the stack names, in the receiver's name: chorus's messages
//    carry none), and none that asks CAF to link an actor to a proxy (CAF
//    0.17 takes the actor that message names for a proxy, whatever it is:
//    chorus links no actor across processes);
//  - no message whose header claims more than max_message_bytes (CAF sizes
//    its receive buffer from payload_len before it checks anything else),
//    and no handshake of more than max_handshake_bytes.
//
// Anything else is refused: the link is closed with a line naming why,
// before CAF sees the bytes that carried it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace chorus::actors {

/// The largest BASP payload a link takes. chorus's own messages stay far
/// below it: frames close at `max_frame_bytes` (actors/rank_proxy.cpp) and a
/// config or summary call takes at most 16 MiB of JSON (runtime/client/run.cpp).
inline constexpr std::size_t max_message_bytes = std::size_t{128} << 20;

/// The largest handshake a link takes: a node, CAF's application ids and the
/// signatures of a published actor's interface (404 bytes for the Run
/// actor's). Until its handshake went through, a connection can make CAF
/// size no larger buffer than this.
inline constexpr std::size_t max_handshake_bytes = std::size_t{64} << 10;

/// CAF 0.17.6's BASP, as link_stream.cpp checks it against CAF's headers.
namespace basp_bytes {
inline constexpr std::size_t header_size = 32;
enum Operation : std::uint8_t {
  server_handshake = 0,
  client_handshake = 1,
  direct_message = 2,
  routed_message = 3,
  monitor_message = 4,
  down_message = 5,
  heartbeat = 6,
};
/// The bytes of a node of CAF's default implementation.
inline constexpr std::size_t node_size = 32;
/// The atoms of CAF's link and unlink messages (caf::link_atom, caf::unlink_atom).
inline constexpr std::uint64_t link_atom = 0x00000000'0fc6ecf0;
inline constexpr std::uint64_t unlink_atom = 0x000000fe'b3c6ecf0;
/// How CAF 0.17.6 begins a message of an atom and an actor handle: no type
/// number, then the types' names.
inline constexpr char atom_and_handle[] = "\0\0\x1b@<>+@atom+@strong_actor_ptr";
} // namespace basp_bytes

/// Follows BASP's framing on one link's bytes, in the order they are read,
/// however they are split, and judges each message by the rules above.
class LinkFraming {
public:
  /// Which end of the connection this process is.
  enum class Side : bool { accepted, dialled };
  /// What one feed() found.
  enum class Verdict { ok, handshake, refused };

  /// `this_node`: this process's node as CAF writes it (basp_bytes::node_size bytes).
  LinkFraming(Side side, std::string this_node);

  /// Follows `n` bytes just read. `handshake` where the peer's handshake
  /// ended in them (its node is peer() from now on), `refused` where they
  /// break a rule (why() says which; the link must close, and nothing that
  /// follows is looked at).
  Verdict feed(const unsigned char* p, std::size_t n);

  /// Why the bytes were refused, as "a routed message ..." for the link's line.
  [[nodiscard]] const std::string& why() const noexcept { return why_; }
  /// The node the peer's handshake announced ("" before it).
  [[nodiscard]] const std::string& peer() const noexcept { return peer_; }
  /// The peer's handshake went through.
  [[nodiscard]] bool handshaken() const noexcept { return handshaken_; }

private:
  /// The header just completed: whether its message may come, and how much
  /// of its payload to see before it is judged.
  bool header();
  /// The payload's first bytes are in (or the payload ended): the message's verdict.
  bool payload();
  bool refuse(std::string why);

  Side side_;
  std::string this_node_;
  std::string peer_;
  std::string why_;
  bool handshaken_ = false;
  bool refused_ = false;
  bool handshake_now_ = false; // the handshake ended in this feed()
  std::array<unsigned char, basp_bytes::header_size> header_{};
  std::size_t header_have_ = 0;
  std::uint8_t op_ = 0;
  std::uint32_t len_ = 0;           // the current message's payload_len
  std::uint64_t payload_left_ = 0;  // of it, bytes still to come
  std::size_t want_ = 0;            // payload bytes to see before it is judged (0: judged)
  std::array<unsigned char, 64> seen_{}; // its first bytes
  std::size_t seen_have_ = 0;
};

} // namespace chorus::actors
