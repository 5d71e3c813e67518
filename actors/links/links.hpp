// How a process links to the job's other processes: the plan (Unix socket
// within a node, TCP between nodes, TLS with the job's credentials or plain
// where CHORUS_INSECURE=1 allows it), the actor system's configuration for
// it, and Links, which publishes this process's actors and dials the others'
// through chorus's own middleman actors (local_link.hpp, node_link.hpp).
#pragma once

#include "actors/links/tls_session.hpp"
#include "io/platform/credentials.hpp"
#include "runtime/core/options.hpp"
#include "runtime/core/result.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_cast.hpp>
#include <caf/expected.hpp>
#include <caf/io/middleman_actor.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace chorus::actors {

/// How a link between two of the job's processes travels: a Unix socket
/// private to this user (processes of one node), or TCP between nodes (TLS
/// with the job's credentials, plain where CHORUS_INSECURE allows it: one
/// process has one kind, node_link.hpp).
enum class Link { local, node };

/// How this process's links to the job's other processes are secured.
struct LinkPlan {
  bool across_nodes = false; // the run's ranks are on several nodes
  bool tls = false;          // links between the run's nodes are mutual TLS
  bool group_tls = false;    // so are the links of the job's run hosts to its group
  platform::Credentials creds;     // the job's, where either is
  std::shared_ptr<const TlsContext> tls_context; // ... loaded once for every TLS link (load_tls)
  [[nodiscard]] bool tls_or_group() const { return tls || group_tls; }
};

/// Whether the run's ranks are on several nodes (scope global across nodes).
[[nodiscard]] bool spans_nodes(const core::Settings& s);

/// Whether this process links to others at all: a run of several ranks, or
/// a run of a job's group. A run of one process alone needs no middleman.
[[nodiscard]] inline bool links_anything(const core::Settings& s) { return s.run_world > 1 || s.group_size > 0; }

/// The plan of this process's links; an error where the run spans nodes with
/// neither credentials nor CHORUS_INSECURE=1, or the credentials are bad.
[[nodiscard]] Result<LinkPlan> plan_links(const core::Settings& s);

/// Loads the job's credentials into `plan.tls_context` where the plan has
/// TLS links, for the links this process makes; the error names the file
/// and the fix.
[[nodiscard]] Error load_tls(LinkPlan& plan);

/// What the links between the job's processes need, in any actor system:
/// the middleman, chorus's message types, and heartbeats only where this
/// process accepts links. (TLS is chorus's own: tls_session.hpp.)
void configure_links(caf::actor_system_config& cfg, const core::Settings& s);

/// Whether an orchestrator's actor system can carry the run's links; the
/// error names what is missing and the fix.
[[nodiscard]] Error check_orchestrator_system(caf::actor_system& sys, const core::Settings& s);

/// This process's middleman actors, which publish its actors and dial the
/// job's others.
class Links {
public:
  using clock = std::chrono::steady_clock;

  /// `socket_dir`: this user's socket directory ("" where nothing links
  /// within the node); `nodes`: whether the job has several nodes.
  Links(caf::actor_system& sys, const LinkPlan& plan, std::string socket_dir, bool nodes,
        std::chrono::milliseconds connection_timeout);

  /// Publishes `whom` on `port`: this user's socket for it (local), or every
  /// interface (TLS, or plain TCP between nodes); with its interface's
  /// signatures, which dial() checks. The port listened on, or why not.
  template <class Handle>
  caf::expected<std::uint16_t> publish(const Handle& whom, std::uint16_t port, Link link) {
    return publish(caf::actor_cast<caf::strong_actor_ptr>(whom), sys_.message_types(whom), port, link);
  }

  /// Dials address:port until `deadline`, into `out`: see the untyped dial.
  template <class Handle>
  Error dial(const std::string& address, std::uint16_t port, Link link, clock::time_point deadline, Handle& out,
             const std::function<std::string()>& gone = {}) {
    caf::strong_actor_ptr found;
    Error e = dial(address, port, link, deadline, sys_.message_types<Handle>(), found, gone);
    if (!e) out = caf::actor_cast<Handle>(std::move(found));
    return e;
  }

  /// Names the listener of `port` (at `address`, where it is another
  /// machine's) for an error, and the job it was derived from, if it was.
  [[nodiscard]] std::string where(const core::Settings& s, std::uint16_t port, Link link,
                                  const std::string& address = {}) const;

  /// Stops the middleman actors (after the actors that use their links).
  void stop();
  /// The middleman actors, for a caller that waits until they are gone.
  [[nodiscard]] std::vector<caf::actor> actors() const;

private:
  caf::expected<std::uint16_t> publish(caf::strong_actor_ptr whom, std::set<std::string> ifs, std::uint16_t port,
                                       Link link);
  /// A bounded TCP probe, then CAF's handshake through a middleman actor,
  /// bounded by a request timeout, until `deadline`. The actor published
  /// there, or the last reason it failed; at once where it was published with
  /// another interface than `expected` (another program, or another chorus,
  /// holds the port). `gone`, where given, says why dialing is over before
  /// the deadline ("" while it is not).
  Error dial(const std::string& address, std::uint16_t port, Link link, clock::time_point deadline,
             const std::set<std::string>& expected, caf::strong_actor_ptr& out,
             const std::function<std::string()>& gone);
  /// The middleman actor that opens links of kind `link`.
  caf::io::middleman_actor connector(Link link) const { return link == Link::local ? local_ : node_; }
  /// Another middleman actor for links of kind `link`, which dial() uses
  /// after an attempt went unanswered; stopped with the others.
  caf::io::middleman_actor fresh_connector(Link link);

  caf::actor_system& sys_;
  std::string socket_dir_;
  std::shared_ptr<const TlsContext> node_tls_; // null: links between nodes are plain TCP
  std::chrono::milliseconds connection_timeout_;
  caf::io::middleman_actor local_; // links within this node (local_link.hpp)
  caf::io::middleman_actor node_;  // links between nodes, TLS or plain (node_link.hpp)
  std::vector<caf::io::middleman_actor> dialers_; // see fresh_connector
};

} // namespace chorus::actors
