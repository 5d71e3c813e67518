#define BOOST_TEST_MODULE e2e_hostile_peer
#include <boost/test/unit_test.hpp>

#include "tests/e2e/harness.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

using namespace chorus::test;
using namespace e2e;

namespace {

std::string rank_cmd(const fs::path& dir, const fs::path& sockets, int port, int r, const std::string& args) {
  return "CHORUS_DIR=" + dir.string() + " CHORUS_SOCKET_DIR=" + sockets.string() + " CHORUS_PORT=" +
         std::to_string(port) + " CHORUS_RUN_ID=attacked RANK=" + std::to_string(r) + " LOCAL_RANK=" +
         std::to_string(r) + " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
         std::to_string(port + 1) + " " + bin("chorus_e2e_worker") + " " + args;
}

} // namespace

// A process that reaches the run host through its socket sends every kind of
// message, anonymously and as itself: the run ends exactly as its two real
// ranks made it.
BOOST_AUTO_TEST_CASE(a_foreign_process_on_the_socket_changes_nothing_in_the_run) {
  TempDir dir;
  const fs::path sockets = dir.path / "sockets";
  const int port = test_port(41);
  const std::string args = "--steps 300 --step-us 10000";
  const Output out = run("(" + rank_cmd(dir.path, sockets, port, 0, args) + " & p0=$!; " +
                         rank_cmd(dir.path, sockets, port, 1, args) + " & p1=$!; " + bin("chorus_hostile_peer") + " " +
                         sockets.string() + " " + std::to_string(port) + "; wait $p0; s0=$?; wait $p1; s1=$?; " +
                         "echo \"STATUS $s0 $s1\")");
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.text.find("connected") != std::string::npos);
  BOOST_TEST(out.text.find("STATUS 0 0") != std::string::npos);
  BOOST_TEST(out.text.find("nccl id: not given") != std::string::npos);
  BOOST_TEST(out.text.find("join: refused rank 1 belongs to another job") != std::string::npos);
  const auto runs = find_runs(dir.path);
  BOOST_REQUIRE(runs.size() == 1);
  simdjson::dom::parser parser;
  auto run_json = read_run_json(parser, runs[0]);
  BOOST_TEST(std::string_view(run_json["state"].get_string().value()) == "finished");
  BOOST_TEST(run_json["rejected"].get_uint64().value() == 0u);
  for (auto r : run_json["ranks"].get_array())
    BOOST_TEST(std::string_view(r["state"].get_string().value()) == "finished");
  check_worker_history(runs[0], {0, 1}, 300);
  BOOST_TEST(slurp(runs[0] / "history.jsonl").find("evil") == std::string::npos);
  if (fs::exists(runs[0] / "system.jsonl"))
    BOOST_TEST(slurp(runs[0] / "system.jsonl").find("injected") == std::string::npos);
  // 64 MiB of malformed frames came; none of it is in the WAL.
  BOOST_TEST(fs::file_size(runs[0] / "wal") < (8u << 20));
}

// Another user's process finds no door: the socket refuses it and nothing
// listens on TCP, so no header of its ever reaches CAF.
BOOST_AUTO_TEST_CASE(another_user_cannot_reach_the_run_host) {
  if (::geteuid() != 0) {
    std::printf("skipped: needs root to act as another user\n");
    return;
  }
  TempDir dir;
  const fs::path sockets = dir.path / "sockets";
  const int port = test_port(42);
  fs::permissions(dir.path, fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);
  const std::string args = "--steps 200 --step-us 10000";
  const Output out = run("(" + rank_cmd(dir.path, sockets, port, 0, args) + " & p0=$!; " +
                         rank_cmd(dir.path, sockets, port, 1, args) + " & p1=$!; sleep 0.7; " +
                         bin("chorus_hostile_peer") + " " + sockets.string() + " " + std::to_string(port) +
                         " --as-nobody; wait $p0; s0=$?; wait $p1; s1=$?; echo \"STATUS $s0 $s1\")");
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.text.find("socket: Permission denied") != std::string::npos);
  BOOST_TEST(out.text.find("tcp: Connection refused") != std::string::npos);
  BOOST_TEST(out.text.find("STATUS 0 0") != std::string::npos);
  const auto runs = find_runs(dir.path);
  BOOST_REQUIRE(runs.size() == 1);
  check_worker_history(runs[0], {0, 1}, 200);
}

