// The MLflow upload against a slow server, several log-batches in flight at
// once, and one chorus run staying one MLflow run: every point once.
#define BOOST_TEST_MODULE upload_mlflow_delivery
#include <boost/test/unit_test.hpp>

#include "io/upload/upload.hpp"
#include "tests/socket.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/uploading.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <thread>

using namespace chorus;
using namespace std::chrono_literals;
using test::check_history;
using test::drain;
using test::mlflow_url;
using test::only_run;
using test::quick;
using test::RunFixture;
using test::target;
using test::TrackingServer;

namespace {

using Clock = std::chrono::steady_clock;

/// Pumps as `chorus sync` does: a 250 ms slice at a time, sleeping through waits.
upload::Uploader::Progress pump_in_slices(upload::Uploader& up, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  upload::Uploader::Progress p;
  while (Clock::now() < end) {
    p = up.pump(std::min(end, Clock::now() + 250ms));
    if (p.done || p.stopped) break;
    if (p.wait_until) std::this_thread::sleep_until(std::min(*p.wait_until, end));
  }
  return p;
}

/// `rows` history rows and the end state; an Uploader of it to `url`, opened.
std::unique_ptr<upload::Uploader> finished_run(RunFixture& run, int rows, const std::string& url,
                                               const upload::UploadSettings& settings = quick()) {
  run.history(0, rows);
  run.write_run_json("finished", 1'700'000'000.0 + rows);
  auto up = std::make_unique<upload::Uploader>(run.dir(), target(url), settings);
  BOOST_REQUIRE(!up->open());
  return up;
}

/// After a killed upload of `rows` rows (its offsets file `lost` removed,
/// unless ""), a new Uploader delivers the rest: every point once, one run.
void upload_again(TrackingServer& server, RunFixture& run, const std::string& lost, int rows) {
  if (!lost.empty()) std::filesystem::remove(lost);
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  const auto p = drain(up);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  BOOST_REQUIRE_EQUAL(server.mlflow_runs().size(), 1u);
  check_history(server, only_run(server).id, rows);
  BOOST_TEST(up.state().points == static_cast<std::uint64_t>(rows) * 3u);
}

std::string blob(std::size_t size) {
  std::string b(size, '\0');
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((i * 131) >> 3);
  return b;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_slow_server_gets_every_request_its_own_time) {
  // Every answer takes 600 ms, more than the 250 ms slice `chorus sync`
  // pumps in: a slice decides only whether a request starts, so the upload
  // completes, the artifact whole.
  TrackingServer server;
  RunFixture run;
  run.history(0, 1200);
  const std::string artifact = blob(2u << 20);
  std::filesystem::create_directories(run.dir() + "/artifacts");
  run.write("artifacts/model.bin", artifact);
  run.append("artifacts.jsonl", "{\"name\":\"model.bin\",\"type\":\"model\",\"size\":2097152,\"sha256\":\"x\"}\n");
  run.write_run_json("finished", 1'700'000'300.0);
  server.set_delay(600ms);
  upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  const auto p = pump_in_slices(up, 90s);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  const auto r = only_run(server);
  check_history(server, r.id, 1200);
  BOOST_TEST(r.status == "FINISHED");
  const auto arts = server.artifacts(r.id);
  BOOST_REQUIRE_EQUAL(arts.count("model.bin"), 1u);
  BOOST_TEST((arts.at("model.bin") == artifact));
}

BOOST_AUTO_TEST_CASE(cut_requests_at_bounds_the_requests_in_flight) {
  // The drain at a run's finish and `chorus sync --timeout` must end in time:
  // requests in flight then are cut. The server applies them anyway; the
  // next upload reads that back and sends nothing twice.
  TrackingServer server;
  RunFixture run;
  auto up = finished_run(run, 1500, mlflow_url(server));
  server.set_delay(1500ms, "log-batch");
  const auto start = Clock::now();
  up->cut_requests_at(start + 300ms);
  // Uncut, the answers would come after 1.5 s and the upload would be done
  // within the pump's 10 s: cut, it ends with nothing acknowledged yet.
  const auto p = up->pump(start + 10s);
  BOOST_TEST(!p.done);
  BOOST_TEST(p.error.find("ran out") != std::string::npos, p.error);
  BOOST_TEST(up->state().points == 0u);
  std::this_thread::sleep_for(1800ms); // the server stores the batches it was sent
  server.clear_faults();
  up->cut_requests_at(upload::SteadyTime::max());
  const auto done = drain(*up);
  BOOST_REQUIRE_MESSAGE(done.done, done.error);
  check_history(server, only_run(server).id, 1500);
  BOOST_TEST(up->state().points == 4500u);
}

BOOST_AUTO_TEST_CASE(log_batches_go_several_at_once) {
  // 20 log-batches, each answered after 200 ms: one at a time takes 4 s.
  TrackingServer server;
  RunFixture run;
  auto up = finished_run(run, 6660, mlflow_url(server));
  server.set_delay(200ms, "log-batch");
  const auto p = drain(*up);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  check_history(server, only_run(server).id, 6660);
  // One request at a time keeps one kept-alive connection: several mean
  // requests that were in flight together.
  BOOST_TEST(server.stats().connections > 1u);
  BOOST_TEST(server.stats().connections <= 8u); // the window's most
}

BOOST_AUTO_TEST_CASE(a_window_with_lost_answers_then_a_crash_sends_nothing_twice) {
  // Batches in flight at once: some stored with their answer lost, one
  // refused before it was stored (a gap, with stored batches after it).
  // Then the process dies; the next one reads the server's record, with its
  // offsets file kept, and with it lost (as for another spelling of the
  // server's address): every point once either way.
  for (const bool keep_offsets : {true, false}) {
    for (int round = 0; round < 3; ++round) {
      BOOST_TEST_CONTEXT("keep offsets " << keep_offsets << ", round " << round) {
        TrackingServer server;
        RunFixture run;
        std::string state_file;
        {
          // Its pause after the failures outlasts the window's other answers,
          // so that it "dies" in that wait, before any retry.
          auto first = finished_run(run, 4000, mlflow_url(server), test::patient(6s));
          state_file = first->state_path();
          server.reset_next(2, test::ResetPoint::after_handling, "log-batch");
          server.fail_next(1, {503, "", "", "log-batch"});
          BOOST_TEST(!first->pump(Clock::now() + 10s).done); // the run made, a window of batches, then a wait
        } // "killed"
        upload_again(server, run, keep_offsets ? "" : state_file, 4000);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_same_server_spelled_another_way_is_the_same_run) {
  TrackingServer server;
  RunFixture run;
  run.history(0, 600);
  {
    upload::Uploader up(run.dir(), target(mlflow_url(server)), quick());
    BOOST_REQUIRE(!up.open());
    BOOST_REQUIRE(drain(up).caught_up);
  }
  run.history(600, 600);
  run.write_run_json("finished", 1'700'000'300.0);
  upload::Uploader up(run.dir(), target("mlflow://localhost:" + std::to_string(server.port())), quick());
  BOOST_REQUIRE(!up.open());
  const auto p = drain(up);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  const auto r = only_run(server);
  check_history(server, r.id, 1200);
  BOOST_TEST(r.status == "FINISHED");
  BOOST_TEST(up.state().points == 3600u);
  BOOST_TEST(up.state().remote_run == r.id);
}

BOOST_AUTO_TEST_CASE(a_lost_runs_create_answer_leaves_no_second_run) {
  // The server makes the run and its answer is lost: the next attempt finds
  // it by its chorus.run_id tag instead of making another.
  TrackingServer server;
  RunFixture run;
  auto up = finished_run(run, 300, mlflow_url(server));
  server.reset_next(1, test::ResetPoint::after_handling, "runs/create");
  const auto first = up->pump(Clock::now() + 10s);
  BOOST_TEST(!first.done);
  // libcurl's "Send failed since rewinding of the data stream failed", said as what it means.
  BOOST_TEST(first.error.find("the connection dropped after the request went out") != std::string::npos, first.error);
  BOOST_TEST(first.error.find("rewinding") == std::string::npos, first.error);
  const auto p = drain(*up);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  BOOST_REQUIRE_EQUAL(server.mlflow_runs().size(), 1u);
  check_history(server, only_run(server).id, 300);
  BOOST_TEST(server.stats().by_kind["mlflow/runs/create"] == 1u);
}

BOOST_AUTO_TEST_CASE(limit_silence_spares_a_server_that_answers_and_gives_up_on_one_that_does_not) {
  // A slow server that has answered keeps each request's own time under the
  // finish's limit (its answers take 4 times the limit), and stays reachable.
  TrackingServer server;
  RunFixture run;
  run.history(0, 3);
  auto up = std::make_unique<upload::Uploader>(run.dir(), target(mlflow_url(server)), quick());
  BOOST_REQUIRE(!up->open());
  auto p = up->pump(Clock::now() + 30s); // answered at once: the remote run is made, the rows sent
  BOOST_REQUIRE_MESSAGE(p.caught_up, p.error);
  server.set_delay(800ms);
  up->limit_silence(200ms);
  run.history(3, 300);
  run.write_run_json("finished", 1'700'000'300.0);
  p = drain(*up, 90s);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  BOOST_TEST(!up->unreachable());
  check_history(server, only_run(server).id, 303);

  // A server that takes the connection and never answers: cut after the
  // limit, and unreachable at once, since it never answered.
  const int silent = test::bound_socket(0, 16); // listening, never accepting
  BOOST_REQUIRE(silent >= 0);
  RunFixture other("other");
  auto lost = finished_run(other, 10, "mlflow://127.0.0.1:" + std::to_string(test::port_of(silent)));
  lost->limit_silence(200ms);
  BOOST_TEST(!lost->unreachable());
  p = lost->pump(Clock::now() + 30s);
  BOOST_TEST(p.wait_until.has_value());
  BOOST_TEST(lost->unreachable());
  BOOST_TEST(p.error.find("none within 0.2 s") != std::string::npos, p.error);
  ::close(silent);
}

BOOST_AUTO_TEST_CASE(an_answered_log_batch_is_replaced_before_a_slow_one_is_answered) {
  // The first log-batch is held until 8 more have arrived (or 20 s): a
  // window that waits for all its answers before sending more sends only 3
  // meanwhile; a sliding one refills each answered slot at once.
  TrackingServer server;
  RunFixture run;
  auto up = finished_run(run, 8000, mlflow_url(server)); // 24 log-batches
  server.hold_next(1, 20s, 8, "log-batch");
  const auto p = drain(*up, 60s);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  BOOST_TEST(server.stats().overtaken >= 8u);
  check_history(server, only_run(server).id, 8000);
  BOOST_TEST(up->state().points == 24000u);
}

BOOST_AUTO_TEST_CASE(a_crash_with_batches_answered_beyond_a_slow_one_sends_nothing_twice) {
  // Batches answered beyond one held: the process dies with the held one
  // in flight (its answer then lost, though the server stores it), with its
  // offsets file kept and lost. The run's tags name every batch answered
  // beyond the acknowledged offsets, so the next process skips them.
  for (const bool keep_offsets : {true, false}) {
    BOOST_TEST_CONTEXT("keep offsets " << keep_offsets) {
      TrackingServer server;
      RunFixture run;
      std::string state_file;
      {
        auto first = finished_run(run, 8000, mlflow_url(server));
        state_file = first->state_path();
        server.hold_next(1, 2s, 1000, "log-batch"); // held past the cut below
        first->cut_requests_at(Clock::now() + 1s);
        BOOST_TEST(!first->pump(Clock::now() + 10s).done);
      } // "killed"
      std::this_thread::sleep_for(1500ms); // the held batch is stored
      BOOST_TEST(server.stats().overtaken >= 1u); // batches answered beyond it
      upload_again(server, run, keep_offsets ? "" : state_file, 8000);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_window_grows_while_the_server_keeps_up_and_halves_when_it_is_busy) {
  // Every log-batch answered after 300 ms, however many are in flight: the
  // server keeps up, so more go at once than the 4 an upload starts with.
  TrackingServer::Options o;
  o.record_requests = true;
  TrackingServer server(o);
  RunFixture run;
  run.history(0, 16000); // 48 log-batches
  // The pause after the 503 outlasts the window's other answers however slow
  // the machine: the retry, and the window after it, come only after the first pump.
  upload::Uploader up(run.dir(), target(mlflow_url(server)), test::patient(4s));
  BOOST_REQUIRE(!up.open());
  server.set_delay(300ms, "log-batch");
  BOOST_REQUIRE(drain(up, 120s).caught_up);
  auto in_flight = [&](std::size_t from) {
    std::vector<unsigned> n;
    const auto all = server.requests();
    for (std::size_t i = from; i < all.size(); ++i)
      if (all[i].target.find("log-batch") != std::string::npos) n.push_back(all[i].in_flight);
    return n;
  };
  const std::vector<unsigned> grown = in_flight(0);
  const unsigned peak = *std::max_element(grown.begin(), grown.end());
  BOOST_TEST(peak > 4u);

  // A 503: the next window is half as wide, and grows from there.
  server.clear_faults();
  server.fail_next(1, {503, "", "", "log-batch"});
  run.history(16000, 8000);
  run.write_run_json("finished", 1'700'000'000.0 + 24000);
  const auto first = up.pump(Clock::now() + 10s); // a window, the 503, a wait
  BOOST_TEST(first.wait_until.has_value());
  const std::size_t after_503 = server.requests().size();
  server.set_delay(300ms, "log-batch");
  const auto p = drain(up, 120s);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  const std::vector<unsigned> halved = in_flight(after_503);
  // The window after the 503 goes out at once: its requests arrive with 1,
  // 2, ... in flight, recorded in any order (counted when their headers are
  // read, recorded once their body is). Half the peak and one more: a window
  // wider than half shows more than half among them, whatever the order.
  const std::size_t looked_at = (peak + 1) / 2 + 1;
  BOOST_REQUIRE(halved.size() >= looked_at);
  const unsigned widest = *std::max_element(halved.begin(), halved.begin() + static_cast<std::ptrdiff_t>(looked_at));
  BOOST_TEST(widest <= (peak + 1) / 2, "the first " << looked_at << " requests after the 503 went with up to " << widest
                                                    << " in flight; the peak before it was " << peak);
  check_history(server, only_run(server).id, 24000);
  BOOST_TEST(up.state().points == 72000u);
}
