// RankProxy: one per process. Drains the trainer's ring in batches, turns
// them into wire frames (announcing each key once), forwards them to the Run
// actor with a bounded number in flight, and turns the Run's acks into
// completed tickets.
#pragma once

#include "actors/protocol.hpp"

#include <chorus/chorus.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

namespace chorus::client {
class RunImpl;
}

namespace chorus::actors {


struct JoinResult {
  Error error;
  std::string run_id;
  std::string run_dir;
};

/// Where a RankProxy's acks stand: the frames it has in flight, the last
/// call it sent, the last call the host's acks completed.
struct AckWindow {
  std::uint32_t in_flight = 0;
  std::uint64_t sent = 0;
  std::uint64_t acked = 0;
};

/// The frames a RankProxy has sent and its host has not yet acknowledged
/// (the host acks what its WAL holds synced): at most max_frames of them
/// and max_bytes, but one always goes. A burst's first frames are small (the
/// proxy drains while the trainer logs): counted in frames alone, four of
/// them held the next, the trainer's finish among them, until a sync
/// returned, and the run's end then waited for a second sync. The bytes
/// bound what a rank leaves in the host's mailbox, as four full frames did.
class FrameWindow {
public:
  static constexpr std::uint32_t max_frames = 16;
  static constexpr std::size_t max_bytes = std::size_t{1} << 20;

  /// Whether another frame may go.
  [[nodiscard]] bool open() const noexcept {
    return sizes_.empty() || (sizes_.size() < max_frames && bytes_ < max_bytes);
  }
  /// A frame of `bytes` went.
  void sent(std::size_t bytes) {
    sizes_.push_back(bytes);
    bytes_ += bytes;
  }
  /// The `frames` oldest were acknowledged (no more than are in flight).
  void acked(std::uint32_t frames) noexcept {
    for (; frames > 0 && !sizes_.empty(); --frames) {
      bytes_ -= sizes_.front();
      sizes_.pop_front();
    }
  }
  [[nodiscard]] std::uint32_t in_flight() const noexcept { return static_cast<std::uint32_t>(sizes_.size()); }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

private:
  std::deque<std::size_t> sizes_; // oldest first
  std::size_t bytes_ = 0;
};

/// What is wrong with an ack (ack_atom) of `frames` frames completing
/// `completed`, with `errors`, at `w`, or "" where nothing is: it may answer
/// only frames in flight, complete only what the rank sent, never go back,
/// and name errors only among the calls it completed.
[[nodiscard]] std::string bad_ack(const AckWindow& w, std::uint32_t frames, std::uint64_t completed,
                                  const AckErrors& errors);

/// Spawns the proxy of `run` talking to the Run actor `host`; it joins at
/// once, with the job's `secret` (actors/job_secret.hpp), repeating its join
/// until `join_deadline` (init's), and reports the outcome through `on_join`
/// (called exactly once, by the deadline).
rank_proxy_actor spawn_rank_proxy(caf::actor_system& sys, client::RunImpl& run, run_actor host, std::string host_label,
                                  std::string secret, std::chrono::steady_clock::time_point join_deadline,
                                  std::function<void(JoinResult)> on_join);

} // namespace chorus::actors
