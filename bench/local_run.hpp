// A run for the benchmarks that time the public API in one process.
#pragma once

#include "bench.hpp"

#include <chorus/chorus.hpp>

#include <cstdio>
#include <cstdlib>

namespace bench {

/// A single-process run under `dir`, without system samples or the
/// environment's settings; exits with 3, saying why, where it cannot start.
inline chorus::Run local_run(const TempDir& dir) {
  chorus::Error err;
  chorus::Run run = chorus::init({.project = "bench",
                                  .dir = (dir.path / "runs").string(),
                                  .system_interval = 0,
                                  .read_env = false,
                                  .topology = chorus::Topology{}},
                                 err);
  if (err) {
    std::fprintf(stderr, "init failed: %s\n", err.message().c_str());
    std::exit(3);
  }
  return run;
}

} // namespace bench
