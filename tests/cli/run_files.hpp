// Run directories written by hand, as a run host leaves them, for the
// `chorus ls` and `chorus show` tests.
#pragma once

#include "tests/cli/process.hpp"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>

namespace chorus::test {

inline std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

struct RunSpec {
  std::string id;
  std::string state = "finished";
  int world = 4;
  int crashed = 0;
  std::string host = hostname();
  double start = 1'700'000'000.0;
  bool ended = true;
  int last_step = 99; // of each rank that did not crash (-1: run.json does not know it yet)
};

inline std::string run_json(const RunSpec& r, const std::filesystem::path& dir) {
  std::string ranks;
  for (int i = 0; i < r.world; ++i) {
    const bool dead = i < r.crashed;
    ranks += std::string(i ? "," : "") + R"({"rank":)" + std::to_string(i) + R"(,"state":")" +
             (dead ? "crashed" : r.state == "running" ? "running" : "finished") + R"(","last_step":)" +
             (dead ? "41" : std::to_string(r.last_step)) + R"(,"host":")" + r.host + R"(","message":")" + (dead ? "heartbeat lost" : "") +
             "\"}";
  }
  return R"({"id":")" + r.id + R"(","name":")" + r.id + R"(-name","project":"proj","group":"grp","mode":"shared",)" +
         R"("scope":"global","host":")" + r.host + R"(","pid":2147483000,"dir":")" + dir.string() + R"(","state":")" +
         r.state + R"(","start_time":)" + std::to_string(r.start) + R"(,"end_time":)" +
         (r.ended ? std::to_string(r.start + 95.0) : "null") + R"(,"world_size":)" + std::to_string(r.world) +
         R"(,"rows":100,"rejected":0,"ranks":[)" + ranks + "]}\n";
}

inline std::filesystem::path make_run(const std::filesystem::path& root, const std::string& project,
                                      const std::string& group, const RunSpec& r) {
  const std::filesystem::path dir = root / project / group / r.id;
  write_text(dir / "run.json", run_json(r, dir));
  return dir;
}

/// A machine that is not this one, for the runs hosted "elsewhere".
inline const std::string other_host = "node-elsewhere";

/// lease.json as the host of a run made by make_run (pid 2147483000 on
/// `host`) writes it, renewed `age_s` seconds ago by this machine's clock
/// (io/store/lease.hpp: it expires 30 s after).
inline void write_lease(const std::filesystem::path& dir, const std::string& host, double age_s) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() - age_s;
  write_text(dir / "lease.json", R"({"host":")" + host + R"(","pid":2147483000,"renewed":)" + std::to_string(now) +
                                     R"(,"interval":5,"expires":)" + std::to_string(now + 30) + "}\n");
}

// 100 rows of loss (every 10th NaN, one infinite), lr, and acc per rank.
inline std::string history(int rows = 100, int ranks = 2) {
  std::string h;
  for (int s = 0; s < rows; ++s) {
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s) +
         R"(,"_runtime":)" + std::to_string(s) + ",\"loss\":";
    h += s % 10 == 3 ? "\"NaN\"" : s == 50 ? "\"Infinity\"" : std::to_string(2.0 * std::exp(-s / 30.0));
    h += ",\"lr\":" + std::to_string(0.001 * (rows - s) / rows);
    for (int r = 0; r < ranks; ++r) h += ",\"acc/rank-" + std::to_string(r) + "\":" + std::to_string(s * 0.01 + r);
    h += R"(,"_count":{"loss":2}})"
         "\n";
  }
  return h;
}

} // namespace chorus::test
