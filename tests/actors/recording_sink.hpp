// A HistorySink that keeps everything the Merger tells it: typed, for the
// unit tests, and as one line of text per call, for comparing whole runs.
#pragma once

#include "runtime/core/merger.hpp"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

namespace chorus {
// For Boost.Test's messages.
inline std::ostream& operator<<(std::ostream& o, RunState s) { return o << "RunState(" << static_cast<int>(s) << ")"; }
inline std::ostream& operator<<(std::ostream& o, Errc e) { return o << "Errc(" << static_cast<int>(e) << ")"; }
} // namespace chorus

namespace chorus::test {

struct RecordedValue {
  std::string key;
  int rank; // -1: stored under the plain key
  double value;
  std::uint32_t count;
};

struct RecordedHistogram {
  std::string key;
  int rank; // -1: stored under the plain key
  Histogram value;
  std::uint32_t count;
};

struct RecordedRow {
  std::int64_t step;
  std::int64_t ts_us;
  std::int64_t runtime_us;
  std::vector<RecordedValue> values;
  std::vector<RecordedHistogram> histograms;
};

struct Completion {
  int rank;
  std::uint64_t seq;
  Errc code;
  std::string message;
};

struct Rejection {
  int rank;
  std::uint64_t seq;
  std::int64_t step;
  std::vector<std::pair<std::string, double>> values;
  Errc code;
  std::string message;
};

struct StateChange {
  int rank;
  RunState state;
  std::int64_t last_step;
  std::string host;
  std::string reason;
};

/// Exact text for a double: hexadecimal, so that equal text means equal bits
/// (every NaN reads "nan": its sign and payload are not part of the contract).
inline std::string exact(double v) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

inline std::string format_row(const RecordedRow& r) {
  std::string s = "row " + std::to_string(r.step) + " ts=" + std::to_string(r.ts_us) + " rt=" +
                  std::to_string(r.runtime_us) + " |";
  for (const auto& v : r.values)
    s += " " + v.key + (v.rank >= 0 ? "/rank-" + std::to_string(v.rank) : "") + "=" + exact(v.value) + "#" +
         std::to_string(v.count);
  return s;
}

inline std::string format_done(int rank, std::uint64_t seq, Errc code) {
  return "done " + std::to_string(rank) + " " + std::to_string(seq) + " " + std::to_string(static_cast<int>(code));
}

inline std::string format_rejected(const Rejection& r) {
  std::string s = "rejected " + std::to_string(r.rank) + " " + std::to_string(r.seq) + " step=" +
                  std::to_string(r.step) + " code=" + std::to_string(static_cast<int>(r.code)) + " |";
  for (const auto& [k, v] : r.values) s += " " + k + "=" + exact(v);
  return s;
}

inline std::string format_state(int rank, RunState state, std::int64_t last_step, std::string_view host,
                                 bool has_reason) {
  return "state " + std::to_string(rank) + " " + std::to_string(static_cast<int>(state)) + " last=" +
         std::to_string(last_step) + " host=" + std::string(host) + (has_reason ? " (reason)" : "");
}

class RecordingSink final : public core::HistorySink {
public:
  const core::Merger* merger = nullptr; // names the keys of rows

  std::vector<std::string> log;
  std::string run_json;
  std::uint32_t world = 0;
  std::vector<RecordedRow> rows;
  std::vector<std::pair<int, std::string>> configs, summaries;
  std::vector<Rejection> rejections;
  std::vector<StateChange> states;
  /// rank_joined(): (rank, ts_us), in the order heard.
  std::vector<std::pair<int, std::int64_t>> joins;
  std::vector<Completion> completions;
  /// refused(): "rank seq step code n values" a line.
  std::vector<std::string> refusals;
  /// metric(): "name reduce summary step-metric" a line (step-metric "-" for _step).
  std::vector<std::string> metrics;
  bool ended = false;
  RunState end_state = RunState::running;
  std::int64_t end_ts = 0;
  /// Broken promises of the interface, found while recording.
  std::vector<std::string> violations;

