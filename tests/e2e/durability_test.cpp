// What a run makes durable, and when: the files' syncs and renames as the
// process makes them, seen through fsync, fdatasync and rename defined here
// (they take the place of libc's for the whole process, and call it).
//
// The start syncs none of run.json, config.json and summary.json: nothing
// waits on them before the WAL's first sync, which holds what they say. Once
// finish() returns, run.json and summary.json were each renamed into place
// from a file synced first, config.json (which nothing changed since the
// start) was synced where it stood, and history.jsonl, system.jsonl (which
// the WAL does not hold) and the WAL were synced during the finish; files
// never written were not synced at all.
#define BOOST_TEST_MODULE durability
#include "local_run.hpp"

#include "io/platform/posix.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Seen {
  std::string what; // "sync", "rename", or "mark"
  std::string path; // synced or renamed into; the mark's name
  std::string from; // rename's source
};

std::mutex seen_mutex;
std::vector<Seen> seen;

std::string path_of(int fd) {
  char buf[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

void note(Seen s) {
  std::lock_guard lock(seen_mutex);
  seen.push_back(std::move(s));
}

/// libc's own `name`, the one these take the place of.
template <class F>
F* next(const char* name) {
  return chorus::platform::dl_symbol<F*>(RTLD_NEXT, name);
}

void mark(const std::string& name) { note({"mark", name, ""}); }

/// Where `what` of `path` (a file name at the end of it) was seen first, from `after` on; -1 if not.
long find(const std::vector<Seen>& all, const std::string& what, const std::string& path, std::size_t after = 0) {
  for (std::size_t i = after; i < all.size(); ++i)
    if (all[i].what == what && all[i].path == path) return static_cast<long>(i);
  return -1;
}

long find_last(const std::vector<Seen>& all, const std::string& what, const std::string& path) {
  for (std::size_t i = all.size(); i-- > 0;)
    if (all[i].what == what && all[i].path == path) return static_cast<long>(i);
  return -1;
}

} // namespace

extern "C" {
int fsync(int fd) {
  static auto* real = next<int(int)>("fsync");
  note({"sync", path_of(fd), ""});
  return real(fd);
}
int fdatasync(int fd) {
  static auto* real = next<int(int)>("fdatasync");
  note({"sync", path_of(fd), ""});
  return real(fd);
}
int rename(const char* from, const char* to) noexcept {
  static auto* real = next<int(const char*, const char*)>("rename");
  const int r = real(from, to);
  if (r == 0) note({"rename", to, from});
  return r;
}
}

BOOST_AUTO_TEST_CASE(the_start_syncs_nothing_the_first_log_waits_on_and_finish_leaves_every_file_durable) {
  e2e::TempDir dir;
  chorus::Options opt = e2e::local_options(dir, "durable");
  opt.system_interval = 0.1; // system.jsonl: lines the WAL does not hold
  mark("init");
  chorus::Run run = chorus::init(opt);
  BOOST_REQUIRE(run);
  run.log({{"loss", 1.0}});
  mark("first log");
  // No config call: config.json is the start's alone, and finish makes it durable all the same.
  for (int s = 1; s < 50; ++s) run.log({{"loss", 1.0 / s}, {"acc", 0.01 * s}});
  std::this_thread::sleep_for(std::chrono::milliseconds(300)); // a few system samples
  mark("finish");
  const chorus::FinishResult r = run.finish().wait();
  mark("finished");
  BOOST_REQUIRE(!r.error);
  BOOST_TEST(r.rows == 50u);
  std::vector<Seen> all;
  {
    std::lock_guard lock(seen_mutex);
    all = seen;
  }
  // The run's own files: their paths as the process names them (real paths).
  std::string base;
  for (const Seen& s : all)
    if (s.what == "rename" && s.path.ends_with("/run.json")) base = s.path.substr(0, s.path.size() - 9);
  BOOST_REQUIRE_MESSAGE(!base.empty(), "no run.json was renamed into place");
  const long init = find(all, "mark", "init"), first = find(all, "mark", "first log");
  const long finish = find(all, "mark", "finish"), finished = find(all, "mark", "finished");
  BOOST_REQUIRE(init >= 0 && first > init && finish > first && finished > finish);

  for (const std::string name : {"run.json", "config.json", "summary.json"}) {
    const std::string file = base + "/" + name;
    // Written at the start, before the first log returned, and not synced then.
    const long written = find(all, "rename", file, static_cast<std::size_t>(init));
    BOOST_TEST_REQUIRE((written >= 0 && written < first), name << " is in place before the first log returns");
    BOOST_TEST(find(all, "sync", all[static_cast<std::size_t>(written)].from) == -1,
               name << " was synced at the start");
    if (name == "config.json") {
      // Unchanged since the start: synced in place during the finish, not written again.
      const long last = find_last(all, "rename", file);
      BOOST_TEST(last == written, "config.json, unchanged since the start, was written again");
      const long synced = find(all, "sync", file, static_cast<std::size_t>(finish));
      BOOST_TEST((synced > finish && synced < finished), "config.json was not synced during the finish");
      continue;
    }
    // Its last version, renamed from a synced file, during the finish.
    const long last = find_last(all, "rename", file);
    BOOST_TEST((last > finish && last < finished), name << " is written again by finish");
    const long synced = find(all, "sync", all[static_cast<std::size_t>(last)].from);
    BOOST_TEST((synced >= 0 && synced < last), name << "'s last version was not synced before it took its place");
  }
  // The rows, the system samples and the WAL: synced during the finish, after the last log.
  BOOST_TEST(find(all, "sync", base + "/history.jsonl", static_cast<std::size_t>(finish)) != -1);
  BOOST_TEST(find(all, "sync", base + "/system.jsonl", static_cast<std::size_t>(finish)) != -1);
  // Files never written (no histogram, no image) are not synced: there is nothing in them to lose.
  BOOST_TEST(find(all, "sync", base + "/histograms.jsonl") == -1);
  BOOST_TEST(find(all, "sync", base + "/media.jsonl") == -1);
  bool wal_synced = false;
  for (std::size_t i = static_cast<std::size_t>(finish); i < static_cast<std::size_t>(finished); ++i)
    if (all[i].what == "sync" && all[i].path == base + "/wal") wal_synced = true;
  BOOST_TEST(wal_synced, "the WAL was not synced during the finish");
}
