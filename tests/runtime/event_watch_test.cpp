// The EventWatch's rules (runtime/core/event_watch.hpp, event_watch.cpp), on
// a fake clock: each event fires exactly when its rule says and not a
// microsecond earlier, once, and again only after it re-armed; a healthy
// run raises nothing.
#define BOOST_TEST_MODULE runtime_event_watch
#include <boost/test/unit_test.hpp>

#include "runtime/core/event_watch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace chorus;
using namespace chorus::core;

namespace {

constexpr std::int64_t T0 = 1'700'000'000'000'000; // unix microseconds
constexpr std::int64_t sec = 1'000'000;
constexpr std::int64_t ms = 1'000;
constexpr double NaN = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

constexpr std::uint32_t loss = 0, acc = 1, lr = 2;

std::string host_of(int rank) { return rank < 4 ? "node-a" : "node-b"; }
std::int64_t pid_of(int rank) { return 4239 + rank; } // rank 3: 4242

std::vector<int> ranks_of(const EventDraft& d) { return {d.ranks.begin(), d.ranks.end()}; }

struct Watch {
  EventWatch w;
  std::vector<std::string> names{"loss", "acc", "lr"};
  std::function<std::string_view(std::uint32_t)> key_name = [this](std::uint32_t k) -> std::string_view {
    return names.at(k);
  };
  std::int64_t now = T0;

  explicit Watch(WatchSettings s = {}) : w(s) {}

  /// A run of `world` ranks, every one joined at T0 (but those in `absent`).
  void start(int world, const std::vector<int>& absent = {}) {
    w.run_start(world, now);
    for (int r = 0; r < world; ++r) {
      if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
      w.rank_joined(r, host_of(r), pid_of(r), now);
      w.rank_state(r, RunState::running, -1, "", now);
    }
  }
  void progress(int rank, std::int64_t step, std::int64_t at) { w.progress(rank, step, now = at); }
  void tick(std::int64_t at) { w.tick(now = at); }
  /// A tick each whole second after `now` up to `to`, then one at `to`.
  void ticks_to(std::int64_t to) {
    for (std::int64_t t = (now / sec + 1) * sec; t < to; t += sec) w.tick(t);
    tick(to);
  }
  void row(std::int64_t step, std::vector<RowValue> values, std::int64_t at, std::vector<RowNonfinite> nonfinite = {}) {
    Row r;
    r.step = step;
    r.ts_us = at;
    r.values = std::move(values);
    r.nonfinite = std::move(nonfinite);
    w.row(r, key_name, now = at);
  }
  /// Barrier `index`: ranks arrive at their times (in that order), then it releases at `release`.
  void barrier(std::uint64_t index, const std::vector<std::pair<int, std::int64_t>>& arrivals, std::int64_t release,
               std::string_view name = "sync") {
    std::vector<int> waiters;
    for (const auto& [rank, at] : arrivals) {
      w.barrier_reached(rank, index, name, now = at);
      waiters.push_back(rank);
    }
    std::sort(waiters.begin(), waiters.end());
    w.barrier_released(index, name, waiters, {}, nullptr, now = release);
  }
  std::vector<EventDraft> take() { return w.take(); }
};

std::string kinds(const std::vector<EventDraft>& all) {
  std::string s;
  for (const EventDraft& d : all) s += std::string(to_string(d.kind)) + "(rank " + std::to_string(d.rank) + ") ";
  return s;
}

void check_message(const EventDraft& d) {
  BOOST_TEST(!d.message.empty());
  BOOST_TEST(d.message.find('\n') == std::string::npos, d.message);
}

WatchSettings stall_only(std::int64_t stall_after_us = 300 * sec) {
  WatchSettings s;
  s.stall_after_us = stall_after_us;
  s.straggler_window = 0;
  s.lag_steps = std::numeric_limits<std::int64_t>::max() / 4;
  return s;
}

} // namespace

// ---- stalled --------------------------------------------------------------

BOOST_AUTO_TEST_CASE(stall_fires_exactly_stall_after_once_the_others_got_ahead) {
  Watch x(stall_only());
  x.start(4);
  for (int r = 0; r < 4; ++r) x.progress(r, 12, T0 + 1 * sec);
  // The others go on at 100.5 s; rank 3 stays at 12 (its last move: 1 s).
  x.ticks_to(T0 + 100 * sec);
  const std::int64_t ahead = T0 + 100 * sec + 500 * ms;
  for (std::int64_t s = 13; s <= 40; ++s)
    for (int r = 0; r < 3; ++r) x.progress(r, s, ahead + (s - 13) * sec);
  const std::int64_t due = ahead + 300 * sec;
  x.ticks_to(due - 1);
  BOOST_TEST(x.take().empty());
  x.tick(due);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  const EventDraft& d = events[0];
  BOOST_TEST((d.kind == EventKind::stalled));
  BOOST_TEST(d.rank == 3);
  BOOST_TEST(d.step == 12);
  BOOST_TEST(d.host == "node-a");
  BOOST_TEST(d.pid == 4242);
  BOOST_TEST(d.others_step == 40);
  BOOST_TEST(d.seconds_us == due - (T0 + 1 * sec));
  BOOST_TEST(d.ts_us == due);
  BOOST_TEST(d.message ==
             "rank 3 (process 4242 on node-a) has not logged past step 12 for 399 s while other ranks reached step 40; "
             "it may hang (a deadlock, a stuck collective or I/O): look at its stack (py-spy dump --pid 4242, or gdb -p "
             "4242)");
  // Once per stall.
  x.ticks_to(due + 100 * sec);
  BOOST_TEST(x.take().empty());
  // It moves: resumed, once.
  x.progress(3, 13, due + 100 * sec + 250 * ms);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::resumed));
  BOOST_TEST(events[0].rank == 3);
  BOOST_TEST(events[0].step == 13);
  BOOST_TEST(events[0].seconds_us == due + 100 * sec + 250 * ms - (T0 + 1 * sec));
  BOOST_TEST(events[0].message == "rank 3 (process 4242 on node-a) moved on to step 13 after 499 s without progress; "
                                  "nothing to do unless it stalls again");
  x.progress(3, 14, due + 101 * sec);
  x.progress(3, 40, due + 102 * sec);
  x.ticks_to(due + 200 * sec);
  BOOST_TEST(x.take().empty());
}

