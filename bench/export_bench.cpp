// bench_export: `chorus export` of a long run. A run of 1,000,000 rows by 20
// metrics (history.jsonl of some 500 MB) goes out as CSV and as JSON lines,
// and its first 100,000 rows as TensorBoard event files; each in a process
// of its own, timed, with its peak resident memory (getrusage of the child).
// The reference is reading the same file once, with nothing done to it (a
// process that counts its lines, wc -l): the floor any export stands on.
// Memory must stay bounded by the keys, not the rows.
#include "bench.hpp"

#include <sys/resource.h>

#include <cinttypes>
#include <random>

namespace {

struct Measured {
  double seconds = 0;
  double peak_mib = 0;
  int status = -1;
};

/// Runs `argv` with its output to /dev/null; its wall time and peak RSS.
Measured run(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  const std::int64_t t0 = bench::now_ns();
  pid_t pid = 0;
  Measured m;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) return m;
  posix_spawn_file_actions_destroy(&actions);
  int st = 0;
  rusage ru{};
  ::wait4(pid, &st, 0, &ru);
  m.seconds = static_cast<double>(bench::now_ns() - t0) / 1e9;
  m.peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0; // KiB on Linux
  m.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return m;
}

/// A run directory whose history has `rows` rows of `keys` metrics (a few
/// per-rank columns among them), as a run host writes it.
std::uint64_t write_run(const bench::fs::path& dir, std::int64_t rows, int keys) {
  bench::fs::create_directories(dir);
  std::ofstream(dir / "run.json") << R"({"id":"big","name":"big","project":"p","group":"g","state":"finished",)"
                                  << R"("start_time":1700000000,"end_time":1700001000,"world_size":4,"ranks":[]})"
                                  << "\n";
  std::FILE* f = std::fopen((dir / "history.jsonl").c_str(), "w");
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> u(0, 1);
  std::string line;
  char buf[64];
  for (std::int64_t s = 0; s < rows; ++s) {
    line = "{\"_step\":" + std::to_string(s) + ",\"_timestamp\":" + std::to_string(1700000000 + s / 100) +
           ",\"_runtime\":" + std::to_string(s / 100);
    for (int k = 0; k < keys; ++k) {
      const std::string key = k < 4 ? "loss/rank-" + std::to_string(k) : "train/metric_" + std::to_string(k);
      std::snprintf(buf, sizeof buf, "%.9g", u(gen));
      line.append(",\"").append(key).append("\":").append(buf);
    }
    line += "}\n";
    std::fwrite(line.data(), 1, line.size(), f);
  }
  std::fclose(f);
  return bench::fs::file_size(dir / "history.jsonl");
}

} // namespace

int main() {
  bench::TempDir tmp;
  const std::string chorus = std::string(CHORUS_BINARY_DIR) + "/bin/chorus";
  const bench::fs::path big = tmp.path / "p" / "g" / "big", small = tmp.path / "p" / "g" / "small";
  const std::uint64_t bytes = write_run(big, 1'000'000, 20);
  write_run(small, 100'000, 20);
  std::printf("history.jsonl: 1,000,000 rows x 20 metrics, %.0f MiB\n\n", static_cast<double>(bytes) / (1 << 20));

  const Measured floor = run({"/usr/bin/wc", "-l", (big / "history.jsonl").string()});
  const Measured csv = run({chorus, "export", big.string(), "--csv", (tmp.path / "h.csv").string()});
  const Measured jsonl = run({chorus, "export", big.string(), "--jsonl", (tmp.path / "h.jsonl").string(),
                              "--metric", "train/*"});
  const Measured floor_small = run({"/usr/bin/wc", "-l", (small / "history.jsonl").string()});
  const Measured tb = run({chorus, "export", small.string(), "--tensorboard", (tmp.path / "tb").string()});

  bench::Table t({"what", "rows", "seconds", "rows/s", "peak RSS MiB", "x reading the file", "exit"});
  auto row = [&](const char* what, std::int64_t rows, const Measured& m, const Measured& ref) {
    char s[32], r[32], p[32], x[32];
    std::snprintf(s, sizeof s, "%.2f", m.seconds);
    std::snprintf(r, sizeof r, "%.0f", static_cast<double>(rows) / m.seconds);
    std::snprintf(p, sizeof p, "%.1f", m.peak_mib);
    std::snprintf(x, sizeof x, "%.1f", m.seconds / ref.seconds);
    t.add({what, std::to_string(rows), s, r, p, x, std::to_string(m.status)});
  };
  row("read the file (wc -l)", 1'000'000, floor, floor);
  row("export --csv (two passes)", 1'000'000, csv, floor);
  row("export --jsonl --metric train/*", 1'000'000, jsonl, floor);
  row("read the file (wc -l)", 100'000, floor_small, floor_small);
  row("export --tensorboard (2M scalars)", 100'000, tb, floor_small);
  t.print();
  return csv.status == 0 && jsonl.status == 0 && tb.status == 0 ? 0 : 1;
}
