// What a link takes from its peer: see actors/links/link_framing.hpp.
#include "actors/links/link_framing.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace chorus::actors {
namespace {

using namespace basp_bytes;

/// What the operation is called in a refusal.
const char* named(std::uint8_t op) {
  switch (op) {
  case server_handshake: return "a server handshake";
  case client_handshake: return "a client handshake";
  case direct_message: return "a direct message";
  case routed_message: return "a routed message";
  case monitor_message: return "a monitor message";
  case down_message: return "a down message";
  case heartbeat: return "a heartbeat";
  default: return "a message";
  }
}

std::uint32_t be32(const unsigned char* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | std::uint32_t{p[3]};
}

std::uint64_t be64(const unsigned char* p) { return std::uint64_t{be32(p)} << 32 | be32(p + 4); }

/// The bytes a direct message's payload is judged on: its forwarding stack's
/// count (one byte where it is empty), and the beginning of a link message.
constexpr std::size_t direct_seen = 1 + sizeof atom_and_handle - 1 + 8;

} // namespace

LinkFraming::LinkFraming(Side side, std::string this_node) : side_(side), this_node_(std::move(this_node)) {}

bool LinkFraming::refuse(std::string why) {
  refused_ = true;
  why_ = std::move(why);
  return false;
}

LinkFraming::Verdict LinkFraming::feed(const unsigned char* p, std::size_t n) {
  if (refused_) return Verdict::refused;
  handshake_now_ = false;
  while (n > 0) {
    if (payload_left_ > 0) {
      const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(n, payload_left_));
      if (want_ > seen_have_) {
        const std::size_t c = std::min(k, want_ - seen_have_);
        std::memcpy(seen_.data() + seen_have_, p, c);
        seen_have_ += c;
      }
      payload_left_ -= k;
      p += k;
      n -= k;
    } else {
      const std::size_t k = std::min(n, header_size - header_have_);
      std::memcpy(header_.data() + header_have_, p, k);
      header_have_ += k;
      p += k;
      n -= k;
      if (header_have_ < header_size) break;
      header_have_ = 0;
      if (!header()) return Verdict::refused;
    }
    if (want_ > 0 && (seen_have_ == want_ || payload_left_ == 0) && !payload()) return Verdict::refused;
    if (payload_left_ == 0 && op_ <= client_handshake && !peer_.empty() && !handshaken_) {
      handshaken_ = true;
      handshake_now_ = true;
    }
  }
  return handshake_now_ ? Verdict::handshake : Verdict::ok;
}

bool LinkFraming::header() {
  op_ = header_[0];
  len_ = be32(header_.data() + 4);
  if (len_ > max_message_bytes)
    return refuse("a message header claiming " + std::to_string(len_) + " bytes, over the " +
                  std::to_string(max_message_bytes >> 20) + " MiB that chorus's messages can take");
  if (op_ > heartbeat) {
    static constexpr char hex[] = "0123456789abcdef";
    return refuse(std::string("a message of an operation BASP does not have (0x") + hex[op_ >> 4] + hex[op_ & 15] +
                  ")");
  }
  if (op_ == routed_message)
    return refuse("a routed message, which names its own source and destination nodes: chorus links each pair of "
                  "its processes directly and routes nothing");
  const bool handshake = op_ == server_handshake || op_ == client_handshake;
  if (!handshaken_) {
    const std::uint8_t due = side_ == Side::accepted ? client_handshake : server_handshake;
    if (op_ != due) return refuse(std::string(named(op_)) + " before its " + (named(due) + 2));
    if (len_ > max_handshake_bytes)
      return refuse("a handshake claiming " + std::to_string(len_) + " bytes, over the " +
                    std::to_string(max_handshake_bytes >> 10) + " KiB that a handshake can take");
    if (len_ < node_size) return refuse("a handshake too short to name its node");
    want_ = node_size;
  } else if (op_ == client_handshake && side_ == Side::accepted) {
    // CAF 0.17.6 sends its client handshake twice, the second time with
    // select_connection_flag: the same node, on the same connection.
    if (len_ != node_size) return refuse("a second handshake of another size than a node's");
    want_ = node_size;
  } else if (handshake) {
    return refuse(std::string("a second handshake (") + (named(op_) + 2) + ")");
  } else if (op_ == direct_message) {
    want_ = direct_seen;
  } else if (op_ == monitor_message || op_ == down_message) {
    want_ = 2 * node_size;
  } else {
    want_ = 0;
  }
  seen_have_ = 0;
  payload_left_ = len_;
  return true;
}

bool LinkFraming::payload() {
  want_ = 0; // judged once
  const unsigned char* seen = seen_.data();
  const auto is = [&](std::size_t at, const std::string& node) {
    return node.size() == node_size && std::memcmp(seen + at, node.data(), node_size) == 0;
  };
  switch (op_) {
  case server_handshake:
  case client_handshake: {
    // The node's kind (its first 8 bytes) is this process's: CAF's default.
    if (this_node_.size() != node_size || std::memcmp(seen, this_node_.data(), 8) != 0)
      return refuse("a handshake announcing a node of another kind than CAF's default");
    if (handshaken_) {
      if (!is(0, peer_)) return refuse("a second handshake in another node's name than the first");
      return true;
    }
    if (op_ == client_handshake && is(0, this_node_)) return refuse("a handshake in this process's own name");
    peer_.assign(reinterpret_cast<const char*>(seen), node_size);
    return true;
  }
  case direct_message:
    if (seen_have_ >= 1 && seen[0] != 0)
      return refuse("a message with a forwarding stack, which would send its answer on to the actors the stack "
                    "names: chorus's messages carry none");
    if (seen_have_ == direct_seen && std::memcmp(seen + 1, atom_and_handle, sizeof atom_and_handle - 1) == 0) {
      const std::uint64_t atom = be64(seen + sizeof atom_and_handle);
      if (atom == link_atom || atom == unlink_atom)
        return refuse("a link message, whose actor CAF would take for a proxy of the peer's: chorus links no actor "
                      "across processes");
    }
    return true;
  case monitor_message:
  case down_message:
    if (seen_have_ < 2 * node_size) return refuse(std::string(named(op_)) + " too short to name its nodes");
    if (!is(0, peer_))
      return refuse(std::string(named(op_)) + " in the name of another node than the one its handshake announced");
    if (!is(node_size, this_node_))
      return refuse(std::string(named(op_)) + " for another node than this process's: chorus routes nothing");
    return true;
  default:
    return true;
  }
}

} // namespace chorus::actors
