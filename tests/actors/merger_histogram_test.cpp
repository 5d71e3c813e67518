// Histograms in the Merger (README, "Histograms"): a key declared
// Reduce::merge is, at each step, the exact merge of the ranks that logged
// it; undeclared, a column per rank; `first` the lowest rank's; a key holds
// one kind; and histograms.jsonl, as `chorus recover` rebuilds it, reads
// back as what was committed.
#define BOOST_TEST_MODULE actors_merger_histogram
#include <boost/test/unit_test.hpp>

#include "io/store/histogram_log.hpp"
#include "io/store/run_writer.hpp"
#include "tests/actors/merger_rig.hpp"
#include "tests/temp_dir.hpp"

#include <simdjson.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace chorus;
using namespace chorus::test;

namespace {

/// What rank r logs at step s: values spread over many buckets, a few
/// non-finite ones where `non_finite`.
std::vector<float> values_of(int r, std::int64_t s, bool non_finite = false) {
  std::mt19937 rng(static_cast<unsigned>(r * 7919 + s));
  std::normal_distribution<float> d(static_cast<float>(r) - 1.5f, 0.5f + static_cast<float>(s % 3));
  std::vector<float> v(1000 + static_cast<std::size_t>(r) * 37);
  for (float& x : v) x = d(rng);
  if (non_finite) {
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[5] = std::numeric_limits<float>::infinity();
    v[7] = -std::numeric_limits<float>::infinity();
    v[9] = 0.0f;
  }
  return v;
}

const RecordedHistogram* find(const RecordedRow& row, std::string_view key, int rank) {
  for (const auto& h : row.histograms)
    if (h.key == key && h.rank == rank) return &h;
  return nullptr;
}

struct ReadLine {
  std::int64_t step;
  std::string column;
  std::uint32_t ranks;
  Histogram value;
};

/// The rig's frames replayed into a RunWriter (as `chorus recover` does);
/// histograms.jsonl's lines read back.
std::vector<ReadLine> replay(const Rig& rig, const TempDir& dir) {
  {
    core::Merger* mp = nullptr;
    store::RunWriter w(dir.str(), [&](std::uint32_t k) { return mp->key_name(k); });
    core::Merger m(w);
    mp = &m;
    for (const auto& f : rig.frames) BOOST_REQUIRE(m.apply(f));
  }
  std::vector<ReadLine> out;
  std::ifstream in(dir / "histograms.jsonl");
  simdjson::dom::parser parser;
  for (std::string line; std::getline(in, line);) {
    simdjson::dom::element e;
    BOOST_REQUIRE(parser.parse(line).get(e) == simdjson::SUCCESS);
    Result<store::HistogramLine> h = store::read_histogram_line(e);
    BOOST_TEST_REQUIRE(h.has_value(), (h ? "" : h.error().message()));
    out.push_back({h->step, h->column(), h->ranks, h->value});
  }
  return out;
}

} // namespace

// 4 ranks log known values into a merged histogram at every step: the
// merged buckets, count, min and max are those of all the values at once.
BOOST_AUTO_TEST_CASE(merged_histogram_is_the_histogram_of_all_values) {
  Rig rig(4);
  for (int r = 0; r < 4; ++r) {
    auto b = rig.batch(r);
    b.define("grad", Reduce::merge);
    BOOST_REQUIRE(b.send());
  }
  constexpr int steps = 5;
  for (std::int64_t s = 0; s < steps; ++s)
    for (int r = 3; r >= 0; --r) { // the arrival order is not the ranks' order
      const auto v = values_of(r, s, s == 2);
      rig.histogram(r, "grad", Histogram(std::span<const float>(v)));
    }
  rig.end();
  BOOST_TEST(rig.sink.violations.empty());
  BOOST_REQUIRE(rig.sink.rows.size() == static_cast<std::size_t>(steps));
  for (std::int64_t s = 0; s < steps; ++s) {
    BOOST_TEST_CONTEXT("step " << s) {
      std::vector<float> all;
      for (int r = 0; r < 4; ++r) {
        const auto v = values_of(r, s, s == 2);
        all.insert(all.end(), v.begin(), v.end());
      }
      const Histogram whole{std::span<const float>(all)};
      const RecordedRow* row = rig.row(s);
      BOOST_REQUIRE(row);
      BOOST_TEST(row->values.empty());
      BOOST_REQUIRE(row->histograms.size() == 1u);
      const RecordedHistogram& h = row->histograms[0];
      BOOST_TEST(h.key == "grad");
      BOOST_TEST(h.rank == -1);
      BOOST_TEST(h.count == 4u);
      BOOST_TEST(h.value.count() == whole.count());
      BOOST_TEST(h.value.min() == whole.min());
      BOOST_TEST(h.value.max() == whole.max());
      BOOST_TEST(h.value.nan_count() == (s == 2 ? 4u : 0u));
      BOOST_TEST(h.value.pos_inf_count() == (s == 2 ? 4u : 0u));
      BOOST_TEST(h.value.neg_inf_count() == (s == 2 ? 4u : 0u));
      BOOST_TEST(std::isfinite(h.value.sum()));
      BOOST_TEST(h.value.sum() == whole.sum(), boost::test_tools::tolerance(1e-12));
      const auto got = h.value.buckets(), want = whole.buckets();
      BOOST_TEST(std::equal(got.begin(), got.end(), want.begin(), want.end(),
                            [](const auto& a, const auto& b) { return a.lo == b.lo && a.count == b.count; }));
    }
  }
  // The run directory says the same, as recover rebuilds it.
  TempDir dir;
  const auto lines = replay(rig, dir);
  BOOST_REQUIRE(lines.size() == static_cast<std::size_t>(steps));
  for (std::int64_t s = 0; s < steps; ++s) {
    BOOST_TEST(lines[s].step == s);
    BOOST_TEST(lines[s].column == "grad");
    BOOST_TEST(lines[s].ranks == 4u);
    BOOST_TEST((lines[s].value == rig.row(s)->histograms[0].value));
  }
}