BOOST_AUTO_TEST_CASE(stall_clock_starts_at_its_own_move_when_that_is_later) {
  Watch x(stall_only(60 * sec));
  x.start(3);
  for (int r = 0; r < 3; ++r) x.progress(r, 1, T0 + 1 * sec);
  x.progress(0, 40, T0 + 2 * sec);
  x.progress(1, 40, T0 + 2 * sec);
  x.ticks_to(T0 + 30 * sec);
  x.progress(2, 5, T0 + 30 * sec + 1); // still behind, but it moved
  x.ticks_to(T0 + 90 * sec);
  BOOST_TEST(x.take().empty());
  x.tick(T0 + 90 * sec + 1);
  const auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 2);
  BOOST_TEST(events[0].step == 5);
  BOOST_TEST(events[0].seconds_us == 60 * sec);
}

BOOST_AUTO_TEST_CASE(one_step_behind_after_a_pause_of_everyone_is_not_stalled_at_once) {
  Watch x(stall_only());
  x.start(4);
  for (int r = 0; r < 4; ++r) x.progress(r, 10, T0 + 1 * sec);
  // Everyone pauses for 1000 s (an evaluation): nobody is ahead of anybody.
  x.ticks_to(T0 + 1000 * sec);
  BOOST_TEST(x.take().empty());
  // Then the others go on and rank 3 is one step behind, 999 s after its last move.
  const std::int64_t ahead = T0 + 1000 * sec + 200 * ms;
  for (int r = 0; r < 3; ++r) x.progress(r, 11, ahead);
  x.tick(T0 + 1001 * sec);
  BOOST_TEST(x.take().empty());
  x.ticks_to(ahead + 300 * sec - 1);
  BOOST_TEST(x.take().empty());
  x.tick(ahead + 300 * sec);
  const auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 3);
  BOOST_TEST(events[0].others_step == 11);
  BOOST_TEST(events[0].seconds_us == ahead + 300 * sec - (T0 + 1 * sec));
}

BOOST_AUTO_TEST_CASE(a_rank_parked_at_a_barrier_is_not_stalled_the_ranks_it_waits_for_are) {
  Watch x(stall_only());
  x.start(4);
  for (int r = 0; r < 4; ++r) x.progress(r, 10, T0 + 1 * sec);
  x.w.barrier_reached(3, 0, "eval", x.now = T0 + 2 * sec);
  for (int r = 0; r < 3; ++r) x.progress(r, 20, T0 + 5 * sec);
  // Ranks 0-2 stand higher than rank 3 but it is parked; they are missing at
  // the barrier it waits at, since their last move (5 s).
  x.ticks_to(T0 + 305 * sec - 1);
  BOOST_TEST(x.take().empty());
  x.tick(T0 + 305 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 3u, kinds(events));
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST((events[r].kind == EventKind::stalled));
    BOOST_TEST(events[r].rank == r);
    BOOST_TEST(events[r].step == 20);
    BOOST_TEST(events[r].others_step == 20);
  }
  BOOST_TEST(events[0].message == "rank 0 (process 4239 on node-a) has not logged past step 20 for 300 s while other "
                                  "ranks wait for it at barrier \"eval\"; it may hang (a deadlock, a stuck collective "
                                  "or I/O): look at its stack (py-spy dump --pid 4239, or gdb -p 4239)");
  x.ticks_to(T0 + 2000 * sec);
  BOOST_TEST(x.take().empty()); // rank 3, parked all along, never
  // Reaching the barrier resumes them, once each.
  for (int r = 0; r < 3; ++r) x.w.barrier_reached(r, 0, "eval", x.now = T0 + 2000 * sec + r);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 3u, kinds(events));
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST((events[r].kind == EventKind::resumed));
    BOOST_TEST(events[r].rank == r);
  }
  BOOST_TEST(events[0].message == "rank 0 (process 4239 on node-a) reached barrier \"eval\" after 1995 s without "
                                  "progress; nothing to do unless it stalls again");
  const std::vector<int> all{0, 1, 2, 3};
  const std::int64_t released = T0 + 2000 * sec + 10;
  x.w.barrier_released(0, "eval", all, {}, nullptr, x.now = released);
  BOOST_TEST(x.take().empty());
  // Released, rank 3 stands below the others: its clock starts at the release.
  x.ticks_to(released + 300 * sec - 1);
  BOOST_TEST(x.take().empty());
  x.tick(released + 300 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 3);
  BOOST_TEST(events[0].step == 10);
}

BOOST_AUTO_TEST_CASE(stall_after_zero_turns_stalls_off) {
  Watch x(stall_only(0));
  x.start(2);
  x.progress(0, 1, T0 + 1 * sec);
  x.progress(1, 1, T0 + 1 * sec);
  x.progress(0, 100, T0 + 2 * sec);
  x.w.barrier_reached(0, 0, "sync", x.now = T0 + 3 * sec);
  x.ticks_to(T0 + 100'000 * sec);
  BOOST_TEST(x.take().empty());
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_joined_never_stalls) {
  Watch x(stall_only(10 * sec));
  x.start(4, {3});
  for (std::int64_t s = 0; s < 100; ++s)
    for (int r = 0; r < 3; ++r) x.progress(r, s, T0 + s * sec);
  x.ticks_to(T0 + 99 * sec);
  BOOST_TEST(x.take().empty());
  // It is given up on: lost, without a host or process.
  x.w.rank_state(3, RunState::crashed, -1, "never connected to the run host within init_timeout (60000 ms)",
                 T0 + 100 * sec);
  const auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::rank_lost));
  BOOST_TEST(events[0].host.empty());
  BOOST_TEST(events[0].pid == -1);
  BOOST_TEST(events[0].step == -1);
  BOOST_TEST((events[0].state == RunState::crashed));
  BOOST_TEST(events[0].message == "rank 3 was lost before it joined the run: never connected to the run host within "
                                  "init_timeout (60000 ms). Look at whether its process started (the launcher's log) "
                                  "and can reach the run host");
}

BOOST_AUTO_TEST_CASE(a_joined_rank_that_logs_nothing_stalls_from_its_join) {
  Watch x(stall_only(10 * sec));
  x.start(2);
  x.progress(0, 0, T0 + 3 * sec);
  x.ticks_to(T0 + 13 * sec - 1);
  BOOST_TEST(x.take().empty());
  x.tick(T0 + 13 * sec);
  const auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 1);
  BOOST_TEST(events[0].step == -1);
  BOOST_TEST(events[0].message == "rank 1 (process 4240 on node-a) has logged nothing for 13 s while other ranks "
                                  "reached step 0; it may hang (a deadlock, a stuck collective or I/O): look at its "
                                  "stack (py-spy dump --pid 4240, or gdb -p 4240)");
}

