// The training's own collectives (gradient averaging, consistency checks),
// over Gloo's TCP transport. Gloo's headers stay in process_group.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace ddp {

struct GroupOptions {
  /// Directory for Gloo's FileStore rendezvous. Every rank must see the same
  /// directory: on several nodes it has to be on a shared filesystem.
  std::string store_dir;
  /// Names this job inside the store, so that concurrent jobs never meet.
  std::string job_key;
  /// Interface (e.g. "eth0") or address Gloo binds to; one of the two.
  std::string iface;
  std::string host;
  std::chrono::milliseconds timeout{60'000};
};

/// A Gloo context over all ranks of the job. With one rank it holds no Gloo
/// state at all and every collective is the identity.
class ProcessGroup {
public:
  /// Rendezvous with the other ranks; throws std::runtime_error (or Gloo's
  /// exceptions) if they cannot be reached within the timeout.
  ProcessGroup(int rank, int world_size, const GroupOptions& opts);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int world_size() const noexcept { return world_size_; }

  /// values = mean over ranks, the same bits on every rank.
  void average(std::span<float> values);
  /// values = sum over ranks.
  void sum(std::span<double> values);
  /// True on every rank iff every rank passed the same value.
  [[nodiscard]] bool all_equal(std::uint64_t value);
  void barrier();

private:
  struct Gloo;
  int rank_;
  int world_size_;
  std::unique_ptr<Gloo> gloo_;
};

} // namespace ddp
