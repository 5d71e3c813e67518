// Several producers in one rank (README, "Many producers in one rank"): each
// writer stream's steps are ordered on their own, and the rank stands at the
// minimum over its live streams, so producers that interleave out of order
// lose nothing.
#define BOOST_TEST_MODULE actors_merger_streams
#include <boost/test/unit_test.hpp>

#include "tests/actors/merger_rig.hpp"

#include <string>
#include <vector>

using namespace chorus;
using namespace chorus::test;

namespace {

/// The steps of the committed rows that hold `key`.
std::vector<std::int64_t> steps_of(const Rig& rig, std::string_view key) {
  std::vector<std::int64_t> out;
  for (const RecordedRow& r : rig.sink.rows)
    for (const RecordedValue& v : r.values)
      if (v.key == key) out.push_back(r.step);
  return out;
}

/// Opens writer streams 1..n of rank 0, as n calls of Run::writer() would.
void open_writers(Rig& rig, std::uint32_t n) {
  for (std::uint32_t id = 1; id <= n; ++id) rig.stream(0, id, true);
}

std::vector<std::int64_t> upto(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t s = 0; s < n; ++s) out.push_back(s);
  return out;
}

} // namespace

// The reported case, in small: two producers of one rank each log steps
// 0..9, one far ahead of the other. As one stream, the slower one's steps
// were all backwards_step.
BOOST_AUTO_TEST_CASE(two_streams_interleaved_out_of_order_commit_everything) {
  Rig rig(1);
  open_writers(rig, 2);
  for (int s = 0; s < 10; ++s) rig.write(0, 1, {{"a", 1.0 * s}}, s);
  BOOST_TEST(rig.sink.rows.empty()); // writer 2 has logged nothing yet: it holds every row back
  for (int s = 0; s < 10; ++s) rig.write(0, 2, {{"b", 10.0 * s}}, s);
  BOOST_TEST(rig.steps() == upto(9)); // both stand at 9: rows 0..8 commit
  rig.finish(0);
  BOOST_TEST(rig.sink.rejections.empty());
  BOOST_TEST(steps_of(rig, "a") == upto(10));
  BOOST_TEST(steps_of(rig, "b") == upto(10));
  BOOST_TEST(rig.row(7)->values.size() == 2u, values_text(rig.row(7))); // both keys, one row
}

BOOST_AUTO_TEST_CASE(automatic_steps_count_each_writers_own_calls) {
  Rig rig(1);
  open_writers(rig, 2);
  for (int i = 0; i < 3; ++i) rig.write(0, 1, {{"a", 1.0 * i}});
  rig.write(0, 2, {{"b", 1}});
  rig.finish(0);
  BOOST_TEST(rig.sink.rejections.empty());
  BOOST_TEST(steps_of(rig, "a") == upto(3));
  BOOST_TEST(steps_of(rig, "b") == upto(1));
}

BOOST_AUTO_TEST_CASE(a_writer_going_backwards_is_rejected_naming_it) {
  Rig rig(1);
  open_writers(rig, 2);
  rig.write(0, 1, {{"a", 1}}, 5);
  const auto back = rig.write(0, 1, {{"a", 2}}, 3);
  const auto other = rig.write(0, 2, {{"b", 3}}, 3); // below writer 1's step, but writer 2's own first
  BOOST_TEST((rig.done(0, back) == Errc::backwards_step));
  BOOST_TEST((rig.done(0, other) == Errc::ok));
  BOOST_REQUIRE_EQUAL(rig.sink.rejections.size(), 1u);
  const std::string& why = rig.sink.rejections[0].message;
  BOOST_TEST(why.find("rank 0 writer 1") != std::string::npos, why);
  BOOST_TEST(why.find("writer's last step 5") != std::string::npos, why);
}

BOOST_AUTO_TEST_CASE(a_closed_writer_leaves_the_minimum) {
  Rig rig(1);
  open_writers(rig, 2);
  for (int s = 0; s < 5; ++s) rig.write(0, 1, {{"a", 1.0 * s}}, s);
  rig.write(0, 2, {{"b", 0}}, 0);
  BOOST_TEST(rig.sink.rows.empty()); // writer 2 stands at 0
  const auto closed = rig.stream(0, 2, false);
  BOOST_TEST((rig.done(0, closed) == Errc::ok));
  BOOST_TEST(rig.steps() == upto(4)); // writer 1 alone: rows 0..3
  // With every writer closed the rank stands where they got to.
  rig.stream(0, 1, false);
  BOOST_TEST(rig.steps() == upto(4));
}

BOOST_AUTO_TEST_CASE(a_rank_is_held_back_by_its_slowest_writer_not_by_other_ranks_writers) {
  Rig rig(2);
  open_writers(rig, 2);
  for (int s = 0; s < 4; ++s) rig.write(0, 1, {{"a", 1.0 * s}}, s);
  rig.write(0, 2, {{"a", 9}}, 1);
  for (int s = 0; s < 4; ++s) rig.log(1, {{"a", 1.0 * s}}, s);
  BOOST_TEST(rig.steps() == upto(1)); // rank 0 stands at min(3, 1)
}

BOOST_AUTO_TEST_CASE(a_writer_opened_late_starts_after_the_committed_rows) {
  Rig rig(1);
  rig.stream(0, 1, true);
  for (int s = 0; s < 5; ++s) rig.write(0, 1, {{"a", 1.0 * s}}, s);
  BOOST_TEST(rig.steps() == upto(4));
  rig.stream(0, 2, true);
  const auto first = rig.write(0, 2, {{"b", 1}}); // automatic: after row 3
  rig.finish(0);
  BOOST_TEST((rig.done(0, first) == Errc::ok));
  BOOST_TEST(steps_of(rig, "b") == std::vector<std::int64_t>{4});
}

