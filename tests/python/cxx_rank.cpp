// One rank of a test job, in C++: the same values as rank_worker.py logs, so
// that Python and C++ ranks can share one run (tests/python/test_jobs.py).
#include <chorus/chorus.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main() {
  const char* steps_env = std::getenv("STEPS");
  const int steps = steps_env ? std::atoi(steps_env) : 200;
  chorus::Options opt;
  opt.project = "jobs";
  opt.mode = chorus::Mode::shared;
  opt.config = {{"steps", steps}};
  chorus::Run run = chorus::init(opt);
  const int rank = run.topology().rank;
  run.define_metric("loss", chorus::Reduce::mean);
  run.define_metric("tokens", chorus::Reduce::sum);
  for (int s = 0; s < steps; ++s) {
    run.log({{"loss", double(rank + s)}, {"tokens", double(rank + 1)}, {"r", double(rank * 100000 + s)}});
    if ((s + 1) % 50 == 0) {
      std::string name = "b";
      name.append(std::to_string(s + 1)); // (not "b" + ...: GCC 12's -Wrestrict misfires on it at -O3)
      if (chorus::Error e = run.barrier(name).wait()) {
        std::fprintf(stderr, "barrier: %s\n", e.message().c_str());
        return 1;
      }
    }
  }
  const chorus::FinishResult r = run.finish().wait();
  if (run.is_host()) std::printf("RUN_DIR %s\n", r.run_dir.c_str());
  return r.error ? 1 : 0;
}
