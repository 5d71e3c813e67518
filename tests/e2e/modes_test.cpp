// Every cell of the mode x scope matrix (README, "Modes and the environment") with real
// processes: a job of two nodes with two ranks each, as two `chorus launch`
// on this machine, steered by CHORUS_MODE and CHORUS_SCOPE alone, and
// exactly the runs each cell must leave.
#define BOOST_TEST_MODULE e2e_modes
#include "harness.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string_view>

using namespace e2e;

namespace {

constexpr int nodes = 2, per_node = 2, world = nodes * per_node, steps = 40;

/// One run a cell must leave: its name's suffix, the global ranks that log
/// into it (in the order of their place in the run), and the global ranks
/// whose exit codes launch records there.
struct Expected {
  std::string suffix;
  std::vector<int> ranks;
  std::vector<int> exit_codes;
};

std::vector<int> ranks_of_node(int node) {
  std::vector<int> r;
  for (int local = 0; local < per_node; ++local) r.push_back(node * per_node + local);
  return r;
}

/// The runs of a cell, spelled as the environment spells it (auto|shared|new, global|worker).
std::vector<Expected> expected_runs(std::string_view mode, std::string_view scope) {
  std::vector<Expected> runs;
  if (mode == "new") {
    for (int r = 0; r < world; ++r) runs.push_back({"-rank-" + std::to_string(r), {r}, {r}});
  } else if (scope == "worker") {
    // A node's run is hosted by its local rank 0 and gets the node's exit codes.
    for (int n = 0; n < nodes; ++n)
      runs.push_back({"-node-" + std::to_string(n), mode == "auto" ? std::vector{n * per_node} : ranks_of_node(n),
                      ranks_of_node(n)});
  } else {
    // One run hosted by global rank 0: only node 0's launch knows it.
    std::vector<int> all(world);
    for (int r = 0; r < world; ++r) all[static_cast<std::size_t>(r)] = r;
    runs.push_back({"", mode == "auto" ? std::vector{0} : all, ranks_of_node(0)});
  }
  return runs;
}

/// The lines "[rank R] WORD..." of launch's output, by R.
std::set<int> ranks_saying(const std::string& text, const std::string& word) {
  std::set<int> ranks;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    int r = -1;
    if (std::sscanf(line.c_str(), "[rank %d]", &r) == 1 && line.find("] " + word) != std::string::npos)
      ranks.insert(r);
  }
  return ranks;
}

