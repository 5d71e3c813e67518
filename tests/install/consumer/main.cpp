// Logs three steps into a run under argv[1] and prints the run directory.
#include <chorus/chorus.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  chorus::Options opt;
  opt.project = "consumer";
  opt.dir = argv[1];
  opt.read_env = false;
  opt.topology = chorus::Topology{};
  chorus::Run run = chorus::init(opt);
  run.define_metric("loss", chorus::Reduce::mean);
  for (int step = 0; step < 3; ++step) run.log({{"loss", 1.0 / (step + 1)}});
  chorus::FinishResult r = run.finish().wait();
  if (r.error) {
    std::fprintf(stderr, "%s\n", r.error.message().c_str());
    return 1;
  }
  std::printf("%s %llu\n", r.run_dir.c_str(), static_cast<unsigned long long>(r.rows));
  return 0;
}
