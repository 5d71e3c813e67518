#define BOOST_TEST_MODULE actors_merger
#include <boost/test/unit_test.hpp>

#include "runtime/core/merger.hpp"
#include "tests/actors/merger_rig.hpp"

#include <algorithm>
#include <csignal>
#include <chrono>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>

using namespace chorus;
using chorus::core::Merger;
namespace w = chorus::core::wire;

namespace {

using namespace chorus::test;

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

using Steps = std::vector<std::int64_t>;

/// What a fresh Merger tells its sink when fed every frame `rig` applied.
std::vector<std::string> replayed_log(const Rig& rig) {
  test::RecordingSink sink;
  Merger again(sink);
  sink.merger = &again;
  for (const auto& f : rig.frames) again.apply(f);
  return sink.log;
}

} // namespace

BOOST_AUTO_TEST_CASE(single_rank_auto_steps_commit_as_it_moves_on) {
  Rig rig(1);
  BOOST_TEST(rig.m.started());
  BOOST_TEST(rig.m.world_size() == 1);
  BOOST_TEST(rig.m.start_ts_us() == start_ts);
  rig.log(0, {{"loss", 1.5}}, auto_step, start_ts + 7);
  BOOST_TEST(rig.sink.rows.empty()); // step 0 may still get values
  rig.log(0, {{"loss", 1.25}, {"acc", 0.5}});
  BOOST_TEST(rig.steps() == Steps{0}, boost::test_tools::per_element());
  rig.log(0, {{"loss", 1.0}});
  BOOST_TEST(rig.steps() == Steps({0, 1}), boost::test_tools::per_element());
  BOOST_TEST(rig.m.rank_last_step(0) == 2);
  BOOST_TEST(rig.m.last_committed_step() == 1);
  rig.end();
  BOOST_TEST(rig.steps() == Steps({0, 1, 2}), boost::test_tools::per_element());
  const auto& r0 = rig.sink.rows[0];
  BOOST_TEST(r0.ts_us == start_ts + 7);
  BOOST_TEST(r0.runtime_us == 7);
  BOOST_TEST(values_text(rig.row(1)) == "row 1 ts=1000010 rt=10 | acc=0x1p-1#0 loss=0x1.4p+0#0");
  BOOST_TEST(rig.m.rows_committed() == 3u);
  BOOST_TEST(rig.sink.ended);
  BOOST_TEST((rig.sink.end_state == RunState::finished));
}

BOOST_AUTO_TEST_CASE(rows_wait_for_every_live_rank_and_join_keys_by_name) {
  Rig rig(2);
  rig.log(0, {{"loss", 1}, {"only0", 5}});
  rig.log(0, {{"loss", 2}});
  rig.log(0, {{"loss", 3}});
  BOOST_TEST(rig.sink.rows.empty()); // rank 1 has logged nothing yet
  rig.log(1, {{"loss", 10}});
  BOOST_TEST(rig.sink.rows.empty()); // rank 1 may still log at step 0
  rig.log(1, {{"loss", 20}});
  BOOST_TEST(rig.steps() == Steps{0}, boost::test_tools::per_element());
  // Same name, different local ids on each rank: one key, stored per rank,
  // even where one rank alone logged it.
  BOOST_TEST(values_text(rig.row(0)) ==
             "row 0 ts=1000010 rt=10 | loss/rank-0=0x1p+0#0 loss/rank-1=0x1.4p+3#0 only0/rank-0=0x1.4p+2#0");
  rig.log(1, {{"loss", 30}}, 5);
  BOOST_TEST(rig.steps() == Steps({0, 1}), boost::test_tools::per_element()); // rank 0 may still log at 2
  rig.end();
  BOOST_TEST(rig.steps() == Steps({0, 1, 2, 5}), boost::test_tools::per_element());
  BOOST_TEST(values_text(rig.row(5)) == "row 5 ts=1000010 rt=10 | loss/rank-1=0x1.ep+4#0");
}

