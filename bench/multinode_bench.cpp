// bench_multinode: a job of N nodes x K ranks (default 8 x 32 = 256) joining
// one shared run across nodes. Each node is a network namespace on this
// machine (tests/e2e/netns.hpp), its links to the others mutual TLS with the
// job's credentials (`chorus certs`); every node's `chorus launch
// --nnodes N` is started at once, and each rank (this binary again, with
// --rank) meets the others at a barrier, as a trainer's first collective
// does (so that the run host waits for the ranks still joining rather than
// finishing without them), then logs a few steps into the run hosted by
// global rank 0, on node 0. The ranks print when they started, when init
// returned (joined), when they passed the barrier, when their first value
// was acknowledged and when their finish returned (steady-clock times, one
// clock for every namespace of this machine), and at their end
// their own CPU time and peak RSS. The run host is also sampled from outside
// (/proc/PID/stat and VmHWM) while it runs, which gives its figures even
// where it never gets to print them.
//
// It prints: how many ranks joined, the join spread (from the start of the
// last launch to the last rank's init returning, and to its first
// acknowledged value), the total wall time, the run host's CPU time and
// peak RSS, the other ranks' CPU time, the CPU time of every launch with
// its ranks (wait4), the exit codes, what run.json and history.jsonl hold,
// and the ranks' other output, counted by kind.
//
//   bench_multinode [--nodes 8] [--per-node 32] [--steps 20] [--init-timeout 60]
//                   [--finish-timeout 60] [--limit SECONDS] [--tls 1|0]
//   bench_multinode --rank STEPS BARRIER_S   one rank (what the launches start)
//
// Needs root (network namespaces); says so and measures nothing otherwise.
// CHORUS_KEEP_TEST_DIRS=1 keeps the nodes' disks and output.
#include "bench.hpp"

#include "io/platform/procfs.hpp"
#include "tests/e2e/netns.hpp"

#include <chorus/chorus.hpp>

#include <sys/resource.h>

#include <cctype>
#include <map>
#include <set>

namespace {

using bench::num;
using std::chrono::milliseconds;

// --- a rank ------------------------------------------------------------------

void say(const char* name, double value) {
  bench::report(name, value);
  std::fflush(stdout);
}

/// This process's CPU time and peak RSS, then its exit code.
int end_rank(int code) {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  say("cpu_s", e2e::cpu_seconds(u));
  say("maxrss_kb", static_cast<double>(u.ru_maxrss));
  say("ended", static_cast<double>(bench::now_ns()));
  say("code", code);
  return code;
}

int rank_main(long steps, double barrier_s) {
  say("started", static_cast<double>(bench::now_ns()));
  say("pid", ::getpid());
  chorus::Options opt;
  opt.project = "bench";
  opt.system_interval = 0;
  chorus::Error err;
  chorus::Run run = chorus::init(opt, err);
  const auto joined = static_cast<double>(bench::now_ns());
  if (err || !run) {
    std::fprintf(stderr, "init failed: %s\n", err ? err.message().c_str() : "inactive");
    say("init_failed", joined);
    return end_rank(3);
  }
  say("joined", joined);
  say("host", run.is_host() ? 1 : 0);
  const double rank = run.topology().rank;
  run.define_metric("loss", chorus::Reduce::mean);
  run.define_metric("tokens", chorus::Reduce::sum);
  const auto barrier_timeout = std::chrono::duration_cast<milliseconds>(std::chrono::duration<double>(barrier_s));
  if (chorus::Error e = run.barrier("start", barrier_timeout).wait()) {
    std::fprintf(stderr, "start barrier: %s\n", e.message().c_str());
    say("barrier_failed", static_cast<double>(bench::now_ns()));
  } else {
    say("barrier", static_cast<double>(bench::now_ns()));
  }
  for (long s = 0; s < steps; ++s) {
    const chorus::Pending p = run.log({{"loss", rank + static_cast<double>(s) * 0.5}, {"tokens", 100.0 + rank}}, {.step = s});
    if (s == 0) {
      if (chorus::Error e = p.wait()) std::fprintf(stderr, "first log: %s\n", e.message().c_str());
      else say("first_ack", static_cast<double>(bench::now_ns()));
    }
  }
  const chorus::FinishResult r = run.finish().wait();
  say("finished", static_cast<double>(bench::now_ns()));
  if (r.error) std::fprintf(stderr, "finish: %s\n", r.error.message().c_str());
  return end_rank(r.error ? 4 : 0);
}

// --- the benchmark -------------------------------------------------------------

struct Args {
  int nodes = 8, per_node = 32;
  long steps = 20;
  double init_timeout = 60, finish_timeout = 60, limit = 0;
  bool tls = true; // links between nodes mutual TLS; plain TCP (CHORUS_INSECURE=1) with --tls 0
};

/// How long the ranks wait at their start barrier: a rank started last may
/// take its whole init timeout to join.
double barrier_s(const Args& a) { return a.init_timeout + 30; }

Args parse(int argc, char** argv) {
  Args a;
  const char* usage = "usage: bench_multinode [--nodes 8] [--per-node 32] [--steps 20] [--init-timeout 60] "
                      "[--finish-timeout 60] [--limit SECONDS] [--tls 1|0]\n";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf("%s", usage);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_multinode: %s needs a value\n", k.c_str());
      std::exit(2);
    }
    const double v = std::strtod(argv[++i], nullptr);
    if (k == "--nodes") a.nodes = static_cast<int>(v);
    else if (k == "--per-node") a.per_node = static_cast<int>(v);
    else if (k == "--steps") a.steps = static_cast<long>(v);
    else if (k == "--init-timeout") a.init_timeout = v;
    else if (k == "--finish-timeout") a.finish_timeout = v;
    else if (k == "--limit") a.limit = v;
    else if (k == "--tls") a.tls = v != 0;
    else {
      std::fprintf(stderr, "%s", usage);
      std::exit(2);
    }
  }
  if (a.nodes < 1 || a.nodes > 200 || a.per_node < 1 || a.steps < 1 || a.init_timeout <= 0 || a.finish_timeout <= 0) {
    std::fprintf(stderr, "bench_multinode: out of range\n");
    std::exit(2);
  }
  if (a.limit <= 0) a.limit = barrier_s(a) + a.init_timeout + a.finish_timeout + 60;
  return a;
}

