// Every message that crosses between chorus's actors, in one place. Only the
// few translation units that run actors include this (it pulls in CAF).
//
//   RankProxy -> Run   (join_atom, u32 rank, string host, i64 pid, string job)
//   Run -> RankProxy   (joined_atom, bool ok, string run_id | error, string run_dir, actor beacon)
//                      sent to the join's sender, not as a response: CAF 0.17
//                      can lose a remote message's sender while the connection
//                      is set up, so the proxy repeats its join until answered
//                      (a repeated join is answered again; one without a
//                      sender is ignored). `job` is the job's identity: a
//                      rank of another job is refused.
//   RankProxy -> Run   (batch_atom, vector<char> frame)              a wire.hpp rank_batch
//   Run -> RankProxy   (ack_atom, u32 frames, u64 completed, vector<char> errors)
//                      sent once the WAL holding them is on disk; `frames`:
//                      how many of the rank's frames it answers.
//                      errors: repeated {u64 seq, u8 Errc, u32 len, message}
//   Run -> RankProxy   (fail_atom, u8 Errc, string message)          the run cannot keep what it is sent
//                      (its WAL failed): every ticket not acknowledged, and
//                      every later one, fails with this error
//   RankProxy -> Run   (finish_atom) -> (ok_atom)                    host only: finish the run
//   actor -> RankProxy (actors::log_atom, [i64 step,] Values) -> (ok_atom)   an actor of the rank's own
//                      (actors::open_atom) -> (ok_atom), (actors::leave_atom) -> (ok_atom)    process, a stream
//                      each (<chorus/caf.hpp>: the typed rank_proxy); answered when the call's ticket completes,
//                      an error as a caf::error of category actors::error_category
//   rank 0 -> Run      (nccl_id_atom, vector<char> id)               the run's NCCL unique id
//   rank -> Run        (nccl_id_atom) -> (vector<char> id)           answered once rank 0 sent it
//   SystemMonitor -> Run (system_atom, u32 rank, string json_line)   one system.jsonl line
//
// Every handler checks who sent its message: a rank's messages come from its
// RankProxy (or its process), the host's own calls from its own process,
// timers from the actor itself, reports from the Group it registered with.
// Anything else, an anonymous message included, is dropped.
//   Run -> Group       (member_atom, i64 seq, string member_json, actor run)
//                      a member run's latest state (io/store/group_file.hpp's member
//                      object), repeated until acknowledged; a later seq wins
//   Group -> Run       (member_ok_atom, i64 seq)                      sent to the run the report names
//   System -> Run      (group_atom, actor group)                      the Group, here or remote
//   System -> Run      (group_atom) -> (ok_atom)                      once the final report is acknowledged
//   System -> Group    (finish_atom) -> (ok_atom)                     rank 0 exits: once the members ended
//   Run -> Uploader    (upload_atom), (upload_drain_atom, i64 ms) -> (bool, u64, string)   see actors/uploader.hpp
//   Run -> its syncer  (sync_atom) -> (string failure)               fdatasync of the WAL; empty: done
//   host -> Run        (resume_atom) -> (string refusal)              a resumed run's attempt started: empty
//   RankProxy -> beacon (ping_atom) -> (ok_atom)                      a dialled link's keepalive (to the
//   Run -> Group        (ping_atom) -> (ok_atom)                      Run before the join answer came),
//                                                                     see actors/keepalive.hpp
//   self-timers        (drain_atom, u64 loop), nudge_atom, flush_atom, (barrier_tmo_atom, i64 index),
//                      join_tmo_atom, join_retry_atom, finish_tmo_atom, sample_atom, member_retry_atom,
//                      keepalive_atom
//
// Only built-in CAF types travel (integers, strings, std::vector<char>, actor
// handles), so nothing needs registering and a frame is copied once, as raw
// bytes.
#pragma once

#include <chorus/chorus.hpp>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstring>
#include <utility>
#include <vector>

namespace chorus::detail {

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

/// The current message is a timer or a note the actor sent itself.
inline bool from_self(caf::local_actor* self) { return self->current_sender() == self->ctrl(); }

/// The current message comes from an actor of this process.
inline bool from_this_process(caf::local_actor* self) {
  const auto& s = self->current_sender();
  return s && s->node() == self->node();
}

/// The current message comes from `whom`.
inline bool from(caf::local_actor* self, const caf::actor& whom) {
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
caf::actor spawn_blocking(caf::actor_system& sys, Blocking where, F fun, Ts&&... xs) {
  if (where == Blocking::scheduled_for_tests) return sys.spawn(fun, std::forward<Ts>(xs)...);
  return sys.spawn<caf::detached>(fun, std::forward<Ts>(xs)...);
}

/// Encodes one (seq, error) pair of an ack.
void append_ack_error(std::vector<char>& out, std::uint64_t seq, const Error& e);
/// Calls f(seq, Error) for each pair; stops at the first malformed byte.
template <class F>
void for_each_ack_error(const std::vector<char>& in, F&& f) {
  std::size_t i = 0;
  while (i + 13 <= in.size()) {
    std::uint64_t seq;
    std::uint32_t len;
    std::memcpy(&seq, in.data() + i, 8);
    const auto code = static_cast<Errc>(static_cast<std::uint8_t>(in[i + 8]));
    std::memcpy(&len, in.data() + i + 9, 4);
    i += 13;
    if (len > in.size() - i) return;
    f(seq, Error(code, std::string(in.data() + i, len)));
    i += len;
  }
}

} // namespace chorus::detail
