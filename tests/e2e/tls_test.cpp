// Links between nodes are authenticated: `chorus certs` makes a job's
// credentials, a run that spans nodes does not start without them (unless
// CHORUS_INSECURE=1), and a peer with another CA's credentials, or with none,
// can neither join the run nor put a record into it. Two nodes of two ranks
// each run on this machine, as two `chorus launch --nnodes 2`.
#define BOOST_TEST_MODULE e2e_tls
#include "harness.hpp"
#include "slow_link.hpp"

#include "io/credentials.hpp"

#include <boost/test/unit_test.hpp>

#include <sys/stat.h>

#include <future>

using namespace e2e;

namespace {

/// Both nodes of a 2 x 2 shared run at once, each with its own environment.
/// The run host listens on test_port(salt) + 1.
std::pair<Output, Output> two_nodes(const TempDir& dir, int salt, const std::string& env0, const std::string& env1,
                                    const std::string& worker_args = "--steps 30", int init_timeout_s = 3) {
  const int port = test_port(salt);
  auto node = [&](int k, const std::string& env) {
    return run(env + " CHORUS_DIR=" + (dir.path / ("node" + std::to_string(k))).string() +
               " CHORUS_MODE=shared CHORUS_INIT_TIMEOUT=" + std::to_string(init_timeout_s * sanitizer_slowdown) + " " +
               bin("chorus") +
               " launch -n 2 --nnodes 2 --node-rank " + std::to_string(k) + " --master-addr 127.0.0.1 --master-port " +
               std::to_string(port) + " --run-id tls" + std::to_string(salt) + " -- " + bin("chorus_e2e_worker") +
               " " + worker_args);
  };
  auto second = std::async(std::launch::async, node, 1, env1);
  Output first = node(0, env0);
  return {first, second.get()};
}

std::string certs(const fs::path& dir) {
  Output o = run(bin("chorus") + " certs " + dir.string());
  BOOST_REQUIRE_MESSAGE(o.status == 0, o.text);
  return "CHORUS_TLS_DIR=" + dir.string();
}

/// The ranks' states of the one run under node 0's directory, and its history.
std::vector<std::string> rank_states(const fs::path& root, std::vector<Row>& rows) {
  std::vector<std::string> states;
  for (const auto& run_dir : find_runs(root)) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    BOOST_REQUIRE(!parser.load((run_dir / "run.json").string()).get(doc));
    for (auto r : doc["ranks"].get_array()) states.emplace_back(std::string_view(r["state"].get_string()));
    rows = read_history(run_dir);
  }
  return states;
}

/// Both nodes succeeded, and node 0 holds the whole run: 4 ranks finished, 30 rows of 4 losses.
void check_whole_run(const TempDir& dir, const Output& n0, const Output& n1) {
  BOOST_TEST_CONTEXT(n0.text << n1.text) {
    BOOST_REQUIRE_EQUAL(n0.status, 0);
    BOOST_REQUIRE_EQUAL(n1.status, 0);
  }
  std::vector<Row> rows;
  auto states = rank_states(dir.path / "node0", rows);
  BOOST_TEST(states == std::vector<std::string>(4, "finished"), boost::test_tools::per_element());
  BOOST_REQUIRE_EQUAL(rows.size(), 30u);
  for (const Row& row : rows) BOOST_TEST(row.count.at("loss") == 4);
}

} // namespace

