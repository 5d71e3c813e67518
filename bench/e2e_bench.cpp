// bench_e2e: end-to-end values per second (a target of BENCHMARKS.md). Four ranks
// on this host, started as torchrun would start them (this binary again,
// with RANK, LOCAL_RANK, WORLD_SIZE, ... and CHORUS_*), log flat out into one
// shared run; the run host commits every value to the run directory. The
// clock runs from the first log of any rank (all ranks start together,
// after a barrier) to the return of the run host's finish, which returns
// once every rank has finished and everything is on disk. Afterwards
// history.jsonl is read back to check that nothing was lost.
//
//   bench_e2e                 the benchmark (starts the ranks itself)
//   bench_e2e --rank STEPS    one rank (what the benchmark starts)
#include "bench.hpp"

#include <chorus/chorus.hpp>

#include <simdjson.h>

#include <array>
#include <string>

namespace {

using bench::num;

constexpr int world = 4;
constexpr int default_steps = 150'000;
constexpr int repetitions = 3;
constexpr int keys = 10;
// Keys 0-4 are averaged, 5 summed, 6 the minimum, 7 the maximum; 8 and 9
// are not reduced, so each rank's value is kept as key/rank-N.
constexpr std::array<std::string_view, keys> names = {"loss", "acc",    "lr",  "grad_norm", "ppl",
                                                      "tokens", "lo", "hi", "own_a",     "own_b"};
constexpr std::array<chorus::Reduce, keys> reductions = {
    chorus::Reduce::mean, chorus::Reduce::mean, chorus::Reduce::mean, chorus::Reduce::mean, chorus::Reduce::mean,
    chorus::Reduce::sum,  chorus::Reduce::min,  chorus::Reduce::max,  chorus::Reduce::none, chorus::Reduce::none};

/// What rank r logs for key k at step s: exact in a double, so every reduction can be checked exactly.
double value_of(int r, std::int64_t s, int k) { return static_cast<double>(s) + k * 1000.0 + r; }

double expected(chorus::Reduce how, std::int64_t s, int k) {
  const double base = value_of(0, s, k);
  switch (how) {
    case chorus::Reduce::mean: return base + (world - 1) / 2.0;
    case chorus::Reduce::sum: return base * world + world * (world - 1) / 2.0;
    case chorus::Reduce::min:
    case chorus::Reduce::first: return base;
    case chorus::Reduce::max: return base + world - 1;
    case chorus::Reduce::none:
    case chorus::Reduce::merge: break; // histograms only
  }
  return base;
}

int rank_main(int steps) {
  chorus::Options opt;
  opt.system_interval = 0;
  chorus::Error err;
  chorus::Run run = chorus::init(opt, err);
  if (err) {
    std::fprintf(stderr, "init failed: %s\n", err.message().c_str());
    return 3;
  }
  const int rank = run.topology().rank;
  for (int k = 0; k < keys; ++k)
    if (reductions[k] != chorus::Reduce::none) run.define_metric(names[k], reductions[k]);
  if (chorus::Error e = run.barrier("start").wait()) {
    std::fprintf(stderr, "barrier: %s\n", e.message().c_str());
    return 4;
  }
  std::array<chorus::Metric, keys> values;
  for (int k = 0; k < keys; ++k) values[k].key = names[k];
  const std::int64_t t_first = bench::now_ns();
  for (std::int64_t s = 0; s < steps; ++s) {
    for (int k = 0; k < keys; ++k) values[k].value = value_of(rank, s, k);
    run.log(values, {.step = s});
  }
  const std::int64_t t_last = bench::now_ns();
  chorus::FinishResult r = run.finish().wait();
  const std::int64_t t_end = bench::now_ns();
  if (r.error) std::fprintf(stderr, "rank %d finish: %s\n", rank, r.error.message().c_str());
  bench::report("first_log", static_cast<double>(t_first));
  bench::report("last_log", static_cast<double>(t_last));
  bench::report("finished", static_cast<double>(t_end));
  bench::report("dropped", static_cast<double>(r.dropped));
  bench::report("rejected", static_cast<double>(r.rejected));
  bench::report("rows", static_cast<double>(r.rows));
  bench::report("host", run.is_host() ? 1 : 0);
  return r.error ? 5 : 0;
}

struct Check {
  std::uint64_t rows = 0;
  std::uint64_t values = 0; // values the rows account for: a reduced value counts its _count
  std::uint64_t bad = 0;    // rows with a wrong value, count, key set or step
  std::string first_problem;
};

Check check_history(const bench::fs::path& run_dir, int steps) {
  Check c;
  simdjson::padded_string text;
  if (simdjson::padded_string::load((run_dir / "history.jsonl").string()).get(text)) {
    c.first_problem = "cannot read history.jsonl";
    c.bad = 1;
    return c;
  }
  std::array<std::array<std::string, world>, keys> per_rank;
  for (int k = 0; k < keys; ++k)
    for (int r = 0; r < world; ++r) per_rank[k][r] = std::string(names[k]) + "/rank-" + std::to_string(r);

  simdjson::dom::parser parser;
  simdjson::dom::document_stream stream;
  if (parser.parse_many(text).get(stream)) {
    c.bad = 1;
    c.first_problem = "history.jsonl is not JSON lines";
    return c;
  }
  const auto problem = [&c](std::int64_t step, const std::string& what) {
    if (c.bad++ == 0) c.first_problem = "step " + std::to_string(step) + ": " + what;
  };
  for (auto doc : stream) {
    simdjson::dom::object row;
    if (doc.get(row)) {
      problem(-1, "a line is not an object");
      continue;
    }
    const auto s = static_cast<std::int64_t>(c.rows);
    ++c.rows;
    std::int64_t step = -1;
    if (row["_step"].get(step) || step != s) {
      problem(s, "_step is " + std::to_string(step));
      continue;
    }
    simdjson::dom::object counts;
    const bool has_counts = !row["_count"].get(counts);
    std::size_t fields = 0;
    for (auto field : row) {
      (void)field;
      ++fields;
    }
    // _step, _timestamp, _runtime, _count, 8 reduced keys, 2 keys x 4 ranks.
    if (fields != 4 + 8 + 2 * world) problem(s, std::to_string(fields) + " fields");
    for (int k = 0; k < keys; ++k) {
      if (reductions[k] == chorus::Reduce::none) {
        for (int r = 0; r < world; ++r) {
          double v = 0;
          if (row[per_rank[k][r]].get(v) || v != value_of(r, s, k)) problem(s, per_rank[k][r] + " wrong");
          else ++c.values;
        }
      } else {
        double v = 0;
        std::int64_t n = 0;
        if (row[names[k]].get(v) || v != expected(reductions[k], s, k)) problem(s, std::string(names[k]) + " wrong");
        if (!has_counts || counts[names[k]].get(n) || n != world)
          problem(s, "_count of " + std::string(names[k]) + " is not 4");
        else c.values += static_cast<std::uint64_t>(n);
      }
    }
  }
  if (c.rows != static_cast<std::uint64_t>(steps)) problem(-1, std::to_string(c.rows) + " rows");
  return c;
}

struct Result {
  double seconds = 0;      // first log of any rank to the run host's finish
  double enqueue_s = 0;    // the slowest rank's log loop
  double host_finish_ms = 0;
  double values_per_s = 0;
  Check check;
  bool ok = false;
};

Result run_job(int steps) {
  bench::TempDir dir;
  const std::string run_id = "bench-e2e-" + std::to_string(::getpid()) + "-" + std::to_string(bench::now_ns() % 100000);
  bench::Job job(world, {"--rank", std::to_string(steps)},
                 {{"CHORUS_DIR", (dir.path / "runs").string()},
                  {"CHORUS_MODE", "shared"},
                  {"CHORUS_RUN_ID", run_id},
                  {"CHORUS_PROJECT", "bench"},
                  {"CHORUS_SYSTEM_INTERVAL", "0"},
                  // Bounded, so that a failed start or finish costs seconds, not minutes.
                  {"CHORUS_INIT_TIMEOUT", "10"},
                  {"CHORUS_FINISH_TIMEOUT", "30"}},
                 dir.path);
  Result res;
  res.ok = job.wait();
  double first = 1e300, host_end = 0, host_last = 0, slowest = 0;
  double dropped = 0, rejected = 0;
  for (int r = 0; r < world; ++r) {
    auto f = job.figures(r);
    if (!f.count("finished")) {
      res.ok = false;
      continue;
    }
    first = std::min(first, f["first_log"]);
    slowest = std::max(slowest, f["last_log"] - f["first_log"]);
    dropped += f["dropped"];
    rejected += f["rejected"];
    if (f["host"] == 1) {
      host_end = f["finished"];
      host_last = f["last_log"];
    }
  }
  res.seconds = (host_end - first) / 1e9;
  res.enqueue_s = slowest / 1e9;
  res.host_finish_ms = (host_end - host_last) / 1e6;
  const bench::fs::path run_dir = bench::find_run_dir(dir.path / "runs");
  res.check = check_history(run_dir, steps);
  const double logged = static_cast<double>(world) * steps * keys;
  res.values_per_s = logged / res.seconds;
  res.ok = res.ok && dropped == 0 && rejected == 0 && res.check.bad == 0 &&
           static_cast<double>(res.check.values) == logged;
  return res;
}

} // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--rank") return rank_main(std::atoi(argv[2]));
  const int steps = default_steps;
  std::printf("bench_e2e: %d ranks on this host, one shared run, each logging %d steps x %d values "
              "(8 keys reduced, 2 kept per rank) flat out; %d runs\n\n",
              world, steps, keys, repetitions);
  bench::Table t({"run", "values", "seconds", "M values/s", "slowest rank's log loop s",
                  "host finish after last log ms", "rows", "values in history", "lost or wrong"});
  std::vector<double> rates;
  bool all_ok = true;
  for (int i = 0; i < repetitions; ++i) {
    const Result r = run_job(steps);
    const double logged = static_cast<double>(world) * steps * keys;
    const std::string problem = r.check.first_problem.empty() ? std::string("a rank failed") : r.check.first_problem;
    t.add({std::to_string(i + 1), num(logged, 0), num(r.seconds, 3), num(r.values_per_s / 1e6, 2),
           num(r.enqueue_s, 3), num(r.host_finish_ms, 1), std::to_string(r.check.rows),
           std::to_string(r.check.values), r.ok ? "none" : "YES: " + problem});
    rates.push_back(r.values_per_s);
    all_ok = all_ok && r.ok;
  }
  t.print();
  const double m = bench::median(rates);
  std::printf("\ntarget: >= 2 M values/s, nothing lost: median %.2f M values/s, %s -> %s\n", m / 1e6,
              all_ok ? "nothing lost" : "VALUES LOST OR WRONG", bench::verdict(m >= 2e6 && all_ok).c_str());
  return all_ok ? 0 : 1;
}
