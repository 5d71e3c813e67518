// The Merger against a reference model of its rules (runtime/core/merger.hpp) on random runs.
//
// The reference is written for clarity, not speed: ordered maps, events kept
// as plain structs, and the watermark and barrier state recomputed from every
// rank on every event. Both are fed the same random run (random ranks, record
// streams, writer streams within them (README, "Many producers in one rank"),
// frame splits, interleavings and host decisions) and must tell their sinks
// exactly the same things, in the same order.
//
// CHORUS_SEED=n replays a run of cases; CHORUS_CASE=i runs only case i of it;
// CHORUS_MODEL_CASES=n changes how many cases run (10 000; 500 under a
// sanitizer).
#define BOOST_TEST_MODULE actors_merger_model
#include <boost/test/unit_test.hpp>

#include "runtime/core/merger.hpp"
#include "tests/actors/recording_sink.hpp"

#include <array>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

using namespace chorus;
namespace w = chorus::core::wire;

namespace {

/// One event of a rank's stream, owning its data.
struct Ev {
  w::Tag tag;
  std::uint64_t seq = 0;
  std::int64_t step = 0; // values: the step or auto_step; barrier: its timeout
  std::int64_t ts = 0;
  std::uint32_t stream = 0; // stream_values, stream_open, stream_close: the writer (0: the default stream)
  std::vector<std::pair<std::uint32_t, double>> values; // (local key id, value)
  std::uint32_t key = 0;                                // key: its id; define: the key; barrier: its name
  Reduce reduce = Reduce::none;
  std::string text; // key: its name; config, summary: the JSON
};

std::vector<char> encode(std::uint32_t rank, const std::vector<Ev>& events) {
  std::vector<char> out;
  w::BatchWriter b(out, rank);
  for (const Ev& e : events) {
    switch (e.tag) {
      case w::Tag::key: b.key(e.key, e.text); break;
      case w::Tag::values:
      case w::Tag::stream_values:
        b.values(e.seq, e.step, e.ts, static_cast<std::uint32_t>(e.values.size()), e.stream);
        for (auto [k, v] : e.values) b.value(k, v);
        break;
      case w::Tag::define: b.define(e.seq, e.key, e.reduce); break;
      case w::Tag::barrier: b.barrier(e.seq, e.key, e.step); break;
      case w::Tag::config: b.config(e.seq, e.text); break;
      case w::Tag::summary: b.summary(e.seq, e.text); break;
      case w::Tag::finish: b.finish(e.seq); break;
      case w::Tag::finish_failed: b.finish(e.seq, static_cast<std::int32_t>(e.step)); break;
      case w::Tag::stream_open:
      case w::Tag::stream_close: b.stream(e.seq, e.stream, e.tag == w::Tag::stream_open); break;
      case w::Tag::finish_ended:
      case w::Tag::refused:
      case w::Tag::metric_view:
      case w::Tag::histogram:
      case w::Tag::media:
      case w::Tag::alert_rule: break; // not in the model's events (merger_histogram_test, e2e_media_test and e2e_events_test have them)
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// The reference model.

class Reference {
public:
  std::vector<std::string> log;
  std::set<std::tuple<int, std::int64_t, std::string>> accepted; // (rank, step, key) that went into a row
  std::uint64_t rows = 0;
  std::uint64_t rejected_values = 0;
  std::int64_t committed = -1;

  void run_start(std::int64_t ts, int world) {
    start_ = ts;
    ranks_.assign(static_cast<std::size_t>(world), RankRef{});
    log.push_back("start " + std::to_string(ts) + " " + std::to_string(world) + " {}");
  }

  void frame(int rank, const std::vector<Ev>& events) {
    RankRef& r = ranks_[rank];
    if (ended_ || r.state != RunState::running) return;
    for (const Ev& e : events) {
      if (e.tag == w::Tag::key) {
        r.names[e.key] = e.text;
        continue;
      }
      if (r.closed) continue;
      if (r.parked) {
        r.waiting.push_back(e);
        continue;
      }
      handle(rank, e);
      settle();
    }
  }

  void joined(int rank, const std::string& host) {
    RankRef& r = ranks_[rank];
    if (ended_ || r.joined || r.state != RunState::running) return;
    r.joined = true;
    r.host = host;
    log.push_back(test::format_state(rank, RunState::running, r.last, r.host, false));
  }

  void dead(int rank) {
    if (ended_ || ranks_[rank].state != RunState::running) return;
    crash(rank);
    settle();
  }

  void barrier_timeout(std::uint64_t index) {
    if (ended_ || !any_parked() || index != released_) return;
    release(Cause::timeout);
    settle();
  }

  void finish_timeout() {
    if (ended_) return;
    // Open barriers let their waiters through first (a finish may wait behind one).
    while (any_parked()) release(all_live_parked() ? Cause::arrived : Cause::run_end);
    for (int i = 0; i < world(); ++i)
      if (ranks_[i].state == RunState::running) crash(i);
    settle();
  }

  void run_end(RunState state, std::int64_t ts) {
    if (ended_) return;
    while (any_parked()) release(all_live_parked() ? Cause::arrived : Cause::run_end);
    commit_below(std::nullopt);
    ended_ = true;
    log.push_back("end " + std::to_string(static_cast<int>(state)) + " " + std::to_string(ts));
  }

  // What the Merger reports about its state.
  [[nodiscard]] int world() const { return static_cast<int>(ranks_.size()); }
  [[nodiscard]] std::int64_t open_barrier() const {
    return any_parked() && !ended_ ? static_cast<std::int64_t>(released_) : -1;
  }
  [[nodiscard]] std::vector<int> missing() const {
    std::vector<int> out;
    if (open_barrier() < 0) return out;
    for (int i = 0; i < world(); ++i)
      if (ranks_[i].state == RunState::running && !ranks_[i].parked) out.push_back(i);
    return out;
  }
  [[nodiscard]] std::int64_t open_timeout() const {
    std::int64_t t = 0;
    if (open_barrier() < 0) return 0;
    for (const auto& r : ranks_)
      if (r.parked) t = std::max(t, r.btimeout);
    return t;
  }
  [[nodiscard]] RunState state(int rank) const { return ranks_[rank].state; }
  [[nodiscard]] bool is_joined(int rank) const { return ranks_[rank].joined; }
  [[nodiscard]] std::int64_t last_step(int rank) const { return ranks_[rank].last; }
  [[nodiscard]] bool all_done() const {
    return std::none_of(ranks_.begin(), ranks_.end(), [](const RankRef& r) { return r.state == RunState::running; });
  }

private:
  /// One ordered stream of a rank: its default stream (run.log) or a writer.
  struct StreamRef {
    std::int64_t last = -1;   // the step it last logged at: its explicit steps must not go below
    std::int64_t cursor = -1; // its automatic steps go on after this
  };
  struct RankRef {
    RunState state = RunState::running;
    bool joined = false, parked = false, closed = false;
    std::int64_t last = -1; // the highest step any of its streams logged at
    StreamRef plain;        // the default stream, live once it has logged
    bool plain_live = false;
    bool had_writers = false; // a writer opened at some time
    std::map<std::uint32_t, StreamRef> writers; // the open writer streams, by id
    std::uint64_t barriers = 0;
    std::map<std::uint32_t, std::string> names;
    std::deque<Ev> waiting;
    std::uint64_t bseq = 0;
    std::string bname;
    std::int64_t btimeout = 0;
    std::string host;
  };
  struct PendingRow {
    std::int64_t ts = std::numeric_limits<std::int64_t>::max();
    std::map<std::pair<std::string, int>, double> values; // (key, rank) -> value
  };
  enum class Cause { arrived, timeout, run_end };

  void done(int rank, std::uint64_t seq, Errc code) { log.push_back(test::format_done(rank, seq, code)); }

  void crash(int rank) {
    RankRef& r = ranks_[rank];
    r.state = RunState::crashed;
    log.push_back(test::format_state(rank, RunState::crashed, r.last, r.host, true));
  }

  void handle(int rank, const Ev& e) {
    RankRef& r = ranks_[rank];
    switch (e.tag) {
      case w::Tag::values:
      case w::Tag::stream_values: {
        // Each stream's steps are its own: automatic ones count its calls,
        // and only its own last step makes an explicit one backwards. The
        // default stream goes live at its first values, its automatic steps
        // going on where barriers left them, and in a rank that opened
        // writers past the last committed step, as a writer opens.
        if (!r.plain_live && e.tag == w::Tag::values) {
          r.plain_live = true;
          if (r.had_writers) r.plain.cursor = std::max(r.plain.cursor, committed);
        }
        StreamRef& s = e.tag == w::Tag::values ? r.plain : r.writers.at(e.stream);
        const bool automatic = e.step == w::auto_step;
        const std::int64_t step = automatic ? s.cursor + 1 : e.step;
        Errc code = Errc::ok;
        if (!automatic && step < s.last) {
          code = Errc::backwards_step;
        } else {
          s.last = step;
          s.cursor = std::max(s.cursor, step);
          r.last = std::max(r.last, step);
          if (step <= committed) code = Errc::step_committed;
        }
        if (code != Errc::ok) {
          test::Rejection rej{rank, e.seq, step, {}, code, {}};
          for (auto [k, v] : e.values) rej.values.emplace_back(r.names.at(k), v);
          log.push_back(test::format_rejected(rej));
          rejected_values += e.values.size();
        } else if (!e.values.empty()) {
          PendingRow& row = pending_[step];
          row.ts = std::min(row.ts, e.ts);
          for (auto [k, v] : e.values) {
            row.values[{r.names.at(k), rank}] = v;
            accepted.emplace(rank, step, r.names.at(k));
          }
        }
        done(rank, e.seq, code);
        break;
      }
      case w::Tag::stream_open: // a writer joins at the last committed step
        r.writers[e.stream] = StreamRef{-1, committed};
        r.had_writers = true;
        done(rank, e.seq, Errc::ok);
        break;
      case w::Tag::stream_close:
        r.writers.erase(e.stream);
        done(rank, e.seq, Errc::ok);
        break;
      case w::Tag::define:
        reduce_[r.names.at(e.key)] = e.reduce;
        // The sink hears the declaration whole (the model makes no metric views).
        log.push_back("metric " + r.names.at(e.key) + " " + std::string(to_string(e.reduce)) + " last -");
        done(rank, e.seq, Errc::ok);
        break;
      case w::Tag::config:
      case w::Tag::summary:
        log.push_back(std::string(e.tag == w::Tag::config ? "config " : "summary ") + std::to_string(rank) + " " +
                      e.text);
        done(rank, e.seq, Errc::ok);
        break;
      case w::Tag::finish:
      case w::Tag::finish_failed: {
        r.closed = true;
        // A finish with an exit code ends the rank as failed, with that reason.
        const bool failed = e.tag == w::Tag::finish_failed;
        if (r.state == RunState::running) {
          r.state = failed ? RunState::failed : RunState::finished;
          log.push_back(test::format_state(rank, r.state, r.last, r.host, failed));
        }
        done(rank, e.seq, Errc::ok);
        break;
      }
      case w::Tag::barrier: {
        const std::uint64_t index = r.barriers++;
        if (index < released_) {
          pass_barrier(r);
          done(rank, e.seq, Errc::barrier_timeout);
        } else {
          r.parked = true;
          r.bseq = e.seq;
          r.bname = r.names.at(e.key);
          r.btimeout = e.step;
        }
        break;
      }
      case w::Tag::key: break;
      // Not among the events the model generates (merger_test.cpp covers them).
      case w::Tag::finish_ended:
      case w::Tag::refused:
      case w::Tag::metric_view:
      case w::Tag::histogram:
      case w::Tag::media:
      case w::Tag::alert_rule: break;
    }
  }

  /// Past a barrier, every stream's automatic steps go on after what it committed.
  void pass_barrier(RankRef& r) {
    r.plain.cursor = std::max(r.plain.cursor, committed);
    for (auto& [id, s] : r.writers) s.cursor = std::max(s.cursor, committed);
  }

  /// Where a rank stands for the watermark: the minimum over its live
  /// streams; with none live, at its last step. (Where it stands at or below
  /// the committed step does not matter: no row is pending there.)
  [[nodiscard]] static std::int64_t stands(const RankRef& r) {
    std::optional<std::int64_t> m;
    if (r.plain_live) m = r.plain.cursor;
    for (const auto& [id, s] : r.writers) m = std::min(m.value_or(s.cursor), s.cursor);
    return m.value_or(r.last);
  }

  [[nodiscard]] bool any_parked() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const RankRef& r) { return r.parked; });
  }
  [[nodiscard]] bool all_live_parked() const {
    return std::all_of(ranks_.begin(), ranks_.end(),
                       [](const RankRef& r) { return r.state != RunState::running || r.parked; });
  }

  void settle() {
    while (any_parked() && all_live_parked()) release(Cause::arrived);
    std::optional<std::int64_t> mark;
    for (const auto& r : ranks_)
      if (r.state == RunState::running && !r.parked) mark = std::min(mark.value_or(stands(r)), stands(r));
    commit_below(mark);
  }

  void release(Cause cause) {
    commit_below(std::nullopt);
    std::vector<int> waiters;
    for (int i = 0; i < world(); ++i)
      if (ranks_[i].parked) waiters.push_back(i);
    Errc code = Errc::barrier_timeout;
    if (cause == Cause::arrived) {
      code = Errc::ok;
      for (int i : waiters)
        if (ranks_[i].bname != ranks_[waiters[0]].bname) code = Errc::barrier_mismatch;
    }
    ++released_;
    for (int i : waiters) {
      ranks_[i].parked = false;
      pass_barrier(ranks_[i]);
      done(i, ranks_[i].bseq, code);
    }
    for (int i : waiters) {
      RankRef& r = ranks_[i];
      while (!r.waiting.empty() && !r.parked && !r.closed) {
        Ev e = r.waiting.front();
        r.waiting.pop_front();
        handle(i, e);
      }
      if (r.closed) r.waiting.clear();
    }
  }

  /// Commits the pending rows below `mark`; all of them without one.
  void commit_below(std::optional<std::int64_t> mark) {
    while (!pending_.empty() && (!mark || pending_.begin()->first < *mark)) {
      const auto [step, row] = *pending_.begin();
      pending_.erase(pending_.begin());
      test::RecordedRow out{step, row.ts, row.ts - start_, {}};
      for (auto it = row.values.begin(); it != row.values.end();) {
        const std::string& key = it->first.first;
        std::vector<std::pair<int, double>> by_rank;
        for (; it != row.values.end() && it->first.first == key; ++it)
          by_rank.emplace_back(it->first.second, it->second);
        const auto r = reduce_.find(key);
        const Reduce how = r == reduce_.end() ? Reduce::none : r->second;
        const auto count = static_cast<std::uint32_t>(by_rank.size());
        if (how == Reduce::none) { // a column per rank, whoever else logged; plain in a run of one
          for (auto [rank, v] : by_rank) out.values.push_back({key, world() == 1 ? -1 : rank, v, 0});
          continue;
        }
        if (how == Reduce::first) { // the lowest rank's value: by_rank is in rank order
          out.values.push_back({key, -1, by_rank[0].second, count});
          continue;
        }
        bool nan = false;
        for (auto [rank, v] : by_rank) nan = nan || std::isnan(v);
        double x = by_rank[0].second;
        for (std::size_t i = 1; i < by_rank.size(); ++i) {
          const double v = by_rank[i].second;
          if (how == Reduce::sum || how == Reduce::mean) x += v;
          if (how == Reduce::min) x = std::min(x, v);
          if (how == Reduce::max) x = std::max(x, v);
        }
        if (how == Reduce::mean) x /= static_cast<double>(by_rank.size());
        if (nan) x = std::numeric_limits<double>::quiet_NaN();
        out.values.push_back({key, -1, x, count});
      }
      committed = step;
      ++rows;
      log.push_back(test::format_row(out));
    }
  }

  std::int64_t start_ = 0;
  std::vector<RankRef> ranks_;
  std::map<std::int64_t, PendingRow> pending_;
  std::map<std::string, Reduce> reduce_;
  std::uint64_t released_ = 0;
  bool ended_ = false;
};

// ---------------------------------------------------------------------------
// Random runs.

using Rng = std::mt19937_64;

int pick(Rng& rng, int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); }
bool chance(Rng& rng, int percent) { return pick(rng, 100) < percent; }