BOOST_AUTO_TEST_CASE(a_stalled_rank_that_ends_gets_its_end_only) {
  Watch x(stall_only(10 * sec));
  x.start(2);
  x.progress(0, 5, T0 + 1 * sec);
  x.progress(1, 6, T0 + 1 * sec);
  x.ticks_to(T0 + 11 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 0);
  x.w.rank_state(0, RunState::failed, 5, "RuntimeError: CUDA error: an illegal memory access\nwas encountered.",
                 x.now = T0 + 12 * sec);
  x.progress(0, 7, T0 + 13 * sec); // a dead rank's frame changes nothing
  x.ticks_to(T0 + 100 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::rank_failed));
  BOOST_TEST(events[0].message == "rank 0 (process 4239 on node-a) failed at step 5: RuntimeError: CUDA error: an "
                                  "illegal memory access was encountered. Look at its log for the error (a traceback, "
                                  "or what made its process exit)");
  BOOST_TEST(events[0].reason == "RuntimeError: CUDA error: an illegal memory access\nwas encountered.");
}

// ---- ranks' ends ----------------------------------------------------------

BOOST_AUTO_TEST_CASE(rank_failed_killed_lost_once_per_rank) {
  Watch x(stall_only(0));
  x.start(6);
  x.progress(1, 7, T0 + 1 * sec);
  x.w.rank_state(0, RunState::finished, -1, "", T0 + 2 * sec);
  x.w.rank_state(1, RunState::killed, 7, "killed by SIGTERM", T0 + 3 * sec);
  x.w.rank_state(2, RunState::crashed, 9, "its connection to the run host was lost", T0 + 4 * sec);
  x.w.rank_state(3, RunState::failed, 11, "", T0 + 5 * sec);
  // Told already: nothing more.
  x.w.rank_state(1, RunState::killed, 7, "killed by SIGTERM", T0 + 6 * sec);
  x.w.rank_state(3, RunState::failed, 11, "exit status 1", T0 + 6 * sec);
  // A finished rank whose process then exits non-zero fails.
  x.w.rank_state(0, RunState::failed, -1, "its process exited with status 3 after it finished", T0 + 7 * sec);
  x.w.rank_state(0, RunState::failed, -1, "again", T0 + 8 * sec);
  const auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 4u, kinds(events));

  BOOST_TEST((events[0].kind == EventKind::rank_killed));
  BOOST_TEST(events[0].rank == 1);
  BOOST_TEST(events[0].step == 7);
  BOOST_TEST((events[0].state == RunState::killed));
  BOOST_TEST(events[0].reason == "killed by SIGTERM");
  BOOST_TEST(events[0].host == "node-a");
  BOOST_TEST(events[0].pid == 4240);
  BOOST_TEST(events[0].ts_us == T0 + 3 * sec);
  BOOST_TEST(events[0].message ==
             "rank 1 (process 4240 on node-a) was killed at step 7: killed by SIGTERM. Look at who stopped it: the "
             "scheduler (a time or memory limit), the kernel's OOM killer (dmesg on node-a) or a user");

  BOOST_TEST((events[1].kind == EventKind::rank_lost));
  BOOST_TEST(events[1].rank == 2);
  BOOST_TEST((events[1].state == RunState::crashed));
  BOOST_TEST(events[1].message == "rank 2 (process 4241 on node-a) was lost at step 9: its connection to the run host "
                                  "was lost. Look at its node and its log: its process may have crashed, or its node "
                                  "or the network gone down");

  BOOST_TEST((events[2].kind == EventKind::rank_failed));
  BOOST_TEST(events[2].rank == 3);
  BOOST_TEST(events[2].message == "rank 3 (process 4242 on node-a) failed at step 11. Look at its log for the error (a "
                                  "traceback, or what made its process exit)");

  BOOST_TEST((events[3].kind == EventKind::rank_failed));
  BOOST_TEST(events[3].rank == 0);
  BOOST_TEST(events[3].step == -1);
  BOOST_TEST(events[3].message ==
             "rank 0 (process 4239 on node-a) failed before it logged a step: its process exited with status 3 after it "
             "finished. Look at its log for the error (a traceback, or what made its process exit)");
  for (const EventDraft& d : events) check_message(d);
}

// ---- barriers -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(barrier_timeout_names_the_missing_ranks) {
  Watch x(stall_only(0));
  x.start(6);
  for (int r = 0; r < 4; ++r) x.w.barrier_reached(r, 2, "eval", T0 + r * sec);
  const std::vector<int> waiters{0, 1, 2, 3}, missing{4, 5};
  const Error err(Errc::barrier_timeout, "barrier 'eval' timed out after 600000 ms: ranks 4, 5 did not reach it and "
                                         "the ranks that did went on without them; look for a hang or a missing "
                                         "barrier() call on those ranks, or raise the barrier timeout");
  x.w.barrier_released(2, "eval", waiters, missing, &err, T0 + 600 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  const EventDraft& d = events[0];
  BOOST_TEST((d.kind == EventKind::barrier_timeout));
  BOOST_TEST(ranks_of(d) == missing);
  BOOST_TEST(d.barrier == "eval");
  BOOST_TEST(d.index == 2);
  BOOST_TEST(d.rank == -1);
  BOOST_TEST(d.ts_us == T0 + 600 * sec);
  BOOST_TEST(d.message == "barrier \"eval\" (#2) went on without ranks 4, 5: " + err.message());
  // A clean release, and one with an error that misses nobody (names that differ): nothing.
  x.barrier(3, {{0, T0 + 601 * sec}, {1, T0 + 601 * sec}}, T0 + 602 * sec);
  const Error mismatch(Errc::barrier_mismatch, "ranks reached barriers of different names");
  for (int r = 0; r < 6; ++r) x.w.barrier_reached(r, 4, "x", T0 + 603 * sec);
  const std::vector<int> everyone{0, 1, 2, 3, 4, 5};
  x.w.barrier_released(4, "x", everyone, {}, &mismatch, T0 + 603 * sec);
  BOOST_TEST(x.take().empty());
}

