// Separate hosts on one machine for the multi-node tests: a network
// namespace per node, each joined by a veth pair to a bridge that lives in a
// namespace of its own, so nothing is added to the machine's own network
// and deleting the namespaces removes every link. Needs root; where
// namespaces cannot be made (no CAP_NET_ADMIN) the test is skipped.
#pragma once

#include "harness.hpp"
#include "tests/gpu.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fcntl.h>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace e2e {

/// Runs `cmd` through sh, its output discarded; its exit status.
inline int quiet(const std::string& cmd) { return run(cmd + " >/dev/null").status; }

/// Seconds of CPU (user and system) in `u`.
inline double cpu_seconds(const rusage& u) {
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

/// A process started through sh in a process group of its own, its output
/// (stdout and stderr) going to `log`.
class Process {
public:
  Process(const std::string& cmd, const fs::path& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (pid_ > 0) ::setpgid(pid_, pid_);
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() { kill(); }

  /// Its exit code (128 + S for signal S), once it ended within `limit`.
  std::optional<int> wait_for(std::chrono::milliseconds limit) {
    if (status_) return status_;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (pid_ > 0) {
      int st = 0;
      const pid_t r = ::wait4(pid_, &st, WNOHANG, &usage_);
      if (r == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (r < 0 && errno != EINTR) break;
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }

  /// SIGKILL to its group, then reaped.
  void kill() {
    if (pid_ <= 0 || status_) return;
    ::kill(-pid_, SIGKILL);
    wait_for(std::chrono::seconds(10));
  }

  pid_t pid() const { return pid_; }
  /// Its resource use once it ended (wait4): its own and that of the
  /// children it waited for, e.g. the ranks of a `chorus launch`.
  const rusage& usage() const { return usage_; }

private:
  pid_t pid_ = -1;
  std::optional<int> status_;
  rusage usage_{};
};

/// `n` hosts chorus-<pid>-n0.. on the bridge of chorus-<pid>-br, at
/// 10.A.B.1.. (A.B from this process's id, so that concurrent test
/// programs are told apart in `ip netns list` and in their logs).
class Hosts {
public:
  explicit Hosts(int n) : n_(n) {
    if (::geteuid() != 0) chorus::test::skip_test("the multi-node tests make network namespaces and need root");
    remove_stale();
    const auto pid = static_cast<unsigned>(::getpid());
    prefix_ = "chorus-" + std::to_string(pid) + "-";
    subnet_ = "10." + std::to_string(100 + (pid >> 8) % 150) + "." + std::to_string(pid % 256) + ".";
    if (quiet("ip netns add " + bridge_ns())) {
      chorus::test::skip_test("'ip netns add' fails here (no CAP_NET_ADMIN, e.g. in a container): "
                              "the multi-node tests need network namespaces");
    }
    made_.push_back(bridge_ns());
    try {
      connect();
    } catch (...) {
      for (const std::string& name : made_) remove(name);
      throw;
    }
  }
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  ~Hosts() {
    for (const std::string& name : made_) remove(name);
  }

  std::string ns(int i) const { return prefix_ + "n" + std::to_string(i); }
  std::string address(int i) const { return subnet_ + std::to_string(i + 1); }
  /// A command prefix that runs what follows on node `i`.
  std::string on(int i) const { return "ip netns exec " + ns(i) + " "; }

  /// Takes node `i` off the network: its bridge port goes down, so its
  /// packets are dropped without a reset, as when a cable is pulled.
  void cut(int i) { must("ip -n " + bridge_ns() + " link set " + veth(i) + " down"); }

  /// SIGKILL to every process on node `i` and to its process group.
  void kill_all(int i) const { kill_in(ns(i)); }

private:
  std::string bridge_ns() const { return prefix_ + "br"; }
  std::string veth(int i) const { return "v" + std::to_string(i); }

  void connect() {
    must("ip -n " + bridge_ns() + " link add br0 type bridge");
    must("ip -n " + bridge_ns() + " link set br0 up");
    for (int i = 0; i < n_; ++i) {
      const std::string node = ns(i), v = veth(i);
      must("ip netns add " + node);
      made_.push_back(node);
      must("ip -n " + bridge_ns() + " link add " + v + " type veth peer name eth0 netns " + node);
      must("ip -n " + bridge_ns() + " link set " + v + " master br0 up");
      must("ip -n " + node + " link set lo up");
      must("ip -n " + node + " addr add " + address(i) + "/24 dev eth0");
      must("ip -n " + node + " link set eth0 up");
    }
    // Links come up asynchronously; the ranks retry their dial anyway, but a
    // node whose link never comes up is a broken setup, not a failing run.
    for (int i = 0; i < n_; ++i) {
      for (int tries = 0; run("ip -n " + ns(i) + " -o link show eth0").text.find("state UP") == std::string::npos; ++tries) {
        if (tries == 250) throw std::runtime_error("eth0 of " + ns(i) + " does not come up");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  static void must(const std::string& cmd) {
    Output out = run(cmd);
    if (out.status != 0) throw std::runtime_error("'" + cmd + "' failed: " + out.text);
  }

  static void kill_in(const std::string& name) {
    std::istringstream pids(run("ip netns pids " + name).text);
    for (long p; pids >> p;) {
      const pid_t group = ::getpgid(static_cast<pid_t>(p));
      if (group > 0 && group != ::getpgrp()) ::kill(-group, SIGKILL);
      ::kill(static_cast<pid_t>(p), SIGKILL);
    }
  }

  static void remove(const std::string& name) {
    kill_in(name);
    quiet("ip netns del " + name + " 2>/dev/null");
  }

  /// Namespaces left by a test program that died before its cleanup.
  static void remove_stale() {
    std::istringstream list(run("ip netns list").text);
    for (std::string line; std::getline(list, line);) {
      const std::string name = line.substr(0, line.find(' '));
      long pid = 0;
      char rest[32] = {};
      if (std::sscanf(name.c_str(), "chorus-%ld-%31s", &pid, rest) != 2 || pid <= 0) continue;
      if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) remove(name);
    }
  }

  int n_;
  std::string prefix_, subnet_;
  std::vector<std::string> made_;
};

/// A job on `nodes` hosts: a disk each (a CHORUS_DIR of its own), the job's
/// credentials (`chorus certs`, mutual TLS between nodes, as a real
/// multi-node job's links must be), and on each node a `chorus launch` of
/// `per_node` ranks under --nnodes, whose ranks of other nodes reach the run
/// host only through MASTER_ADDR (node 0's address).
class Cluster {
public:
  Cluster(int nodes, int per_node) : node_count(nodes), ranks_per_node(per_node), hosts(nodes) {
    for (int k = 0; k < node_count; ++k) fs::create_directories(disk(k));
    const fs::path creds = dir.path / "creds";
    const Output made = run(bin("chorus") + " certs " + creds.string());
    if (made.status != 0) throw std::runtime_error("chorus certs failed: " + made.text);
    credentials = "CHORUS_TLS_DIR=" + creds.string();
  }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const int node_count, ranks_per_node;
  TempDir dir;
  Hosts hosts;
  // Each host has ports of its own: one port serves every test program.
  int port = 29400;
  std::string credentials; // CHORUS_TLS_DIR=..., made once for the job
  std::vector<std::unique_ptr<Process>> launches; // destroyed first: SIGKILL to what is left

  int world() const { return node_count * ranks_per_node; }
  fs::path disk(int k) const { return dir.path / ("node" + std::to_string(k)); }
  fs::path log(int k) const { return dir.path / ("node" + std::to_string(k) + ".out"); }

  /// The command that runs node `k`'s launch of `trainer` (a command line)
  /// in the job `run_id`, with `env` ("NAME=value ...") beside the credentials.
  std::string launch_command(int k, const std::string& env, const std::string& run_id, const std::string& trainer) const {
    return hosts.on(k) + "env " + credentials + " " + env + " CHORUS_DIR=" + disk(k).string() + " " + bin("chorus") +
           " launch -n " + std::to_string(ranks_per_node) + " --master-port " + std::to_string(port) + " --nnodes " +
           std::to_string(node_count) + " --node-rank " + std::to_string(k) + " --master-addr " + hosts.address(0) +
           " --run-id " + run_id + " -- " + trainer;
  }

  /// Starts every node's launch of `trainer` at once, each node's output to log(k).
  void start_trainer(const std::string& env, const std::string& run_id, const std::string& trainer) {
    for (int k = 0; k < node_count; ++k)
      launches.push_back(std::make_unique<Process>(launch_command(k, env, run_id, trainer), log(k)));
  }

  /// Starts every node's launch of chorus_e2e_worker with `worker_args`.
  void start(const std::string& env, const std::string& run_id, const std::string& worker_args) {
    start_trainer(env, run_id, bin("chorus_e2e_worker") + " " + worker_args);
  }

  /// Each launch's exit code, or -1 where it did not end within `limit`.
  std::vector<int> wait_all(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<int> codes;
    for (auto& l : launches) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      codes.push_back(l->wait_for(std::max(left, std::chrono::milliseconds(0))).value_or(-1));
    }
    return codes;
  }

  std::string logs() const {
    std::string text;
    for (int k = 0; k < node_count; ++k) text += "--- node " + std::to_string(k) + "\n" + slurp(log(k));
    return text;
  }
};

/// Checks what run.json says of a run of a Cluster's job that ended, by its
/// places' states: `last_step` is that of each finished place.
inline void check_run_json(const fs::path& rd, const std::string& mode, const std::string& scope, int nodes,
                           std::size_t run_world, const std::vector<std::string>& rank_states, std::int64_t last_step) {
  simdjson::dom::parser parser;
  auto info = read_run_json(parser, rd);
  BOOST_TEST(std::string_view(info["mode"].get_string()) == mode);
  BOOST_TEST(std::string_view(info["scope"].get_string()) == scope);
  BOOST_TEST(int64_t(info["nodes"].get_int64()) == nodes);
  BOOST_TEST(int64_t(info["world_size"].get_int64()) == static_cast<int64_t>(run_world));
  std::vector<std::string> states;
  for (auto r : info["ranks"].get_array()) {
    states.emplace_back(std::string_view(r["state"].get_string()));
    if (states.back() == "finished") BOOST_TEST(int64_t(r["last_step"].get_int64()) == last_step);
  }
  BOOST_TEST(states == rank_states, boost::test_tools::per_element());
}

} // namespace e2e