/// What each rank printed: its "bench.NAME=VALUE" figures; and the other
/// lines of every rank and launch, counted by kind (digits folded to #).
struct RankOutput {
  std::map<int, std::map<std::string, double>> ranks;
  std::map<std::string, int> other;
};

std::string fold_digits(const std::string& line) {
  std::string out;
  for (char ch : line) {
    if (std::isdigit(static_cast<unsigned char>(ch)) != 0) {
      if (out.empty() || out.back() != '#') out += '#';
    } else {
      out += ch;
    }
  }
  return out;
}

void read_output(const std::string& text, RankOutput& out) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    int rank = -1, used = 0;
    char name[64] = {};
    double value = 0;
    if (std::sscanf(line.c_str(), "[rank %d] bench.%63[^=]=%lf", &rank, name, &value) == 3) {
      out.ranks[rank][name] = value;
      continue;
    }
    std::string rest = line;
    if (std::sscanf(line.c_str(), "[rank %d] %n", &rank, &used) == 1 && used > 0) rest = line.substr(static_cast<std::size_t>(used));
    if (rest.starts_with("FINISH_STATE") || rest.empty()) continue;
    ++out.other[fold_digits(rest)];
  }
}

/// The CPU seconds and the name (comm) in a /proc stat file's text; false
/// where it cannot be read.
bool cpu_of(const std::string& stat, double& cpu_s, std::string& comm) {
  const auto fields = chorus::platform::parse_pid_stat(stat);
  const auto name = chorus::platform::parse_pid_stat_name(stat);
  if (!fields || !name) return false;
  comm = *name;
  cpu_s = static_cast<double>(fields->utime + fields->stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  return true;
}

/// The run host seen from outside: CPU time and peak RSS, and its threads'
/// CPU (the middleman's multiplexer carries every link; chorus.tls makes
/// the TLS handshakes of the links it accepts), last sampled.
struct Sampled {
  pid_t pid = -1;
  bool gone = false;
  double cpu_s = 0, hwm_kb = 0;
  std::map<std::string, std::pair<std::string, double>> threads; // tid -> name, CPU s

  void sample() {
    if (pid <= 0 || gone) return;
    const std::string dir = "/proc/" + std::to_string(pid) + "/";
    std::string comm;
    if (!cpu_of(chorus::test::slurp(dir + "stat"), cpu_s, comm) || comm != "bench_multinode") {
      gone = true;
      return;
    }
    std::error_code ec;
    for (const auto& task : e2e::fs::directory_iterator(dir + "task", ec)) {
      double cpu = 0;
      if (cpu_of(chorus::test::slurp(task.path() / "stat"), cpu, comm))
        threads[task.path().filename().string()] = {comm, cpu};
    }
    const std::string status = chorus::test::slurp(dir + "status");
    if (const auto at = status.find("VmHWM:"); at != std::string::npos)
      hwm_kb = std::max(hwm_kb, std::strtod(status.c_str() + at + 6, nullptr));
  }

  /// The `n` busiest threads, as "name CPU-seconds", busiest first.
  [[nodiscard]] std::string busiest(std::size_t n) const {
    std::vector<std::pair<std::string, double>> all;
    for (const auto& [tid, t] : threads) all.push_back(t);
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    std::string out;
    for (std::size_t i = 0; i < std::min(n, all.size()); ++i)
      out += (out.empty() ? "" : ", ") + all[i].first + " " + num(all[i].second, 2);
    return out.empty() ? "-" : out;
  }
};

double ms_between(double from_ns, double to_ns) { return (to_ns - from_ns) / 1e6; }

std::string list(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : " ") + i;
  return s;
}

