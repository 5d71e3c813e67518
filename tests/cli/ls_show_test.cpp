// `chorus ls` and `chorus show` on run directories written by hand.
#define BOOST_TEST_MODULE cli_ls_show
#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"

#include <cmath>
#include <fcntl.h>
#include <map>
#include <sys/file.h>

using namespace chorus::test;
namespace fs = std::filesystem;

namespace {

constexpr double gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;

// One system.jsonl line, as a rank's SystemMonitor writes it.
class SystemLine {
public:
  SystemLine(double t, int node, int rank) {
    text_ = R"({"_timestamp":)" + std::to_string(1'700'000'000 + t) + R"(,"_runtime":)" + std::to_string(t) +
            R"(,"_node":)" + std::to_string(node) + R"(,"_rank":)" + std::to_string(rank);
  }
  SystemLine& figure(const std::string& name, const std::string& label, double v) {
    text_ += ",\"system." + name + "/" + label + "\":" + std::to_string(v);
    return *this;
  }
  [[nodiscard]] std::string str() const { return text_ + "}\n"; }

private:
  std::string text_;
};

// The rows of the table whose heading line starts with `heading` ("NODE",
// "RANK"), as cells (columns are two or more spaces apart); the heading's
// two lines first.
std::vector<std::vector<std::string>> table(const std::string& out, const std::string& heading) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (rows.empty() && !line.starts_with("  " + heading + "  ")) continue;
    if (line.empty()) break;
    std::vector<std::string>& row = rows.emplace_back();
    for (std::size_t at = 2; at < line.size();) {
      const std::size_t gap = line.find("  ", at);
      row.push_back(line.substr(at, gap - at));
      at = gap == std::string::npos ? line.size() : line.find_first_not_of(' ', gap);
    }
  }
  return rows;
}

std::string section(const std::string& out, const std::string& title) {
  const std::size_t at = out.find("\n" + title);
  if (at == std::string::npos) return {};
  return out.substr(at + 1, out.find("\n\n", out.find("\n\n", at + 1) + 2) - at);
}

// The line of `out` that starts with `start` ("  state "); "" where none does.
std::string line_of(const std::string& out, const std::string& start) {
  for (const std::string& line : lines_of(out))
    if (line.starts_with(start)) return line;
  return {};
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
  make_run(root.path, "proj", "grp", {.id = "run-good", .world = 4, .crashed = 1});
  make_run(root.path, "proj", "grp", {.id = "run-second", .start = 1'700'000'500.0});
  write_text(root.path / "aaa" / "g" / "run-broken" / "run.json", "{\"id\": \"run-broken\", \"state\": ");
  write_text(root.path / "aaa" / "g" / "run-nowal" / "wal", "");
  make_run(root.path, "zzz", "later", {.id = "run-last"});

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
  make_run(root.path, "p", "g", {.id = "from-env"});
  const Output o = run_chorus({"ls"}, {"CHORUS_DIR=" + root.str()});
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "from-env"));
  const Output missing = run_chorus({"ls", (root.path / "nope").string()});
  BOOST_TEST(missing.code == 1);
  BOOST_TEST(contains(missing.err, "CHORUS_DIR"));
  BOOST_TEST(run_chorus({"ls", "--bogus"}).code == 2);
  BOOST_TEST(run_chorus({"ls", "--help"}).code == 0);
}

BOOST_AUTO_TEST_CASE(show_prints_identity_ranks_config_summary_and_charts) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "abc123", .world = 2, .crashed = 1});
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

