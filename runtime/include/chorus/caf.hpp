// CAF interop, opt in: chorus's actors run in an orchestrator's own
// caf::actor_system (CAF 0.17.6, the version chorus is built with), and the
// orchestrator's actors log by typed messages to the rank's proxy, each reply
// coming once the run host has the values on disk, as a ticket completes.
// Include it only where CAF is; link CAF (caf_core and caf_io) yourself; a
// run's TLS between nodes is chorus's own. chorus/chorus.hpp stays free of CAF.
//
//   caf::actor_system_config cfg;
//   if (chorus::Error e = chorus::actors::configure(cfg)) ...  // before the system exists
//   caf::actor_system sys{cfg};
//   chorus::Run run = chorus::actors::init(sys);                // chorus's actors run in `sys`
//   chorus::actors::rank_proxy proxy = chorus::actors::proxy(run);
//   ...
//   // in any actor of the process:
//   self->request(proxy, caf::infinite, chorus::actors::log_atom::value, step,
//                 chorus::actors::Values{{"loss", 0.25}})
//       .then([](caf::ok_atom) { /* durable on the run host */ },
//             [](const caf::error& e) { chorus::Error why = chorus::actors::to_error(e); });
//
// Each sending actor logs into a stream of its own (as a `Writer` does):
// its steps are ordered among its own messages only, the rank's committed
// step is the minimum over the live streams, and a stream leaves that
// minimum once its actor sends `leave_atom` or terminates. Errors come back
// as the ticket's would: a step lower than the actor's last one is
// `backwards_step`, a bad key `invalid_key`, a call after finish `finished`. The proxy never
// drops a message: where the rank's queue is full it holds the message, and
// its reply, until there is room (an actor that waits for each reply before
// its next message paces itself).
//
// Lifetime: the Run must finish and be destroyed before the actor system is
// (it waits for chorus's actors, which run on the system's threads). Do not
// block an actor's handler on a chorus ticket (`wait()`): reply to messages,
// or use `on_done`.
#pragma once

#include <chorus/chorus.hpp>

#include <caf/all.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace chorus {

/// chorus::Event as a CAF message (what `actors::subscribe` delivers);
/// `actors::configure` registers it, so that it may cross processes too.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Event& e) {
  return f(::caf::meta::type_name("chorus::Event"), e.kind, e.step, e.rank, e.key, e.time, e.message, e.ranks, e.state,
           e.json);
}

namespace detail {
/// What `actors::subscribe` hands the run's events to: a typed message to
/// `h`, from no actor.
inline std::function<void(const Event&)> event_sender(::caf::actor h) {
  return [h = std::move(h)](const Event& e) { ::caf::anon_send(h, e); };
}
} // namespace detail

} // namespace chorus

