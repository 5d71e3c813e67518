// `chorus show`, `ls` and `recover` on run directories made to hurt them:
// links, FIFOs and endless files where run files belong, numbers out of any
// range, files too large to be run files.
#define BOOST_TEST_MODULE cli_hostile_dirs
#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"

#include <fcntl.h>
#include <sys/stat.h>

using namespace chorus::test;
namespace fs = std::filesystem;

namespace {

const std::string good_run_json =
    R"({"id":"r1","name":"r1","project":"p","group":"g","mode":"shared","scope":"global","host":"elsewhere",)"
    R"("pid":4242,"state":"finished","start_time":1700000000,"end_time":1700000010,"world_size":1,)"
    R"("ranks":[{"rank":0,"state":"finished","last_step":2}]})"
    "\n";

const std::string good_history = R"({"_step":0,"loss":1.5})"
                                 "\n"
                                 R"({"_step":1,"loss":1.0})"
                                 "\n";

// ROOT/p/g/r1 with run.json, history.jsonl, summary.json, system.jsonl and a WAL.
fs::path make_run(const fs::path& root) {
  const fs::path dir = root / "p" / "g" / "r1";
  write_text(dir / "run.json", good_run_json);
  write_text(dir / "history.jsonl", good_history);
  write_text(dir / "summary.json", R"({"loss":1.0})");
  write_text(dir / "system.jsonl", "");
  write_text(dir / "wal", "");
  return dir;
}

// Runs chorus, failing the test (rather than hanging it) if it does not end in 20 s.
Output run_bounded(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  Child c(args, env);
  Output o = c.finish(std::chrono::seconds(20));
  BOOST_TEST(o.code != -1, "chorus " << args.front() << " hung");
  return o;
}

void replace_with_fifo(const fs::path& p) {
  fs::remove(p);
  BOOST_REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
}

std::size_t entries(const fs::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

} // namespace

BOOST_AUTO_TEST_CASE(recover_refuses_a_linked_wal_and_leaves_its_target_alone) {
  TempDir root;
  const fs::path dir = make_run(root.path);
  const fs::path outside = root.path / "precious";
  write_text(outside, std::string(3000, 'x'));
  fs::remove(dir / "wal");
  fs::create_symlink(outside, dir / "wal");
  for (const bool dry : {true, false}) {
    std::vector<std::string> args{"recover", dir.string()};
    if (dry) args.push_back("--dry-run");
    const Output o = run_bounded(args);
    BOOST_TEST(o.code == 1);
    BOOST_TEST(contains(o.err, "is a symbolic link"), o.err);
  }
  BOOST_TEST(fs::file_size(outside) == 3000u);
}

BOOST_AUTO_TEST_CASE(fifos_in_place_of_run_files_are_refused_without_hanging) {
  for (const std::string name : {"run.json", "history.jsonl", "summary.json", "system.jsonl", "wal"}) {
    BOOST_TEST_CONTEXT(name) {
      TempDir root, tmp;
      const fs::path dir = make_run(root.path);
      replace_with_fifo(dir / name);
      const Output show = run_bounded({"show", dir.string()});
      BOOST_TEST(contains(show.out + show.err, "not a regular file (a FIFO)") == (name != "wal"), show.out + show.err);
      const Output ls = run_bounded({"ls", root.str()});
      BOOST_TEST(ls.code == 0);
      const Output rec = run_bounded({"recover", "--dry-run", dir.string()}, {"TMPDIR=" + tmp.str()});
      if (name == "wal") BOOST_TEST(contains(rec.err, "not a regular file (a FIFO)"), rec.err);
      BOOST_TEST(entries(tmp.path) == 0u); // no chorus-recover-* left behind
    }
  }
}

BOOST_AUTO_TEST_CASE(a_fifo_group_json_is_refused_without_hanging) {
  TempDir root;
  const fs::path dir = make_run(root.path);
  ::mkfifo((dir.parent_path() / "group.json").c_str(), 0600);
  const Output ls = run_bounded({"ls", root.str()});
  BOOST_TEST(ls.code == 0);
  BOOST_TEST(contains(ls.out, "not a regular file (a FIFO)"), ls.out);
  const Output show = run_bounded({"show", dir.parent_path().string()});
  BOOST_TEST(contains(show.out + show.err, "not a regular file (a FIFO)"), show.out + show.err);
}

BOOST_AUTO_TEST_CASE(an_endless_history_is_cut_at_the_line_bound) {
  TempDir root;
  const fs::path dir = make_run(root.path);
  // A link to /dev/zero is refused outright; a regular file with no newline
  // in 17 MiB is read up to the bound.
  fs::remove(dir / "history.jsonl");
  fs::create_symlink("/dev/zero", dir / "history.jsonl");
  Output o = run_bounded({"show", dir.string()});
  BOOST_TEST(contains(o.out, "history.jsonl is a symbolic link"), o.out);
  fs::remove(dir / "history.jsonl");
  write_text(dir / "history.jsonl", good_history + std::string(17u << 20, 'a'));
  o = run_bounded({"show", dir.string()});
  BOOST_TEST(contains(o.out, "history.jsonl: line 3 runs past 16 MiB without a newline"), o.out);
}

BOOST_AUTO_TEST_CASE(a_run_file_of_absurd_size_is_refused_unread) {
  TempDir root;
  const fs::path dir = make_run(root.path);
  for (const char* name : {"run.json", "summary.json"}) {
    // Sparse: 1 GiB of address, no disk.
    fs::resize_file(dir / name, std::uintmax_t{1} << 30);
    const Output o = run_bounded({"show", dir.string()});
    BOOST_TEST(contains(o.out + o.err, std::string(name) + " is larger than 64 MiB"), o.out + o.err);
    write_text(dir / name, name == std::string("run.json") ? good_run_json : "{}");
  }
}

BOOST_AUTO_TEST_CASE(numbers_beyond_int64_are_reported_not_cast) {
  TempDir root;
  const fs::path dir = make_run(root.path);
  std::string j = good_run_json;
  j.replace(j.find("4242"), 4, "1e300");
  write_text(dir / "run.json", j);
  Output o = run_bounded({"show", dir.string()});
  BOOST_TEST(o.code == 1);
  BOOST_TEST(contains(o.err, "\"pid\" is 1e+300, beyond a whole number's range"), o.err);

  // Times no calendar holds are shown as unknown.
  j = good_run_json;
  j.replace(j.find("1700000000,"), 10, "1e300");
  j.replace(j.find("1700000010"), 10, "1e308");
  write_text(dir / "run.json", j);
  o = run_bounded({"show", dir.string()});
  BOOST_TEST(o.code == 0, o.err);

  write_text(dir / "run.json", good_run_json);
  write_text(dir / "history.jsonl", good_history + R"({"_step":1e300,"loss":0.5})" + "\n");
  o = run_bounded({"show", dir.string()});
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "1 unreadable lines skipped (first: line 3: a _step not written as a whole number)"), o.out);
}