BOOST_AUTO_TEST_CASE(show_gives_a_line_per_histogram_column_and_names_a_damaged_line) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "hist", .world = 2});
  write_text(dir / "history.jsonl", history(10));
  // histograms.jsonl as the run host writes it (README, "The run directory").
  // Bucket 16129 is [1, 1+1/128), 16257 [2, ...), 16321 [3, ...), 16385 [4, ...).
  // "grad", merged: 10 ones, 80 twos (odd steps: threes) and 10 fours; "act",
  // a column per rank: 5 ones, and at rank 1's last step 2 NaN besides.
  const auto line = [](int step, const std::string& key, const std::string& rank, const std::string& figures) {
    return R"({"_step":)" + std::to_string(step) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + step) +
           R"(,"_runtime":)" + std::to_string(step) + R"(,"key":")" + key + R"(","rank":)" + rank + "," + figures +
           "}\n";
  };
  std::string h;
  for (int s = 0; s < 10; ++s) {
    h += line(s, "act", "0", R"("count":5,"sum":5,"min":1,"max":1,"nan":0,"inf":0,"-inf":0,"buckets":[[16129,5]])");
    h += line(s, "act", "1",
              s == 9 ? R"("count":7,"sum":5,"min":1,"max":1,"nan":2,"inf":0,"-inf":0,"buckets":[[16129,5]])"
                     : R"("count":5,"sum":5,"min":1,"max":1,"nan":0,"inf":0,"-inf":0,"buckets":[[16129,5]])");
    h += line(s, "grad", "null",
              std::string(R"("_count":2,"count":100,"sum":)") + (s % 2 ? "290" : "210") +
                  R"(,"min":1,"max":4,"nan":0,"inf":0,"-inf":0,"buckets":[[16129,10],[)" + (s % 2 ? "16321" : "16257") +
                  R"(,80],[16385,10]])");
    if (s == 0) // line 4: its count is not its buckets'
      h += line(1, "grad", "null", R"("count":5,"sum":1,"min":1,"max":1,"nan":0,"inf":0,"-inf":0,"buckets":[[16129,1]])");
  }
  write_text(dir / "histograms.jsonl", h);

  const Output o = run_chorus({"show", dir.string(), "--width", "160"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(contains(o.out, "\nhistograms (3 columns, 30 lines)\n"));
  BOOST_TEST(contains(o.out, "  1 unreadable lines skipped (first: line 4: a histograms.jsonl line has a count that is "
                             "not the sum of its buckets"));
  const auto rows = table(o.out, "COLUMN");
  BOOST_REQUIRE_EQUAL(rows.size(), 4u);
  BOOST_TEST(rows[0] == (std::vector<std::string>{"COLUMN", "STEPS", "LAST STEP", "COUNT", "MIN", "P50", "MAX",
                                                  "P50 OVER STEPS", "P5-P95 SPREAD"}),
             boost::test_tools::per_element());
  std::map<std::string, std::vector<std::string>> by_column;
  for (const auto& r : rows) by_column[r.at(0)] = r;
  const std::vector<std::string>& grad = by_column["grad"];
  BOOST_REQUIRE_EQUAL(grad.size(), 9u);
  BOOST_TEST(grad[1] == "10");  // steps
  BOOST_TEST(grad[2] == "9");   // the last
  BOOST_TEST(grad[3] == "100"); // its count, min and max (exact), its median within 1/256 of 3
  BOOST_TEST(grad[4] == "1");
  BOOST_TEST(std::fabs(std::stod(grad[5]) - 3) <= 3.0 / 256);
  BOOST_TEST(grad[6] == "4");
  // The median goes 2, 3, 2, 3, ... over the steps; the spread (1 to 4) stays.
  BOOST_TEST(grad[7] == "▁█▁█▁█▁█▁█");
  BOOST_TEST(grad[8] == "██████████");
  const std::vector<std::string>& act0 = by_column["act/rank-0"];
  BOOST_REQUIRE_EQUAL(act0.size(), 9u);
  BOOST_TEST(act0[3] == "5");
  BOOST_TEST(act0[5] == "1");
  BOOST_TEST(act0[8] == "▁▁▁▁▁▁▁▁▁▁"); // no spread at all
  BOOST_REQUIRE_EQUAL(by_column["act/rank-1"].size(), 9u);
  BOOST_TEST(by_column["act/rank-1"][3] == "7 (2 NaN)");

  // --metric picks columns as it picks keys.
  const Output picked = run_chorus({"show", dir.string(), "--width", "160", "--metric", "act"});
  BOOST_REQUIRE_EQUAL(picked.code, 0);
  BOOST_TEST(contains(picked.out, "histograms (2 columns, 20 lines)"));
  BOOST_TEST(table(picked.out, "COLUMN").size() == 3u);
  // A run without histograms has no such section.
  fs::remove(dir / "histograms.jsonl");
  const Output none = run_chorus({"show", dir.string()});
  BOOST_REQUIRE_EQUAL(none.code, 0);
  BOOST_TEST(!contains(none.out, "\nhistograms"));
}

BOOST_AUTO_TEST_CASE(show_counts_media_per_column_with_the_last_file) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "media", .world = 2});
  write_text(dir / "history.jsonl", history(4));
  // media.jsonl as the run host writes it (io/store/media_log.hpp): "img" from
  // both ranks at steps 0..3, "note" from rank 1 alone; a line whose path
  // leaves media/ is damage, named.
  const auto line = [](int step, const std::string& key, int rank, const std::string& kind, const std::string& ext,
                       int size) {
    return R"({"_step":)" + std::to_string(step) + R"(,"_timestamp":1700000000.5,"_runtime":1.5,"key":")" + key +
           R"(","rank":)" + std::to_string(rank) + R"(,"kind":")" + kind + R"(","format":")" + ext +
           R"(","path":"media/)" + key + "-00000000/" + std::to_string(step) + "-rank" + std::to_string(rank) + "." +
           ext + R"(","size":)" + std::to_string(size) + (kind == "image" ? R"(,"width":2,"height":2})" : "}") + "\n";
  };
  std::string m;
  for (int s = 0; s < 4; ++s) {
    for (int r = 0; r < 2; ++r) m += line(s, "img", r, "image", "png", 1000 + r);
    if (s % 2 == 1) m += line(s, "note", 1, "text", "md", 2048);
  }
  m += R"({"_step":4,"_timestamp":1.5,"_runtime":1.5,"key":"x","rank":0,"kind":"text","format":"md","path":"../run.json","size":3})"
       "\n";
  write_text(dir / "media.jsonl", m);

  const Output o = run_chorus({"show", dir.string(), "--width", "200"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(contains(o.out, "\nmedia (3 columns, 10 files, 11.8 KiB, under " + dir.string() + "/)\n"));
  BOOST_TEST(contains(o.out, "  1 unreadable lines skipped (first: line 11: "));
  const auto rows = table(o.out, "MEDIA");
  BOOST_REQUIRE_EQUAL(rows.size(), 4u);
  BOOST_TEST(rows[0] == (std::vector<std::string>{"MEDIA", "KIND", "FILES", "STEPS", "SIZE", "LAST FILE"}),
             boost::test_tools::per_element());
  BOOST_TEST(rows[1] == (std::vector<std::string>{"img/rank-0", "image", "4", "0..3", "3.9 KiB",
                                                  "media/img-00000000/3-rank0.png"}),
             boost::test_tools::per_element());
  BOOST_TEST(rows[2] == (std::vector<std::string>{"img/rank-1", "image", "4", "0..3", "3.9 KiB",
                                                  "media/img-00000000/3-rank1.png"}),
             boost::test_tools::per_element());
  // A key one rank logged is under its plain name.
  BOOST_TEST(rows[3] == (std::vector<std::string>{"note", "text", "2", "1..3", "4.0 KiB",
                                                  "media/note-00000000/3-rank1.md"}),
             boost::test_tools::per_element());
  // --metric picks media columns as it picks keys.
  const Output picked = run_chorus({"show", dir.string(), "--width", "200", "--metric", "note"});
  BOOST_REQUIRE_EQUAL(picked.code, 0);
  BOOST_TEST(table(picked.out, "MEDIA").size() == 2u);
  fs::remove(dir / "media.jsonl");
  const Output none = run_chorus({"show", dir.string()});
  BOOST_REQUIRE_EQUAL(none.code, 0);
  BOOST_TEST(!contains(none.out, "\nmedia"));
}

BOOST_AUTO_TEST_CASE(show_gives_many_per_rank_keys_sparklines) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "wide", .world = 16});
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
  make_run(root.path, "p", "g", {.id = "x1-aaaa"});
  make_run(root.path, "p", "g", {.id = "x1-bbbb"});
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
  write_text(root.path / "p" / "g" / "bad" / "run.json", "not json");
  write_text(root.path / "p" / "g" / "bad" / "wal", "");
  const Output o = run_chorus({"show", (root.path / "p" / "g" / "bad").string()});
  BOOST_TEST(o.code == 1);
  BOOST_TEST(contains(o.err, "run.json"));
  BOOST_TEST(contains(o.err, "chorus recover"));
}