// ---- the run's end --------------------------------------------------------

BOOST_AUTO_TEST_CASE(run_finished_is_the_last_event_until_a_new_attempt) {
  Watch x(stall_only(10 * sec));
  x.w.rule(loss, "loss", above(10.0));
  x.start(2);
  x.row(0, {{loss, -1, 20.0, 2}}, T0 + 1 * sec);
  BOOST_TEST(x.take().size() == 1u);
  x.w.run_end(RunState::failed, T0 + 2 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::run_finished));
  BOOST_TEST((events[0].state == RunState::failed));
  BOOST_TEST(events[0].ts_us == T0 + 2 * sec);
  BOOST_TEST(events[0].message.starts_with("the run ended failed"));
  check_message(events[0]);
  // After it, nothing.
  x.progress(0, 100, T0 + 3 * sec);
  x.row(1, {{loss, -1, NaN, 2}}, T0 + 3 * sec, {{0, {0, 1}}});
  x.w.rank_state(1, RunState::crashed, 0, "lost", T0 + 4 * sec);
  const Error late(Errc::barrier_timeout, "the run ended before rank 1 reached barrier 'sync'");
  x.w.barrier_released(0, "sync", std::vector<int>{0}, std::vector<int>{1}, &late, T0 + 5 * sec);
  x.ticks_to(T0 + 1000 * sec);
  x.w.run_end(RunState::failed, T0 + 1000 * sec);
  BOOST_TEST(x.take().empty());
  BOOST_TEST(!x.w.has_drafts());

  // A resumed attempt starts afresh; its rule carries on.
  x.now = T0 + 2000 * sec;
  x.start(2);
  x.row(2, {{loss, -1, 30.0, 2}}, T0 + 2001 * sec); // above again: told again in this attempt
  x.progress(0, 5, T0 + 2001 * sec);
  x.progress(1, 5, T0 + 2001 * sec);
  x.ticks_to(T0 + 2100 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::threshold));
  BOOST_TEST(events[0].step == 2);
  x.w.run_end(RunState::finished, T0 + 2101 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].message == "the run ended finished");
}

// ---- nonfinite ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(nonfinite_names_the_ranks_of_a_reduced_value) {
  Watch x(stall_only(0));
  x.start(8);
  // values: acc (finite), loss (NaN from ranks 2 and 5).
  x.row(120, {{acc, -1, 0.5, 8}, {loss, -1, NaN, 8}}, T0 + 1 * sec, {{1, {2, 5}}});
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  EventDraft d = events[0];
  BOOST_TEST((d.kind == EventKind::nonfinite));
  BOOST_TEST(d.key == "loss");
  BOOST_TEST(d.step == 120);
  BOOST_TEST(d.rank == -1);
  BOOST_TEST(ranks_of(d) == (std::vector<int>{2, 5}));
  BOOST_TEST(d.has_value);
  BOOST_TEST(std::isnan(d.value));
  BOOST_TEST(d.ts_us == T0 + 1 * sec);
  BOOST_TEST(d.message == "loss is NaN at step 120 (ranks 2, 5 logged non-finite values); look for a diverging loss or "
                          "bad input on those ranks (lower the learning rate, clip gradients, check the data)");
  // Once per column: again only after a finite value.
  x.row(121, {{loss, -1, inf, 8}}, T0 + 2 * sec, {{0, {2}}});
  BOOST_TEST(x.take().empty());
  x.row(122, {{loss, -1, 1.5, 8}}, T0 + 3 * sec);
  BOOST_TEST(x.take().empty());
  x.row(123, {{loss, -1, -inf, 8}}, T0 + 4 * sec, {{0, {7}}});
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(ranks_of(events[0]) == std::vector<int>{7});
  BOOST_TEST(events[0].message == "loss is -Inf at step 123 (rank 7 logged a non-finite value); look for a diverging "
                                  "loss or bad input there (lower the learning rate, clip gradients, check the data)");
  // A sum that overflowed: no rank's value was.
  x.row(124, {{acc, -1, inf, 8}}, T0 + 5 * sec, {{0, {}}});
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].key == "acc");
  BOOST_TEST(events[0].ranks.empty());
  BOOST_TEST(events[0].message.starts_with("acc is +Inf at step 124 (every rank's value was finite"));
}

BOOST_AUTO_TEST_CASE(nonfinite_in_a_ranks_column_and_in_a_run_of_one) {
  Watch x(stall_only(0));
  x.start(4);
  x.row(3, {{lr, 1, 0.1, 0}, {lr, 2, NaN, 0}, {lr, 3, inf, 0}}, T0 + 1 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 2u, kinds(events));
  BOOST_TEST(events[0].rank == 2);
  BOOST_TEST(ranks_of(events[0]) == std::vector<int>{2});
  BOOST_TEST(events[0].key == "lr");
  BOOST_TEST(events[0].message == "lr is NaN at step 3 (rank 2 logged it); look for a diverging loss or bad input "
                                  "there (lower the learning rate, clip gradients, check the data)");
  BOOST_TEST(events[1].rank == 3);
  BOOST_TEST(ranks_of(events[1]) == std::vector<int>{3});
  // Rank 2's column is finite again, rank 3's is not: only rank 2's re-arms.
  x.row(4, {{lr, 2, 0.1, 0}, {lr, 3, NaN, 0}}, T0 + 2 * sec);
  x.row(5, {{lr, 2, NaN, 0}, {lr, 3, NaN, 0}}, T0 + 3 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 2);
  BOOST_TEST(events[0].step == 5);

  Watch one(stall_only(0));
  one.start(1);
  one.row(0, {{loss, -1, NaN, 0}}, T0 + 1 * sec);
  events = one.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == -1);
  BOOST_TEST(ranks_of(events[0]) == std::vector<int>{0});
  BOOST_TEST(events[0].message.starts_with("loss is NaN at step 0 (rank 0 logged it); "));
}