BOOST_AUTO_TEST_CASE(group_ranks_out_of_range_are_refused) {
  TempDir root;
  const fs::path dir = make_run(root.path);
  write_text(dir.parent_path() / "group.json",
             R"({"group":"g","project":"p","size":2,"members":[{"id":"r1","state":"finished","index":0,)"
             R"("ranks":[{"rank":0,"state":"finished","last_step":1},)"
             R"({"rank":9223372036854775807,"state":"finished","last_step":1}]}]})");
  const Output o = run_bounded({"ls", root.str()});
  BOOST_TEST(contains(o.out, "group.json unreadable"), o.out);
  BOOST_TEST(contains(o.out, "\"ranks\""), o.out);
}

BOOST_AUTO_TEST_CASE(unreadable_run_files_name_the_cause) {
  TempDir root;
  const fs::path dir = make_run(root.path);
  fs::remove(dir / "run.json");
  fs::create_directory(dir / "run.json");
  Output o = run_bounded({"show", dir.string()});
  BOOST_TEST(o.code == 1);
  BOOST_TEST(contains(o.err, "run.json is not a regular file (a directory)"), o.err);

  fs::remove(dir / "run.json");
  fs::create_symlink("run.json", dir / "run.json");
  o = run_bounded({"show", dir.string()});
  BOOST_TEST(o.code == 1);
  BOOST_TEST(contains(o.err, "run.json is a symbolic link loop"), o.err);
  BOOST_TEST(!contains(o.err, "no run.json"), o.err);
}
