// `chorus show --follow`: a real job under `chorus launch` grows while show
// follows it; show draws it again as its files change, and stops by itself
// once the run has ended.
#define BOOST_TEST_MODULE cli_show_follow
#include "tests/e2e/harness.hpp"

#include <boost/test/unit_test.hpp>

#include <future>
#include <thread>

using namespace e2e;
using namespace std::chrono_literals;

namespace {

std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

} // namespace

BOOST_AUTO_TEST_CASE(follow_draws_a_growing_run_again_and_stops_when_it_ends) {
  chorus::test::TempDir dir;
  const fs::path runs = dir.path / "runs";
  // About 6 s of training: 60 steps of 100 ms.
  auto job = std::async(std::launch::async, [&] {
    return run("CHORUS_SYSTEM_INTERVAL=0 " + launch_worker(runs, 2, test_port(81), "--steps 60 --step-us 100000"));
  });
  fs::path run_dir;
  const auto until = std::chrono::steady_clock::now() + 60s * sanitizer_slowdown;
  while (run_dir.empty() && std::chrono::steady_clock::now() < until) {
    std::error_code ec;
    if (fs::is_directory(runs, ec))
      for (const fs::path& d : find_runs(runs))
        if (fs::exists(d / "history.jsonl")) run_dir = d;
    std::this_thread::sleep_for(20ms);
  }
  BOOST_REQUIRE(!run_dir.empty());
  const Output shown = run(bin("chorus") + " show " + run_dir.string() + " --follow --no-system --width 80 --metric loss");
  const Output trained = job.get();
  BOOST_TEST_INFO_SCOPE(shown.text << "\n---\n" << trained.text);
  BOOST_REQUIRE_EQUAL(trained.status, 0);
  BOOST_TEST(shown.status == 0); // it ended by itself, with the run
  // Several frames: drawn while running, then once more when finished.
  BOOST_TEST(count_of(shown.text, "run " + run_dir.filename().string() + "\n") >= 3u);
  BOOST_TEST(count_of(shown.text, "following " + run_dir.filename().string()) >= 2u);
  const std::size_t last = shown.text.rfind("run " + run_dir.filename().string() + "\n");
  const std::string final_frame = shown.text.substr(last);
  BOOST_TEST(final_frame.find("finished") != std::string::npos);
  BOOST_TEST(final_frame.find("history (60 rows") != std::string::npos);
  BOOST_TEST(final_frame.find("following") == std::string::npos);
  // An earlier frame had fewer rows.
  BOOST_TEST(shown.text.find("history (60 rows") > shown.text.find("history ("));
}

BOOST_AUTO_TEST_CASE(follow_of_an_ended_run_draws_it_once) {
  chorus::test::TempDir dir;
  const Output trained = run("CHORUS_SYSTEM_INTERVAL=0 " + launch_worker(dir.path, 2, test_port(82), "--steps 5"));
  BOOST_REQUIRE_EQUAL(trained.status, 0);
  const fs::path run_dir = find_runs(dir.path).front();
  const Output shown = run(bin("chorus") + " show " + run_dir.string() + " -f --no-system");
  BOOST_TEST_INFO_SCOPE(shown.text);
  BOOST_TEST(shown.status == 0);
  BOOST_TEST(count_of(shown.text, "run " + run_dir.filename().string() + "\n") == 1u);
  const Output two = run(bin("chorus") + " show " + run_dir.string() + " " + run_dir.string() + " --follow");
  BOOST_TEST(two.status == 2);
  BOOST_TEST(two.text.find("--follow follows one run") != std::string::npos, two.text);
}
