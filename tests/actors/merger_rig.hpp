// A Merger fed by frame builders that number keys and seqs the way a
// RankProxy does, with a sink that records what it was told: the rig of the
// Merger's deterministic tests.
#pragma once

#include "runtime/core/merger.hpp"
#include "tests/actors/recording_sink.hpp"

#include <boost/test/unit_test.hpp>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chorus::test {

namespace w = chorus::core::wire;
using chorus::core::Merger;

constexpr std::int64_t start_ts = 1'000'000;
constexpr std::int64_t auto_step = w::auto_step;

/// A Merger with a recording sink, and frame builders that keep each rank's
/// key ids and seqs the way a RankProxy does. Ranks number their keys
/// differently on purpose: the merge must join them by name.
struct Rig {
  test::RecordingSink sink;
  Merger m{sink};
  std::vector<std::map<std::string, std::uint32_t, std::less<>>> ids;
  std::vector<std::uint64_t> seq;
  std::vector<std::vector<char>> frames; // everything applied, in order

  explicit Rig(int world, bool join_all = true) {
    sink.merger = &m;
    ids.resize(world);
    seq.assign(world, 0);
    BOOST_REQUIRE(apply(w::run_start(start_ts, static_cast<std::uint32_t>(world), R"({"id":"t"})")));
    if (join_all)
      for (int r = 0; r < world; ++r) join(r);
  }

  bool apply(const std::vector<char>& f) {
    frames.push_back(f);
    return m.apply(f);
  }
  void join(int r) {
    BOOST_REQUIRE(apply(w::rank_joined(static_cast<std::uint32_t>(r), 1, 100 + r, "host-" + std::to_string(r))));
  }
  void dead(int r, std::string_view why = "gone") {
    BOOST_REQUIRE(apply(w::rank_dead(static_cast<std::uint32_t>(r), 2, why)));
  }
  void end(RunState s = RunState::finished) { BOOST_REQUIRE(apply(w::run_end(s, 99))); }
  /// A resumed attempt (Options::resume) after end(): its ranks are new
  /// processes, numbering their keys and seqs afresh.
  void resume(int world, std::int64_t ts, bool join_all = true) {
    ids.assign(world, {});
    seq.assign(world, 0);
    BOOST_REQUIRE(apply(w::run_start(ts, static_cast<std::uint32_t>(world), R"({"id":"t"})")));
    if (join_all)
      for (int r = 0; r < world; ++r) join(r);
  }

  class Batch {
  public:
    Batch(Rig& rig, int rank) : rig_(rig), rank_(rank), w_(bytes_, static_cast<std::uint32_t>(rank)) {}

    /// One log call into `stream` (0: the default stream, else a writer's).
    std::uint64_t log(std::vector<std::pair<std::string, double>> values, std::int64_t step = auto_step,
                      std::int64_t ts = start_ts + 10, std::uint32_t stream = 0) {
      std::vector<std::uint32_t> keys;
      for (auto& [k, v] : values) keys.push_back(key(k));
      const std::uint64_t s = next();
      w_.values(s, step, ts, static_cast<std::uint32_t>(values.size()), stream);
      for (std::size_t i = 0; i < values.size(); ++i) w_.value(keys[i], values[i].second);
      return s;
    }
    std::uint64_t define(std::string_view name, Reduce r) {
      const auto k = key(name);
      const auto s = next();
      w_.define(s, k, r);
      return s;
    }
    std::uint64_t barrier(std::string_view name, std::int64_t timeout_ms = 1000) {
      const auto k = key(name);
      const auto s = next();
      w_.barrier(s, k, timeout_ms);
      return s;
    }
    std::uint64_t config(std::string_view json) {
      const auto s = next();
      w_.config(s, json);
      return s;
    }
    std::uint64_t summary(std::string_view json) {
      const auto s = next();
      w_.summary(s, json);
      return s;
    }
    std::uint64_t finish(std::int32_t exit_code = 0) {
      const auto s = next();
      w_.finish(s, exit_code);
      return s;
    }
    /// The rank ends `state` (failed or killed) with `code` and why.
    std::uint64_t end(RunState state, std::int32_t code, std::string_view message = {}) {
      const auto s = next();
      w_.finish_ended(s, state, code, message);
      return s;
    }
    /// Values refused before the ring: `n` of them, `values` a JSON object.
    std::uint64_t refused(std::int64_t step, std::uint32_t n, std::string_view values,
                          Errc code = Errc::invalid_key) {
      const auto s = next();
      w_.refused(s, step, code, n, "refused for a test", values);
      return s;
    }
    /// define_metric's summary and step metric (unchanged where not given).
    std::uint64_t view(std::string_view name, std::optional<Summary> summary, std::string_view step_metric = {}) {
      const auto k = key(name);
      const std::uint32_t step_key = step_metric.empty() ? w::no_step_metric : key(step_metric);
      const auto s = next();
      w_.metric_view(s, k, summary ? static_cast<std::uint8_t>(*summary) : w::unchanged_summary, step_key);
      return s;
    }
    /// One log_histogram call into `stream`; `step` may be w::same_step.
    std::uint64_t histogram(std::string_view name, const Histogram& h, std::int64_t step = auto_step,
                            std::uint32_t stream = 0, std::int64_t ts = start_ts + 10) {
      const auto k = key(name);
      const auto s = next();
      w_.histogram(s, stream, step, ts, k, h);
      return s;
    }
    /// Opens (Run::writer) or closes (Writer::close) writer stream `id`.
    std::uint64_t stream(std::uint32_t id, bool open) {
      const auto s = next();
      w_.stream(s, id, open);
      return s;
    }
    bool send() { return rig_.apply(bytes_); }
    /// The frame as a RankProxy sends it, for an actor test to send instead.
    [[nodiscard]] const std::vector<char>& bytes() const { return bytes_; }