// ---- threshold ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(above_and_below_fire_once_and_rearm_within_the_bound) {
  Watch x(stall_only(0));
  x.w.rule(loss, "loss", above(10.0));
  x.w.rule(loss, "loss", above(10.0)); // the same rule twice is one
  x.w.rule(loss, "loss", below(-1.0)); // and another on the same key
  x.start(4);
  std::int64_t t = T0;
  auto commit = [&](std::int64_t step, double v) { x.row(step, {{loss, -1, v, 4}}, t += sec); };
  commit(1, 5.0);
  commit(2, 10.0); // at the bound: not above
  BOOST_TEST(x.take().empty());
  commit(3, std::nextafter(10.0, 11.0));
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  EventDraft d = events[0];
  BOOST_TEST((d.kind == EventKind::threshold));
  BOOST_TEST(d.key == "loss");
  BOOST_TEST(d.rank == -1);
  BOOST_TEST(d.step == 3);
  BOOST_TEST(d.rule == "above");
  BOOST_TEST(d.limit == 10.0);
  BOOST_TEST(d.has_value);
  BOOST_TEST(d.value == std::nextafter(10.0, 11.0));
  commit(4, 12.5);
  commit(5, NaN); // neither above nor within (nonfinite tells it)
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::nonfinite));
  commit(6, 12.5); // still fired: NaN did not re-arm it
  BOOST_TEST(x.take().empty());
  commit(7, 10.0); // within: re-armed
  commit(8, 12.5);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].step == 8);
  BOOST_TEST(events[0].message == "loss is 12.5 at step 8, above 10 (an alert_when rule); look at what changed around "
                                  "that step, or stop the run if it diverged");
  commit(9, -1.0); // at the lower bound: not below, and within the upper: re-arms it
  BOOST_TEST(x.take().empty());
  commit(10, -3.0);
  commit(11, -4.0);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rule == "below");
  BOOST_TEST(events[0].limit == -1.0);
  BOOST_TEST(events[0].step == 10);
  commit(12, inf); // +Inf is above
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 2u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::nonfinite));
  BOOST_TEST(events[1].rule == "above");
}

BOOST_AUTO_TEST_CASE(a_ranks_column_is_checked_on_its_own) {
  Watch x(stall_only(0));
  x.start(4);
  x.w.rule(acc, "acc", below(0.1)); // declared while the run goes on
  x.row(1, {{acc, 0, 0.5, 0}, {acc, 1, 0.05, 0}, {acc, 2, 0.2, 0}, {acc, 3, 0.01, 0}}, T0 + 1 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 2u, kinds(events));
  BOOST_TEST(events[0].rank == 1);
  BOOST_TEST(events[0].rule == "below");
  BOOST_TEST(events[0].message == "acc of rank 1 is 0.05 at step 1, below 0.1 (an alert_when rule); look at what "
                                  "changed around that step, or stop the run if it diverged");
  BOOST_TEST(events[1].rank == 3);
  x.row(2, {{acc, 0, 0.05, 0}, {acc, 1, 0.04, 0}, {acc, 3, 0.5, 0}}, T0 + 2 * sec);
  x.row(3, {{acc, 3, 0.01, 0}}, T0 + 3 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 2u, kinds(events));
  BOOST_TEST(events[0].rank == 0);
  BOOST_TEST(events[0].step == 2);
  BOOST_TEST(events[1].rank == 3);
  BOOST_TEST(events[1].step == 3);
}

BOOST_AUTO_TEST_CASE(no_change_fires_after_its_time_while_the_run_goes_on) {
  Watch x(stall_only(0));
  x.w.rule(loss, "loss", no_change(std::chrono::seconds(60)));
  x.start(2);
  // The loss changes each second up to step 10 (at 10 s), then from step 11
  // (at 10.5 s) stays 0.01 while rows keep committing.
  for (std::int64_t s = 1; s <= 10; ++s) x.row(s, {{loss, -1, 1.0 / static_cast<double>(s), 2}}, T0 + s * sec);
  x.row(11, {{loss, -1, 0.01, 2}}, T0 + 10 * sec + 500 * ms); // changed at 10.5 s
  for (std::int64_t s = 12; s <= 70; ++s) {
    x.row(s, {{loss, -1, 0.01, 2}, {acc, -1, static_cast<double>(s), 2}}, T0 + s * sec - 300 * ms);
    x.tick(T0 + s * sec);
  }
  BOOST_TEST(x.take().empty());
  x.tick(T0 + 70 * sec + 500 * ms - 1);
  BOOST_TEST(x.take().empty());
  x.tick(T0 + 70 * sec + 500 * ms);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  EventDraft d = events[0];
  BOOST_TEST((d.kind == EventKind::threshold));
  BOOST_TEST(d.rule == "no_change");
  BOOST_TEST(d.limit == 60.0);
  BOOST_TEST(d.seconds_us == 60 * sec);
  BOOST_TEST(d.key == "loss");
  BOOST_TEST(d.rank == -1);
  BOOST_TEST(d.step == 70);
  BOOST_TEST(d.value == 0.01);
  BOOST_TEST(d.message == "loss has stayed 0.01 for 60 s (last committed at step 70) while the run went on (an "
                          "alert_when rule); look at whether it still learns (a frozen model, a stuck data loader, a "
                          "learning rate of 0)");
  // Once, until it changes.
  for (std::int64_t s = 71; s <= 200; ++s) {
    x.row(s, {{loss, -1, 0.01, 2}}, T0 + s * sec);
    x.tick(T0 + s * sec + 1);
  }
  BOOST_TEST(x.take().empty());
  x.row(201, {{loss, -1, 0.02, 2}}, T0 + 201 * sec);
  for (std::int64_t s = 202; s <= 260; ++s) {
    x.row(s, {{loss, -1, 0.02, 2}}, T0 + s * sec);
    x.tick(T0 + s * sec + 1);
  }
  BOOST_TEST(x.take().empty());
  x.tick(T0 + 261 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].step == 260);
}

