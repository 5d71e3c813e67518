// Keepalive: the liveness of a link this process dialled.
//
// CAF 0.17's own silence detection (middleman.connection-timeout, checked at
// every heartbeat tick) closes a connection it dialled whose handshake has
// not been answered by the next tick: the connection's "last seen" time is
// only set by the first bytes that come back. Under load, or across a slow
// link, a TLS handshake outlasts a tick and every attempt to reach the run
// host is closed again. A process that only dials (a rank that does not host
// a run) therefore runs CAF without ticks (see actors/system.cpp), and each
// link it dialled is kept and watched here instead:
//
//   - every heartbeat_interval the peer is sent (ping_atom), which it answers
//     with ok_atom; the ping is also the traffic that keeps the peer's own
//     connection timeout from closing the link of a quiet rank;
//   - a peer not heard from for connection_timeout is gone: its node is
//     unreachable (a pulled cable sends no reset) or it hangs.
#pragma once

#include "actors/protocol.hpp"

#include <chrono>

namespace chorus::actors {

class Keepalive {
public:
  using clock = std::chrono::steady_clock;

  Keepalive(std::chrono::milliseconds interval, std::chrono::milliseconds limit)
      : interval_(interval), limit_(limit), heard_(clock::now()) {}

  /// Something came from the peer.
  void heard() { heard_ = clock::now(); }

  /// One tick of `self`'s keepalive_atom timer: false once `peer` has been
  /// silent for longer than the limit; otherwise pings it and arms the next
  /// tick. `this` must live as long as `self` (a member of its state).
  template <class Self>
  bool tick(Self* self, const beacon_actor& peer) {
    if (clock::now() - heard_ > limit_) return false;
    self->request(peer, limit_, ping_atom::value).then([this](caf::ok_atom) { heard(); }, [](caf::error&) {});
    self->delayed_send(self, interval_, keepalive_atom::value);
    return true;
  }

  std::chrono::milliseconds limit() const { return limit_; }

private:
  std::chrono::milliseconds interval_, limit_;
  clock::time_point heard_;
};

/// An actor of its own that answers pings: a host's links are judged by
/// whether the process and its network answer, not by how long a busy
/// actor's mailbox is (as CAF's own heartbeats are). It is a scheduled
/// actor, not a detached one: CAF 0.17 may never destroy a detached actor
/// that has answered actors of other processes (a reference to it outlives
/// the middleman's stop), and ~actor_system then waits for its thread
/// forever. The scheduler's bounded max-throughput (actors/system.cpp)
/// keeps a busy Run actor from holding a worker thread while pings wait.
class Beacon : public beacon_actor::base {
public:
  /// It stops when `run` does.
  Beacon(caf::actor_config& cfg, caf::actor_addr run) : beacon_actor::base(cfg), run_(std::move(run)) {}
  behavior_type make_behavior() override {
    stop_with(this, run_);
    return {[](ping_atom) { return caf::ok_atom::value; }};
  }

private:
  caf::actor_addr run_;
};

inline beacon_actor spawn_beacon(caf::actor_system& sys, caf::actor_addr run) {
  return spawn_guarded_class<Beacon>(sys, std::move(run));
}

/// True when `peer` lives in another process: a link that was dialled.
template <class Handle>
bool is_remote(const caf::local_actor* self, const Handle& peer) {
  return peer && peer.node() != self->node();
}

} // namespace chorus::actors
