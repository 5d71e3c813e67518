// The Run actor's rounds of WAL syncs (actors/run.cpp). A round fdatasyncs
// the WAL on a syncer's thread of its own while the actor merges on, and
// releases the acks of what was appended before it was asked for (and the
// files' ends that it backs, for the live upload). One round runs at a time,
// but for a frame that ends a rank: its round starts at once, on the second
// syncer, beside its merge, since the run's end waits for it.
//
// A later round that returns makes durable everything an earlier one would:
// fdatasync writes out all that was written before it was called. So when a
// round returns, it and every round opened before it are done, in order.
#pragma once

#include "actors/host_sink.hpp"
#include "io/store/run_writer.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace chorus::actors {

class SyncRounds {
public:
  static constexpr int syncers = 2;

  struct Round {
    std::uint64_t id = 0;
    int syncer = 0;
    std::uint64_t wal_end = 0;             // the WAL's size when it was asked for: what it makes durable
    std::vector<HostSink::Progress> acks;  // the acks it releases, by rank
    store::RunWriter::LineEnds ends;       // how far the files hold only what it makes durable
  };

  /// A syncer free to take a round, if one is.
  [[nodiscard]] std::optional<int> free_syncer() const noexcept {
    for (int k = 0; k < syncers; ++k)
      if (!busy_[static_cast<std::size_t>(k)]) return k;
    return std::nullopt;
  }
  [[nodiscard]] bool in_flight() const noexcept { return !rounds_.empty(); }
  /// Whether syncer `k` has a round it has not answered.
  [[nodiscard]] bool busy(int k) const noexcept { return busy_[static_cast<std::size_t>(k)]; }

  /// Opens a round on syncer `k` (free_syncer()) over the WAL's first `wal_end` bytes.
  Round& open(int k, std::uint64_t wal_end) {
    busy_[static_cast<std::size_t>(k)] = true;
    Round& r = rounds_.emplace_back();
    r.id = ++next_;
    r.syncer = k;
    r.wal_end = wal_end;
    return r;
  }

  /// Whether the WAL's first `wal_size` bytes are durable, or a round under way makes them so.
  [[nodiscard]] bool covers(std::uint64_t wal_size) const noexcept {
    if (synced_ >= wal_size) return true;
    return std::any_of(rounds_.begin(), rounds_.end(), [&](const Round& r) { return r.wal_end >= wal_size; });
  }
  /// How far the WAL is durable.
  [[nodiscard]] std::uint64_t synced() const noexcept { return synced_; }

  /// Round `id`, run by syncer `k`, returned: it and every round opened
  /// before it are done. Calls `release(round)` for each, oldest first.
  template <class F>
  void done(std::uint64_t id, int k, F&& release) {
    busy_[static_cast<std::size_t>(k)] = false;
    const auto it = std::find_if(rounds_.begin(), rounds_.end(), [&](const Round& r) { return r.id == id; });
    if (it == rounds_.end()) return; // a later round's return released it already
    const auto last = it - rounds_.begin();
    for (std::ptrdiff_t i = 0; i <= last; ++i) {
      Round r = std::move(rounds_.front());
      rounds_.pop_front();
      synced_ = std::max(synced_, r.wal_end);
      release(r);
    }
  }

  /// The rounds under way, oldest first.
  [[nodiscard]] std::deque<Round>& under_way() noexcept { return rounds_; }

private:
  std::deque<Round> rounds_;
  std::array<bool, syncers> busy_{};
  std::uint64_t next_ = 0;
  std::uint64_t synced_ = 0;
};

} // namespace chorus::actors
