// The Run actor's HistorySink (actors/run.cpp): the merge's output goes to
// the run directory (RunWriter), the live merge's doings to the events'
// watch (actors/run_events.hpp), and per rank how far its stream is done
// (and what was refused) to the next acks. Barriers are timed here, on the
// run host's clock.
#pragma once

#include "actors/protocol.hpp"
#include "actors/run_events.hpp"
#include "io/platform/posix.hpp"
#include "io/store/barrier_log.hpp"
#include "io/store/run_writer.hpp"
#include "runtime/core/merger.hpp"
#include "runtime/core/wire.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace chorus::actors {

/// Forwards the merge's output to the run directory, and gathers per rank
/// how far its stream is done (and what was refused) for the next acks.
class HostSink final : public core::HistorySink {
public:
  struct Progress {
    std::uint64_t completed = 0;
    AckErrors errors;
    std::uint32_t frames = 0; // the rank's frames applied since its last ack
    bool changed = false;
    /// What an ack told is told: only `completed` stays.
    void acked() {
      errors.clear();
      changed = false;
      frames = 0;
    }
  };

  explicit HostSink(std::string dir) : writer(std::move(dir), [this](std::uint32_t k) { return merger->key_name(k); }) {}

  /// The events' watch hears what the live merge does (`timing`: not a replay's).
  core::EventWatch* watch() const noexcept { return timing && events ? &events->watch : nullptr; }