const std::vector<std::string> key_pool{"loss", "acc", "lr", "grad/norm", "b", "Zeta"};

struct RankPlan {
  std::vector<std::vector<Ev>> frames;
  std::size_t next = 0;
  bool joins = true;
  bool dies = false;
  bool joined = false;
  bool declared_dead = false;
};

/// One rank's stream: segments of records split by the run's barriers, then
/// (usually) a finish; a dying rank's stream stops early.
RankPlan plan_rank(Rng& rng, int rank, int barriers, std::int64_t start) {
  RankPlan p;
  // Rank-local key ids, different on every rank; sometimes two ids for one name.
  std::map<std::string, std::vector<std::uint32_t>> ids;
  std::set<std::uint32_t> used;
  for (const auto& k : key_pool) {
    std::uint32_t id;
    do id = static_cast<std::uint32_t>(pick(rng, 64)); while (!used.insert(id).second);
    ids[k].push_back(id);
  }
  if (chance(rng, 10)) {
    std::uint32_t id;
    do id = static_cast<std::uint32_t>(pick(rng, 64)); while (!used.insert(id).second);
    ids[key_pool[pick(rng, static_cast<int>(key_pool.size()))]].push_back(id);
  }
  std::map<std::string, std::uint32_t> barrier_ids;
  std::uint32_t next_barrier_id = 100;
  std::set<std::uint32_t> introduced;
  std::uint64_t seq = 0;
  std::int64_t est = -1, ts = start + rank;
  std::vector<Ev> stream;

  // Writer streams (Run::writer), on some ranks: opened before the rank's
  // records or among them, closed, their ids reused, left open at its finish
  // or death. Each has its own explicit steps, near the rank's furthest; on
  // some of these ranks the default stream never logs.
  const bool has_writers = chance(rng, 30);
  const int plain_share = has_writers ? 40 * pick(rng, 3) : 100; // % of values into the default stream
  // Ids as a client reuses them; on a few ranks one is the highest allowed.
  const std::array<std::uint32_t, 4> writer_ids{1, 2, 3, has_writers && chance(rng, 10) ? w::max_streams : 4};
  std::map<std::uint32_t, std::int64_t> writers; // the open ones: id -> its explicit steps' estimate
  std::int64_t furthest = -1;                    // the highest estimate of any stream
  auto any_writer = [&] { return std::next(writers.begin(), pick(rng, static_cast<int>(writers.size()))); };
  auto open_or_close = [&](bool open) {
    Ev x{open ? w::Tag::stream_open : w::Tag::stream_close};
    if (open) {
      do x.stream = writer_ids[static_cast<std::size_t>(pick(rng, static_cast<int>(writer_ids.size())))];
      while (writers.count(x.stream));
      writers[x.stream] = std::max<std::int64_t>(-1, furthest + pick(rng, 7) - 4);
    } else {
      const auto it = any_writer();
      x.stream = it->first;
      writers.erase(it);
    }
    x.seq = ++seq;
    stream.push_back(x);
  };
  if (has_writers)
    for (int n = pick(rng, 4); n > 0; --n) open_or_close(true);

  auto name_key = [&](std::uint32_t id, const std::string& name) {
    if (!introduced.count(id) || chance(rng, 3)) {
      Ev k{w::Tag::key};
      k.key = id;
      k.text = name;
      stream.push_back(k);
      introduced.insert(id);
    }
  };
  auto random_key = [&](std::uint32_t& id) {
    const auto& name = key_pool[pick(rng, static_cast<int>(key_pool.size()))];
    const auto& choices = ids[name];
    id = choices[pick(rng, static_cast<int>(choices.size()))];
    name_key(id, name);
  };
  auto random_value = [&]() -> double {
    const int kind = pick(rng, 20);
    if (kind == 0) return std::numeric_limits<double>::quiet_NaN();
    if (kind < 4) return std::ldexp(static_cast<double>(rng() >> 11), -52) - 1.0; // arbitrary bits
    return pick(rng, 11) - 5 + (chance(rng, 30) ? 0.5 : 0.0);
  };

  for (int segment = 0; segment <= barriers; ++segment) {
    const int records = pick(rng, 9);
    for (int i = 0; i < records; ++i) {
      if (has_writers && chance(rng, 15))
        open_or_close(writers.empty() || (writers.size() < writer_ids.size() && chance(rng, 50)));
      const int what = pick(rng, 100);
      ts += pick(rng, 9) - 1;
      if (what < 72) {
        Ev v{w::Tag::values};
        std::int64_t* at = &est; // the estimate of the stream it goes into
        if (has_writers && !chance(rng, plain_share)) {
          if (writers.empty()) open_or_close(true);
          const auto it = any_writer();
          v.tag = w::Tag::stream_values;
          v.stream = it->first;
          at = &it->second;
        }
        const int n = chance(rng, 10) ? 0 : 1 + pick(rng, 4);
        for (int j = 0; j < n; ++j) {
          std::uint32_t id;
          random_key(id);
          v.values.emplace_back(id, random_value());
        }
        if (chance(rng, 70)) {
          v.step = w::auto_step;
          ++*at;
        } else {
          v.step = std::max<std::int64_t>(0, *at + pick(rng, 8) - 3);
          *at = std::max(*at, v.step);
        }
        furthest = std::max(furthest, *at);
        v.ts = ts;
        v.seq = ++seq;
        stream.push_back(v);
      } else if (what < 82) {
        Ev d{w::Tag::define};
        random_key(d.key);
        d.reduce = static_cast<Reduce>(pick(rng, 6)); // none .. first
        d.seq = ++seq;
        stream.push_back(d);
      } else if (what < 91) {
        Ev c{chance(rng, 50) ? w::Tag::config : w::Tag::summary};
        c.text = "{\"k" + std::to_string(pick(rng, 3)) + "\":" + std::to_string(pick(rng, 100)) + "}";
        c.seq = ++seq;
        stream.push_back(c);
      } else if (!writers.empty() && chance(rng, 50)) {
        any_writer()->second += pick(rng, 6); // a writer runs ahead
      } else {
        est += pick(rng, 3); // a gap in the explicit steps to come
      }
    }
    if (segment < barriers) {
      const std::string name = "epoch-" + std::to_string(segment) + (chance(rng, 5) ? "-odd" : "");
      auto [it, fresh] = barrier_ids.try_emplace(name, next_barrier_id);
      if (fresh) ++next_barrier_id;
      name_key(it->second, name);
      Ev b{w::Tag::barrier};
      b.key = it->second;
      b.step = 100 * (1 + pick(rng, 50));
      b.seq = ++seq;
      stream.push_back(b);
    }
  }
  if (chance(rng, 90)) {
    if (has_writers && chance(rng, 50)) // else the finish ends the writers still open
      while (!writers.empty()) open_or_close(false);
    Ev f{chance(rng, 10) ? w::Tag::finish_failed : w::Tag::finish};
    f.step = 1 + pick(rng, 255); // the exit code of a failed finish
    f.seq = ++seq;
    stream.push_back(f);
    if (chance(rng, 5)) { // a client that logs after its finish: ignored
      Ev v{w::Tag::values};
      if (!writers.empty() && chance(rng, 50)) {
        v.tag = w::Tag::stream_values;
        v.stream = any_writer()->first;
      }
      v.step = w::auto_step;
      v.seq = ++seq;
      stream.push_back(v);
    }
  }
  if (chance(rng, 20)) { // the rank dies: only part of its stream was ever sent
    p.dies = true;
    stream.resize(static_cast<std::size_t>(pick(rng, static_cast<int>(stream.size()) + 1)));
  }
  if (chance(rng, 5)) {
    p.joins = false;
    p.dies = chance(rng, 60);
  }
  for (std::size_t i = 0; i < stream.size();) {
    const std::size_t n = chance(rng, 5) ? 0 : 1 + static_cast<std::size_t>(pick(rng, chance(rng, 20) ? 30 : 5));
    p.frames.emplace_back(stream.begin() + static_cast<std::ptrdiff_t>(i),
                          stream.begin() + static_cast<std::ptrdiff_t>(std::min(stream.size(), i + n)));
    i += n;
  }
  return p;
}