BOOST_AUTO_TEST_CASE(a_running_run_whose_host_died_is_called_crashed) {
  TempDir root;
  const fs::path dead = make_run(root.path, "p", "g", {.id = "dead", .state = "running", .ended = false, .last_step = -1});
  write_text(dead / "wal", "");
  write_text(dead / "summary.json", R"({"loss":0.5,"_step":41})");
  const fs::path live = make_run(root.path, "p", "g", {.id = "live", .state = "running", .ended = false});
  write_text(live / "wal", "");
  // This test plays the live run's host: it holds the WAL lock, as WalWriter does.
  const int fd = ::open((live / "wal").c_str(), O_RDWR | O_CLOEXEC);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);

  const Output show = run_chorus({"show", dead.string(), "--no-history"});
  BOOST_TEST(show.code == 0);
  BOOST_TEST_INFO(show.out);
  BOOST_TEST(contains(line_of(show.out, "  state "), "crashed (run.json says running, but its host was lost)"));
  BOOST_TEST(contains(show.out, "no longer holds the run's write-ahead log"));
  BOOST_TEST(contains(show.out, "last committed step 41"));
  BOOST_TEST(contains(show.out, "chorus recover " + dead.string()));
  const auto ranks = table(show.out, "RANK");
  BOOST_REQUIRE(ranks.size() == 5u); // the heading and 4 ranks
  BOOST_TEST(ranks[1][1] == "crashed");
  BOOST_TEST(ranks[1][2] == "41");
  BOOST_TEST(contains(ranks[1][4], "its run host (pid 2147483000 on " + hostname() + ") was lost"));

  const Output alive = run_chorus({"show", live.string(), "--no-history"});
  BOOST_TEST(alive.code == 0);
  BOOST_TEST(line_of(alive.out, "  state ").ends_with(" running"), alive.out);
  BOOST_TEST(!contains(alive.out, "crashed"));

  const Output ls = run_chorus({"ls", root.str()});
  BOOST_TEST(ls.code == 0);
  BOOST_TEST_INFO(ls.out);
  const auto listed = table(ls.out, "RUN");
  BOOST_REQUIRE(listed.size() == 3u);
  for (const auto& row : listed)
    if (row[0] == "dead") BOOST_TEST(row[1] == "crashed");
    else if (row[0] == "live") BOOST_TEST(row[1] == "running");
  BOOST_TEST(!contains(ls.out, "crashed?"));
  // The note under the listing names the run whose host was lost, and the fix.
  BOOST_TEST(contains(ls.out, "  dead: its host (pid 2147483000"));
  BOOST_TEST(!contains(ls.out, "  live: "));
  BOOST_TEST(contains(ls.out, "'chorus recover RUN' rebuilds the run's files"));
  ::close(fd);
}

