// bench_e2e: end-to-end values per second (a target of BENCHMARKS.md). Four ranks
// on this host, started as torchrun would start them (this binary again,
// with RANK, LOCAL_RANK, WORLD_SIZE, ... and CHORUS_*), log flat out into one
// shared run; the run host commits every value to the run directory. The
// clock runs from the first log of any rank (all ranks start together,
// after a barrier) to the return of the run host's finish, which returns
// once every rank has finished and everything is on disk. Over that time
// the machine's idle share is taken from /proc/stat (a pipeline that waits
// leaves cores idle; one bound by its CPU does not). Afterwards
// history.jsonl is read back to check that nothing was lost.
//
// With --histograms, the same job runs in turns with and without histograms:
// each rank also runs a thread that logs 100 histograms a second (10,000
// floats each, key "grad" declared Reduce::merge on every rank) through a
// writer of its own for as long as its scalar loop runs, and
// histograms.jsonl is read back too: a merged line per histogram step.
//
//   bench_e2e                          the benchmark (starts the ranks itself)
//   bench_e2e --histograms [STRIDE]    scalars with and without histograms
//   bench_e2e --rank STEPS [STRIDE]    one rank (what the benchmark starts);
//                                      STRIDE > 0: with histograms, the k-th at step k x STRIDE
#include "bench.hpp"

#include "io/platform/posix.hpp"
#include "io/platform/procfs.hpp"

#include <chorus/chorus.hpp>

#include <simdjson.h>

#include <sys/resource.h>
#include <time.h>

#include <array>
#include <atomic>
#include <chrono>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

using bench::num;

constexpr int world = 4;
constexpr int default_steps = 150'000;
constexpr int repetitions = 3;
constexpr int histogram_repetitions = 5; // a case, with --histograms
constexpr int histograms_per_s = 100;
constexpr std::size_t histogram_values = 10'000;
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

/// The histograms one rank logged, and what its calls cost its thread.
struct HistogramLog {
  std::int64_t logged = 0;
  double call_ns = 0;     // mean, wall clock
  double call_cpu_ns = 0; // mean, the thread's CPU time
};

/// This thread's CPU time, ns.
double thread_cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

/// Logs histograms of 10,000 floats through `w`, 100 a second (the k-th at
/// step k x `stride`), until `stop`; then closes `w`, so that it holds no row back.
HistogramLog log_histograms(chorus::Writer& w, int rank, std::int64_t stride, const std::atomic<bool>& stop) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(rank) + 1);
  std::normal_distribution<float> normal(0.0F, 0.02F);
  std::vector<float> values(histogram_values);
  for (float& v : values) v = normal(rng);
  HistogramLog out;
  double spent_ns = 0, cpu_ns = 0;
  const auto t0 = bench::clock::now();
  for (std::int64_t k = 0;; ++k) {
    std::this_thread::sleep_until(t0 + k * std::chrono::microseconds(1'000'000 / histograms_per_s));
    if (stop.load(std::memory_order_acquire)) break;
    const double c = thread_cpu_ns();
    const std::int64_t t = bench::now_ns();
    (void)w.log_histogram("grad", std::span<const float>(values), {.step = k * stride});
    spent_ns += static_cast<double>(bench::now_ns() - t);
    cpu_ns += thread_cpu_ns() - c;
    ++out.logged;
  }
  (void)w.close();
  out.call_ns = out.logged ? spent_ns / static_cast<double>(out.logged) : 0;
  out.call_cpu_ns = out.logged ? cpu_ns / static_cast<double>(out.logged) : 0;
  return out;
}