namespace {

/// A shell command that runs rank `r` of a two-rank run with `env`, its
/// output in dir/r<r>.out, and keeps its pid in $p<r>.
std::string start_rank(const fs::path& dir, int r, const std::string& env, const std::string& args) {
  return "env " + env + " RANK=" + std::to_string(r) + " " + bin("chorus_e2e_worker") + " " + args + " >" +
         (dir / ("r" + std::to_string(r) + ".out")).string() + " 2>&1 & p" + std::to_string(r) + "=$!; ";
}

/// Waits until rank 1 has joined (it printed its pid), runs `attacker`, lets
/// the ranks finish, and prints their exit codes and what they wrote.
std::string attack_run(const fs::path& dir, const std::string& attacker) {
  const std::string r1 = (dir / "r1.out").string();
  return "for i in $(seq 400); do grep -q 'PID 1 ' " + r1 + " 2>/dev/null && break; sleep 0.05; done; " + attacker +
         "; touch " + (dir / "go").string() + "; wait $p0; s0=$?; wait $p1; s1=$?; cat " + (dir / "r0.out").string() +
         " " + r1 + "; echo \"STATUS $s0 $s1\"";
}

/// What the run held at its end: finished, every value of both ranks, no forged one.
void check_whole(const fs::path& root, int steps) {
  const auto runs = find_runs(root);
  BOOST_REQUIRE(runs.size() == 1);
  simdjson::dom::parser parser;
  auto run_json = read_run_json(parser, runs[0]);
  BOOST_TEST(std::string_view(run_json["state"].get_string().value()) == "finished");
  BOOST_TEST(run_json["rejected"].get_uint64().value() == 0u);
  for (auto r : run_json["ranks"].get_array())
    BOOST_TEST(std::string_view(r["state"].get_string().value()) == "finished");
  check_worker_history(runs[0], {0, 1}, steps);
  BOOST_TEST(slurp(runs[0] / "history.jsonl").find("evil") == std::string::npos);
}

/// The attacks chorus_hostile_peer --forge makes, and the cause each is cut for.
const std::vector<std::pair<std::string, std::string>> forgeries{
    {"routed fin_tmo as the run", "sent a routed message"},
    {"routed batch as rank 1", "sent a routed message"},
    {"routed ack to rank 1", "sent a routed message"},
    {"down as rank 1", "sent a down message in the name of another node than the one its handshake announced"},
    {"monitor as rank 1", "sent a monitor message in the name of another node than the one its handshake announced"},
    {"handshake as the host", "sent a handshake in this process's own name"},
    {"handshake as rank 1", "sent a handshake in the name of a node that another link of this process is with"},
    {"message before the handshake", "sent a direct message before its client handshake"},
    {"forwarding stack", "sent a message with a forwarding stack"},
    {"link to the run", "sent a link message"},
    {"1 GiB handshake", "sent a message header claiming 1073741824 bytes"},
    {"1 GiB message", "sent a message header claiming 1073741824 bytes"},
};

/// Every forgery was cut, each with its line from the host, and the host's
/// memory did not grow by the 1 GiB the headers claimed.
void check_cut(const std::string& text) {
  for (const auto& [attack, line] : forgeries) {
    BOOST_TEST(text.find("ATTACK " + attack + ": cut") != std::string::npos, attack);
    BOOST_TEST(text.find(line) != std::string::npos, line);
  }
  long before = 0, peak = 0;
  const auto at = text.find("MEMORY ");
  BOOST_REQUIRE(at != std::string::npos);
  std::istringstream(text.substr(at + 7)) >> before >> peak;
  BOOST_TEST(before > 0);
  BOOST_TEST(peak < before + 256 * 1024, "host VmRSS " << before << " kB before, VmHWM " << peak << " kB after");
}

} // namespace