/// Runs the job in one cell of the matrix and checks every run it left.
void check_cell(const std::string& mode, const std::string& scope, int salt) {
  TempDir dir;
  const int port = test_port(salt);
  // Both nodes name the job alike, so they derive one group from it.
  const std::string job = "modes-" + mode + "-" + scope;
  // A run across the two nodes needs credentials or the insecure switch;
  // e2e_tls_test covers the credentials.
  const std::string env = "CHORUS_INSECURE=1 CHORUS_MODE=" + mode + " CHORUS_SCOPE=" + scope + " ";
  auto node = [&](int k) {
    return env +
           launch_worker(dir.path, per_node, port, "--steps " + std::to_string(steps) + " --barrier-every 10",
                         "--nnodes " + std::to_string(nodes) + " --node-rank " + std::to_string(k) +
                             " --master-addr 127.0.0.1 --run-id " + job) +
           " > " + (dir.path / ("node" + std::to_string(k) + ".out")).string() + " 2>&1";
  };
  Output status = run(node(1) + " & n1=$!; " + node(0) + "; s0=$?; wait $n1; echo \"STATUS $s0 $?\"");
  const std::string text = slurp(dir.path / "node0.out") + slurp(dir.path / "node1.out");
  BOOST_TEST_INFO(text);
  BOOST_REQUIRE(status.text.find("STATUS 0 0") != std::string::npos);

  const std::vector<Expected> expected = expected_runs(mode, scope);
  std::set<int> hosts, inactive;
  for (int r = 0; r < world; ++r) inactive.insert(r);
  for (const Expected& e : expected) {
    hosts.insert(e.ranks.front());
    for (int r : e.ranks) inactive.erase(r);
  }
  BOOST_TEST(ranks_saying(text, "RUN_DIR=") == hosts);
  BOOST_TEST(ranks_saying(text, "INACTIVE") == inactive);
  // An inactive handle's finish says so, not `running`.
  for (int r : inactive) BOOST_TEST(text.find("FINISH_STATE " + std::to_string(r) + " inactive") != std::string::npos, r);

  // One group, derived from the job, holding exactly the cell's runs.
  const std::string group = "torchrun-" + job;
  std::vector<fs::path> groups;
  for (auto& p : fs::directory_iterator(dir.path / "e2e")) groups.push_back(p.path());
  BOOST_REQUIRE_EQUAL(groups.size(), 1u);
  BOOST_TEST(groups[0].filename() == group);
  const std::vector<fs::path> runs = find_runs(dir.path);
  BOOST_REQUIRE_EQUAL(runs.size(), expected.size());

  simdjson::dom::parser parser;
  std::set<std::string> seen;
  for (const fs::path& rd : runs) {
    BOOST_TEST_CONTEXT("run " << rd) {
      BOOST_TEST(rd.parent_path() == groups[0]);
      BOOST_TEST(text.find("RUN_DIR=" + rd.string() + "\n") != std::string::npos);
      auto info = read_run_json(parser, rd);
      const std::string id(std::string_view(info["id"].get_string()));
      const std::string name(std::string_view(info["name"].get_string()));
      // A global run keeps its id as its name; the others are named after the group.
      const auto e = std::find_if(expected.begin(), expected.end(), [&](const Expected& x) {
        return name == (x.suffix.empty() ? id : group + x.suffix);
      });
      BOOST_REQUIRE_MESSAGE(e != expected.end(), "run named " << name << " is one of the cell's");
      BOOST_TEST(seen.insert(name).second);
      BOOST_TEST(std::string_view(info["group"].get_string()) == group);
      BOOST_TEST(std::string_view(info["mode"].get_string()) == mode);
      BOOST_TEST(std::string_view(info["scope"].get_string()) == scope);
      BOOST_TEST(std::string_view(info["state"].get_string()) == "finished");
      BOOST_TEST(int64_t(info["nodes"].get_int64()) == nodes);
      BOOST_TEST(int64_t(info["world_size"].get_int64()) == static_cast<int64_t>(e->ranks.size()));
      std::vector<std::int64_t> places;
      for (auto r : info["ranks"].get_array()) {
        places.push_back(int64_t(r["rank"].get_int64()));
        BOOST_TEST(std::string_view(r["state"].get_string()) == "finished");
        BOOST_TEST(int64_t(r["last_step"].get_int64()) == steps - 1);
      }
      std::vector<std::int64_t> want(e->ranks.size());
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<std::int64_t>(i);
      BOOST_TEST(places == want, boost::test_tools::per_element());
      std::map<std::string, std::int64_t> codes, want_codes;
      for (auto [k, v] : info["exit_codes"].get_object()) codes[std::string(k)] = int64_t(v.get_int64());
      for (int r : e->exit_codes) want_codes[std::to_string(r)] = 0;
      BOOST_TEST((codes == want_codes));
      check_worker_history(rd, e->ranks, steps);
    }
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(automatic_global_only_global_rank_0_logs) { check_cell("auto", "global", 1); }
BOOST_AUTO_TEST_CASE(automatic_node_local_rank_0_logs_its_nodes_run) { check_cell("auto", "worker", 2); }
BOOST_AUTO_TEST_CASE(shared_global_every_rank_logs_into_one_run) { check_cell("shared", "global", 3); }
BOOST_AUTO_TEST_CASE(shared_node_each_node_shares_its_own_run) { check_cell("shared", "worker", 4); }
BOOST_AUTO_TEST_CASE(per_rank_global_every_rank_has_its_own_run) { check_cell("new", "global", 5); }
BOOST_AUTO_TEST_CASE(per_rank_node_every_rank_has_its_own_run) { check_cell("new", "worker", 6); }