std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* s = std::getenv(name);
  return s && *s ? std::strtoull(s, nullptr, 10) : fallback;
}

struct CaseResult {
  bool ok = true;
  std::string failure;
  std::size_t values = 0, writer_values = 0, rows = 0, rejections = 0, timeouts = 0;
  std::map<Errc, std::size_t> outcomes; // completions by code
};

/// Runs one random case; on a difference, `failure` says where, with the
/// actions that led there.
CaseResult run_case(std::uint64_t seed) {
  CaseResult res;
  Rng rng(seed);
  const int world = 1 + pick(rng, 8);
  const int barriers = pick(rng, 4);
  const std::int64_t start = 1'000'000 + pick(rng, 1000);

  test::RecordingSink sink;
  core::Merger merger(sink);
  sink.merger = &merger;
  Reference ref;
  std::vector<std::vector<char>> applied;
  std::vector<std::string> trace;

  auto fail = [&](const std::string& what) {
    if (!res.ok) return;
    res.ok = false;
    std::ostringstream o;
    o << what << "\nworld " << world << ", " << barriers << " barriers; actions:\n";
    for (const auto& t : trace) o << "  " << t << "\n";
    const auto& a = sink.log;
    const auto& b = ref.log;
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    const std::size_t from = i > 8 ? i - 8 : 0;
    o << "merger log from line " << from << ":\n";
    for (std::size_t j = from; j < std::min(a.size(), i + 4); ++j) o << (j == i ? " >" : "  ") << a[j] << "\n";
    o << "reference log from line " << from << ":\n";
    for (std::size_t j = from; j < std::min(b.size(), i + 4); ++j) o << (j == i ? " >" : "  ") << b[j] << "\n";
    res.failure = o.str();
  };
  auto apply = [&](const std::vector<char>& f, const std::string& what) {
    trace.push_back(what);
    applied.push_back(f);
    if (!merger.apply(f)) fail("the Merger refused a well-formed frame: " + what);
  };
  auto compare = [&]() {
    if (sink.log != ref.log) return fail("the sink calls differ");
    if (!sink.violations.empty()) return fail("sink: " + sink.violations.front());
    if (merger.open_barrier() != ref.open_barrier()) return fail("open_barrier differs");
    if (merger.missing_at_barrier() != ref.missing()) return fail("missing_at_barrier differs");
    if (merger.open_barrier_timeout_ms() != ref.open_timeout()) return fail("open_barrier_timeout_ms differs");
    if (merger.last_committed_step() != ref.committed) return fail("last_committed_step differs");
    if (merger.rows_committed() != ref.rows) return fail("rows_committed differs");
    if (merger.values_rejected() != ref.rejected_values) return fail("values_rejected differs");
    if (merger.all_done() != ref.all_done()) return fail("all_done differs");
    for (int r = 0; r < world; ++r) {
      if (merger.rank_state(r) != ref.state(r) || merger.rank_joined(r) != ref.is_joined(r) ||
          merger.rank_last_step(r) != ref.last_step(r))
        return fail("the state of rank " + std::to_string(r) + " differs");
    }
  };

  std::vector<RankPlan> plans;
  for (int r = 0; r < world; ++r) plans.push_back(plan_rank(rng, r, barriers, start));
  std::size_t total_frames = 0, delivered = 0;
  for (const auto& p : plans) total_frames += p.frames.size();

  apply(w::run_start(start, static_cast<std::uint32_t>(world), "{}"), "run_start");
  ref.run_start(start, world);
  compare();

  bool finish_timed_out = false;
  enum class Act { join, frame, dead, timeout, stale_timeout, finish_timeout };
  while (res.ok) {
    std::vector<std::pair<Act, int>> acts;
    for (int r = 0; r < world; ++r) {
      RankPlan& p = plans[r];
      if (p.joins && !p.joined) acts.insert(acts.end(), 2, {Act::join, r});
      if (p.joined && p.next < p.frames.size()) acts.insert(acts.end(), 6, {Act::frame, r});
      if (p.dies && !p.declared_dead && (p.joined || !p.joins)) acts.emplace_back(Act::dead, r);
    }
    if (acts.empty()) break;
    if (ref.open_barrier() >= 0 && chance(rng, 15)) acts.emplace_back(Act::timeout, 0);
    if (chance(rng, 2)) acts.emplace_back(Act::stale_timeout, 0);
    if (!finish_timed_out && delivered * 2 > total_frames && chance(rng, 1)) acts.emplace_back(Act::finish_timeout, 0);

    const auto [act, r] = acts[static_cast<std::size_t>(pick(rng, static_cast<int>(acts.size())))];
    RankPlan& p = plans[r];
    switch (act) {
      case Act::join:
        p.joined = true;
        apply(w::rank_joined(static_cast<std::uint32_t>(r), start, 1000 + r, "node-" + std::to_string(r % 3)),
              "join " + std::to_string(r));
        ref.joined(r, "node-" + std::to_string(r % 3));
        break;
      case Act::frame: {
        const auto& events = p.frames[p.next++];
        ++delivered;
        std::string what = "frame " + std::to_string(r) + ":";
        static const char* const tag_names[] = {"?",      "key",    "values",  "define",        "barrier", "config",
                                                "summary", "finish", "finish_failed", "open", "values",  "close"};
        for (const Ev& e : events) {
          what += std::string(" ") + tag_names[static_cast<int>(e.tag)];
          if (e.stream != 0) what += "#" + std::to_string(e.stream); // a writer's
          if (e.tag == w::Tag::stream_values) res.writer_values += e.values.size();
          if (e.tag == w::Tag::values || e.tag == w::Tag::stream_values) {
            what += "@" + (e.step == w::auto_step ? std::string("auto") : std::to_string(e.step)) + "x" +
                    std::to_string(e.values.size());
            res.values += e.values.size();
          }
        }
        apply(encode(static_cast<std::uint32_t>(r), events), what);
        ref.frame(r, events);
        break;
      }
      case Act::dead:
        p.declared_dead = true;
        apply(w::rank_dead(static_cast<std::uint32_t>(r), start, "lost"), "dead " + std::to_string(r));
        ref.dead(r);
        break;
      case Act::timeout: {
        const auto index = static_cast<std::uint32_t>(ref.open_barrier());
        apply(w::barrier_timeout(index, start), "barrier_timeout " + std::to_string(index));
        ref.barrier_timeout(index);
        ++res.timeouts;
        break;
      }
      case Act::stale_timeout: {
        const auto index = static_cast<std::uint32_t>(pick(rng, barriers + 1));
        apply(w::barrier_timeout(index, start), "barrier_timeout " + std::to_string(index) + " (maybe stale)");
        ref.barrier_timeout(index);
        break;
      }
      case Act::finish_timeout:
        finish_timed_out = true;
        apply(w::finish_timeout(start), "finish_timeout");
        ref.finish_timeout();
        break;
    }
    compare();
  }
  // The end: the host's timers fire for what is still open, then the run ends.
  while (res.ok && ref.open_barrier() >= 0 && chance(rng, 50)) {
    const auto index = static_cast<std::uint32_t>(ref.open_barrier());
    apply(w::barrier_timeout(index, start), "barrier_timeout " + std::to_string(index));
    ref.barrier_timeout(index);
    ++res.timeouts;
    compare();
  }
  if (res.ok && !ref.all_done() && chance(rng, 40)) {
    apply(w::finish_timeout(start), "finish_timeout");
    ref.finish_timeout();
    compare();
  }
  if (res.ok) {
    const auto state = static_cast<RunState>(pick(rng, 5));
    apply(w::run_end(state, start + 5000), "run_end");
    ref.run_end(state, start + 5000);
    compare();
  }
  if (!res.ok) return res;

  // Every accepted (rank, step, key) lands in exactly one row value.
  std::uint64_t landed = 0;
  for (const auto& row : sink.rows)
    for (const auto& v : row.values) landed += v.count > 0 ? v.count : 1;
  if (landed != ref.accepted.size())
    fail("rows hold " + std::to_string(landed) + " values, " + std::to_string(ref.accepted.size()) + " were accepted");
  if (!sink.ended || merger.open_barrier() != -1) fail("the run did not end cleanly");

  // A replay of the same frames tells a new sink the same story.
  test::RecordingSink again;
  core::Merger replay(again);
  again.merger = &replay;
  for (const auto& f : applied) replay.apply(f);
  if (again.log != sink.log) fail("a replay of the same frames differs");

  res.rows = sink.rows.size();
  res.rejections = sink.rejections.size();
  for (const auto& c : sink.completions) ++res.outcomes[c.code];
  return res;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// Under a sanitizer every allocation walks the stack (AddressSanitizer's slow
// unwinder, which tests/lsan.supp needs): about 100 times the plain cost.
constexpr std::uint64_t default_cases = 500;
#else
constexpr std::uint64_t default_cases = 10000;
#endif

} // namespace

