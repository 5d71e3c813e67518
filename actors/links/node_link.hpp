// Links between nodes: TCP, with mutual TLS against the job's CA where the job
// has credentials (CHORUS_TLS_DIR), plain where CHORUS_INSECURE=1 allows it.
// A middleman actor of our own opens them, as actors/links/local_link.hpp does for
// the links within a node, so that two rules hold before CAF's BASP broker
// acts on a byte from a peer:
//
//  - A connection this process accepted proves itself within a deadline: it
//    finishes its TLS handshake (which demands the job's certificate) and
//    delivers its first bytes, or it is shut down. CAF 0.17's own OpenSSL
//    doorman waits forever on a peer that never finishes its handshake, so a
//    few hundred such connections would hold a run host at its fd limit.
//  - No BASP message may claim more than `max_message_bytes`: CAF sizes its
//    receive buffer from a header's payload_len before it checks anything
//    else, so one 32-byte header could make a host allocate 4 GiB.
#pragma once

#include <caf/fwd.hpp>
#include <caf/io/middleman_actor.hpp>

#include <chrono>
#include <cstddef>

namespace chorus::detail {

/// The largest BASP payload a link takes. chorus's own messages stay far
/// below it: frames close at `max_frame_bytes` (actors/rank_proxy.cpp) and a
/// config or summary call takes at most 16 MiB of JSON (runtime/client/run.cpp).
inline constexpr std::size_t max_message_bytes = std::size_t{128} << 20;

/// A middleman actor (CAF's publish_atom and connect_atom) for links between
/// nodes. `tls`: mutual TLS through CAF's OpenSSL session (the actor system
/// must have loaded caf::openssl::manager with the job's credentials).
/// `handshake_deadline`: how long an accepted connection has to prove itself.
caf::io::middleman_actor spawn_node_links(caf::actor_system& sys, bool tls,
                                          std::chrono::milliseconds handshake_deadline);

} // namespace chorus::detail
