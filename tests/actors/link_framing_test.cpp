// What a link takes from its peer (actors/links/link_framing.hpp), fed byte
// sequences as reads would deliver them: BASP's messages as CAF 0.17.6
// writes them (its own serializer makes the nodes, headers and payloads), in
// one read, split over many, or a byte at a time.
#define BOOST_TEST_MODULE actors_link_framing
#include <boost/test/unit_test.hpp>

#include "actors/links/link_framing.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp/header.hpp>

#include <string>
#include <vector>

using namespace chorus::actors;
namespace basp = caf::io::basp;
using Verdict = LinkFraming::Verdict;
using Side = LinkFraming::Side;
using Bytes = std::vector<char>;

namespace {

/// An actor system for CAF's serializer, and the nodes of a link's two ends.
struct Nodes {
  caf::actor_system_config cfg;
  caf::actor_system sys{init(cfg)};
  caf::node_id self = node(1000);
  caf::node_id peer = node(2000);
  caf::node_id other = node(3000); // a third process on the same machine

  static caf::actor_system_config& init(caf::actor_system_config& c) {
    c.load<caf::io::middleman>(); // which gives the system its node
    c.set("middleman.workers", size_t{0});
    c.set("logger.console-verbosity", caf::atom("quiet"));
    return c;
  }
  caf::node_id node(std::uint32_t pid) {
    return caf::make_node_id(pid, static_cast<const caf::node_id::default_data&>(*sys.node()).host_id());
  }
  std::string bytes(const caf::node_id& n) {
    Bytes out;
    caf::binary_serializer s{sys, out};
    BOOST_REQUIRE(!s(n));
    return {out.begin(), out.end()};
  }

  /// A message: `h` with its payload_len set, then what `write` serializes.
  template <class F>
  Bytes message(basp::header h, F write) {
    Bytes body;
    {
      caf::binary_serializer s{sys, body};
      BOOST_REQUIRE(!write(s));
    }
    h.payload_len = static_cast<std::uint32_t>(body.size());
    Bytes out;
    caf::binary_serializer s{sys, out};
    BOOST_REQUIRE(!s(h));
    out.insert(out.end(), body.begin(), body.end());
    return out;
  }
  Bytes header_only(basp::message_type op, std::uint32_t len, std::uint8_t flags = 0) {
    Bytes out;
    caf::binary_serializer s{sys, out};
    basp::header h{op, flags, len, 0, 0, 0};
    BOOST_REQUIRE(!s(h));
    return out;
  }
  Bytes client_handshake(const caf::node_id& as, std::uint8_t flags = 0) {
    return message(basp::header{basp::message_type::client_handshake, flags, 0, 0, 0, 0},
                   [&](caf::binary_serializer& s) { return s(as); });
  }
  Bytes server_handshake(const caf::node_id& as) {
    return message(basp::header{basp::message_type::server_handshake, 0, 0, basp::version, 7, 0},
                   [&](caf::binary_serializer& s) {
                     std::vector<std::string> app_ids{"generic-caf-app"};
                     std::set<std::string> sigs{"caf::replies_to<@atom>::with<@atom>"};
                     return s(as, app_ids, caf::actor_id{7}, sigs);
                   });
  }
  Bytes direct(const caf::message& msg, std::vector<caf::strong_actor_ptr> stages = {}) {
    return message(basp::header{basp::message_type::direct_message, 0, 0, 0, 5, 7},
                   [&](caf::binary_serializer& s) { return s(stages, msg); });
  }
  Bytes routed(const caf::node_id& src, const caf::node_id& dst, const caf::message& msg) {
    return message(basp::header{basp::message_type::routed_message, 0, 0, 0, 7, 7}, [&](caf::binary_serializer& s) {
      std::vector<caf::strong_actor_ptr> stages;
      return s(src, dst, stages, msg);
    });
  }
  Bytes down(const caf::node_id& src, const caf::node_id& dst) {
    return message(basp::header{basp::message_type::down_message, 0, 0, 0, 9, 0}, [&](caf::binary_serializer& s) {
      caf::error reason = caf::exit_reason::kill;
      return s(src, dst, reason);
    });
  }
  Bytes monitor(const caf::node_id& src, const caf::node_id& dst) {
    return message(basp::header{basp::message_type::monitor_message, 0, 0, 0, 0, 9},
                   [&](caf::binary_serializer& s) { return s(src, dst); });
  }
  Bytes heartbeat() { return header_only(basp::message_type::heartbeat, 0); }

