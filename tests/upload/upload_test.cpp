// The Uploader and its MLflow and W&B backends against the loopback tracking
// server: every point once and in step order, whatever the server does.
#define BOOST_TEST_MODULE upload
#include <boost/test/unit_test.hpp>

#include "io/upload/slices.hpp"
#include "io/upload/upload.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/uploading.hpp"

#include <simdjson.h>

#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <atomic>
#include <functional>
#include <set>
#include <thread>

using namespace chorus;
using namespace std::chrono_literals;
using test::check_history;
using test::drain;
using test::Env;
using test::mlflow_url;
using test::only_run;
using test::quick;
using test::RunFixture;
using test::target;
using test::TrackingServer;
using test::wandb_url;

BOOST_AUTO_TEST_CASE(target_urls) {
  BOOST_TEST(target("mlflow://h:5000").base_url == "http://h:5000");
  BOOST_TEST(target("mlflow+https://h:443").base_url == "https://h:443");
  BOOST_TEST(target("wandb://api.wandb.ai").base_url == "https://api.wandb.ai");
  BOOST_TEST(target("wandb+http://h:8080/team").entity == "team");
  BOOST_TEST(target("mlflow://127.0.0.1:5000").id == "mlflow-127.0.0.1-5000");
  for (const char* bad : {"http://h", "mlflow:/h", "mlflow://", "mlflow://h:1/x", "wandb://h/a/b"}) {
    const auto t = upload::UploadTarget::parse(bad);
    BOOST_TEST(!t, bad);
    BOOST_TEST(t.error().message().find("mlflow://HOST:PORT") != std::string::npos, t.error().message());
  }
  const Error e = upload::UploadTarget::parse("wandb://user:secret@h").error();
  BOOST_TEST((e.code() == Errc::invalid_argument));
  BOOST_TEST(e.message().find("WANDB_API_KEY") != std::string::npos);
  BOOST_TEST(e.message().find("secret") == std::string::npos, e.message()); // never echoed
}

BOOST_AUTO_TEST_CASE(read_lines_takes_whole_lines_only) {
  RunFixture run;
  run.append("history.jsonl", "{\"a\":1}\n{\"b\":2}\n{\"c\":");
  upload::LineSlice s;
  BOOST_REQUIRE(!upload::read_lines(run.dir() + "/history.jsonl", {}, 1 << 20, s));
  BOOST_REQUIRE_EQUAL(s.lines.size(), 2u);
  BOOST_TEST(s.lines[1] == "{\"b\":2}");
  BOOST_TEST(s.after[1].lines == 2u);
  BOOST_TEST(s.after[1].bytes == 16u);
  // A small budget still gives at least one line.
  BOOST_REQUIRE(!upload::read_lines(run.dir() + "/history.jsonl", {}, 3, s));
  BOOST_TEST(s.lines.size() >= 1u);
  // From the middle.
  BOOST_REQUIRE(!upload::read_lines(run.dir() + "/history.jsonl", {1, 8}, 1 << 20, s));
  BOOST_REQUIRE_EQUAL(s.lines.size(), 1u);
  BOOST_TEST(s.lines[0] == "{\"b\":2}");
  // A file shorter than the offset was rewritten: an error that says what to do.
  Error e = upload::read_lines(run.dir() + "/history.jsonl", {9, 1000}, 1 << 20, s);
  BOOST_TEST(static_cast<bool>(e));
  BOOST_TEST(e.message().find("upload/") != std::string::npos);
  // A missing file is empty.
  BOOST_TEST(!upload::read_lines(run.dir() + "/nothing.jsonl", {}, 1 << 20, s));
  BOOST_TEST(s.lines.empty());
}

