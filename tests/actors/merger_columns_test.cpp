// Where the Merger puts a value: its column depends on its key, the key's
// declaration and its rank only, never on which other ranks logged at that
// step (README, "Columns"). The summary is checked as `chorus recover` builds
// it: the rig's frames replayed through a fresh Merger into a RunWriter.
#define BOOST_TEST_MODULE actors_merger_columns
#include <boost/test/unit_test.hpp>

#include "io/store/run_writer.hpp"
#include "tests/actors/merger_rig.hpp"
#include "tests/temp_dir.hpp"

#include <simdjson.h>

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace chorus;
using namespace chorus::test;

namespace {

using Names = std::set<std::string>;

/// The columns of the rig's rows, each as "key", "key/rank-N" or "key#count"
/// for a reduced one, in one row (`step`) or in all of them.
Names columns(const Rig& rig, std::optional<std::int64_t> step = std::nullopt) {
  Names out;
  for (const RecordedRow& r : rig.sink.rows) {
    if (step && r.step != *step) continue;
    for (const RecordedValue& v : r.values)
      out.insert(v.key + (v.rank >= 0 ? "/rank-" + std::to_string(v.rank) : "") +
                 (v.count > 0 ? "#" + std::to_string(v.count) : ""));
  }
  return out;
}

/// The keys of summary.json for the rig's run.
Names summary_keys(const Rig& rig) {
  chorus::test::TempDir tmp;
  const Merger* replay = nullptr;
  store::RunWriter writer(tmp / "run", [&](std::uint32_t key) { return replay->key_name(key); });
  Merger m(writer);
  replay = &m;
  for (const std::vector<char>& f : rig.frames) BOOST_REQUIRE(m.apply(f));
  const std::string json = writer.summary_json();
  simdjson::dom::parser parser;
  simdjson::dom::object obj;
  BOOST_REQUIRE_MESSAGE(!parser.parse(json).get(obj), json);
  Names out;
  for (auto [k, v] : obj)
    if (!k.starts_with("_")) out.insert(std::string(k));
  return out;
}

/// The value of `key` at `step`: its lowest rank's where it is kept per rank.
RecordedValue value_at(const Rig& rig, std::int64_t step, std::string_view key) {
  if (const RecordedRow* r = rig.row(step))
    for (const RecordedValue& v : r->values)
      if (v.key == key) return v;
  BOOST_TEST_REQUIRE(false, "no " << key << " at step " << step << ": " << values_text(rig.row(step)));
  return {};
}

} // namespace

// The reported case: rank 0 logs lr every step, rank 1 on even steps only.
// Stored by who else logged, lr was lr/rank-0 and lr/rank-1 on even steps and
// plain lr on odd ones: three broken series, and lr next to lr/rank-0 in the
// summary.
BOOST_AUTO_TEST_CASE(a_key_some_ranks_skip_is_a_column_per_rank_at_every_step) {
  constexpr int steps = 6;
  Rig rig(2);
  for (int s = 0; s < steps; ++s) {
    rig.log(0, {{"lr", 0.1 * s}}, s);
    if (s % 2 == 0) rig.log(1, {{"lr", 0.2 * s}}, s);
  }
  rig.end();
  BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s)
    BOOST_TEST(columns(rig, s) == (s % 2 == 0 ? Names{"lr/rank-0", "lr/rank-1"} : Names{"lr/rank-0"}),
               "step " << s << ": " << values_text(rig.row(s)));
  BOOST_TEST(value_at(rig, 3, "lr").value == 0.1 * 3);
  BOOST_TEST(summary_keys(rig) == (Names{"lr/rank-0", "lr/rank-1"}));
}

BOOST_AUTO_TEST_CASE(a_key_one_rank_logs_first_and_two_later_keeps_its_columns) {
  Rig rig(2);
  for (int s = 0; s < 4; ++s) {
    rig.log(0, {{"x", 1.0 + s}}, s);
    if (s < 2)
      rig.log(1, {{"other", 0}}, s);
    else
      rig.log(1, {{"x", 10.0 + s}}, s);
  }
  rig.end();
  BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), 4u);
  BOOST_TEST(columns(rig, 0) == (Names{"other/rank-1", "x/rank-0"}));
  BOOST_TEST(columns(rig, 3) == (Names{"x/rank-0", "x/rank-1"}));
  BOOST_TEST(columns(rig).count("x") == 0u);
  BOOST_TEST(summary_keys(rig) == (Names{"other/rank-1", "x/rank-0", "x/rank-1"}));
}