BOOST_AUTO_TEST_CASE(a_run_on_another_host_reads_crashed_once_its_lease_expired) {
  TempDir root;
  const RunSpec running{.state = "running", .host = other_host, .ended = false, .last_step = -1};
  RunSpec spec = running;
  spec.id = "expired";
  const fs::path expired = make_run(root.path, "p", "g", spec);
  write_lease(expired, other_host, 3600);
  write_text(expired / "summary.json", R"({"_step":41})");
  spec.id = "fresh";
  write_lease(make_run(root.path, "p", "g", spec), other_host, 1);
  spec.id = "unleased"; // a run of an earlier version: nothing to go by from here
  make_run(root.path, "p", "g", spec);

  const Output ls = run_chorus({"ls", root.str()});
  BOOST_TEST(ls.code == 0);
  BOOST_TEST_INFO(ls.out);
  for (const auto& row : table(ls.out, "RUN"))
    if (row[0] == "expired") BOOST_TEST(row[1] == "crashed");
    else if (row[0] != "RUN") BOOST_TEST(row[1] == "running");
  BOOST_TEST(contains(ls.out, "  expired: its host (pid 2147483000 on " + other_host + ") stopped renewing its lease"));

  const Output show = run_chorus({"show", expired.string(), "--no-history"});
  BOOST_TEST(show.code == 0);
  BOOST_TEST_INFO(show.out);
  BOOST_TEST(contains(show.out, "crashed (run.json says running, but its host was lost)"));
  BOOST_TEST(contains(show.out, "s ago: it died or hangs; last committed step 41"));
  const auto ranks = table(show.out, "RANK");
  BOOST_REQUIRE(ranks.size() == 5u);
  for (std::size_t i = 1; i < ranks.size(); ++i) {
    BOOST_TEST(ranks[i][1] == "crashed");
    BOOST_TEST(ranks[i][2] == "41");
  }
  const Output fresh = run_chorus({"show", (root.path / "p/g/fresh").string(), "--no-history"});
  BOOST_TEST(line_of(fresh.out, "  state ").ends_with(" running"), fresh.out);
  const Output unleased = run_chorus({"show", (root.path / "p/g/unleased").string(), "--no-history"});
  BOOST_TEST(contains(unleased.out, "cannot be checked from here: it renews no lease"), unleased.out);
}

BOOST_AUTO_TEST_CASE(show_gives_each_ranks_message_and_sums_up_a_thousand_ranks) {
  TempDir root;
  // 1000 ranks on 125 hosts: rank 7 failed with an exception, 500-501 crashed, the rest finished.
  auto run_with = [&](const std::string& id, int world) {
    std::string ranks;
    for (int i = 0; i < world; ++i) {
      const bool failed = i == 7, crashed = i == 500 || i == 501;
      ranks += std::string(i ? "," : "") + R"({"rank":)" + std::to_string(i) + R"(,"state":")" +
               (failed ? "failed" : crashed ? "crashed" : "finished") + R"(","last_step":)" +
               (failed ? "12" : crashed ? "41" : "99") + R"(,"host":"node-)" + std::to_string(i / 8) +
               R"(","message":")" + (failed ? "ValueError: boom" : crashed ? "heartbeat lost" : "") + "\"}";
    }
    const fs::path dir = root.path / "p" / "g" / id;
    write_text(dir / "run.json", R"({"id":")" + id + R"(","project":"p","group":"g","host":"node-0","pid":1,)" +
                                     R"("state":"failed","start_time":1700000000,"end_time":1700000095,)" +
                                     R"("world_size":)" + std::to_string(world) + R"(,"ranks":[)" + ranks + "]}\n");
    return dir;
  };
  const Output few = run_chorus({"show", run_with("few", 16).string(), "--no-history", "--width", "200"});
  BOOST_TEST_INFO(few.out);
  const auto rows = table(few.out, "RANK");
  BOOST_REQUIRE(rows.size() == 17u); // one a rank
  BOOST_TEST(rows[8][0] == "7");
  BOOST_TEST(rows[8][1] == "failed");
  BOOST_TEST(rows[8][4] == "ValueError: boom");

  const Output many = run_chorus({"show", run_with("many", 1000).string(), "--no-history", "--width", "200"});
  BOOST_TEST(many.code == 0);
  BOOST_TEST_INFO(many.out);
  BOOST_TEST(contains(many.out, "ranks (1000: 2 crashed, 1 failed, 997 finished)"));
  const auto summed = table(many.out, "RANK");
  BOOST_TEST(summed.size() < 10u); // alike neighbours share a row
  const std::vector<std::vector<std::string>> expected{{"0-6", "finished", "99", "node-0", ""},
                                                       {"7", "failed", "12", "node-0", "ValueError: boom"},
                                                       {"8-499", "finished", "99", "62 hosts", ""},
                                                       {"500-501", "crashed", "41", "node-62", "heartbeat lost"},
                                                       {"502-999", "finished", "99", "63 hosts", ""}};
  BOOST_REQUIRE(summed.size() == expected.size() + 1);
  for (std::size_t i = 0; i < expected.size(); ++i)
    for (std::size_t c = 0; c < 4; ++c) BOOST_TEST(summed[i + 1][c] == expected[i][c], "row " << i << " column " << c);
  BOOST_TEST(summed[2][4] == "ValueError: boom");
}