BOOST_AUTO_TEST_CASE(a_barrier_moves_every_writers_automatic_steps_past_what_it_committed) {
  Rig rig(1);
  open_writers(rig, 2);
  rig.write(0, 1, {{"a", 1}}, 7);
  rig.barrier(0, "epoch");
  rig.write(0, 2, {{"b", 1}}); // automatic: past the barrier's row 7
  rig.finish(0);
  BOOST_TEST(rig.sink.rejections.empty());
  BOOST_TEST(steps_of(rig, "b") == std::vector<std::int64_t>{8});
}

// A rank's writers take turns at steps of their own, so a key of the rank
// comes back to a row after it was logged at other steps. Within one rank
// and step the later value still replaces the earlier: the row once kept
// both, so a reduced key counted the rank twice and a plain one had two
// columns for it.
BOOST_AUTO_TEST_CASE(a_key_a_rank_logs_again_at_a_step_after_other_steps_keeps_the_later_value) {
  Rig rig(2);
  {
    auto b = rig.batch(0);
    b.define("a", Reduce::sum);
    b.stream(1, true);
    b.stream(2, true);
    BOOST_REQUIRE(b.send());
  }
  rig.write(0, 1, {{"a", 1}, {"b", 1}}, 5);
  rig.write(0, 2, {{"a", 2}, {"b", 2}}, 3);
  rig.write(0, 1, {{"a", 3}}, 5); // back at 5 after 3: replaces 1
  rig.write(0, 1, {{"b", 4}}, 7);
  rig.write(0, 2, {{"b", 5}}, 5); // the other writer at 5, after 7 and 3: replaces 1
  rig.log(1, {{"a", 10}}, 5);
  rig.finish(0);
  rig.finish(1);
  BOOST_TEST(rig.sink.rejections.empty());
  BOOST_TEST(values_text(rig.row(5)) == "row 5 ts=1000010 rt=10 | a=0x1.ap+3#2 b/rank-0=0x1.4p+2#0");
  BOOST_TEST(values_text(rig.row(3)) == "row 3 ts=1000010 rt=10 | a=0x1p+1#1 b/rank-0=0x1p+1#0");
}

// A frame is checked whole before any of it counts, so a hostile one cannot
// leave streams half open, nor name more than core::wire::max_streams.
BOOST_AUTO_TEST_CASE(malformed_stream_events_change_nothing) {
  Rig rig(1);
  rig.log(0, {{"a", 0}}, 0); // names "a" in a good frame: the bad ones below must fail for their streams only
  auto frame = [&](auto&& fill) {
    auto b = rig.batch(0);
    fill(b);
    return b.send();
  };
  const auto seq = rig.seq[0];
  BOOST_TEST(!frame([](auto& b) { b.log({{"a", 1}}, 0, start_ts, 3); })); // never opened
  BOOST_TEST(!frame([](auto& b) { b.stream(3, false); }));                // closed unopened
  BOOST_TEST(!frame([](auto& b) { b.stream(0, true); }));                 // the default stream is no writer
  BOOST_TEST(!frame([](auto& b) { b.stream(w::max_streams + 1, true); }));
  BOOST_TEST(!frame([](auto& b) {
    b.stream(3, true);
    b.stream(3, true); // twice
  }));
  BOOST_TEST(!frame([](auto& b) {
    b.stream(3, true);
    b.log({{"a", 1}}, 0, start_ts, 4); // the good open before it is undone with it
  }));
  rig.seq[0] = seq;
  BOOST_TEST(!frame([](auto& b) { b.log({{"a", 1}}, 0, start_ts, 3); })); // so 3 is still not open
  rig.seq[0] = seq;
  BOOST_TEST(frame([](auto& b) {
    b.stream(w::max_streams, true);
    b.log({{"a", 1}}, 0, start_ts, w::max_streams);
    b.stream(w::max_streams, false);
  }));
  BOOST_TEST(rig.sink.rejections.empty());
}

// The default stream joins as a writer opens: a rank whose writers already
// let rows commit, and which then calls run.log with automatic steps, logs
// past them rather than into rows that are gone (step_committed), and holds
// back no later row.
BOOST_AUTO_TEST_CASE(the_default_stream_joins_after_what_writers_committed) {
  Rig rig(1);
  open_writers(rig, 1);
  for (int s = 0; s < 10; ++s) rig.write(0, 1, {{"a", 1.0 * s}}, s);
  rig.stream(0, 1, false); // the writer closes at 9: rows 0..8 commit
  BOOST_TEST(rig.steps() == upto(9));
  const auto first = rig.log(0, {{"b", 1}});
  const auto second = rig.log(0, {{"b", 2}});
  BOOST_TEST((rig.done(0, first) == Errc::ok));
  BOOST_TEST((rig.done(0, second) == Errc::ok));
  BOOST_TEST(rig.steps() == upto(10)); // the rank stands at 10: row 9 commits
  rig.finish(0);
  BOOST_TEST(rig.sink.rejections.empty());
  BOOST_TEST(steps_of(rig, "b") == std::vector<std::int64_t>({9, 10}));
  BOOST_TEST(rig.row(9)->values.size() == 2u, values_text(rig.row(9))); // a and b, one row
}
