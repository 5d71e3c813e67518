// `chorus ls` and `chorus show` on run directories written by hand.
#define BOOST_TEST_MODULE cli_ls_show
#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"

#include <cmath>
#include <fcntl.h>
#include <sys/file.h>

using namespace chorus::test;
namespace fs = std::filesystem;

namespace {

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

struct RunSpec {
  std::string id;
  std::string state = "finished";
  int world = 4;
  int crashed = 0;
  std::string host = hostname();
  double start = 1'700'000'000.0;
  bool ended = true;
};

std::string run_json(const RunSpec& r, const fs::path& dir) {
  std::string ranks;
  for (int i = 0; i < r.world; ++i) {
    const bool dead = i < r.crashed;
    ranks += std::string(i ? "," : "") + R"({"rank":)" + std::to_string(i) + R"(,"state":")" +
             (dead ? "crashed" : r.state == "running" ? "running" : "finished") + R"(","last_step":)" +
             (dead ? "41" : "99") + R"(,"host":")" + r.host + R"(","message":")" + (dead ? "heartbeat lost" : "") +
             "\"}";
  }
  return R"({"id":")" + r.id + R"(","name":")" + r.id + R"(-name","project":"proj","group":"grp","mode":"shared",)" +
         R"("scope":"global","host":")" + r.host + R"(","pid":2147483000,"dir":")" + dir.string() + R"(","state":")" +
         r.state + R"(","start_time":)" + std::to_string(r.start) + R"(,"end_time":)" +
         (r.ended ? std::to_string(r.start + 95.0) : "null") + R"(,"world_size":)" + std::to_string(r.world) +
         R"(,"rows":100,"rejected":0,"ranks":[)" + ranks + "]}\n";
}

fs::path make_run(const fs::path& root, const std::string& project, const std::string& group, const RunSpec& r) {
  const fs::path dir = root / project / group / r.id;
  write_text(dir / "run.json", run_json(r, dir));
  return dir;
}

// 100 rows of loss (every 10th NaN, one infinite), lr, and acc per rank.
std::string history(int rows = 100, int ranks = 2) {
  std::string h;
  for (int s = 0; s < rows; ++s) {
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s) +
         R"(,"_runtime":)" + std::to_string(s) + ",\"loss\":";
    h += s % 10 == 3 ? "\"NaN\"" : s == 50 ? "\"Infinity\"" : std::to_string(2.0 * std::exp(-s / 30.0));
    h += ",\"lr\":" + std::to_string(0.001 * (rows - s) / rows);
    for (int r = 0; r < ranks; ++r) h += ",\"acc/rank-" + std::to_string(r) + "\":" + std::to_string(s * 0.01 + r);
    h += R"(,"_count":{"loss":2}})"
         "\n";
  }
  return h;
}

bool has_braille(const std::string& s) {
  // U+2801..U+28FF in UTF-8: E2 A0..A3 xx.
  for (std::size_t i = 0; i + 1 < s.size(); ++i)
    if (static_cast<unsigned char>(s[i]) == 0xE2 && (static_cast<unsigned char>(s[i + 1]) & 0xFC) == 0xA0) return true;
  return false;
}

} // namespace

