// Every message that crosses between chorus's actors, in one place: each
// actor's interface is a caf::typed_actor below, which its behaviour
// implements and every sender holds, so a message an actor does not take
// fails to compile. Only the few translation units that run actors include
// this (it pulls in CAF).
//
// What each message means is said at its interface. The rules they share:
//
// Senders. Every handler checks who sent its message: a rank's messages come
// from its RankProxy (or its process), the host's own calls from its own
// process, timers from the actor itself, reports from the Group it
// registered with. Anything else, an anonymous message included, is
// dropped. The types bind this process's senders only: a peer process may
// send any message at all (CAF 0.17 delivers a remote message whatever its
// types; one no handler takes is dropped), so the checks stay.
//
// Answers to the sender. The Run answers a join, and the Group a report, by a
// message to the sender (joined_atom, member_ok_atom), not as a response:
// CAF 0.17 can lose a remote message's sender while the connection is set
// up, so the proxy repeats its join, and the Run its report, until answered
// (a repeated one is answered again; one without a sender is ignored).
//
// Self-timers. A typed actor of CAF 0.17 takes only what its type lists,
// its timers and the notes it sends itself too. Each actor's behaviour is
// therefore its interface extended by its own timers (the *_self types
// below); every other actor holds the interface alone, which has none of
// them. (The Uploader's sender and the SystemMonitor time themselves with a
// message of their interface: upload_atom, sample_atom.)
//
// What CAF 0.17 cannot type, all of it here:
//   - Handles inside messages between processes (the Beacon of joined_atom,
//     the Run a report names) travel as caf::actor: typed handles are not
//     among CAF 0.17's built-in types, so each would need a name registered
//     with every actor system (an orchestrator's too), and a handle from
//     another process is only as typed as that process claims. The receiver
//     casts it to the interface it expects.
//   - A message's sender (current_sender()) is an untyped strong_actor_ptr:
//     the Run answers a join at the RankProxy interface of whoever sent it.
//   - A link: CAF's middleman (and chorus's own middleman actors,
//     actors/links/local_link.hpp, actors/links/node_link.hpp) publishes and connects
//     untyped actors. The run host and the Group are published with their
//     interface's signatures, and a peer's handle is taken only where the
//     signatures it was published with are its interface's (actors/system.cpp).
//   - A request dropped by its handler's sender check: an untyped handler
//     that returns nothing answers a request with an empty message, which no
//     typed signature can say; drop_request() sends it.
//   - The System (runtime/client/system.hpp) stays free of CAF's headers, so it
//     hands the RankProxy out as caf::actor; actors/caf_api.cpp casts it to
//     <chorus/caf.hpp>'s rank_proxy.
//   - A refused resume (actors/run.cpp): the Run actor then answers
//     resume_atom only, until its host stops it: a typed behaviour must
//     implement the whole interface, so that one is built unchecked.
//
// Ack errors are a std::vector<AckError>, registered with every actor system
// that links processes (actors/system.cpp's configure_links, which
// <chorus/caf.hpp>'s configure calls too); every other element that crosses
// processes is a CAF built-in (integers, strings, std::vector<char>, actor
// handles), and a frame is copied once, as raw bytes.
#pragma once

#include <chorus/caf.hpp>
#include <chorus/chorus.hpp>

#include "actors/guard.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace chorus::store {
class WalWriter;
}

