#define BOOST_TEST_MODULE io_dir_watch
#include <boost/test/unit_test.hpp>

#include "io/platform/dir_watch.hpp"
#include "tests/io/files.hpp"
#include "tests/temp_dir.hpp"

#include <filesystem>
#include <fstream>
#include <string>

#include <sys/stat.h>

using chorus::platform::changes_all_seen_here;
using chorus::platform::DirWatch;
using chorus::test::TempDir;
using chorus::test::files::spit;
namespace fs = std::filesystem;

namespace {

/// How many inotify instances this process holds open.
int inotify_instances() {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(e.path(), ec).string() == "anon_inode:inotify") ++n;
  }
  return n;
}

/// A watch of `dirs`, or none where the test's directory is on a filesystem
/// the watch does not answer for (then each case says so and checks that).
bool watched(DirWatch& w, std::initializer_list<fs::path> dirs) {
  for (const fs::path& d : dirs)
    if (!w.add(d.string())) return false;
  return true;
}

} // namespace

BOOST_AUTO_TEST_CASE(each_change_of_a_watched_directory_is_told_once) {
  TempDir root;
  const fs::path run = root.path / "proj" / "run-1";
  fs::create_directories(run);
  DirWatch w;
  if (!changes_all_seen_here(root.path.string())) {
    BOOST_TEST(!watched(w, {root.path}));
    BOOST_TEST(w.changed()); // an incomplete watch always says "look"
    BOOST_TEST_MESSAGE("skipped: " << root.path << " is on a filesystem whose changes inotify may not all see");
    return;
  }
  BOOST_REQUIRE(watched(w, {root.path, root.path / "proj", run}));
  BOOST_TEST(w.complete());
  BOOST_TEST(!w.changed()); // nothing yet

  // A run's files replaced by rename (run.json), one created, one removed.
  spit(run / "run.json.tmp", "{}");
  BOOST_TEST(w.changed());
  BOOST_TEST(!w.changed()); // told once
  fs::rename(run / "run.json.tmp", run / "run.json");
  BOOST_TEST(w.changed());
  fs::remove(run / "run.json");
  BOOST_TEST(w.changed());

  // A file written in place, as by hand: told, many writes as one change.
  spit(run / "history.jsonl", "{}\n");
  BOOST_TEST(w.changed());
  {
    std::ofstream f(run / "history.jsonl", std::ios::app);
    for (int i = 0; i < 100; ++i) f << "{\"a\":" << i << "}\n" << std::flush;
  }
  BOOST_TEST(w.changed());
  BOOST_TEST(!w.changed());
  // Reading it changes nothing.
  {
    std::ifstream f(run / "history.jsonl");
    std::string line;
    while (std::getline(f, line)) {
    }
  }
  BOOST_TEST(!w.changed());

  // Who may read a file is what a listing shows of it.
  fs::permissions(run / "history.jsonl", fs::perms::owner_read);
  BOOST_TEST(w.changed());

  // A new run beside it, in the project's directory; then the run moved away.
  fs::create_directory(root.path / "proj" / "run-2");
  BOOST_TEST(w.changed());
  fs::rename(run, root.path / "elsewhere");
  BOOST_TEST(w.changed());
  BOOST_TEST(!w.changed());
  BOOST_TEST(w.complete());

  // restart(): the old directories are no longer watched.
  w.restart();
  BOOST_REQUIRE(watched(w, {root.path / "proj" / "run-2"}));
  spit(root.path / "elsewhere" / "x", "");
  fs::create_directory(root.path / "proj" / "run-3");
  BOOST_TEST(!w.changed());
  spit(root.path / "proj" / "run-2" / "run.json", "{}");
  BOOST_TEST(w.changed());
}

BOOST_AUTO_TEST_CASE(a_directory_it_cannot_answer_for_makes_the_watch_incomplete_until_restarted) {
  TempDir root;
  const int before = inotify_instances();
  DirWatch w;
  BOOST_TEST(inotify_instances() == before + 1);
  // /proc is no local filesystem of files; a missing directory cannot be watched.
  BOOST_TEST(!changes_all_seen_here("/proc"));
  BOOST_TEST(!changes_all_seen_here((root.path / "missing").string()));
  BOOST_TEST(!w.add("/proc"));
  BOOST_TEST(!w.complete());
  // Its watches are given back at once: the user's limit is shared.
  BOOST_TEST(inotify_instances() == before);
  BOOST_TEST(w.changed());
  BOOST_TEST(w.changed()); // and keeps saying so
  if (!changes_all_seen_here(root.path.string())) {
    BOOST_TEST_MESSAGE("skipped the rest: " << root.path << " is on a filesystem inotify may not see whole");
    return;
  }
  BOOST_TEST(!w.add(root.path.string())); // stays incomplete
  w.restart();
  BOOST_TEST(w.add(root.path.string()));
  BOOST_TEST(!w.add((root.path / "missing").string()));
  BOOST_TEST(!w.complete());
  BOOST_TEST(w.changed());
}

BOOST_AUTO_TEST_CASE(the_local_filesystems_are_known) {
  // Where the test runs (ext4, overlayfs, tmpfs or Btrfs in practice) and
  // /dev/shm (tmpfs) are local; a procfs or sysfs path is not.
  if (fs::exists("/dev/shm")) BOOST_TEST(changes_all_seen_here("/dev/shm"));
  BOOST_TEST(!changes_all_seen_here("/sys"));
}