BOOST_AUTO_TEST_CASE(ls_lists_runs_by_project_and_group_and_survives_broken_ones) {
  TempDir root;
  make_run(root.path(), "proj", "grp", {.id = "run-good", .world = 4, .crashed = 1});
  make_run(root.path(), "proj", "grp", {.id = "run-second", .start = 1'700'000'500.0});
  write_text(root.path() / "aaa" / "g" / "run-broken" / "run.json", "{\"id\": \"run-broken\", \"state\": ");
  write_text(root.path() / "aaa" / "g" / "run-nowal" / "wal", "");
  make_run(root.path(), "zzz", "later", {.id = "run-last"});

  const Output o = run_chorus({"ls", root.str()});
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "5 runs"));
  BOOST_TEST(contains(o.out, "proj / grp"));
  BOOST_TEST(contains(o.out, "zzz / later"));
  BOOST_TEST(contains(o.out, "run-good"));
  BOOST_TEST(contains(o.out, "4 (1 crashed)"));
  BOOST_TEST(contains(o.out, "finished"));
  BOOST_TEST(contains(o.out, "1m 35s"));
  BOOST_TEST(contains(o.out, "run-good-name"));
  BOOST_TEST(contains(o.out, "run-broken  unreadable: run.json"));
  BOOST_TEST(contains(o.out, "run-nowal  unreadable: no run.json"));
  BOOST_TEST(contains(o.out, "run-last")); // after the broken ones
  BOOST_TEST(o.out.find("run-good") < o.out.find("run-second")); // by start time
}

BOOST_AUTO_TEST_CASE(ls_defaults_to_chorus_dir_and_fails_on_a_missing_dir) {
  TempDir root;
  make_run(root.path(), "p", "g", {.id = "from-env"});
  const Output o = run_chorus({"ls"}, {"CHORUS_DIR=" + root.str()});
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "from-env"));
  const Output missing = run_chorus({"ls", (root.path() / "nope").string()});
  BOOST_TEST(missing.code == 1);
  BOOST_TEST(contains(missing.err, "CHORUS_DIR"));
  BOOST_TEST(run_chorus({"ls", "--bogus"}).code == 2);
  BOOST_TEST(run_chorus({"ls", "--help"}).code == 0);
}

BOOST_AUTO_TEST_CASE(show_prints_identity_ranks_config_summary_and_charts) {
  TempDir root;
  const fs::path dir = make_run(root.path(), "proj", "grp", {.id = "abc123", .world = 2, .crashed = 1});
  write_text(dir / "history.jsonl", history());
  write_text(dir / "config.json", R"({"lr":0.001,"optimizer":"adam","layers":[64,32]})");
  write_text(dir / "summary.json", R"({"best_acc":0.975,"_step":99})");

  const Output o = run_chorus({"show", dir.string(), "--width", "100"});
  BOOST_TEST(o.code == 0);
  for (const char* s : {"run abc123", "abc123-name", "proj", "grp", "shared, scope global", "1m 35s", "finished",
                        "ranks (2)", "heartbeat lost", "optimizer", "adam", "[64,32]", "best_acc", "0.975",
                        "history (100 rows, 4 keys)", "_step"})
    BOOST_TEST(contains(o.out, s), "missing: " << s);
  BOOST_TEST(contains(o.out, "skipped 10 NaN and 1 infinite")); // loss
  BOOST_TEST(contains(o.out, "acc/rank-1"));
  BOOST_TEST(has_braille(o.out));
  BOOST_TEST(contains(o.out, "┤"));

  const Output ascii = run_chorus({"show", dir.string(), "--ascii", "--metric", "loss"});
  BOOST_TEST(ascii.code == 0);
  BOOST_TEST(!has_braille(ascii.out));
  BOOST_TEST(contains(ascii.out, "*"));
  BOOST_TEST(contains(ascii.out, "history (100 rows, 1 key)"));
  BOOST_TEST(!contains(ascii.out, "lr  ("));
}

BOOST_AUTO_TEST_CASE(show_gives_many_per_rank_keys_sparklines) {
  TempDir root;
  const fs::path dir = make_run(root.path(), "proj", "grp", {.id = "wide", .world = 16});
  write_text(dir / "history.jsonl", history(100, 16));
  const Output o = run_chorus({"show", dir.string(), "--width", "120"});
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "loss  ("));        // a chart
  BOOST_TEST(contains(o.out, "lr  ("));          // a chart
  BOOST_TEST(!contains(o.out, "acc/rank-3  (")); // no chart: a sparkline
  BOOST_TEST(contains(o.out, "acc/rank-15"));
  BOOST_TEST(contains(o.out, "▁"));
}

