// bench_sdk_workload: the workload tracking SDKs publish their speed on —
// 10 runs one after another in one process, each 100 steps of 100 floats,
// init and finish included — beside its floor measured in the same process:
// the same values written as JSON lines into 10 files, one fdatasync each (a
// durable finish needs at least one). Each try runs the floor and chorus one
// after the other; the figures are medians over the tries, with chorus's
// phases apart: init (from the call until the first run.log returns), the
// logging, finish (from the last log's return until finish().wait()
// returns, the run committed and synced) and the handle's release after it
// (its actors stopped); the floor's fdatasync is timed apart too, as the
// finish's target is one fdatasync + 1 ms. The disk is synced (syncfs)
// before each side, outside the timing, so that neither pays for what the
// other left to the kernel's writeback.
//
//   bench_sdk_workload [TRIES]    (default 7)
#include "bench.hpp"

#include <chorus/chorus.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

namespace {

using bench::num;

constexpr int runs = 10;
constexpr int steps = 100;
constexpr int values = 100;

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "bench_sdk_workload: %s\n", why.c_str());
  std::exit(1);
}

double value_of(int run, int step, int k) { return 0.001 * step + 0.5 * k + run; }

/// Writes out everything dirty on `dir`'s file system (syncfs), outside any timing.
void settle_disk(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open " + dir.string() + ": " + std::strerror(errno));
  if (::syncfs(fd) != 0) fail("syncfs " + dir.string() + ": " + std::strerror(errno));
  ::close(fd);
}

struct Floor {
  double total = 0; // ms, the 10 runs
  double sync = 0;  // ms, one fdatasync (the mean of the 10)
};

/// The floor: the same rows as JSON lines, a file a run, one fdatasync each.
Floor floor_ms(const std::filesystem::path& dir) {
  std::array<std::string, values> keys;
  for (int k = 0; k < values; ++k) keys[k].append("\"m").append(std::to_string(k)).append("\":");
  std::filesystem::create_directories(dir);
  // One buffer for every run, its pages touched before the clock starts: the
  // floor pays for no page fault, whatever the allocator's state (where a
  // fault costs 10-20 µs, a buffer grown afresh each run cost the floor a third).
  std::string out(std::size_t{steps} * values * 32, ' ');
  const std::int64_t t0 = bench::now_ns();
  std::int64_t sync_ns = 0;
  char num_buf[32];
  for (int r = 0; r < runs; ++r) {
    const std::string run_dir = (dir / ("floor-" + std::to_string(r))).string();
    if (::mkdir(run_dir.c_str(), 0755) != 0) fail("mkdir " + run_dir);
    const int fd = ::open((run_dir + "/history.jsonl").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("open in " + run_dir);
    out.clear();
    for (int s = 0; s < steps; ++s) {
      out += "{\"_step\":";
      out += std::to_string(s);
      for (int k = 0; k < values; ++k) {
        out += ',';
        out += keys[k];
        const auto end = std::to_chars(num_buf, num_buf + sizeof num_buf, value_of(r, s, k)).ptr;
        out.append(num_buf, end);
      }
      out += "}\n";
    }
    if (::write(fd, out.data(), out.size()) != static_cast<ssize_t>(out.size())) fail("write");
    const std::int64_t s0 = bench::now_ns();
    if (::fdatasync(fd) != 0) fail("fdatasync");
    sync_ns += bench::now_ns() - s0;
    ::close(fd);
  }
  return {static_cast<double>(bench::now_ns() - t0) / 1e6, static_cast<double>(sync_ns) / 1e6 / runs};
}

struct Phases {
  double total = 0, init = 0, log = 0, finish = 0, release = 0; // ms, over the 10 runs
};

Phases chorus_ms(const std::filesystem::path& dir, int attempt) {
  std::array<std::string, values> names;
  for (int k = 0; k < values; ++k) names[k].append("m").append(std::to_string(k));
  std::array<chorus::Metric, values> row;
  for (int k = 0; k < values; ++k) row[k].key = names[k];
  Phases p;
  const std::int64_t t0 = bench::now_ns();
  std::int64_t freed = t0;
  for (int r = 0; r < runs; ++r) {
    chorus::Options opt;
    opt.read_env = false;
    opt.topology = chorus::Topology{};
    opt.dir = dir.string();
    opt.project = "bench";
    opt.run_id = "run-" + std::to_string(attempt) + "-" + std::to_string(r);
    opt.system_interval = 0;
    const std::int64_t a = bench::now_ns();
    std::optional<chorus::Run> run(chorus::init(opt));
    for (int k = 0; k < values; ++k) row[k].value = value_of(r, 0, k);
    run->log(row);
    const std::int64_t b = bench::now_ns();
    for (int s = 1; s < steps; ++s) {
      for (int k = 0; k < values; ++k) row[k].value = value_of(r, s, k);
      run->log(row);
    }
    const std::int64_t c = bench::now_ns();
    const chorus::FinishResult f = run->finish().wait();
    const std::int64_t d = bench::now_ns();
    run.reset();
    freed = bench::now_ns();
    if (f.error || f.rows != static_cast<std::uint64_t>(steps))
      fail("finish: " + f.error.message() + ", " + std::to_string(f.rows) + " rows");
    p.init += static_cast<double>(b - a) / 1e6;
    p.log += static_cast<double>(c - b) / 1e6;
    p.finish += static_cast<double>(d - c) / 1e6;
    p.release += static_cast<double>(freed - d) / 1e6;
  }
  p.total = static_cast<double>(bench::now_ns() - t0) / 1e6;
  return p;
}

} // namespace

