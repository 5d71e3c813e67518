// A run's state tells the truth about how its ranks ended: a trainer that
// ends its rank as failed (finish({.exit_code})), a rank that exits non-zero
// after its finish, and a run host that aborts mid-run, under `chorus launch`
// with real processes.
#define BOOST_TEST_MODULE e2e_failure_states
#include "harness.hpp"

#include <boost/test/unit_test.hpp>

#include <string>

using namespace e2e;

BOOST_AUTO_TEST_CASE(a_rank_that_finishes_with_an_exit_code_fails_the_run) {
  TempDir dir;
  const Output o = run(launch_worker(dir.path, 2, test_port(71), "--steps 20 --fail-rank 1 --finish-code 3"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 0); // the processes themselves exit 0
  Ended run(dir);
  BOOST_TEST(run.state() == "failed");
  BOOST_TEST(run.rank_field(1, "state") == "failed");
  BOOST_TEST(run.rank_field(1, "message").find("exit code 3") != std::string::npos, run.rank_field(1, "message"));
  BOOST_TEST(run.rank_field(0, "state") == "finished");
  // Each rank's FinishResult: the host's carries the run's state, rank 1's its own.
  BOOST_TEST(o.text.find("FINISH_STATE 0 failed") != std::string::npos);
  BOOST_TEST(o.text.find("FINISH_STATE 1 failed") != std::string::npos);
  BOOST_TEST(read_history(run.dir).size() == 20u); // nothing lost
}

BOOST_AUTO_TEST_CASE(a_rank_that_exits_non_zero_after_its_finish_fails_the_run) {
  TempDir dir;
  const Output o = run(launch_worker(dir.path, 2, test_port(72), "--steps 20 --exit-code 3"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 3);
  Ended run(dir);
  BOOST_TEST(run.state() == "failed");
  const std::string error = std::string(std::string_view(run.json["error"].get_string()));
  BOOST_TEST(error.find("exited with code 3 after the run ended") != std::string::npos, error);
  BOOST_TEST(run.exit_code(0) == 3);
  BOOST_TEST(run.exit_code(1) == 3);
  // chorus show and ls read it as it is, and a rebuild from the WAL keeps it.
  const Output show = e2e::run(bin("chorus") + " show " + run.dir.string());
  BOOST_TEST(show.text.find("failed") != std::string::npos, show.text);
  const Output recover = e2e::run(bin("chorus") + " recover " + run.dir.string());
  BOOST_TEST(recover.status == 0, recover.text);
  Ended rebuilt(dir);
  BOOST_TEST(rebuilt.state() == "failed");
  BOOST_TEST(rebuilt.exit_code(1) == 3);
  const Output shown = e2e::run(bin("chorus") + " show " + run.dir.string());
  BOOST_TEST(shown.text.find("exit codes") != std::string::npos, shown.text);
}

BOOST_AUTO_TEST_CASE(a_host_that_dies_before_a_rank_joins_fails_that_rank_at_once) {
  // Rank 0 aborts before init (its setup threw); rank 1 dials its host with
  // 60 s to do it, and learns from chorus launch at once that the host is gone.
  TempDir dir;
  const Output o = run("CHORUS_INIT_TIMEOUT=60 " + launch_worker(dir.path, 2, test_port(74), "--steps 20 --abort-rank 0"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status != 0);
  BOOST_TEST(o.text.find("the run host (rank 0) exited with code 134 before this rank joined") != std::string::npos);
  BOOST_TEST(o.text.find("within init_timeout") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_host_that_aborts_is_ended_by_launch_from_its_wal) {
  // Rank 0 hosts the run and aborts at step 30 (SIGABRT, as an uncaught
  // exception does): launch rebuilds the run from its WAL and marks it
  // crashed, with the exit codes, instead of leaving it `running`.
  TempDir dir;
  const Output o = run(launch_worker(dir.path, 2, test_port(73),
                                     "--steps 400 --step-us 5000 --die-rank 0 --die-step 30 --die-signal 6"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status != 0);
  Ended run(dir);
  BOOST_TEST(run.state() == "crashed");
  BOOST_TEST(run.exit_code(0) == 128 + 6);
  BOOST_TEST(run.exit_code(1) != 0); // it lost its host
  const std::string reason = run.rank_field(1, "message");
  BOOST_TEST(reason.find("chorus launch rebuilt the run from its WAL") != std::string::npos, reason);
  // Everything acknowledged before the abort is in the history.
  const auto rows = read_history(run.dir);
  BOOST_TEST(rows.size() >= 30u);
  for (std::size_t i = 0; i < rows.size(); ++i) BOOST_TEST(rows[i].step() == static_cast<std::int64_t>(i));
}
