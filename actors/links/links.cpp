// How a process links to the job's others: see actors/links/links.hpp.
#include "actors/links/links.hpp"
#include "actors/links/local_link.hpp"
#include "actors/links/node_link.hpp"
#include "actors/protocol.hpp"
#include "runtime/core/backoff.hpp"

#include <algorithm>
#include <thread>

namespace chorus::actors {

/// Whether the run's ranks are on several nodes (scope global across nodes).
bool spans_nodes(const core::Settings& s) { return s.topo.num_nodes > 1 && s.opts.scope == Scope::global; }

Result<LinkPlan> plan_links(const core::Settings& s) {
  LinkPlan plan;
  // Links between nodes carry records from other machines: they are
  // authenticated with the job's credentials, or explicitly allowed not to be.
  plan.across_nodes = s.run_world > 1 && spans_nodes(s);
  // A job's run hosts report to its group on global rank 0, across nodes too.
  plan.group_tls = s.is_host && s.group_size > 0 && s.topo.num_nodes > 1 && !s.opts.tls_dir.empty();
  if ((plan.across_nodes && !s.opts.tls_dir.empty()) || plan.group_tls)
    if (Error e = platform::check_credentials(s.opts.tls_dir, plan.creds)) return e;
  plan.tls = plan.across_nodes && !s.opts.tls_dir.empty();
  if (plan.across_nodes && !plan.tls && !s.opts.insecure)
    return {Errc::invalid_argument,
            "this run spans " + std::to_string(s.topo.num_nodes) +
                " nodes, and links between nodes need the job's credentials: run `chorus certs DIR` once, copy DIR "
                "to every node and set CHORUS_TLS_DIR=DIR on every rank (or set CHORUS_INSECURE=1 to accept "
                "unauthenticated links, on a network you trust)"};
  return plan;
}

Error load_tls(LinkPlan& plan) {
  if (!plan.tls_or_group()) return {};
  // A peer is admitted by holding a certificate of the job's own CA, which
  // only the job's nodes have; no host name is checked.
  Result<std::shared_ptr<const TlsContext>> ctx = TlsContext::load(plan.creds);
  if (!ctx) return ctx.error();
  plan.tls_context = std::move(*ctx);
  return {};
}

/// Whether an orchestrator's actor system can carry the run's links; the
/// error names what is missing and the fix.
Error check_orchestrator_system(caf::actor_system& sys, const core::Settings& s) {
  if (!links_anything(s)) return {};
  const std::string fix = ": call chorus::actors::configure(cfg, opts) on the actor system's configuration before "
                          "constructing the system (<chorus/caf.hpp>)";
  if (!sys.has_middleman())
    return {Errc::invalid_argument, "this run links the job's processes, and the actor system has no middleman" + fix};
  if (caf::get_or(sys.config(), "middleman.workers", caf::defaults::middleman::workers) != 0)
    return {Errc::invalid_argument, "the actor system's middleman has worker threads (middleman.workers), which "
                                    "CAF 0.17 lets hand a message over before its link is known" + fix};
  return {};
}

void configure_links(caf::actor_system_config& cfg, const core::Settings& s) {
  cfg.load<caf::io::middleman>();
  register_wire_types(cfg);
  // Messages from the network are deserialized on the multiplexer thread,
  // in arrival order: CAF 0.17's worker threads can hand a message over
  // before its connection's node is known (a lost sender, a dropped link).
  cfg.set("middleman.workers", size_t{0});
  // Heartbeats are off by default in CAF, where a silent peer is never
  // noticed. But CAF's heartbeat ticks close, besides silent links, any link this
  // process dialled whose handshake is still unanswered at the tick (CAF
  // 0.17 sets its "last seen" only once bytes come back): under load, or
  // on a slow link, every attempt to reach the run host would be closed
  // again. They run only where links are accepted (a run host with other
  // ranks, the job's group), to notice ranks that went silent; a process
  // that only dials keeps its links alive and watched itself
  // (actors/keepalive.hpp), and so do members of a remote group.
  const bool accepts = s.is_host && (s.run_world > 1 || (s.topo.rank == 0 && s.group_size > 0));
  cfg.set("middleman.heartbeat-interval", caf::timespan(accepts ? s.opts.heartbeat_interval : std::chrono::milliseconds(0)));
  cfg.set("middleman.connection-timeout", caf::timespan(s.opts.connection_timeout));
}

Links::Links(caf::actor_system& sys, const LinkPlan& plan, std::string socket_dir, bool nodes,
             std::chrono::milliseconds connection_timeout)
    : sys_(sys), socket_dir_(std::move(socket_dir)), node_tls_(plan.tls_context),
      connection_timeout_(connection_timeout) {
  if (!socket_dir_.empty()) local_ = spawn_local_links(sys_, socket_dir_, connection_timeout_);
  if (nodes) node_ = spawn_node_links(sys_, node_tls_, connection_timeout_);
}

void Links::stop() {
  for (const auto& m : actors()) caf::anon_send_exit(m, caf::exit_reason::kill);
}

std::vector<caf::actor> Links::actors() const {
  std::vector<caf::actor> out;
  for (const auto& m : {local_, node_})
    if (m) out.push_back(caf::actor_cast<caf::actor>(m));
  for (const auto& d : dialers_) out.push_back(caf::actor_cast<caf::actor>(d));
  return out;
}

std::string Links::where(const core::Settings& s, std::uint16_t port, Link link, const std::string& address) const {
  if (link == Link::local) return local_socket_path(socket_dir_, port) + " (" + core::port_name(s, port) + ")";
  return (address.empty() ? "port " : address + ":") + std::to_string(port) +
         (s.port_job.empty() ? std::string() : " (" + core::port_name(s, port) + ")");
}

caf::io::middleman_actor Links::fresh_connector(Link link) {
  dialers_.push_back(link == Link::local ? spawn_local_links(sys_, socket_dir_, connection_timeout_)
                                         : spawn_node_links(sys_, node_tls_, connection_timeout_));
  return dialers_.back();
}

caf::expected<std::uint16_t> Links::publish(caf::strong_actor_ptr whom, std::set<std::string> ifs, std::uint16_t port,
                                            Link link) {
  if (link == Link::local && !local_)
    return caf::make_error(caf::sec::cannot_open_port, "no socket directory for local links");
  if (link == Link::node && !node_)
    return caf::make_error(caf::sec::cannot_open_port, "no links between nodes in a job of one node");
  caf::expected<std::uint16_t> out{std::uint16_t{0}};
  caf::scoped_actor self{sys_};
  self->request(connector(link), caf::infinite, caf::publish_atom::value, port,
                std::move(whom), std::move(ifs), std::string(), true)
      .receive([&](std::uint16_t actual) { out = actual; }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

Error Links::dial(const std::string& address, std::uint16_t port, Link link, clock::time_point deadline,
                  const std::set<std::string>& expected, caf::strong_actor_ptr& out,
                  const std::function<std::string()>& gone) {
  std::string why = "nothing tried";
  auto failed = [](std::string what) { return Error(Errc::connect_failed, std::move(what)); };
  // Ranks often start before the host listens: retry soon, then back off,
  // with jitter (hundreds of ranks start together).
  auto pause = std::chrono::milliseconds(5);
  // CAF 0.17 answers no connect whose link its heartbeat tick closed during
  // the handshake (actors/keepalive.hpp), and its middleman actor makes any
  // later connect to that address wait on the lost one. An attempt is
  // bounded, and after one went unanswered the next goes through a
  // middleman actor of its own. It gets the time the host gives a handshake
  // (connection_timeout) and a second more: a slow handshake (TLS on a
  // loaded host, hundreds of ranks at once) cut short only starts again,
  // and the host, still working on the first, has two to do.
  const auto attempt_limit = std::max(std::chrono::milliseconds(3000), connection_timeout_ + std::chrono::milliseconds(1000));
  caf::io::middleman_actor via = connector(link);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) break;
    {
      caf::scoped_actor self{sys_};
      bool ok = false, unanswered = false, foreign = false;
      const auto waited = std::min(left, attempt_limit);
      self->request(via, waited, caf::connect_atom::value, address, port)
          .receive(
              [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
                if (!ptr) {
                  why = "nothing published on that port yet";
                } else if (!sys_.assignable(ifs, expected)) {
                  foreign = true;
                  why = "what listens there does not take chorus's messages (another program, or a process "
                        "built against another chorus, holds the port)";
                } else {
                  out = std::move(ptr);
                  ok = true;
                }
              },
              [&](caf::error& e) {
                unanswered = e == caf::sec::request_timeout;
                why = unanswered ? "the handshake went unanswered for " + std::to_string(waited.count()) + " ms"
                                 : sys_.render(e);
              });
      if (ok) return {};
      if (foreign) return failed(why);
      if (unanswered) via = fresh_connector(link);
    }
    if (gone)
      if (std::string over = gone(); !over.empty()) return failed(std::move(over));
    std::this_thread::sleep_for(
        std::min(core::jittered(pause), std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now())));
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  return failed(why);
}

} // namespace chorus::actors
