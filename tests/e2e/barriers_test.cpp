// barriers.jsonl from a real job of three processes under `chorus launch`
// (tests/e2e/barrier_worker.cpp): a line per released barrier, each rank's
// arrival and wait, a rank made late is the one the others waited for (at
// least as long as it slept), and a barrier that timed out lists the rank
// that never came with no arrival and an error naming it. Only lower bounds
// and order are asserted on the times.
#define BOOST_TEST_MODULE e2e_barriers
#include "tests/e2e/harness.hpp"

#include "io/store/barrier_log.hpp"

#include <sys/stat.h>

using namespace e2e;

namespace {

constexpr long late_ms = 1500;
constexpr long timeout_ms = 1000 * sanitizer_slowdown;

} // namespace

BOOST_AUTO_TEST_CASE(released_barriers_are_logged_with_each_ranks_wait) {
  TempDir dir;
  const std::string cmd = "CHORUS_DIR=" + dir.path.string() + " " + bin("chorus") + " launch -n 3 --master-port " +
                          std::to_string(test_port(61)) + " -- " + bin("chorus_e2e_barrier_worker") + " --dir " +
                          dir.path.string() + " --late-rank 1 --late-ms " + std::to_string(late_ms) +
                          " --absent-rank 2 --timeout-ms " + std::to_string(timeout_ms);
  const Output o = run(cmd);
  BOOST_TEST_INFO(o.text);
  BOOST_REQUIRE_EQUAL(o.status, 0);
  for (int r = 0; r < 3; ++r) BOOST_TEST(o.text.find("BARRIER " + std::to_string(r) + " epoch-0 ok") != std::string::npos, r);
  const fs::path run_dir = run_dir_of(o.text);
  BOOST_REQUIRE(!run_dir.empty());

  struct stat st {};
  BOOST_REQUIRE(::stat((run_dir / "barriers.jsonl").c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  const chorus::store::BarrierSummary b = chorus::store::BarrierLog::read(run_dir.string());
  BOOST_TEST(!b.problem);
  BOOST_TEST(b.skipped == 0u);
  BOOST_TEST(b.total == 2u);
  BOOST_TEST(b.failed == 1u);
  BOOST_REQUIRE_EQUAL(b.records.size(), 2u);

  // epoch-0: every rank came; rank 1 last, the others waited for it at least as long as it slept.
  const chorus::store::BarrierRecord& e0 = b.records[0];
  BOOST_TEST(e0.name == "epoch-0");
  BOOST_TEST(e0.index == 0u);
  BOOST_TEST(e0.error.empty(), e0.error);
  BOOST_TEST(e0.step >= -1);
  BOOST_REQUIRE_EQUAL(e0.ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST(e0.ranks[r].rank == r);
    BOOST_REQUIRE(e0.ranks[r].arrived_us.has_value());
    BOOST_TEST(*e0.ranks[r].arrived_us >= e0.opened_us);
    BOOST_TEST(*e0.ranks[r].arrived_us <= e0.released_us);
  }
  for (const int r : {0, 2}) {
    BOOST_TEST(*e0.ranks[r].arrived_us < *e0.ranks[1].arrived_us, r);
    BOOST_TEST(*e0.waited_us(e0.ranks[r]) >= late_ms * 1000, "rank " << r << " waited " << *e0.waited_us(e0.ranks[r]) << " us");
    BOOST_TEST(*e0.waited_us(e0.ranks[r]) > *e0.waited_us(e0.ranks[1]));
  }

  // epoch-1 timed out: rank 2 never came, the error names it, the others waited out the timeout.
  const chorus::store::BarrierRecord& e1 = b.records[1];
  BOOST_TEST(e1.name == "epoch-1");
  BOOST_TEST(e1.index == 1u);
  BOOST_TEST(e1.released_us >= e0.released_us);
  BOOST_TEST(e1.error.find("timed out") != std::string::npos, e1.error);
  BOOST_TEST(e1.error.find("rank 2") != std::string::npos, e1.error);
  BOOST_REQUIRE_EQUAL(e1.ranks.size(), 3u);
  BOOST_TEST(!e1.ranks[2].arrived_us.has_value());
  std::int64_t longest = 0;
  for (const int r : {0, 1}) {
    BOOST_REQUIRE(e1.ranks[r].arrived_us.has_value());
    longest = std::max(longest, *e1.waited_us(e1.ranks[r]));
  }
  BOOST_TEST(longest >= timeout_ms * 1000, longest);

  // Per rank: rank 1 was waited for at epoch-0, rank 2 at epoch-1.
  BOOST_REQUIRE_EQUAL(b.ranks.size(), 3u);
  BOOST_TEST(b.ranks[1].last == 1u);
  BOOST_TEST(b.ranks[2].last == 1u);
  BOOST_TEST(b.ranks[2].absent == 1u);
  BOOST_TEST(b.ranks[0].last == 0u);
  BOOST_TEST(b.ranks[1].caused_s >= 2 * late_ms / 1000.0);

  // The lines as written: times in unix seconds, the absent rank's arrival null.
  const std::string text = slurp(run_dir / "barriers.jsonl");
  BOOST_TEST(text.find(R"({"rank":2,"arrived":null,"waited":null})") != std::string::npos, text);

  // chorus show sums them up under the ranks.
  const Output show = run(bin("chorus") + " show " + run_dir.string() + " --width 400");
  BOOST_TEST(show.status == 0);
  BOOST_TEST(show.text.find("barriers: 2 released, 1 with an error; waited in all: rank 0 ") !=
                 std::string::npos,
             show.text);
}