namespace chorus::actors {

using join_atom = caf::atom_constant<caf::atom("join")>;
using joined_atom = caf::atom_constant<caf::atom("joined")>;
using join_retry_atom = caf::atom_constant<caf::atom("join_rty")>;
using batch_atom = caf::atom_constant<caf::atom("batch")>;
using ack_atom = caf::atom_constant<caf::atom("ack")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using nudge_atom = caf::atom_constant<caf::atom("nudge")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
using barrier_tmo_atom = caf::atom_constant<caf::atom("bar_tmo")>;
using join_tmo_atom = caf::atom_constant<caf::atom("join_tmo")>;
using finish_tmo_atom = caf::atom_constant<caf::atom("fin_tmo")>;
using nccl_id_atom = caf::atom_constant<caf::atom("nccl_id")>;
using system_atom = caf::atom_constant<caf::atom("system")>;
using sample_atom = caf::atom_constant<caf::atom("sample")>;
using member_atom = caf::atom_constant<caf::atom("member")>;
using member_ok_atom = caf::atom_constant<caf::atom("member_ok")>;
using member_retry_atom = caf::atom_constant<caf::atom("member_rty")>;
using group_atom = caf::atom_constant<caf::atom("group")>;
using upload_atom = caf::atom_constant<caf::atom("upload")>;
using upload_drain_atom = caf::atom_constant<caf::atom("up_drain")>;
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using keepalive_atom = caf::atom_constant<caf::atom("keepalive")>;
using fail_atom = caf::atom_constant<caf::atom("fail")>;
using sync_atom = caf::atom_constant<caf::atom("sync")>;
using resume_atom = caf::atom_constant<caf::atom("resume")>;
using exited_atom = caf::atom_constant<caf::atom("exited")>;
using event_atom = caf::atom_constant<caf::atom("event")>;
using answered_atom = caf::atom_constant<caf::atom("answered")>;

// -- errors -----------------------------------------------------------------

/// The Error of a code and a message from another process: a code this build
/// does not know (a newer peer's, or garbage), or none, reads as internal.
[[nodiscard]] inline Error error_from_peer(std::uint8_t code, std::string message) {
  constexpr auto last = static_cast<std::uint8_t>(Errc::upload_incomplete); // the last Errc
  if (code == 0 || code > last)
    return {Errc::internal, "the run host answered with an unknown error code " + std::to_string(code) + ": " +
                                std::move(message)};
  return {static_cast<Errc>(code), std::move(message)};
}

/// An Error as a message carries it, to an actor of this process or of
/// another: its code (an Errc, 0 where there is no error) and its message.
/// Every reply and message that can say why something failed says it so.
struct WireError {
  std::uint8_t code = 0;
  std::string message;

  WireError() = default;
  WireError(const Error& e) // NOLINT: an Error goes into a message as it is
      : code(e ? static_cast<std::uint8_t>(e.code()) : std::uint8_t{0}), message(e ? e.message() : std::string()) {}
  /// The Error; empty where there is none, and a code this build does not
  /// know reads as internal (error_from_peer).
  [[nodiscard]] Error error() const { return code == 0 ? Error{} : error_from_peer(code, message); }
  explicit operator bool() const noexcept { return code != 0; }
  friend bool operator==(const WireError&, const WireError&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WireError& x) {
  return f(caf::meta::type_name("chorus.error"), x.code, x.message);
}

/// A call that an ack answers with an error: its ticket's seq, and the error.
struct AckError {
  std::uint64_t seq = 0;
  WireError failure;
  /// The call's values were refused, and a key of them for the first time
  /// on this rank: the rank prints the message as a warning (once a key).
  bool warn = false;

