// A job of 64 ranks on four hosts (16 a node; 4 under a sanitizer), every
// node's `chorus launch` started at once, logging into one shared run
// hosted by global rank 0: the ranks of nodes 1-3 join it over mutual TLS
// through MASTER_ADDR, all
// within the same moments, as the ranks of a large job do. Every launch must
// succeed, run.json must hold the 64 ranks finished, and the history every
// step reduced over all 64. Nodes are network namespaces (netns.hpp); needs
// root (ctest label `netns`), skipped otherwise. bench_multinode
// (bench/multinode_bench.cpp) measures such joins at larger sizes.
#define BOOST_TEST_MODULE e2e_scale
#include "netns.hpp"

#include <boost/test/unit_test.hpp>

using namespace e2e;
using namespace std::chrono_literals;

namespace {

// Under a sanitizer, 16 ranks: AddressSanitizer's unwinder on every
// allocation (tests/lsan.supp needs it) makes each TLS handshake cost the
// run host tens of milliseconds, so that 64 at once outlast its handshake
// deadline; the plain build takes the 64.
constexpr int nodes = 4, per_node = sanitizer_slowdown > 1 ? 4 : 16, world = nodes * per_node;

} // namespace

BOOST_AUTO_TEST_CASE(sixty_four_ranks_on_four_nodes_join_one_shared_run_and_log_every_step) {
  BOOST_TEST_MESSAGE(world << " ranks on " << nodes << " nodes");
  Cluster c(nodes, per_node);
  constexpr int steps = 200;
  // Timeouts generous for 64 processes starting at once on a small machine:
  // this test checks that every rank joins and logs, not how fast.
  const std::string env = "CHORUS_MODE=shared CHORUS_SCOPE=global CHORUS_INIT_TIMEOUT=" +
                          std::to_string(90 * sanitizer_slowdown) +
                          " CHORUS_FINISH_TIMEOUT=" + std::to_string(90 * sanitizer_slowdown);
  c.start(env, "scale-shared-global", "--steps " + std::to_string(steps) + " --barrier-every 100");
  const std::vector<int> codes = c.wait_all(150s * sanitizer_slowdown);
  BOOST_TEST_INFO(c.logs());
  BOOST_REQUIRE((codes == std::vector<int>(nodes, 0)));

  // One run, on node 0's disk (the run host is global rank 0), of every rank.
  const auto runs = find_runs(c.disk(0));
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  for (int k = 1; k < nodes; ++k) BOOST_TEST(find_runs(c.disk(k)).empty(), "no run on node " << k);
  check_run_json(runs[0], "shared", "global", nodes, world, std::vector<std::string>(world, "finished"), steps - 1);
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[static_cast<std::size_t>(r)] = r;
  check_worker_history(runs[0], all, steps);
}
