// The Uploader actor (actors/uploader.cpp) on CAF's test coordinator, against
// the loopback tracking server: its sender runs as a scheduled actor
// (Blocking::scheduled_for_tests), so each poke and the drain run on the
// test's thread, one message at a time, while the server answers on its own.
//
// Whether a backoff has passed is upload::Uploader's to decide, by the steady
// clock, which the test clock does not move: a backoff of the live upload
// here is none (the retry comes within the same poke) or an hour (its timer
// is due long after the test); only the drain, which waits out backoffs
// itself by design, is given short ones.
#define BOOST_TEST_MODULE actors_uploader
#include "tests/actors/caf_dsl.hpp"

#include "actors/uploader.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/uploading.hpp"

#include <string>
#include <tuple>

using namespace chorus;
using namespace chorus::actors;
using namespace std::chrono_literals;

namespace {

/// A run of 20 steps to upload to MLflow on the tracking server.
struct UploaderFixture : test::ActorFixture {
  test::TrackingServer server;
  test::RunFixture dir;
  uploader_actor uploader;
  caf::actor sender;

  UploaderFixture() { dir.history(0, 20); }

  void start(std::chrono::milliseconds backoff) {
    upload::UploadSettings settings;
    settings.backoff_base = settings.backoff_max = backoff;
    uploader = keep(spawn_uploader(sys, dir.dir(), test::mlflow_url(server), settings, Blocking::scheduled_for_tests));
    BOOST_TEST_REQUIRE(static_cast<bool>(uploader));
    sched.run();
  }

  /// New data was flushed: the Run pokes the Uploader, which passes it to its sender.
  void poke() {
    inject((upload_atom), from(self).to(uploader).with(upload_atom::value));
    if (!sender) sender = keep(receiver_of<upload_atom>(uploader));
    expect((upload_atom), from(uploader).to(sender).with(_));
  }

  /// The run ended: the Run asks for a drain within `ms`; its answer.
  std::tuple<bool, std::uint64_t, std::string> drain(std::int64_t ms) {
    inject((upload_drain_atom, std::int64_t), from(self).to(uploader).with(upload_drain_atom::value, ms));
    if (!sender) sender = keep(receiver_of<upload_drain_atom, std::int64_t>(self));
    expect((upload_drain_atom, std::int64_t), from(self).to(sender).with(_, ms)); // delegated: the answer goes to the Run
    std::tuple<bool, std::uint64_t, std::string> out;
    self->receive(
        [&](std::uint64_t left, const WireError& why) {
          BOOST_TEST((!why || why.error().code() == Errc::upload_incomplete));
          out = {!why, left, why.message};
        },
                  caf::after(std::chrono::seconds(0)) >> [] { BOOST_ERROR("the drain was not answered"); });
    return out;
  }
};

} // namespace

BOOST_FIXTURE_TEST_SUITE(uploader_actor, UploaderFixture)

BOOST_AUTO_TEST_CASE(a_poke_sends_what_there_is_trying_a_failed_request_again) {
  server.fail_next(1, {.status = 503});
  start(0ms);
  poke();
  const auto run = test::only_run(server);
  test::check_history(server, run.id, 20);
  BOOST_TEST(run.status == "RUNNING"); // the run goes on: no end state yet
  BOOST_TEST(pending_timers() == 0u);  // caught up: the next poke comes with new data

  dir.history(20, 5);
  poke();
  test::check_history(server, run.id, 25);
}

BOOST_AUTO_TEST_CASE(a_failure_backs_off_on_a_timer_and_a_poke_meanwhile_sends_nothing) {
  server.fail_next(1, {.status = 503});
  start(1h);
  poke();
  BOOST_TEST(server.stats().requests == 1u);
  BOOST_TEST(pending_timers() == 1u); // its retry, when the backoff ends

  poke();
  BOOST_TEST(server.stats().requests == 1u);
  BOOST_TEST(pending_timers() == 1u); // the same retry, not a second one

  // At the run's end the drain has a bound the backoff outlasts: it answers
  // at once with what is left and why, for `chorus sync`.
  dir.write_run_json("finished", 1'700'000'100.0);
  const auto [done, left, why] = drain(10'000);
  BOOST_TEST(!done);
  BOOST_TEST(left > 0u);
  BOOST_TEST(why.find("injected 503") != std::string::npos, why);
  BOOST_TEST(why.find("chorus sync " + dir.dir()) != std::string::npos, why);
  BOOST_TEST(server.stats().requests == 1u);
}

BOOST_AUTO_TEST_CASE(the_drain_tries_again_after_failures_and_delivers_the_end_within_its_bound) {
  dir.write_run_json("finished", 1'700'000'100.0);
  server.fail_next(2, {.status = 503});
  start(20ms); // the drain waits out each backoff, then tries again
  const auto [done, left, why] = drain(30'000);
  BOOST_TEST(done, why);
  BOOST_TEST(left == 0u);
  const auto run = test::only_run(server);
  test::check_history(server, run.id, 20);
  BOOST_TEST(run.status == "FINISHED");
}

BOOST_AUTO_TEST_SUITE_END()
