// A rank of the end-to-end tests: logs values that the tests can predict
// from (rank, step) alone, and misbehaves on request. A rank whose handle
// is inactive (automatic mode, not the primary) prints INACTIVE and exits.
//   worker [--steps N] [--barrier-every B] [--die-rank R --die-step S [--die-signal SIG]]
//          [--no-finish] [--exit-code C] [--heartbeat-ms H --connection-timeout-ms T] [--queue N]
//          [--step-us U] [--ack-each 1] [--fork-every N] [--artifact PATH] [--uneven 1]
//          [--hold-until PATH] [--fail-rank R --finish-code C] [--abort-rank R]
//          [--start-step S] [--pause-step P] [--print-pid 1] [--throw-rank R --throw-step S]
//          [--exit-rank R --exit-step S --exit-now C] [--unwind-rank R --unwind-step S] [--bad-keys 1]
// --start-step: the first step logged, as by a trainer restarted from a checkpoint.
// --pause-step: at step P every rank meets at a barrier (which commits every
// row before P), prints "PAUSED P" and waits there to be killed.
// --ack-each waits for each step's values to be acknowledged and prints "ACKED S".
// --stop-on-error stops logging at the first call refused at once (its host lost, say), with why.
// --hold-until waits before the last step until PATH exists (at most 60 s),
// so that a test can keep this run going while it starts another.
// --fork-every forks a child every N steps, as DataLoader workers are forked:
// the child logs through the inherited handle, drops it and exits; the parent
// prints "CHILD HUNG" for a child that is not gone within 10 s.
// SIGSTOP as --die-signal freezes the rank: its link goes silent, it does not close.
// --artifact: after the steps and a barrier, each rank logs PATH as the artifact
// "rank-R/<file name>" of type "model" and prints "ARTIFACT R ok" once it is stored.
// --print-pid prints "PID <rank> <pid>" once the run started.
// --throw-rank: at step S an exception escapes a thread of that rank
// (std::terminate); --exit-rank: at step S that rank calls exit(C) without
// finishing; --unwind-rank: at step S an exception unwinds that rank's Run
// (main catches it and returns 5).
// --bad-keys: every step also logs values under the keys "" and "_x" and a
// 300-byte key beside "good", and "late" at the step before, its tickets dropped.
// --slow-exit-ms: after its finish each rank exits through exit() with its
// Run still held (as an interpreter that ends does). On rank 0 an exit
// handler registered before the run started (as a GPU library's is) takes
// M ms; the other ranks wait M/2 ms first, so that their links close while
// rank 0 is exiting.
// --local-run-first: before its run, the process makes and finishes a run of
// its own under CHORUS_DIR/local, read from no environment (no upload).
// --uneven: rank 0 logs the undeclared key "uneven" (rank * 1000 + step) at
// every step, the other ranks at even steps only.
#include <chorus/chorus.hpp>
#include "tests/e2e/histogram_values.hpp"

#include <thread>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct Args {
  long steps = 100;
  long barrier_every = 0;
  int die_rank = -1;
  long die_step = -1;
  int die_signal = SIGKILL;
  bool no_finish = false;
  int exit_code = 0;
  long heartbeat_ms = 0;
  long connection_timeout_ms = 0;
  long queue = 0;
  long step_us = 0; // a pause per step, as a training step would take
  bool ack_each = false;
  long fork_every = 0;
  std::string artifact;
  bool uneven = false;
  int fail_rank = -1; // this rank ends the run with finish({.exit_code = finish_code})
  int abort_rank = -1; // this rank (RANK) aborts before init, as a trainer's setup that throws
  int finish_code = 0;
  std::string hold_until;
  long start_step = 0;
  long pause_step = -1;
  bool print_pid = false;
  bool stop_on_error = false; // a call refused at once (its host lost, say): say why and stop logging
  int throw_rank = -1, exit_rank = -1, unwind_rank = -1;
  long throw_step = -1, exit_step = -1, unwind_step = -1;
  int exit_now = 0;
  long slow_exit_ms = -1;
  bool local_run_first = false;
  bool bad_keys = false;
  bool histograms = false; // each step: "grad" (merged) and "act" (per rank) of histogram_values()
};