BOOST_AUTO_TEST_CASE(first_takes_the_lowest_rank_that_logged_and_counts_them) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Rig rig(3);
  {
    auto b = rig.batch(2);
    b.define("lr", Reduce::first);
    b.log({{"lr", 2.5}}, 0);
    BOOST_REQUIRE(b.send());
  }
  rig.log(1, {{"lr", 1.5}}, 0);
  rig.log(0, {{"lr", 0.5}}, 0);
  rig.log(2, {{"lr", 2.25}}, 1); // ranks 1 and 2: rank 1 is the lowest
  rig.log(1, {{"lr", 1.25}}, 1);
  rig.log(2, {{"lr", 2.0}}, 2); // rank 2 alone
  rig.log(0, {{"lr", 0.75}}, 3);
  rig.log(1, {{"lr", nan}}, 3); // a higher rank's NaN does not count
  rig.log(0, {{"lr", nan}}, 4);
  rig.log(1, {{"lr", 1.0}}, 4); // the lowest rank's does
  rig.end();
  BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), 5u);
  const double want[] = {0.5, 1.25, 2.0, 0.75};
  const std::uint32_t count[] = {3, 2, 1, 2};
  for (int s = 0; s < 4; ++s) {
    BOOST_TEST_CONTEXT("step " << s << ": " << values_text(rig.row(s))) {
      BOOST_TEST(value_at(rig, s, "lr").value == want[s]);
      BOOST_TEST(value_at(rig, s, "lr").rank == -1);
      BOOST_TEST(value_at(rig, s, "lr").count == count[s]);
    }
  }
  BOOST_TEST(std::isnan(value_at(rig, 4, "lr").value));
  BOOST_TEST(summary_keys(rig) == (Names{"lr"}));
}

BOOST_AUTO_TEST_CASE(a_run_of_one_rank_keeps_plain_keys) {
  Rig rig(1);
  {
    auto b = rig.batch(0);
    b.define("lr", Reduce::first);
    b.define("loss", Reduce::mean);
    b.log({{"lr", 0.1}, {"loss", 2}, {"acc", 0.5}});
    b.log({{"acc", 0.75}});
    BOOST_REQUIRE(b.send());
  }
  rig.end();
  BOOST_TEST(columns(rig, 0) == (Names{"acc", "loss#1", "lr#1"}));
  BOOST_TEST(columns(rig, 1) == (Names{"acc"}));
  BOOST_TEST(summary_keys(rig) == (Names{"acc", "loss", "lr"}));
}

// The declaration in force when a row commits decides: a row committed before
// it keeps its columns, one still waiting for another rank takes the new one.
BOOST_AUTO_TEST_CASE(a_late_declaration_decides_from_the_rows_not_yet_committed) {
  Rig rig(2);
  rig.log(1, {{"k", 10}}, 0);
  rig.log(1, {{"k", 11}}, 1);
  for (int s = 0; s < 4; ++s) rig.log(0, {{"k", double(s)}}, s);
  BOOST_TEST(rig.m.last_committed_step() == 0); // rank 1 may still log at step 1
  {
    auto b = rig.batch(0);
    b.define("k", Reduce::sum);
    BOOST_REQUIRE(b.send());
  }
  rig.log(1, {{"k", 12}}, 2);
  rig.log(1, {{"k", 13}}, 3);
  rig.end();
  BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), 4u);
  BOOST_TEST(columns(rig, 0) == (Names{"k/rank-0", "k/rank-1"}));
  for (int s = 1; s < 4; ++s) {
    BOOST_TEST(columns(rig, s) == (Names{"k#2"}), "step " << s);
    BOOST_TEST(value_at(rig, s, "k").value == 10.0 + 2 * s);
  }
}
