// Shared by the benchmarks: clocks, percentiles, tables, temporary run
// directories, free ports, and starting copies of the running binary as the
// ranks of a job (what torchrun would do).
#pragma once

// The tests' own helpers, by a path from here: the benchmarks that use only
// the public API get no include path into the repository.
#include "../tests/socket.hpp"
#include "../tests/temp_dir.hpp"

#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace bench {

namespace fs = std::filesystem;
using clock = std::chrono::steady_clock;

/// Steady-clock nanoseconds: CLOCK_MONOTONIC, comparable across processes of one host.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
}

/// The q-quantile (0..1) of `v` by nearest rank; reorders `v`.
template <class T>
T quantile(std::vector<T>& v, double q) {
  if (v.empty()) return T{};
  auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

template <class T>
T median(std::vector<T> v) {
  return quantile(v, 0.5);
}

/// A plain-text table: columns sized to their widest cell, numbers right-aligned.
class Table {
public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print() const {
    std::vector<std::size_t> w(rows_[0].size(), 0);
    for (const auto& r : rows_)
      for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
    for (std::size_t n = 0; n < rows_.size(); ++n) {
      const auto& r = rows_[n];
      std::string line;
      for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) {
        const std::string pad(w[i] - r[i].size(), ' ');
        line += i == 0 ? r[i] + pad : "  " + pad + r[i];
      }
      std::printf("%s\n", line.c_str());
      if (n == 0) {
        std::size_t total = 0;
        for (std::size_t x : w) total += x + 2;
        std::printf("%s\n", std::string(total - 2, '-').c_str());
      }
    }
    std::fflush(stdout);
  }

private:
  std::vector<std::vector<std::string>> rows_;
};

inline std::string num(double v, int decimals = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

/// Figures of several tries, shown as their median, smallest and largest ("-" where there are none).
struct Spread {
  std::vector<double> v;
  int digits = 2;
  [[nodiscard]] std::string median() const { return v.empty() ? "-" : num(bench::median(v), digits); }
  [[nodiscard]] std::string min() const { return v.empty() ? "-" : num(*std::min_element(v.begin(), v.end()), digits); }
  [[nodiscard]] std::string max() const { return v.empty() ? "-" : num(*std::max_element(v.begin(), v.end()), digits); }
};

/// "met" or "MISSED", for a target column.
inline std::string verdict(bool ok) { return ok ? "met" : "MISSED"; }

using chorus::test::TempDir;

/// A TCP port on 127.0.0.1 that was free a moment ago; exits where none can be had.
inline int free_port() {
  const int port = chorus::test::free_port();
  if (port < 0) {
    std::perror("free_port");
    std::exit(2);
  }
  return port;
}

/// Two distinct free ports (MASTER_PORT for the launcher's store, CHORUS_PORT for the run host).
inline std::pair<int, int> two_free_ports() {
  const int a = free_port();
  int b = free_port();
  while (b == a) b = free_port();
  return {a, b};
}

/// A job of `world` local ranks, each this binary again with `args`, with
/// torchrun's environment plus `extra` (CHORUS_*). Each rank's stdout and
/// stderr go to `out_dir`/rank-N.out.
class Job {
public:
  Job(int world, const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& extra,
      const fs::path& out_dir)
      : out_dir_(out_dir) {
    const auto [master_port, chorus_port] = two_free_ports();
    for (int r = 0; r < world; ++r) {
      std::vector<std::pair<std::string, std::string>> env = {
          {"RANK", std::to_string(r)},
          {"LOCAL_RANK", std::to_string(r)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"GROUP_RANK", "0"},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(master_port)},
          {"CHORUS_PORT", std::to_string(chorus_port)},
      };
      env.insert(env.end(), extra.begin(), extra.end());
      pids_.push_back(spawn(args, env, out_dir / ("rank-" + std::to_string(r) + ".out")));
    }
  }

  /// Waits for every rank; true if all exited with 0.
  bool wait() {
    bool ok = true;
    for (std::size_t r = 0; r < pids_.size(); ++r) {
      int st = 0;
      ::waitpid(pids_[r], &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        ok = false;
        std::fprintf(stderr, "rank %zu failed (status %d):\n%s\n", r, st, output(static_cast<int>(r)).c_str());
      }
    }
    pids_.clear();
    return ok;
  }

  [[nodiscard]] std::string output(int rank) const {
    std::ifstream in(out_dir_ / ("rank-" + std::to_string(rank) + ".out"));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  /// The "name=value" lines a rank printed, as numbers.
  [[nodiscard]] std::map<std::string, double> figures(int rank) const {
    std::map<std::string, double> out;
    std::istringstream in(output(rank));
    std::string line;
    while (std::getline(in, line)) {
      const auto eq = line.find('=');
      if (eq == std::string::npos || line.compare(0, 6, "bench.") != 0) continue;
      out[line.substr(6, eq - 6)] = std::strtod(line.c_str() + eq + 1, nullptr);
    }
    return out;
  }

private:
  static pid_t spawn(const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& env,
                     const fs::path& out) {
    std::vector<std::string> env_text;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string s = *e;
      const bool replaced = std::any_of(env.begin(), env.end(), [&](const auto& kv) {
        return s.size() > kv.first.size() && s.compare(0, kv.first.size(), kv.first) == 0 && s[kv.first.size()] == '=';
      });
      if (!replaced) env_text.push_back(s);
    }
    for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_text) envp.push_back(s.data());
    envp.push_back(nullptr);

    std::string exe = "/proc/self/exe";
    std::vector<std::string> argv_text{exe};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_text) argv.push_back(s.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      std::fprintf(stderr, "posix_spawn: %s\n", std::strerror(rc));
      std::exit(2);
    }
    return pid;
  }

  fs::path out_dir_;
  std::vector<pid_t> pids_;
};

/// What a rank reports to the parent: one "bench.name=value" line.
inline void report(const char* name, double value) { std::printf("bench.%s=%.17g\n", name, value); }


/// The run directory a finished job left under `root` (the only one with a history.jsonl).
inline fs::path find_run_dir(const fs::path& root) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator(); ++it)
    if (it->path().filename() == "history.jsonl") return it->path().parent_path();
  return {};
}

} // namespace bench