  void run_start(std::string_view run_json, std::int64_t ts_us, std::uint32_t world_size) override {
    // A resumed attempt's ranks count their seqs afresh.
    progress.assign(world_size, {});
    hosts.assign(world_size, {});
    warned.assign(world_size, {});
    writer.run_start(run_json, ts_us, world_size);
    if (core::EventWatch* w = watch()) w->run_start(static_cast<int>(world_size), now_us);
  }
  void row(const core::Row& row) override {
    writer.row(row);
    if (core::EventWatch* w = watch()) w->row(row, key_name, now_us);
  }
  void config(int rank, std::string_view json) override { writer.config(rank, json); }
  void summary(int rank, std::string_view json) override { writer.summary(rank, json); }
  void rejected(int rank, std::uint64_t seq, std::int64_t step, std::span<const std::pair<std::string_view, double>> values,
                const Error& why) override {
    writer.rejected(rank, seq, step, values, why);
    // The rank warns of a key's first refusal: its ack says when (completed() follows).
    if (rank < 0 || static_cast<std::size_t>(rank) >= warned.size()) return;
    auto& keys = warned[static_cast<std::size_t>(rank)];
    for (const auto& [key, value] : values)
      if (keys.size() < max_warned_keys && keys.emplace(key).second) warn_next = true;
  }
  void refused(int rank, std::uint64_t seq, std::int64_t step, const Error& why, std::string_view values,
               std::uint32_t n) override {
    writer.refused(rank, seq, step, why, values, n); // the rank warned of these itself
  }
  void metric(std::uint32_t key, Reduce reduce, Summary summary, std::uint32_t step_key) override {
    writer.metric(key, reduce, summary, step_key);
  }
  // When the host accepted the rank's join (its rank_joined event, logged by the join handler below).
  void rank_joined(int rank, std::int64_t ts_us) override { writer.rank_joined(rank, ts_us); }
  void rank_state(int rank, RunState state, std::int64_t last_step, std::string_view host,
                  std::string_view reason) override {
    if (rank >= 0 && static_cast<std::size_t>(rank) < hosts.size() && !host.empty()) hosts[rank] = host;
    ++generation;
    writer.rank_state(rank, state, last_step, host, reason);
    if (core::EventWatch* w = watch()) w->rank_state(rank, state, last_step, reason, now_us);
  }
  // Rules are state: a replayed one counts as well.
  void alert_rule(int, std::uint32_t key, AlertRule rule) override {
    if (events) events->watch.rule(key, merger->key_name(key), rule);
  }
  void event(const core::wire::EventRecord& e) override {
    writer.event(e);
    ++events_told;
  }
  void completed(int rank, std::uint64_t seq, const Error* err) override {
    if (rank < 0 || static_cast<std::size_t>(rank) >= progress.size()) return;
    Progress& p = progress[rank];
    p.completed = std::max(p.completed, seq);
    if (err) p.errors.emplace_back(seq, *err, std::exchange(warn_next, false));
    p.changed = true;
  }
  void run_end(RunState state, std::int64_t ts_us) override {
    if (core::EventWatch* w = watch()) w->run_end(state, now_us);
    if (hold_run_end) {
      held_run_end = std::pair{state, ts_us};
      return;
    }
    writer.run_end(state, ts_us);
  }
  /// The end's run.json staged while the WAL's sync runs (RunWriter::stage_run_end).
  void stage_run_end() {
    if (held_run_end) writer.stage_run_end(held_run_end->first, held_run_end->second);
  }
  /// run.json says how the run ended once what the end told is in
  /// events.jsonl (its readers take the end state as the last word).
  void release_run_end() {
    hold_run_end = false;
    if (held_run_end) writer.run_end(held_run_end->first, held_run_end->second);
    held_run_end.reset();
  }
  // Barriers are timed here, on the run host's clock, as the merge sees ranks
  // reach them and releases them; a replay's (resume) are not: `timing` is off.
  void barrier_reached(int rank, std::uint64_t index, std::string_view name) override {
    if (!timing) return;
    if (core::EventWatch* w = watch()) w->barrier_reached(rank, index, name, now_us);
    if (!arrivals_index || *arrivals_index != index) {
      arrivals_index = index;
      arrivals.clear();
    }
    if (rank < 0) return;
    if (static_cast<std::size_t>(rank) >= arrivals.size()) arrivals.resize(static_cast<std::size_t>(rank) + 1);
    arrivals[static_cast<std::size_t>(rank)] = platform::unix_now_us();
  }
  void barrier_released(std::uint64_t index, std::string_view name, std::int64_t step, std::span<const int> waiters,
                        std::span<const int> missing, const Error* err) override {
    if (core::EventWatch* w = watch()) w->barrier_released(index, name, waiters, missing, err, now_us);
    // A barrier whose ranks arrived before this host timed them (in the replayed log) is not recorded.
    if (!timing || !arrivals_index || *arrivals_index != index) return;
    store::BarrierRecord r;
    r.name = std::string(name);
    r.index = index;
    r.step = step;
    r.released_us = platform::unix_now_us();
    r.opened_us = r.released_us;
    if (err) r.error = err->message();
    for (const int rank : waiters) {
      store::BarrierRank k{rank, std::nullopt};
      if (rank >= 0 && static_cast<std::size_t>(rank) < arrivals.size()) k.arrived_us = arrivals[static_cast<std::size_t>(rank)];
      if (k.arrived_us) r.opened_us = std::min(r.opened_us, *k.arrived_us);
      r.ranks.push_back(k);
    }
    for (const int rank : missing) r.ranks.push_back({rank, std::nullopt});
    std::sort(r.ranks.begin(), r.ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
    arrivals_index.reset();
    arrivals.clear();
    writer.barrier(r);
  }

  core::Merger* merger = nullptr;
  RunEvents* events = nullptr;
  std::uint64_t events_told = 0; // events in the WAL so far (a resumed run's earlier attempts' too)
  std::function<std::string_view(std::uint32_t)> key_name = [this](std::uint32_t k) { return merger->key_name(k); };
  bool timing = true;
  /// The run host's clock as the frame being applied was recorded (one read a frame, not a row).
  std::int64_t now_us = 0;
  bool hold_run_end = false; // end_run: run.json's end waits for the end's events
  std::optional<std::pair<RunState, std::int64_t>> held_run_end;
  std::optional<std::uint64_t> arrivals_index;              // the barrier being timed
  std::vector<std::optional<std::int64_t>> arrivals;         // by rank: when it reached it
  store::RunWriter writer;
  std::vector<Progress> progress;
  std::vector<std::string> hosts;
  // Per rank, the keys whose refusal it was told to warn of (bounded).
  static constexpr std::size_t max_warned_keys = 10'000;
  std::vector<std::unordered_set<std::string>> warned;
  bool warn_next = false;
  std::uint64_t generation = 0; // rank state changes so far
};

} // namespace chorus::actors