  void run_start(std::string_view json, std::int64_t ts_us, std::uint32_t world_size) override {
    run_json = json;
    world = world_size;
    last_seq_.assign(world_size, 0);
    log.push_back("start " + std::to_string(ts_us) + " " + std::to_string(world_size) + " " + run_json);
  }
  void row(const core::Row& row) override {
    RecordedRow r{row.step, row.ts_us, row.runtime_us, {}, {}};
    for (const auto& v : row.values)
      r.values.push_back({std::string(merger->key_name(v.key)), v.rank, v.value, v.count});
    for (const auto& h : row.histograms)
      r.histograms.push_back({std::string(merger->key_name(h.key)), h.rank, *h.value, h.count});
    if (!rows.empty() && rows.back().step >= r.step)
      violations.push_back("row " + std::to_string(r.step) + " after row " + std::to_string(rows.back().step));
    for (std::size_t i = 1; i < r.values.size(); ++i) {
      const auto& a = r.values[i - 1];
      const auto& b = r.values[i];
      if (a.key > b.key || (a.key == b.key && a.rank >= b.rank))
        violations.push_back("row " + std::to_string(r.step) + " values out of order at " + b.key);
    }
    if (r.values.empty() && r.histograms.empty()) violations.push_back("empty row " + std::to_string(r.step));
    log.push_back(format_row(r));
    rows.push_back(std::move(r));
  }
  void config(int rank, std::string_view json) override {
    configs.emplace_back(rank, std::string(json));
    log.push_back("config " + std::to_string(rank) + " " + std::string(json));
  }
  void summary(int rank, std::string_view json) override {
    summaries.emplace_back(rank, std::string(json));
    log.push_back("summary " + std::to_string(rank) + " " + std::string(json));
  }
  void rejected(int rank, std::uint64_t seq, std::int64_t step,
                std::span<const std::pair<std::string_view, double>> values, const Error& why) override {
    Rejection r{rank, seq, step, {}, why.code(), why.message()};
    for (const auto& [k, v] : values) r.values.emplace_back(std::string(k), v);
    if (!why || why.message().empty()) violations.push_back("rejection without a reason");
    log.push_back(format_rejected(r));
    rejections.push_back(std::move(r));
  }
  void refused(int rank, std::uint64_t seq, std::int64_t step, const Error& why, std::string_view values,
               std::uint32_t n) override {
    std::string line = std::to_string(rank) + " " + std::to_string(seq) + " " +
                       (step == core::wire::auto_step ? std::string("auto") : std::to_string(step)) + " " +
                       std::string(to_string(why.code())) + " " + std::to_string(n) + " " + std::string(values);
    if (!why || why.message().empty()) violations.push_back("refusal without a reason");
    log.push_back("refused " + line);
    refusals.push_back(std::move(line));
  }
  void metric(std::uint32_t key, Reduce reduce, Summary summary, std::uint32_t step_key) override {
    std::string line = std::string(merger->key_name(key)) + " " + std::string(to_string(reduce)) + " " +
                       std::string(to_string(summary)) + " " +
                       (step_key == no_step_key ? std::string("-") : std::string(merger->key_name(step_key)));
    log.push_back("metric " + line);
    metrics.push_back(std::move(line));
  }
  void rank_joined(int rank, std::int64_t ts_us) override { joins.emplace_back(rank, ts_us); }
  void rank_state(int rank, RunState state, std::int64_t last_step, std::string_view host,
                  std::string_view reason) override {
    states.push_back({rank, state, last_step, std::string(host), std::string(reason)});
    if (state == RunState::crashed && reason.empty()) violations.push_back("crash without a reason");
    log.push_back(format_state(rank, state, last_step, host, !reason.empty()));
  }
  void completed(int rank, std::uint64_t seq, const Error* err) override {
    if (rank < 0 || static_cast<std::size_t>(rank) >= last_seq_.size()) {
      violations.push_back("completion for rank " + std::to_string(rank));
    } else {
      if (seq <= last_seq_[rank])
        violations.push_back("rank " + std::to_string(rank) + " completed seq " + std::to_string(seq) + " after " +
                             std::to_string(last_seq_[rank]));
      last_seq_[rank] = seq;
    }
    if (err && (!*err || err->message().empty())) violations.push_back("completion error without a message");
    const Errc code = err ? err->code() : Errc::ok;
    completions.push_back({rank, seq, code, err ? err->message() : std::string()});
    log.push_back(format_done(rank, seq, code));
  }
  void run_end(RunState state, std::int64_t ts_us) override {
    ended = true;
    end_state = state;
    end_ts = ts_us;
    log.push_back("end " + std::to_string(static_cast<int>(state)) + " " + std::to_string(ts_us));
  }

  /// The latest: a resumed attempt's ranks number their seqs afresh.
  [[nodiscard]] const Completion* completion(int rank, std::uint64_t seq) const {
    for (auto c = completions.rbegin(); c != completions.rend(); ++c)
      if (c->rank == rank && c->seq == seq) return &*c;
    return nullptr;
  }

private:
  std::vector<std::uint64_t> last_seq_;
};

} // namespace chorus::test
