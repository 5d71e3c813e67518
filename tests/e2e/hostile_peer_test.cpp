#define BOOST_TEST_MODULE e2e_hostile_peer
#include <boost/test/unit_test.hpp>

#include "tests/e2e/harness.hpp"

#include <unistd.h>

#include <filesystem>

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