BOOST_AUTO_TEST_CASE(no_change_is_quiet_while_the_whole_run_pauses) {
  Watch x(stall_only(0));
  x.w.rule(loss, "loss", no_change(std::chrono::seconds(60)));
  x.start(2);
  x.progress(0, 1, T0 + 1 * sec);
  x.progress(1, 1, T0 + 1 * sec);
  x.row(1, {{loss, -1, 0.5, 2}}, T0 + 2 * sec); // the last thing that happens
  x.ticks_to(T0 + 10'000 * sec);
  BOOST_TEST(x.take().empty());
  // A rank's step moving is the run going on too.
  x.progress(0, 2, T0 + 10'000 * sec + 1);
  x.tick(T0 + 10'000 * sec + 2);
  const auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].step == 1);
  BOOST_TEST(events[0].value == 0.5);
}

BOOST_AUTO_TEST_CASE(no_change_of_a_key_never_committed_and_of_each_ranks_column) {
  Watch x(stall_only(0));
  x.w.rule(acc, "acc", no_change(std::chrono::seconds(30)));
  x.start(3);
  for (std::int64_t s = 1; s <= 29; ++s) {
    x.row(s, {{loss, -1, static_cast<double>(s), 3}}, T0 + s * sec);
    x.tick(T0 + s * sec + 1);
  }
  x.row(30, {{loss, -1, 30.0, 3}}, T0 + 30 * sec - 1);
  x.tick(T0 + 30 * sec - 1);
  BOOST_TEST(x.take().empty());
  x.tick(T0 + 30 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == -1);
  BOOST_TEST(events[0].step == -1);
  BOOST_TEST(!events[0].has_value);
  BOOST_TEST(events[0].message == "acc has not been logged for 30 s while the run went on (an alert_when rule); look "
                                  "at whether the code that logs it still runs");
  // Each rank's column: rank 1's stays the same, the others' change.
  for (std::int64_t s = 31; s <= 70; ++s) {
    const double v = static_cast<double>(s);
    x.row(s, {{acc, 0, v, 0}, {acc, 1, 0.5, 0}, {acc, 2, -v, 0}}, T0 + s * sec);
    x.tick(T0 + s * sec);
  }
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 1);
  BOOST_TEST(events[0].ts_us == T0 + 61 * sec);
  BOOST_TEST(events[0].message.starts_with("acc of rank 1 has stayed 0.5 for 30 s (last committed at step 61)"));
}

// ---- straggler ------------------------------------------------------------

namespace {

WatchSettings barriers_only(std::size_t window, double share, std::int64_t floor_us) {
  WatchSettings s = stall_only(0);
  s.straggler_window = window;
  s.straggler_share = share;
  s.straggler_floor_us = floor_us;
  return s;
}

/// Barrier `index` of 4 ranks at `at`: `last` arrives `wait` after the others (1 ms apart).
void barrier_last(Watch& x, std::uint64_t index, int last, std::int64_t wait, std::int64_t at) {
  std::vector<std::pair<int, std::int64_t>> arrivals;
  std::int64_t t = at;
  for (int r = 0; r < 4; ++r)
    if (r != last) arrivals.push_back({r, t += ms});
  arrivals.push_back({last, t + wait});
  x.barrier(index, arrivals, t + wait + 10);
}

} // namespace

BOOST_AUTO_TEST_CASE(straggler_by_barriers_once_the_window_is_full) {
  Watch x(barriers_only(5, 0.8, 1 * sec)); // 4 of the last 5
  x.start(4);
  std::int64_t at = T0;
  for (std::uint64_t i = 0; i < 4; ++i) {
    barrier_last(x, i, 2, 1500 * ms, at += 10 * sec);
    BOOST_TEST(x.take().empty(), "barrier " << i);
  }
  barrier_last(x, 4, 0, 2 * ms, at += 10 * sec); // the window is full: rank 2 was last at 4 of 5
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  const EventDraft& d = events[0];
  BOOST_TEST((d.kind == EventKind::straggler));
  BOOST_TEST(d.rank == 2);
  BOOST_TEST(d.reason == "barriers");
  BOOST_TEST(d.barrier == "sync");
  BOOST_TEST(d.host == "node-a");
  BOOST_TEST(d.pid == 4241);
  BOOST_TEST(d.message == "rank 2 (process 4241 on node-a) was the last to reach 4 of the last 5 barriers (the latest "
                          "\"sync\"), each time keeping the others waiting 1.5 s or more; look at what slows it (its "
                          "node's load, I/O, a slower GPU or link) or give it less work");
  // Once: it stays last at 4 of 5.
  barrier_last(x, 5, 2, 3 * sec, at += 10 * sec);
  BOOST_TEST(x.take().empty());
  // It drops to 3 of the last 5 (re-armed), then back to 4.
  barrier_last(x, 6, 1, 2 * ms, at += 10 * sec);
  BOOST_TEST(x.take().empty());
  barrier_last(x, 7, 2, 2 * sec, at += 10 * sec); // last at 3, 5 and 7 of 3-7
  barrier_last(x, 8, 2, 2 * sec, at += 10 * sec); // 5, 7, 8 of 4-8
  BOOST_TEST(x.take().empty());
  barrier_last(x, 9, 2, 2 * sec, at += 10 * sec); // 5, 7, 8, 9 of 5-9
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 2);
  BOOST_TEST(events[0].message.find("waiting 2 s or more") != std::string::npos, events[0].message);
}

