// bench_lifecycle: how long a run takes to start and to finish (targets of
// BENCHMARKS.md), each figure the median of several fresh processes:
// - init -> first log, a single process (target <= 2 ms): from the call of
//   chorus::init to the return of the first run.log;
// - an 8-rank shared run connected (target <= 100 ms): 8 processes started
//   as torchrun would; from the first rank's call of init to the return of
//   the last rank's init (and, apart, from the launch of the first process);
// - finish after the last log, local store (target <= one fdatasync + 1 ms): a single
//   process logs 1000 steps x 10 values and calls finish().wait() at once;
//   the clock runs from the return of the last log to the return of finish,
//   so it covers committing the tail, the summary, run.json and the fsyncs;
// - the page faults that single process takes in init and in that finish
//   (every thread's): where a fault costs several µs (a VM), they are much
//   of both.
//
//   bench_lifecycle                 the benchmark
//   bench_lifecycle --single DIR    one single-process run (what it starts)
//   bench_lifecycle --rank          one rank of the 8-rank run (what it starts)
#include "bench.hpp"

#include <chorus/chorus.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <array>
#include <string>

namespace {

using bench::num;

constexpr int single_reps = 7;
constexpr int job_reps = 5;
constexpr int job_world = 8;
constexpr int tail_steps = 1000;

constexpr std::array<std::string_view, 10> names = {"loss", "acc", "lr",  "grad_norm", "ppl",
                                                    "tokens", "lo", "hi", "own_a",     "own_b"};

void log_steps(chorus::Run& run, int rank, int steps) {
  std::array<chorus::Metric, names.size()> values;
  for (std::size_t k = 0; k < names.size(); ++k) values[k].key = names[k];
  for (int s = 0; s < steps; ++s) {
    for (std::size_t k = 0; k < names.size(); ++k) values[k].value = s + 1000.0 * static_cast<double>(k) + rank;
    run.log(values);
  }
}

/// Page faults the process has taken so far (every thread's): a VM where
/// one costs several µs spends much of init and finish on them.
double faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt + u.ru_majflt);
}

int single_main(const char* dir) {
  chorus::Options opt;
  opt.read_env = false;
  opt.topology = chorus::Topology{};
  opt.dir = dir;
  opt.project = "bench";
  opt.mode = chorus::Mode::shared;
  opt.system_interval = 0;

  const double f0 = faults();
  const std::int64_t t0 = bench::now_ns();
  chorus::Run run = chorus::init(opt);
  const std::int64_t t_init = bench::now_ns();
  const double f_init = faults();
  chorus::Pending first = run.log({{"loss", 1.0}});
  const std::int64_t t_log = bench::now_ns();
  if (chorus::Error e = first.wait()) std::fprintf(stderr, "first log: %s\n", e.message().c_str());
  const std::int64_t t_commit = bench::now_ns();

  // Finish right after the last log: the tail is still in flight.
  log_steps(run, 0, tail_steps);
  const std::int64_t t_last = bench::now_ns();
  const double f_last = faults();
  chorus::FinishResult r = run.finish().wait();
  const std::int64_t t_fin = bench::now_ns();
  const double f_fin = faults();
  if (r.error || r.rows != tail_steps + 1u) {
    std::fprintf(stderr, "finish: %s, %llu rows\n", r.error.message().c_str(), static_cast<unsigned long long>(r.rows));
    return 5;
  }
  bench::report("init_ms", static_cast<double>(t_init - t0) / 1e6);
  bench::report("first_log_ms", static_cast<double>(t_log - t0) / 1e6);
  bench::report("first_commit_ms", static_cast<double>(t_commit - t0) / 1e6);
  bench::report("finish_ms", static_cast<double>(t_fin - t_last) / 1e6);
  bench::report("init_faults", f_init - f0);
  bench::report("finish_faults", f_fin - f_last);

  // Finish with nothing in flight: the fixed cost alone.
  opt.run_id = "idle";
  const std::int64_t t_idle0 = bench::now_ns();
  chorus::Run idle = chorus::init(opt);
  bench::report("second_init_ms", static_cast<double>(bench::now_ns() - t_idle0) / 1e6);
  log_steps(idle, 0, tail_steps);
  if (chorus::Error e = idle.log({{"loss", 2.0}}).wait()) std::fprintf(stderr, "log: %s\n", e.message().c_str());
  const std::int64_t t_idle = bench::now_ns();
  chorus::FinishResult ri = idle.finish().wait();
  const std::int64_t t_idle_fin = bench::now_ns();
  if (ri.error) std::fprintf(stderr, "finish: %s\n", ri.error.message().c_str());
  bench::report("finish_idle_ms", static_cast<double>(t_idle_fin - t_idle) / 1e6);
  return 0;
}

