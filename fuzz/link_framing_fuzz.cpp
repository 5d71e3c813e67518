// A link's framing (actors/links/link_framing.hpp) on any bytes from a peer:
// the first byte picks the side (accepted or dialled) and how the rest is
// split into reads. Whatever the split, the framing must come to the same
// end as on one read (the same refusal, or the same handshake and peer), tell
// a handshake at most once, and never take a client handshake in this
// process's own name or a node of another kind.
#include "actors/links/link_framing.hpp"
#include "fuzz/seeds.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

using namespace chorus::actors;
namespace b = chorus::actors::basp_bytes;

namespace {

/// A node as CAF 0.17.6 writes it: the default implementation's atom, a pid, a host id.
std::string node(std::uint32_t pid) {
  std::string n("\0\0\x3e\x9a\xab\x9b\xac\x79", 8);
  for (int shift = 24; shift >= 0; shift -= 8) n += static_cast<char>((pid >> shift) & 0xff);
  n.append(20, '\x42');
  return n;
}

const std::string self = node(1000);

std::string be(std::uint64_t v, int bytes) {
  std::string out;
  for (int i = bytes - 1; i >= 0; --i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string message(std::uint8_t op, const std::string& payload, std::uint8_t flags = 0) {
  std::string h(1, static_cast<char>(op));
  h += std::string(2, '\0') + static_cast<char>(flags) + be(payload.size(), 4) + std::string(24, '\0');
  return h + payload;
}

/// Where the framing ended on these reads.
struct End {
  bool refused = false;
  std::string why, peer;
  bool handshaken = false;
  int handshakes = 0;
  /// The same end (a read that ends the handshake and then refuses tells the refusal only).
  bool operator==(const End& o) const {
    return refused == o.refused && why == o.why && peer == o.peer && handshaken == o.handshaken &&
           (refused || handshakes == o.handshakes);
  }
};

End run(LinkFraming::Side side, const std::uint8_t* data, std::size_t size, std::size_t chunk) {
  LinkFraming f(side, self);
  End end;
  for (std::size_t at = 0; at < size; at += chunk) {
    const auto v = f.feed(data + at, std::min(chunk, size - at));
    if (v == LinkFraming::Verdict::handshake) ++end.handshakes;
    if (v == LinkFraming::Verdict::refused) {
      end.refused = true;
      break;
    }
  }
  end.why = f.why();
  end.peer = f.peer();
  end.handshaken = f.handshaken();
  return end;
}

} // namespace

// Seeds: a rank's link as its host reads it, a host's as its rank reads it, and forgeries.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string peer = node(2000), other = node(3000);
  const std::string hello = message(b::client_handshake, peer) + message(b::client_handshake, peer, 2);
  const std::string direct = message(b::direct_message, std::string("\0\0\0\x09@<>+@atom", 13) + be(0x3ebbb3979cb4, 8));
  const std::string link = message(b::direct_message, std::string(1, '\0') + std::string(b::atom_and_handle, 30) +
                                                          be(b::link_atom, 8) + be(7, 8) + self);
  const std::string server = message(b::server_handshake, self.substr(0, 8) + peer.substr(8) +
                                                              std::string("\x01\x0fgeneric-caf-app", 17) + be(7, 8) +
                                                              std::string(1, '\0'));
  chorus::fuzz::write_seeds_if_asked({
      std::string(1, '\x06') + hello + direct + message(b::heartbeat, "") + message(b::monitor_message, peer + self) +
          message(b::down_message, peer + self + std::string(15, '\x01')),
      std::string(1, '\x01') + server + direct + message(b::down_message, peer + self),
      std::string(1, '\x02') + hello + message(b::routed_message, self + self + std::string(1, '\0')),
      std::string(1, '\x10') + hello + message(b::down_message, other + self) + link,
      std::string(1, '\x40') + message(b::client_handshake, self) + be(1u << 30, 4),
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto side = (data[0] & 1) != 0 ? LinkFraming::Side::dialled : LinkFraming::Side::accepted;
  const std::size_t chunk = 1 + (data[0] >> 1);
  const End whole = run(side, data + 1, size - 1, size);
  const End split = run(side, data + 1, size - 1, chunk);
  if (!(whole == split)) std::abort();
  for (const End& e : {whole, split})
    if (e.handshakes > 1 || (e.handshakes == 1 && !e.handshaken) || (!e.refused && e.handshaken != (e.handshakes == 1)))
      std::abort();
  if (whole.handshaken) {
    if (whole.peer.size() != b::node_size || whole.peer.compare(0, 8, self, 0, 8) != 0) std::abort();
    if (side == LinkFraming::Side::accepted && whole.peer == self) std::abort();
  }
  if (whole.refused == whole.why.empty()) std::abort();
  return 0;
}
