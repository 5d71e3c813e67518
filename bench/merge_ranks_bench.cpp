// bench_merge_ranks: many ranks into one Run, simulated in one process
// (a target of BENCHMARKS.md). The Merger, the Run actor's core, is fed the frames
// R ranks would send (wire.hpp), round-robin, one frame per rank in turn; the
// same number of values in every case, so the per-value cost shows how the
// merge scales with the number of ranks. Target: from 1 to 1024 ranks the
// per-value cost grows no worse than log(ranks).
//
// Each rank logs 16 keys a step, a quarter of them reduced (mean) and the
// rest stored per rank (key/rank-N), 16 steps to a frame, and finishes in
// its last frame. Two sinks: one that only counts (the merge alone), and the
// run directory writer (the merge plus history.jsonl, as the run host does,
// without the WAL).
#include "bench.hpp"

#include "io/store/run_writer.hpp"
#include "runtime/core/history.hpp"
#include "runtime/core/merger.hpp"
#include "runtime/core/wire.hpp"

#include <cmath>
#include <memory>
#include <string>

namespace {

namespace w = chorus::core::wire;
using chorus::RunState;
using bench::num;

constexpr std::uint64_t total_values = 1u << 21; // per case, over all ranks
constexpr int keys = 16;
constexpr int reduced_every = 4; // key k is reduced when k % 4 == 0
constexpr int calls_per_frame = 16;
constexpr int repetitions = 3;

/// Counts what arrives and keeps nothing: the merge's own cost.
class CountingSink final : public chorus::core::HistorySink {
public:
  std::uint64_t rows = 0, values = 0;
  void run_start(std::string_view, std::int64_t, std::uint32_t) override {}
  void row(const chorus::core::Row& r) override {
    ++rows;
    values += r.values.size();
  }
  void config(int, std::string_view) override {}
  void summary(int, std::string_view) override {}
  void rejected(int, std::uint64_t, std::int64_t, std::span<const std::pair<std::string_view, double>>,
                const chorus::Error&) override {
    ++rejected_calls;
  }
  void rank_state(int, RunState, std::int64_t, std::string_view, std::string_view) override {}
  void completed(int, std::uint64_t, const chorus::Error*) override {}
  void run_end(RunState, std::int64_t) override {}
  std::uint64_t rejected_calls = 0;
};

/// Every frame of every rank, built before the clock starts.
struct Workload {
  int ranks = 0;
  int steps = 0;
  std::vector<std::vector<std::vector<char>>> frames; // [rank][i]
  std::vector<std::vector<char>> finishes;             // [rank]: its finish, after its last frame

  explicit Workload(int r) : ranks(r), steps(static_cast<int>(total_values / (static_cast<std::uint64_t>(r) * keys))) {
    frames.resize(static_cast<std::size_t>(ranks));
    for (int rank = 0; rank < ranks; ++rank) {
      std::uint64_t seq = 0;
      // Ranks number their keys differently, as real processes may: the merge joins them by name.
      const auto local = [&](int k) { return static_cast<std::uint32_t>((k + rank) % keys); };
      for (int s = 0; s < steps; s += calls_per_frame) {
        std::vector<char> out;
        w::BatchWriter b(out, static_cast<std::uint32_t>(rank));
        if (s == 0) {
          for (int k = 0; k < keys; ++k) b.key(local(k), "metric/" + std::to_string(k));
          for (int k = 0; k < keys; k += reduced_every) b.define(++seq, local(k), chorus::Reduce::mean);
        }
        for (int c = 0; c < calls_per_frame && s + c < steps; ++c) {
          b.values(++seq, w::auto_step, 1'000'000 + s + c, keys);
          for (int k = 0; k < keys; ++k) b.value(local(k), 0.5 * (s + c) + k + rank);
        }
        frames[static_cast<std::size_t>(rank)].push_back(std::move(out));
      }
      std::vector<char> out;
      w::BatchWriter(out, static_cast<std::uint32_t>(rank)).finish(++seq);
      finishes.push_back(std::move(out));
    }
  }

