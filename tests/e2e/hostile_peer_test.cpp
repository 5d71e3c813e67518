#define BOOST_TEST_MODULE e2e_hostile_peer
#include <boost/test/unit_test.hpp>

#include "tests/e2e/harness.hpp"

#include <sys/stat.h>
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

} // namespace

// A process that reaches the run host through its socket sends every kind of
// message, anonymously and as itself: the run ends exactly as its two real
// ranks made it.
BOOST_AUTO_TEST_CASE(a_foreign_process_on_the_socket_changes_nothing_in_the_run) {
  TempDir dir;
  const fs::path sockets = dir.path / "sockets";
  const int port = test_port(41);
  // Long enough (9 s) for the run to outlast the attack below on a loaded
  // machine: a host that ended first answers no join.
  const std::string args = "--steps 300 --step-us 30000";
  const e2e::Output out = run("(" + rank_cmd(dir.path, sockets, port, 0, args) + " & p0=$!; " +
                         rank_cmd(dir.path, sockets, port, 1, args) + " & p1=$!; " + bin("chorus_hostile_peer") + " " +
                         sockets.string() + " " + std::to_string(port) + "; wait $p0; s0=$?; wait $p1; s1=$?; " +
                         "echo \"STATUS $s0 $s1\")");
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.text.find("connected") != std::string::npos);
  BOOST_TEST(out.text.find("STATUS 0 0") != std::string::npos);
  BOOST_TEST(out.text.find("nccl id: not given") != std::string::npos);
  BOOST_TEST(out.text.find("join: refused rank 1 belongs to another job") != std::string::npos);
  check_whole(dir.path, 300);
  const auto runs = find_runs(dir.path);
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
  const e2e::Output out = run("(" + rank_cmd(dir.path, sockets, port, 0, args) + " & p0=$!; " +
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
  const e2e::Output out = run("(" + start_rank(dir.path, 0, env + " LOCAL_RANK=0", args) +
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
  const e2e::Output out = run("(" + start_rank(dir.path, 0, env + " GROUP_RANK=0 CHORUS_DIR=" + (dir.path / "node0").string(), args) +
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

namespace {

/// lstat's mode bits, owner and entries of `p`, for a before and after.
std::string state_of(const fs::path& p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return "missing";
  std::string out = std::to_string(st.st_mode) + " " + std::to_string(st.st_uid);
  if (S_ISDIR(st.st_mode))
    for (auto& e : fs::directory_iterator(p)) out += " " + e.path().filename().string();
  return out;
}

} // namespace

// Another user made /tmp/chorus-<uid> first (here in a TMPDIR of the test's,
// sticky as /tmp is): the run's processes leave it as it is and meet in the
// next private directory. CHORUS_SOCKET_DIR naming a shared directory keeps
// its mode: the sockets go in a private subdirectory.
BOOST_AUTO_TEST_CASE(a_socket_directory_another_user_made_first_blocks_nothing) {
  if (::geteuid() != 0) {
    std::printf("skipped: needs root to act as another user\n");
    return;
  }
  TempDir dir;
  const fs::path tmp = dir.path / "tmp";
  fs::create_directory(tmp);
  ::chmod(tmp.c_str(), 01777);
  fs::permissions(dir.path, fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);
  const fs::path theirs = tmp / ("chorus-" + std::to_string(::geteuid()));
  fs::create_directory(theirs);
  std::ofstream((theirs / "their-file").string()) << "x";
  BOOST_REQUIRE(::chown((theirs / "their-file").c_str(), 65534, 65534) == 0);
  BOOST_REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
  ::chmod(theirs.c_str(), 0700);
  const std::string before = state_of(theirs);
  const fs::path shared = dir.path / "shared";
  fs::create_directory(shared);
  ::chmod(shared.c_str(), 01777);
  for (const std::string& where : {"TMPDIR=" + tmp.string(), "CHORUS_SOCKET_DIR=" + shared.string()}) {
    TempDir runs;
    const int port = test_port(where[0] == 'T' ? 45 : 46);
    const std::string env = "-u XDG_RUNTIME_DIR -u CHORUS_SOCKET_DIR " + where + " CHORUS_DIR=" + runs.path.string() +
                            " CHORUS_PORT=" + std::to_string(port) + " CHORUS_RUN_ID=shared-tmp WORLD_SIZE=2 "
                            "LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                            std::to_string(port + 1);
    const std::string args = "--steps 50 --print-pid 1";
    const e2e::Output out = run("(" + start_rank(runs.path, 0, env + " LOCAL_RANK=0", args) +
                           start_rank(runs.path, 1, env + " LOCAL_RANK=1", args) + attack_run(runs.path, "true") + ")");
    BOOST_TEST_INFO(where << "\n" << out.text);
    BOOST_TEST(out.text.find("STATUS 0 0") != std::string::npos);
    check_whole(runs.path, 50);
  }
  BOOST_TEST(state_of(theirs) == before);
  BOOST_TEST(fs::is_directory(tmp / ("chorus-" + std::to_string(::geteuid()) + "-1")));
  struct stat st {};
  BOOST_REQUIRE(::lstat(shared.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 07777) == 01777u);
  BOOST_TEST(fs::is_directory(shared / ("chorus-" + std::to_string(::geteuid()))));
}