BOOST_AUTO_TEST_CASE(undeclared_histograms_are_a_column_per_rank_and_first_keeps_the_lowest) {
  Rig rig(3);
  {
    auto b = rig.batch(0);
    b.define("act", Reduce::first);
    BOOST_REQUIRE(b.send());
  }
  for (int r = 0; r < 3; ++r) {
    const auto v = values_of(r, 0);
    auto b = rig.batch(r);
    b.histogram("w", Histogram(std::span<const float>(v)), 0);
    if (r != 0) b.histogram("act", Histogram(std::span<const float>(v)), 0); // rank 0 logs it later
    b.log({{"loss", 1.0 + r}}, 0);
    BOOST_REQUIRE(b.send());
  }
  {
    const auto v = values_of(0, 0);
    auto b = rig.batch(0);
    b.histogram("act", Histogram(std::span<const float>(v)), w::same_step); // joins step 0
    BOOST_REQUIRE(b.send());
  }
  rig.end();
  BOOST_TEST(rig.sink.violations.empty());
  const RecordedRow* row = rig.row(0);
  BOOST_REQUIRE(row);
  BOOST_TEST(row->values.size() == 3u);
  BOOST_REQUIRE(row->histograms.size() == 4u); // act, w/rank-0..2 in name order
  const auto v0 = values_of(0, 0);
  const RecordedHistogram* act = find(*row, "act", -1);
  BOOST_REQUIRE(act);
  BOOST_TEST(act->count == 3u);
  BOOST_TEST((act->value == Histogram(std::span<const float>(v0))));
  for (int r = 0; r < 3; ++r) {
    const RecordedHistogram* h = find(*row, "w", r);
    BOOST_REQUIRE(h);
    const auto v = values_of(r, 0);
    BOOST_TEST((h->value == Histogram(std::span<const float>(v))));
    BOOST_TEST(h->count == 0u);
  }
}

BOOST_AUTO_TEST_CASE(a_key_holds_one_kind) {
  Rig rig(2);
  const double one = 1.0;
  const Histogram h(std::span<const double>(&one, 1));
  rig.log(0, {{"loss", 1.0}}, 0);
  const auto refused_hist = rig.histogram(1, "loss", h, 0);
  const auto hist_ok = rig.histogram(0, "grad", h, 1);
  const auto refused_scalar = rig.log(1, {{"grad", 2.0}, {"other", 3.0}}, 1);
  std::uint64_t refused_define = 0;
  {
    auto b = rig.batch(0);
    refused_define = b.define("loss", Reduce::merge);
    BOOST_REQUIRE(b.send());
  }
  rig.end();
  const Completion* c = rig.sink.completion(1, refused_hist);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->code == Errc::invalid_argument);
  BOOST_TEST(c->message.find("'loss', which holds scalars") != std::string::npos, c->message);
  BOOST_TEST(rig.sink.completion(0, hist_ok)->code == Errc::ok);
  c = rig.sink.completion(1, refused_scalar);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->code == Errc::invalid_argument);
  BOOST_TEST(c->message.find("'grad', which holds histograms") != std::string::npos, c->message);
  c = rig.sink.completion(0, refused_define);
  BOOST_REQUIRE(c);
  BOOST_TEST(c->code == Errc::invalid_argument);
  BOOST_TEST(c->message.find("merge is for histograms") != std::string::npos, c->message);
  // Refused whole, and recorded: the histogram in rejected.jsonl's way, the scalars as values.
  BOOST_REQUIRE(rig.sink.refusals.size() == 1u);
  BOOST_TEST(rig.sink.refusals[0].find("{\"loss\":{\"histogram\":{\"count\":1") != std::string::npos,
             rig.sink.refusals[0]);
  BOOST_REQUIRE(rig.sink.rejections.size() == 1u);
  BOOST_TEST(rig.sink.rejections[0].values.size() == 2u);
  // Nothing of the refused calls committed.
  for (const RecordedRow& r : rig.sink.rows) {
    for (const auto& v : r.values) BOOST_TEST(v.key != "grad");
    for (const auto& x : r.histograms) BOOST_TEST(x.key != "loss");
  }
}

BOOST_AUTO_TEST_CASE(histograms_take_steps_as_values_do) {
  Rig rig(2);
  const double one = 1.0;
  const Histogram h(std::span<const double>(&one, 1));
  rig.log(0, {{"x", 1.0}}, 5);
  rig.log(1, {{"x", 1.0}}, 6);
  rig.log(0, {{"x", 1.0}}, 7); // rows through 5 commit
  const auto backwards = rig.histogram(0, "h", h, 6);
  const auto committed = rig.histogram(1, "h", h, 7); // moves rank 1 to 7; fine
  rig.log(1, {{"x", 1.0}}, 8);
  const auto late = rig.histogram(0, "h", h, 5);
  rig.end();
  BOOST_TEST(rig.sink.completion(0, backwards)->code == Errc::backwards_step);
  BOOST_TEST(rig.sink.completion(1, committed)->code == Errc::ok);
  BOOST_TEST(rig.sink.completion(0, late)->code == Errc::backwards_step);
  const RecordedRow* row7 = rig.row(7);
  BOOST_REQUIRE(row7);
  BOOST_REQUIRE(row7->histograms.size() == 1u);
  BOOST_TEST(row7->histograms[0].rank == 1);
}