int rank_main() {
  chorus::Options opt;
  opt.system_interval = 0;
  const std::int64_t t0 = bench::now_ns();
  chorus::Error err;
  chorus::Run run = chorus::init(opt, err);
  const std::int64_t t_init = bench::now_ns();
  if (err) {
    std::fprintf(stderr, "init failed: %s\n", err.message().c_str());
    return 3;
  }
  log_steps(run, run.topology().rank, 100);
  const std::int64_t t_last = bench::now_ns();
  chorus::FinishResult r = run.finish().wait();
  const std::int64_t t_fin = bench::now_ns();
  if (r.error) std::fprintf(stderr, "finish: %s\n", r.error.message().c_str());
  bench::report("init_start", static_cast<double>(t0));
  bench::report("init_end", static_cast<double>(t_init));
  bench::report("finish_ms", static_cast<double>(t_fin - t_last) / 1e6);
  bench::report("host", run.is_host() ? 1 : 0);
  return r.error ? 5 : 0;
}

/// Milliseconds to touch `bytes` of fresh memory, a page at a time: what
/// page faults cost on this machine (a virtual machine's can be slow).
double first_touch_ms(std::size_t bytes) {
  std::vector<double> runs;
  for (int i = 0; i < 5; ++i) {
    // Fresh pages from the kernel each time (malloc would hand back touched ones).
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    auto* p = static_cast<volatile char*>(m);
    const std::int64_t t0 = bench::now_ns();
    for (std::size_t at = 0; at < bytes; at += 4096) p[at] = 1;
    runs.push_back(static_cast<double>(bench::now_ns() - t0) / 1e6);
    ::munmap(m, bytes);
  }
  return bench::median(runs);
}

using Series = bench::Spread;

