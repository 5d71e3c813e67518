// What a user meets first in `chorus ls` and `chorus show`: groups in the
// order they ran, the summary's bookkeeping in words, a live run's last
// steps, and several runs' curves in one chart.
#define BOOST_TEST_MODULE cli_show_runs
#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"

#include <iomanip>
#include <sstream>

using namespace chorus::test;
namespace fs = std::filesystem;

namespace {

/// The lines of `out` from the one that starts with `first` up to the next blank one.
std::vector<std::string> block(const std::string& out, const std::string& first) {
  std::vector<std::string> lines;
  for (const std::string& l : lines_of(out)) {
    if (lines.empty() && !l.starts_with(first)) continue;
    if (l.empty()) break;
    lines.push_back(l);
  }
  return lines;
}

/// `cells` whitespace-separated, as a table row prints them.
std::vector<std::string> words_of(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

} // namespace

BOOST_AUTO_TEST_CASE(ls_lists_a_projects_groups_by_start_time_newest_last) {
  TempDir root;
  // Names in the opposite order of their start: random ids and job ids say nothing of when.
  make_run(root.path, "proj", "a-newest", {.id = "r3", .start = 1'700'000'900.0});
  make_run(root.path, "proj", "b-middle", {.id = "r2", .start = 1'700'000'500.0});
  make_run(root.path, "proj", "c-oldest", {.id = "r1", .start = 1'700'000'100.0});
  make_run(root.path, "other", "z", {.id = "r0", .start = 1'700'000'999.0});
  const Output o = run_chorus({"ls", root.str()});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  const auto at = [&](const std::string& s) { return o.out.find(s); };
  BOOST_TEST(at("proj / c-oldest") < at("proj / b-middle"));
  BOOST_TEST(at("proj / b-middle") < at("proj / a-newest"));
  BOOST_TEST(at("other / z") < at("proj / c-oldest")); // projects by name
}

BOOST_AUTO_TEST_CASE(show_puts_the_summarys_bookkeeping_in_words) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "sum1"});
  write_text(dir / "summary.json", R"({"_step":99,"_runtime":95.0,"_timestamp":1700000095.0,"best_acc":0.975})");
  const Output o = run_chorus({"show", dir.string(), "--no-history", "--no-system", "--width", "120"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  const std::vector<std::string> summary = block(o.out, "summary");
  BOOST_REQUIRE_EQUAL(summary.size(), 3u); // the title, the last row, best_acc
  BOOST_TEST(summary[1].starts_with("  last row: step 99, "), summary[1]);
  BOOST_TEST(contains(summary[1], "1m 35s into the run"), summary[1]);
  BOOST_TEST(contains(summary[2], "best_acc"));
  for (const char* raw : {"_step", "_runtime", "_timestamp"}) BOOST_TEST(!contains(o.out, raw), raw);
}

BOOST_AUTO_TEST_CASE(show_gives_a_running_runs_ranks_their_last_committed_step) {
  TempDir root;
  // Hosted elsewhere, its lease fresh: alive (io/store/lease.hpp).
  const fs::path dir = make_run(root.path, "proj", "grp",
                                {.id = "live1", .state = "running", .world = 2, .host = other_host, .ended = false,
                                 .last_step = -1});
  write_lease(dir, other_host, 1);
  write_text(dir / "summary.json", R"({"_step":57,"_runtime":12.0,"_timestamp":1700000012.0,"loss":0.5})");
  const Output o = run_chorus({"show", dir.string(), "--no-history", "--no-system", "--width", "120"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  const std::vector<std::string> ranks = block(o.out, "ranks (2)");
  BOOST_REQUIRE_GE(ranks.size(), 4u);
  for (std::size_t r = 0; r < 2; ++r) {
    const auto row = words_of(ranks[2 + r]);
    BOOST_REQUIRE_GE(row.size(), 3u);
    BOOST_TEST(row[1] == "running");
    BOOST_TEST(row[2] == "57"); // not "-"
  }
  BOOST_TEST(contains(o.out, "last committed row"));
}

BOOST_AUTO_TEST_CASE(show_of_several_runs_overlays_their_curves_with_a_legend) {
  TempDir root;
  const fs::path a = make_run(root.path, "proj", "g1", {.id = "run-a"});
  const fs::path b = make_run(root.path, "proj", "g2", {.id = "run-b", .start = 1'700'000'500.0});
  write_text(a / "history.jsonl", history(100));
  write_text(b / "history.jsonl", history(40, 3)); // shorter, and a per-rank key run-a has not
  const Output o = run_chorus({"show", a.string(), "run-b", "--dir", root.str(), "--ascii", "--width", "100"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(contains(o.out, "runs (2)"));
  // One chart per metric, a series per run, and the legend naming both.
  BOOST_TEST(count_of(o.out, "\nloss  (2 of 2 runs)\n") == 1u);
  BOOST_TEST(count_of(o.out, "\nacc/rank-2  (1 of 2 runs)\n") == 1u);
  const std::vector<std::string> loss = block(o.out, "loss  (");
  bool star = false, ring = false;
  for (const std::string& l : loss) {
    if (!l.starts_with("  ") || l.find('|') == std::string::npos) continue; // plot lines only
    const std::string plot = l.substr(l.find('|') + 1);
    star = star || contains(plot, "*");
    ring = ring || contains(plot, "o");
  }
  BOOST_TEST(star);
  BOOST_TEST(ring);
  BOOST_TEST(contains(o.out, "  * run-a-name (run-a)  "));
  BOOST_TEST(contains(o.out, "  o run-b-name (run-b)  "));
  BOOST_TEST(contains(o.out, "steps 0..99"));
  BOOST_TEST(contains(o.out, "steps 0..39"));
  BOOST_TEST(contains(o.out, "(not logged)")); // run-a in acc/rank-2's legend
}

BOOST_AUTO_TEST_CASE(show_of_several_runs_refuses_what_it_cannot_overlay) {
  TempDir root;
  std::vector<std::string> nine{"show"};
  for (int i = 0; i < 9; ++i) nine.push_back(make_run(root.path, "p", "g", {.id = "n" + std::to_string(i)}).string());
  const Output many = run_chorus(nine);
  BOOST_TEST(many.code == 2);
  BOOST_TEST(contains(many.err, "9 runs"), many.err);
  BOOST_TEST(contains(many.err, "give fewer"), many.err);

  const Output group = run_chorus({"show", (root.path / "p" / "g").string(), (root.path / "p" / "g" / "n0").string()});
  BOOST_TEST(group.code == 1);
  BOOST_TEST(contains(group.err, "is a group"), group.err);
  BOOST_TEST(contains(group.err, "show it alone"), group.err);

  const Output missing = run_chorus({"show", "--dir", root.str(), "n0", "nothing-here"});
  BOOST_TEST(missing.code == 1);
  BOOST_TEST(contains(missing.err, "nothing-here"), missing.err);
}

BOOST_AUTO_TEST_CASE(show_smooths_as_tensorboard_and_puts_time_on_the_x_axis) {
  TempDir root;
  const fs::path dir = make_run(root.path, "p", "g", {.id = "sm"});
  // x: 0, 10, 0, 10, ... at 0.5 s a row.
  std::string h;
  for (int s = 0; s < 40; ++s)
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":1700000000,"_runtime":)" + std::to_string(s * 0.5) +
         R"(,"x":)" + std::to_string(s % 2 == 0 ? 0 : 10) + "}\n";
  write_text(dir / "history.jsonl", h);
  const std::vector<std::string> base{"show", dir.string(), "--no-system", "--width", "80", "--metric", "x"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_chorus(args);
  };
  const Output raw = with({});
  BOOST_REQUIRE_EQUAL(raw.code, 0);
  BOOST_TEST(contains(raw.out, "last 10"), raw.out);
  // Debiased EMA with weight 0.9 over 0, 10, 0, 10, ...: the last of 40 points is
  // sum(0.1 * 0.9^k * x[39-k]) / (1 - 0.9^40).
  double ema = 0, debias = 1;
  for (int s = 0; s < 40; ++s) {
    ema = ema * 0.9 + 0.1 * (s % 2 == 0 ? 0 : 10);
    debias *= 0.9;
  }
  const Output smooth = with({"--smooth", "0.9"});
  BOOST_TEST_INFO_SCOPE(smooth.out << smooth.err);
  BOOST_REQUIRE_EQUAL(smooth.code, 0);
  std::ostringstream want;
  want << "last " << std::setprecision(6) << ema / (1 - debias);
  BOOST_TEST(contains(smooth.out, want.str()), want.str());
  BOOST_TEST(!contains(smooth.out, "last 10"));
  // Time into the run on the x axis: 0 to 19.5 s.
  const Output time = with({"--x", "time"});
  BOOST_TEST_INFO_SCOPE(time.out << time.err);
  BOOST_REQUIRE_EQUAL(time.code, 0);
  BOOST_TEST(contains(time.out, "19.5s into the run"));
  BOOST_TEST(!contains(time.out, "_step"));
  // A glob and a regular expression pick keys; wrong values name what they take.
  BOOST_TEST(run_chorus({"show", dir.string(), "--no-system", "--metric", "/^x$/"}).code == 0);
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--smooth", "1"}, {"--smooth", "-0.1"},
                                              {"--x", "wall"}, {"--metric", "/[/"}}) {
    const Output o = with(bad);
    BOOST_TEST(o.code == 2, bad[0] << " " << bad[1]);
    BOOST_TEST(contains(o.err, bad[0]), o.err);
  }
}

BOOST_AUTO_TEST_CASE(show_says_a_declared_summary_and_step_metric) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "decl", .world = 2});
  write_text(dir / "history.jsonl", history(100, 2));
  write_text(dir / "summary.json", R"({"_step":99,"loss":0.123,"lr":0.00001,"acc/rank-1":1.99})");
  // loss's summary is its min; acc (kept per rank: acc/rank-N) is charted against epoch.
  write_text(dir / "metrics.json", R"({"loss":{"reduce":"mean","summary":"min","step_metric":null},)"
                                   R"("acc":{"reduce":"none","summary":"max","step_metric":"epoch"}})");
  const Output o = run_chorus({"show", dir.string(), "--no-system", "--width", "120"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  const std::vector<std::string> summary = block(o.out, "summary");
  BOOST_REQUIRE_EQUAL(summary.size(), 5u); // the title, the last row, three values
  BOOST_TEST(words_of(summary[2]) == std::vector<std::string>({"loss", "=", "0.123", "(min)"}), summary[2]);
  BOOST_TEST(words_of(summary[3]) == std::vector<std::string>({"lr", "=", "1e-05"}), summary[3]);
  BOOST_TEST(words_of(summary[4]) == std::vector<std::string>({"acc/rank-1", "=", "1.99", "(max)"}), summary[4]);
  // The charts of acc's columns say their x; loss's says nothing of it.
  for (const char* key : {"acc/rank-0  (", "acc/rank-1  ("}) {
    const std::vector<std::string> chart = block(o.out, key);
    BOOST_REQUIRE(chart.size() > 2u);
    BOOST_TEST(chart[1].starts_with("  x: epoch (its step metric"), chart[1]);
  }
  BOOST_TEST(count_of(o.out, "x: epoch") == 2u);

  // Several runs: said where they all declare the same.
  const fs::path other = make_run(root.path, "proj", "grp", {.id = "plain", .world = 2});
  write_text(other / "history.jsonl", history(50, 2));
  const Output both = run_chorus({"show", dir.string(), other.string(), "--width", "120"});
  BOOST_TEST_INFO_SCOPE(both.out << both.err);
  BOOST_TEST(!contains(both.out, "x: epoch"));
  std::filesystem::copy_file(dir / "metrics.json", other / "metrics.json");
  BOOST_TEST(count_of(run_chorus({"show", dir.string(), other.string(), "--width", "120"}).out, "x: epoch") == 2u);

  // A damaged metrics.json is named, with its fix; the rest is shown.
  write_text(dir / "metrics.json", R"({"loss":{"reduce")");
  const Output damaged = run_chorus({"show", dir.string(), "--no-system", "--width", "120"});
  BOOST_TEST_INFO_SCOPE(damaged.out << damaged.err);
  BOOST_TEST(damaged.code == 0);
  const std::vector<std::string> metrics = block(damaged.out, "metrics");
  BOOST_REQUIRE_EQUAL(metrics.size(), 2u);
  BOOST_TEST(contains(metrics[1], "metrics.json is not a JSON object"));
  BOOST_TEST(contains(metrics[1], "chorus recover"));
  BOOST_TEST(contains(damaged.out, "\nloss  ("));
}