// run.json's "joined" (when the run host accepted each rank's join): how far
// apart the ranks joined, from the run's start, and which never did.
BOOST_AUTO_TEST_CASE(show_says_how_far_apart_the_ranks_joined_and_which_never_did) {
  TempDir root;
  auto run_with = [&](const std::string& id, const std::string& ranks, const std::string& extra = "") {
    const fs::path dir = root.path / "p" / "g" / id;
    write_text(dir / "run.json", R"({"id":")" + id + R"(","project":"p","group":"g","host":"node-0","pid":1,)" +
                                     R"("state":"crashed","start_time":1700000000,"end_time":1700000095,)" + extra +
                                     R"("world_size":4,"ranks":[)" + ranks + "]}\n");
    return dir.string();
  };
  auto rank = [](int r, const std::string& state, const std::string& joined) {
    return R"({"rank":)" + std::to_string(r) + R"(,"state":")" + state + R"(","last_step":9,"host":"node-)" +
           std::to_string(r) + R"(","message":"")" + (joined.empty() ? "" : R"(,"joined":)" + joined) + "}";
  };
  // Rank 3 joined first, rank 1 last; rank 2 never connected.
  const std::string some = rank(0, "finished", "1700000000.25") + "," + rank(1, "finished", "1700000000.43") + "," +
                           rank(2, "crashed", "") + "," + rank(3, "finished", "1700000000.02");
  const Output o = run_chorus({"show", run_with("some", some), "--no-history", "--no-system"});
  BOOST_TEST(o.code == 0);
  BOOST_TEST_INFO(o.out);
  const std::string line = line_of(o.out, "  joined ");
  BOOST_TEST(line.ends_with(" 3 ranks within 0.41 s of each other (first rank 3 at +0.02 s, last rank 1 at +0.43 s "
                            "after the run started); 1 never joined: rank 2"),
             line);

  // A rank run.json does not list never joined either; a resumed run's joins are its last attempt's.
  const std::string listed = rank(0, "finished", "1700000100.5") + "," + rank(1, "finished", "1700000101.75");
  const Output resumed =
      run_chorus({"show",
                  run_with("resumed", listed,
                           R"("segments":[{"start_time":1700000000,"end_time":1700000050,"state":"crashed"},)"
                           R"({"start_time":1700000100,"end_time":1700000195,"state":"crashed"}],)"),
                  "--no-history", "--no-system"});
  BOOST_TEST(resumed.code == 0);
  BOOST_TEST(line_of(resumed.out, "  joined ")
                 .ends_with(" 2 ranks within 1.25 s of each other (first rank 0 at +0.50 s, last rank 1 at +1.75 s "
                            "after attempt 2 started); 2 never joined: ranks 2, 3"),
             resumed.out);

  // No line where fewer than two ranks have a join time (a run.json of an earlier version has none).
  const std::string one = rank(0, "finished", "1700000000.25") + "," + rank(1, "finished", "");
  const Output single = run_chorus({"show", run_with("one", one), "--no-history", "--no-system"});
  BOOST_TEST(single.code == 0);
  BOOST_TEST(line_of(single.out, "  joined ").empty(), single.out);
}

BOOST_AUTO_TEST_CASE(a_long_history_is_streamed) {
  TempDir root;
  const fs::path dir = make_run(root.path, "p", "g", {.id = "long"});
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

// 2 nodes of 2 ranks, 5 samples each; rank 3 has no GPU, node 1 no network figures, no node any disk figures.
std::string system_jsonl() {
  std::string lines;
  for (int t = 0; t < 5; ++t) {
    for (int rank = 0; rank < 4; ++rank) {
      const int node = rank / 2;
      const std::string r = "rank-" + std::to_string(rank), n = "node-" + std::to_string(node);
      static constexpr double rss[] = {1, 2, 3, 2.5, 2};
      SystemLine line(10.0 * t, node, rank);
      line.figure("proc.cpu.percent", r, 90 + rank + 2 * t)
          .figure("proc.memory.rss_bytes", r, rss[t] * gib)
          .figure("proc.threads", r, 12);
      if (rank != 3)
        line.figure("gpu.utilization_percent", r, 50 + 10 * t + rank)
            .figure("gpu.memory.used_bytes", r, (30 + t + rank) * gib)
            .figure("gpu.memory.total_bytes", r, 80 * gib)
            .figure("gpu.temperature_c", r, 60 + t)
            .figure("gpu.power_w", r, 400 + 10 * t)
            .figure("gpu.sm_clock_mhz", r, 1980);
      if (rank % 2 == 0) {
        line.figure("cpu.percent", n, 40 + 20 * node + 2 * t)
            .figure("cpu.count", n, 64)
            .figure("memory.used_bytes", n, (10 + t + node) * gib)
            .figure("memory.total_bytes", n, 64 * gib)
            .figure("memory.percent", n, 20);
        if (node == 0)
          line.figure("network.rx_bytes_per_s", n, 110 * mib).figure("network.tx_bytes_per_s", n, 1.5 * mib);
      }
      lines += line.str();
    }
    if (t == 2) lines += "{\"_timestamp\": oops}\n";
  }
  return lines + R"({"_timestamp":1700000050,"_node":0,"_rank":0,"system.proc.cpu)"; // its writer died mid-line
}

