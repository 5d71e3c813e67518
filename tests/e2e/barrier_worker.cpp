// A rank of the barrier tests (barriers_test.cpp): logs a step, then meets
// the others at two barriers, "epoch-0" and "epoch-1", then finishes.
//   barrier_worker --dir D [--late-rank R --late-ms MS] [--absent-rank A --timeout-ms T]
// --late-rank: every other rank calls barrier("epoch-0"), gives its frame
// 300 ms to reach the run host, then touches D/at-RANK; rank R waits until
// all have, then sleeps MS before it calls barrier(), so that the others
// wait at least MS there.
// --absent-rank: rank A does not reach epoch-1 within its timeout T (asked by
// every rank): it sleeps 2 T + 1 s first, then passes through it late.
// Each rank prints "BARRIER R NAME ok|error: ..." after each.
#include <chorus/chorus.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>

namespace {

struct Args {
  std::string dir;
  int late_rank = -1;
  long late_ms = 0;
  int absent_rank = -1;
  long timeout_ms = 0;
};

chorus::task<int> work(Args a) {
  chorus::Options opt;
  opt.project = "e2e";
  opt.mode = chorus::Mode::shared;
  opt.init_timeout = std::chrono::milliseconds(20'000);
  opt.finish_timeout = std::chrono::milliseconds(30'000);
  chorus::Error err;
  chorus::Run run = chorus::init(opt, err);
  if (err || !run) {
    std::fprintf(stderr, "init failed: %s\n", err.message().c_str());
    co_return 3;
  }
  const int rank = run.topology().rank, world = run.topology().world_size;
  auto report = [&](const char* name, const chorus::Error& e) {
    std::printf("BARRIER %d %s %s%s\n", rank, name, e ? "error: " : "ok", e ? e.message().c_str() : "");
    std::fflush(stdout);
  };
  run.log({{"loss", 1.0 + rank}}, {.step = 0});
  chorus::Pending at;
  if (rank == a.late_rank) {
    for (int r = 0; r < world; ++r)
      while (r != rank && ::access((a.dir + "/at-" + std::to_string(r)).c_str(), F_OK) != 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(a.late_ms));
    at = run.barrier("epoch-0");
  } else {
    at = run.barrier("epoch-0");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::ofstream(a.dir + "/at-" + std::to_string(rank)) << "here\n";
  }
  report("epoch-0", co_await at);
  run.log({{"loss", 2.0 + rank}}, {.step = 1});
  const std::chrono::milliseconds timeout(a.timeout_ms);
  if (rank == a.absent_rank) std::this_thread::sleep_for(2 * timeout + std::chrono::seconds(1));
  report("epoch-1", co_await run.barrier("epoch-1", timeout));
  const chorus::FinishResult r = co_await run.finish();
  if (run.is_host()) std::printf("RUN_DIR=%s\n", r.run_dir.c_str());
  co_return r.error ? 4 : 0;
}

} // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") a.dir = v;
    else if (k == "--late-rank") a.late_rank = std::atoi(v.c_str());
    else if (k == "--late-ms") a.late_ms = std::atol(v.c_str());
    else if (k == "--absent-rank") a.absent_rank = std::atoi(v.c_str());
    else if (k == "--timeout-ms") a.timeout_ms = std::atol(v.c_str());
  }
  return chorus::sync_wait(work(a));
}