BOOST_AUTO_TEST_CASE(straggler_by_barriers_share_and_floor_edges) {
  // 3 of 5 is below the share.
  {
    Watch x(barriers_only(5, 0.8, 1 * sec));
    x.start(4);
    std::int64_t at = T0;
    const int lasts[] = {2, 2, 0, 2, 1, 0, 2, 1, 2, 3};
    for (std::uint64_t i = 0; i < 10; ++i) barrier_last(x, i, lasts[i], 5 * sec, at += 10 * sec);
    BOOST_TEST(x.take().empty());
  }
  // A wait one microsecond short of the floor does not count; exactly the floor does.
  for (const std::int64_t short_by : {std::int64_t{1}, std::int64_t{0}}) {
    Watch x(barriers_only(5, 0.8, 1 * sec));
    x.start(4);
    std::int64_t at = T0;
    barrier_last(x, 0, 2, 1 * sec - short_by, at += 10 * sec);
    barrier_last(x, 1, 2, 5 * sec, at += 10 * sec);
    barrier_last(x, 2, 2, 5 * sec, at += 10 * sec);
    barrier_last(x, 3, 1, 5 * sec, at += 10 * sec);
    barrier_last(x, 4, 2, 5 * sec, at += 10 * sec);
    const auto events = x.take();
    BOOST_TEST(events.size() == (short_by ? 0u : 1u), "short by " << short_by << ": " << kinds(events));
  }
  // The wait is for the last rank alone: the one before it came late too.
  {
    Watch x(barriers_only(2, 1.0, 1 * sec));
    x.start(3);
    for (std::uint64_t i = 0; i < 2; ++i) {
      const std::int64_t at = T0 + static_cast<std::int64_t>(i) * 100 * sec;
      x.barrier(i, {{0, at}, {1, at + 10 * sec}, {2, at + 10 * sec + 999'999}}, at + 11 * sec);
    }
    BOOST_TEST(x.take().empty());
    x.barrier(2, {{0, T0 + 300 * sec}, {1, T0 + 310 * sec}, {2, T0 + 311 * sec}}, T0 + 312 * sec);
    const auto events = x.take();
    BOOST_TEST(events.empty(), kinds(events)); // 1 of 2 only
    x.barrier(3, {{0, T0 + 400 * sec}, {1, T0 + 400 * sec}, {2, T0 + 401 * sec}}, T0 + 402 * sec);
    BOOST_TEST(x.take().size() == 1u);
  }
  // A window of 0 turns the rule off.
  {
    Watch x(barriers_only(0, 0.8, 1 * sec));
    x.start(4);
    for (std::uint64_t i = 0; i < 30; ++i) barrier_last(x, i, 2, 100 * sec, T0 + static_cast<std::int64_t>(i) * 1000 * sec);
    BOOST_TEST(x.take().empty());
  }
}

BOOST_AUTO_TEST_CASE(straggler_by_steps_lags_the_median_for_lag_for) {
  WatchSettings s = stall_only(0);
  s.lag_steps = 100;
  s.lag_for_us = 60 * sec;
  Watch x(s);
  x.start(5);
  for (int r = 0; r < 4; ++r) x.progress(r, 1000, T0 + 1 * sec);
  x.progress(4, 900, T0 + 1 * sec); // exactly lag_steps behind: not lagging
  x.ticks_to(T0 + 200 * sec);
  BOOST_TEST(x.take().empty());
  x.progress(0, 1001, T0 + 200 * sec + 1); // the median (lower of 5) is still 1000
  x.ticks_to(T0 + 300 * sec);
  BOOST_TEST(x.take().empty());
  for (int r = 1; r < 4; ++r) x.progress(r, 1001, T0 + 300 * sec + 1); // now 101 behind
  const std::int64_t seen = T0 + 301 * sec;                             // the first tick that sees it
  x.ticks_to(seen + 60 * sec - 1);
  BOOST_TEST(x.take().empty());
  x.tick(seen + 60 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  const EventDraft& d = events[0];
  BOOST_TEST((d.kind == EventKind::straggler));
  BOOST_TEST(d.rank == 4);
  BOOST_TEST(d.reason == "steps");
  BOOST_TEST(d.others_step == 1001);
  BOOST_TEST(d.step == 900);
  BOOST_TEST(d.host == "node-b");
  BOOST_TEST(d.barrier.empty());
  BOOST_TEST(d.message == "rank 4 (process 4243 on node-b) is 101 steps behind the median rank (at step 900, the median "
                          "at step 1001) for 60 s; look at what slows it (its node's load, I/O, a slower GPU or link) or "
                          "give it less work");
  x.ticks_to(seen + 500 * sec);
  BOOST_TEST(x.take().empty()); // once
  // It catches up (re-armed), then falls behind again: its clock starts anew.
  x.progress(4, 950, seen + 500 * sec + 1);
  x.tick(seen + 501 * sec);
  for (int r = 0; r < 4; ++r) x.progress(r, 1200, seen + 501 * sec + 1);
  x.ticks_to(seen + 562 * sec - 1);
  BOOST_TEST(x.take().empty());
  x.tick(seen + 562 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].step == 950);
  BOOST_TEST(events[0].others_step == 1200);
}

BOOST_AUTO_TEST_CASE(straggler_by_steps_measures_from_the_lower_median) {
  // Half the ranks far behind the other half: the median is the lower
  // middle rank's step, so nobody lags it (the rule is for a few ranks that
  // hold the rest back; stalls cover the halves).
  WatchSettings s = stall_only(0);
  s.lag_steps = 100;
  s.lag_for_us = 10 * sec;
  Watch x(s);
  x.start(4);
  for (std::int64_t step = 0; step < 100; ++step)
    for (int r = 0; r < 4; ++r) x.progress(r, r < 2 ? step : step + 500, T0 + step * sec + r);
  x.ticks_to(T0 + 200 * sec);
  BOOST_TEST(x.take().empty());
  // One rank of five behind: the median is the others'.
  Watch y(s);
  y.start(5);
  for (std::int64_t step = 0; step < 100; ++step)
    for (int r = 0; r < 5; ++r) y.progress(r, r == 0 ? step : step + 500, T0 + step * sec + r);
  y.ticks_to(T0 + 200 * sec);
  const auto events = y.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].rank == 0);
  BOOST_TEST(events[0].ts_us == T0 + 110 * sec); // seen at the first tick (100 s), told 10 s later
}

// ---- a healthy run --------------------------------------------------------

namespace {

/// What sets a run of healthy_run apart from a healthy one.
struct Sim {
  int slow_rank = -1;          // reaches every barrier this late after the others
  std::int64_t slow_by_us = 0;
};

WatchSettings tight() {
  WatchSettings s;
  s.stall_after_us = 5 * sec;
  s.straggler_window = 20;
  s.straggler_share = 0.8;
  s.straggler_floor_us = 1 * sec;
  s.lag_steps = 5;
  s.lag_for_us = 2 * sec;
  return s;
}

/// A run of 8 ranks and 2000 steps of 200 ms: each rank logs a step 0-40 ms
/// after the step began (rank 5 3 ms later still), now and then a rank's
/// frames come 600 ms late (and the next ones bunch up behind them); a row
/// commits once every rank logged its step; after every 50th step the ranks
/// reach a barrier 1-5 ms apart, rank 7 always last (6 ms later); a tick
/// every second. Returns the number of barriers.
std::uint64_t healthy_run(Watch& x, const Sim& sim = {}) {
  constexpr int world = 8;
  x.start(world);
  std::uint64_t rng = 0x9e3779b97f4a7c15ull;
  auto jitter = [&](std::int64_t span) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return static_cast<std::int64_t>(rng % static_cast<std::uint64_t>(span));
  };
  // What happens, put in time order at the end: (time, order, what).
  struct Ev {
    std::int64_t at;
    int order;
    std::function<void()> fn;
  };
  std::vector<Ev> evs;
  int order = 0;
  std::int64_t base = T0 + 1 * sec;
  std::vector<std::int64_t> last_at(world, base);
  std::uint64_t barriers = 0;
  for (std::int64_t step = 0; step < 2000; ++step) {
    base += 200 * ms;
    for (int r = 0; r < world; ++r) {
      const std::int64_t late = (step % 97 == 13 && r == step % world) ? 600 * ms : 0;
      const std::int64_t at = std::max(last_at[r] + 1, base + jitter(40 * ms) + (r == 5 ? 3 * ms : 0) + late);
      last_at[r] = at;
      evs.push_back({at, order++, [&x, r, step, at] { x.progress(r, step, at); }});
    }
    const std::int64_t committed = *std::max_element(last_at.begin(), last_at.end()) + 1;
    const double l = 5.0 / (1.0 + static_cast<double>(step));
    evs.push_back({committed, order++, [&x, step, l, committed] {
                     std::vector<RowValue> v{{acc, -1, 1.0 - l / 5.0, 8}, {loss, -1, l, 8}};
                     for (int r = 0; r < world; ++r) v.push_back({lr, r, 1e-3, 0});
                     x.row(step, v, committed);
                   }});
    if (step % 50 != 49) continue;
    std::vector<std::pair<std::int64_t, int>> arrive;
    for (int r = 0; r < world; ++r)
      arrive.push_back({committed + 1 * ms + jitter(4 * ms) + (r == 7 ? 6 * ms : 0) + (r == sim.slow_rank ? sim.slow_by_us : 0), r});
    std::sort(arrive.begin(), arrive.end());
    const std::uint64_t index = barriers++;
    for (const auto& [at, r] : arrive)
      evs.push_back({at, order++, [&x, r, index, at] { x.w.barrier_reached(r, index, "sync", x.now = at); }});
    const std::int64_t released = arrive.back().first + 100;
    evs.push_back({released, order++, [&x, index, released] {
                     const std::vector<int> waiters{0, 1, 2, 3, 4, 5, 6, 7};
                     x.w.barrier_released(index, "sync", waiters, {}, nullptr, x.now = released);
                   }});
    base = released;
    std::fill(last_at.begin(), last_at.end(), released);
  }
  const std::int64_t end = *std::max_element(last_at.begin(), last_at.end()) + 1 * sec;
  for (std::int64_t t = T0 + 1 * sec; t <= end; t += sec) evs.push_back({t, order++, [&x, t] { x.tick(t); }});
  std::sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) { return a.at != b.at ? a.at < b.at : a.order < b.order; });
  for (const Ev& e : evs) e.fn();
  x.now = end;
  return barriers;
}

} // namespace