BOOST_AUTO_TEST_CASE(show_summarises_system_jsonl_per_node_and_per_rank) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "sys"});
  write_text(dir / "system.jsonl", system_jsonl());
  write_text(dir / "history.jsonl", history(3) + "not a row\n" + history(2));
  const Output o = run_chorus({"show", dir.string(), "--width", "200"});
  BOOST_TEST(o.code == 0);
  const std::string sys = section(o.out, "system (");
  BOOST_TEST_INFO(o.out);
  BOOST_TEST(contains(sys, "system (2 nodes, 4 ranks; 20 samples over 40.0s)"));
  BOOST_TEST(contains(sys, "2 lines skipped: 1 not JSON (first: line 13), 1 unfinished last line"));
  BOOST_TEST(o.out.find("ranks (") < o.out.find("system ("));
  BOOST_TEST(o.out.find("system (") < o.out.find("history ("));
  // The refactored line reader still numbers history's lines.
  BOOST_TEST(contains(o.out, "1 unreadable lines skipped (first: line 4:"));

  using Row = std::vector<std::string>;
  const auto nodes = table(sys, "NODE");
  BOOST_REQUIRE_EQUAL(nodes.size(), 4u);
  // No node has disk figures: no disk columns.
  BOOST_TEST((nodes[0] == Row{"NODE", "SAMPLES", "CPU %", "MEMORY", "NET RX / TX"}));
  BOOST_TEST((nodes[1] == Row{"", "mean / max", "max / total", "mean"}));
  BOOST_TEST((nodes[2] == Row{"0", "5", "44 / 48", "14.0 / 64.0 GiB", "110 / 1.5 MiB/s"}));
  BOOST_TEST((nodes[3] == Row{"1", "5", "64 / 68", "15.0 / 64.0 GiB", "-"}));

  const auto ranks = table(sys, "RANK");
  BOOST_REQUIRE_EQUAL(ranks.size(), 6u);
  BOOST_TEST((ranks[0] == Row{"RANK", "NODE", "SAMPLES", "CPU %", "RSS", "GPU %", "GPU MEMORY", "GPU TEMP",
                              "GPU POWER", "GPU % OVER TIME"}));
  BOOST_TEST((ranks[1] == Row{"", "mean / max", "last / max", "mean / max", "max / total", "max", "mean / max",
                              "(no GPU: CPU %)"}));
  const Row first(ranks[2].begin(), ranks[2].end() - 1), no_gpu(ranks[5].begin(), ranks[5].end() - 1);
  BOOST_TEST((first == Row{"0", "0", "5", "94 / 98", "2.0 / 3.0 GiB", "70 / 90", "34.0 / 80.0 GiB", "64 °C",
                           "420 / 440 W"}));
  BOOST_TEST(ranks[3][6] == "35.0 / 80.0 GiB");
  BOOST_TEST((no_gpu == Row{"3", "1", "5", "97 / 101", "2.0 / 3.0 GiB", "-", "-", "-", "-"}));
  // A sparkline of 5 samples: GPU use from 50% to 90% for rank 0, on a 0..100 scale.
  BOOST_TEST(ranks[2].back() == "▅▅▆▇▇");
  BOOST_TEST(ranks[5].back().size() == 5 * std::string("█").size());

  // At 100 columns the tables still fit, without their sparklines.
  const Output narrow = run_chorus({"show", dir.string(), "--width", "100"});
  const std::string narrow_sys = section(narrow.out, "system (");
  BOOST_TEST(!contains(narrow_sys, "…"));
  BOOST_TEST(!contains(narrow_sys, "OVER TIME"));
  BOOST_TEST(contains(narrow_sys, "420 / 440 W"));

  const Output skipped = run_chorus({"show", dir.string(), "--no-system"});
  BOOST_TEST(skipped.code == 0);
  BOOST_TEST(!contains(skipped.out, "system"));
}

BOOST_AUTO_TEST_CASE(show_says_when_a_run_has_no_system_samples) {
  TempDir root;
  const fs::path dir = make_run(root.path, "p", "g", {.id = "quiet"});
  const std::string none = "system: no samples (CHORUS_SYSTEM_INTERVAL=0, or the run was shorter than one interval)";
  BOOST_TEST(contains(run_chorus({"show", dir.string(), "--no-history"}).out, none));
  write_text(dir / "system.jsonl", "");
  BOOST_TEST(contains(run_chorus({"show", dir.string(), "--no-history"}).out, none));
  write_text(dir / "system.jsonl", "[1,2\n{\"_rank\":0}\n");
  const Output bad = run_chorus({"show", dir.string(), "--no-history"});
  BOOST_TEST(bad.code == 0);
  BOOST_TEST(contains(bad.out, none));
  BOOST_TEST(contains(bad.out, "2 lines skipped: 1 not JSON, 1 without system figures (first: line 1)"));
  BOOST_TEST(contains(run_chorus({"show", "--help"}).out, "--no-system"));
}

