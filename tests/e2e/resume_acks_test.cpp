// A resumed run acknowledges nothing of the attempt it replayed to the new
// attempt's ranks.
//
// Resuming a run whose host died, the new host replays its WAL and closes
// the earlier attempt there (its ranks crashed, the run's end): those
// frames start a sync, and what the replay completed rode along with it.
// The new attempt's own rank joins in the meantime and numbers its calls
// afresh: an acknowledgement of the old attempt's calls reached it, and it
// refused the link, its values reported lost. The syncs are made slow here
// (fdatasync defined below takes libc's place for the whole process), so
// that the join always comes first.
#define BOOST_TEST_MODULE resume_acks
#include "local_run.hpp"

#include "io/platform/posix.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace {

std::atomic<bool> slow_syncs{false};

/// The offset of the WAL's first run_end frame (a host event of kind 6).
std::uintmax_t run_end_at(const fs::path& wal) {
  const std::string bytes = chorus::test::slurp(wal.string());
  std::size_t at = 0;
  while (at + 12 <= bytes.size()) {
    std::uint32_t len = 0;
    std::memcpy(&len, bytes.data() + at + 4, 4);
    if (len >= 2 && bytes[at + 12] == 2 && bytes[at + 13] == 6) return at;
    at += 12 + len;
  }
  return bytes.size();
}

} // namespace

extern "C" int fdatasync(int fd) {
  static auto* real = chorus::platform::dl_symbol<int (*)(int)>(RTLD_NEXT, "fdatasync");
  if (slow_syncs) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return real(fd);
}

BOOST_AUTO_TEST_CASE(the_new_attempts_rank_hears_no_ack_of_the_replayed_attempts_calls) {
  e2e::TempDir dir;
  chorus::Options opt = e2e::local_options(dir, "resumeacks");
  opt.run_id = "r1";
  opt.system_interval = 0;
  fs::path run_dir;
  {
    chorus::Run run = chorus::init(opt);
    BOOST_REQUIRE(run);
    run_dir = run.dir();
    for (int s = 0; s < 300; ++s) run.log({{"loss", 1.0 / (s + 1)}}, {.step = s});
    BOOST_REQUIRE(!run.finish().wait().error);
  }
  // As its host would have left it, dead before the end: the log stops
  // before run_end, and run.json says running.
  fs::resize_file(run_dir / "wal", run_end_at(run_dir / "wal"));
  std::string json = chorus::test::slurp((run_dir / "run.json").string());
  const std::size_t at = json.find("\"state\":\"finished\"");
  BOOST_REQUIRE(at != std::string::npos);
  json.replace(at, 18, "\"state\":\"running\"");
  std::ofstream(run_dir / "run.json", std::ios::trunc) << json;

  slow_syncs = true;
  opt.resume = chorus::Resume::allow;
  chorus::Run again = chorus::init(opt);
  BOOST_REQUIRE(again);
  // Its first call is acknowledged as its own: seq 1 of this attempt, not the old attempt's last.
  const chorus::Error e = again.log({{"loss", 0.5}}, {.step = 300}).wait();
  BOOST_TEST(!e, e.message());
  const chorus::FinishResult r = again.finish().wait();
  slow_syncs = false;
  BOOST_TEST(!r.error, r.error.message());
  BOOST_TEST(r.rows == 301u);
  BOOST_TEST((r.state == chorus::RunState::finished));
}
