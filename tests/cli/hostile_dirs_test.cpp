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

// A line of 20 MiB in a file `chorus sync` uploads, to TensorBoard event
// files: the lines before it go, then the sync stops, naming the file, the
// line and the bound, and exits 1; it holds no more of the line than the
// bound (its peak memory against a sync of the run without that line).
BOOST_AUTO_TEST_CASE(sync_stops_at_a_line_past_the_bound_in_bounded_memory) {
  const auto row = [](int step) {
    return R"({"_step":)" + std::to_string(step) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + step) +
           R"(,"_runtime":)" + std::to_string(step) + R"(,"loss":)" + std::to_string(1.0 / (step + 1)) + "}\n";
  };
  const auto sample = [](int i) {
    return R"({"_timestamp":)" + std::to_string(1'700'000'000 + i) + R"(,"_runtime":)" + std::to_string(i) +
           R"(,"_node":0,"_rank":0,"system.cpu.percent/node-0":)" + std::to_string(10 + i) + "}\n";
  };
  const std::string long_line = R"({"_step":3,"loss":")" + std::string(20u << 20, 'x') + "\"}\n";
  for (const std::string file : {"history.jsonl", "system.jsonl"}) {
    BOOST_TEST_CONTEXT(file) {
      TempDir root;
      const fs::path dir = make_run(root.path), plain = make_run(root.path / "plain");
      std::string good_rows, good_samples;
      for (int s = 0; s < 3; ++s) good_rows += row(s), good_samples += sample(s);
      for (const fs::path& d : {dir, plain}) {
        write_text(d / "history.jsonl", good_rows);
        write_text(d / "system.jsonl", good_samples);
      }
      // Line 4 is the long one, two good lines follow it.
      write_text(dir / file, (file == "history.jsonl" ? good_rows : good_samples) + long_line +
                                 (file == "history.jsonl" ? row(4) + row(5) : sample(4) + sample(5)));
      const Output base = run_bounded({"sync", plain.string(), "--to", "tensorboard:" + root / "tb-plain"});
      BOOST_REQUIRE_MESSAGE(base.code == 0, base.err);
      const Output o = run_bounded({"sync", dir.string(), "--to", "tensorboard:" + root / "tb"});
      BOOST_TEST_INFO(o.err);
      BOOST_TEST(o.code == 1);
      BOOST_TEST(contains(o.err, (dir / file).string() + ": line 4 runs past 16 MiB without a newline"));
      BOOST_TEST(contains(o.err, "That line and every line after it are not read"));
      BOOST_TEST(!contains(o.out, "uploaded to"));
      BOOST_TEST_MESSAGE("peak memory: " << base.max_rss_kb << " KiB without the line, " << o.max_rss_kb
                                         << " KiB with it");
      BOOST_TEST(o.max_rss_kb < base.max_rss_kb + line_bound_slack_kb);
      // The lines before it went (the event files hold them), and --status says why the rest did not.
      BOOST_TEST(fs::exists(fs::path(root / "tb") / "r1"));
      const Output status = run_bounded({"sync", "--status", dir.string()});
      BOOST_TEST(contains(status.out, file), status.out); // the problem, cut to its first words
    }
  }
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