// A line past the bound every reader of a run's lines keeps (store::max_line_bytes):
// the lines before it are read, then nothing more of the file, and why.
BOOST_AUTO_TEST_CASE(read_lines_stops_at_a_line_past_the_bound) {
  RunFixture run;
  run.append("history.jsonl", "{\"a\":1}\n{\"b\":2}\n{\"c\":\"" + std::string(17u << 20, 'x') + "\"}\n{\"d\":4}\n");
  upload::LineSlice s;
  // A budget that the long line's first bytes fill: the lines before it.
  BOOST_REQUIRE(!upload::read_lines(run.dir() + "/history.jsonl", {}, 1 << 20, s));
  BOOST_REQUIRE_EQUAL(s.lines.size(), 2u);
  // From the long line on: nothing, and why.
  const store::Cursor at = s.after[1];
  BOOST_REQUIRE(!upload::read_lines(run.dir() + "/history.jsonl", at, 1 << 20, s));
  BOOST_TEST(s.lines.empty());
  BOOST_TEST(s.to_end);
  BOOST_REQUIRE(static_cast<bool>(s.damaged));
  BOOST_TEST(s.damaged.message().find("history.jsonl: line 3 runs past 16 MiB without a newline") != std::string::npos,
             s.damaged.message());
  BOOST_TEST(s.damaged.message().find("That line and every line after it are not read") != std::string::npos);
  // A budget larger than the bound: the lines before it, and why the reading stops there.
  BOOST_REQUIRE(!upload::read_lines(run.dir() + "/history.jsonl", {}, 64u << 20, s));
  BOOST_REQUIRE_EQUAL(s.lines.size(), 2u);
  BOOST_TEST(s.to_end);
  BOOST_TEST(s.damaged.message().find("line 3 runs past 16 MiB") != std::string::npos);
  // A bound's worth of line is not taken either.
  RunFixture exact;
  exact.append("history.jsonl", std::string(16u << 20, 'y') + "\n");
  BOOST_REQUIRE(!upload::read_lines(exact.dir() + "/history.jsonl", {}, 1 << 20, s));
  BOOST_TEST(s.lines.empty());
  BOOST_TEST(static_cast<bool>(s.damaged));
}

