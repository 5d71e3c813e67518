// Links between nodes: TCP, with mutual TLS against the job's CA where the job
// has credentials (CHORUS_TLS_DIR), plain where CHORUS_INSECURE=1 allows it.
// A middleman actor of our own opens them, as actors/links/local_link.hpp does
// for the links within a node, on the connection every link has
// (link_stream.hpp): an accepted connection proves itself (its TLS handshake,
// then its BASP handshake) within a deadline, and what a peer sends is judged
// before CAF's BASP broker acts on a byte of it (link_framing.hpp: no routed
// message, no node named in vain, no header claiming more than
// max_message_bytes).
#pragma once

#include "actors/links/link_framing.hpp"
#include "actors/links/tls_session.hpp"

#include <caf/fwd.hpp>
#include <caf/io/middleman_actor.hpp>

#include <chrono>
#include <memory>

namespace chorus::actors {

/// A middleman actor (CAF's publish_atom and connect_atom) for links between
/// nodes. `tls`: the job's credentials for mutual TLS (tls_session.hpp);
/// null for plain TCP. `handshake_deadline`: how long an accepted connection
/// has to prove itself.
caf::io::middleman_actor spawn_node_links(caf::actor_system& sys, std::shared_ptr<const TlsContext> tls,
                                          std::chrono::milliseconds handshake_deadline);

} // namespace chorus::actors