  AckError() = default;
  AckError(std::uint64_t s, const Error& e, bool w = false) : seq(s), failure(e), warn(w) {}
  [[nodiscard]] Error error() const { return error_from_peer(failure.code, failure.message); }
  friend bool operator==(const AckError&, const AckError&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AckError& x) {
  return f(caf::meta::type_name("chorus.ack_error"), x.seq, x.failure, x.warn);
}

/// The errors of one ack. CAF's binary deserializer reads it from a peer
/// within the message's bytes (a count or a length past its end is an error,
/// and the message is dropped), and error() checks each code.
using AckErrors = std::vector<AckError>;

/// Registers what travels between processes beyond CAF's built-in types.
inline void register_wire_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<WireError>("chorus.error");
  cfg.add_message_type<AckErrors>("chorus.ack_errors");
}

// -- interfaces -------------------------------------------------------------

/// Answers a keepalive ping (actors/keepalive.hpp).
using ping_sig = caf::replies_to<ping_atom>::with<caf::ok_atom>;

/// The Beacon (actors/keepalive.hpp): answers the pings of a run's ranks.
using beacon_actor = caf::typed_actor<ping_sig>;

/// A RankProxy as its Run actor reaches it.
using proxy_actor = caf::typed_actor<
    // (refusal, run id, run dir, the run's Beacon or none): the join's
    // answer; `refusal` says why the rank may not join, and is empty where
    // it joined
    caf::reacts_to<joined_atom, WireError, std::string, std::string, caf::actor>,
    // (frames, completed, errors): sent once the WAL holding them is on
    // disk; `frames`: how many of the rank's frames it answers; `completed`:
    // the rank's seq done up to; `errors`: the calls among them that failed.
    caf::reacts_to<ack_atom, std::uint32_t, std::uint64_t, AckErrors>,
    // (error): the run cannot keep what it is sent (its WAL failed,
    // or it ended): every ticket not acknowledged, and every later one,
    // fails with this error.
    caf::reacts_to<fail_atom, WireError>,
    // (frame): an event the run told (a wire.hpp HostEvent::event frame, as
    // its WAL holds it), for the rank's Run::on_event and next_event
    caf::reacts_to<event_atom, std::vector<char>>,
    // answered once the proxy has everything the run sent before: the run's
    // end waits for it, so that its host's process does not stop with the
    // last acks still queued
    ping_sig>;

/// The RankProxy as its own process holds it: the Channel's wake-up for a
/// parked proxy, and <chorus/caf.hpp>'s rank_proxy, through which the
/// process's actors log by message (each call answered when its ticket
/// completes, an error as a caf::error of category actors::error_category).
using rank_proxy_actor =
    proxy_actor::extend<caf::reacts_to<nudge_atom>,
                        // (status): the process exits with it after the rank finished (the System,
                        // at exit): told to the run host, answered once it has it (or is gone)
                        caf::replies_to<exited_atom, std::int32_t>::with<caf::ok_atom>>::extend_with<rank_proxy>;
/// Its timers: its drain loop (of a generation), the join's retry, the
/// keepalive of a run host in another process, finish's bound.
using rank_proxy_self =
    rank_proxy_actor::extend<caf::reacts_to<drain_atom, std::uint64_t>, caf::reacts_to<join_retry_atom>,
                             caf::reacts_to<keepalive_atom>, caf::reacts_to<finish_tmo_atom>>;

/// The Run actor as the ranks reach it, published on the run's port.
using run_actor = caf::typed_actor<
    // (rank, host name, pid, job, secret): a RankProxy joins; answered with
    // joined_atom, to the sender. `job` is the job's identity: a rank of
    // another job is refused; `secret`, the job's (actors/job_secret.hpp):
    // a process outside the job cannot take a rank's place.
    caf::reacts_to<join_atom, std::uint32_t, std::string, std::int64_t, std::string, std::string>,
    // a wire.hpp rank_batch of a joined rank
    caf::reacts_to<batch_atom, std::vector<char>>,
    // the host's own RankProxy finishes the run
    caf::replies_to<finish_atom>::with<caf::ok_atom>,
    // from the host's own RankProxy: the trainer has finish's answer, so what
    // only the end needed (the disk's reserve) goes, off the finish's path
    caf::reacts_to<answered_atom>,
    // (rank, status): the rank's process exited with `status` (not 0) after
    // the rank finished, even after the run ended: the rank, and the run,
    // failed. From the rank's own proxy; answered once on disk.
    caf::replies_to<exited_atom, std::uint32_t, std::int32_t>::with<caf::ok_atom>,
    // from run rank 0's process: the run's NCCL unique id
    caf::reacts_to<nccl_id_atom, std::vector<char>>,
    // from a rank's process: the id, answered once rank 0 sent it
    caf::replies_to<nccl_id_atom>::with<std::vector<char>>,
    // (rank, line): a rank's SystemMonitor, one system.jsonl line
    caf::reacts_to<system_atom, std::uint32_t, std::string>,
    // a rank's keepalive, before the join's answer named the Beacon
    ping_sig>;

/// A member run as its Group reaches it: (seq) its report `seq` is taken.
using member_actor = caf::typed_actor<caf::reacts_to<member_ok_atom, std::int64_t>>;

/// The Group (actors/group.hpp) as the run hosts of the job reach it,
/// published on the group's port.
using group_actor = caf::typed_actor<
    // (seq, member JSON, the run, the job's secret): a member run's latest state
    // (io/store/group_file.hpp's member object), sent by that run, repeated until
    // acknowledged (member_ok_atom, to the sender); a later seq wins
    caf::reacts_to<member_atom, std::int64_t, std::string, caf::actor, std::string>,
    // global rank 0's System, as it exits: answered once the members ended
    caf::replies_to<finish_atom>::with<caf::ok_atom>,
    // a member's keepalive, where the Group is in another process
    ping_sig>;
/// Its timers: the write of group.json, the join's and finish's bounds.
using group_self =
    group_actor::extend<caf::reacts_to<flush_atom>, caf::reacts_to<join_tmo_atom>, caf::reacts_to<finish_tmo_atom>>;

/// The Run actor as its host process (the System) holds it.
using run_host_actor = run_actor::extend_with<member_actor>::extend<
    // the Group, here or remote: the run registers with it; answered once
    // the Group has the run's first report (or is gone)
    caf::replies_to<group_atom, group_actor>::with<caf::ok_atom>,
    // answered once the run's final report is acknowledged
    caf::replies_to<group_atom>::with<caf::ok_atom>,
    // a resumed run's attempt started: no error, or why it was refused
    caf::replies_to<resume_atom>::with<WireError>>;
/// Its timers: the files' flush (each second), a barrier's bound (its
/// index), the ranks' join bound, finish's bound, the retry of a report to
/// the Group and the keepalive of a Group in another process; and a sync
/// round put off behind the messages already queued.
using run_self = run_host_actor::extend<caf::reacts_to<flush_atom>, caf::reacts_to<barrier_tmo_atom, std::int64_t>,
                                        caf::reacts_to<join_tmo_atom>, caf::reacts_to<finish_tmo_atom>,
                                        caf::reacts_to<member_retry_atom>, caf::reacts_to<keepalive_atom>,
                                        caf::reacts_to<sync_atom>>;

/// The WAL a syncer makes durable: held by the request until its fdatasync
/// returns, so that a run that ends meanwhile leaves it open. A message of
/// this process only: it cannot cross to another (nothing can read it).
struct WalToSync {
  std::shared_ptr<store::WalWriter> wal;
};

/// A WAL syncer (actors/wal_syncers.hpp): fdatasync of the WAL it is given;
/// no error once done, else why it failed.
using syncer_actor = caf::typed_actor<caf::replies_to<sync_atom, WalToSync>::with<WireError>>;

/// The Uploader (actors/uploader.hpp), and its sender behind it.
using uploader_actor = caf::typed_actor<
    // new data was flushed: send what there is (the sender's own timer too,
    // when a backoff or a rate limit ends)
    caf::reacts_to<upload_atom>,
    // (ms) -> (bytes left, error): the run ended: send everything; an
    // upload_incomplete error says what is left and how to send it later
    caf::replies_to<upload_drain_atom, std::int64_t>::with<std::uint64_t, WireError>>;

/// A SystemMonitor: its sampling timer is all it takes.
using system_monitor_actor = caf::typed_actor<caf::reacts_to<sample_atom>>;

// -- helpers ----------------------------------------------------------------

/// The current message is a timer or a note the actor sent itself.
inline bool from_self(caf::local_actor* self) { return self->current_sender() == self->ctrl(); }

/// The current message comes from an actor of this process.
inline bool from_this_process(caf::local_actor* self) {
  const auto& s = self->current_sender();
  return s && s->node() == self->node();
}

/// The current message comes from `whom`.
template <class Handle>
bool from(caf::local_actor* self, const Handle& whom) {
  const auto& s = self->current_sender();
  return s && whom && caf::actor_cast<caf::actor_addr>(s) == whom.address();
}

/// Where an actor that blocks its thread (the WAL's fdatasync, the
/// Uploader's HTTP requests) runs: `detached`, on a thread of its own, in
/// every process; `scheduled_for_tests`, a scheduled actor like the others,
/// in tests/actors only, whose deterministic scheduler (CAF's test
/// coordinator) runs nothing else.
enum class Blocking : bool { detached, scheduled_for_tests };

template <class F, class... Ts>
auto spawn_blocking(caf::actor_system& sys, Blocking where, F fun, Ts&&... xs) {
  if (where == Blocking::scheduled_for_tests) return spawn_guarded(sys, fun, std::forward<Ts>(xs)...);
  return spawn_guarded<caf::detached>(sys, fun, std::forward<Ts>(xs)...);
}

/// A request that its handler's sender check refused, answered as an untyped
/// handler that returns nothing answers it: with an empty message (none to a
/// message that is no request). The handler returns what this returns.
template <class... Ts>
caf::delegated<Ts...> drop_request(caf::local_actor* self) {
  caf::response_promise rp = self->make_response_promise();
  if (rp.pending() && !rp.async()) rp.deliver(caf::unit);
  return {};
}

} // namespace chorus::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(chorus::actors::WalToSync)