/// Milliseconds one fdatasync of a 4 KiB append takes in `dir` (median of 7):
/// the unit of finish's target.
double fdatasync_ms(const bench::fs::path& dir) {
  const std::string path = (dir / "sync-probe").string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  const std::string block(4096, 'x');
  std::vector<double> runs;
  for (int i = 0; i < 7; ++i) {
    if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) break;
    const std::int64_t t0 = bench::now_ns();
    if (::fdatasync(fd) != 0) break;
    runs.push_back(static_cast<double>(bench::now_ns() - t0) / 1e6);
  }
  ::close(fd);
  return runs.empty() ? -1 : bench::median(runs);
}

} // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--single") return single_main(argv[2]);
  if (argc >= 2 && std::string(argv[1]) == "--rank") return rank_main();

  std::printf("bench_lifecycle: medians of %d single-process runs and %d %d-rank shared runs, each a fresh "
              "process\n\n",
              single_reps, job_reps, job_world);
  bool ok = true;
  Series init, first_log, first_commit, finish, finish_idle, second_init;
  Series init_faults{{}, 0}, finish_faults{{}, 0};
  for (int i = 0; i < single_reps; ++i) {
    bench::TempDir dir;
    // A single process: the child ignores the environment (read_env = false, one-process topology).
    bench::Job job(1, {"--single", (dir.path / "runs").string()}, {}, dir.path);
    ok = job.wait() && ok;
    auto f = job.figures(0);
    if (!f.count("finish_idle_ms")) continue;
    init.v.push_back(f["init_ms"]);
    first_log.v.push_back(f["first_log_ms"]);
    first_commit.v.push_back(f["first_commit_ms"]);
    finish.v.push_back(f["finish_ms"]);
    finish_idle.v.push_back(f["finish_idle_ms"]);
    second_init.v.push_back(f["second_init_ms"]);
    init_faults.v.push_back(f["init_faults"]);
    finish_faults.v.push_back(f["finish_faults"]);
  }

  Series connected, launched, host_finish, host_init, other_init;
  int failed_jobs = 0;
  for (int i = 0; i < job_reps; ++i) {
    bench::TempDir dir;
    const std::int64_t t_launch = bench::now_ns();
    bench::Job job(job_world, {"--rank"},
                   {{"CHORUS_DIR", (dir.path / "runs").string()},
                    {"CHORUS_MODE", "shared"},
                    {"CHORUS_RUN_ID", "bench-life-" + std::to_string(i)},
                    {"CHORUS_PROJECT", "bench"},
                    {"CHORUS_SYSTEM_INTERVAL", "0"},
                    // Bounded, so that a failed start costs seconds, not the default 30 s.
                    {"CHORUS_INIT_TIMEOUT", "10"},
                    {"CHORUS_FINISH_TIMEOUT", "10"}},
                   dir.path);
    if (!job.wait()) {
      ok = false;
      ++failed_jobs;
    }
    double first = 1e300, last = 0, slowest_other = 0;
    bool all = true;
    for (int r = 0; r < job_world; ++r) {
      auto f = job.figures(r);
      if (!f.count("init_end")) {
        all = false;
        continue;
      }
      first = std::min(first, f["init_start"]);
      last = std::max(last, f["init_end"]);
      const double took = (f["init_end"] - f["init_start"]) / 1e6;
      if (f["host"] == 1) {
        host_finish.v.push_back(f["finish_ms"]);
        host_init.v.push_back(took);
      } else {
        slowest_other = std::max(slowest_other, took);
      }
    }
    if (!all) continue;
    connected.v.push_back((last - first) / 1e6);
    other_init.v.push_back(slowest_other);
    launched.v.push_back((last - static_cast<double>(t_launch)) / 1e6);
  }

  // The targets (BENCHMARKS.md): init -> first log <= 2 ms, 8 ranks connected <= 100 ms, finish <= one fdatasync + 1 ms.
  double sync_ms = -1;
  {
    bench::TempDir dir;
    sync_ms = fdatasync_ms(dir.path);
  }
  bench::Table t({"what (ms)", "median", "min", "max", "target", "verdict"});
  const auto line = [&t](const std::string& name, const Series& s, double target) {
    const bool has = !s.v.empty();
    t.add({name, s.median(), s.min(), s.max(), target > 0 ? "<= " + num(target, target < 10 ? 1 : 0) : "-",
           target > 0 ? (has ? bench::verdict(bench::median(s.v) <= target) : "MISSED") : ""});
  };
  line("single process: init returns", init, 0);
  line("single process: init -> first log returns", first_log, 2);
  line("single process: init -> first log committed", first_commit, 0);
  line("single process: init of a second run in the same process", second_init, 0);
  line("8-rank shared run connected (first init call -> last init returns)", connected, 100);
  line("8-rank shared run connected (launch -> last init returns)", launched, 0);
  line("8-rank: the run host's own init", host_init, 0);
  line("8-rank: the slowest other rank's own init", other_init, 0);
  line("finish after the last log (1000 x 10 values just logged)", finish, sync_ms > 0 ? sync_ms + 1 : 0);
  line("finish with nothing in flight", finish_idle, 0);
  line("8-rank run host: finish after its last log (100 x 10 values)", host_finish, 0);
  t.print();
  std::printf("\nfinish's target: one fdatasync of a 4 KiB append here (%.2f ms, median of 7) + 1 ms\n", sync_ms);
  std::printf("for scale: touching 2 MiB of fresh memory (the default queue of 65536 slots is 2 MiB) takes "
              "%.2f ms here;\nthe single process took %s page faults in init and %s in the finish after the "
              "burst (medians, every thread's)\n",
              first_touch_ms(std::size_t{2} << 20), init_faults.median().c_str(), finish_faults.median().c_str());
  if (failed_jobs > 0)
    std::printf("\n%d of %d %d-rank runs FAILED (see the messages above); the figures are over the others\n",
                failed_jobs, job_reps, job_world);
  if (!ok) std::printf("\nsome processes failed: see the messages above\n");
  return ok ? 0 : 1;
}