// The sink hears when each rank joined (its event's time), once an attempt:
// a join repeated, or of a rank already given up on, is not heard.
BOOST_AUTO_TEST_CASE(the_sink_hears_each_join_once_an_attempt_with_its_time) {
  using Joins = std::vector<std::pair<int, std::int64_t>>;
  Rig rig(3, false);
  BOOST_REQUIRE(rig.apply(w::rank_joined(1, 5'000, 101, "host-1")));
  BOOST_TEST(rig.sink.states.back().rank == 1); // its state follows
  BOOST_REQUIRE(rig.apply(w::rank_joined(1, 9'000, 102, "host-x")));
  rig.dead(2, "never connected");
  BOOST_REQUIRE(rig.apply(w::rank_joined(2, 12'000, 103, "host-2")));
  BOOST_REQUIRE(rig.apply(w::rank_joined(0, 7'000, 100, "host-0")));
  BOOST_TEST((rig.sink.joins == Joins{{1, 5'000}, {0, 7'000}}));
  // A resumed attempt's ranks join afresh.
  rig.end();
  rig.resume(1, 20'000, false);
  BOOST_REQUIRE(rig.apply(w::rank_joined(0, 21'000, 200, "host-0")));
  BOOST_TEST((rig.sink.joins == Joins{{1, 5'000}, {0, 7'000}, {0, 21'000}}));
}

BOOST_AUTO_TEST_CASE(a_rank_that_has_not_joined_holds_every_row) {
  Rig rig(2, false);
  rig.join(0);
  BOOST_TEST(!rig.m.rank_joined(1));
  BOOST_TEST((rig.m.rank_state(1) == RunState::running));
  for (int i = 0; i < 5; ++i) rig.log(0, {{"x", double(i)}});
  BOOST_TEST(rig.sink.rows.empty());
  // A frame of a rank that never joined is refused.
  auto b = rig.batch(1);
  b.log({{"never", 1}});
  BOOST_TEST(!b.send());
  rig.join(1);
  BOOST_TEST(rig.m.rank_joined(1));
  BOOST_TEST(rig.sink.states.back().host == "host-1");
  rig.log(1, {{"x", 1}}, 3);
  BOOST_TEST(rig.steps() == Steps({0, 1, 2}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(explicit_steps_and_later_values_replace_earlier) {
  Rig rig(1);
  auto b = rig.batch(0);
  b.log({{"a", 1}, {"b", 2}, {"a", 3}}, 4, start_ts + 50);
  b.log({{"b", 5}}, 4, start_ts + 40);
  b.log({{"c", 6}}, auto_step, start_ts + 60); // auto after 4 is 5
  BOOST_REQUIRE(b.send());
  rig.end();
  BOOST_TEST(rig.steps() == Steps({4, 5}), boost::test_tools::per_element());
  BOOST_TEST(values_text(rig.row(4)) == "row 4 ts=1000040 rt=40 | a=0x1.8p+1#0 b=0x1.4p+2#0");
}

BOOST_AUTO_TEST_CASE(a_backwards_step_is_rejected_with_names_and_fix) {
  Rig rig(1);
  rig.log(0, {{"x", 1}}, 10);
  const auto s = rig.log(0, {{"loss", 2}, {"acc", 3}}, 7);
  BOOST_REQUIRE_EQUAL(rig.sink.rejections.size(), 1u);
  const auto& r = rig.sink.rejections[0];
  BOOST_TEST((r.code == Errc::backwards_step));
  BOOST_TEST(r.seq == s);
  BOOST_TEST(r.step == 7);
  BOOST_REQUIRE_EQUAL(r.values.size(), 2u);
  BOOST_TEST(r.values[0].first == "loss");
  BOOST_TEST(r.values[1].second == 3.0);
  BOOST_TEST(contains(r.message, "'loss'"));
  BOOST_TEST(contains(r.message, "'acc'"));
  BOOST_TEST(contains(r.message, "step 7"));
  BOOST_TEST(contains(r.message, "last step 10"));
  BOOST_TEST(contains(r.message, "automatic steps"));
  BOOST_TEST((rig.done(0, s) == Errc::backwards_step));
  BOOST_TEST(rig.m.values_rejected() == 2u);
  BOOST_TEST(rig.m.rank_last_step(0) == 10);
  rig.log(0, {{"x", 2}}); // auto: 11, the rejection did not move the step
  rig.end();
  BOOST_TEST(rig.steps() == Steps({10, 11}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(reductions) {
  Rig rig(3);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  {
    auto b = rig.batch(0);
    b.define("mean", Reduce::mean);
    b.define("sum", Reduce::sum);
    b.define("min", Reduce::min);
    b.define("max", Reduce::max);
    b.define("nanmax", Reduce::max);
    b.define("lonely", Reduce::sum);
    b.log({{"mean", 1}, {"sum", 1}, {"min", 3}, {"max", -1}, {"nanmax", 1}, {"plain", 1}, {"lonely", 4}});
    BOOST_REQUIRE(b.send());
  }
  rig.log(1, {{"mean", 2}, {"sum", 0.5}, {"min", -2}, {"max", 7}, {"nanmax", nan}, {"plain", 2}});
  rig.log(2, {{"mean", 4}, {"sum", 0.25}, {"min", 5}, {"max", 0}, {"nanmax", 3}});
  rig.end();
  BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), 1u);
  std::map<std::string, test::RecordedValue> by;
  for (const auto& v : rig.sink.rows[0].values) by[v.key + "/" + std::to_string(v.rank)] = v;
  BOOST_TEST(by.at("mean/-1").value == 7.0 / 3.0);
  BOOST_TEST(by.at("mean/-1").count == 3u);
  BOOST_TEST(by.at("sum/-1").value == 1.75);
  BOOST_TEST(by.at("min/-1").value == -2.0);
  BOOST_TEST(by.at("max/-1").value == 7.0);
  BOOST_TEST(std::isnan(by.at("nanmax/-1").value));
  BOOST_TEST(by.at("nanmax/-1").count == 3u);
  BOOST_TEST(by.at("lonely/-1").value == 4.0);
  BOOST_TEST(by.at("lonely/-1").count == 1u);
  BOOST_TEST(by.at("plain/0").value == 1.0);
  BOOST_TEST(by.at("plain/1").value == 2.0);
  BOOST_TEST(by.count("plain/-1") == 0u);
  // Every define completed, in order.
  for (std::uint64_t s = 1; s <= 6; ++s) BOOST_TEST((rig.done(0, s) == Errc::ok));
}

// `first` takes one rank's value, NaN or not: merger_columns_test.
BOOST_AUTO_TEST_CASE(nan_propagates_through_every_arithmetic_reduction) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (Reduce how : {Reduce::mean, Reduce::sum, Reduce::min, Reduce::max}) {
    Rig rig(2);
    {
      auto b = rig.batch(0);
      b.define("k", how);
      b.log({{"k", 1}});
      BOOST_REQUIRE(b.send());
    }
    rig.log(1, {{"k", nan}});
    rig.end();
    BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), 1u);
    BOOST_TEST(std::isnan(rig.sink.rows[0].values.at(0).value), "reduction " << int(how));
  }
}

BOOST_AUTO_TEST_CASE(values_sorted_by_key_name_then_rank) {
  Rig rig(3);
  rig.log(2, {{"b", 1}, {"a/z", 2}, {"A", 3}});
  rig.log(0, {{"b", 4}, {"a", 5}});
  rig.log(1, {{"b", 6}});
  rig.end();
  BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), 1u);
  std::vector<std::string> got;
  for (const auto& v : rig.sink.rows[0].values) got.push_back(v.key + ":" + std::to_string(v.rank));
  const std::vector<std::string> want{"A:2", "a:0", "a/z:2", "b:0", "b:1", "b:2"};
  BOOST_TEST(got == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(config_and_summary_in_stream_order) {
  Rig rig(2);
  auto b = rig.batch(1);
  const auto c = b.config(R"({"lr":1})");
  const auto s = b.summary(R"({"best":2})");
  b.config(R"({"lr":3})");
  BOOST_REQUIRE(b.send());
  BOOST_REQUIRE_EQUAL(rig.sink.configs.size(), 2u);
  BOOST_TEST(rig.sink.configs[0].second == R"({"lr":1})");
  BOOST_TEST(rig.sink.configs[1].second == R"({"lr":3})");
  BOOST_TEST(rig.sink.configs[1].first == 1);
  BOOST_TEST(rig.sink.summaries.at(0).second == R"({"best":2})");
  BOOST_TEST((rig.done(1, c) == Errc::ok));
  BOOST_TEST((rig.done(1, s) == Errc::ok));
}

BOOST_AUTO_TEST_CASE(barrier_orders_before_and_after) {
  Rig rig(2);
  rig.log(0, {{"x", 1}});                // step 0
  const auto b0 = rig.barrier(0, "epoch-1", 5000);
  BOOST_TEST(rig.m.open_barrier() == 0);
  BOOST_TEST(rig.m.open_barrier_timeout_ms() == 5000);
  BOOST_TEST(rig.m.missing_at_barrier() == std::vector<int>{1}, boost::test_tools::per_element());
  const auto after = rig.log(0, {{"x", 2}}); // waits behind the barrier
  BOOST_TEST(!rig.done(0, after).has_value());
  BOOST_TEST(!rig.done(0, b0).has_value());
  for (int i = 0; i < 4; ++i) rig.log(1, {{"x", 10.0 + i}}); // steps 0..3
  BOOST_TEST(rig.steps() == Steps({0, 1, 2}), boost::test_tools::per_element()); // rank 0 waits: it is past them
  const auto b1 = rig.barrier(1, "epoch-1", 9000);
  // Released: everything before it committed, then the waiters resume.
  BOOST_TEST(rig.m.open_barrier() == -1);
  BOOST_TEST((rig.done(0, b0) == Errc::ok));
  BOOST_TEST((rig.done(1, b1) == Errc::ok));
  BOOST_TEST((rig.done(0, after) == Errc::ok));
  BOOST_TEST(rig.steps() == Steps({0, 1, 2, 3}), boost::test_tools::per_element());
  // Rank 0's auto step moved past the committed step 3.
  rig.log(1, {{"x", 0}});
  rig.end();
  BOOST_TEST(rig.steps() == Steps({0, 1, 2, 3, 4}), boost::test_tools::per_element());
  BOOST_TEST(values_text(rig.row(4)) == "row 4 ts=1000010 rt=10 | x/rank-0=0x1p+1#0 x/rank-1=0x0p+0#0");
  // The barrier's completion came before the events behind it.
  std::size_t at_barrier = 0, at_after = 0;
  for (std::size_t i = 0; i < rig.sink.completions.size(); ++i) {
    if (rig.sink.completions[i].rank == 0 && rig.sink.completions[i].seq == b0) at_barrier = i;
    if (rig.sink.completions[i].rank == 0 && rig.sink.completions[i].seq == after) at_after = i;
  }
  BOOST_TEST(at_barrier < at_after);
}

BOOST_AUTO_TEST_CASE(explicit_step_at_or_below_a_barrier_commit_is_rejected) {
  Rig rig(2);
  rig.log(0, {{"x", 1}}, 5);
  rig.barrier(0, "sync");
  rig.log(1, {{"x", 1}}, 2);
  rig.barrier(1, "sync");
  BOOST_TEST(rig.m.last_committed_step() == 5);
  const auto s = rig.log(1, {{"late", 1}}, 4);
  BOOST_REQUIRE_EQUAL(rig.sink.rejections.size(), 1u);
  const auto& r = rig.sink.rejections[0];
  BOOST_TEST((r.code == Errc::step_committed));
  BOOST_TEST(contains(r.message, "'late'"));
  BOOST_TEST(contains(r.message, "'sync'"));
  BOOST_TEST(contains(r.message, "above 5"));
  BOOST_TEST(contains(r.message, "automatic steps"));
  BOOST_TEST((rig.done(1, s) == Errc::step_committed));
  rig.log(1, {{"ok", 1}}, 6);
  rig.end();
  BOOST_TEST(rig.steps() == Steps({2, 5, 6}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(barrier_name_mismatch_is_an_error_but_still_a_barrier) {
  Rig rig(3);
  const auto a = rig.barrier(0, "epoch-3");
  const auto b = rig.barrier(1, "epoch-4");
  const auto c = rig.barrier(2, "epoch-3");
  for (auto [rank, seq] : {std::pair{0, a}, std::pair{1, b}, std::pair{2, c}}) {
    const auto* done = rig.sink.completion(rank, seq);
    BOOST_REQUIRE(done);
    BOOST_TEST((done->code == Errc::barrier_mismatch));
    BOOST_TEST(contains(done->message, "'epoch-3' (ranks 0, 2)"));
    BOOST_TEST(contains(done->message, "'epoch-4' (rank 1)"));
  }
  BOOST_TEST(rig.m.open_barrier() == -1);
}

BOOST_AUTO_TEST_CASE(barrier_timeout_names_the_missing_and_lets_late_ranks_through) {
  Rig rig(4);
  const auto b0 = rig.barrier(0, "sync", 100);
  const auto b1 = rig.barrier(1, "sync", 300);
  BOOST_TEST(rig.m.open_barrier_timeout_ms() == 300);
  BOOST_TEST(rig.m.missing_at_barrier() == std::vector<int>({2, 3}), boost::test_tools::per_element());
  BOOST_REQUIRE(rig.apply(w::barrier_timeout(7, 1))); // a stale timer: nothing happens
  BOOST_TEST(rig.m.open_barrier() == 0);
  const auto behind = rig.log(0, {{"x", 1}});
  rig.log(2, {{"x", 2}}, 3);
  BOOST_REQUIRE(rig.apply(w::barrier_timeout(0, 1)));
  BOOST_TEST(rig.m.open_barrier() == -1);
  for (auto [rank, seq] : {std::pair{0, b0}, std::pair{1, b1}}) {
    const auto* done = rig.sink.completion(rank, seq);
    BOOST_REQUIRE(done);
    BOOST_TEST((done->code == Errc::barrier_timeout));
    BOOST_TEST(contains(done->message, "ranks 2, 3"));
    BOOST_TEST(contains(done->message, "'sync'"));
  }
  BOOST_TEST((rig.done(0, behind) == Errc::ok));
  BOOST_TEST(rig.m.last_committed_step() == 3);
  // Rank 3 missed the barrier: its auto steps at or below 3 are refused.
  const auto low = rig.log(3, {{"y", 1}});
  BOOST_TEST((rig.done(3, low) == Errc::step_committed));
  BOOST_TEST(contains(rig.sink.rejections.back().message, "timed out"));
  // It reaches the barrier late and passes straight through, past step 3.
  const auto late = rig.barrier(3, "sync");
  const auto* done = rig.sink.completion(3, late);
  BOOST_REQUIRE(done);
  BOOST_TEST((done->code == Errc::barrier_timeout));
  BOOST_TEST(contains(done->message, "rank 3"));
  BOOST_TEST(rig.m.open_barrier() == -1);
  rig.log(3, {{"y", 2}});
  rig.end();
  BOOST_TEST(values_text(rig.row(4)) == "row 4 ts=1000010 rt=10 | x/rank-0=0x1p+0#0 y/rank-3=0x1p+1#0");
}

BOOST_AUTO_TEST_CASE(finished_and_dead_ranks_do_not_block) {
  Rig rig(3);
  rig.log(0, {{"x", 1}});
  rig.log(1, {{"x", 1}});
  const auto f = rig.finish(2);
  BOOST_TEST((rig.m.rank_state(2) == RunState::finished));
  BOOST_TEST((rig.done(2, f) == Errc::ok));
  BOOST_TEST(rig.sink.states.back().state == RunState::finished);
  rig.log(0, {{"x", 2}});
  BOOST_TEST(rig.sink.rows.empty());
  rig.dead(1, "its process exited");
  BOOST_TEST((rig.m.rank_state(1) == RunState::crashed));
  BOOST_TEST(rig.sink.states.back().reason == "its process exited");
  BOOST_TEST(rig.sink.states.back().last_step == 0);
  BOOST_TEST(rig.steps() == Steps{0}, boost::test_tools::per_element());
  // Frames of a dead or finished rank change nothing.
  const auto n = rig.sink.log.size();
  auto b = rig.batch(1);
  b.log({{"x", 5}});
  BOOST_TEST(b.send());
  auto c = rig.batch(2);
  c.log({{"x", 5}});
  BOOST_TEST(c.send());
  BOOST_TEST(rig.sink.log.size() == n);
  // A lone live rank passes a barrier at once.
  const auto bar = rig.barrier(0, "solo");
  BOOST_TEST((rig.done(0, bar) == Errc::ok));
  BOOST_TEST(!rig.m.all_done());
  rig.finish(0);
  BOOST_TEST(rig.m.all_done());
}

BOOST_AUTO_TEST_CASE(events_of_a_rank_that_died_behind_a_barrier_are_kept) {
  Rig rig(2);
  rig.barrier(0, "b");
  const auto behind = rig.log(0, {{"x", 1}});
  {
    auto b = rig.batch(0);
    b.config(R"({"a":1})");
    b.log({{"x", 2}});
    BOOST_REQUIRE(b.send());
  }
  rig.dead(0, "lost");
  // Rank 1 is the only live rank now; the barrier waits for it.
  BOOST_TEST(rig.m.open_barrier() == 0);
  BOOST_TEST(rig.m.missing_at_barrier() == std::vector<int>{1}, boost::test_tools::per_element());
  rig.log(1, {{"y", 1}});
  rig.barrier(1, "b");
  BOOST_TEST((rig.done(0, behind) == Errc::ok));
  BOOST_REQUIRE_EQUAL(rig.sink.configs.size(), 1u);
  rig.end(RunState::failed);
  BOOST_TEST(rig.steps() == Steps({0, 1, 2}), boost::test_tools::per_element());
  BOOST_TEST(values_text(rig.row(1)) == "row 1 ts=1000010 rt=10 | x/rank-0=0x1p+0#0");
}

BOOST_AUTO_TEST_CASE(a_dead_ranks_waiting_events_are_processed_when_all_others_finished) {
  Rig rig(2);
  rig.barrier(0, "b");
  rig.log(0, {{"x", 1}});
  rig.dead(0);
  rig.finish(1); // no live rank left: the barrier releases, the waiting values are processed
  BOOST_TEST(rig.m.all_done());
  rig.end(RunState::failed);
  BOOST_TEST(rig.steps() == Steps{0}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(finish_timeout_crashes_every_running_rank) {
  Rig rig(3, false);
  rig.join(0);
  rig.join(1);
  rig.log(0, {{"x", 1}}, 4);
  rig.finish(1);
  BOOST_REQUIRE(rig.apply(w::finish_timeout(5)));
  BOOST_TEST((rig.m.rank_state(0) == RunState::crashed));
  BOOST_TEST((rig.m.rank_state(1) == RunState::finished));
  BOOST_TEST((rig.m.rank_state(2) == RunState::crashed));
  BOOST_TEST(rig.m.all_done());
  BOOST_REQUIRE_EQUAL(rig.sink.states.size(), 5u);
  BOOST_TEST(contains(rig.sink.states[3].reason, "finish_timeout"));
  BOOST_TEST(rig.sink.states[3].last_step == 4);
  BOOST_TEST(rig.steps() == Steps{4}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_finish_behind_a_barrier_is_let_through_at_the_finish_timeout) {
  // Rank 0 waits at a barrier rank 1 never reaches, and finishes there (its
  // trainer was interrupted at the barrier): the finish waits behind the
  // barrier, and the finish timeout lets it through, so rank 0 ends as it
  // asked, with what it logged, and only rank 1 is crashed.
  Rig rig(2);
  rig.log(0, {{"x", 1}});
  const auto b = rig.barrier(0, "never");
  rig.log(0, {{"x", 2}});
  const auto fin = rig.finish(0, 130);
  BOOST_TEST(rig.m.finish_waiting(0));
  BOOST_TEST(!rig.m.finish_waiting(1));
  BOOST_TEST(!rig.sink.completion(0, fin));
  BOOST_REQUIRE(rig.apply(w::finish_timeout(5)));
  BOOST_TEST((rig.m.rank_state(0) == RunState::failed));
  BOOST_TEST((rig.m.rank_state(1) == RunState::crashed));
  BOOST_TEST(rig.m.all_done());
  const auto* barrier_done = rig.sink.completion(0, b);
  BOOST_REQUIRE(barrier_done);
  BOOST_TEST((barrier_done->code == Errc::barrier_timeout));
  const auto* finish_done = rig.sink.completion(0, fin);
  BOOST_REQUIRE(finish_done);
  BOOST_TEST((finish_done->code == Errc::ok));
  rig.end(RunState::failed);
  BOOST_TEST(rig.steps() == Steps({0, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(run_end_releases_barriers_and_commits_everything) {
  Rig rig(3);
  rig.log(0, {{"x", 1}});
  const auto b = rig.barrier(0, "one");
  const auto behind = rig.log(0, {{"x", 2}});
  rig.barrier(0, "two"); // waits behind the first, in rank 0's buffer
  rig.log(0, {{"x", 3}});
  rig.log(1, {{"x", 5}}, 7);
  rig.end(RunState::failed);
  const auto* done = rig.sink.completion(0, b);
  BOOST_REQUIRE(done);
  BOOST_TEST((done->code == Errc::barrier_timeout));
  BOOST_TEST(contains(done->message, "ended"));
  BOOST_TEST((rig.done(0, behind) == Errc::ok));
  BOOST_TEST(rig.steps() == Steps({0, 7, 8, 9}), boost::test_tools::per_element());
  BOOST_TEST(rig.sink.ended);
  BOOST_TEST((rig.sink.end_state == RunState::failed));
  BOOST_TEST(rig.m.open_barrier() == -1);
  // Nothing is taken after the end.
  const auto n = rig.sink.log.size();
  BOOST_TEST(rig.apply(w::rank_dead(2, 1, "x")));
  auto later = rig.batch(2);
  later.log({{"x", 1}});
  BOOST_TEST(later.send());
  BOOST_TEST(rig.sink.log.size() == n);
}

BOOST_AUTO_TEST_CASE(malformed_frames_are_refused_and_change_nothing) {
  Rig rig(2);
  std::vector<char> out;
  {
    w::BatchWriter b(out, 0);
    b.key(1, "good");
    b.values(1, 0, 0, 2);
    b.value(1, 1.0);
    b.value(2, 2.0); // key 2 was never named
  }
  BOOST_TEST(!rig.apply(out));
  out.clear();
  {
    w::BatchWriter b(out, 0);
    b.key(1, "good");
    b.key(1, "other"); // one id, two names
  }
  BOOST_TEST(!rig.apply(out));
  out.clear();
  {
    w::BatchWriter b(out, 5); // no such rank
    b.finish(1);
  }
  BOOST_TEST(!rig.apply(out));
  out.clear();
  {
    w::BatchWriter b(out, 0);
    b.key(1u << 30, "far"); // beyond any key table a process builds
  }
  BOOST_TEST(!rig.apply(out));
  BOOST_TEST(!rig.apply(std::vector<char>{1, 2, 3}));
  BOOST_TEST(!rig.apply(w::run_start(0, 2, "{}"))); // started already
  BOOST_TEST(!rig.apply(w::rank_dead(9, 0, "no such rank")));
  BOOST_TEST(!rig.apply(w::rank_joined(9, 0, 1, "h")));
  BOOST_TEST(rig.sink.rows.empty());
  BOOST_TEST(rig.sink.completions.empty());

  // Key 1 was not left defined by the refused frames: it may still be named anew.
  out.clear();
  {
    w::BatchWriter b(out, 0);
    b.key(1, "other");
    b.values(1, 0, start_ts, 1);
    b.value(1, 3.0);
  }
  BOOST_TEST(rig.apply(out));
  rig.end();
  BOOST_TEST(values_text(rig.row(0)) == "row 0 ts=1000000 rt=0 | other/rank-0=0x1.8p+1#0");

  test::RecordingSink sink;
  Merger fresh(sink);
  sink.merger = &fresh;
  BOOST_TEST(!fresh.apply(w::rank_joined(0, 0, 1, "h"))); // before run_start
  BOOST_TEST(!fresh.apply(w::run_start(0, 0, "{}")));      // no ranks
  BOOST_TEST(!fresh.started());
}

BOOST_AUTO_TEST_CASE(frames_whose_seqs_do_not_go_up_as_a_proxy_numbers_them_are_refused) {
  // A seq far ahead would complete tickets not yet sent (a finish among them).
  Rig rig(2);
  auto frame = [](std::vector<std::uint64_t> seqs) {
    std::vector<char> out;
    w::BatchWriter b(out, 0);
    b.key(1, "loss");
    std::int64_t step = 0;
    for (std::uint64_t seq : seqs) {
      b.values(seq, step++, start_ts, 1);
      b.value(1, 1.0);
    }
    return out;
  };
  BOOST_TEST(!rig.apply(frame({std::uint64_t{1} << 62})));
  BOOST_TEST(!rig.apply(frame({0})));    // seqs start at 1
  BOOST_TEST(!rig.apply(frame({2, 2}))); // and go up
  BOOST_TEST(!rig.apply(frame({3, 2})));
  BOOST_TEST(rig.sink.completions.empty());
  BOOST_TEST(rig.apply(frame({1, 2, 3})));
  BOOST_TEST(!rig.apply(frame({3}))); // not again
  BOOST_TEST(!rig.apply(frame({4 + (1u << 17)})));
  BOOST_TEST(rig.apply(frame({4 + 65535})));
}

BOOST_AUTO_TEST_CASE(two_local_ids_for_one_name_are_one_key) {
  Rig rig(1);
  std::vector<char> out;
  {
    w::BatchWriter b(out, 0);
    b.key(4, "k");
    b.key(9, "k");
    b.key(4, "k"); // named again: fine
    b.values(1, 0, start_ts, 2);
    b.value(4, 1.0);
    b.value(9, 2.0);
  }
  BOOST_REQUIRE(rig.apply(out));
  rig.end();
  BOOST_TEST(values_text(rig.row(0)) == "row 0 ts=1000000 rt=0 | k=0x1p+1#0");
}

BOOST_AUTO_TEST_CASE(completions_follow_each_ranks_seq_order) {
  Rig rig(2);
  auto b = rig.batch(0);
  b.define("x", Reduce::sum);
  b.log({{"x", 1}});
  b.log({{"x", 1}}, 0); // fine: same step
  b.barrier("b");
  b.log({{"x", 1}});
  b.config("{}");
  b.finish();
  b.log({{"x", 1}}); // after finish: ignored
  BOOST_REQUIRE(b.send());
  rig.barrier(1, "b");
  std::vector<std::uint64_t> got;
  for (const auto& c : rig.sink.completions)
    if (c.rank == 0) got.push_back(c.seq);
  BOOST_TEST(got == std::vector<std::uint64_t>({1, 2, 3, 4, 5, 6, 7}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(many_rows_commit_in_one_apply) {
  Rig rig(2);
  auto b = rig.batch(0);
  for (int i = 0; i < 1000; ++i) b.log({{"x", double(i)}});
  BOOST_REQUIRE(b.send());
  auto c = rig.batch(1);
  c.log({{"y", 1}}, 2000);
  BOOST_REQUIRE(c.send());
  BOOST_TEST(rig.sink.rows.size() == 999u);
  rig.end();
  BOOST_TEST(rig.sink.rows.size() == 1001u);
}

BOOST_AUTO_TEST_CASE(sparse_and_huge_steps) {
  Rig rig(2);
  const std::int64_t big = std::numeric_limits<std::int64_t>::max() - 1;
  rig.log(0, {{"x", 1}}, 1'000'000'000'000);
  rig.log(1, {{"x", 2}}, 3);
  rig.log(1, {{"x", 3}}, big);
  const auto over = rig.log(1, {{"x", 4}}); // the auto step would pass the largest step
  BOOST_TEST((rig.done(1, over) == Errc::invalid_argument));
  rig.end();
  BOOST_TEST(rig.steps() == Steps({3, 1'000'000'000'000, big}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(replay_gives_the_same_output) {
  Rig rig(3);
  rig.log(0, {{"a", 1}});
  rig.barrier(0, "x");
  rig.log(0, {{"a", 2}});
  rig.log(1, {{"a", 3}, {"b", 4}}, 2);
  rig.dead(2);
  rig.log(1, {{"a", 3}}, 1);
  rig.barrier(1, "y");
  rig.log(1, {{"b", 5}});
  rig.end();

  BOOST_TEST(replayed_log(rig) == rig.sink.log, boost::test_tools::per_element());
  BOOST_TEST(!rig.sink.log.empty());
}

// Options::resume: a job killed after step 5 committed starts again under
// the same run id; the host replays the log, closes the attempt, and sends a
// second run_start.
BOOST_AUTO_TEST_CASE(a_resumed_attempt_goes_on_after_the_last_committed_step) {
  Rig rig(2);
  for (int s = 0; s < 5; ++s) {
    rig.log(0, {{"loss", 10.0 + s}});
    rig.log(1, {{"loss", 20.0 + s}});
  }
  rig.dead(1, "killed");
  rig.log(0, {{"loss", 15}}); // step 5, with rank 1 gone
  rig.dead(0, "the run host died"); // closing_frames, as the resumed host applies them
  rig.end(RunState::crashed);
  BOOST_TEST(rig.steps() == Steps({0, 1, 2, 3, 4, 5}), boost::test_tools::per_element());
  BOOST_TEST(rig.m.all_done());

  const std::int64_t resumed_at = start_ts + 60'000'000;
  rig.resume(2, resumed_at, /*join_all=*/false);
  // The ranks start afresh, the dead one too; the history goes on.
  BOOST_TEST(!rig.m.all_done());
  for (int r : {0, 1}) {
    BOOST_TEST(rig.m.rank_state(r) == RunState::running);
    BOOST_TEST(!rig.m.rank_joined(r));
    BOOST_TEST(rig.m.rank_last_step(r) == -1);
  }
  BOOST_TEST(rig.m.last_committed_step() == 5);
  BOOST_TEST(rig.m.start_ts_us() == start_ts); // runtime counts from the run's first start
  BOOST_TEST(!rig.apply(w::run_start(resumed_at, 2, "{}"))); // this attempt is running
  rig.join(0);
  rig.join(1);

  // Trainers reloaded a checkpoint at step 3: steps up to 5 are refused, never written twice.
  const auto low = rig.log(0, {{"loss", 99}}, 3);
  const auto edge = rig.log(1, {{"loss", 99}}, 5);
  BOOST_TEST((rig.done(0, low) == Errc::step_committed));
  BOOST_TEST((rig.done(1, edge) == Errc::step_committed));
  BOOST_REQUIRE_EQUAL(rig.sink.rejections.size(), 2u);
  BOOST_TEST(contains(rig.sink.rejections[0].message, "steps up to 5 are already committed"),
             rig.sink.rejections[0].message);

  // Auto steps go on after 5, and an explicit 6 meets them there.
  const auto next = rig.log(0, {{"loss", 16}}, auto_step, resumed_at + 10);
  rig.log(1, {{"loss", 26}}, 6, resumed_at + 20);
  rig.log(0, {{"loss", 17}}, auto_step, resumed_at + 30);
  rig.log(1, {{"loss", 27}}, auto_step, resumed_at + 40);
  BOOST_TEST((rig.done(0, next) == Errc::ok));
  BOOST_TEST(rig.steps() == Steps({0, 1, 2, 3, 4, 5, 6}), boost::test_tools::per_element());
  BOOST_TEST(values_text(rig.row(6)) == "row 6 ts=" + std::to_string(resumed_at + 10) + " rt=60000010 | loss/rank-0=" +
                                            exact(16) + "#0 loss/rank-1=" + exact(26) + "#0");

  // Barriers count from 0 again in the new attempt: both ranks meet at the first.
  const auto b0 = rig.barrier(0, "ckpt");
  const auto b1 = rig.barrier(1, "ckpt");
  BOOST_TEST((rig.done(0, b0) == Errc::ok));
  BOOST_TEST((rig.done(1, b1) == Errc::ok));
  BOOST_TEST(rig.steps().back() == 7);
  rig.finish(0);
  rig.finish(1);
  BOOST_TEST(rig.m.all_done());
  rig.end();
  BOOST_TEST(std::count_if(rig.sink.log.begin(), rig.sink.log.end(),
                           [](const std::string& l) { return l.starts_with("start "); }) == 2);

  // What `chorus recover`, or the next resume, replays from the log gives the same.
  BOOST_TEST(replayed_log(rig) == rig.sink.log, boost::test_tools::per_element());
}

namespace {

/// Counts what arrives and keeps nothing: the merge's own cost, measured.
class CountingSink final : public core::HistorySink {
public:
  std::uint64_t rows = 0, values = 0, done = 0;
  void run_start(std::string_view, std::int64_t, std::uint32_t) override {}
  void row(const core::Row& r) override {
    ++rows;
    values += r.values.size();
  }
  void config(int, std::string_view) override {}
  void summary(int, std::string_view) override {}
  void rejected(int, std::uint64_t, std::int64_t, std::span<const std::pair<std::string_view, double>>,
                const Error&) override {}
  void rank_state(int, RunState, std::int64_t, std::string_view, std::string_view) override {}
  void completed(int, std::uint64_t, const Error*) override { ++done; }
  void run_end(RunState, std::int64_t) override {}
};

struct Throughput {
  double values_per_s;
  std::uint64_t rows;
};

/// `ranks` ranks log `keys` keys per call (a quarter of them reduced), in
/// frames of `calls` calls, round-robin, for `steps` steps each.
Throughput merge_throughput(int ranks, int keys, int calls, int steps) {
  std::vector<std::vector<std::vector<char>>> frames(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    std::uint64_t seq = 0;
    for (int s = 0; s < steps; s += calls) {
      std::vector<char> out;
      w::BatchWriter b(out, static_cast<std::uint32_t>(r));
      if (s == 0) {
        for (int k = 0; k < keys; ++k)
          b.key(static_cast<std::uint32_t>(k), "metric/" + std::to_string(k * 7919 % 1000));
        for (int k = 0; k < keys; k += 4) b.define(++seq, static_cast<std::uint32_t>(k), Reduce::mean);
      }
      for (int c = 0; c < calls && s + c < steps; ++c) {
        b.values(++seq, w::auto_step, 1000 + s + c, static_cast<std::uint32_t>(keys));
        for (int k = 0; k < keys; ++k) b.value(static_cast<std::uint32_t>(k), 0.5 * (s + c) + k);
      }
      frames[r].push_back(std::move(out));
    }
  }
  CountingSink sink;
  Merger m(sink);
  BOOST_REQUIRE(m.apply(w::run_start(0, static_cast<std::uint32_t>(ranks), "{}")));
  for (int r = 0; r < ranks; ++r) BOOST_REQUIRE(m.apply(w::rank_joined(static_cast<std::uint32_t>(r), 0, r, "h")));
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < frames[0].size(); ++i)
    for (int r = 0; r < ranks; ++r) BOOST_REQUIRE(m.apply(frames[r][i]));
  BOOST_REQUIRE(m.apply(w::run_end(RunState::finished, 1)));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double values = double(ranks) * keys * steps;
  BOOST_TEST(sink.rows == static_cast<std::uint64_t>(steps));
  return {values / secs, sink.rows};
}

} // namespace

// Not a benchmark (bench/ has those, and nothing here asserts on time): a
// figure in the log, and a check that 1024 ranks merge correctly.
BOOST_AUTO_TEST_CASE(merge_throughput_in_the_log) {
  // The same 4M values, in frames of 1024 values (16 calls of 64 keys), over more and more ranks.
  for (int ranks : {4, 64, 1024}) {
    const auto t = merge_throughput(ranks, 64, 16, 65536 / ranks);
    BOOST_TEST_MESSAGE("merge, " << ranks << " ranks x 64 keys, 1024 values a frame: " << t.values_per_s / 1e6
                                 << " M values/s (" << 1e9 / t.values_per_s << " ns a value)");
  }
  const auto big = merge_throughput(4, 64, 64, 16384);
  BOOST_TEST_MESSAGE("merge, 4 ranks x 64 keys, 4096 values a frame: " << big.values_per_s / 1e6 << " M values/s");
  const auto thin = merge_throughput(4, 1, 1024, 65536);
  BOOST_TEST_MESSAGE("merge, 4 ranks x 1 key, 1024 values a frame: " << thin.values_per_s / 1e6 << " M values/s");
}

BOOST_AUTO_TEST_CASE(a_thousand_ranks_meet_at_a_barrier) {
  constexpr int ranks = 1024;
  Rig rig(ranks);
  for (int r = ranks - 1; r >= 0; --r) {
    auto b = rig.batch(r);
    b.define("loss", Reduce::sum);
    b.log({{"loss", 1.0}, {"own", double(r)}});
    b.barrier("end");
    b.log({{"loss", 2.0}});
    b.finish();
    BOOST_REQUIRE(b.send());
    if (r > 0) BOOST_TEST(rig.m.open_barrier() == 0);
  }
  BOOST_TEST(rig.m.all_done());
  rig.end();
  BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), 2u);
  const auto& first = rig.sink.rows[0];
  BOOST_TEST(first.values.size() == 1u + ranks);
  BOOST_TEST(first.values[0].key == "loss");
  BOOST_TEST(first.values[0].value == double(ranks));
  BOOST_TEST(first.values[0].count == static_cast<std::uint32_t>(ranks));
  BOOST_TEST(first.values[1].rank == 0);
  BOOST_TEST(first.values.back().rank == ranks - 1);
  BOOST_TEST(rig.sink.rows[1].values.at(0).value == 2.0 * ranks);
}

// Wide rows take the linear-time sort: check it against a plain computation.
BOOST_AUTO_TEST_CASE(wide_rows_sorted_and_reduced) {
  constexpr int ranks = 300;
  const std::vector<std::string> keys{"w", "b/x", "a", "zz", "m"};
  Rig rig(ranks);
  std::mt19937 rng(7);
  std::vector<int> order(ranks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int r : order) {
    auto b = rig.batch(r);
    if (r == 5) {
      b.define("a", Reduce::sum);
      b.define("m", Reduce::max);
    }
    std::vector<std::pair<std::string, double>> values;
    for (std::size_t k = 0; k < keys.size(); ++k) values.emplace_back(keys[k], r * 10.0 + double(k));
    std::shuffle(values.begin(), values.end(), rng);
    b.log(values, 3);
    BOOST_REQUIRE(b.send());
  }
  rig.end();
  BOOST_REQUIRE_EQUAL(rig.sink.rows.size(), 1u);
  const auto& v = rig.sink.rows[0].values;
  BOOST_REQUIRE_EQUAL(v.size(), 2u + 3u * ranks);
  BOOST_TEST(v[0].key == "a");
  double sum = 0;
  for (int r = 0; r < ranks; ++r) sum += r * 10.0 + 2;
  BOOST_TEST(v[0].value == sum);
  BOOST_TEST(v[0].count == std::uint32_t(ranks));
  for (int r = 0; r < ranks; ++r) {
    BOOST_TEST(v[1 + r].key == "b/x");
    BOOST_TEST(v[1 + r].rank == r);
    BOOST_TEST(v[1 + r].value == r * 10.0 + 1);
  }
  BOOST_TEST(v[1 + ranks].key == "m");
  BOOST_TEST(v[1 + ranks].value == (ranks - 1) * 10.0 + 4);
  BOOST_TEST(v[2 + ranks].key == "w");
  BOOST_TEST(v.back().key == "zz");
  BOOST_TEST(v.back().rank == ranks - 1);
  BOOST_TEST(v.back().value == (ranks - 1) * 10.0 + 3);
}

// Frames damaged on the way (or in a WAL) never break the merge: a refused
// frame changes nothing, and the run goes on. Run it under ASan.
BOOST_AUTO_TEST_CASE(damaged_frames_never_break_the_merge) {
  Rig rig(3);
  {
    auto b = rig.batch(0);
    b.define("loss", Reduce::mean);
    b.log({{"loss", 1}, {"acc", 2}});
    b.barrier("e1");
    b.log({{"loss", 3}}, 4);
    b.config(R"({"a":1})");
    BOOST_REQUIRE(b.send());
  }
  rig.log(1, {{"loss", 2}});
  rig.barrier(1, "e1");
  rig.dead(2, "gone");
  rig.log(1, {{"x", 5}}, 3);
  rig.finish(1);
  rig.finish(0);
  rig.end();
  const auto& frames = rig.frames;

  const char* env = std::getenv("CHORUS_SEED");
  const std::uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
  BOOST_TEST_MESSAGE("merge damage seed " << seed << " (set CHORUS_SEED to replay)");
  std::mt19937_64 rng(seed);
  int refused = 0;
  for (int round = 0; round < 3000; ++round) {
    BOOST_TEST_CONTEXT("seed " << seed << " round " << round) {
      const std::size_t at = 1 + rng() % (frames.size() - 1);
      auto damaged = frames[at];
      for (int e = 0, edits = 1 + static_cast<int>(rng() % 3); e < edits; ++e) {
        if (rng() % 4 == 0 && damaged.size() > 1)
          damaged.resize(1 + rng() % (damaged.size() - 1));
        else
          damaged[rng() % damaged.size()] = static_cast<char>(rng());
      }
      test::RecordingSink sink;
      Merger m(sink);
      sink.merger = &m;
      for (std::size_t i = 0; i < at; ++i) m.apply(frames[i]);
      const auto before = sink.log.size();
      if (!m.apply(damaged)) {
        ++refused;
        BOOST_TEST(sink.log.size() == before);
      }
      for (std::size_t i = at + 1; i < frames.size(); ++i) m.apply(frames[i]);
    }
  }
  BOOST_TEST_MESSAGE(refused << " of 3000 damaged frames refused");
  BOOST_TEST(refused > 0);
}

BOOST_AUTO_TEST_CASE(a_rank_ends_as_its_finish_says_and_the_worst_ending_names_the_run) {
  Rig rig(4);
  for (int r = 0; r < 4; ++r) rig.log(r, {{"x", r}}, 0);
  BOOST_TEST((rig.m.end_state() == RunState::finished));
  auto killed = rig.batch(2);
  killed.end(RunState::killed, SIGTERM);
  BOOST_REQUIRE(killed.send());
  BOOST_TEST((rig.m.rank_state(2) == RunState::killed));
  BOOST_TEST(rig.m.rank_message(2) == "stopped by SIGTERM");
  BOOST_TEST((rig.m.end_state() == RunState::killed));
  rig.dead(3, "its connection was lost");
  BOOST_TEST((rig.m.end_state() == RunState::crashed)); // a rank lost outranks a signal
  auto failed = rig.batch(1);
  failed.end(RunState::failed, 1, "ValueError: boom");
  BOOST_REQUIRE(failed.send());
  BOOST_TEST(rig.m.rank_message(1) == "ended its run with exit code 1: ValueError: boom");
  BOOST_TEST((rig.m.end_state() == RunState::failed)); // and a failure outranks both
  rig.finish(0);
  BOOST_TEST(rig.m.rank_message(0).empty());
  const auto it = std::find_if(rig.sink.states.begin(), rig.sink.states.end(),
                               [](const StateChange& c) { return c.rank == 1 && c.state == RunState::failed; });
  BOOST_REQUIRE(it != rig.sink.states.end());
  BOOST_TEST(it->reason == "ended its run with exit code 1: ValueError: boom");
  // Every value logged before the endings is committed.
  rig.end(rig.m.end_state());
  BOOST_TEST(rig.steps() == Steps{0}, boost::test_tools::per_element());
  BOOST_TEST(replayed_log(rig) == rig.sink.log, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_ended_finish_carries_at_most_4_KiB_of_message) {
  std::vector<char> out;
  w::BatchWriter b(out, 0);
  b.finish_ended(1, RunState::failed, 3, std::string(10000, 'm'));
  w::Frame f;
  BOOST_REQUIRE(w::decode(out, f));
  w::for_each_event(f, [](const w::RankEvent& e) {
    const auto* fin = std::get_if<w::Finish>(&e);
    BOOST_REQUIRE(fin);
    BOOST_TEST(fin->message.size() == w::max_end_message);
    BOOST_TEST((fin->state == RunState::failed));
    BOOST_TEST(fin->code == 3);
  });
  // A finished state in finish_ended is none that a rank sends: malformed.
  std::vector<char> bad;
  w::BatchWriter c(bad, 0);
  c.finish_ended(1, RunState::finished, 0, "");
  BOOST_TEST(!w::decode(bad, f));
}

BOOST_AUTO_TEST_CASE(a_rank_exit_after_its_finish_fails_it_and_a_run_that_ended_finished) {
  Rig rig(2);
  rig.log(0, {{"x", 1}}, 0);
  rig.log(1, {{"x", 2}}, 0);
  rig.finish(0);
  rig.finish(1);
  // Before the end: the rank turns failed, and so will the run.
  BOOST_REQUIRE(rig.apply(w::rank_exit(1, 50, 3)));
  BOOST_TEST((rig.m.rank_state(1) == RunState::failed));
  BOOST_TEST(contains(rig.m.rank_message(1), "exited with status 3 after it finished"));
  BOOST_TEST((rig.m.end_state() == RunState::failed));
  rig.end(RunState::failed);
  // After the end: the run that ended failed stays so; a second exit of a rank already failed changes nothing.
  const auto n = rig.sink.log.size();
  BOOST_REQUIRE(rig.apply(w::rank_exit(1, 60, 4)));
  BOOST_TEST(rig.sink.log.size() == n);

  Rig fine(2);
  fine.finish(0);
  fine.finish(1);
  fine.end(RunState::finished);
  BOOST_REQUIRE(fine.apply(w::rank_exit(0, 70, 2)));
  BOOST_TEST((fine.m.rank_state(0) == RunState::failed));
  BOOST_TEST(fine.sink.ended);
  BOOST_TEST((fine.sink.end_state == RunState::failed)); // the sink heard run_end again, amended
  BOOST_TEST(fine.sink.end_ts == 99);                    // at the end's own time
  BOOST_TEST(replayed_log(fine) == fine.sink.log, boost::test_tools::per_element());
  // A rank outside the run is a malformed event; a status of 0 is none.
  BOOST_TEST(!fine.apply(w::rank_exit(7, 80, 2)));
  BOOST_TEST(!fine.apply(w::rank_exit(1, 80, 0)));
}

BOOST_AUTO_TEST_CASE(values_refused_before_the_ring_are_counted_and_take_no_step) {
  Rig rig(1);
  rig.log(0, {{"x", 1}});
  auto b = rig.batch(0);
  const auto seq = b.refused(auto_step, 3, R"({"":1,"_y":2,"z":"a string"})");
  BOOST_REQUIRE(b.send());
  BOOST_TEST(rig.m.values_rejected() == 3u);
  BOOST_REQUIRE_EQUAL(rig.sink.refusals.size(), 1u);
  BOOST_TEST(rig.sink.refusals[0] == "0 " + std::to_string(seq) + R"( auto invalid_key 3 {"":1,"_y":2,"z":"a string"})");
  BOOST_TEST((rig.done(0, seq) == Errc::ok)); // its ticket carries the rank's own error already
  rig.log(0, {{"x", 2}});
  rig.end();
  BOOST_TEST(rig.steps() == Steps({0, 1}), boost::test_tools::per_element()); // no step taken by the refusal
}

BOOST_AUTO_TEST_CASE(a_metric_declaration_reaches_the_sink_whole) {
  Rig rig(2);
  auto b = rig.batch(0);
  b.define("loss", Reduce::mean);
  b.view("loss", Summary::min);
  b.view("loss", std::nullopt, "epoch"); // the summary stays
  b.view("acc", Summary::max);
  BOOST_REQUIRE(b.send());
  BOOST_TEST(rig.sink.metrics == std::vector<std::string>({"loss mean last -", "loss mean min -",
                                                            "loss mean min epoch", "acc none max -"}),
             boost::test_tools::per_element());
  // A step metric named by an id the frame never defined is malformed.
  std::vector<char> out;
  w::BatchWriter bad(out, 1);
  bad.key(0, "m");
  bad.metric_view(1, 0, 0, 9);
  BOOST_TEST(!rig.apply(out));
}