  LinkFraming accepted() { return LinkFraming(Side::accepted, bytes(self)); }
  LinkFraming dialled() { return LinkFraming(Side::dialled, bytes(self)); }
};

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

/// Feeds `b` in reads of `chunk` bytes (0: one read); the last verdict that
/// was not ok (a handshake, or the refusal that ends it), else ok.
Verdict feed(LinkFraming& f, const Bytes& b, std::size_t chunk = 0) {
  if (chunk == 0) chunk = b.size();
  Verdict last = Verdict::ok;
  for (std::size_t at = 0; at < b.size(); at += chunk) {
    const Verdict v = f.feed(reinterpret_cast<const unsigned char*>(b.data()) + at, std::min(chunk, b.size() - at));
    if (v != Verdict::ok) last = v;
    if (v == Verdict::refused) break;
  }
  return last;
}

const std::vector<std::size_t> splits{0, 1, 3, 31, 32, 33, 64};

} // namespace

BOOST_FIXTURE_TEST_SUITE(framing, Nodes)

BOOST_AUTO_TEST_CASE(a_node_is_32_bytes_as_caf_0_17_6_writes_it) {
  // The implementation's atom ("default"), the process id, the host id: network order.
  const std::string b = bytes(node(0x01020304));
  BOOST_REQUIRE_EQUAL(b.size(), basp_bytes::node_size);
  BOOST_TEST(b.substr(0, 8) == std::string("\0\0\x3e\x9a\xab\x9b\xac\x79", 8));
  BOOST_TEST(b.substr(8, 4) == std::string("\x01\x02\x03\x04", 4));
  BOOST_TEST(b.substr(12) ==
             std::string(reinterpret_cast<const char*>(
                             static_cast<const caf::node_id::default_data&>(*sys.node()).host_id().data()),
                         20));
  // A header: the operation first, payload_len at offset 4.
  const Bytes h = header_only(basp::message_type::routed_message, 0x11223344, 2);
  BOOST_REQUIRE_EQUAL(h.size(), basp_bytes::header_size);
  BOOST_TEST(h[0] == 3);
  BOOST_TEST(h[3] == 2);
  BOOST_TEST((h[4] == 0x11 && h[5] == 0x22 && h[6] == 0x33 && h[7] == 0x44));
}

BOOST_AUTO_TEST_CASE(a_handshake_then_direct_messages_pass_however_they_are_split) {
  const Bytes stream =
      cat({client_handshake(peer), client_handshake(peer, basp::header::select_connection_flag),
           direct(caf::make_message(caf::atom("fin_tmo"))), heartbeat(), monitor(peer, self), down(peer, self),
           direct(caf::make_message(caf::atom("batch"), Bytes(5000, 'x'))), heartbeat()});
  for (std::size_t chunk : splits) {
    LinkFraming f = accepted();
    BOOST_TEST((feed(f, stream, chunk) == Verdict::handshake), "chunk " << chunk);
    BOOST_TEST(f.handshaken());
    BOOST_TEST(f.peer() == bytes(peer));
  }
  // The handshake is told in the read that ends it, not before.
  LinkFraming f = accepted();
  const Bytes hs = client_handshake(peer);
  BOOST_TEST((f.feed(reinterpret_cast<const unsigned char*>(hs.data()), hs.size() - 1) == Verdict::ok));
  BOOST_TEST(!f.handshaken());
  BOOST_TEST((f.feed(reinterpret_cast<const unsigned char*>(hs.data()) + hs.size() - 1, 1) == Verdict::handshake));
  BOOST_TEST(f.handshaken());
}

BOOST_AUTO_TEST_CASE(a_dialled_link_takes_the_servers_handshake) {
  const Bytes stream = cat({server_handshake(peer), direct(caf::make_message(caf::atom("ack"))), down(peer, self)});
  for (std::size_t chunk : splits) {
    LinkFraming f = dialled();
    BOOST_TEST((feed(f, stream, chunk) == Verdict::handshake), "chunk " << chunk);
    BOOST_TEST(f.peer() == bytes(peer));
  }
  // A client handshake is not what a dialled link waits for, nor a server's on an accepted one.
  LinkFraming d = dialled();
  BOOST_TEST((feed(d, client_handshake(peer)) == Verdict::refused));
  BOOST_TEST(d.why() == "a client handshake before its server handshake");
  LinkFraming a = accepted();
  BOOST_TEST((feed(a, server_handshake(peer)) == Verdict::refused));
}