int main(int argc, char** argv) {
  const int tries = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  bench::TempDir tmp("chorus-sdk-workload");
  bench::Spread floor, sync{.digits = 3}, total, ratio, init{.digits = 3}, log{.digits = 3}, finish{.digits = 3},
      release{.digits = 3}, over{.digits = 3};
  // One try of each first, not counted: the library's and the files' first use.
  floor_ms(tmp.path / "warm-floor");
  chorus_ms(tmp.path / "warm", -1);
  for (int t = 0; t < tries; ++t) {
    const std::filesystem::path d = tmp.path / std::to_string(t);
    std::filesystem::create_directories(d);
    // Each side starts from a disk with nothing of the other's left to write:
    // chorus leaves its end's files to the kernel's writeback, and a journaled
    // disk's next fdatasync would commit them as well, inside the floor's time.
    settle_disk(d);
    const Floor f = floor_ms(d);
    settle_disk(d);
    const Phases c = chorus_ms(d, t);
    floor.v.push_back(f.total);
    sync.v.push_back(f.sync);
    total.v.push_back(c.total);
    init.v.push_back(c.init / runs);
    log.v.push_back(c.log / runs);
    finish.v.push_back(c.finish / runs);
    release.v.push_back(c.release / runs);
    over.v.push_back(c.finish / runs - f.sync);
    ratio.v.push_back(c.total / f.total);
  }
  std::printf("10 runs one after another, 100 steps x 100 floats each, init and finish included; %d tries\n\n", tries);
  bench::Table t({"what", "median", "min", "max", "target", "verdict"});
  const auto add = [&](const std::string& what, const bench::Spread& s, double target = 0) {
    t.add({what, s.median(), s.min(), s.max(), target > 0 ? num(target, 1) : std::string(),
           target > 0 ? bench::verdict(bench::median(s.v) <= target) : std::string()});
  };
  add("floor: JSON lines, 10 files, one fdatasync each (ms)", floor);
  add("floor: one fdatasync (ms)", sync);
  add("chorus: 10 runs, init to finish (ms)", total);
  add("chorus / floor", ratio, 1.5);
  add("chorus, a run: init -> first log returns (ms)", init, 2);
  add("chorus, a run: 99 more log calls (ms)", log);
  add("chorus, a run: finish after the last log (ms)", finish);
  add("chorus, a run: its finish beyond the floor's fdatasync (ms)", over, 1);
  add("chorus, a run: the handle freed after finish (ms)", release);
  t.print();
  std::printf("\ntargets: chorus / floor <= 1.5; init -> first log <= 2 ms; finish <= one fdatasync + 1 ms (the "
              "floor's, the same try)\n");
  return 0;
}