// A healthy run, with rules tight enough that a wrong one would fire (a
// stall of 5 s, a lag of 5 steps for 2 s, a wait of 1 s at barriers, rules
// on its keys): nothing but the run's end.
BOOST_AUTO_TEST_CASE(a_healthy_run_raises_nothing) {
  Watch x(tight());
  x.w.rule(loss, "loss", above(10.0));
  x.w.rule(loss, "loss", no_change(std::chrono::seconds(30)));
  x.w.rule(acc, "acc", below(0.0));
  BOOST_TEST(healthy_run(x) == 40u);
  auto events = x.take();
  BOOST_TEST(events.empty(), kinds(events));
  for (const EventDraft& d : events) BOOST_TEST_MESSAGE(d.message);
  for (int r = 0; r < 8; ++r) x.w.rank_state(r, RunState::finished, 1999, "", x.now);
  x.w.run_end(RunState::finished, x.now);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::run_finished));
}

// The same run with one rank 1.2 s late at every barrier: a straggler, told
// at the 20th barrier; and the healthy run with a floor of 1 ms: rank 7,
// last by a few ms each time, would be one (the floor keeps it quiet).
BOOST_AUTO_TEST_CASE(the_healthy_runs_rules_fire_on_a_straggler) {
  {
    Watch x(tight());
    healthy_run(x, {6, 1200 * ms});
    const auto events = x.take();
    BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
    BOOST_TEST(events[0].rank == 6);
    BOOST_TEST(events[0].reason == "barriers");
    BOOST_TEST(events[0].message.find("the last to reach 20 of the last 20 barriers") != std::string::npos,
               events[0].message);
  }
  {
    WatchSettings s = tight();
    s.straggler_floor_us = 1 * ms;
    Watch x(s);
    healthy_run(x);
    const auto events = x.take();
    BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
    BOOST_TEST(events[0].rank == 7);
    BOOST_TEST(events[0].reason == "barriers");
  }
}

// A finished rank whose process exits non-zero after the run's end fails it:
// its rank_failed, and run_finished again where the end state changed.
BOOST_AUTO_TEST_CASE(a_rank_that_fails_after_the_end_is_told_and_so_is_the_end_it_changes) {
  Watch x(stall_only(10 * sec));
  x.start(2);
  x.w.rank_state(0, RunState::finished, 9, "", T0 + 1 * sec);
  x.w.rank_state(1, RunState::finished, 9, "", T0 + 1 * sec);
  x.w.run_end(RunState::finished, T0 + 2 * sec);
  auto events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST(events[0].message == "the run ended finished");

  x.w.rank_state(1, RunState::failed, 9, "its process exited with status 3 after it finished", T0 + 3 * sec);
  x.w.run_end(RunState::failed, T0 + 3 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 2u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::rank_failed));
  BOOST_TEST(events[0].rank == 1);
  BOOST_TEST(events[0].pid == pid_of(1));
  BOOST_TEST(events[0].reason == "its process exited with status 3 after it finished");
  BOOST_TEST((events[1].kind == EventKind::run_finished));
  BOOST_TEST((events[1].state == RunState::failed));
  BOOST_TEST(events[1].message.starts_with("the run ended failed after all"), events[1].message);
  check_message(events[1]);

  // The same end again, or rank 0 failing too without changing it: its rank_failed only.
  x.w.run_end(RunState::failed, T0 + 4 * sec);
  x.w.rank_state(0, RunState::failed, 9, "its process exited with status 3 after it finished", T0 + 4 * sec);
  x.w.run_end(RunState::failed, T0 + 4 * sec);
  events = x.take();
  BOOST_TEST_REQUIRE(events.size() == 1u, kinds(events));
  BOOST_TEST((events[0].kind == EventKind::rank_failed));
  BOOST_TEST(events[0].rank == 0);
  // A rank failed once is not told twice.
  x.w.rank_state(1, RunState::failed, 9, "again", T0 + 5 * sec);
  BOOST_TEST(x.take().empty());
}