BOOST_AUTO_TEST_CASE(show_finds_a_run_by_id_under_dir) {
  TempDir root;
  make_run(root.path(), "p", "g", {.id = "x1-aaaa"});
  make_run(root.path(), "p", "g", {.id = "x1-bbbb"});
  const Output one = run_chorus({"show", "--dir", root.str(), "x1-aaaa", "--no-history"});
  BOOST_TEST(one.code == 0);
  BOOST_TEST(contains(one.out, "run x1-aaaa"));
  const Output prefix = run_chorus({"show", "x1-b", "--no-history"}, {"CHORUS_DIR=" + root.str()});
  BOOST_TEST(prefix.code == 0);
  BOOST_TEST(contains(prefix.out, "run x1-bbbb"));
  const Output ambiguous = run_chorus({"show", "--dir", root.str(), "x1"});
  BOOST_TEST(ambiguous.code == 1);
  BOOST_TEST(contains(ambiguous.err, "x1-aaaa"));
  const Output none = run_chorus({"show", "--dir", root.str(), "nothing"});
  BOOST_TEST(none.code == 1);
  BOOST_TEST(run_chorus({"show"}).code == 2);
  BOOST_TEST(run_chorus({"show", "--width", "wide", "x"}).code == 2);
}

BOOST_AUTO_TEST_CASE(show_reports_a_broken_run_json) {
  TempDir root;
  write_text(root.path() / "p" / "g" / "bad" / "run.json", "not json");
  write_text(root.path() / "p" / "g" / "bad" / "wal", "");
  const Output o = run_chorus({"show", (root.path() / "p" / "g" / "bad").string()});
  BOOST_TEST(o.code == 1);
  BOOST_TEST(contains(o.err, "run.json"));
  BOOST_TEST(contains(o.err, "chorus recover"));
}

BOOST_AUTO_TEST_CASE(a_running_run_whose_host_died_is_called_crashed) {
  TempDir root;
  const fs::path dead = make_run(root.path(), "p", "g", {.id = "dead", .state = "running", .ended = false});
  write_text(dead / "wal", "");
  const fs::path live = make_run(root.path(), "p", "g", {.id = "live", .state = "running", .ended = false});
  write_text(live / "wal", "");
  // This test plays the live run's host: it holds the WAL lock, as WalWriter does.
  const int fd = ::open((live / "wal").c_str(), O_RDWR | O_CLOEXEC);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);

  const Output show = run_chorus({"show", dead.string()});
  BOOST_TEST(show.code == 0);
  BOOST_TEST(contains(show.out, "CRASHED"));
  BOOST_TEST(contains(show.out, "chorus recover " + dead.string()));

  const Output alive = run_chorus({"show", live.string()});
  BOOST_TEST(alive.code == 0);
  BOOST_TEST(!contains(alive.out, "CRASHED"));

  const Output ls = run_chorus({"ls", root.str()});
  BOOST_TEST(ls.code == 0);
  BOOST_TEST(contains(ls.out, "crashed?"));
  BOOST_TEST(count_of(ls.out, "crashed?") == 2u); // the row and the footnote
  ::close(fd);
}

BOOST_AUTO_TEST_CASE(a_long_history_is_streamed) {
  TempDir root;
  const fs::path dir = make_run(root.path(), "p", "g", {.id = "long"});
  {
    std::ofstream f(dir / "history.jsonl");
    for (int s = 0; s < 300'000; ++s)
      f << R"({"_step":)" << s << R"(,"_timestamp":1.5,"_runtime":0.5,"loss":)" << 1.0 / (1 + s) << "}\n";
    f << R"({"_step":300000,"loss":)"; // a row being written: left out
  }
  const Output o = run_chorus({"show", dir.string(), "--width", "80"});
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "history (300000 rows, 1 key)"));
  BOOST_TEST(contains(o.out, "300000 points, steps 0..299999"));
  BOOST_TEST(!contains(o.out, "unreadable"));
}