/// Waits until `path` exists, at most 60 s.
void hold_until(const std::string& path) {
  for (int i = 0; i < 6000 && ::access(path.c_str(), F_OK) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

/// A child forked with a live run: its calls must be no-ops that return at
/// once. It exits through exit() so that static destructors run too.
[[noreturn]] void forked_child(chorus::Run& run, long step) {
  (void)run.log({{"child", 1.0}, {"loss", -1e9}}, {.step = step}).wait();
  (void)run.summary({{"child", true}});
  (void)run.finish().wait();
  { chorus::Run gone = std::move(run); } // its destructor, in the child
  std::exit(0);
}

/// Waits up to 10 s for a forked child; one that does not end hung.
void reap(pid_t child) {
  for (int i = 0; i < 1000; ++i) {
    int status = 0;
    if (::waitpid(child, &status, WNOHANG) == child) {
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::printf("CHILD FAILED %d\n", status);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("CHILD HUNG\n");
  // Where it hangs, for whoever reads the test's output: each thread's stack
  // (gdb, where it is installed).
  std::fflush(stdout);
  const std::string where = "gdb -p " + std::to_string(child) +
                            " -batch -ex 'thread apply all bt' 2>/dev/null | grep -E '^(Thread|#)' | head -80";
  if (std::system(where.c_str()) != 0) std::printf("(no stacks: gdb could not attach)\n");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (k == "--steps") a.steps = v;
    else if (k == "--barrier-every") a.barrier_every = v;
    else if (k == "--die-rank") a.die_rank = static_cast<int>(v);
    else if (k == "--die-step") a.die_step = v;
    else if (k == "--die-signal") a.die_signal = static_cast<int>(v);
    else if (k == "--no-finish") a.no_finish = v != 0;
    else if (k == "--exit-code") a.exit_code = static_cast<int>(v);
    else if (k == "--fail-rank") a.fail_rank = static_cast<int>(v);
    else if (k == "--abort-rank") a.abort_rank = static_cast<int>(v);
    else if (k == "--finish-code") a.finish_code = static_cast<int>(v);
    else if (k == "--heartbeat-ms") a.heartbeat_ms = v;
    else if (k == "--connection-timeout-ms") a.connection_timeout_ms = v;
    else if (k == "--queue") a.queue = v;
    else if (k == "--step-us") a.step_us = v;
    else if (k == "--ack-each") a.ack_each = v != 0;
    else if (k == "--stop-on-error") a.stop_on_error = v != 0;
    else if (k == "--fork-every") a.fork_every = v;
    else if (k == "--artifact") a.artifact = argv[i + 1];
    else if (k == "--uneven") a.uneven = v != 0;
    else if (k == "--hold-until") a.hold_until = argv[i + 1];
    else if (k == "--start-step") a.start_step = v;
    else if (k == "--pause-step") a.pause_step = v;
    else if (k == "--print-pid") a.print_pid = v != 0;
    else if (k == "--throw-rank") a.throw_rank = static_cast<int>(v);
    else if (k == "--throw-step") a.throw_step = v;
    else if (k == "--exit-rank") a.exit_rank = static_cast<int>(v);
    else if (k == "--exit-step") a.exit_step = v;
    else if (k == "--exit-now") a.exit_now = static_cast<int>(v);
    else if (k == "--slow-exit-ms") a.slow_exit_ms = v;
    else if (k == "--local-run-first") a.local_run_first = v != 0;
    else if (k == "--unwind-rank") a.unwind_rank = static_cast<int>(v);
    else if (k == "--unwind-step") a.unwind_step = v;
    else if (k == "--bad-keys") a.bad_keys = v != 0;
    else if (k == "--histograms") a.histograms = v != 0;
  }
  return a;
}

chorus::task<int> work(Args a) {
  chorus::Options opt;
  opt.project = "e2e";
  opt.mode = chorus::Mode::shared;
  opt.finish_timeout = std::chrono::milliseconds(20'000);
  opt.init_timeout = std::chrono::milliseconds(20'000);
  if (a.queue > 0) opt.queue_capacity = static_cast<std::size_t>(a.queue);
  if (a.heartbeat_ms > 0) opt.heartbeat_interval = std::chrono::milliseconds(a.heartbeat_ms);
  if (a.connection_timeout_ms > 0) opt.connection_timeout = std::chrono::milliseconds(a.connection_timeout_ms);
  chorus::Error err;
  if (const char* r = std::getenv("RANK"); r != nullptr && a.abort_rank >= 0 && std::atoi(r) == a.abort_rank)
    std::abort();
  if (a.local_run_first) {
    chorus::Options local;
    local.read_env = false;
    local.topology = chorus::Topology{};
    const char* dir = std::getenv("CHORUS_DIR");
    local.dir = std::string(dir ? dir : ".") + "/local";
    local.project = "local";
    local.system_interval = 0;
    chorus::Run first = chorus::init(local, err);
    if (err) {
      std::fprintf(stderr, "the local run's init failed: %s\n", err.message().c_str());
      co_return 3;
    }
    (void)first.log({{"x", 1.0}});
    std::printf("LOCAL_RUN %s\n", std::string(chorus::to_string(first.finish().wait().state)).c_str());
  }
  chorus::Run run = chorus::init(opt, err);
  if (err) {
    std::fprintf(stderr, "init failed: %s\n", err.message().c_str());
    co_return 3;
  }
  if (!run) {
    // A rank that does not log in this mode (automatic, not the primary)
    // stops here without a value.
    std::printf("INACTIVE\n");
    std::printf("FINISH_STATE %d %s\n", run.topology().rank, std::string(chorus::to_string(run.finish().wait().state)).c_str());
    co_return a.exit_code;
  }
  const int rank = run.topology().rank;
  if (a.print_pid) {
    std::printf("PID %d %d\n", rank, static_cast<int>(::getpid()));
    std::fflush(stdout);
  }
  run.define_metric("loss", chorus::Reduce::mean);
  run.define_metric("tokens", chorus::Reduce::sum);
  run.define_metric("lo", chorus::Reduce::min);
  run.define_metric("hi", chorus::Reduce::max);
  run.define_metric("only0", chorus::Reduce::first); // rank 0 logs it alone: declared, it keeps its plain name
  run.config({{"steps", a.steps}, {"optimizer", "sgd"}});
  if (a.histograms) run.define_metric("grad", chorus::Reduce::merge);
  chorus::Pending last;
  for (long s = a.start_step; s < a.steps; ++s) {
    if (s == a.pause_step) {
      chorus::Error e = co_await run.barrier("pause");
      std::printf("PAUSED %ld%s%s\n", s, e ? " " : "", e ? e.message().c_str() : "");
      std::fflush(stdout);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    if (rank == a.die_rank && s == a.die_step) {
      // Make sure what came before reached the host, then die without a word.
      (void)last.wait();
      ::kill(::getpid(), a.die_signal);
    }
    if (rank == a.throw_rank && s == a.throw_step) {
      (void)last.wait();
      // An exception that nothing catches, on a thread of the trainer's: std::terminate.
      std::thread([s] { throw std::runtime_error("boom at step " + std::to_string(s)); }).join();
    }
    if (rank == a.exit_rank && s == a.exit_step) {
      (void)last.wait();
      std::fflush(stdout);
      std::exit(a.exit_now);
    }
    if (rank == a.unwind_rank && s == a.unwind_step) {
      (void)last.wait();
      throw std::runtime_error("unwound at step " + std::to_string(s));
    }
    if (a.bad_keys) {
      const std::string long_key(300, 'k');
      run.log({{"", 1.0}, {"_x", 2.0}, {long_key, 3.0}, {"good", static_cast<double>(s)}}, {.step = s});
    }
    if (!a.hold_until.empty() && s + 1 == a.steps) hold_until(a.hold_until);
    const double r = rank, st = static_cast<double>(s);
    last = run.log({{"loss", r + st * 0.5}, {"tokens", 100.0 + r}, {"lo", st - r}, {"hi", st + r},
                    {"per_rank", r * 1000 + st}},
                   {.step = s});
    if (a.stop_on_error && last.ready()) {
      if (const chorus::Error e = last.wait()) {
        std::fprintf(stderr, "rank %d step %ld: %s\n", rank, s, e.message().c_str());
        break;
      }
    }
    if (a.bad_keys && s > 0) run.log({{"late", st}}, {.step = s - 1}); // backwards: refused by the run host
    chorus::Pending only0;
    if (rank == 0) only0 = run.log({{"only0", st}}, {.step = s});
    if (a.histograms) {
      const std::vector<float> v = e2e::histogram_values(rank, s);
      run.log_histogram("grad", v, {.step = s});
      const std::vector<double> d(v.begin(), v.end());
      run.log_histogram("act", d, {.step = s});
    }
    if (a.uneven && (rank == 0 || s % 2 == 0)) run.log({{"uneven", r * 1000 + st}}, {.step = s});
    if (a.ack_each) {
      const chorus::Error e1 = last.wait(), e2 = only0.wait();
      if (e1 || e2) std::fprintf(stderr, "rank %d step %ld: %s\n", rank, s, (e1 ? e1 : e2).message().c_str());
      else std::printf("ACKED %ld\n", s);
      std::fflush(stdout);
    }
    if (a.fork_every > 0 && (s + 1) % a.fork_every == 0) {
      std::fflush(stdout); // the child must not print the parent's buffer again
      std::fflush(stderr);
      const pid_t child = ::fork();
      if (child == 0) forked_child(run, s);
      if (child > 0) reap(child);
    }
    if (a.step_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(a.step_us));
    if (a.barrier_every > 0 && (s + 1) % a.barrier_every == 0) {
      std::string name = "b";
      name.append(std::to_string(s)); // (not "b" + ...: GCC 12's -Wrestrict misfires on it at -O3)
      chorus::Error e = co_await run.barrier(name);
      if (e) std::fprintf(stderr, "rank %d barrier %s: %s\n", rank, name.c_str(), e.message().c_str());
    }
  }
  if (!a.artifact.empty()) {
    chorus::Error e = co_await run.barrier("artifacts");
    const std::string name = "rank-" + std::to_string(rank) + "/" + a.artifact.substr(a.artifact.rfind('/') + 1);
    if (!e) e = co_await run.log_artifact(name, a.artifact, "model");
    if (e) std::fprintf(stderr, "rank %d artifact: %s\n", rank, e.message().c_str());
    else std::printf("ARTIFACT %d ok\n", rank);
  }
  run.summary({{"done", true}});
  if (a.no_finish) co_return a.exit_code; // the Run's destructor finishes
  const chorus::FinishOptions how{.exit_code = rank == a.fail_rank ? a.finish_code : 0};
  chorus::FinishResult r = co_await run.finish(how);
  if (r.error) std::fprintf(stderr, "rank %d finish: %s\n", rank, r.error.message().c_str());
  std::printf("FINISH_STATE %d %s\n", rank, std::string(chorus::to_string(r.state)).c_str());
  if (run.is_host()) std::printf("RUN_DIR=%s\n", r.run_dir.c_str());
  if (a.slow_exit_ms >= 0) {
    std::fflush(stdout);
    if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.slow_exit_ms / 2));
    std::exit(r.error ? 4 : a.exit_code); // the Run held: nothing unwinds
  }
  co_return r.error ? 4 : a.exit_code;
}

} // namespace

long slow_exit_ms = 0;

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    if (const char* r = std::getenv("RANK"); a.slow_exit_ms > 0 && r != nullptr && std::string_view(r) == "0") {
      // Registered before the run makes anything static: it runs after their destructors.
      slow_exit_ms = a.slow_exit_ms;
      std::atexit([] { std::this_thread::sleep_for(std::chrono::milliseconds(slow_exit_ms)); });
    }
    return chorus::sync_wait(work(std::move(a)));
  } catch (const std::exception& e) {
    std::printf("CAUGHT %s\n", e.what());
    return 5;
  }
}
