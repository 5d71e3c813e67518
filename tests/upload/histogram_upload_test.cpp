// histograms.jsonl through the Uploader to the loopback MLflow and W&B
// doubles (docs/UPLOADS.md): every histogram arrives once, whatever the
// server does, as MLflow's quantile metrics and artifact, and as W&B's own
// histograms in the history row of their step.
#define BOOST_TEST_MODULE upload_histograms
#include <boost/test/unit_test.hpp>

#include "io/store/histogram_log.hpp"
#include "io/upload/upload.hpp"
#include "tests/cli/process.hpp"
#include "tests/upload/histogram_checks.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/uploading.hpp"

#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <limits>

using namespace chorus;
using namespace chorus::test;
using namespace std::chrono_literals;

namespace {

/// Every history row and histogram of `run` once on the server: in the W&B
/// run's rows, or as the MLflow run's metrics and artifacts.
void check_once(const TrackingServer& server, bool wandb, const RunFixture& run) {
  if (wandb) {
    const auto r = server.wandb_run("chorus-user", "proj", "run");
    BOOST_REQUIRE(r);
    check_wandb_histograms(*r, run.dir());
  } else {
    check_mlflow_histograms(server, only_run(server).id, run.dir());
    check_history(server, only_run(server).id, 40);
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(mlflow_gets_quantiles_and_an_artifact_of_each_histogram) {
  TrackingServer server;
  RunFixture run;
  ended_histogram_run(run);
  BOOST_TEST(upload_all(run.dir(), mlflow_url(server)).histograms.lines == read_histograms(run.dir()).size());
  const auto r = only_run(server);
  check_history(server, r.id, 40);
  check_mlflow_histograms(server, r.id, run.dir());
  BOOST_TEST(r.status == "FINISHED");
  // One artifact's exact form.
  const auto artifacts = server.artifacts(r.id);
  const std::string act = artifacts.at("histograms/act/rank-1/step_3.json");
  BOOST_TEST(act.starts_with("{\"step\":3,\"timestamp\":1700000000.75,\"column\":\"act/rank-1\",\"count\":20,"
                             "\"sum\":14350,\"min\":5,\"max\":2000,\"nan\":0,\"inf\":0,\"-inf\":0,"
                             "\"buckets\":[[5,5.03125,1],[20,20.125,1],"),
             act);
  check_nothing_left(server, run.dir(), mlflow_url(server));
}

BOOST_AUTO_TEST_CASE(wandb_gets_each_histogram_in_the_row_of_its_step) {
  TrackingServer server;
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  RunFixture run;
  ended_histogram_run(run);
  const upload::UploadState st = upload_all(run.dir(), wandb_url(server));
  const auto r = server.wandb_run("chorus-user", "proj", "run");
  BOOST_REQUIRE(r);
  check_wandb_histograms(*r, run.dir());
  BOOST_REQUIRE(r->history.size() == 42u); // 40 rows, 2 steps of histograms only
  BOOST_TEST(st.histogram_rows == 2u);
  BOOST_TEST(st.points == 40u * 3);
  BOOST_TEST(r->complete);
  // A step of histograms only: its times and its histograms, nothing else.
  BOOST_TEST(r->history[41].starts_with("{\"_step\":42,\"_timestamp\":1700000010.5,\"_runtime\":10.5,\"act/rank-0\":"
                                        "{\"_type\":\"histogram\",\"values\":[1,0,1,0,"),
             r->history[41]);
  BOOST_TEST(r->history[41].find("\"bins\":[43,43.25,172,173,") != std::string::npos, r->history[41]);
}

// The run grows while it uploads, a history row or a histogram at a time as
// the run host writes them: the histograms of a step first, then its row. A
// step goes up only once both files hold it whole, so no step is two rows.
BOOST_AUTO_TEST_CASE(wandb_live_run_sends_each_step_as_one_row) {
  TrackingServer server;
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  RunFixture run;
  upload::Uploader up(run.dir(), target(wandb_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  for (std::int64_t s = 0; s <= 30; ++s) {
    histograms(run, s, 1);
    drain(up, 5s); // the step's histograms, its row not yet written
    if (s < 28) run.history(s, 1); // steps 28 and 30 have histograms only (29 has nothing)
    drain(up, 5s);
  }
  // Nothing is sent of the last step while the run may still add to it.
  auto r = server.wandb_run("chorus-user", "proj", "run");
  BOOST_REQUIRE(r);
  BOOST_TEST(r->history.size() == 29u);
  run.write_run_json("finished", 1'700'000'100.0);
  BOOST_REQUIRE(drain(up).done);
  r = server.wandb_run("chorus-user", "proj", "run");
  BOOST_REQUIRE(r);
  check_wandb_histograms(*r, run.dir());
  BOOST_TEST(r->history.size() == 30u);
}

BOOST_AUTO_TEST_CASE(faults_deliver_every_histogram_once) {
  through_each_fault(
      [](RunFixture& run, int half) {
        if (half < 0) return;
        run.history(half * 20, 20);
        histograms(run, half * 20, half == 0 ? 20 : 24);
      },
      check_once);
}

// The server stores a request, its answer is lost, and the uploading
// process dies before it saves its offsets: the next upload sends nothing twice.
BOOST_AUTO_TEST_CASE(a_crash_between_an_answer_and_the_offsets_sends_nothing_twice) {
  for_each_backend([](TrackingServer& server, bool wandb) {
    RunFixture run;
    ended_histogram_run(run);
    const std::string url = wandb ? wandb_url(server) : mlflow_url(server);
    forget_offsets(run.dir(), url, upload_all(run.dir(), url));
    (void)upload_all(run.dir(), url);
    check_once(server, wandb, run);
  });
}

BOOST_AUTO_TEST_CASE(mlflow_refused_quantiles_are_listed_and_the_rest_delivered) {
  TrackingServer server;
  RunFixture run;
  ended_histogram_run(run);
  server.refuse_key("act/rank-1/p90");
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(drain(up).done);
  const auto r = only_run(server);
  BOOST_TEST(server.metric_history(r.id, "act/rank-1/p90").empty());
  BOOST_TEST(server.metric_history(r.id, "act/rank-1/p50").empty()); // refused with it: one log-batch a line
  BOOST_TEST(server.metric_history(r.id, "act/rank-0/p90").size() == 15u);
  BOOST_TEST(server.metric_history(r.id, "grad/p99").size() == 22u);
  BOOST_TEST(up.state().refused == 15u * 3);
  const std::string refused = run.read("upload/" + up.target().id + ".refused.jsonl");
  BOOST_TEST(refused.find("\"key\":\"act/rank-1/p90\"") != std::string::npos, refused);
  BOOST_TEST(server.artifacts(r.id).count("histograms/act/rank-1/step_3.json") == 1u);
}

namespace {

/// The run directory of the one run under `root`.
std::string only_run_dir(const std::string& root) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.path().filename() == "run.json") found.push_back(e.path().parent_path().string());
  BOOST_REQUIRE_EQUAL(found.size(), 1u);
  return found.front();
}

} // namespace

// Real ranks log histograms under `chorus launch`; `chorus sync` is cut
// short by its --timeout against a slow server, and a second sync sends
// the rest: every histogram once, to MLflow and to W&B.
BOOST_AUTO_TEST_CASE(sync_after_a_stopped_upload_sends_every_histogram_once) {
  TempDir dir;
  const std::vector<std::string> quiet{"CHORUS_DIR=" + dir.str(), "WANDB_API_KEY=chorus-test-key",
                                       "CHORUS_WANDB_INTERVAL=0"};
  Child job({"launch", "-n", "2", "--", CHORUS_BINARY_DIR "/bin/chorus_e2e_worker", "--steps", "30",
                   "--histograms", "1"},
                  quiet);
  const Output out = job.finish(120s);
  BOOST_TEST_INFO_SCOPE(out.out << out.err);
  BOOST_REQUIRE_EQUAL(out.code, 0);
  const std::string run_dir = only_run_dir(dir.str());
  BOOST_REQUIRE(read_histograms(run_dir).size() == 30u * 3);
  for (const bool wandb : {false, true}) {
    BOOST_TEST_CONTEXT((wandb ? "W&B" : "MLflow")) {
      TrackingServer server;
      const std::string url = wandb ? wandb_url(server) : mlflow_url(server);
      server.set_delay(400ms);
      const Output cut = run_chorus({"sync", run_dir, "--to", url, "--timeout", "2"}, quiet);
      BOOST_TEST_INFO_SCOPE(cut.out << cut.err);
      BOOST_TEST(cut.code != 0);
      server.set_delay(0ms);
      const Output sync = run_chorus({"sync", run_dir, "--to", url}, quiet);
      BOOST_TEST_INFO_SCOPE(sync.out << sync.err);
      BOOST_REQUIRE_EQUAL(sync.code, 0);
      if (wandb) {
        const auto runs = server.wandb_runs();
        BOOST_REQUIRE_EQUAL(runs.size(), 1u);
        check_wandb_histograms(runs.front(), run_dir);
        BOOST_TEST(runs.front().history.size() == 30u);
      } else {
        check_mlflow_histograms(server, only_run(server).id, run_dir);
      }
    }
  }
}