BOOST_AUTO_TEST_CASE(show_lists_64_ranks_in_numeric_order_one_line_each) {
  TempDir root;
  const fs::path dir = make_run(root.path, "p", "g", {.id = "big", .world = 64});
  std::string lines;
  for (int t = 0; t < 3; ++t)
    for (int rank = 63; rank >= 0; --rank) { // written out of order: rows are sorted by number
      SystemLine line(t, rank / 8, rank);
      line.figure("proc.cpu.percent", "rank-" + std::to_string(rank), 100 + t);
      if (rank % 8 == 0) line.figure("cpu.percent", "node-" + std::to_string(rank / 8), 50);
      lines += line.str();
    }
  write_text(dir / "system.jsonl", lines);
  const Output o = run_chorus({"show", dir.string(), "--width", "100"});
  BOOST_TEST(o.code == 0);
  const std::string sys = section(o.out, "system (");
  BOOST_TEST(contains(sys, "system (8 nodes, 64 ranks; 192 samples over 2.0s)"));
  BOOST_TEST(!contains(sys, "GPU")); // no rank has a GPU: no GPU columns, a CPU sparkline
  BOOST_TEST(contains(sys, "CPU % OVER TIME"));
  const auto nodes = table(sys, "NODE");
  BOOST_REQUIRE_EQUAL(nodes.size(), 10u);
  for (int n = 0; n < 8; ++n) BOOST_TEST(nodes[static_cast<std::size_t>(n) + 2][0] == std::to_string(n));
  const auto ranks = table(sys, "RANK");
  BOOST_REQUIRE_EQUAL(ranks.size(), 66u);
  for (int r = 0; r < 64; ++r) {
    const auto& row = ranks[static_cast<std::size_t>(r) + 2];
    BOOST_TEST(row[0] == std::to_string(r));
    BOOST_TEST(row[1] == std::to_string(r / 8));
    BOOST_TEST(row[3] == "101 / 102");
  }
}

// A group of four runs, a run per rank: two with their directories here, one
// whose directory is on another node (known from group.json only), one that
// never started.
fs::path make_group(const fs::path& root) {
  const fs::path dir = root / "proj" / "job7";
  for (int r = 0; r < 2; ++r) {
    const std::string id = "r" + std::to_string(r);
    const fs::path rd = make_run(root, "proj", "job7", {.id = id, .world = 1, .start = 1'700'000'000.0 + r});
    write_text(rd / "config.json", R"({"lr":0.)" + std::to_string(r + 1) + R"(,"opt":"sgd"})");
    write_text(rd / "summary.json", R"({"_step":9,"loss":0.)" + std::to_string(25 + 10 * r) + R"(,"best":)" +
                                        std::to_string(r + 1) + "}");
    std::string h;
    for (int s = 0; s < 10; ++s) {
      h += R"({"_step":)" + std::to_string(s) + R"(,"loss":)" + (s == 9 ? std::to_string(0.25 + 0.1 * r) : "1");
      if (r == 0) h += R"(,"acc":0.5)";
      h += "}\n";
    }
    write_text(rd / "history.jsonl", h);
  }
  auto member = [](int r, const std::string& id, const std::string& host, const std::string& state,
                   const std::string& extra) {
    return R"({"index":)" + std::to_string(r) + R"(,"id":")" + id + R"(","name":")" +
           (id.empty() ? "" : "job7-rank-" + std::to_string(r)) + R"(","dir":"/elsewhere/)" + id + R"(","host":")" +
           host + R"(","pid":1,"node":)" + std::to_string(r / 2) + R"(,"state":")" + state +
           R"(","message":"","start_time":1700000000,"end_time":1700000100,"rows":10,"ranks":[{"rank":)" +
           std::to_string(r) + R"(,"state":")" + state + R"(","last_step":9}])" + extra + "}";
  };
  write_text(dir / "group.json",
             R"({"group":"job7","project":"proj","mode":"new","scope":"global","launcher":"torchrun","job_id":"7",)"
             R"("host":"node0","size":4,"state":"failed","start_time":1700000000,"end_time":1700000100,"members":[)" +
                 member(0, "r0", "node0", "finished", "") + "," + member(1, "r1", "node0", "finished", "") + "," +
                 member(2, "remote2", "node9", "crashed", R"(,"summary":{"loss":0.5,"best":3})") + "," +
                 member(3, "", "", "missing", "") + R"(],"exit_codes":{"0":0,"1":0,"2":137}})");
  return dir;
}

BOOST_AUTO_TEST_CASE(ls_sums_up_a_group_and_lists_members_from_elsewhere) {
  TempDir root;
  make_group(root.path);
  const Output o = run_chorus({"ls", root.str()});
  BOOST_TEST_INFO(o.out);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "proj / job7  (group: 4 runs, new global, failed, 1m 40s, exit codes: 0=0 1=0 2=137)\n"));
  const auto rows = table(o.out, "RUN");
  BOOST_REQUIRE_EQUAL(rows.size(), 5u);
  using Row = std::vector<std::string>;
  BOOST_TEST((rows[0] == Row{"RUN", "STATE", "RANKS", "ROWS", "STARTED", "DURATION", "EXIT", "NAME"}));
  BOOST_TEST(rows[1][0] == "r0");
  BOOST_TEST(rows[1][2] == "1 (rank 0)");
  BOOST_TEST(rows[1][6] == "0");
  BOOST_TEST(rows[3][0] == "remote2");
  BOOST_TEST(rows[3][1] == "crashed");
  BOOST_TEST(rows[3][6] == "137");
  BOOST_TEST(rows[3][7] == "job7-rank-2 (on node9, not here)");
  BOOST_TEST(rows[4][1] == "missing");
  BOOST_TEST(rows[4][7] == "place 3: never registered");
}