BOOST_AUTO_TEST_CASE(a_routed_message_is_refused_whatever_it_claims) {
  for (const auto& [src, dst] : {std::pair{self, self}, std::pair{other, self}, std::pair{self, other},
                                 std::pair{peer, self}}) {
    for (std::size_t chunk : splits) {
      LinkFraming f = accepted();
      const Bytes stream = cat({client_handshake(peer), routed(src, dst, caf::make_message(caf::atom("fin_tmo")))});
      BOOST_TEST((feed(f, stream, chunk) == Verdict::refused), "chunk " << chunk);
      BOOST_TEST(f.why().find("a routed message") == 0, f.why());
    }
  }
  // And on a dialled link (an ack a host would route to its rank).
  LinkFraming d = dialled();
  BOOST_TEST((feed(d, cat({server_handshake(peer), routed(peer, self, caf::make_message(caf::atom("ack")))})) ==
              Verdict::refused));
  // Once refused, nothing more passes.
  BOOST_TEST((feed(d, heartbeat()) == Verdict::refused));
}

BOOST_AUTO_TEST_CASE(a_down_or_monitor_message_in_another_nodes_name_is_refused) {
  for (bool is_down : {true, false}) {
    auto make = [&](const caf::node_id& src, const caf::node_id& dst) {
      return is_down ? down(src, dst) : monitor(src, dst);
    };
    const std::string kind = is_down ? "a down message" : "a monitor message";
    for (std::size_t chunk : splits) {
      LinkFraming forged = accepted();
      BOOST_TEST((feed(forged, cat({client_handshake(peer), make(other, self)}), chunk) == Verdict::refused));
      BOOST_TEST(forged.why() == kind + " in the name of another node than the one its handshake announced");
      LinkFraming as_self = accepted();
      BOOST_TEST((feed(as_self, cat({client_handshake(peer), make(self, self)}), chunk) == Verdict::refused));
      LinkFraming routed_on = accepted();
      BOOST_TEST((feed(routed_on, cat({client_handshake(peer), make(peer, other)}), chunk) == Verdict::refused));
      BOOST_TEST(routed_on.why() == kind + " for another node than this process's: chorus routes nothing");
    }
    // Too short to name two nodes.
    LinkFraming f = accepted();
    Bytes shortened = make(peer, self);
    shortened.resize(basp_bytes::header_size + 40);
    shortened[7] = 40;
    shortened[6] = shortened[5] = shortened[4] = 0;
    BOOST_TEST((feed(f, cat({client_handshake(peer), shortened})) == Verdict::refused));
    BOOST_TEST(f.why() == kind + " too short to name its nodes");
  }
}

BOOST_AUTO_TEST_CASE(handshakes_in_another_name_are_refused) {
  LinkFraming as_self = accepted();
  BOOST_TEST((feed(as_self, client_handshake(self)) == Verdict::refused));
  BOOST_TEST(as_self.why() == "a handshake in this process's own name");
  // A second handshake for another node: CAF would route that node's messages here.
  for (std::uint8_t flags : {0, 2}) {
    LinkFraming f = accepted();
    BOOST_TEST((feed(f, cat({client_handshake(peer), client_handshake(other, flags)})) == Verdict::refused));
    BOOST_TEST(f.why() == "a second handshake in another node's name than the first");
  }
  // A node of another kind than CAF's default (here: the invalid node).
  LinkFraming none = accepted();
  BOOST_TEST((feed(none, message(basp::header{basp::message_type::client_handshake, 0, 0, 0, 0, 0},
                                 [&](caf::binary_serializer& s) {
                                   caf::node_id invalid;
                                   std::uint64_t pad[3] = {};
                                   return s(invalid, pad[0], pad[1], pad[2]);
                                 })) == Verdict::refused));
  BOOST_TEST(none.why() == "a handshake announcing a node of another kind than CAF's default");
  // A server's second handshake.
  LinkFraming d = dialled();
  BOOST_TEST((feed(d, cat({server_handshake(peer), server_handshake(peer)})) == Verdict::refused));
}

