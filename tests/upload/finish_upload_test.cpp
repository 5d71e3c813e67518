// A run's finish with an upload target that is not there: nothing listens,
// or a server takes the connection and never answers. Finish returns with
// the run complete on disk, says in FinishResult::upload_error how much is
// left and which `chorus sync` sends it, and that command then delivers
// everything to a server that works.
#define BOOST_TEST_MODULE upload_finish
#include "tests/cli/process.hpp"
#include "tests/e2e/local_run.hpp"
#include "tests/socket.hpp"
#include "tests/upload/tracking_server.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

namespace {

using chorus::test::TrackingServer;

constexpr int steps = 50;

std::string mlflow_url(std::uint16_t port) { return "mlflow://127.0.0.1:" + std::to_string(port); }

/// A run of `steps` rows uploading to `url` (the default upload_timeout,
/// 30 s), finished.
chorus::FinishResult finished_run(const e2e::TempDir& dir, const std::string& url) {
  chorus::Options opt = e2e::local_options(dir, "finish");
  opt.upload = url;
  opt.system_interval = 0;
  chorus::Run run = chorus::init(opt);
  BOOST_REQUIRE(run);
  for (int s = 0; s < steps; ++s) run.log({{"loss", 1.0 / (s + 1)}, {"acc", s / 100.0}});
  return run.finish().wait();
}

/// What finish must say when the target never took a value: the run itself
/// is complete, the upload is not, and the error names how much is left and
/// the command that sends it.
void check_left_for_sync(const chorus::FinishResult& r, const std::string& url) {
  BOOST_TEST(!r.error, r.error.message());
  BOOST_TEST((r.state == chorus::RunState::finished));
  BOOST_TEST(r.rows == static_cast<std::uint64_t>(steps));
  BOOST_TEST((r.upload_error.code() == chorus::Errc::upload_incomplete), r.upload_error.message());
  BOOST_TEST(r.upload_left > 0u);
  const std::string& m = r.upload_error.message();
  BOOST_TEST(m.find("of history and system metrics") != std::string::npos, m);
  BOOST_TEST(m.find("`chorus sync " + r.run_dir + " --to " + url + "`") != std::string::npos, m);
  BOOST_TEST(e2e::read_history(r.run_dir).size() == static_cast<std::size_t>(steps)); // on disk, for sync
}

/// `chorus sync` of the run to `url`, where `server` now answers: every value arrives, with the end state.
void check_sync_delivers_everything(const chorus::FinishResult& r, const std::string& url,
                                    const TrackingServer& server) {
  const auto sync = chorus::test::run_chorus({"sync", r.run_dir, "--to", url});
  BOOST_TEST_INFO_SCOPE("sync: " << sync.out << sync.err);
  BOOST_REQUIRE_EQUAL(sync.code, 0);
  const auto runs = server.mlflow_runs();
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  BOOST_TEST(runs.front().status == "FINISHED");
  for (const char* key : {"loss", "acc"})
    BOOST_TEST(server.metric_history(runs.front().id, key).size() == static_cast<std::size_t>(steps), key);
}

} // namespace

BOOST_AUTO_TEST_CASE(nothing_listening_leaves_the_upload_to_sync) {
  std::uint16_t port = 0;
  { port = TrackingServer().port(); } // a port that nothing listens on now
  e2e::TempDir dir;
  const std::string url = mlflow_url(port);
  const chorus::FinishResult r = finished_run(dir, url);
  check_left_for_sync(r, url);
  BOOST_TEST(r.upload_error.message().find("no answer") != std::string::npos, r.upload_error.message());

  TrackingServer::Options so;
  so.port = port;
  TrackingServer server(so);
  check_sync_delivers_everything(r, url, server);
}

BOOST_AUTO_TEST_CASE(a_server_that_never_answers_leaves_the_upload_to_sync) {
  // Listening, never accepting: the kernel completes each connection, the
  // request goes out, and no answer ever comes.
  const int silent = chorus::test::bound_socket(0, 16);
  BOOST_REQUIRE(silent >= 0);
  const std::uint16_t port = chorus::test::port_of(silent);
  e2e::TempDir dir;
  const std::string url = mlflow_url(port);
  const chorus::FinishResult r = finished_run(dir, url);
  check_left_for_sync(r, url);
  BOOST_TEST(r.upload_error.message().find("no answer") != std::string::npos, r.upload_error.message());

  ::close(silent);
  TrackingServer::Options so;
  so.port = port;
  TrackingServer server(so);
  check_sync_delivers_everything(r, url, server);
}
