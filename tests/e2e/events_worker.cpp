// A rank of the events tests (tests/e2e/events_test.cpp): every rank logs
// "loss" (declared mean) at steps 0..N-1, one step every --step-ms, and
// misbehaves on request; rank 0 takes the run's events with Run::on_event on
// an executor of its own thread and prints each as
//   EVENT <kind> rank=<r> step=<s> key=<k> ranks=<a,b> state=<state> thread=<own|chorus>
// ("own": the callback ran on the executor's thread, as it must), and
// before it finishes waits (at most 60 s) for the event --wait-for names.
//   events_worker [--steps N] [--step-ms M] [--stall-rank R --stall-step S --stall-ms T]
//                 [--nan-rank R --nan-step S] [--term-rank R --term-step S]
//                 [--rule-above X] [--wait-for KIND] [--exit-after-finish C]
// --stall-rank sleeps T ms at step S (a rank that hangs, then goes on);
// --term-rank raises SIGTERM at step S (chorus ends it killed);
// --rule-above declares alert_when("loss", above(X)); --exit-after-finish
// calls exit(C) after the finish, the Run still held (its host hears it).
#include <chorus/chorus.hpp>

#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace {

/// A user's executor: one thread that runs what is posted, in order.
class ThreadExecutor final : public chorus::Executor {
public:
  ThreadExecutor() : thread_([this] { loop(); }) {}
  ~ThreadExecutor() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::coroutine_handle<> h) override {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(h);
    }
    cv_.notify_all();
  }
  [[nodiscard]] std::thread::id id() const { return thread_.get_id(); }

private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto h = queue_.front();
      queue_.pop_front();
      lock.unlock();
      h.resume();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::coroutine_handle<>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

struct Args {
  long steps = 30, step_ms = 20;
  int stall_rank = -1, nan_rank = -1, term_rank = -1;
  long stall_step = -1, stall_ms = 0, nan_step = -1, term_step = -1;
  double rule_above = 0;
  bool rule = false;
  std::string wait_for;
  int exit_after_finish = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (k == "--steps") a.steps = v;
    else if (k == "--step-ms") a.step_ms = v;
    else if (k == "--stall-rank") a.stall_rank = static_cast<int>(v);
    else if (k == "--stall-step") a.stall_step = v;
    else if (k == "--stall-ms") a.stall_ms = v;
    else if (k == "--nan-rank") a.nan_rank = static_cast<int>(v);
    else if (k == "--nan-step") a.nan_step = v;
    else if (k == "--term-rank") a.term_rank = static_cast<int>(v);
    else if (k == "--term-step") a.term_step = v;
    else if (k == "--rule-above") {
      a.rule = true;
      a.rule_above = std::strtod(argv[i + 1], nullptr);
    } else if (k == "--wait-for") a.wait_for = argv[i + 1];
    else if (k == "--exit-after-finish") a.exit_after_finish = static_cast<int>(v);
    else {
      std::fprintf(stderr, "events_worker: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

} // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  chorus::Options opt;
  opt.mode = chorus::Mode::shared;
  chorus::Run run = chorus::init(opt);
  const int rank = run.topology().rank;
  ThreadExecutor executor;
  std::mutex mu;
  std::condition_variable cv;
  bool waited_for = a.wait_for.empty();
  bool finished_seen = false;
  bool failed_end_seen = false; // a run_finished that says failed
  if (rank == 0) {
    std::printf("RUN_DIR=%s\n", std::string(run.dir()).c_str());
    std::fflush(stdout);
    run.on_event(
        [&](const chorus::Event& e) {
          std::string ranks;
          for (int r : e.ranks) ranks.append(ranks.empty() ? "" : ",").append(std::to_string(r));
          std::printf("EVENT %s rank=%d step=%lld key=%s ranks=%s state=%s thread=%s\n",
                      std::string(chorus::to_string(e.kind)).c_str(), e.rank, static_cast<long long>(e.step),
                      e.key.c_str(), ranks.c_str(), std::string(chorus::to_string(e.state)).c_str(),
                      std::this_thread::get_id() == executor.id() ? "own" : "chorus");
          std::fflush(stdout);
          std::lock_guard lock(mu);
          if (chorus::to_string(e.kind) == a.wait_for) waited_for = true;
          if (e.kind == chorus::EventKind::run_finished) finished_seen = true;
          if (e.kind == chorus::EventKind::run_finished && e.state == chorus::RunState::failed) failed_end_seen = true;
          cv.notify_all();
        },
        executor);
  }
  (void)run.define_metric("loss", chorus::Reduce::mean);
  if (a.rule) (void)run.alert_when("loss", chorus::above(a.rule_above));
  for (long s = 0; s < a.steps; ++s) {
    if (rank == a.stall_rank && s == a.stall_step)
      std::this_thread::sleep_for(std::chrono::milliseconds(a.stall_ms));
    if (rank == a.term_rank && s == a.term_step) std::raise(SIGTERM);
    const double loss = rank == a.nan_rank && s == a.nan_step ? std::nan("") : 1.0 / static_cast<double>(s + 1);
    (void)run.log({{"loss", loss}}, {.step = s});
    std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
  }
  if (rank == 0) {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return waited_for; }))
      std::printf("NO EVENT %s\n", a.wait_for.c_str());
  }
  const chorus::FinishResult r = run.finish().wait();
  std::printf("FINISH_STATE %d %s\n", rank, std::string(chorus::to_string(r.state)).c_str());
  std::fflush(stdout);
  if (rank != 0 && a.exit_after_finish != 0) std::exit(a.exit_after_finish);
  // The run's last event reaches rank 0's executor before it goes.
  if (rank == 0) {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return finished_seen; })) std::printf("NO run_finished\n");
    // The run host (this process) stays until another rank's exit status has amended the run's end.
    if (a.exit_after_finish != 0 &&
        !cv.wait_for(lock, std::chrono::seconds(30), [&] { return failed_end_seen; }))
      std::printf("NO amended end\n");
  }
  return 0;
}