namespace chorus::actors {

/// (log_atom, Values) -> ok: the values, at this actor's next automatic step
/// (its own count of calls).
/// (log_atom, std::int64_t step, Values) -> ok: at `step`, which must not be
/// lower than this actor's last one.
using log_atom = caf::atom_constant<caf::atom("chorus_log")>;
/// (open_atom) -> ok: opens this actor's stream now (a first log otherwise
/// does). A stream joins at the rank's last committed step, as a `Writer`
/// does: have the actors that log explicit steps open before any of them logs.
using open_atom = caf::atom_constant<caf::atom("chorus_op")>;
/// (leave_atom) -> ok: this actor is done logging; its stream leaves the
/// rank's minimum once what it logged is processed. A later log opens a new one.
using leave_atom = caf::atom_constant<caf::atom("chorus_lv")>;

/// One log call's values: (key, value) pairs, keys as `Run::log` takes them.
using Values = std::vector<std::pair<std::string, double>>;

/// The messages a rank's proxy takes from the actors of its own process.
using rank_proxy = caf::typed_actor<caf::replies_to<log_atom, Values>::with<caf::ok_atom>,
                                    caf::replies_to<log_atom, std::int64_t, Values>::with<caf::ok_atom>,
                                    caf::replies_to<open_atom>::with<caf::ok_atom>,
                                    caf::replies_to<leave_atom>::with<caf::ok_atom>>;

/// The category of the caf::errors the proxy replies with: the code is an
/// Errc, the context the message (one std::string). `configure` registers it
/// with the system, so that `system().render(e)` prints the message.
inline constexpr caf::atom_value error_category = caf::atom("chorus");

/// The chorus Error a failed reply carries. CAF's own errors (the proxy is
/// gone once its run ended or its host was lost; a request timed out) are
/// said in chorus's terms.
inline Error to_error(const caf::error& e) {
  if (!e) return {};
  if (e.category() == error_category) {
    std::string message;
    if (e.context().match_elements<std::string>()) message = e.context().get_as<std::string>(0);
    return {static_cast<Errc>(e.code()), std::move(message)};
  }
  if (e == caf::sec::request_receiver_down)
    return {Errc::finished, "the rank's proxy is gone (its run finished, or the run host was lost): log before "
                            "finish(), and keep the Run alive while actors log into it"};
  if (e == caf::sec::request_timeout)
    return {Errc::timeout, "the rank's proxy did not reply within the request's timeout; the values may still be "
                           "logged: use a longer timeout (or caf::infinite: the proxy replies once they are durable)"};
  return {Errc::internal, "CAF error " + caf::to_string(e)};
}

/// Prepares an orchestrator's configuration for chorus, before its actor
/// system is constructed: loads CAF's middleman (the run's links between
/// processes) and, for a run across nodes with CHORUS_TLS_DIR, the OpenSSL
/// manager with the job's credentials, and sets the middleman's options
/// chorus relies on (no middleman worker threads; heartbeats where this
/// process accepts links). `opts` and the environment are read as `init`
/// reads them: pass the same Options. The error names a bad variable or
/// missing credentials.
[[nodiscard]] CHORUS_API Error configure(caf::actor_system_config& cfg, const Options& opts = {}) noexcept;

/// As chorus::init, with chorus's actors (the RankProxy, and on the run host
/// the Run actor and its helpers) spawned in `sys` instead of an actor system
/// of chorus's own. A run whose processes link needs `configure` on the
/// system's configuration first; the error says so where it was not.
[[nodiscard]] CHORUS_API Run init(caf::actor_system& sys, const Options& opts, Error& error) noexcept;
/// The same; throws InitError on failure.
[[nodiscard]] CHORUS_API Run init(caf::actor_system& sys, const Options& opts = {});

/// The rank's proxy, for the actors of this process to log into `run`; an
/// invalid (false) handle for an inactive run, where nothing is logged.
[[nodiscard]] CHORUS_API rank_proxy proxy(const Run& run) noexcept;

/// The handle of an actor that takes the run's events: each is a message
/// holding one chorus::Event (README, "When something goes wrong").
using event_subscriber = caf::typed_actor<caf::reacts_to<Event>>;

/// Delivers every later event of `run` to `subscriber` as a typed message (a
/// chorus::Event), in the order the run host told them, the run's
/// run_finished last. Any rank may subscribe, any number of actors; the
/// message comes from no actor (an anonymous send). A false error; an
/// invalid handle or an inactive run is an error that says so.
///
///   chorus::actors::subscribe(run, self);   // in the orchestrator's actor:
///   [=](const chorus::Event& e) { if (e.kind == chorus::EventKind::stalled) restart_job(); }
[[nodiscard]] CHORUS_API Error subscribe(const Run& run, const caf::actor& subscriber) noexcept;
template <class Handle>
[[nodiscard]] Error subscribe(const Run& run, const Handle& subscriber) noexcept {
  return subscribe(run, caf::actor_cast<caf::actor>(subscriber));
}

} // namespace chorus::actors