BOOST_AUTO_TEST_CASE(nothing_but_the_handshake_comes_first) {
  for (const Bytes& first : {direct(caf::make_message(caf::atom("fin_tmo"))), heartbeat(), down(peer, self),
                             monitor(peer, self)}) {
    LinkFraming f = accepted();
    BOOST_TEST((feed(f, first) == Verdict::refused));
    BOOST_TEST(f.why().find("before its client handshake") != std::string::npos, f.why());
  }
  LinkFraming tiny = accepted();
  BOOST_TEST((feed(tiny, header_only(basp::message_type::client_handshake, 8)) == Verdict::refused));
  BOOST_TEST(tiny.why() == "a handshake too short to name its node");
}

BOOST_AUTO_TEST_CASE(oversized_headers_are_refused_at_the_header_however_split) {
  // 1 GiB after the handshake, 4 GiB - 16, and a handshake over its bound.
  for (std::size_t chunk : splits) {
    LinkFraming f = accepted();
    BOOST_TEST((feed(f, cat({client_handshake(peer), header_only(basp::message_type::direct_message, 1u << 30)}),
                     chunk) == Verdict::refused));
    BOOST_TEST(f.why() == "a message header claiming 1073741824 bytes, over the 128 MiB that chorus's messages can take");
    LinkFraming g = accepted();
    BOOST_TEST((feed(g, header_only(basp::message_type::client_handshake, 0xfffffff0u), chunk) == Verdict::refused));
    BOOST_TEST(g.why().find("claiming 4294967280 bytes") != std::string::npos);
    LinkFraming h = accepted();
    BOOST_TEST((feed(h, header_only(basp::message_type::client_handshake, 1u << 20), chunk) == Verdict::refused));
    BOOST_TEST(h.why() == "a handshake claiming 1048576 bytes, over the 64 KiB that a handshake can take");
  }
  // At the bound, a header passes (its payload is still to come).
  LinkFraming f = accepted();
  BOOST_TEST(
      (feed(f, cat({client_handshake(peer), header_only(basp::message_type::direct_message, max_message_bytes)})) ==
       Verdict::handshake));
  // An operation BASP does not have.
  LinkFraming g = accepted();
  Bytes odd = heartbeat();
  odd[0] = 7;
  BOOST_TEST((feed(g, cat({client_handshake(peer), odd})) == Verdict::refused));
  BOOST_TEST(g.why() == "a message of an operation BASP does not have (0x07)");
}

BOOST_AUTO_TEST_CASE(a_forwarding_stack_or_a_link_message_is_refused) {
  // A stage naming an actor of this process, as CAF writes a handle: its id, then its node.
  // (An argument, as CAF 0.17 binds an empty argument list through a null pointer.)
  auto actor = sys.spawn([](caf::event_based_actor*, int) { return caf::behavior{[](int) {}}; }, 0);
  const auto ptr = caf::actor_cast<caf::strong_actor_ptr>(actor);
  for (std::size_t chunk : splits) {
    LinkFraming f = accepted();
    BOOST_TEST((feed(f, cat({client_handshake(peer), direct(caf::make_message(caf::atom("nccl_id")), {ptr})}),
                     chunk) == Verdict::refused));
    BOOST_TEST(f.why().find("a message with a forwarding stack") == 0, f.why());
    for (const caf::message& m :
         {caf::make_message(caf::link_atom::value, ptr), caf::make_message(caf::unlink_atom::value, ptr)}) {
      LinkFraming g = accepted();
      BOOST_TEST((feed(g, cat({client_handshake(peer), direct(m)}), chunk) == Verdict::refused));
      BOOST_TEST(g.why().find("a link message") == 0, g.why());
    }
  }
  // Another atom with a handle is a message like any other.
  LinkFraming h = accepted();
  BOOST_TEST((feed(h, cat({client_handshake(peer), direct(caf::make_message(caf::atom("group"), ptr))})) ==
              Verdict::handshake));
  caf::anon_send_exit(actor, caf::exit_reason::kill);
}

BOOST_AUTO_TEST_SUITE_END()