  [[nodiscard]] std::uint64_t values() const { return static_cast<std::uint64_t>(ranks) * keys * steps; }
  /// Values in the committed rows: reduced keys once, the others once per rank.
  [[nodiscard]] std::uint64_t row_values() const {
    const int reduced = (keys + reduced_every - 1) / reduced_every;
    const std::uint64_t per_row =
        ranks == 1 ? keys : static_cast<std::uint64_t>(reduced) + static_cast<std::uint64_t>(keys - reduced) * ranks;
    return per_row * static_cast<std::uint64_t>(steps);
  }
};

struct Timing {
  double ns_per_value = 0;     // wall clock
  double cpu_ns_per_value = 0; // this thread's CPU time (user and kernel): what waiting on the disk leaves out
  double lifecycle_ms = 0;     // every rank's join and finish, wall clock
  bool ok = false;
};

std::int64_t thread_cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// Applies the workload to a fresh Merger; the values are timed from the
/// first rank frame to the last, the ranks' joins and finishes apart
/// (run_end, with its fsyncs in the writer, is not timed).
Timing run_once(const Workload& wl, chorus::core::Merger& m) {
  bool ok = m.apply(w::run_start(1'000'000, static_cast<std::uint32_t>(wl.ranks), R"({"id":"bench"})"));
  const auto j0 = bench::clock::now();
  for (int r = 0; r < wl.ranks; ++r)
    ok = m.apply(w::rank_joined(static_cast<std::uint32_t>(r), 1'000'000, 100 + r, "host")) && ok;
  const auto j1 = bench::clock::now();
  const std::size_t n = wl.frames[0].size();
  const std::int64_t c0 = thread_cpu_ns();
  const auto t0 = bench::clock::now();
  for (std::size_t i = 0; i < n; ++i)
    for (int r = 0; r < wl.ranks; ++r) ok = m.apply(wl.frames[static_cast<std::size_t>(r)][i]) && ok;
  const auto t1 = bench::clock::now();
  const std::int64_t c1 = thread_cpu_ns();
  for (const auto& f : wl.finishes) ok = m.apply(f) && ok;
  const auto f1 = bench::clock::now();
  ok = ok && m.all_done();
  ok = m.apply(w::run_end(RunState::finished, 2'000'000)) && ok;
  ok = ok && m.rows_committed() == static_cast<std::uint64_t>(wl.steps) && m.values_rejected() == 0;
  const auto values = static_cast<double>(wl.values());
  const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  return {static_cast<double>((t1 - t0).count()) / values, static_cast<double>(c1 - c0) / values,
          ms(j1 - j0) + ms(f1 - t1), ok};
}

Timing counting(const Workload& wl) {
  CountingSink sink;
  chorus::core::Merger m(sink);
  Timing t = run_once(wl, m);
  t.ok = t.ok && sink.values == wl.row_values() && sink.rejected_calls == 0;
  return t;
}

Timing writing(const Workload& wl, const bench::fs::path& dir) {
  Timing t;
  {
    std::unique_ptr<chorus::core::Merger> m;
    chorus::store::RunWriter writer(dir.string(), [&m](std::uint32_t k) { return m->key_name(k); });
    m = std::make_unique<chorus::core::Merger>(writer);
    t = run_once(wl, *m);
    t.ok = t.ok && !writer.error() && writer.rows() == static_cast<std::uint64_t>(wl.steps);
  }
  std::error_code ec;
  bench::fs::remove_all(dir, ec); // run_end synced it: what the next run writes starts clean
  return t;
}

/// The median of `repetitions` runs; ok only if every run was.
template <class F>
Timing median_of(F&& once) {
  std::vector<double> ns, cpu, life;
  bool ok = true;
  for (int i = 0; i < repetitions; ++i) {
    const Timing t = once(i);
    ns.push_back(t.ns_per_value);
    cpu.push_back(t.cpu_ns_per_value);
    life.push_back(t.lifecycle_ms);
    ok = ok && t.ok;
  }
  return {bench::median(ns), bench::median(cpu), bench::median(life), ok};
}

} // namespace

int main() {
  bench::TempDir dir;
  std::printf("bench_merge_ranks: %llu values per case (16 keys a step, 4 reduced by mean, 12 per rank), "
              "frames of %d steps, round-robin over the ranks; median of %d runs\n\n",
              static_cast<unsigned long long>(total_values), calls_per_frame, repetitions);

  const int counts[] = {1, 4, 16, 64, 256, 1024};
  struct Line {
    int ranks;
    int steps;
    Timing merge, write;
  };
  std::vector<Line> lines;
  for (int r : counts) {
    const Workload wl(r);
    int run = 0;
    Line l{r, wl.steps, median_of([&](int) { return counting(wl); }), median_of([&](int) {
             // Appended, not `"r" + std::to_string(r)`: GCC 12 at -O3 warns (-Wrestrict) on that form.
             std::string name = std::to_string(r);
             name.append("-").append(std::to_string(run++));
             return writing(wl, dir.path / name);
           })};
    lines.push_back(l);
  }

  bench::Table t({"ranks", "steps", "row width", "merge ns/value", "ratio to 1 rank", "+history ns/value",
                  "ratio", "+history cpu ns/value", "ratio", "log2(R)", "verdict", "joins+finishes ms",
                  "+history", "checked"});
  bool all_ok = true;
  for (const Line& l : lines) {
    const double lg = std::log2(static_cast<double>(l.ranks));
    const double rm = l.merge.ns_per_value / lines[0].merge.ns_per_value;
    const double rw = l.write.ns_per_value / lines[0].write.ns_per_value;
    const double rc = l.write.cpu_ns_per_value / lines[0].write.cpu_ns_per_value;
    // "No worse than log(ranks)": the merge's cost at R ranks stays within the 1-rank cost times (1 + log2 R).
    const bool ok = rm <= 1 + lg;
    all_ok = all_ok && ok;
    const int reduced = (keys + reduced_every - 1) / reduced_every;
    const int width = l.ranks == 1 ? keys : reduced + (keys - reduced) * l.ranks;
    t.add({std::to_string(l.ranks), std::to_string(l.steps), std::to_string(width), num(l.merge.ns_per_value, 1),
           num(rm, 2), num(l.write.ns_per_value, 1), num(rw, 2), num(l.write.cpu_ns_per_value, 1), num(rc, 2),
           num(lg, 0), bench::verdict(ok), num(l.merge.lifecycle_ms, 2), num(l.write.lifecycle_ms, 1),
           l.merge.ok && l.write.ok ? "rows ok" : "WRONG"});
  }
  t.print();
  std::printf("\nmerge: the Merger alone; +history: the Merger writing history.jsonl through the run directory\n"
              "writer (wall clock, and this thread's CPU time, which leaves out waiting on the disk).\n"
              "joins+finishes: every rank's join and finish event, applied apart from the values (wall clock).\n"
              "target: the merge's per-value cost from 1 to 1024 ranks grows no worse than log(ranks), read as\n"
              "cost(R) <= cost(1) * (1 + log2 R): %s\n",
              all_ok ? "met" : "MISSED");
  return 0;
}
