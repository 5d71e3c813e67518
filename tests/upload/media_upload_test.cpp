// media.jsonl (images, text and tables) through the Uploader to the
// loopback MLflow and W&B doubles (docs/UPLOADS.md, "Images, text and
// tables"): every media arrives once, byte for byte, whatever the server
// does, laid out as MLflow's own client lays it out, and as W&B's files in
// the history row of their step.
#define BOOST_TEST_MODULE upload_media
#include <boost/test/unit_test.hpp>

#include "io/upload/upload.hpp"
#include "tests/cli/process.hpp"
#include "tests/upload/media_checks.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/uploading.hpp"


using namespace chorus;
using namespace chorus::test;
using namespace std::chrono_literals;

namespace {

/// Every history row and media of `run` once on the server.
void check_once(const TrackingServer& server, bool wandb, const RunFixture& run) {
  if (wandb) {
    const auto r = server.wandb_run("chorus-user", "proj", "run");
    BOOST_REQUIRE(r);
    check_wandb_media(*r, run.dir(), run.world_size);
    std::istringstream history(run.read("history.jsonl"));
    std::size_t rows = 0;
    for (std::string line; std::getline(history, line); ++rows) {
      // History row N is wandb-history.jsonl's line N + the rows of media only before it: find it by its step.
      const std::string head = line.substr(0, line.find(','));
      const auto it = std::find_if(r->history.begin(), r->history.end(),
                                   [&](const std::string& row) { return row.starts_with(head + ","); });
      BOOST_REQUIRE_MESSAGE(it != r->history.end(), head);
      BOOST_TEST(it->starts_with(line.substr(0, line.size() - 1)), *it); // as written, its media after its values
    }
    BOOST_TEST(rows == 40u);
  } else {
    check_mlflow_media(server, only_run(server).id, run.dir(), run.world_size);
    check_history(server, only_run(server).id, 40);
  }
}

std::string media_cursor(const RunFixture& run) {
  const std::string text = run.read("media.jsonl");
  return std::to_string(std::count(text.begin(), text.end(), '\n')) + "." + std::to_string(text.size());
}

} // namespace

BOOST_AUTO_TEST_CASE(mlflow_gets_each_image_text_and_table_as_its_client_lays_them_out) {
  TrackingServer server;
  RunFixture run;
  ended_media_run(run, 2);
  const upload::UploadState st = upload_all(run.dir(), mlflow_url(server));
  BOOST_TEST(st.media.lines == read_media(run.dir()).size());
  const auto r = only_run(server);
  check_history(server, r.id, 40);
  check_mlflow_media(server, r.id, run.dir(), 2);
  BOOST_TEST(r.status == "FINISHED");
  BOOST_TEST(r.tags.at("chorus.upload.media") == media_cursor(run));
  // The exact names, one of each.
  const auto artifacts = server.artifacts(r.id);
  BOOST_TEST(artifacts.count("tables/preds/rank-0/step_3.json") == 1u);
  BOOST_TEST(artifacts.count("text/notes/rank-1/step_5.md") == 1u);
  BOOST_TEST(artifacts.at("text/notes/rank-1/step_5.md") == "## step 5\n\"loss\" **down** \u2713 \\ done");
  std::size_t samples = 0, photos = 0;
  for (const auto& [path, bytes] : artifacts) {
    samples += path.starts_with("images/samples.rank-1+step+2+timestamp+1700000000501+"); // rank 1 a ms later
    // A JPEG keeps its bytes, under the .png name MLflow's UI reads.
    photos += path.starts_with("images/photo.rank-0+step+7+timestamp+1700000001750+") && bytes.starts_with("\xFF\xD8");
  }
  BOOST_TEST(samples == 2u); // the image and its "compressed" thumbnail
  BOOST_TEST(photos == 2u);
  BOOST_TEST(r.tags.at("mlflow.loggedArtifacts").starts_with(
                 "[{\"path\": \"tables/preds/rank-0/step_0.json\", \"type\": \"table\"}, {\"path\": "),
             r.tags.at("mlflow.loggedArtifacts"));
  check_nothing_left(server, run.dir(), mlflow_url(server));
}

BOOST_AUTO_TEST_CASE(wandb_gets_each_media_in_the_row_of_its_step) {
  TrackingServer::Options options;
  options.record_requests = true;
  TrackingServer server(options);
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  RunFixture run;
  ended_media_run(run, 2);
  const upload::UploadState st = upload_all(run.dir(), wandb_url(server));
  const auto r = server.wandb_run("chorus-user", "proj", "run");
  BOOST_REQUIRE(r);
  check_once(server, true, run);
  BOOST_TEST(r->history.size() == 44u); // 40 rows, 4 steps of media only
  BOOST_TEST(st.histogram_rows == 4u);
  BOOST_TEST(st.media.lines == read_media(run.dir()).size());
  BOOST_TEST(r->complete);
  // A step of media only: its times and its media, nothing else.
  BOOST_TEST(r->history[40].starts_with("{\"_step\":40,\"_timestamp\":1700000010.001,\"_runtime\":10,\"notes/rank-1\":"
                                        "{\"_type\":\"table-file\",\"path\":\"media/table/notes/rank-1_40_"),
             r->history[40]);
  // The files went to the signed URLs with the upload header and without the API key.
  std::size_t puts = 0;
  for (const RecordedRequest& q : server.requests()) {
    if (!q.target.starts_with("/wandb-storage/")) continue;
    ++puts;
    bool blob = false, auth = false;
    for (const auto& [name, value] : q.headers) {
      blob = blob || (name == "x-ms-blob-type" && value == "BlockBlob");
      auth = auth || name == "authorization";
    }
    BOOST_TEST(blob);
    BOOST_TEST(!auth);
  }
  BOOST_TEST(puts == read_media(run.dir()).size());
  check_nothing_left(server, run.dir(), wandb_url(server));
}

