// Nothing reaches a run's readable files before its frame is in the WAL.
//
// A host that dies between the two leaves files (and so an upload that read
// them, a dashboard, a script) with what its log does not hold: `chorus
// recover` then rebuilds a different run, and a TensorBoard or MLflow target
// keeps values the run no longer has. Here every write to the WAL is seen
// through writev defined below (it takes libc's place for the whole process):
// just before each one, the sizes of history.jsonl, events.jsonl,
// histograms.jsonl and media.jsonl, and run.json's state, are noted. After
// the run, the WAL cut where each write began is rebuilt by `chorus
// recover`: each file as it stood then must be a prefix of the rebuilt one,
// and run.json must not have said the run ended before its end was logged.
#define BOOST_TEST_MODULE wal_first
#include "local_run.hpp"

#include "io/platform/posix.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <array>
#include <climits>
#include <cmath>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::array<const char*, 4> line_files = {"history.jsonl", "events.jsonl", "histograms.jsonl", "media.jsonl"};

/// The run's files as they stood just before a write to its WAL.
struct Before {
  std::uintmax_t wal = 0;               // the WAL's size: the frames written before
  std::array<std::uintmax_t, 4> sizes{}; // of line_files
  std::string state;                     // run.json's
};

std::mutex seen_mutex;
std::vector<Before> seen;
std::string run_dir; // the WAL's directory, once seen

std::string path_of(int fd) {
  char buf[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

std::uintmax_t size_of(const fs::path& p) {
  std::error_code ec;
  const std::uintmax_t n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

/// run.json's "state", read plainly (its writer replaces it whole, by rename).
std::string state_in(const fs::path& run_json) {
  const std::string text = chorus::test::slurp(run_json.string());
  const std::size_t at = text.find("\"state\":\"");
  if (at == std::string::npos) return {};
  const std::size_t from = at + 9;
  return text.substr(from, text.find('"', from) - from);
}

void note_wal_write(const std::string& wal) {
  const fs::path dir = fs::path(wal).parent_path();
  Before b;
  b.wal = size_of(wal);
  for (std::size_t i = 0; i < line_files.size(); ++i) b.sizes[i] = size_of(dir / line_files[i]);
  b.state = state_in(dir / "run.json");
  std::lock_guard lock(seen_mutex);
  run_dir = dir.string();
  seen.push_back(std::move(b));
}

} // namespace

extern "C" ssize_t writev(int fd, const struct iovec* iov, int n) {
  static auto* real = chorus::platform::dl_symbol<ssize_t (*)(int, const struct iovec*, int)>(RTLD_NEXT, "writev");
  if (const std::string p = path_of(fd); p.ends_with("/wal")) note_wal_write(p);
  return real(fd, iov, n);
}

BOOST_AUTO_TEST_CASE(what_the_files_showed_at_each_wal_write_is_in_the_log_written_before_it) {
  e2e::TempDir dir;
  chorus::Options opt = e2e::local_options(dir, "walfirst");
  opt.system_interval = 0;
  chorus::Run run = chorus::init(opt);
  BOOST_REQUIRE(run);
  run.config({{"lr", 0.1}});
  const std::vector<double> spread = {0.5, 1.5, 2.5, 3.5};
  for (int s = 0; s < 40; ++s) {
    // A NaN at step 7 (an event, written at once), a histogram every third
    // step and a text at step 12 (their rows go out at once too).
    run.log({{"loss", s == 7 ? std::nan("") : 1.0 / (s + 1)}, {"acc", 0.01 * s}}, {.step = s});
    if (s % 3 == 0) run.log_histogram("grad", spread, {.step = s});
    if (s == 12) run.log_text("note", "step twelve", {.step = s});
    if (s % 4 == 0) BOOST_REQUIRE(!run.log({{"tick", 1.0}}, {.step = s}).wait()); // a frame of its own, now and then
  }
  const chorus::FinishResult r = run.finish().wait();
  BOOST_REQUIRE(!r.error);
  BOOST_TEST(r.rows == 40u);

  std::vector<Before> all;
  {
    std::lock_guard lock(seen_mutex);
    all = seen;
  }
  BOOST_REQUIRE(!run_dir.empty());
  BOOST_TEST_MESSAGE(all.size() << " WAL writes seen");
  BOOST_REQUIRE(all.size() > 10u);
  const fs::path live = run_dir;

  // The run's end is in the log before run.json says it ended.
  for (const Before& b : all) BOOST_TEST(b.state != "finished", "run.json said finished before its WAL held the end");

  // Each moment where the files had grown since the last write is checked.
  int checked = 0;
  std::array<std::uintmax_t, 4> last{};
  for (std::size_t k = 0; k < all.size(); ++k) {
    const Before& b = all[k];
    if (b.sizes == last || b.wal == 0) continue;
    last = b.sizes;
    // The WAL as it stood, and run.json, in a directory of their own, rebuilt.
    const fs::path cut = dir.path / ("cut-" + std::to_string(k));
    fs::create_directories(cut);
    fs::permissions(cut, fs::perms::owner_all);
    fs::copy_file(live / "run.json", cut / "run.json");
    fs::copy_file(live / "wal", cut / "wal");
    fs::resize_file(cut / "wal", b.wal);
    const e2e::Output rec = e2e::run(e2e::bin("chorus") + " recover " + cut.string());
    BOOST_TEST_INFO_SCOPE("after " << k << " WAL writes (" << b.wal << " bytes): " << rec.text);
    BOOST_REQUIRE_EQUAL(rec.status, 0);
    for (std::size_t i = 0; i < line_files.size(); ++i) {
      const std::string was = chorus::test::slurp((live / line_files[i]).string()).substr(0, b.sizes[i]);
      const std::string rebuilt = chorus::test::slurp((cut / line_files[i]).string());
      BOOST_TEST(rebuilt.starts_with(was), line_files[i] << " held " << b.sizes[i]
                                                         << " bytes that a replay of the log written before does "
                                                            "not rebuild");
    }
    ++checked;
  }
  BOOST_TEST_MESSAGE(checked << " moments checked");
  BOOST_TEST(checked >= 5);
}
