// A live upload sends only what the run's synced WAL holds.
//
// The run host writes each frame to its WAL before its rows reach the files
// (tests/e2e/wal_first_test.cpp), but the WAL is made durable a moment
// later, by its fdatasync. An upload that read the rows in that moment, and
// a machine that crashed in it, would leave a server holding values the run
// lost. Here the WAL's syncs are held back (fdatasync defined below takes
// libc's place for the whole process, and waits while the test says so):
// rows logged meanwhile reach history.jsonl at the run's next flush, and
// must not reach the TensorBoard target until the WAL holding them is
// synced. Once it is, every row is there once.
#define BOOST_TEST_MODULE durable_upload
#include "tests/e2e/local_run.hpp"
#include "tests/upload/tfevents_reader.hpp"

#include "io/platform/posix.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace fs = std::filesystem;
namespace tb = chorus::test::tfevents;

namespace {

std::mutex gate_mutex;
std::condition_variable gate_moved;
bool held = false;       // the WAL's syncs wait
int waiting = 0;         // syncs of the WAL waiting now

bool is_wal(int fd) {
  char buf[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 4 && std::string_view(buf, static_cast<std::size_t>(n)).ends_with("/wal");
}

void hold(bool on) {
  {
    std::lock_guard lock(gate_mutex);
    held = on;
  }
  gate_moved.notify_all();
}

/// The steps of `tag` in the target's files for the run.
std::vector<std::int64_t> steps_of(const fs::path& run_dir, const std::string& tag) {
  std::vector<std::int64_t> out;
  for (const auto& [where, values] : tb::values_under(run_dir))
    if (std::get<0>(where).empty() && std::get<1>(where) == tag)
      for (std::size_t i = 0; i < values.size(); ++i) out.push_back(std::get<2>(where));
  return out;
}

} // namespace

extern "C" int fdatasync(int fd) {
  static auto* real = chorus::platform::dl_symbol<int (*)(int)>(RTLD_NEXT, "fdatasync");
  if (is_wal(fd)) {
    std::unique_lock lock(gate_mutex);
    ++waiting;
    gate_moved.notify_all();
    gate_moved.wait(lock, [] { return !held; });
    --waiting;
  }
  return real(fd);
}

BOOST_AUTO_TEST_CASE(rows_reach_the_target_only_once_the_wal_holding_them_is_synced) {
  e2e::TempDir dir;
  const fs::path tb_dir = dir.path / "tb";
  chorus::Options opt = e2e::local_options(dir, "durable");
  opt.system_interval = 0;
  opt.upload = "tensorboard:" + tb_dir.string();
  chorus::Run run = chorus::init(opt);
  BOOST_REQUIRE(run);
  const fs::path target = tb_dir / std::string(run.id());
  BOOST_REQUIRE(!run.log({{"loss", 1.0}}, {.step = 0}).wait()); // synced: the upload may take it

  hold(true);
  for (int s = 1; s <= 50; ++s) run.log({{"loss", 1.0 / (s + 1)}}, {.step = s});
  // The syncer is held with those rows' frames appended: the run host flushes
  // history.jsonl once a second and pokes the Uploader; two seconds see both.
  {
    std::unique_lock lock(gate_mutex);
    BOOST_REQUIRE(gate_moved.wait_for(lock, std::chrono::seconds(30), [] { return waiting > 0; }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const std::string history = chorus::test::slurp((fs::path(run.dir()) / "history.jsonl").string());
  BOOST_TEST_REQUIRE(history.find("\"_step\":49") != std::string::npos,
                     "the rows are in history.jsonl, their WAL not yet synced");
  for (const std::int64_t step : steps_of(target, "loss"))
    BOOST_TEST(step == 0, "the row of step " << step << " was uploaded before the WAL holding it was synced");

  hold(false);
  const chorus::FinishResult r = run.finish().wait();
  BOOST_REQUIRE(!r.error);
  BOOST_TEST(!r.upload_error, r.upload_error.message());
  std::vector<std::int64_t> all = steps_of(target, "loss");
  std::sort(all.begin(), all.end());
  BOOST_TEST_REQUIRE(all.size() == 51u);
  for (int s = 0; s <= 50; ++s) BOOST_TEST(all[static_cast<std::size_t>(s)] == s);
}