// BASP forged by hand on the run host's socket: routed messages claiming the
// host's own node (the Run actor's finish timer) or rank 1's (a batch as its
// RankProxy; an ack the host would have routed on to rank 1), down and
// monitor messages and handshakes in another node's name, messages before
// the handshake, a forwarding stack, a link message, headers claiming 1 GiB,
// and connections that stay silent. Each is cut with a line naming why, the
// host's memory stays where it was, and the run ends as its ranks made it.
BOOST_AUTO_TEST_CASE(forged_basp_on_the_socket_is_cut_and_the_run_is_whole) {
  TempDir dir;
  const fs::path sockets = dir.path / "sockets";
  const int port = test_port(43);
  const int patience = 2 * sanitizer_slowdown; // CHORUS_CONNECTION_TIMEOUT, seconds
  const std::string env = "CHORUS_DIR=" + dir.path.string() + " CHORUS_SOCKET_DIR=" + sockets.string() +
                          " CHORUS_PORT=" + std::to_string(port) + " CHORUS_RUN_ID=forged WORLD_SIZE=2 "
                          "LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(port + 1) + " CHORUS_CONNECTION_TIMEOUT=" + std::to_string(patience) +
                          " CHORUS_HEARTBEAT_INTERVAL=0.5";
  const std::string args = "--steps 100 --step-us 2000 --print-pid 1 --hold-until " + (dir.path / "go").string();
  const Output out = run("(" + start_rank(dir.path, 0, env + " LOCAL_RANK=0", args) +
                         start_rank(dir.path, 1, env + " LOCAL_RANK=1", args) +
                         attack_run(dir.path, bin("chorus_hostile_peer") + " " + sockets.string() + " " +
                                                  std::to_string(port) + " --forge $p0 $p1 --silent 32") +
                         ")");
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.text.find("connected") != std::string::npos);
  BOOST_TEST(out.text.find("STATUS 0 0") != std::string::npos);
  check_cut(out.text);
  // Silent connections, before a handshake and after one, are closed.
  BOOST_TEST(out.text.find("SILENT 32 of 32 closed") != std::string::npos);
  BOOST_TEST(out.text.find("ATTACK silent after the handshake: cut") != std::string::npos);
  check_whole(dir.path, 100);
}

// The same forgeries over TCP, where CHORUS_INSECURE=1 lets any peer reach a
// run that spans nodes (two nodes of one rank each, on this machine).
BOOST_AUTO_TEST_CASE(forged_basp_over_insecure_tcp_is_cut_and_the_run_is_whole) {
  TempDir dir;
  const int port = test_port(44);
  const std::string env = "CHORUS_INSECURE=1 CHORUS_MODE=shared CHORUS_PORT=" + std::to_string(port) +
                          " CHORUS_RUN_ID=forged WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 "
                          "MASTER_PORT=" + std::to_string(port + 1) + " CHORUS_INIT_TIMEOUT=" +
                          std::to_string(20 * sanitizer_slowdown);
  const std::string args = "--steps 100 --step-us 2000 --print-pid 1 --hold-until " + (dir.path / "go").string();
  const Output out = run("(" + start_rank(dir.path, 0, env + " GROUP_RANK=0 CHORUS_DIR=" + (dir.path / "node0").string(), args) +
                         start_rank(dir.path, 1, env + " GROUP_RANK=1 CHORUS_DIR=" + (dir.path / "node1").string(), args) +
                         attack_run(dir.path, bin("chorus_hostile_peer") + " none " + std::to_string(port) +
                                                  " --forge $p0 $p1 --tcp 127.0.0.1") +
                         ")");
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.text.find("connected") != std::string::npos);
  BOOST_TEST(out.text.find("STATUS 0 0") != std::string::npos);
  BOOST_TEST(out.text.find("WARNING: CHORUS_INSECURE=1") != std::string::npos);
  check_cut(out.text);
  check_whole(dir.path / "node0", 100);
}
