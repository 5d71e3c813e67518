// Jobs of three real hosts: each node is a network namespace with its own
// address and its own disk (a CHORUS_DIR of its own), and runs its two ranks
// under `chorus launch --nnodes 3`. Unlike e2e_modes_test, whose nodes share
// loopback, the ranks of other nodes reach the run host only through
// MASTER_ADDR, and a node can be cut off the network mid-run. The links
// between nodes are mutual TLS with the job's credentials (`chorus certs`),
// as a real multi-node job's must be. Needs root (ctest label `netns`);
// skipped otherwise.
#define BOOST_TEST_MODULE e2e_multinode
#include "netns.hpp"

#include <boost/test/unit_test.hpp>

#include <memory>

using namespace e2e;
using namespace std::chrono_literals;

namespace {

constexpr int nodes = 3, per_node = 2, world = nodes * per_node;

/// Three hosts of two ranks each.
struct ThreeNodes : Cluster {
  ThreeNodes() : Cluster(nodes, per_node) {}

  /// Starts every node's launch at once, steered by CHORUS_MODE and CHORUS_SCOPE.
  void start(const std::string& mode, const std::string& scope, const std::string& worker_args) {
    Cluster::start("CHORUS_MODE=" + mode + " CHORUS_SCOPE=" + scope, "multinode-" + mode + "-" + scope, worker_args);
  }
};

std::vector<int> ranks_of_node(int node) {
  std::vector<int> r;
  for (int local = 0; local < per_node; ++local) r.push_back(node * per_node + local);
  return r;
}

/// The name run.json gives a run.
std::string run_name(const fs::path& rd) {
  simdjson::dom::parser parser;
  return std::string(std::string_view(read_run_json(parser, rd)["name"].get_string()));
}

/// Runs one mode x scope cell on three hosts; every launch must succeed.
/// Returns the runs on each node's disk.
std::vector<std::vector<fs::path>> run_cell(ThreeNodes& c, const std::string& mode, const std::string& scope, int steps) {
  c.start(mode, scope, "--steps " + std::to_string(steps) + " --barrier-every 10");
  const std::vector<int> codes = c.wait_all(120s);
  BOOST_TEST_INFO(c.logs());
  BOOST_REQUIRE((codes == std::vector<int>(nodes, 0)));
  std::vector<std::vector<fs::path>> runs;
  for (int k = 0; k < nodes; ++k) runs.push_back(find_runs(c.disk(k)));
  return runs;
}

/// One run a node must hold on its own disk: its name's suffix and its ranks.
struct Expected {
  std::string suffix;
  std::vector<int> ranks;
};

/// Runs a cell whose runs stay on their nodes (node scope, or a run per
/// rank) and checks that node k's disk holds exactly `runs_of(k)`.
void check_runs_on_each_node(const std::string& mode, const std::string& scope, int steps,
                             std::vector<Expected> (*runs_of)(int node)) {
  ThreeNodes c;
  const auto runs = run_cell(c, mode, scope, steps);
  for (int k = 0; k < nodes; ++k) {
    BOOST_TEST_CONTEXT("node " << k) {
      const auto& here = runs[static_cast<std::size_t>(k)];
      const std::vector<Expected> expected = runs_of(k);
      BOOST_REQUIRE_EQUAL(here.size(), expected.size());
      for (const Expected& e : expected) {
        const auto rd = std::find_if(here.begin(), here.end(), [&](const fs::path& p) { return run_name(p).ends_with(e.suffix); });
        BOOST_REQUIRE_MESSAGE(rd != here.end(), "a run named ..." << e.suffix << " on node " << k);
        check_run_json(*rd, mode, scope, nodes, e.ranks.size(), std::vector<std::string>(e.ranks.size(), "finished"), steps - 1);
        check_worker_history(*rd, e.ranks, steps);
      }
    }
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(shared_global_one_run_on_node_0_holds_all_six_ranks) {
  ThreeNodes c;
  constexpr int steps = 40;
  const auto runs = run_cell(c, "shared", "global", steps);
  // The run host is global rank 0: the run lives on node 0's disk only.
  BOOST_REQUIRE_EQUAL(runs[0].size(), 1u);
  BOOST_TEST(runs[1].empty());
  BOOST_TEST(runs[2].empty());
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[static_cast<std::size_t>(r)] = r;
  check_run_json(runs[0][0], "shared", "global", nodes, world, std::vector<std::string>(world, "finished"), steps - 1);
  check_worker_history(runs[0][0], all, steps);
}

BOOST_AUTO_TEST_CASE(shared_node_each_node_hosts_its_own_run_on_its_own_disk) {
  check_runs_on_each_node("shared", "worker", 40,
                          [](int k) { return std::vector<Expected>{{"-node-" + std::to_string(k), ranks_of_node(k)}}; });
}

BOOST_AUTO_TEST_CASE(per_rank_every_rank_has_its_own_run_on_its_nodes_disk) {
  check_runs_on_each_node("new", "global", 20, [](int k) {
    std::vector<Expected> runs;
    for (int r : ranks_of_node(k)) runs.push_back({"-rank-" + std::to_string(r), {r}});
    return runs;
  });
}

BOOST_AUTO_TEST_CASE(a_node_cut_off_the_network_is_declared_crashed_and_the_others_finish) {
  ThreeNodes c;
  // About ten seconds of steps (longer under a sanitizer, where the run host
  // may lag seconds behind ranks that only log); the link goes down after the
  // first 50 rows, and node 2 must still be logging then.
  constexpr int steps = 1000 * sanitizer_slowdown;
  constexpr auto connection_timeout = 1500ms * sanitizer_slowdown;
  c.start("shared", "global",
          "--steps " + std::to_string(steps) + " --step-us 10000 --heartbeat-ms " +
              std::to_string(200 * sanitizer_slowdown) + " --connection-timeout-ms " +
              std::to_string(connection_timeout.count()));

  auto run_dir = [&]() -> fs::path {
    const auto runs = find_runs(c.disk(0), "history.jsonl");
    return runs.empty() ? fs::path() : runs[0];
  };
  auto rows = [&](const fs::path& rd) {
    std::ifstream in(rd / "history.jsonl");
    return std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
  };
  fs::path rd;
  for (auto until = std::chrono::steady_clock::now() + 60s;
       std::chrono::steady_clock::now() < until && (rd.empty() || rows(rd) < 50); std::this_thread::sleep_for(20ms))
    rd = run_dir();
  BOOST_TEST_INFO(c.logs());
  BOOST_REQUIRE_MESSAGE(!rd.empty() && rows(rd) >= 50, "the run on node 0 commits its first 50 rows");

  c.hosts.cut(2);
  const auto cut_at = std::chrono::steady_clock::now();
  // The run host notices when node 2's links stay silent past the connection
  // timeout; run.json says so within the second it takes to be rewritten.
  auto crashed = [&] {
    try {
      simdjson::dom::parser parser;
      int n = 0;
      for (auto r : read_run_json(parser, rd)["ranks"].get_array())
        n += int64_t(r["rank"].get_int64()) >= 2 * per_node && std::string_view(r["state"].get_string()) == "crashed";
      return n == per_node;
    } catch (const std::exception&) {
      return false; // being replaced
    }
  };
  while (!crashed() && std::chrono::steady_clock::now() < cut_at + 60s) std::this_thread::sleep_for(20ms);
  const auto noticed = std::chrono::steady_clock::now() - cut_at;
  BOOST_TEST_INFO(c.logs());
  BOOST_REQUIRE_MESSAGE(crashed(), "node 2's ranks are recorded as crashed");
  BOOST_TEST_MESSAGE("node 2 noticed as cut off after "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(noticed).count() << " ms");
  BOOST_TEST(noticed < connection_timeout + 4s, "noticed after "
                                                     << std::chrono::duration_cast<std::chrono::milliseconds>(noticed).count()
                                                     << " ms");

  // Nodes 0 and 1 finish with every step; node 2's launch fails or hangs
  // on a host it cannot reach, and is killed with its node.
  const auto done = c.wait_all(120s);
  c.hosts.kill_all(2);
  BOOST_TEST_CONTEXT(c.logs()) {
    BOOST_TEST(done[0] == 0);
    BOOST_TEST(done[1] == 0);
    BOOST_TEST(done[2] != 0);

    simdjson::dom::parser parser;
    auto info = read_run_json(parser, rd);
    BOOST_TEST(std::string_view(info["state"].get_string()) == "crashed"); // node 2's ranks were lost
    std::vector<int> all(world);
    std::vector<std::int64_t> last(world, steps - 1);
    for (auto r : info["ranks"].get_array()) {
      const auto rank = int64_t(r["rank"].get_int64());
      BOOST_TEST_CONTEXT("rank " << rank) {
        all[static_cast<std::size_t>(rank)] = static_cast<int>(rank);
        const std::string_view state(r["state"].get_string());
        BOOST_TEST(state == (rank >= 2 * per_node ? "crashed" : "finished"));
        last[static_cast<std::size_t>(rank)] = int64_t(r["last_step"].get_int64());
        // Cut off mid-run: node 2 logged past the first 50 rows, and not to the end.
        if (rank >= 2 * per_node) BOOST_TEST((last[static_cast<std::size_t>(rank)] >= 49 && last[static_cast<std::size_t>(rank)] < steps - 1));
      }
    }
    // Every step, reduced over the ranks that had logged it: node 2's up to where it was cut off.
    check_worker_history(rd, all, steps, last);
  }
}
