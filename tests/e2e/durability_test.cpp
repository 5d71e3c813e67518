// What a run makes durable, and when: the files' syncs and renames as the
// process makes them, seen through fsync, fdatasync and rename defined here
// (they take the place of libc's for the whole process, and call it).
//
// The start syncs none of run.json, config.json and summary.json: nothing
// waits on them before the WAL's first sync, which holds what they say. The
// finish syncs the WAL, which holds every line of the run, writing the end's
// files meanwhile, and only once that sync returned writes run.json (last):
// summary.json and run.json renamed into place without a sync of their
// own, as history.jsonl and config.json stand;
// run.json records their lengths, so that a crash of the machine that cuts
// one short is told (store::apply_liveness). system.jsonl, which the WAL
// does not hold, is synced during the finish; files never written are not
// synced at all. The finish does not start the writeback of the files the
// WAL holds either (sync_file_range, seen here too): nothing waits on it.
#define BOOST_TEST_MODULE durability
#include "local_run.hpp"

#include "io/platform/posix.hpp"
#include "io/store/lease.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Seen {
  std::string what; // "sync" (called), "synced" (returned), "writeback", "rename", or "mark"
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
  const std::string path = path_of(fd);
  note({"sync", path, ""});
  const int r = real(fd);
  if (r == 0) note({"synced", path, ""});
  return r;
}
int sync_file_range(int fd, off64_t offset, off64_t bytes, unsigned int flags) {
  static auto* real = next<int(int, off64_t, off64_t, unsigned int)>("sync_file_range");
  note({"writeback", path_of(fd), ""});
  return real(fd, offset, bytes, flags);
}
int rename(const char* from, const char* to) noexcept {
  static auto* real = next<int(const char*, const char*)>("rename");
  const int r = real(from, to);
  if (r == 0) note({"rename", to, from});
  return r;
}
}

BOOST_AUTO_TEST_CASE(the_start_syncs_nothing_the_first_log_waits_on_and_finish_syncs_the_wal_before_the_end) {
  e2e::TempDir dir;
  chorus::Options opt = e2e::local_options(dir, "durable");
  opt.system_interval = 0.1; // system.jsonl: lines the WAL does not hold
  mark("init");
  chorus::Run run = chorus::init(opt);
  BOOST_REQUIRE(run);
  run.log({{"loss", 1.0}});
  mark("first log");
  // No config call: config.json is the start's alone.
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

  // The WAL's last sync, during the finish: it makes the end durable.
  const long wal_synced = find_last(all, "synced", base + "/wal");
  BOOST_TEST_REQUIRE((wal_synced > finish && wal_synced < finished), "the WAL was not synced during the finish");

  for (const std::string name : {"run.json", "config.json", "summary.json"}) {
    const std::string file = base + "/" + name;
    // Written at the start (by the Run actor, which a run of one process
    // starts behind init: the first log does not wait for it), before the
    // finish, and not synced then.
    const long written = find(all, "rename", file, static_cast<std::size_t>(init));
    BOOST_TEST_REQUIRE((written >= 0 && written < finish), name << " is in place before the finish");
    BOOST_TEST(find(all, "sync", all[static_cast<std::size_t>(written)].from) == -1,
               name << " was synced at the start");
    BOOST_TEST(find(all, "sync", file) == -1, name << " was synced in place");
    const long last = find_last(all, "rename", file);
    if (name == "config.json") {
      BOOST_TEST(last == written, "config.json, unchanged since the start, was written again");
      continue;
    }
    // Its last version, written by the finish without a sync of its own:
    // run.json once the WAL's sync made the end durable, summary.json
    // while that sync runs.
    BOOST_TEST((last > (name == "run.json" ? wal_synced : finish) && last < finished),
               name << " is written again by finish" << (name == "run.json" ? ", after the WAL's sync" : ""));
    BOOST_TEST(find(all, "sync", all[static_cast<std::size_t>(last)].from) == -1,
               name << "'s last version was synced: the WAL's sync covers it");
  }
  BOOST_TEST(find_last(all, "rename", base + "/run.json") > find_last(all, "rename", base + "/summary.json"),
             "run.json is not the last file of the end");
  // The rows: the WAL holds them, so they are not synced; the system samples
  // (not in the WAL) are, during the finish.
  BOOST_TEST(find(all, "sync", base + "/history.jsonl") == -1);
  BOOST_TEST(find(all, "writeback", base + "/history.jsonl", static_cast<std::size_t>(finish)) == -1,
             "the finish started history.jsonl's writeback, which no sync waits on");
  BOOST_TEST(find(all, "sync", base + "/system.jsonl", static_cast<std::size_t>(finish)) != -1);
  // Files never written (no histogram, no image) are not synced: there is nothing in them to lose.
  BOOST_TEST(find(all, "sync", base + "/histograms.jsonl") == -1);
  BOOST_TEST(find(all, "sync", base + "/media.jsonl") == -1);

  // run.json holds the end's files to their lengths: as they are now, and
  // as a reader finds them.
  const chorus::Result<chorus::store::RunRecord> record = chorus::store::read_run_record(base);
  BOOST_REQUIRE_MESSAGE(record.has_value(), record.error().message());
  BOOST_TEST(!record->error.has_value(), record->error.value_or(""));
  std::vector<std::string> named;
  for (const auto& [name, bytes] : record->lengths) {
    named.push_back(name);
    BOOST_TEST(bytes == std::filesystem::file_size(base + "/" + name), name);
  }
  const std::vector<std::string> expected = {"history.jsonl", "events.jsonl", "summary.json", "config.json"};
  BOOST_TEST(named == expected, boost::test_tools::per_element());
}