// A run whose history holds a line of 20 MiB: the rows before it go up, then
// the upload stops with why (the file, the line, the bound), and the run's
// end is not sent: the rows after it never can be.
BOOST_AUTO_TEST_CASE(a_line_past_the_bound_stops_the_upload_after_the_rows_before_it) {
  test::for_each_backend([](TrackingServer& server, bool wandb) {
    RunFixture run;
    run.history(0, 3);
    run.append("history.jsonl", "{\"_step\":3,\"k0\":\"" + std::string(20u << 20, 'x') + "\"}\n");
    run.history(4, 2);
    run.write_run_json("finished", 1'700'000'100.0);
    const std::string url = wandb ? wandb_url(server) + "/team" : mlflow_url(server);
    upload::Uploader up(run.dir(), target(url), quick());
    BOOST_REQUIRE(!up.open());
    const upload::Uploader::Progress p = drain(up);
    BOOST_TEST(p.stopped);
    BOOST_TEST(!p.done);
    BOOST_TEST(p.error.find(run.dir() + "/history.jsonl: line 4 runs past 16 MiB without a newline") != std::string::npos,
               p.error);
    BOOST_TEST(up.state().last_error == p.error); // for `chorus sync --status`
    BOOST_TEST(up.state().final_sent.empty());
    if (wandb) {
      const auto r = server.wandb_run("team", "proj", "run");
      BOOST_REQUIRE(r);
      BOOST_TEST(r->history.size() == 3u);
      BOOST_TEST(!r->complete);
    } else {
      const auto r = only_run(server);
      check_history(server, r.id, 3);
      BOOST_TEST(r.status == "RUNNING");
    }
  });
}

BOOST_AUTO_TEST_CASE(mlflow_whole_run) {
  TrackingServer server;
  RunFixture run;
  run.history(0, 2500); // 7500 points: 8 requests of at most 999
  run.append("system.jsonl", "{\"_timestamp\":1700000001.5,\"_runtime\":1.5,\"_node\":0,\"_rank\":0,"
                             "\"system.cpu.percent/node-0\":12.5,\"system.proc.threads/rank-0\":9}\n");
  std::string config = "{\"lr\":0.001,\"model\":{\"depth\":12,\"name\":\"mlp\"}";
  for (int i = 0; i < 150; ++i) config += ",\"p" + std::to_string(i) + "\":" + std::to_string(i);
  config += "}";
  run.write("config.json", config);
  run.write("summary.json", "{\"_step\":2499,\"best\":0.93,\"note\":\"ok\"}");
  run.write_run_json("finished", 1'700'000'700.0);

  {
    upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
    BOOST_REQUIRE(!up.open());
    BOOST_TEST(up.points_pending() == 7502u);
    auto p = drain(up);
    BOOST_REQUIRE_MESSAGE(p.done, p.error);
    BOOST_TEST(up.points_pending() == 0u);
    BOOST_TEST(up.state().points == 7502u);
  }

  const auto r = only_run(server);
  check_history(server, r.id, 2500);
  BOOST_TEST(r.status == "FINISHED");
  BOOST_TEST(r.end_time.value_or(0) == 1'700'000'700'000);
  BOOST_TEST(r.start_time == 1'700'000'000'000);
  BOOST_TEST(r.name == "run-rank-3");
  BOOST_TEST(r.tags.at("chorus.group") == "grp");
  BOOST_TEST(r.tags.at("chorus.mode") == "per_rank");
  BOOST_TEST(r.tags.at("chorus.host") == "node7");
  BOOST_TEST(r.tags.at("chorus.rank") == "3");
  BOOST_TEST(r.tags.at("chorus.run_id") == "run");
  BOOST_TEST(r.params.size() == 153u);
  BOOST_TEST(r.params.at("model.depth") == "12");
  BOOST_TEST(r.params.at("model.name") == "mlp");
  BOOST_TEST(r.params.at("lr") == "0.001");
  BOOST_TEST(r.tags.at("summary.best") == "0.93");
  // System metrics under system/.
  auto cpu = server.metric_history(r.id, "system/cpu.percent/node-0");
  BOOST_REQUIRE_EQUAL(cpu.size(), 1u);
  BOOST_TEST(cpu[0].value == 12.5);
  BOOST_TEST(cpu[0].timestamp == 1'700'000'001'500);
  BOOST_TEST(server.experiments().size() == 2u); // Default and proj
  // Keep-alive: a connection per log-batch in flight at once (the window's most, 8), for all of it.
  BOOST_TEST(server.stats().connections <= 8u);
  test::check_nothing_left(server, run.dir(), mlflow_url(server));
}

BOOST_AUTO_TEST_CASE(mlflow_live_run_grows_while_uploading) {
  TrackingServer server;
  RunFixture run;
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  for (int i = 0; i < 5; ++i) {
    run.history(i * 100, 100);
    run.append("history.jsonl", ""); // nothing
    auto p = drain(up);
    BOOST_TEST(p.caught_up);
    BOOST_TEST(!p.done);
  }
  // A torn last line (the writer mid-append) waits for its end.
  run.append("history.jsonl", "{\"_step\":500,\"_timestamp\":1700000125,\"k0\":5000,\"k1\":5001");
  BOOST_TEST(drain(up).caught_up);
  run.append("history.jsonl", ",\"k2\":5002}\n");
  run.write_run_json("failed", 1'700'000'200.0);
  BOOST_REQUIRE(drain(up).done);
  const auto r = only_run(server);
  check_history(server, r.id, 501);
  BOOST_TEST(r.status == "FAILED");
}

BOOST_AUTO_TEST_CASE(mlflow_faults_every_point_once) {
  struct Fault {
    const char* name;
    std::function<void(TrackingServer&)> inject;
  };
  const std::vector<Fault> faults{
      {"500s", [](TrackingServer& s) { s.fail_next(3, {500, "", "", "log-batch"}); }},
      {"429 Retry-After", [](TrackingServer& s) { s.fail_next(2, {429, "", "1", "log-batch"}); }},
      {"reset before applied", [](TrackingServer& s) { s.reset_next(2, test::ResetPoint::after_body, "log-batch"); }},
      {"reset after applied", [](TrackingServer& s) { s.reset_next(2, test::ResetPoint::after_handling, "log-batch"); }},
      {"503 after applied?", [](TrackingServer& s) { s.fail_next(1, {503, "", "", "runs/create"}); }},
      {"slow", [](TrackingServer& s) { s.set_delay(100ms, "log-batch"); }},
      {"outage", [](TrackingServer& s) { s.outage(2500ms); }},
  };
  for (const Fault& f : faults) {
    BOOST_TEST_CONTEXT(f.name) {
      TrackingServer server;
      RunFixture run;
      run.history(0, 1200);
      run.write_run_json("finished", 1'700'000'300.0);
      f.inject(server);
      upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
      BOOST_REQUIRE(!up.open());
      auto p = drain(up);
      BOOST_REQUIRE_MESSAGE(p.done, p.error);
      const auto r = only_run(server);
      check_history(server, r.id, 1200);
      BOOST_TEST(r.status == "FINISHED");
      BOOST_TEST(up.state().points == 3600u);
    }
  }
}

BOOST_AUTO_TEST_CASE(mlflow_resumes_after_a_crash_between_answer_and_offsets) {
  // The server stores a batch, its answer is lost, and the uploading process
  // dies before it saved its offsets: the next one reads the offset tag.
  TrackingServer server;
  RunFixture run;
  run.history(0, 1500);
  run.write_run_json("finished", 1'700'000'400.0);
  {
    server.reset_next(1, test::ResetPoint::after_handling, "log-batch");
    // Its pause after the lost answer outlasts the other batches in flight
    // however slow the machine, so that this process "dies" before retrying.
    upload::Uploader up(run.dir(), target(mlflow_url(server)), test::patient(6s));
    BOOST_REQUIRE(!up.open());
    auto p = up.pump(std::chrono::steady_clock::now() + 10s); // open, then the first batch: reset
    BOOST_TEST(!p.done);
    BOOST_TEST(p.wait_until.has_value());
    BOOST_TEST(up.state().points < 4500u); // the batch whose answer was lost is not known to be delivered here
  } // "killed": its offsets say nothing was delivered
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(drain(up).done);
  check_history(server, only_run(server).id, 1500);
}

BOOST_AUTO_TEST_CASE(mlflow_refused_key_is_reported_and_the_rest_delivered) {
  TrackingServer server;
  RunFixture run;
  run.history(0, 300);
  run.append("history.jsonl", "{\"_step\":300,\"_timestamp\":1700000075,\"k0\":3000,\"k1\":3001,\"k2\":3002,\"bad\":1}\n");
  run.write_run_json("finished", 1'700'000'100.0);
  server.refuse_key("bad");
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(drain(up).done);
  const auto r = only_run(server);
  check_history(server, r.id, 301);
  BOOST_TEST(server.metric_history(r.id, "bad").empty());
  BOOST_TEST(up.state().refused == 1u);
  const std::string refused = run.read("upload/" + up.target().id + ".refused.jsonl");
  BOOST_TEST(refused.find("\"key\":\"bad\"") != std::string::npos, refused);
  BOOST_TEST(refused.find("INVALID_PARAMETER_VALUE") != std::string::npos, refused);
}

BOOST_AUTO_TEST_CASE(mlflow_keys_it_would_refuse_are_mapped_and_recorded) {
  TrackingServer server;
  RunFixture run;
  const std::string long_key(300, 'x');
  std::string line = "{\"_step\":0,\"_timestamp\":1700000000,\"loss@rank#1\":1,\"a/../b\":2,\"/lead//dbl/\":3,\"ok/key-1.5 x\":4,\"";
  line += long_key + "\":5,\"caf\\u00e9\":6}\n";
  run.append("history.jsonl", line);
  run.write_run_json("finished", 1'700'000'001.0);
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(drain(up).done);
  const auto r = only_run(server);
  BOOST_TEST(up.state().refused == 0u);
  BOOST_TEST(r.metrics.size() == 6u);
  BOOST_TEST(r.metrics.count("ok/key-1.5 x") == 1u); // valid keys are kept as they are
  // The mapping file names every mapped key, and each maps to a stored key.
  simdjson::dom::parser parser;
  simdjson::dom::object map;
  BOOST_REQUIRE(parser.parse(run.read("upload/" + up.target().id + ".keys.json")).get(map) == simdjson::SUCCESS);
  std::set<std::string> originals;
  for (auto f : map) {
    originals.insert(std::string(f.key));
    std::string_view mapped;
    BOOST_REQUIRE(f.value.get(mapped) == simdjson::SUCCESS);
    BOOST_TEST(r.metrics.count(std::string(mapped)) == 1u, mapped);
    BOOST_TEST(mapped.size() <= 250u);
  }
  BOOST_TEST(originals == (std::set<std::string>{"loss@rank#1", "a/../b", "/lead//dbl/", long_key, "caf\xc3\xa9"}));
}

BOOST_AUTO_TEST_CASE(mlflow_artifacts_streamed) {
  TrackingServer server;
  RunFixture run;
  std::string blob(3u << 20, '\0');
  for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>((i * 131) >> 3);
  std::filesystem::create_directories(run.dir() + "/artifacts/ckpt");
  run.write("artifacts/ckpt/model.bin", blob);
  run.append("artifacts.jsonl", "{\"name\":\"ckpt/model.bin\",\"type\":\"model\",\"size\":3145728,\"sha256\":\"x\",\"rank\":0}\n");
  run.history(0, 10);
  run.write_run_json("finished", 1'700'000'010.0);
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(drain(up).done);
  const auto arts = server.artifacts(only_run(server).id);
  BOOST_REQUIRE_EQUAL(arts.count("ckpt/model.bin"), 1u);
  BOOST_TEST((arts.at("ckpt/model.bin") == blob));
}

BOOST_AUTO_TEST_CASE(mlflow_bad_credentials_stop_once) {
  TrackingServer server;
  RunFixture run;
  run.history(0, 10);
  server.fail_next(1, {401, "{\"error_code\":\"UNAUTHENTICATED\",\"message\":\"no token\"}", "", "experiments"});
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  auto p = drain(up);
  BOOST_TEST(p.stopped);
  BOOST_TEST(p.error.find("MLFLOW_TRACKING_TOKEN") != std::string::npos, p.error);
  BOOST_TEST(server.stats().requests == 1u); // never retried
}

BOOST_AUTO_TEST_CASE(one_uploader_per_run_and_target) {
  TrackingServer server;
  RunFixture run;
  upload::Uploader a(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!a.open());
  upload::Uploader b(run.dir(), target(mlflow_url(server)), quick());
  Error e = b.open();
  BOOST_TEST(static_cast<bool>(e));
  BOOST_TEST(e.message().find("pid " + std::to_string(::getpid())) != std::string::npos, e.message());
}

BOOST_AUTO_TEST_CASE(wandb_whole_run) {
  TrackingServer server;
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  RunFixture run;
  run.history(0, 400);
  run.append("system.jsonl", "{\"_timestamp\":1700000001.5,\"_runtime\":1.5,\"system.cpu.percent/node-0\":12.5}\n");
  run.write("config.json", "{\"lr\":0.001,\"layers\":[1,2]}");
  run.write("summary.json", "{\"_step\":399,\"best\":0.93}");
  run.write_run_json("finished", 1'700'000'100.0);
  upload::Uploader up(run.dir(), target(wandb_url(server) + "/team"), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(drain(up).done);
  auto r = server.wandb_run("team", "proj", "run");
  BOOST_REQUIRE(r);
  BOOST_TEST(r->history.size() == 400u);
  const std::string hist = run.read("history.jsonl");
  std::string joined;
  for (auto& l : r->history) joined += l + "\n";
  BOOST_TEST(joined == hist); // every line, once, in order, as written
  BOOST_REQUIRE_EQUAL(r->events.size(), 1u);
  BOOST_TEST(r->summary.find("\"best\":0.93") != std::string::npos);
  BOOST_TEST(r->complete);
  BOOST_TEST(r->exitcode.value_or(-1) == 0);
  BOOST_TEST(r->group == "grp");
  BOOST_TEST(r->display_name == "run-rank-3");
  BOOST_TEST(r->config.find("{\"value\":0.001}") != std::string::npos, r->config);
  // The key never lands in the run directory.
  for (const auto& e : std::filesystem::recursive_directory_iterator(run.dir())) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    BOOST_TEST(text.find("chorus-test-key") == std::string::npos, e.path());
  }
}

// A run whose end went up is resumed under its id (Options::resume): the
// second attempt's upload takes up the same W&B run, sets it running again,
// goes on from its offsets, and ends it again with that attempt's state.
BOOST_AUTO_TEST_CASE(wandb_resumed_run_runs_again_then_ends_with_one_history) {
  TrackingServer server;
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  RunFixture run;
  const auto remote = [&] {
    auto r = server.wandb_run("chorus-user", "proj", "run");
    BOOST_REQUIRE(r);
    return *r;
  };
  const auto history_on_server = [&] {
    std::string joined;
    for (const auto& l : remote().history) joined += l + "\n";
    return joined;
  };

  run.history(0, 300);
  run.write("summary.json", "{\"_step\":299,\"k0\":2990}");
  run.write_run_json("crashed", 1'700'000'075.0);
  {
    upload::Uploader up(run.dir(), target(wandb_url(server)), quick());
    BOOST_REQUIRE(!up.open());
    auto p = drain(up);
    BOOST_REQUIRE_MESSAGE(p.done, p.error);
  }
  BOOST_TEST(remote().state == "failed");
  BOOST_TEST(remote().exitcode.value_or(-1) == 1);
  BOOST_TEST(history_on_server() == run.read("history.jsonl"));

  // The second attempt trains from step 300 on, and its host uploads again.
  run.resume();
  run.history(300, 200);
  run.write("summary.json", "{\"_step\":499,\"k0\":4990}");
  upload::Uploader up(run.dir(), target(wandb_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  auto p = drain(up);
  BOOST_REQUIRE_MESSAGE(p.caught_up && !p.done && !p.stopped, p.error);
  BOOST_TEST(remote().state == "running");
  BOOST_TEST(history_on_server() == run.read("history.jsonl")); // steps 0..499, each once, in order
  BOOST_TEST(remote().summary.find("\"_step\":499") != std::string::npos, remote().summary);

  run.history(500, 20);
  run.write_run_json("finished", 1'700'000'130.0);
  p = drain(up);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  const auto r = remote();
  BOOST_TEST(r.state == "finished");
  BOOST_TEST(r.exitcode.value_or(-1) == 0);
  BOOST_TEST(history_on_server() == run.read("history.jsonl"));
  BOOST_TEST(r.history.size() == 520u);
  BOOST_TEST(up.state().points == 520u * 3); // no line sent twice
  BOOST_TEST(up.state().final_sent == "finished");
  BOOST_TEST(server.wandb_runs().size() == 1u);
}

namespace {

/// One target's view of the run on the server, for resumed_attempt_ended_before_its_upload.
struct Remote {
  std::string url;
  std::function<std::string()> state; // the server-side run's, in the server's terms
  std::string failed, finished;       // those terms for a crashed run and a finished one
  std::function<void(const RunFixture&, std::int64_t)> history; // checks steps [0, n): each once, in order
  std::string sets_running, sets_end; // what the body of the request doing it holds
};

/// A run whose end went up is resumed (Options::resume) and its second
/// attempt ends before any upload of it ran (the job ran without
/// CHORUS_UPLOAD): a later upload (`chorus sync`) sets the server-side run
/// running again, sends that attempt's history from the offsets (nothing
/// twice) and its end. The offsets file is one written before
/// final_attempt, which named no attempt.
void resumed_attempt_ended_before_its_upload(TrackingServer& server, const Remote& remote) {
  RunFixture run;
  run.history(0, 300);
  run.write_run_json("crashed", 1'700'000'075.0);
  const auto upload = [&] {
    upload::Uploader up(run.dir(), target(remote.url), quick());
    BOOST_REQUIRE(!up.open());
    const auto p = drain(up);
    BOOST_REQUIRE_MESSAGE(p.done, p.error);
    return up.state();
  };
  const upload::UploadState first = upload();
  BOOST_TEST(first.final_sent == "crashed");
  BOOST_TEST(first.final_attempt == 1u);
  BOOST_TEST(remote.state() == remote.failed);
  remote.history(run, 300);

  // The offsets file as chorus wrote it before final_attempt: still done.
  const std::string offsets = run.dir() + "/upload/" + target(remote.url).id + ".json";
  std::string text = test::files::slurp(offsets);
  const std::size_t key = text.find("\"final_attempt\":");
  BOOST_REQUIRE(key != std::string::npos);
  text.erase(key, text.find(',', key) + 1 - key);
  BOOST_REQUIRE(!platform::write_file_atomic(offsets, text));
  auto before = server.stats().requests;
  BOOST_TEST(upload().final_sent == "crashed");
  BOOST_TEST(server.stats().requests == before); // nothing sent again

  // The second attempt runs and ends with nothing uploading it.
  run.resume();
  run.history(300, 200);
  run.write_run_json("finished", 1'700'000'130.0);
  upload::UploadState st;
  BOOST_REQUIRE(!st.load(offsets));
  BOOST_TEST(!st.end_delivered(run.attempts)); // what `chorus sync --status` shows
  BOOST_TEST(st.end_delivered(1));

  const std::size_t seen = server.requests().size();
  const upload::UploadState second = upload();
  BOOST_TEST(second.final_sent == "finished");
  BOOST_TEST(second.final_attempt == 2u);
  BOOST_TEST(second.points == 500u * 3); // no line sent twice
  BOOST_TEST(remote.state() == remote.finished);
  remote.history(run, 500);
  // Running again before the new end, not only left at the earlier one.
  const auto requests = server.requests();
  std::size_t running = requests.size(), ended = requests.size();
  for (std::size_t i = requests.size(); i-- > seen;) {
    if (requests[i].body.find(remote.sets_running) != std::string::npos) running = i;
    if (requests[i].body.find(remote.sets_end) != std::string::npos) ended = i;
  }
  BOOST_TEST(running < ended);
  BOOST_TEST(ended < requests.size());

  before = server.stats().requests;
  BOOST_TEST(upload().final_sent == "finished");
  BOOST_TEST(server.stats().requests == before);
}

} // namespace

BOOST_AUTO_TEST_CASE(mlflow_resumed_attempt_ended_before_its_upload_goes_up_at_sync) {
  TrackingServer server({.record_requests = true});
  resumed_attempt_ended_before_its_upload(
      server, {mlflow_url(server), [&] { return only_run(server).status; }, "FAILED", "FINISHED",
               [&](const RunFixture&, std::int64_t steps) { check_history(server, only_run(server).id, steps); },
               "\"status\":\"RUNNING\"", "\"status\":\"FINISHED\""});
  BOOST_TEST(only_run(server).end_time.value_or(0) == 1'700'000'130'000); // the second attempt's end
}

BOOST_AUTO_TEST_CASE(wandb_resumed_attempt_ended_before_its_upload_goes_up_at_sync) {
  TrackingServer server({.record_requests = true});
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  const auto run = [&] {
    auto r = server.wandb_run("chorus-user", "proj", "run");
    BOOST_REQUIRE(r);
    return *r;
  };
  resumed_attempt_ended_before_its_upload(
      server, {wandb_url(server), [&] { return run().state; }, "failed", "finished",
               [&](const RunFixture& dir, std::int64_t steps) {
                 const auto r = run();
                 BOOST_REQUIRE_EQUAL(r.history.size(), static_cast<std::size_t>(steps));
                 std::string joined;
                 for (const auto& l : r.history) joined += l + "\n";
                 BOOST_TEST(joined == dir.read("history.jsonl")); // every line once, in order
               },
               "\"state\":\"running\"", "\"complete\":true"});
}

BOOST_AUTO_TEST_CASE(wandb_faults_every_line_once) {
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  struct Fault {
    const char* name;
    std::function<void(TrackingServer&)> inject;
  };
  const std::vector<Fault> faults{
      {"500s", [](TrackingServer& s) { s.fail_next(3, {500, "", "", "file_stream"}); }},
      {"429", [](TrackingServer& s) { s.fail_next(1, {429, "", "1", "file_stream"}); }},
      {"reset after applied", [](TrackingServer& s) { s.reset_next(2, test::ResetPoint::after_handling, "file_stream"); }},
      {"outage", [](TrackingServer& s) { s.outage(2s); }},
      {"rate limit", [](TrackingServer& s) { s.set_wandb_rate_limit(1); }},
  };
  for (const Fault& f : faults) {
    BOOST_TEST_CONTEXT(f.name) {
      TrackingServer server;
      RunFixture run;
      upload::Uploader up(run.dir(), target(wandb_url(server)), quick());
      BOOST_REQUIRE(!up.open());
      f.inject(server);
      for (int i = 0; i < 4; ++i) {
        run.history(i * 50, 50);
        drain(up, 10s);
      }
      run.write_run_json("killed", 1'700'000'100.0);
      auto p = drain(up);
      BOOST_REQUIRE_MESSAGE(p.done, p.error);
      auto r = server.wandb_run("chorus-user", "proj", "run");
      BOOST_REQUIRE(r);
      std::string joined;
      for (auto& l : r->history) joined += l + "\n";
      BOOST_TEST(joined == run.read("history.jsonl"));
      BOOST_TEST(r->complete);
      BOOST_TEST(r->exitcode.value_or(-1) == 143);
    }
  }
}

BOOST_AUTO_TEST_CASE(wandb_wrong_key_and_stopped_run_stop) {
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  TrackingServer server;
  RunFixture run;
  run.history(0, 5);
  {
    Env key("WANDB_API_KEY", "wrong");
    upload::Uploader up(run.dir(), target(wandb_url(server)), quick());
    BOOST_REQUIRE(!up.open());
    auto p = drain(up);
    BOOST_TEST(p.stopped);
    BOOST_TEST(p.error.find("WANDB_API_KEY") != std::string::npos, p.error);
    BOOST_TEST(p.error.find("wrong") == std::string::npos, p.error);
  }
  {
    Env key("WANDB_API_KEY", "chorus-test-key");
    upload::Uploader up(run.dir(), target(wandb_url(server)), quick());
    BOOST_REQUIRE(!up.open());
    BOOST_TEST(drain(up).caught_up);
    BOOST_REQUIRE(server.stop_wandb_run("chorus-user", "proj", "run"));
    run.history(5, 5);
    auto p = drain(up);
    BOOST_TEST(p.stopped);
    BOOST_TEST(p.error.find("stopped") != std::string::npos, p.error);
  }
  Error e;
  ::unsetenv("WANDB_API_KEY");
  upload::Uploader none(run.dir(), target(wandb_url(server) + "/x"), quick());
  e = none.open();
  BOOST_TEST(e.message().find("WANDB_API_KEY") != std::string::npos, e.message());
}

BOOST_AUTO_TEST_CASE(wandb_https_verifies_the_certificate) {
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  RunFixture run;
  std::filesystem::create_directories(run.root() + "/good");
  std::filesystem::create_directories(run.root() + "/other");
  const auto good = test::write_test_certificates(run.root() + "/good");
  const auto other = test::write_test_certificates(run.root() + "/other");
  TrackingServer::Options o;
  o.tls = good;
  TrackingServer server(o);
  run.history(0, 20);
  run.write_run_json("finished", 1'700'000'010.0);
  const std::string url = "wandb://127.0.0.1:" + std::to_string(server.port());
  {
    Env ca("CURL_CA_BUNDLE", other.ca);
    upload::Uploader up(run.dir(), target(url), quick());
    BOOST_REQUIRE(!up.open());
    auto p = drain(up);
    BOOST_TEST(p.stopped); // a certificate that does not verify is not retried
    BOOST_TEST(p.error.find("CURL_CA_BUNDLE") != std::string::npos, p.error);
    BOOST_TEST(!server.wandb_run("chorus-user", "proj", "run"));
  }
  Env ca("CURL_CA_BUNDLE", good.ca);
  upload::Uploader up(run.dir(), target(url), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(drain(up).done);
  auto r = server.wandb_run("chorus-user", "proj", "run");
  BOOST_REQUIRE(r);
  BOOST_TEST(r->history.size() == 20u);
  // Basic auth with user "api".
  for (const auto& h : server.authorization_headers()) BOOST_TEST(h.starts_with("Basic "));
}

BOOST_AUTO_TEST_CASE(mlflow_runs_racing_for_one_experiment) {
  // Eight per-rank runs of one project create its experiment at once: one
  // experiment, eight runs in it.
  TrackingServer server;
  std::vector<std::unique_ptr<RunFixture>> runs;
  for (int r = 0; r < 8; ++r) {
    runs.push_back(std::make_unique<RunFixture>("run" + std::to_string(r)));
    runs.back()->history(0, 20);
    runs.back()->write_run_json("finished", 1'700'000'010.0);
  }
  std::vector<std::thread> threads;
  std::atomic<int> done{0};
  const upload::UploadTarget to = target(mlflow_url(server)); // Boost.Test's checks stay on this thread
  for (auto& run : runs)
    threads.emplace_back([&, dir = run->dir()] {
      upload::Uploader up(dir, to, quick());
      if (!up.open() && drain(up).done) ++done;
    });
  for (auto& t : threads) t.join();
  BOOST_TEST(done.load() == 8);
  const auto exps = server.experiments();
  BOOST_TEST(std::count_if(exps.begin(), exps.end(), [](const auto& e) { return e.name == "proj"; }) == 1);
  const auto all = server.mlflow_runs();
  BOOST_REQUIRE_EQUAL(all.size(), 8u);
  for (const auto& r : all) {
    BOOST_TEST(r.experiment_id == all.front().experiment_id);
    check_history(server, r.id, 20);
  }
}

BOOST_AUTO_TEST_CASE(mlflow_non_finite_values_and_a_changed_config) {
  TrackingServer server;
  RunFixture run;
  run.append("history.jsonl", "{\"_step\":0,\"_timestamp\":1700000000,\"a\":\"NaN\",\"b\":\"Infinity\",\"c\":\"-Infinity\",\"d\":1}\n");
  run.write("config.json", "{\"lr\":0.1}");
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_TEST(drain(up).caught_up);
  run.write("config.json", "{\"lr\":0.2,\"wd\":0.01}"); // lr changed after upload; wd new
  run.write_run_json("finished", 1'700'000'001.0);
  BOOST_REQUIRE(drain(up).done);
  const auto r = only_run(server);
  BOOST_TEST(std::isnan(server.metric_history(r.id, "a").at(0).value));
  BOOST_TEST(server.metric_history(r.id, "b").at(0).value == 1.7976931348623157e308);
  BOOST_TEST(server.metric_history(r.id, "c").at(0).value == -1.7976931348623157e308);
  BOOST_TEST(r.params.at("lr") == "0.1"); // MLflow keeps the first value
  BOOST_TEST(r.params.at("wd") == "0.01");
  BOOST_TEST(r.tags.at("chorus.param.lr") == "0.2"); // the change is not lost
  BOOST_TEST(up.state().refused == 0u);
}

namespace {
/// A slice of lines at `steps`, as read (not to the file's end).
upload::KeptSlice slice_of(std::vector<std::int64_t> steps) {
  upload::KeptSlice k;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    k.slice.lines.emplace_back("{}");
    k.slice.after.push_back({});
  }
  k.steps = std::move(steps);
  return k;
}
} // namespace

// The W&B join by step: histograms.jsonl's step 6, read after history.jsonl,
// does not make step 5 whole there, as the row of step 5 may still be on its
// way (the run host writes it before step 6's histograms, but after this
// history read): step 5's histograms wait. Read before history.jsonl, it
// does: step 5 then has no row (histograms only).
BOOST_AUTO_TEST_CASE(a_step_of_histograms_read_after_the_history_says_nothing_of_its_rows) {
  const upload::KeptSlice history = slice_of({1, 2, 3, 4});
  const upload::KeptSlice histograms = slice_of({2, 5, 6});
  const upload::WholeSteps after = upload::whole_steps(history, histograms, nullptr, {}, std::nullopt);
  BOOST_TEST(after.history == 4u);
  BOOST_TEST(after.histograms == 1u); // step 2; 5 waits for its row, or for a later step read before the rows
  const upload::WholeSteps before =
      upload::whole_steps(history, histograms, nullptr, {.histograms = 6}, std::nullopt);
  BOOST_TEST(before.history == 4u);
  BOOST_TEST(before.histograms == 2u); // 2 and 5; 6 is the file's last step: more of it may come
}