int rank_main(int steps, std::int64_t histogram_stride) {
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
  chorus::Writer histogram_writer; // made before anything is logged, as writers must be
  if (histogram_stride > 0) {
    run.define_metric("grad", chorus::Reduce::merge);
    histogram_writer = run.writer();
  }
  if (chorus::Error e = run.barrier("start").wait()) {
    std::fprintf(stderr, "barrier: %s\n", e.message().c_str());
    return 4;
  }
  std::array<chorus::Metric, keys> values;
  for (int k = 0; k < keys; ++k) values[k].key = names[k];
  std::atomic<bool> stop{false};
  HistogramLog histograms;
  std::thread histogram_thread;
  if (histogram_stride > 0)
    histogram_thread = std::thread(
        [&] { histograms = log_histograms(histogram_writer, rank, histogram_stride, stop); });
  const std::int64_t t_first = bench::now_ns();
  for (std::int64_t s = 0; s < steps; ++s) {
    for (int k = 0; k < keys; ++k) values[k].value = value_of(rank, s, k);
    run.log(values, {.step = s});
  }
  const std::int64_t t_last = bench::now_ns();
  stop.store(true, std::memory_order_release);
  if (histogram_thread.joinable()) histogram_thread.join();
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
  bench::report("histograms", static_cast<double>(histograms.logged));
  bench::report("histogram_call_ns", histograms.call_ns);
  bench::report("histogram_call_cpu_ns", histograms.call_cpu_ns);
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  bench::report("cpu_s", static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                             static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
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

/// histograms.jsonl of a run whose ranks logged `logged[r]` histograms each,
/// the k-th at step k x `stride`: a line per step in order, "grad" merged
/// from the ranks that logged it (all 4 but at the end, where a rank's
/// thread may have stopped one or two early), their counts added exactly.
struct HistogramCheck {
  std::uint64_t lines = 0;
  std::uint64_t from_all = 0; // lines merged from every rank (_count 4)
  std::uint64_t bad = 0;
  std::string first_problem;
};

HistogramCheck check_histograms(const bench::fs::path& run_dir, std::int64_t stride,
                                const std::array<std::int64_t, world>& logged) {
  HistogramCheck c;
  const auto problem = [&c](std::int64_t k, const std::string& what) {
    if (c.bad++ == 0) c.first_problem = "histogram " + std::to_string(k) + ": " + what;
  };
  simdjson::padded_string text;
  simdjson::dom::parser parser;
  simdjson::dom::document_stream stream;
  if (simdjson::padded_string::load((run_dir / "histograms.jsonl").string()).get(text) ||
      parser.parse_many(text).get(stream)) {
    problem(-1, "cannot read histograms.jsonl");
    return c;
  }
  for (auto doc : stream) {
    const auto k = static_cast<std::int64_t>(c.lines++);
    const auto ranks = static_cast<std::int64_t>(
        std::count_if(logged.begin(), logged.end(), [k](std::int64_t n) { return n > k; }));
    simdjson::dom::object line;
    std::int64_t step = -1, count = -1, values = -1;
    std::string_view key;
    if (doc.get(line) || line["_step"].get(step) || line["key"].get(key) || line["_count"].get(count) ||
        line["count"].get(values)) {
      problem(k, "a field is missing");
      continue;
    }
    if (step != k * stride) problem(k, "_step is " + std::to_string(step));
    else if (key != "grad" || !line["rank"].is_null()) problem(k, "not the merged \"grad\"");
    else if (count != ranks) problem(k, "_count is " + std::to_string(count) + ", not " + std::to_string(ranks));
    else if (values != ranks * static_cast<std::int64_t>(histogram_values))
      problem(k, "count is " + std::to_string(values));
    c.from_all += count == world ? 1 : 0;
  }
  const std::int64_t most = *std::max_element(logged.begin(), logged.end());
  if (c.lines != static_cast<std::uint64_t>(most)) problem(-1, std::to_string(c.lines) + " lines");
  return c;
}

/// The machine's CPU ticks (/proc/stat, as the SystemMonitor reads it), and when.
struct Ticks {
  std::int64_t at_ns = 0;
  chorus::platform::CpuTimes cpu;
};
Ticks cpu_ticks() {
  const chorus::Result<std::string> text = chorus::platform::read_text("/proc/stat");
  return {bench::now_ns(), text ? chorus::platform::parse_proc_stat(*text).value_or(chorus::platform::CpuTimes{})
                                : chorus::platform::CpuTimes{}};
}

/// /proc/stat every 10 ms on a thread of its own, while a job runs: the
/// machine's idle share over a stretch of it (the job's timed part).
class IdleSampler {
public:
  IdleSampler() : thread_([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      samples_.push_back(cpu_ticks());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    samples_.push_back(cpu_ticks());
  }) {}
  ~IdleSampler() { stop(); }
  void stop() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }
  /// The idle share between the last sample at or before `from_ns` and the first at or after `to_ns`.
  [[nodiscard]] double idle(double from_ns, double to_ns) const {
    const Ticks* a = nullptr;
    const Ticks* b = nullptr;
    for (const Ticks& t : samples_) {
      if (t.at_ns <= from_ns) a = &t;
      if (!b && t.at_ns >= to_ns) b = &t;
    }
    if (!a || !b || b->cpu.total <= a->cpu.total) return 0;
    const double busy = static_cast<double>(b->cpu.busy - a->cpu.busy);
    return 1 - busy / static_cast<double>(b->cpu.total - a->cpu.total);
  }

private:
  std::atomic<bool> stop_{false};
  std::vector<Ticks> samples_;
  std::thread thread_;
};

struct Result {
  double idle = 0;         // the machine's idle share over `seconds` (/proc/stat every 10 ms)
  double seconds = 0;      // first log of any rank to the run host's finish
  double enqueue_s = 0;    // the slowest rank's log loop
  double host_finish_ms = 0;
  double values_per_s = 0;
  Check check;
  bool ok = false;
  // With histograms:
  std::array<std::int64_t, world> histograms{}; // logged by each rank
  double histograms_per_s = 0;                  // the slowest rank's, over its log loop
  double histogram_call_ns = 0;                 // mean over the ranks
  double histogram_call_cpu_ns = 0;             // the same, the calling thread's CPU time
  double cpu_s = 0;                             // CPU time of all the ranks' processes, the run host's included
  double host_cpu_s = 0;                        // of which the run host's process
  HistogramCheck histogram_check;
};

Result run_job(int steps, std::int64_t histogram_stride) {
  bench::TempDir dir;
  const std::string run_id = "bench-e2e-" + std::to_string(::getpid()) + "-" + std::to_string(bench::now_ns() % 100000);
  IdleSampler sampler;
  bench::Job job(world, {"--rank", std::to_string(steps), std::to_string(histogram_stride)},
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
  sampler.stop();
  double first = 1e300, host_end = 0, host_last = 0, slowest = 0;
  double dropped = 0, rejected = 0;
  res.histograms_per_s = 1e300;
  for (int r = 0; r < world; ++r) {
    auto f = job.figures(r);
    if (!f.count("finished")) {
      res.ok = false;
      continue;
    }
    first = std::min(first, f["first_log"]);
    slowest = std::max(slowest, f["last_log"] - f["first_log"]);
    res.histograms[r] = static_cast<std::int64_t>(f["histograms"]);
    res.histograms_per_s = std::min(res.histograms_per_s, f["histograms"] / (f["last_log"] - f["first_log"]) * 1e9);
    res.histogram_call_ns += f["histogram_call_ns"] / world;
    res.histogram_call_cpu_ns += f["histogram_call_cpu_ns"] / world;
    res.cpu_s += f["cpu_s"];
    dropped += f["dropped"];
    rejected += f["rejected"];
    if (f["host"] == 1) {
      res.host_cpu_s = f["cpu_s"];
      host_end = f["finished"];
      host_last = f["last_log"];
    }
  }
  res.seconds = (host_end - first) / 1e9;
  res.idle = sampler.idle(first, host_end);
  res.enqueue_s = slowest / 1e9;
  res.host_finish_ms = (host_end - host_last) / 1e6;
  const bench::fs::path run_dir = bench::find_run_dir(dir.path / "runs");
  res.check = check_history(run_dir, steps);
  const double logged = static_cast<double>(world) * steps * keys;
  res.values_per_s = logged / res.seconds;
  res.ok = res.ok && dropped == 0 && rejected == 0 && res.check.bad == 0 &&
           static_cast<double>(res.check.values) == logged;
  if (histogram_stride > 0) {
    res.histogram_check = check_histograms(run_dir, histogram_stride, res.histograms);
    res.ok = res.ok && res.histogram_check.bad == 0;
  }
  return res;
}

/// --histograms: the job in turns without and with histograms. The k-th
/// histogram is logged at step k x stride, the scalar loop's step at that
/// time as the run before (without) went: so the histogram writer keeps
/// near the scalars' steps and holds no row back for long (a writer's
/// steps are its own; a rank's rows commit at the minimum over its streams).
int histograms_main(std::int64_t forced_stride) {
  const int steps = default_steps;
  std::printf("bench_e2e --histograms: %d ranks on this host, one shared run, each logging %d steps x %d values flat "
              "out; with histograms, each rank also logs %d histograms/s of %zu floats (\"grad\", Reduce::merge) "
              "from a thread of its own, through its own writer; %d runs a case, in turns\n\n",
              world, steps, keys, histograms_per_s, histogram_values, histogram_repetitions);
  bench::Table t({"case", "run", "seconds", "M values/s", "slowest rank's log loop s", "host finish ms",
                  "CPU s, all ranks", "of it the host's", "lost or wrong", "histograms a rank", "histograms/s a rank",
                  "log_histogram us", "of it CPU us", "stride", "histogram lines", "of them from 4 ranks"});
  std::vector<double> without, with, paired, cpu_without, cpu_with;
  bool all_ok = true;
  const auto add = [&](const char* name, int i, const Result& r, std::int64_t stride) {
    const std::string problem = !r.check.first_problem.empty()            ? r.check.first_problem
                                : !r.histogram_check.first_problem.empty() ? r.histogram_check.first_problem
                                                                           : std::string("a rank failed");
    std::vector<std::string> row = {name,
                                    std::to_string(i + 1),
                                    num(r.seconds, 3),
                                    num(r.values_per_s / 1e6, 2),
                                    num(r.enqueue_s, 3),
                                    num(r.host_finish_ms, 1),
                                    num(r.cpu_s, 2),
                                    num(r.host_cpu_s, 2),
                                    r.ok ? "none" : "YES: " + problem};
    if (stride > 0) {
      const auto [lo, hi] = std::minmax_element(r.histograms.begin(), r.histograms.end());
      row.insert(row.end(), {std::to_string(*lo) + "-" + std::to_string(*hi), num(r.histograms_per_s, 1),
                             num(r.histogram_call_ns / 1e3, 1), num(r.histogram_call_cpu_ns / 1e3, 1),
                             std::to_string(stride), std::to_string(r.histogram_check.lines),
                             std::to_string(r.histogram_check.from_all)});
    } else {
      row.insert(row.end(), 7, "-");
    }
    t.add(std::move(row));
    all_ok = all_ok && r.ok;
  };
  for (int i = 0; i < histogram_repetitions; ++i) {
    const Result plain = run_job(steps, 0);
    add("scalars", i, plain, 0);
    without.push_back(plain.values_per_s);
    cpu_without.push_back(plain.cpu_s);
    const double per_10ms = steps / (plain.enqueue_s * histograms_per_s);
    const std::int64_t stride =
        forced_stride > 0 ? forced_stride : std::max<std::int64_t>(1, static_cast<std::int64_t>(per_10ms + 0.5));
    const Result hist = run_job(steps, stride);
    add("scalars + histograms", i, hist, stride);
    with.push_back(hist.values_per_s);
    cpu_with.push_back(hist.cpu_s);
    paired.push_back(hist.values_per_s / plain.values_per_s);
  }
  t.print();
  const auto range = [](const std::vector<double>& v, double scale, int decimals) {
    return num(*std::min_element(v.begin(), v.end()) * scale, decimals) + "-" +
           num(*std::max_element(v.begin(), v.end()) * scale, decimals);
  };
  const double m0 = bench::median(without), m1 = bench::median(with), pair = bench::median(paired);
  std::printf("\nscalars alone: median %.2f M values/s (%s); with histograms: median %.2f M values/s (%s); "
              "with / without: %.3f median to median, %.3f the median of the runs side by side (%s)\n",
              m0 / 1e6, range(without, 1e-6, 2).c_str(), m1 / 1e6, range(with, 1e-6, 2).c_str(), m1 / m0, pair,
              range(paired, 1, 3).c_str());
  std::printf("CPU time of all the ranks' processes: median %.2f s alone, %.2f s with histograms\n",
              bench::median(cpu_without), bench::median(cpu_with));
  std::printf("target: %d ranks x %d histograms/s merged with no effect on scalar throughput (runs side by side "
              "within 5 %%): %s; every histogram merged and nothing lost: %s\n",
              world, histograms_per_s, bench::verdict(pair >= 0.95).c_str(), all_ok ? "yes" : "NO");
  return all_ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--rank")
    return rank_main(std::atoi(argv[2]), argc >= 4 ? std::atoll(argv[3]) : 0);
  if (argc >= 2 && std::string(argv[1]) == "--histograms") return histograms_main(argc >= 3 ? std::atoll(argv[2]) : 0);
  const int steps = default_steps;
  std::printf("bench_e2e: %d ranks on this host, one shared run, each logging %d steps x %d values "
              "(8 keys reduced, 2 kept per rank) flat out; %d runs\n\n",
              world, steps, keys, repetitions);
  bench::Table t({"run", "values", "seconds", "M values/s", "slowest rank's log loop s",
                  "host finish after last log ms", "machine idle %", "rows", "values in history", "lost or wrong"});
  std::vector<double> rates;
  bool all_ok = true;
  for (int i = 0; i < repetitions; ++i) {
    const Result r = run_job(steps, 0);
    const double logged = static_cast<double>(world) * steps * keys;
    const std::string problem = r.check.first_problem.empty() ? std::string("a rank failed") : r.check.first_problem;
    t.add({std::to_string(i + 1), num(logged, 0), num(r.seconds, 3), num(r.values_per_s / 1e6, 2),
           num(r.enqueue_s, 3), num(r.host_finish_ms, 1), num(100 * r.idle, 0), std::to_string(r.check.rows),
           std::to_string(r.check.values), r.ok ? "none" : "YES: " + problem});
    rates.push_back(r.values_per_s);
    all_ok = all_ok && r.ok;
  }
  t.print();
  const double m = bench::median(rates);
  std::printf("\ntarget: >= 10 M values/s median, nothing lost: median %.2f M values/s, %s -> %s\n", m / 1e6,
              all_ok ? "nothing lost" : "VALUES LOST OR WRONG", bench::verdict(m >= 10e6 && all_ok).c_str());
  return all_ok ? 0 : 1;
}