BOOST_AUTO_TEST_CASE(certs_makes_private_credentials_once) {
  TempDir dir;
  const fs::path creds = dir.path / "creds";
  certs(creds);
  struct stat st {};
  BOOST_REQUIRE(::stat(creds.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0700u);
  for (const char* f : {"ca.pem", "cert.pem", "key.pem"}) {
    BOOST_REQUIRE(::stat((creds / f).c_str(), &st) == 0);
    BOOST_TEST((st.st_mode & 0777) == 0600u, f);
  }
  chorus::io::Credentials c;
  chorus::Error e = chorus::io::check_credentials(creds.string(), c);
  BOOST_TEST(!e, e.message());
  // Not replaced without --force.
  Output again = run(bin("chorus") + " certs " + creds.string());
  BOOST_TEST(again.status == 1);
  BOOST_TEST(again.text.find("--force") != std::string::npos, again.text);
  // A key of another run of `chorus certs` does not belong to this certificate.
  const fs::path other = dir.path / "other";
  certs(other);
  fs::copy_file(other / "key.pem", creds / "key.pem", fs::copy_options::overwrite_existing);
  e = chorus::io::check_credentials(creds.string(), c);
  BOOST_TEST(e.message().find("is not the key of") != std::string::npos, e.message());
  // A certificate of another CA does not verify.
  fs::copy_file(other / "key.pem", creds / "key.pem", fs::copy_options::overwrite_existing);
  fs::copy_file(other / "cert.pem", creds / "cert.pem", fs::copy_options::overwrite_existing);
  e = chorus::io::check_credentials(creds.string(), c);
  BOOST_TEST(e.message().find("does not verify against") != std::string::npos, e.message());
  e = chorus::io::check_credentials((dir.path / "none").string(), c);
  BOOST_TEST(e.message().find("chorus certs") != std::string::npos, e.message());
}

BOOST_AUTO_TEST_CASE(a_run_across_nodes_needs_credentials_or_the_insecure_switch) {
  TempDir dir;
  auto [n0, n1] = two_nodes(dir, 21, "", "");
  BOOST_TEST_INFO(n0.text << n1.text);
  BOOST_TEST(n0.status != 0);
  BOOST_TEST(n1.status != 0);
  BOOST_TEST(n0.text.find("CHORUS_TLS_DIR") != std::string::npos);
  BOOST_TEST(n0.text.find("chorus certs") != std::string::npos);
  BOOST_TEST(n1.text.find("CHORUS_INSECURE=1") != std::string::npos);

  TempDir open;
  auto [i0, i1] = two_nodes(open, 22, "CHORUS_INSECURE=1", "CHORUS_INSECURE=1");
  BOOST_TEST_INFO(i0.text << i1.text);
  BOOST_TEST(i0.status == 0);
  BOOST_TEST(i1.status == 0);
  BOOST_TEST(i0.text.find("WARNING: CHORUS_INSECURE=1") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(nodes_with_the_jobs_credentials_log_into_one_run) {
  TempDir dir;
  const std::string env = certs(dir.path / "creds");
  // Several links at once, opened and closed: each must survive the others'
  // handshakes and goodbyes (runtime/ssl_errors.cpp).
  for (int round = 0; round < 3; ++round) {
    TempDir runs;
    auto [n0, n1] = two_nodes(runs, 30 + round, env, env);
    check_whole_run(runs, n0, n1);
  }
}

BOOST_AUTO_TEST_CASE(ranks_join_across_a_link_slower_than_the_heartbeat) {
  // Node 1 reaches the run host through a link that takes 250 ms each way,
  // while heartbeats tick every 100 ms: every handshake (TCP, TLS, CAF's)
  // outlasts several ticks, and a rank must still join, log and finish.
  TempDir dir;
  const std::string env = certs(dir.path / "creds");
  constexpr int salt = 51;
  const int host_port = test_port(salt) + 1;
  const int relay_port = test_port(salt) + 2;
  SlowLink link(relay_port, host_port, std::chrono::milliseconds(250));
  const std::string liveness = env + " CHORUS_HEARTBEAT_INTERVAL=0.1 CHORUS_CONNECTION_TIMEOUT=5";
  auto [n0, n1] = two_nodes(dir, salt, liveness, liveness + " CHORUS_PORT=" + std::to_string(relay_port), "--steps 30", 30);
  check_whole_run(dir, n0, n1);
}

BOOST_AUTO_TEST_CASE(a_peer_with_another_ca_or_none_cannot_join_or_inject) {
  TempDir dir;
  const std::string ours = certs(dir.path / "creds");
  const std::string theirs = certs(dir.path / "other");
  for (const std::string& intruder : {theirs, std::string("CHORUS_INSECURE=1")}) {
    TempDir runs;
    auto [n0, n1] = two_nodes(runs, intruder == theirs ? 41 : 42, ours, intruder);
    BOOST_TEST_CONTEXT(intruder) {
      BOOST_TEST_INFO(n0.text << n1.text);
      BOOST_TEST(n0.status == 0); // the run host's own node is whole
      BOOST_TEST(n1.status != 0);
      BOOST_TEST(n1.text.find("could not reach the run host") != std::string::npos);
      BOOST_TEST(n1.text.find("CHORUS_TLS_DIR") != std::string::npos);
      std::vector<Row> rows;
      auto states = rank_states(runs.path / "node0", rows);
      BOOST_TEST(states == (std::vector<std::string>{"finished", "finished", "crashed", "crashed"}),
                 boost::test_tools::per_element());
      BOOST_REQUIRE_EQUAL(rows.size(), 30u);
      for (const Row& row : rows) {
        BOOST_TEST(row.count.at("loss") == 2); // ranks 0 and 1 only
        BOOST_TEST(row.num.count("per_rank/rank-2") == 0u);
        BOOST_TEST(row.num.count("per_rank/rank-3") == 0u);
      }
    }
  }
}