// In a run of one rank, a media key is its own column.
BOOST_AUTO_TEST_CASE(a_run_of_one_rank_keeps_each_key_as_it_is) {
  for_each_backend([](TrackingServer& server, bool wandb) {
    RunFixture run;
    ended_media_run(run, 1);
    (void)upload_all(run.dir(), wandb ? wandb_url(server) : mlflow_url(server));
    check_once(server, wandb, run);
    if (!wandb) BOOST_TEST(server.artifacts(only_run(server).id).count("tables/preds/step_3.json") == 1u);
  });
}

// The run grows while it uploads, a step at a time as the run host writes
// it: a step's media first, then its row. A step goes up only once every
// file holds it whole, so that no step is two rows; and the Uploader is
// replaced halfway, as a restarted run host's would be.
BOOST_AUTO_TEST_CASE(a_live_run_and_a_restarted_uploader_send_each_media_once) {
  for_each_backend([](TrackingServer& server, bool wandb) {
    RunFixture run;
    run.world_size = 2;
    run.write_run_json("running");
    const std::string url = wandb ? wandb_url(server) : mlflow_url(server);
    auto up = std::make_unique<upload::Uploader>(run.dir(), target(url), quick());
    BOOST_REQUIRE(!up->open());
    for (std::int64_t s = 0; s <= 44; ++s) {
      media(run, s, 1, 2);
      drain(*up, 5s); // the step's media, its row not yet written
      if (s < 40) run.history(s, 1);
      drain(*up, 5s);
      if (s == 20) { // a new process takes the upload up from the offsets
        up.reset();
        up = std::make_unique<upload::Uploader>(run.dir(), target(url), quick());
        BOOST_REQUIRE(!up->open());
      }
    }
    run.write_run_json("finished", 1'700'000'100.0);
    const auto p = drain(*up);
    BOOST_REQUIRE_MESSAGE(p.done, p.error);
    check_once(server, wandb, run);
  });
}

BOOST_AUTO_TEST_CASE(faults_deliver_every_media_once) {
  through_each_fault(
      [](RunFixture& run, int half) {
        if (half < 0) {
          run.world_size = 2;
          return run.write_run_json("running");
        }
        media(run, half * 20, half == 0 ? 20 : 26, 2);
        run.history(half * 20, 20);
      },
      check_once);
}

// The server stores a request, its answer is lost, and the uploading
// process dies before it saves its offsets: the next upload sends nothing twice.
BOOST_AUTO_TEST_CASE(a_crash_between_an_answer_and_the_offsets_sends_nothing_twice) {
  for_each_backend([](TrackingServer& server, bool wandb) {
    RunFixture run;
    ended_media_run(run, 2);
    const std::string url = wandb ? wandb_url(server) : mlflow_url(server);
    forget_offsets(run.dir(), url, upload_all(run.dir(), url));
    (void)upload_all(run.dir(), url);
    check_once(server, wandb, run);
  });
}

// `chorus sync` cut short by its --timeout against a slow server, then run
// again: every media once, to MLflow and to W&B.
BOOST_AUTO_TEST_CASE(sync_after_a_stopped_upload_sends_every_media_once) {
  for_each_backend([](TrackingServer& server, bool wandb) {
    RunFixture run;
    ended_media_run(run, 2);
    const std::string url = wandb ? wandb_url(server) : mlflow_url(server);
    server.set_delay(300ms);
    const Output cut = run_chorus({"sync", run.dir(), "--to", url, "--timeout", "2"});
    BOOST_TEST_INFO_SCOPE(cut.out << cut.err);
    BOOST_TEST(cut.code != 0);
    server.set_delay(0ms);
    const Output sync = run_chorus({"sync", run.dir(), "--to", url});
    BOOST_TEST_INFO_SCOPE(sync.out << sync.err);
    BOOST_REQUIRE_EQUAL(sync.code, 0);
    check_once(server, wandb, run);
  });
}

// The doubles' paths, as the real servers take them: MLflow 2.10 decodes a
// proxied artifact's path until it stops changing and refuses a '#' (so
// MLflow's own client's "%"-separated image names cannot be kept as they
// are); W&B's signed upload URL takes no credentials.
BOOST_AUTO_TEST_CASE(the_doubles_take_file_paths_as_the_servers_do) {
  TrackingServer server;
  upload::HttpClient http;
  const auto put = [&](const std::string& url, std::vector<std::string> headers = {}) {
    upload::HttpRequest req;
    req.method = "PUT";
    req.url = url;
    req.body = "x";
    req.headers = std::move(headers);
    return http.perform(req);
  };
  const std::string root = server.base_url() + "/api/2.0/mlflow-artifacts/artifacts/0/r1/artifacts/";
  BOOST_TEST(put(root + "a%2523b.png").status == 400);     // "%23" is '#'
  BOOST_TEST(put(root + "k%25step%2541.png").status == 200); // "%41" is 'A'
  BOOST_TEST(put(root + "k%2Bstep%2B41.png").status == 200); // '+' is kept
  BOOST_TEST(http.perform({"GET", root + "k%25stepA.png"}).status == 200);
  BOOST_TEST(http.perform({"GET", root + "k%2Bstep%2B41.png"}).status == 200);
  BOOST_TEST(put(server.base_url() + "/wandb-storage/e/p/r/media/x.png?sig=nope", {"x-ms-blob-type: BlockBlob"}).status == 403);
}