BOOST_AUTO_TEST_CASE(merger_matches_the_reference_model) {
  const std::uint64_t base = env_u64("CHORUS_SEED", std::random_device{}());
  const std::uint64_t cases = env_u64("CHORUS_MODEL_CASES", default_cases);
  const char* only = std::getenv("CHORUS_CASE");
  BOOST_TEST_MESSAGE("model test seed " << base << " (CHORUS_SEED=" << base << " replays; CHORUS_CASE=i runs case i)");
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t values = 0, writer_values = 0, rows = 0, rejections = 0, timeouts = 0, ran = 0;
  std::map<Errc, std::size_t> outcomes;
  for (std::uint64_t i = 0; i < cases; ++i) {
    if (only && *only && i != std::strtoull(only, nullptr, 10)) continue;
    BOOST_TEST_CONTEXT("CHORUS_SEED=" << base << " CHORUS_CASE=" << i) {
      const CaseResult r = run_case(base + i);
      ++ran;
      if (!r.ok) {
        BOOST_ERROR(r.failure);
        break; // one detailed failure is worth more than a thousand
      }
      values += r.values;
      writer_values += r.writer_values;
      rows += r.rows;
      rejections += r.rejections;
      timeouts += r.timeouts;
      for (auto [code, n] : r.outcomes) outcomes[code] += n;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE(ran << " cases in " << secs << " s: " << values << " values sent (" << writer_values
                         << " by writers), " << rows << " rows, " << rejections << " rejections, " << timeouts
                         << " barrier timeouts");
  std::ostringstream by_code;
  for (auto [code, n] : outcomes) by_code << " " << code << ":" << n;
  BOOST_TEST_MESSAGE("completions by code:" << by_code.str());
  BOOST_TEST(ran > 0u);
  BOOST_TEST(rows > 0u);
}