int bench_main(const Args& a) {
  if (::geteuid() != 0) {
    std::printf("bench_multinode: needs root (each node is a network namespace, made with `ip netns`); "
                "nothing measured\n");
    return 0;
  }
  const int world = a.nodes * a.per_node;
  std::printf("bench_multinode: %d nodes x %d ranks = %d ranks, network namespaces on this machine (%ld cores), "
              "%s between nodes, one shared run hosted by rank 0 on node 0; each rank passes a start "
              "barrier (timeout %g s) and logs %ld steps. CHORUS_INIT_TIMEOUT=%g, CHORUS_FINISH_TIMEOUT=%g, "
              "launches killed after %g s\n\n",
              a.nodes, a.per_node, world, ::sysconf(_SC_NPROCESSORS_ONLN), a.tls ? "mutual TLS" : "plain TCP",
              barrier_s(a), a.steps, a.init_timeout,
              a.finish_timeout, a.limit);
  std::fflush(stdout);

  e2e::Cluster c(a.nodes, a.per_node);
  const std::string self = e2e::fs::read_symlink("/proc/self/exe").string();
  const std::string env = "CHORUS_MODE=shared CHORUS_SCOPE=global CHORUS_SYSTEM_INTERVAL=0 CHORUS_INIT_TIMEOUT=" +
                          num(a.init_timeout, 3) + " CHORUS_FINISH_TIMEOUT=" + num(a.finish_timeout, 3) +
                          (a.tls ? "" : " CHORUS_TLS_DIR= CHORUS_INSECURE=1");
  const std::string run_id = "bench-multinode-" + std::to_string(::getpid());

  const double t_first = static_cast<double>(bench::now_ns());
  c.start_trainer(env, run_id, self + " --rank " + std::to_string(a.steps) + " " + num(barrier_s(a), 3));
  const double t_last = static_cast<double>(bench::now_ns());

  // Until every launch ended or the limit: each launch's end, and the run host sampled.
  const auto deadline = bench::clock::now() + std::chrono::duration_cast<milliseconds>(std::chrono::duration<double>(a.limit));
  std::vector<double> ended(static_cast<std::size_t>(a.nodes), 0);
  std::vector<int> codes(static_cast<std::size_t>(a.nodes), -1);
  Sampled host;
  for (;;) {
    int running = 0;
    for (int k = 0; k < a.nodes; ++k) {
      const auto i = static_cast<std::size_t>(k);
      if (ended[i] != 0) continue;
      if (const auto code = c.launches[i]->wait_for(milliseconds(0))) {
        codes[i] = *code;
        ended[i] = static_cast<double>(bench::now_ns());
      } else {
        ++running;
      }
    }
    if (host.pid <= 0) {
      RankOutput o;
      read_output(chorus::test::slurp(c.log(0)), o);
      if (auto it = o.ranks.find(0); it != o.ranks.end() && it->second.count("pid"))
        host.pid = static_cast<pid_t>(it->second["pid"]);
    }
    host.sample();
    if (running == 0 || bench::clock::now() >= deadline) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  std::vector<std::string> launch_codes;
  double launch_cpu = 0, t_end = 0;
  std::vector<std::string> per_node_cpu;
  int killed = 0;
  for (int k = 0; k < a.nodes; ++k) {
    const auto i = static_cast<std::size_t>(k);
    if (ended[i] == 0) {
      ++killed;
      launch_codes.push_back("killed");
      per_node_cpu.push_back("-");
      continue;
    }
    launch_codes.push_back(std::to_string(codes[i]));
    const rusage& u = c.launches[i]->usage();
    const double cpu = e2e::cpu_seconds(u);
    launch_cpu += cpu;
    per_node_cpu.push_back(num(cpu, 1));
    t_end = std::max(t_end, ended[i]);
  }
  if (killed > 0) {
    for (auto& l : c.launches) l->kill();
    t_end = static_cast<double>(bench::now_ns());
  }

  RankOutput out;
  for (int k = 0; k < a.nodes; ++k) read_output(chorus::test::slurp(c.log(k)), out);
  auto figure = [&](int r, const char* name) -> std::optional<double> {
    const auto it = out.ranks.find(r);
    if (it == out.ranks.end()) return std::nullopt;
    const auto f = it->second.find(name);
    if (f == it->second.end()) return std::nullopt;
    return f->second;
  };
  int started = 0, joined = 0, init_failed = 0, passed = 0, barrier_failed = 0, acked = 0, finished = 0, reported = 0;
  double last_started = 0, last_joined = 0, first_joined = 1e300, last_passed = 0, last_ack = 0, last_finished = 0;
  std::vector<double> join_ms, other_cpu, other_rss;
  std::map<int, int> rank_codes;
  std::vector<int> joined_on(static_cast<std::size_t>(a.nodes), 0);
  for (int r = 0; r < world; ++r) {
    if (auto v = figure(r, "started")) {
      ++started;
      last_started = std::max(last_started, *v);
    }
    if (auto v = figure(r, "joined")) {
      ++joined;
      ++joined_on[static_cast<std::size_t>(r / a.per_node)];
      last_joined = std::max(last_joined, *v);
      first_joined = std::min(first_joined, *v);
      join_ms.push_back(ms_between(t_last, *v));
    }
    if (figure(r, "init_failed")) ++init_failed;
    if (auto v = figure(r, "barrier")) {
      ++passed;
      last_passed = std::max(last_passed, *v);
    }
    if (figure(r, "barrier_failed")) ++barrier_failed;
    if (auto v = figure(r, "first_ack")) {
      ++acked;
      last_ack = std::max(last_ack, *v);
    }
    if (auto v = figure(r, "finished")) {
      ++finished;
      last_finished = std::max(last_finished, *v);
    }
    if (auto v = figure(r, "code")) {
      ++reported;
      ++rank_codes[static_cast<int>(*v)];
    }
    if (r != 0) {
      if (auto v = figure(r, "cpu_s")) other_cpu.push_back(*v);
      if (auto v = figure(r, "maxrss_kb")) other_rss.push_back(*v);
    }
  }
  std::vector<std::string> code_list;
  for (const auto& [code, n] : rank_codes) code_list.push_back(std::to_string(n) + " x " + std::to_string(code));
  if (reported < world) code_list.push_back(std::to_string(world - reported) + " x none (killed or crashed)");

  // What the run host wrote on node 0's disk.
  std::string run_ranks = "no run.json", history = "no history.jsonl";
  bool run_ok = false;
  if (const auto runs = e2e::find_runs(c.disk(0)); runs.size() == 1) {
    try {
      simdjson::dom::parser parser;
      auto info = e2e::read_run_json(parser, runs[0]);
      int listed = 0, done = 0;
      for (auto r : info["ranks"].get_array()) {
        ++listed;
        done += std::string_view(r["state"].get_string()) == "finished";
      }
      run_ranks = std::to_string(listed) + " listed, " + std::to_string(done) + " finished; run " +
                  std::string(std::string_view(info["state"].get_string()));
      const auto rows = e2e::read_history(runs[0]);
      long full = 0;
      for (const auto& row : rows) full += row.count.count("loss") && row.count.at("loss") == world;
      history = std::to_string(rows.size()) + " rows, " + std::to_string(full) + " of them over all " +
                std::to_string(world) + " ranks";
      run_ok = listed == world && done == world && static_cast<long>(rows.size()) == a.steps && full == a.steps;
    } catch (const std::exception& e) {
      run_ranks = e.what();
    }
  } else if (runs.size() > 1) {
    run_ranks = std::to_string(runs.size()) + " runs on node 0";
  }

  const bool host_reported = figure(0, "cpu_s").has_value();
  const double host_cpu = host_reported ? *figure(0, "cpu_s") : host.cpu_s;
  const double host_rss_kb = host_reported ? std::max(*figure(0, "maxrss_kb"), host.hwm_kb) : host.hwm_kb;
  const std::string host_how = host_reported ? "" : host.pid > 0 ? " (sampled: it did not report)" : " (not found)";
  auto ms_or_dash = [&](int n, double t) { return n > 0 ? num(ms_between(t_last, t), 0) : std::string("-"); };

  bench::Table t({"figure", "value"});
  t.add({"ranks started (process up)", std::to_string(started) + " / " + std::to_string(world)});
  t.add({"ranks joined (init returned)", std::to_string(joined) + " / " + std::to_string(world)});
  std::vector<std::string> joined_list;
  for (int n : joined_on) joined_list.push_back(std::to_string(n));
  t.add({"  per node, node 0..", list(joined_list)});
  t.add({"ranks whose init failed", std::to_string(init_failed)});
  t.add({"ranks past the start barrier / failed there", std::to_string(passed) + " / " + std::to_string(barrier_failed)});
  t.add({"ranks with their first value acknowledged", std::to_string(acked)});
  t.add({"ranks whose finish returned", std::to_string(finished)});
  t.add({"launches started in, ms", num(ms_between(t_first, t_last), 0)});
  t.add({"last launch start -> last rank process up, ms", ms_or_dash(started, last_started)});
  t.add({"last launch start -> first rank joined, ms", ms_or_dash(joined, first_joined)});
  t.add({"last launch start -> median rank joined, ms", joined > 0 ? num(bench::median(join_ms), 0) : "-"});
  t.add({"last launch start -> last rank joined, ms", ms_or_dash(joined, last_joined)});
  t.add({"last launch start -> last rank past the start barrier, ms", ms_or_dash(passed, last_passed)});
  t.add({"last launch start -> last first ack, ms", ms_or_dash(acked, last_ack)});
  t.add({"last launch start -> last finish returned, ms", ms_or_dash(finished, last_finished)});
  t.add({"total wall (first launch start -> last launch end), s", num((t_end - t_first) / 1e9, 2)});
  t.add({"run host (rank 0) CPU, s" + host_how, num(host_cpu, 2)});
  t.add({"run host (rank 0) peak RSS, MiB" + host_how, num(host_rss_kb / 1024, 1)});
  t.add({"run host's busiest threads, CPU s (sampled every 50 ms)", host.busiest(3)});
  t.add({"other ranks' CPU, s: median / max",
         other_cpu.empty() ? "-" : num(bench::median(other_cpu), 2) + " / " + num(*std::max_element(other_cpu.begin(), other_cpu.end()), 2)});
  t.add({"other ranks' peak RSS, MiB: median", other_rss.empty() ? "-" : num(bench::median(other_rss) / 1024, 1)});
  t.add({"all launches with their ranks, CPU s (wait4)", num(launch_cpu, 1) + (killed ? " (killed ones not counted)" : "")});
  t.add({"  per node", list(per_node_cpu)});
  t.add({"launch exit codes, node 0..", list(launch_codes)});
  t.add({"rank exit codes", list(code_list)});
  t.add({"run.json on node 0", run_ranks});
  t.add({"history.jsonl", history});
  t.print();
  if (!out.other.empty()) {
    std::vector<std::pair<int, std::string>> kinds;
    for (const auto& [line, n] : out.other) kinds.emplace_back(n, line);
    std::sort(kinds.rbegin(), kinds.rend());
    std::printf("\nother output of the ranks and launches, by kind (digits as #):\n");
    for (std::size_t i = 0; i < kinds.size() && i < 12; ++i)
      std::printf("  %5d x %s\n", kinds[i].first, kinds[i].second.substr(0, 300).c_str());
    if (kinds.size() > 12) std::printf("  ... %zu kinds more\n", kinds.size() - 12);
  }
  const bool ok = killed == 0 && joined == world && passed == world && finished == world &&
                  std::all_of(codes.begin(), codes.end(), [](int code) { return code == 0; }) && run_ok;
  std::printf("\n%s\n", ok ? "every rank joined, logged and finished" : "NOT every rank joined, logged and finished");
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--rank") return rank_main(std::atol(argv[2]), std::atof(argv[3]));
  try {
    return bench_main(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_multinode: %s\n", e.what());
    return 2;
  }
}
