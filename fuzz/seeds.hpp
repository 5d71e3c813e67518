// Seeds made by the real encoders: `FUZZER -runs=0` with CHORUS_FUZZ_SEEDS=DIR
// set writes this target's seeds into DIR and exits (fuzz/smoke.sh does).
#pragma once

#include "runtime/core/wire.hpp"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace chorus::fuzz {

/// The frames of a small two-rank run, as its host logs them.
inline std::vector<std::vector<char>> sample_frames() {
  std::vector<std::vector<char>> frames;
  frames.push_back(core::wire::run_start(1'700'000'000'000'000, 2, R"({"id":"f1","project":"p","mode":"shared"})"));
  frames.push_back(core::wire::rank_joined(0, 1'700'000'000'000'001, 100, "h1"));
  frames.push_back(core::wire::rank_joined(1, 1'700'000'000'000'002, 101, "h2"));
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    std::vector<char> out;
    core::wire::BatchWriter b(out, rank);
    std::uint64_t seq = 0;
    b.key(1, "loss");
    b.define(++seq, 1, Reduce::mean);
    b.config(++seq, R"({"lr":0.1})");
    for (int s = 0; s < 3; ++s) {
      b.values(++seq, s, 1'700'000'000'000'100 + s, 1);
      b.value(1, 1.0 / (s + 1));
    }
    b.barrier(++seq, 1, 1000);
    b.summary(++seq, R"({"best":0.3})");
    b.key(2, "epoch");
    b.metric_view(++seq, 1, static_cast<std::uint8_t>(Summary::min), 2);
    b.refused(++seq, 3, Errc::invalid_key, 2, "metric key \"\" is empty", R"({"":1,"x":"a string"})");
    b.key(3, "grad");
    b.define(++seq, 3, Reduce::merge);
    const double grad[] = {-0.5, 0.0, 0.25, 1e-40, 3.0, 1e300};
    b.histogram(++seq, 0, 4, 1'700'000'000'000'150, 3, Histogram(std::span<const double>(grad)));
    if (rank == 0)
      b.finish(++seq);
    else
      b.finish_ended(++seq, RunState::killed, 15, "stopped by SIGTERM");
    frames.push_back(std::move(out));
  }
  frames.push_back(core::wire::rank_dead(1, 1'700'000'000'000'200, "heartbeat lost"));
  frames.push_back(core::wire::run_end(RunState::finished, 1'700'000'000'000'300));
  frames.push_back(core::wire::rank_exit(0, 1'700'000'000'000'400, 3));
  return frames;
}

/// If CHORUS_FUZZ_SEEDS names a directory, writes `seeds` there as seed-N and exits.
inline void write_seeds_if_asked(const std::vector<std::string>& seeds) {
  const char* dir = std::getenv("CHORUS_FUZZ_SEEDS");
  if (dir == nullptr || *dir == '\0') return;
  for (std::size_t i = 0; i < seeds.size(); ++i)
    std::ofstream(std::string(dir) + "/seed-" + std::to_string(i), std::ios::binary) << seeds[i];
  std::exit(0);
}

} // namespace chorus::fuzz
