// Histograms from real ranks under `chorus launch` into one shared run: the
// merged key at each step is the histogram of every rank's values at once,
// an undeclared key a column per rank, and `chorus recover` rebuilds
// histograms.jsonl from the WAL to the same bytes.
#define BOOST_TEST_MODULE e2e_histograms
#include "harness.hpp"
#include "tests/e2e/histogram_lines.hpp"
#include "tests/e2e/histogram_values.hpp"

#include <boost/test/unit_test.hpp>

#include <fstream>
#include <map>
#include <sstream>

using namespace e2e;

using Line = HistogramLineRead;

BOOST_AUTO_TEST_CASE(four_ranks_merge_exactly_and_recover_rebuilds_the_file) {
  TempDir dir;
  const int R = 4, S = 12;
  const int port = test_port(41);
  Output out = run("CHORUS_PORT=" + std::to_string(port) + " " +
                   launch_worker(dir.path, R, port + 1, "--steps " + std::to_string(S) + " --histograms 1"));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  const fs::path rd = run_dir_of(out.text);
  BOOST_REQUIRE(!rd.empty());

  const std::vector<Line> lines = read_histograms(rd);
  // Each step: "act" a column per rank, then "grad" merged (name order).
  BOOST_REQUIRE_EQUAL(lines.size(), static_cast<std::size_t>(S * (R + 1)));
  std::map<std::pair<std::int64_t, std::string>, const Line*> by;
  for (const Line& l : lines) by[{l.step, l.column}] = &l;
  for (long s = 0; s < S; ++s) {
    BOOST_TEST_CONTEXT("step " << s) {
      std::vector<float> all;
      for (int r = 0; r < R; ++r) {
        const std::vector<float> v = histogram_values(r, s);
        all.insert(all.end(), v.begin(), v.end());
        const Line* act = by[{s, "act/rank-" + std::to_string(r)}];
        BOOST_REQUIRE(act);
        const std::vector<double> d(v.begin(), v.end()); // the worker logs "act" as doubles
        BOOST_TEST((act->value == chorus::Histogram(std::span<const double>(d))));
      }
      const chorus::Histogram whole{std::span<const float>(all)};
      const Line* grad = by[{s, "grad"}];
      BOOST_REQUIRE(grad);
      BOOST_TEST(grad->ranks == static_cast<std::uint32_t>(R));
      BOOST_TEST(grad->value.count() == whole.count());
      BOOST_TEST(grad->value.min() == whole.min());
      BOOST_TEST(grad->value.max() == whole.max());
      BOOST_TEST(grad->value.nan_count() == (s % 5 == 0 ? 4u : 0u));
      BOOST_TEST(grad->value.pos_inf_count() == (s % 5 == 0 ? 4u : 0u));
      BOOST_TEST(grad->value.sum() == whole.sum(), boost::test_tools::tolerance(1e-12));
      const auto got = grad->value.buckets(), want = whole.buckets();
      BOOST_TEST(std::equal(got.begin(), got.end(), want.begin(), want.end(),
                            [](const auto& a, const auto& b) { return a.lo == b.lo && a.count == b.count; }));
    }
  }
  // The scalars of the same steps are whole beside them.
  BOOST_TEST(read_history(rd).size() == static_cast<std::size_t>(S));

  // recover rebuilds the file from the WAL, to the same bytes.
  const std::string before = slurp(rd / "histograms.jsonl");
  fs::remove(rd / "histograms.jsonl");
  Output rec = run(bin("chorus") + " recover " + rd.string());
  BOOST_TEST_INFO(rec.text);
  BOOST_REQUIRE_EQUAL(rec.status, 0);
  const bool same = slurp(rd / "histograms.jsonl") == before; // not printed: the file is large
  BOOST_TEST(same);
}