BOOST_AUTO_TEST_CASE(show_group_puts_the_members_side_by_side) {
  TempDir root;
  const fs::path dir = make_group(root.path);
  const Output o = run_chorus({"show", "--dir", root.str(), "job7", "--width", "120"});
  BOOST_TEST_INFO(o.out << o.err);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(o.out.starts_with("group job7\n"));
  BOOST_TEST(contains(o.out, "4: 1 crashed, 2 finished, 1 missing"));
  using Row = std::vector<std::string>;
  const auto members = table(o.out, "MEMBER");
  BOOST_REQUIRE_EQUAL(members.size(), 5u);
  BOOST_TEST((members[1] == Row{"rank-0", "r0", "finished", hostname(), "0", "0", "99", "100", "0", "1m 35s"}));
  BOOST_TEST((members[3] == Row{"rank-2", "remote2", "crashed", "node9", "1", "2", "9", "10", "137", "1m 40s"}));
  BOOST_TEST((members[4] == Row{"place-3", "-", "missing", "-", "1", "3", "9", "-", "-", "1m 40s"}));
  // Config: only what differs among the members that have one, then what they share.
  const std::string config = section(o.out, "config (");
  BOOST_TEST(contains(config, "config (2 keys, 1 differ)"));
  const auto differ = table(config, "KEY");
  BOOST_REQUIRE_GE(differ.size(), 2u);
  BOOST_TEST((differ[0] == Row{"KEY", "rank-0", "rank-1", "rank-2"}));
  BOOST_TEST((differ[1] == Row{"lr", "0.1", "0.2", "-"}));
  BOOST_TEST(contains(config, "the same on every member: opt=sgd"));
  // Final values from each history here, from the summary reported for the one elsewhere.
  const std::string finals = section(o.out, "final values");
  const auto f = table(finals, "KEY");
  BOOST_REQUIRE_EQUAL(f.size(), 3u);
  BOOST_TEST((f[1] == Row{"_step", "9", "9", "-"}));
  BOOST_TEST((f[2] == Row{"loss", "0.25", "0.35", "0.5"}));
  BOOST_TEST((table(section(o.out, "summary"), "KEY")[1] == Row{"best", "1", "2", "3"}));

  // A member declares loss's summary its min: its summary's loss is no final value, and says what it is.
  write_text(dir / "r0" / "metrics.json", R"({"loss":{"reduce":"mean","summary":"min","step_metric":null}})");
  const Output declared = run_chorus({"show", dir.string(), "--width", "120"});
  BOOST_TEST_INFO(declared.out << declared.err);
  const auto summary = table(section(declared.out, "summary"), "KEY");
  BOOST_REQUIRE_EQUAL(summary.size(), 3u);
  BOOST_TEST((summary[2] == Row{"loss", "0.25 (min)", "0.35", "0.5"}));
  BOOST_TEST((table(section(declared.out, "final values"), "KEY")[2] == Row{"loss", "0.25", "0.35", "0.5"}));
  // Without the histories, the final values come from the summaries: not r0's loss.
  const Output summaries = run_chorus({"show", dir.string(), "--no-history"});
  const auto finals_of = table(section(summaries.out, "final values"), "KEY");
  BOOST_TEST(std::none_of(finals_of.begin(), finals_of.end(), [](const Row& r) { return r[0] == "loss"; }));

  // Narrow: the member columns go on in a second table.
  const Output narrow = run_chorus({"show", dir.string(), "--width", "30", "--no-history"});
  BOOST_TEST(narrow.code == 0);
  BOOST_TEST(count_of(section(narrow.out, "final values"), "  KEY  ") >= 2u, narrow.out);

  // A name two projects' groups share must be chosen by directory.
  make_run(root.path, "other", "job7", {.id = "x9"});
  const Output twice = run_chorus({"show", "--dir", root.str(), "job7"});
  BOOST_TEST(twice.code == 1);
  BOOST_TEST(contains(twice.err, "names 2 groups"));
  BOOST_TEST(contains(twice.err, (root.path / "other" / "job7").string()));
}
