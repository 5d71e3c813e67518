// `chorus export`: a run's history as CSV and JSON lines, and a run or a
// group (its scalars, texts and histograms) as TensorBoard event files read
// back by the tests' own reader (tests/upload/tfevents_reader.hpp) and, where
// it is at hand, by TensorBoard's own (tests/upload/tfevents_peer.hpp). Its
// images, texts and tables: tests/cli/export_media_test.cpp.
#define BOOST_TEST_MODULE cli_export
#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"
#include "tests/upload/tfevents_peer.hpp"
#include "tests/upload/tfevents_reader.hpp"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

using namespace chorus::test;
namespace fs = std::filesystem;
namespace tb = chorus::test::tfevents;

namespace {

/// A run of 100 rows (tests/cli/run_files.hpp's history: loss with NaN and
/// an infinity, lr, acc per rank), a config and a summary.
fs::path sample_run(const fs::path& root, const std::string& id = "exp1", const std::string& group = "grp") {
  const fs::path dir = make_run(root, "proj", group, {.id = id});
  write_text(dir / "history.jsonl", history());
  write_text(dir / "config.json", R"({"lr":0.001,"optimizer":"adam|w"})");
  write_text(dir / "summary.json", R"({"_step":99,"best":0.5})");
  return dir;
}

std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
    else if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

/// The event files under `dir` (not below), by name.
std::vector<std::string> event_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().starts_with("events.out.tfevents.")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// tag -> (step -> value) of the scalars of the one events file in `dir`.
std::map<std::string, std::map<std::int64_t, float>> scalars_in(const fs::path& dir) {
  const std::vector<std::string> files = event_files(dir);
  BOOST_TEST_REQUIRE(files.size() == 1u, dir.string());
  std::map<std::string, std::map<std::int64_t, float>> out;
  for (const tb::TbEvent& e : tb::read_events(files.front()))
    for (const tb::TbValue& v : e.values)
      if (v.simple_value) out[v.tag][e.step] = *v.simple_value;
  return out;
}

// ---------------------------------------------------------------------------
// Histograms: histograms.jsonl lines made here from chorus's bucket layout as
// README ("Histograms") defines it, with no code of chorus's.

/// The bucket of a finite `x`: for |x| >= 2^-126, its sign, binary exponent
/// e and the 7 bits of its significand after the leading one (index 1 + (e +
/// 126) 128 + m, negated below zero); 0 for the smaller.
int bucket_of(double x) {
  const double a = std::fabs(x);
  if (a < std::ldexp(1.0, -126)) return 0;
  int exp = 0;
  const double f = std::frexp(a, &exp); // a = f 2^exp, f in [0.5, 1)
  const int i = 1 + (exp - 1 + 126) * 128 + static_cast<int>((f * 2 - 1) * 128);
  return x < 0 ? -i : i;
}

/// Bucket `i`'s bounds: [2^e (1 + m/128), 2^e (1 + (m+1)/128)), mirrored below zero.
std::pair<double, double> bounds_of(int i) {
  if (i == 0) return {-std::ldexp(1.0, -126), std::ldexp(1.0, -126)};
  const int k = std::abs(i) - 1, e = k / 128 - 126, m = k % 128;
  const double lo = std::ldexp(1 + m / 128.0, e), hi = std::ldexp(1 + (m + 1) / 128.0, e);
  return i > 0 ? std::pair{lo, hi} : std::pair{-hi, -lo};
}

std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// A histograms.jsonl line of `values` at `step` (rank < 0: null, a merged one).
std::string histogram_line(int step, const std::string& key, int rank, const std::vector<double>& values) {
  std::map<int, std::uint64_t> buckets;
  std::uint64_t nan = 0, inf = 0, ninf = 0;
  double sum = 0, lo = INFINITY, hi = -INFINITY;
  for (double v : values) {
    if (std::isnan(v)) ++nan;
    else if (std::isinf(v)) ++(v > 0 ? inf : ninf);
    else ++buckets[bucket_of(v)], sum += v, lo = std::min(lo, v), hi = std::max(hi, v);
  }
  const bool finite = lo <= hi;
  std::string out = R"({"_step":)" + std::to_string(step) + R"(,"_timestamp":)" + exact(1'700'000'000.25 + step) +
                    R"(,"_runtime":)" + std::to_string(step) + R"(,"key":")" + key + R"(","rank":)" +
                    (rank < 0 ? "null,\"_count\":2" : std::to_string(rank)) + R"(,"count":)" +
                    std::to_string(values.size()) + R"(,"sum":)" + exact(sum) + R"(,"min":)" +
                    (finite ? exact(lo) : "null") + R"(,"max":)" + (finite ? exact(hi) : "null") +
                    R"(,"nan":)" + std::to_string(nan) + R"(,"inf":)" + std::to_string(inf) + R"(,"-inf":)" +
                    std::to_string(ninf) + R"(,"buckets":[)";
  for (const auto& [i, n] : buckets) out += (out.back() == '[' ? "[" : ",[") + std::to_string(i) + "," + std::to_string(n) + "]";
  return out + "]}\n";
}

/// A run whose histograms.jsonl holds, at steps 0..4, "grad" merged (NaN
/// and infinities at steps 0 and 3, a zero, negatives, gaps between
/// buckets), "act" a column per rank, and at step 2 "dead", NaN alone.
fs::path histogram_run(const fs::path& root) {
  const fs::path dir = sample_run(root, "hist");
  std::string h;
  for (int s = 0; s < 5; ++s) {
    for (int r = 0; r < 2; ++r) h += histogram_line(s, "act", r, {r + 1.0, r + 1.5 + s * 0.01, 10.0 * (r + 1)});
    std::vector<double> grad{-3.5, -0.25, 0, 1e-3, 0.5 + s, 0.5 + s, 2.0, 250.0};
    if (s % 3 == 0) grad.insert(grad.end(), {NAN, INFINITY, -INFINITY, INFINITY});
    h += histogram_line(s, "grad", -1, grad);
    if (s == 2) h += histogram_line(s, "dead", -1, {NAN});
  }
  write_text(dir / "histograms.jsonl", h);
  return dir;
}

/// A HistogramProto as read back, with its event's wall time.
struct Histo {
  double wall_time = 0;
  tb::TbValue::Histo value;
};

/// tag -> (step -> histogram) of the histograms in the event files of `dir` (not below).
std::map<std::string, std::map<std::int64_t, Histo>> histograms_in(const fs::path& dir) {
  std::map<std::string, std::map<std::int64_t, Histo>> out;
  for (const std::string& f : event_files(dir))
    for (const tb::TbEvent& e : tb::read_events(f))
      for (const tb::TbValue& v : e.values)
        if (v.histo) out[v.tag][e.step] = {e.wall_time, *v.histo};
  return out;
}

/// What docs/TENSORBOARD.md says the HistogramProto of a histograms.jsonl
/// line is: a bucket per non-empty bucket (its upper bound), a bucket of 0
/// before one that a gap precedes (its lower bound), the infinities at
/// -DBL_MAX and DBL_MAX, NaN left out.
tb::TbValue::Histo proto_of(const simdjson::dom::object& line) {
  constexpr double most = std::numeric_limits<double>::max();
  const auto count = [&](const char* k) { return static_cast<double>(std::uint64_t(line[k])); };
  tb::TbValue::Histo h;
  const bool finite = !line["min"].is_null();
  h.min = count("-inf") > 0 ? -most : finite ? double(line["min"]) : 0;
  h.max = count("inf") > 0 ? most : finite ? double(line["max"]) : 0;
  h.num = count("count") - count("nan");
  h.sum = double(line["sum"]);
  const auto add = [&h](double limit, double n) {
    h.bucket_limit.push_back(limit);
    h.bucket.push_back(n);
  };
  if (count("-inf") > 0) add(-most, count("-inf"));
  for (simdjson::dom::array b : simdjson::dom::array(line["buckets"])) {
    const auto [lo, hi] = bounds_of(static_cast<int>(std::int64_t(b.at(0))));
    if (!h.bucket_limit.empty() && h.bucket_limit.back() < lo) add(lo, 0);
    add(hi, static_cast<double>(std::uint64_t(b.at(1))));
  }
  if (count("inf") > 0) add(most, count("inf"));
  return h;
}

} // namespace

BOOST_AUTO_TEST_CASE(csv_has_a_row_per_step_and_a_column_per_key) {
  TempDir root;
  const fs::path dir = sample_run(root.path);
  // A row without lr, and a key that needs quoting.
  write_text(dir / "history.jsonl",
             history(3) + R"({"_step":3,"_timestamp":1700000003,"_runtime":3,"loss":1.5,"a,\"b\"":7})" + "\n");
  const fs::path csv = root.path / "out.csv";
  const Output o = run_chorus({"export", dir.string(), "--csv", csv.string()});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  const std::vector<std::string> lines = lines_of(read_text(csv));
  BOOST_REQUIRE_EQUAL(lines.size(), 5u); // the header and 4 rows
  const std::vector<std::string> header = cells_of(lines[0]);
  BOOST_TEST(header == (std::vector<std::string>{"_step", "_timestamp", "_runtime", "loss", "lr", "acc/rank-0",
                                                 "acc/rank-1", "a,\"b\""}),
             boost::test_tools::per_element());
  BOOST_TEST(lines[0].ends_with(R"(,"a,""b""")"));
  const std::vector<std::string> first = cells_of(lines[1]);
  BOOST_REQUIRE_EQUAL(first.size(), header.size());
  BOOST_TEST(first[0] == "0");
  BOOST_TEST(first[1] == "1700000000");
  BOOST_TEST(std::stod(first[3]) == 2.0);
  BOOST_TEST(std::stod(first[6]) == 1.0); // acc/rank-1 at step 0
  BOOST_TEST(first[7].empty());
  const std::vector<std::string> last = cells_of(lines[4]);
  BOOST_REQUIRE_EQUAL(last.size(), header.size());
  BOOST_TEST(last[3] == "1.5");
  BOOST_TEST(last[4].empty()); // no lr in that row
  BOOST_TEST(last[7] == "7");

  // NaN and infinities as pandas reads them.
  write_text(dir / "history.jsonl", history());
  const Output again = run_chorus({"export", dir.string(), "--csv", "-"});
  BOOST_REQUIRE_EQUAL(again.code, 0);
  const std::vector<std::string> all = lines_of(again.out);
  BOOST_REQUIRE_EQUAL(all.size(), 101u);
  BOOST_TEST(cells_of(all[1 + 3])[3] == "NaN");
  BOOST_TEST(cells_of(all[1 + 50])[3] == "inf");
}

BOOST_AUTO_TEST_CASE(jsonl_keeps_the_keys_metric_picks) {
  TempDir root;
  const fs::path dir = sample_run(root.path);
  const Output o = run_chorus({"export", dir.string(), "--jsonl", "-", "--metric", "acc/*"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  const std::vector<std::string> lines = lines_of(o.out);
  BOOST_REQUIRE_EQUAL(lines.size(), 100u);
  simdjson::dom::parser parser;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    simdjson::dom::object row;
    BOOST_REQUIRE(!parser.parse(lines[i]).get(row));
    std::vector<std::string> keys;
    for (auto [k, v] : row) keys.emplace_back(k);
    BOOST_TEST(keys == (std::vector<std::string>{"_step", "_timestamp", "_runtime", "acc/rank-0", "acc/rank-1"}),
               boost::test_tools::per_element());
    BOOST_TEST(std::int64_t(row["_step"]) == static_cast<std::int64_t>(i));
  }
  // A key named keeps its contributions; a regular expression picks too.
  const Output loss = run_chorus({"export", dir.string(), "--jsonl", "-", "--metric", "/^lo/"});
  BOOST_REQUIRE_EQUAL(loss.code, 0);
  const std::string first = lines_of(loss.out).front();
  BOOST_TEST(first == R"({"_step":0,"_timestamp":1700000000,"_runtime":0,"loss":2.0,"_count":{"loss":2}})");
}

BOOST_AUTO_TEST_CASE(a_damaged_line_is_skipped_and_named_and_the_rest_exported) {
  TempDir root;
  const fs::path dir = sample_run(root.path);
  std::string h = history(10);
  h.insert(h.find('\n') + 1, "{\"_step\": oops\n");
  write_text(dir / "history.jsonl", h);
  const Output o = run_chorus({"export", dir.string(), "--csv", "-"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(lines_of(o.out).size() == 11u);
  BOOST_TEST(contains(o.err, "skipped 1 damaged line(s), the first at line 2"));
}

BOOST_AUTO_TEST_CASE(an_output_that_cannot_be_written_fails_naming_it) {
  TempDir root;
  const fs::path dir = sample_run(root.path);
  const Output full = run_chorus({"export", dir.string(), "--csv", "/dev/full"});
  BOOST_TEST_INFO_SCOPE(full.out << full.err);
  BOOST_TEST(full.code == 1);
  BOOST_TEST(contains(full.err, "could not write /dev/full: No space left on device"));
  const std::string nowhere = (root.path / "no" / "such" / "dir.csv").string();
  const Output missing = run_chorus({"export", dir.string(), "--jsonl", nowhere});
  BOOST_TEST(missing.code == 1);
  BOOST_TEST(contains(missing.err, "cannot write " + nowhere));
  // A TensorBoard directory under a regular file.
  write_text(root.path / "file", "x");
  const Output tbf = run_chorus({"export", dir.string(), "--tensorboard", (root.path / "file" / "tb").string()});
  BOOST_TEST(tbf.code == 1);
  BOOST_TEST(contains(tbf.err, (root.path / "file").string()), tbf.err);
}

BOOST_AUTO_TEST_CASE(wrong_command_lines_are_refused) {
  TempDir root;
  const fs::path dir = sample_run(root.path);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"export", dir.string()},
        {"export", dir.string(), "--csv", "-", "--jsonl", "-"},
        {"export", dir.string(), "--csv", "-", "--metric", "/(/"},
        {"export", dir.string(), dir.string(), "--csv", "-"},
        {"export", "--csv", "-"}}) {
    const Output o = run_chorus(args);
    BOOST_TEST(o.code == 2, args.size() << " words: " << o.err);
  }
  const Output group = run_chorus({"export", dir.parent_path().string(), "--csv", "-"});
  BOOST_TEST(group.code == 1);
  BOOST_TEST(contains(group.err, "--tensorboard DIR takes the whole group"), group.err);
}

BOOST_AUTO_TEST_CASE(tensorboard_gets_a_run_per_rank_with_steps_times_and_text) {
  TempDir root;
  const fs::path dir = sample_run(root.path);
  write_text(dir / "system.jsonl",
             R"({"_timestamp":1700000000.5,"_runtime":0.5,"_node":0,"_rank":0,"system.cpu.percent/node-0":50,"system.proc.threads/rank-0":8})"
             "\n"
             R"({"_timestamp":1700000001.5,"_runtime":1.5,"_node":0,"_rank":0,"system.cpu.percent/node-0":70,"system.proc.threads/rank-0":9})"
             "\n");
  const fs::path out = root.path / "tb";
  const Output o = run_chorus({"export", dir.string(), "--tensorboard", out.string()});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(contains(o.out, "tensorboard --logdir " + out.string()));

  // The run's own keys: steps, values (NaN and infinity kept), wall times.
  const auto own = scalars_in(out / "exp1");
  BOOST_TEST(own.size() == 2u); // loss, lr
  BOOST_REQUIRE(own.count("loss") == 1u);
  BOOST_TEST(own.at("loss").size() == 100u);
  BOOST_TEST(own.at("loss").at(0) == 2.0f);
  BOOST_TEST(std::isnan(own.at("loss").at(3)));
  BOOST_TEST(std::isinf(own.at("loss").at(50)));
  const std::vector<tb::TbEvent> events = tb::read_events(event_files(out / "exp1").front());
  BOOST_REQUIRE(!events.empty());
  BOOST_TEST(events.front().file_version.value_or("") == "brain.Event:2");
  std::size_t texts = 0;
  for (const tb::TbEvent& e : events) {
    for (const tb::TbValue& v : e.values) {
      if (v.tag == "loss" && e.step == 7) BOOST_TEST(e.wall_time == 1700000007.0);
      if (v.plugin_name != "text") continue;
      ++texts;
      BOOST_REQUIRE_EQUAL(v.string_val.size(), 1u);
      if (v.tag == "config") BOOST_TEST(contains(v.string_val[0], "| optimizer | adam\\|w |"), v.string_val[0]);
      if (v.tag == "summary") BOOST_TEST(contains(v.string_val[0], "| best | 0.5 |"), v.string_val[0]);
    }
  }
  BOOST_TEST(texts == 2u);
  // The config's keys as the HParams plugin's session, once, at the run's start.
  std::size_t sessions = 0;
  for (const tb::TbEvent& e : events)
    for (const tb::TbValue& v : e.values) {
      if (v.plugin_name != "hparams") continue;
      ++sessions;
      BOOST_TEST(v.tag == "_hparams_/session_start_info");
      const tb::TbHParams h = tb::decode_hparams(v.plugin_content);
      BOOST_TEST(h.session_start);
      BOOST_REQUIRE_EQUAL(h.values.size(), 2u);
      BOOST_TEST(h.values[0].first == "lr");
      BOOST_TEST(std::get<double>(h.values[0].second) == 0.001);
      BOOST_TEST(h.values[1].first == "optimizer");
      BOOST_TEST(std::get<std::string>(h.values[1].second) == "adam|w");
    }
  BOOST_TEST(sessions == 1u);

  // Each rank's column of a key is that rank's run, under the same tag.
  for (int r = 0; r < 2; ++r) {
    const auto rank = scalars_in(out / "exp1" / ("rank-" + std::to_string(r)));
    BOOST_REQUIRE(rank.count("acc") == 1u);
    BOOST_TEST(rank.at("acc").size() == 100u);
    BOOST_TEST(rank.at("acc").at(10) == static_cast<float>(0.1 + r));
    if (r == 0) BOOST_TEST(rank.at("system.proc.threads").at(1) == 9.0f); // its second sample
  }
  const auto node = scalars_in(out / "exp1" / "node-0");
  BOOST_TEST(node.at("system.cpu.percent").at(0) == 50.0f);
  BOOST_TEST(node.at("system.cpu.percent").at(1) == 70.0f);

  // --metric and --no-system leave the rest out.
  const fs::path picked = root.path / "picked";
  const Output p = run_chorus({"export", dir.string(), "--tensorboard", picked.string(), "--metric", "lr", "--no-system"});
  BOOST_REQUIRE_EQUAL(p.code, 0);
  BOOST_TEST(scalars_in(picked / "exp1").size() == 1u);
  BOOST_TEST(!fs::exists(picked / "exp1" / "node-0"));
  BOOST_TEST(!fs::exists(picked / "exp1" / "rank-0"));
}

BOOST_AUTO_TEST_CASE(tensorboard_takes_a_groups_runs_as_runs_of_their_own) {
  TempDir root;
  sample_run(root.path, "member-a", "job");
  sample_run(root.path, "member-b", "job");
  const fs::path out = root.path / "tb";
  const Output o = run_chorus({"export", (root.path / "proj" / "job").string(), "--tensorboard", out.string()});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  for (const char* m : {"member-a", "member-b"}) BOOST_TEST(scalars_in(out / m).at("loss").size() == 100u, m);
}

BOOST_AUTO_TEST_CASE(smooth_gives_each_key_tensorboards_moving_average) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "sm"});
  std::string h;
  for (int s = 0; s < 20; ++s)
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":1700000000,"_runtime":0,"x":)" +
         std::to_string(s % 2 == 0 ? 0 : 10) + (s == 7 ? R"(,"y":"NaN")" : "") + "}\n";
  write_text(dir / "history.jsonl", h);
  const Output o = run_chorus({"export", dir.string(), "--csv", "-", "--smooth", "0.5"});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  const std::vector<std::string> lines = lines_of(o.out);
  BOOST_REQUIRE_EQUAL(lines.size(), 21u);
  double ema = 0, debias = 1;
  for (int s = 0; s < 20; ++s) {
    ema = ema * 0.5 + 0.5 * (s % 2 == 0 ? 0 : 10);
    debias *= 0.5;
    BOOST_TEST(std::stod(cells_of(lines[1 + s])[3]) == ema / (1 - debias), boost::test_tools::tolerance(1e-12));
  }
  BOOST_TEST(cells_of(lines[8])[4] == "NaN"); // passes unsmoothed
  const Output j = run_chorus({"export", dir.string(), "--jsonl", "-", "--smooth", "0.5", "--metric", "x"});
  BOOST_REQUIRE_EQUAL(j.code, 0);
  BOOST_TEST(lines_of(j.out).front() == R"({"_step":0,"_timestamp":1700000000,"_runtime":0,"x":0})");
  BOOST_TEST(contains(lines_of(j.out)[1], R"("x":6.666666666666667)"), lines_of(j.out)[1]);
  BOOST_TEST(run_chorus({"export", dir.string(), "--tensorboard", (root.path / "tb").string(), "--smooth", "0.5"}).code == 2);
  BOOST_TEST(run_chorus({"export", dir.string(), "--csv", "-", "--smooth", "1"}).code == 2);
}

BOOST_AUTO_TEST_CASE(tensorboard_gets_each_histogram_as_its_line_says) {
  TempDir root;
  const fs::path dir = histogram_run(root.path);
  const fs::path out = root.path / "tb";
  const Output o = run_chorus({"export", dir.string(), "--tensorboard", out.string()});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(contains(o.out, "and 16 histograms into"));
  // Each line where a scalar of its column would go: merged ones in the
  // run's own files, a rank's own column in rank-N/ under its key.
  std::map<std::string, std::map<std::string, std::map<std::int64_t, Histo>>> got;
  for (const char* sub : {"", "rank-0", "rank-1"}) got[sub] = histograms_in(out / "hist" / sub);
  BOOST_TEST(got[""].size() == 2u); // grad, dead
  BOOST_TEST(got["rank-0"].size() == 1u);
  std::size_t lines = 0;
  simdjson::dom::parser parser;
  for (const std::string& text : lines_of(read_text(dir / "histograms.jsonl"))) {
    const simdjson::dom::object line = parser.parse(text);
    ++lines;
    const std::string key = std::string(std::string_view(line["key"])), sub = line["rank"].is_null() ? "" : "rank-" + std::to_string(std::int64_t(line["rank"]));
    const std::int64_t step = line["_step"];
    BOOST_TEST_CONTEXT(key << " of '" << sub << "' at step " << step) {
      BOOST_REQUIRE(got[sub][key].count(step) == 1u);
      const Histo& h = got[sub][key][step];
      BOOST_TEST(h.wall_time == double(line["_timestamp"]));
      const tb::TbValue::Histo want = proto_of(line);
      BOOST_TEST(h.value.num == want.num);
      BOOST_TEST(h.value.min == want.min);
      BOOST_TEST(h.value.max == want.max);
      BOOST_TEST(h.value.sum == want.sum);
      BOOST_TEST(h.value.sum_squares == 0.0);
      BOOST_TEST(h.value.bucket_limit == want.bucket_limit, boost::test_tools::per_element());
      BOOST_TEST(h.value.bucket == want.bucket, boost::test_tools::per_element());
      BOOST_TEST(std::accumulate(h.value.bucket.begin(), h.value.bucket.end(), 0.0) == h.value.num);
    }
  }
  BOOST_TEST(lines == 16u);
  // The lines hold what the proto says of them: grad at step 0 has a zero,
  // gaps between its buckets, NaN left out and both infinities.
  const tb::TbValue::Histo& g0 = got[""]["grad"][0].value;
  BOOST_TEST(g0.num == 11.0);
  BOOST_TEST(g0.bucket.front() == 1.0); // -inf
  BOOST_TEST(g0.bucket.back() == 2.0);  // +inf, twice
  BOOST_TEST(std::count(g0.bucket.begin(), g0.bucket.end(), 0.0) >= 3);
  BOOST_TEST(got[""]["dead"][2].value.num == 0.0);
  BOOST_TEST(got[""]["dead"][2].value.bucket.empty());

  // --metric picks histogram columns as it picks keys; --csv holds no histograms.
  const fs::path picked = root.path / "picked";
  const Output p = run_chorus({"export", dir.string(), "--tensorboard", picked.string(), "--metric", "act"});
  BOOST_REQUIRE_EQUAL(p.code, 0);
  BOOST_TEST(histograms_in(picked / "hist").empty());
  BOOST_TEST(histograms_in(picked / "hist" / "rank-1").at("act").size() == 5u);
  const Output csv = run_chorus({"export", dir.string(), "--csv", "-"});
  BOOST_REQUIRE_EQUAL(csv.code, 0);
  BOOST_TEST(lines_of(csv.out).front() == "_step,_timestamp,_runtime,loss,lr,acc/rank-0,acc/rank-1");
}

BOOST_AUTO_TEST_CASE(a_damaged_histogram_line_is_skipped_and_named) {
  TempDir root;
  const fs::path dir = histogram_run(root.path);
  std::string h = read_text(dir / "histograms.jsonl");
  h.insert(h.find('\n') + 1, R"({"_step":0,"key":"act","rank":0,"count":3,"sum":0,"min":null,"max":null,"nan":0,"inf":0,"-inf":0,"buckets":[]})" "\n");
  write_text(dir / "histograms.jsonl", h);
  const Output o = run_chorus({"export", dir.string(), "--tensorboard", (root.path / "tb").string()});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(contains(o.err, "histograms.jsonl: skipped 1 damaged line(s), the first at line 2 (a histograms.jsonl "
                             "line has a count that is not the sum"));
  BOOST_TEST(contains(o.out, "and 16 histograms into"));
}

namespace {

/// `v` as Python's repr() writes a float: the shortest text that reads back
/// the same, with ".0" where it would read as an integer.
std::string python_repr(double v) {
  char buf[64];
  std::string out(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  return out.find_first_of(".en") == std::string::npos ? out + ".0" : out;
}

} // namespace

BOOST_AUTO_TEST_CASE(tensorboards_own_reader_lists_the_histograms_as_exported) {
  const std::optional<fs::path> peer = tb::tensorboard_peer();
  if (!peer) return; // skipped, and said so
  TempDir root;
  const fs::path dir = histogram_run(root.path);
  const fs::path out = root.path / "tb";
  const Output o = run_chorus({"export", dir.string(), "--tensorboard", out.string()});
  BOOST_REQUIRE_EQUAL(o.code, 0);
  // EventAccumulator reads each directory as TensorBoard does: its
  // histogram tags, and each event's num, min and max.
  write_text(root.path / "read.py", R"(import sys
from tensorboard.backend.event_processing import event_accumulator as ea
for sub in sys.argv[2:]:
    acc = ea.EventAccumulator(sys.argv[1] + "/" + sub, size_guidance={ea.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    print("tags", sub or "-", ",".join(sorted(tags["histograms"])), ",".join(sorted(tags["distributions"])))
    for tag in tags["histograms"]:
        for e in acc.Histograms(tag):
            h = e.histogram_value
            print("histo", sub or "-", tag, e.step, repr(h.num), repr(h.min), repr(h.max))
)");
  const std::string said =
      tb::run_with_tensorboard(*peer, root.path / "read.py", (out / "hist").string() + " '' rank-0 rank-1");
  BOOST_TEST_INFO_SCOPE(said);
  BOOST_TEST(contains(said, "tags - dead,grad dead,grad\n"));
  BOOST_TEST(contains(said, "tags rank-0 act act\n"));
  BOOST_TEST(contains(said, "tags rank-1 act act\n"));
  simdjson::dom::parser parser;
  std::size_t lines = 0;
  for (const std::string& text : lines_of(read_text(dir / "histograms.jsonl"))) {
    const simdjson::dom::object line = parser.parse(text);
    ++lines;
    const tb::TbValue::Histo want = proto_of(line);
    const std::string sub = line["rank"].is_null() ? "-" : "rank-" + std::to_string(std::int64_t(line["rank"]));
    char expected[256];
    std::snprintf(expected, sizeof expected, "histo %s %s %lld %.1f %s %s\n", sub.c_str(),
                  std::string(std::string_view(line["key"])).c_str(), static_cast<long long>(std::int64_t(line["_step"])),
                  want.num, python_repr(want.min).c_str(), python_repr(want.max).c_str());
    BOOST_TEST(contains(said, expected), expected);
  }
  BOOST_TEST(lines == 16u);
}