  private:
    std::uint32_t key(std::string_view name) {
      auto& ids = rig_.ids[rank_];
      auto it = ids.find(name);
      if (it != ids.end()) return it->second;
      const auto id = static_cast<std::uint32_t>(ids.size() * 3 + rank_ * 11); // rank-local numbering
      ids.emplace(std::string(name), id);
      w_.key(id, name);
      return id;
    }
    std::uint64_t next() { return ++rig_.seq[rank_]; }

    Rig& rig_;
    int rank_;
    std::vector<char> bytes_;
    w::BatchWriter w_;
  };

  Batch batch(int r) { return Batch(*this, r); }

  /// One log call in its own frame.
  std::uint64_t log(int r, std::vector<std::pair<std::string, double>> values, std::int64_t step = auto_step,
                    std::int64_t ts = start_ts + 10) {
    auto b = batch(r);
    const auto s = b.log(std::move(values), step, ts);
    BOOST_REQUIRE(b.send());
    return s;
  }
  /// One log call of writer stream `stream` in its own frame.
  std::uint64_t write(int r, std::uint32_t stream, std::vector<std::pair<std::string, double>> values,
                      std::int64_t step = auto_step) {
    auto b = batch(r);
    const auto s = b.log(std::move(values), step, start_ts + 10, stream);
    BOOST_REQUIRE(b.send());
    return s;
  }
  /// One log_histogram call in its own frame.
  std::uint64_t histogram(int r, std::string_view name, const Histogram& h, std::int64_t step = auto_step) {
    auto b = batch(r);
    const auto s = b.histogram(name, h, step);
    BOOST_REQUIRE(b.send());
    return s;
  }
  /// Opens or closes writer stream `id` of rank `r` in a frame of its own.
  std::uint64_t stream(int r, std::uint32_t id, bool open) {
    auto b = batch(r);
    const auto s = b.stream(id, open);
    BOOST_REQUIRE(b.send());
    return s;
  }
  std::uint64_t barrier(int r, std::string_view name, std::int64_t timeout_ms = 1000) {
    auto b = batch(r);
    const auto s = b.barrier(name, timeout_ms);
    BOOST_REQUIRE(b.send());
    return s;
  }
  std::uint64_t finish(int r, std::int32_t exit_code = 0) {
    auto b = batch(r);
    const auto s = b.finish(exit_code);
    BOOST_REQUIRE(b.send());
    return s;
  }

  [[nodiscard]] std::vector<std::int64_t> steps() const {
    std::vector<std::int64_t> out;
    for (const auto& r : sink.rows) out.push_back(r.step);
    return out;
  }
  [[nodiscard]] const test::RecordedRow* row(std::int64_t step) const {
    for (const auto& r : sink.rows)
      if (r.step == step) return &r;
    return nullptr;
  }
  [[nodiscard]] std::optional<Errc> done(int rank, std::uint64_t s) const {
    const auto* c = sink.completion(rank, s);
    if (!c) return std::nullopt;
    return c->code;
  }

  ~Rig() {
    BOOST_CHECK_MESSAGE(sink.violations.empty(),
                        "sink saw: " << (sink.violations.empty() ? "" : sink.violations.front()));
  }
};

std::string values_text(const test::RecordedRow* r) { return r ? test::format_row(*r) : std::string("(no row)"); }

} // namespace chorus::test
