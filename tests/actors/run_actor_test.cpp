// The Run actor (actors/run.cpp) driven message by message on CAF's test
// coordinator: two ranks' RankProxies are recorders, the WAL's syncers run
// as scheduled actors (Blocking::scheduled_for_tests), and its timers wait
// on the test clock.
#define BOOST_TEST_MODULE actors_run
#include "tests/actors/caf_dsl.hpp"

#include "actors/run.hpp"
#include "actors/wal_syncers.hpp"
#include <chorus/caf.hpp>
#include "io/platform/posix.hpp"
#include "io/store/run_record.hpp"
#include "io/store/wal.hpp"
#include "io/store/wal_replay.hpp"
#include "runtime/client/channel.hpp"
#include "runtime/client/events.hpp"
#include "io/store/event_log.hpp"
#include "tests/actors/merger_rig.hpp"
#include "tests/actors/recording_sink.hpp"
#include "tests/io/files.hpp"
#include "tests/temp_dir.hpp"

#include <simdjson.h>

#include <array>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace chorus {
inline std::ostream& operator<<(std::ostream& out, EventKind k) { return out << to_string(k); }
} // namespace chorus

using namespace chorus;
using namespace chorus::client;
using namespace chorus::actors;
using namespace std::chrono_literals;
using chorus::test::recorded;

namespace {

using joined_t = std::tuple<joined_atom, WireError, std::string, std::string, caf::actor>;

/// A job's identity as its ranks' joins carry it (job_identity's fields).
std::string identity(const std::string& job, const std::string& project) {
  return "job=" + job + "\nproject=" + project + "\ngroup=g\nranks=2\nmode=shared\nscope=global\nrun id=";
}

/// A run of two ranks hosted in a temporary directory, its syncers known.
struct RunActorFixture : test::ActorFixture {
  chorus::test::TempDir tmp;
  FinishState finished;
  std::shared_ptr<RunHost> host = std::make_shared<RunHost>();
  run_host_actor run;
  std::array<caf::actor, 2> syncers; // the WAL's: the second syncs a frame that ends a rank while the first is at it
  std::vector<caf::actor> ranks; // their RankProxies
  test::Rig frames{2};           // frames as the ranks' proxies build them

  /// `lend`: the run's syncers are lent by a pool (actors/wal_syncers.hpp),
  /// as the process's kept actor system lends them; else the run makes its own.
  explicit RunActorFixture(bool lend = false) {
    host->settings.run_world = 2;
    host->settings.opts.finish_timeout = 5s;
    host->run_id = "run-1";
    host->run_dir = tmp / "run";
    std::filesystem::create_directories(host->run_dir);
    auto wal = store::WalWriter::open(host->run_dir + "/wal");
    BOOST_TEST_REQUIRE(wal.has_value(), wal.error().message());
    host->wal = std::move(*wal);
    host->run_json = R"({"id":"run-1","project":"proj"})";
    host->job = identity("torchrun job 1", "proj");
    host->secret = "the job's secret";
    host->start_us = 1'700'000'000'000'000;
    host->finish = &finished;
    host->blocking = Blocking::scheduled_for_tests;
    if (lend) {
      // Two idle, the first to be taken (the last given back) known as syncers[0].
      host->syncers = std::make_shared<WalSyncers>(sys, Blocking::scheduled_for_tests);
      host->syncers->fill(2);
      BOOST_TEST_REQUIRE(host->syncers->idle() == 2u);
      const syncer_actor first = host->syncers->take();
      const syncer_actor second = host->syncers->take();
      host->syncers->give_back(second);
      host->syncers->give_back(first);
      syncers = {keep(caf::actor_cast<caf::actor>(first)), keep(caf::actor_cast<caf::actor>(second))};
    }
    run = keep(spawn_run_actor(sys, host));
    BOOST_TEST_REQUIRE(sched.prioritize(run));
    sched.run_once(); // it starts: run_start goes to the WAL (no rank waits for it: no round)
    if (!lend) {
      // Its helpers: the two syncers first.
      const std::vector<caf::actor> helpers = host->helpers->take();
      BOOST_TEST_REQUIRE(helpers.size() >= 2u);
      syncers = {keep(helpers[0]), keep(helpers[1])};
      for (const caf::actor& a : helpers) host->helpers->add(a);
    }
    for (int r = 0; r < 2; ++r) ranks.push_back(recorder());
    sched.run();
  }

  /// Syncer `k` fdatasyncs the WAL and says so.
  void sync_round(std::size_t k = 0) {
    expect((sync_atom, WalToSync), from(run).to(syncers[k]).with(_, _));
    expect((WireError), from(syncers[k]).to(run).with(WireError()));
  }
  /// Every round asked for, and those that their answers start, run.
  void sync_all() {
    while (!syncers_idle())
      for (std::size_t k = 0; k < syncers.size(); ++k)
        if (!idle(syncers[k])) sync_round(k);
  }

  void join_as(const caf::actor& proxy, std::uint32_t rank, const std::string& job,
               const std::string& secret = "the job's secret") {
    inject((join_atom, std::uint32_t, std::string, std::int64_t, std::string, std::string),
           from(proxy).to(run).with(join_atom::value, rank, "node-" + std::to_string(rank),
                                    std::int64_t{100} + rank, job, secret));
  }

  /// Rank `r` joins: answered at once, and logged (no round: no rank waits for it).
  void join(std::uint32_t r) {
    join_as(ranks[r], r, host->job);
    expect((joined_atom, WireError, std::string, std::string, caf::actor),
           from(run).to(ranks[r]).with(_, WireError(), host->run_id, host->run_dir, _));
    sched.run();
    BOOST_TEST(syncers_idle());
  }

  void send_batch(std::uint32_t r, const test::Rig::Batch& b) {
    inject((batch_atom, std::vector<char>), from(ranks[r]).to(run).with(batch_atom::value, b.bytes()));
  }

  /// Rank `r` sends one frame of one value, `loss` at `step`.
  void send_loss(std::uint32_t r, double loss, std::int64_t step) {
    auto b = frames.batch(static_cast<int>(r));
    b.log({{"loss", loss}}, step);
    send_batch(r, b);
  }

  /// Rank `r`'s last frame: `loss` at step 0, and its finish.
  test::Rig::Batch last_frames(std::uint32_t r, double loss) {
    auto b = frames.batch(static_cast<int>(r));
    b.log({{"loss", loss}}, 0);
    b.finish();
    return b;
  }

  /// The host's own RankProxy finishes the run.
  void finish() { inject((finish_atom), from(self).to(run).with(finish_atom::value)); }

  /// The host's own rank sends its last frames `b` (its finish frame among
  /// them) and then finishes, as its RankProxy does: the finish is queued
  /// right behind them, before the run handles either.
  void finish_after(const test::Rig::Batch& b) {
    caf::send_as(ranks[0], run, batch_atom::value, b.bytes());
    self->send(run, finish_atom::value);
    expect((batch_atom, std::vector<char>), from(ranks[0]).to(run).with(_, _));
    expect((finish_atom), from(self).to(run).with(_));
  }

  /// Whether `a` has nothing to handle.
  bool idle(const caf::actor& a) { return !sched.prioritize(a); }
  bool syncers_idle() { return idle(syncers[0]) && idle(syncers[1]); }

  /// The last message `proxy` was sent, which must be a refused join: its reason.
  std::string refusal(const caf::actor& proxy) {
    const auto& got = recorded(proxy);
    BOOST_TEST_REQUIRE(!got.empty());
    BOOST_TEST_REQUIRE((got.back().match_elements<joined_atom, WireError, std::string, std::string, caf::actor>()));
    const Error why = got.back().get_as<WireError>(1).error();
    BOOST_TEST_REQUIRE(static_cast<bool>(why));
    BOOST_TEST((why.code() == Errc::connect_failed));
    return why.message();
  }

  /// The acks `proxy` was sent: (frames, completed, errors as "seq: code message").
  struct Ack {
    std::uint32_t frames;
    std::uint64_t completed;
    std::vector<std::string> errors;
  };
  std::vector<Ack> acks(const caf::actor& proxy) {
    std::vector<Ack> out;
    for (const caf::message& m : recorded(proxy)) {
      if (!m.match_elements<ack_atom, std::uint32_t, std::uint64_t, AckErrors>()) continue;
      Ack a{m.get_as<std::uint32_t>(1), m.get_as<std::uint64_t>(2), {}};
      for (const AckError& x : m.get_as<AckErrors>(3)) {
        const Error e = x.error();
        a.errors.push_back(std::to_string(x.seq) + ": " + std::string(to_string(e.code())) + " " + e.message());
      }
      out.push_back(std::move(a));
    }
    return out;
  }
  std::uint32_t frames_acked(const caf::actor& proxy) {
    std::uint32_t n = 0;
    for (const Ack& a : acks(proxy)) n += a.frames;
    return n;
  }

  /// run.json's ranks: state and message of each.
  std::vector<std::pair<std::string, std::string>> rank_states() {
    simdjson::dom::parser parser;
    simdjson::dom::array arr;
    const std::string json = test::files::slurp(host->run_dir + "/run.json");
    BOOST_TEST_REQUIRE(!parser.parse(json)["ranks"].get(arr), json);
    std::vector<std::pair<std::string, std::string>> out;
    for (simdjson::dom::element r : arr) {
      std::string_view state, message;
      BOOST_TEST_REQUIRE(!r["state"].get(state));
      if (r["message"].get(message)) message = {};
      out.emplace_back(state, message);
    }
    return out;
  }

  /// history.jsonl: each row's values by column, the underscored ones left out.
  std::vector<std::map<std::string, double>> history() {
    std::vector<std::map<std::string, double>> out;
    simdjson::dom::parser parser;
    for (const std::string& line : test::files::lines_of(host->run_dir + "/history.jsonl")) {
      simdjson::dom::object row;
      BOOST_TEST_REQUIRE(!parser.parse(line).get(row), line);
      auto& values = out.emplace_back();
      for (auto [k, v] : row) {
        double d = 0;
        if (!k.starts_with("_") && !v.get(d)) values[std::string(k)] = d;
      }
    }
    return out;
  }
};

/// A run whose syncers a pool lends, as the process's kept actor system does.
struct LentSyncersFixture : RunActorFixture {
  LentSyncersFixture() : RunActorFixture(true) {}
};

bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }


} // namespace

BOOST_FIXTURE_TEST_SUITE(run_actor, RunActorFixture)

BOOST_AUTO_TEST_CASE(joins_are_checked_and_a_repeated_join_is_answered_again) {
  // A rank of another job that met this run on its port is refused; nothing is logged.
  join_as(ranks[0], 0, identity("torchrun job 2", "proj"));
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(ranks[0]).with(_, _, _, std::string(), caf::actor()));
  BOOST_TEST(contains(refusal(ranks[0]), "rank 0 belongs to another job (project proj, group g, 2 ranks, mode shared, "
                                         "scope global; torchrun job 2) than this run (project proj, group g, 2 "
                                         "ranks, mode shared, scope global; torchrun job 1)"),
             refusal(ranks[0]));
  BOOST_TEST(syncers_idle());
  // A rank of this job whose project differs is told that, not of a port met by chance.
  join_as(ranks[0], 0, identity("torchrun job 1", "other"));
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(ranks[0]).with(_, _, _, std::string(), caf::actor()));
  BOOST_TEST(contains(refusal(ranks[0]), "rank 0 and the run host belong to one job but disagree: project \"other\" "
                                         "there, \"proj\" on the run host (set by chorus.init(project=...), "
                                         "Options::project or CHORUS_PROJECT)"),
             refusal(ranks[0]));
  BOOST_TEST(!contains(refusal(ranks[0]), "port"), refusal(ranks[0]));
  BOOST_TEST(syncers_idle());

  join(0);
  // The same proxy again (its answer was lost): answered again, not logged again.
  join_as(ranks[0], 0, host->job);
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(ranks[0]).with(_, WireError(), host->run_id, host->run_dir, _));
  BOOST_TEST(syncers_idle());

  // Another process that claims the same rank is refused, naming the first.
  const caf::actor other = recorder();
  sched.run();
  join_as(other, 0, host->job);
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(other).with(_, _, _, std::string(), caf::actor()));
  BOOST_TEST(contains(refusal(other), "rank 0 already joined this run from process 100 on node-0"), refusal(other));
  // A rank outside the run is refused.
  join_as(other, 2, host->job);
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(other).with(_, _, _, std::string(), caf::actor()));
  BOOST_TEST(contains(refusal(other), "rank 2 is outside this run of 2 ranks"), refusal(other));
  // Its frames, claiming rank 0, are dropped unread.
  auto b = frames.batch(0);
  b.log({{"loss", 9.0}}, 0);
  inject((batch_atom, std::vector<char>), from(other).to(run).with(batch_atom::value, b.bytes()));
  BOOST_TEST(syncers_idle());
  BOOST_TEST(idle(other));
}

// The run host's clock times each join as it accepts it, and run.json keeps
// it; a join asked again (its answer was lost) is answered, and moves nothing.
BOOST_AUTO_TEST_CASE(a_process_without_the_jobs_secret_takes_no_ranks_place) {
  // It joins first, as rank 1, with the job's identity but not its secret:
  // refused, and nothing of it is logged.
  const caf::actor outsider = recorder();
  sched.run();
  join_as(outsider, 1, host->job, "a guess");
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(outsider).with(_, _, _, std::string(), caf::actor()));
  BOOST_TEST(contains(refusal(outsider), "process 101 on node-1 claims rank 1 without this job's secret"),
             refusal(outsider));
  BOOST_TEST(syncers_idle());
  join_as(outsider, 1, host->job, "");
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(outsider).with(_, _, _, std::string(), caf::actor()));
  BOOST_TEST(syncers_idle());

  // The real rank 1 then joins, and so does rank 0.
  join(1);
  join(0);
  // Nor can it claim a joined rank's place: refused, the rank keeps it.
  join_as(outsider, 1, host->job, "a guess");
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(outsider).with(_, _, _, std::string(), caf::actor()));
  BOOST_TEST(!contains(refusal(outsider), "already joined"), refusal(outsider)); // it learns nothing of the run
  send_loss(1, 2.0, 0);
  send_loss(0, 1.0, 0);
  sched.run();
  BOOST_TEST(frames_acked(ranks[1]) == 1u);
}

BOOST_AUTO_TEST_CASE(run_json_records_when_each_rank_joined_and_a_repeated_join_moves_nothing) {
  using store::RunRecord;
  const std::int64_t before = platform::unix_now_us();
  join(0);
  std::this_thread::sleep_for(50ms);
  const std::int64_t between = platform::unix_now_us();
  join(1);
  const std::int64_t after = platform::unix_now_us();
  std::this_thread::sleep_for(50ms);
  join_as(ranks[0], 0, host->job);
  expect((joined_atom, WireError, std::string, std::string, caf::actor),
         from(run).to(ranks[0]).with(_, WireError(), host->run_id, host->run_dir, _));
  BOOST_TEST(syncers_idle()); // not logged again
  advance_time(1s); // run.json is rewritten at the next flush
  expect((flush_atom), from(run).to(run).with(_));
  sched.run();

  const Result<RunRecord> rec = RunRecord::read(host->run_dir + "/run.json");
  BOOST_TEST_REQUIRE(rec.has_value(), rec.error().message());
  BOOST_TEST_REQUIRE(rec->ranks.size() == 2u);
  BOOST_TEST_REQUIRE(rec->ranks[0].joined_us.has_value());
  BOOST_TEST_REQUIRE(rec->ranks[1].joined_us.has_value());
  const std::int64_t joined0 = *rec->ranks[0].joined_us, joined1 = *rec->ranks[1].joined_us;
  BOOST_TEST(joined0 >= RunRecord::joined_ms(before));
  BOOST_TEST(joined0 <= RunRecord::joined_ms(between)); // not the repeated join's time, 50 ms later
  BOOST_TEST(joined1 >= RunRecord::joined_ms(between));
  BOOST_TEST(joined1 <= RunRecord::joined_ms(after));
  BOOST_TEST(joined1 - joined0 >= 49'000);
}

BOOST_AUTO_TEST_CASE(frames_of_two_ranks_merge_into_rows_acknowledged_once_the_wal_is_synced) {
  join(0);
  join(1);
  auto b0 = frames.batch(0);
  b0.log({{"loss", 1.0}}, 0);
  b0.log({{"loss", 1.5}}, 1);
  send_batch(0, b0); // in the WAL, and its syncer is asked
  auto b1 = frames.batch(1);
  b1.log({{"loss", 2.0}}, 0);
  b1.log({{"loss", 2.5}}, 1);
  send_batch(1, b1); // in the WAL while that sync is under way: the next one covers it
  BOOST_TEST(idle(ranks[0])); // nothing is acknowledged before its sync
  BOOST_TEST(idle(ranks[1]));

  sync_round();
  // The first sync covered rank 0's values only.
  expect((ack_atom, std::uint32_t, std::uint64_t, AckErrors),
         from(run).to(ranks[0]).with(_, _, std::uint64_t{2}, AckErrors()));
  BOOST_TEST(idle(ranks[1]));
  sync_round();
  expect((ack_atom, std::uint32_t, std::uint64_t, AckErrors),
         from(run).to(ranks[1]).with(_, _, std::uint64_t{2}, AckErrors()));
  sched.run();
  // Every frame is acknowledged once, so its proxy may send more.
  BOOST_TEST(frames_acked(ranks[0]) == 1u);
  BOOST_TEST(frames_acked(ranks[1]) == 1u);

  auto f0 = frames.batch(0);
  f0.finish();
  send_batch(0, f0); // a rank's end: its round starts at once
  auto f1 = frames.batch(1);
  f1.finish();
  send_batch(1, f1); // the other's, beside it, on the second syncer
  finish(); // every rank finished: the run ends once their rounds are done
  BOOST_TEST(idle(self));
  sync_round(0);
  BOOST_TEST(idle(self));
  sync_round(1);
  expect((caf::ok_atom), from(run).to(self).with(_));
  sched.run();
  BOOST_TEST(syncers_idle());

  const auto rows = history();
  BOOST_TEST_REQUIRE(rows.size() == 2u);
  BOOST_TEST((rows[0] == std::map<std::string, double>{{"loss/rank-0", 1.0}, {"loss/rank-1", 2.0}}));
  BOOST_TEST((rows[1] == std::map<std::string, double>{{"loss/rank-0", 1.5}, {"loss/rank-1", 2.5}}));
  BOOST_TEST(finished.result.state == RunState::finished);
  BOOST_TEST(finished.result.rows == 2u);
  BOOST_TEST(acks(ranks[1]).back().completed == 3u); // its finish too
}

// On an idle run, one frame costs one sync round: its ack, the frame counted,
// comes with that round, and nothing more is asked of the syncer.
BOOST_AUTO_TEST_CASE(one_frame_on_an_idle_run_costs_one_sync) {
  join(0);
  join(1);
  send_loss(0, 1.0, 0);
  sync_round();
  expect((ack_atom, std::uint32_t, std::uint64_t, AckErrors),
         from(run).to(ranks[0]).with(_, std::uint32_t{1}, std::uint64_t{1}, AckErrors()));
  BOOST_TEST(syncers_idle());
}

BOOST_AUTO_TEST_CASE(a_barrier_times_out_naming_the_rank_that_did_not_reach_it) {
  join(0);
  join(1);
  auto b = frames.batch(0);
  const std::uint64_t seq = b.barrier("epoch", 500);
  send_batch(0, b);
  sched.run();
  BOOST_TEST(acks(ranks[0]).back().completed == 0u); // the barrier holds rank 0

  advance_time(500ms);
  expect((barrier_tmo_atom, std::int64_t), from(run).to(run).with(_, std::int64_t{0}));
  sync_round();
  // Every rank is told of the timeout at once (the event), before the ack that waits for the sync.
  expect((event_atom, std::vector<char>), from(run).to(ranks[0]).with(_, _));
  expect((ack_atom, std::uint32_t, std::uint64_t, AckErrors), from(run).to(ranks[0]).with(_, _, seq, _));
  const auto errors = acks(ranks[0]).back().errors;
  BOOST_TEST_REQUIRE(errors.size() == 1u);
  BOOST_TEST(contains(errors[0], "1: " + std::string(to_string(Errc::barrier_timeout))), errors[0]);
  BOOST_TEST(contains(errors[0], "barrier 'epoch' timed out after 500 ms: rank 1 did not reach it"), errors[0]);
  BOOST_TEST(acks(ranks[1]).empty());
}

// The host's finish comes right behind its rank's last frames, whose round
// starts as they arrive (they hold the rank's end), beside their merge. The
// run's end waits for that round alone: it asks for none of its own, not
// even for its own frame, which follows from the ranks' ends in the WAL
// (store::derived_end). Their acks go out, and the WAL holds the end.
BOOST_AUTO_TEST_CASE(the_run_ends_on_the_round_that_its_last_ranks_end_started) {
  join(0);
  join(1);
  send_batch(1, last_frames(1, 1.0));
  sync_round(); // rank 1's end
  sched.run();
  finish_after(last_frames(0, 2.0));
  sync_round(); // rank 0's end, asked for as its frame came
  expect((caf::ok_atom), from(run).to(self).with(_));
  sched.run();
  BOOST_TEST(syncers_idle(), "a round more was asked for at the run's end");
  BOOST_TEST(finished.result.state == RunState::finished);
  BOOST_TEST(finished.result.rows == 1u);
  BOOST_TEST_REQUIRE(!acks(ranks[0]).empty());
  BOOST_TEST(acks(ranks[0]).back().frames == 1u); // its last frame, acknowledged by that round
  BOOST_TEST(rank_states() == (std::vector<std::pair<std::string, std::string>>{{"finished", ""}, {"finished", ""}}));
  // The WAL holds the end after the ranks' ends, as a replay finds it.
  test::RecordingSink sink;
  core::Merger replayed(sink);
  sink.merger = &replayed;
  const auto replay = store::replay_wal(host->run_dir + "/wal", replayed, {});
  BOOST_TEST_REQUIRE(replay.has_value(), replay.error().message());
  BOOST_TEST(replay->ended);
  BOOST_TEST(replay->end_state == RunState::finished);
}

// A round's answer releases the rounds asked for before it too: a later
// fdatasync makes durable all that an earlier one would. Rank 1's frame is
// in a round when rank 0's end comes: that one starts beside it, on the
// second syncer, and answers first.
// A run of the process's kept actor system borrows its syncers: it takes
// one as its first round comes (its start and the joins take none), and
// gives them back once its end is durable, not when its handle is freed,
// so that the next run starts no thread. A syncer still at a round when the
// run stops is not given back (WalSyncers::retire).
BOOST_FIXTURE_TEST_CASE(lent_syncers_are_taken_as_rounds_come_and_given_back_at_the_end, LentSyncersFixture) {
  BOOST_TEST(host->syncers->idle() == 2u);
  join(0);
  join(1);
  BOOST_TEST(host->syncers->idle() == 2u, "a round was asked for with no rank waiting");
  send_loss(1, 0.5, 0);
  BOOST_TEST(host->syncers->idle() == 1u);
  sync_round(0);
  sched.run();
  send_batch(1, last_frames(1, 1.0));
  sync_round(0); // rank 1's end: the syncer it holds
  sched.run();
  BOOST_TEST(host->syncers->idle() == 1u, "a run gave back a syncer before its end");
  finish_after(last_frames(0, 2.0));
  sync_round(0);
  expect((caf::ok_atom), from(run).to(self).with(_));
  sched.run();
  BOOST_TEST(finished.result.state == RunState::finished);
  // Back in the pool while the Run actor lives on (its handle is held): the next run takes it.
  BOOST_TEST(host->syncers->idle() == 2u);
  BOOST_TEST((caf::actor_cast<caf::actor>(host->syncers->take()) == syncers[0]));
}

// A run stopped while its round is under way does not give that syncer
// back, so that no later run waits behind a sync not its own: the syncer
// answers, then stops.
BOOST_FIXTURE_TEST_CASE(a_run_stopped_at_a_sync_retires_that_syncer, LentSyncersFixture) {
  join(0);
  join(1);
  send_loss(1, 0.5, 0); // a round asked of syncers[0], which has not run it yet
  BOOST_TEST_REQUIRE(!idle(syncers[0]));
  caf::scoped_actor watcher{sys};
  watcher->monitor(syncers[0]);
  self->send_exit(run, caf::exit_reason::user_shutdown);
  sched.run();
  bool stopped = false;
  watcher->receive([&](caf::down_msg& dm) { stopped = dm.source == syncers[0].address(); },
                   caf::after(std::chrono::seconds(0)) >> [] {});
  BOOST_TEST(stopped, "the syncer at this run's sync went back to serve the next run");
  BOOST_TEST(host->syncers->idle() == 1u); // the one the run never took
  BOOST_TEST((caf::actor_cast<caf::actor>(host->syncers->take()) == syncers[1]));
}

BOOST_AUTO_TEST_CASE(a_frame_that_ends_a_rank_is_synced_beside_the_round_under_way) {
  join(0);
  join(1);
  send_loss(1, 1.0, 0); // an ordinary round, on the first syncer
  auto f1 = frames.batch(1);
  f1.finish();
  send_batch(1, f1); // rank 1's end: its round starts beside it
  BOOST_TEST(!idle(syncers[0]));
  BOOST_TEST(!idle(syncers[1]));
  finish_after(last_frames(0, 2.0)); // both syncers at it: the end waits for a free one
  BOOST_TEST(acks(ranks[1]).empty()); // nothing acknowledged yet
  expect((event_atom, std::vector<char>), from(run).to(ranks[1]).with(_, _)); // run_finished, told as the end began
  sync_round(1); // the later round answers first: both rounds are done, in order
  expect((ack_atom, std::uint32_t, std::uint64_t, AckErrors),
         from(run).to(ranks[1]).with(_, std::uint32_t{1}, std::uint64_t{1}, AckErrors())); // its value
  expect((ack_atom, std::uint32_t, std::uint64_t, AckErrors),
         from(run).to(ranks[1]).with(_, std::uint32_t{1}, std::uint64_t{2}, AckErrors())); // its finish
  BOOST_TEST(idle(self));
  sync_round(1); // the end's own round, for rank 0's last frame
  expect((caf::ok_atom), from(run).to(self).with(_));
  sync_round(0); // the first round's answer, late: it changes nothing
  sched.run();
  BOOST_TEST(acks(ranks[1]).size() == 2u);
  BOOST_TEST(acks(ranks[0]).back().frames == 1u);
  BOOST_TEST(finished.result.state == RunState::finished);
  BOOST_TEST(finished.result.rows == 1u);
}

BOOST_AUTO_TEST_CASE(finish_gives_up_on_a_rank_after_finish_timeout) {
  join(0);
  join(1);
  send_batch(0, last_frames(0, 1.0));
  sched.run();
  finish();
  sched.run();
  disallow((caf::ok_atom), from(run).to(self).with(_)); // rank 1 is still running

  advance_time(host->settings.opts.finish_timeout); // the flush timer's second comes first
  allow((flush_atom), from(run).to(run).with(_));
  expect((finish_tmo_atom), from(run).to(run).with(_));
  sync_all(); // the end's round
  expect((caf::ok_atom), from(run).to(self).with(_));
  sched.run();

  // A rank gone without a word names the run's end: crashed, and why.
  BOOST_TEST(finished.result.state == RunState::crashed);
  BOOST_TEST_REQUIRE(finished.result.ranks.size() == 2u);
  BOOST_TEST(finished.result.ranks[0].state == RunState::finished);
  BOOST_TEST(finished.result.ranks[0].message.empty());
  BOOST_TEST(finished.result.ranks[1].state == RunState::crashed);
  BOOST_TEST(contains(finished.result.ranks[1].message, "did not finish within finish_timeout"),
             finished.result.ranks[1].message);
  const auto states = rank_states();
  BOOST_TEST_REQUIRE(states.size() == 2u);
  BOOST_TEST(states[1].first == "crashed");
  BOOST_TEST(contains(states[1].second, "did not finish within finish_timeout"), states[1].second);
}

BOOST_AUTO_TEST_CASE(a_rank_whose_proxy_goes_down_is_recorded_crashed) {
  join(0);
  join(1);
  send_loss(1, 2.0, 3);
  sched.run();

  caf::anon_send_exit(ranks[1], caf::exit_reason::kill);
  expect((caf::exit_msg), from(_).to(ranks[1]).with(_));
  expect((caf::down_msg), from(_).to(run).with(_));
  sched.run();
  BOOST_TEST(syncers_idle()); // rank 1's death waits for the next round: no rank waits for it

  auto f = frames.batch(0);
  f.finish();
  finish_after(f); // rank 0 finished and rank 1 is gone: the run ends once that is synced
  sync_round();
  expect((caf::ok_atom), from(run).to(self).with(_));
  sched.run();

  BOOST_TEST(finished.result.state == RunState::crashed);
  const auto states = rank_states();
  BOOST_TEST_REQUIRE(states.size() == 2u);
  BOOST_TEST(states[0].first == "finished");
  BOOST_TEST(states[1].first == "crashed");
  BOOST_TEST(contains(states[1].second, "its process exited or its connection was lost"), states[1].second);
  BOOST_TEST(contains(states[1].second, "at step 3"), states[1].second);
}

BOOST_AUTO_TEST_CASE(stray_exit_down_and_error_messages_change_nothing) {
  join(0);
  join(1);
  send_loss(1, 2.0, 3);
  sched.run();

  // None of these enters the Run actor's mailbox (actors/guard.hpp): an
  // anonymous kill, a kill in another actor's name, a down message about a
  // rank's proxy that its proxy did not send, an anonymous error.
  const auto any = caf::actor_cast<caf::actor>(run); // as a peer's message arrives: untyped
  caf::anon_send_exit(any, caf::exit_reason::kill);
  self->send(any, caf::exit_msg{ranks[0].address(), caf::exit_reason::kill});
  self->send(any, caf::down_msg{ranks[1].address(), caf::exit_reason::kill});
  caf::anon_send(any, caf::make_error(caf::sec::runtime_error));
  BOOST_TEST(idle(any));
  sched.run();

  // The run goes on: rank 1 is not taken for gone, and both ranks finish.
  send_loss(0, 1.0, 3);
  sched.run();
  for (std::uint32_t r = 0; r < 2; ++r) {
    auto f = frames.batch(static_cast<int>(r));
    f.finish();
    send_batch(r, f);
  }
  finish();
  sched.run();
  BOOST_TEST(finished.result.state == RunState::finished);
  const auto states = rank_states();
  BOOST_TEST_REQUIRE(states.size() == 2u);
  BOOST_TEST(states[0].first == "finished");
  BOOST_TEST(states[1].first == "finished");
  const auto rows = history();
  BOOST_TEST_REQUIRE(rows.size() == 1u);
  BOOST_TEST((rows[0] == std::map<std::string, double>{{"loss/rank-0", 1.0}, {"loss/rank-1", 2.0}}));

  // An exit an actor of this process sends in its own name still stops it.
  self->send_exit(run, caf::exit_reason::user_shutdown);
  sched.run();
  BOOST_TEST(caf::actor_cast<caf::abstract_actor*>(run)->getf(caf::abstract_actor::is_terminated_flag));
}

/// The events the run told `proxy` (event_atom frames), decoded as its RankProxy decodes them.
std::vector<Event> told(const caf::actor& proxy) {
  std::vector<Event> out;
  for (const caf::message& m : recorded(proxy)) {
    if (!m.match_elements<event_atom, std::vector<char>>()) continue;
    core::wire::Frame f;
    BOOST_TEST_REQUIRE(core::wire::decode(m.get_as<std::vector<char>>(1), f));
    const auto* e = std::get_if<core::wire::EventRecord>(&f.host);
    BOOST_TEST_REQUIRE(e != nullptr);
    out.push_back(e->to_event());
  }
  return out;
}

BOOST_AUTO_TEST_CASE(events_reach_every_rank_and_a_subscriber_as_typed_messages) {
  join(0);
  join(1);
  auto a = frames.batch(0);
  a.define("loss", Reduce::mean);
  a.log({{"loss", 1.0}}, 0);
  a.log({{"loss", 1.0}}, 1);
  send_batch(0, a);
  auto b = frames.batch(1);
  b.log({{"loss", std::nan("")}}, 0);
  b.log({{"loss", 2.0}}, 1);
  b.log({{"loss", 2.0}}, 2);
  send_batch(1, b);
  sched.run();
  // Step 0 committed NaN (rank 1's), step 1 is finite: one event, to both ranks.
  for (const caf::actor& proxy : ranks) {
    const auto events = told(proxy);
    BOOST_TEST_REQUIRE(events.size() == 1u);
    BOOST_TEST(events[0].kind == EventKind::nonfinite);
    BOOST_TEST(events[0].key == "loss");
    BOOST_TEST(events[0].step == 0);
    BOOST_TEST(events[0].rank == -1);
    BOOST_TEST(events[0].ranks == std::vector<int>{1});
  }
  // Rank 1's proxy goes: rank_lost; rank 0 finishes: the run's end, last.
  caf::anon_send_exit(ranks[1], caf::exit_reason::kill);
  sched.run();
  auto f = frames.batch(0);
  f.finish();
  finish_after(f);
  sched.run();
  const auto events = told(ranks[0]);
  BOOST_TEST_REQUIRE(events.size() == 3u);
  BOOST_TEST(events[1].kind == EventKind::rank_lost);
  BOOST_TEST(events[1].rank == 1);
  BOOST_TEST(events[2].kind == EventKind::run_finished);
  BOOST_TEST(events[2].state == RunState::crashed);
  // events.jsonl holds the same, numbered.
  const auto lines = test::files::lines_of(host->run_dir + "/events.jsonl");
  BOOST_TEST_REQUIRE(lines.size() == 3u);
  for (std::size_t i = 0; i < lines.size(); ++i) BOOST_TEST(lines[i] == events[i].json);

  // A subscriber (<chorus/caf.hpp>) gets each as a typed chorus::Event, in order.
  auto got = std::make_shared<std::vector<Event>>();
  // The vector is passed, not captured: CAF 0.17 dereferences a null argument
  // tuple for a function spawned without arguments.
  actors::event_subscriber sub = sys.spawn(
      [](actors::event_subscriber::pointer, std::shared_ptr<std::vector<Event>> into)
          -> actors::event_subscriber::behavior_type { return {[into](const Event& e) { into->push_back(e); }}; },
      got);
  EventHub hub;
  hub.add_sink(chorus::detail::event_sender(caf::actor_cast<caf::actor>(sub)));
  for (const Event& e : events) hub.deliver(e);
  for (std::size_t i = 0; i < events.size(); ++i) expect((Event), to(sub).with(_));
  BOOST_TEST_REQUIRE(got->size() == events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    BOOST_TEST((*got)[i].kind == events[i].kind);
    BOOST_TEST((*got)[i].rank == events[i].rank);
    BOOST_TEST((*got)[i].step == events[i].step);
    BOOST_TEST((*got)[i].key == events[i].key);
    BOOST_TEST((*got)[i].ranks == events[i].ranks);
    BOOST_TEST((*got)[i].state == events[i].state);
    BOOST_TEST((*got)[i].message == events[i].message);
    BOOST_TEST((*got)[i].json == events[i].json);
    BOOST_TEST((*got)[i].time.time_since_epoch().count() == events[i].time.time_since_epoch().count());
  }
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  sched.run();
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

/// An actor system that knows what chorus sends between processes, as each
/// process's does.
struct WireConfig : caf::actor_system_config {
  WireConfig() {
    register_wire_types(*this);
    set("scheduler.policy", caf::atom("testing"));
    set("logger.file-verbosity", caf::atom("quiet"));
  }
};

/// `m` as CAF's binary serializer writes it for another process.
std::vector<char> serialized(caf::actor_system& sys, caf::message m) {
  std::vector<char> bytes;
  caf::binary_serializer sink{sys, bytes};
  BOOST_TEST_REQUIRE(!sink(m));
  return bytes;
}

/// What a process reads from `bytes`, which must deserialize.
caf::message deserialized(caf::actor_system& sys, const std::vector<char>& bytes) {
  caf::message got;
  caf::binary_deserializer source{sys, bytes};
  BOOST_TEST_REQUIRE(!source(got));
  return got;
}

} // namespace

// An ack's errors cross processes as CAF serializes them; what a peer sends
// that is cut short, or claims more than it holds, is refused, and a code
// this build does not know reads as internal.
BOOST_AUTO_TEST_CASE(ack_errors_cross_processes_and_garbage_is_refused) {
  WireConfig cfg;
  caf::actor_system sys{cfg};
  const AckErrors errors{{7, Error(Errc::barrier_timeout, "barrier 'epoch' timed out")},
                         {9, Error(Errc::invalid_key, "")}};
  const std::vector<char> bytes =
      serialized(sys, caf::make_message(ack_atom::value, std::uint32_t{2}, std::uint64_t{9}, errors));
  const caf::message got = deserialized(sys, bytes);
  BOOST_TEST_REQUIRE((got.match_elements<ack_atom, std::uint32_t, std::uint64_t, AckErrors>()));
  BOOST_TEST((got.get_as<AckErrors>(3) == errors));
  BOOST_TEST(got.get_as<AckErrors>(3)[0].error().message() == "barrier 'epoch' timed out");

  // CAF 0.17 reads a message cut short as an empty one, which no handler takes.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    caf::message cut;
    caf::binary_deserializer short_source{sys, bytes.data(), n};
    (void)short_source(cut);
    BOOST_TEST(cut.empty(), "a message cut to " << n << " bytes reads as " << caf::to_string(cut));
  }

  // A count, and a message length, far beyond the bytes there.
  for (const bool long_message : {false, true}) {
    std::vector<char> lie;
    caf::binary_serializer liar{sys, lie};
    std::size_t count = long_message ? 1 : std::size_t{0xFFFFFFFF};
    BOOST_TEST_REQUIRE(!liar.begin_sequence(count));
    std::uint64_t seq = 1;
    std::uint8_t code = 1;
    std::size_t length = long_message ? std::size_t{0xFFFFFFF0} : 1;
    BOOST_TEST_REQUIRE(!liar(seq, code));
    BOOST_TEST_REQUIRE(!liar.begin_sequence(length));
    lie.push_back('x');
    AckErrors out;
    caf::binary_deserializer lie_source{sys, lie};
    BOOST_TEST(static_cast<bool>(lie_source(out)));
  }

  AckError unknown;
  unknown.failure.code = 200;
  unknown.failure.message = "from a newer peer";
  BOOST_TEST((unknown.error().code() == Errc::internal));
  BOOST_TEST(unknown.error().message().find("from a newer peer") != std::string::npos);
  unknown.failure.code = 0;
  BOOST_TEST((unknown.error().code() == Errc::internal));
}

// What a reply says failed crosses processes as a WireError: the Error comes
// back whole, none reads as none, and a code this build does not know reads
// as internal, keeping the peer's message.
BOOST_AUTO_TEST_CASE(a_wire_error_carries_an_error_across_processes) {
  WireConfig cfg;
  caf::actor_system sys{cfg};
  const Error refused(Errc::connect_failed, "rank 3 belongs to another job");
  const caf::message got = deserialized(
      sys, serialized(sys, caf::make_message(joined_atom::value, WireError(refused), std::string(), std::string(),
                                             caf::actor())));
  BOOST_TEST_REQUIRE((got.match_elements<joined_atom, WireError, std::string, std::string, caf::actor>()));
  const Error back = got.get_as<WireError>(1).error();
  BOOST_TEST((back.code() == Errc::connect_failed));
  BOOST_TEST(back.message() == refused.message());

  const WireError none{Error()};
  BOOST_TEST(!none);
  BOOST_TEST(!none.error());

  WireError newer;
  newer.code = 250;
  newer.message = "from a newer peer";
  BOOST_TEST(static_cast<bool>(newer));
  BOOST_TEST((newer.error().code() == Errc::internal));
  BOOST_TEST(newer.error().message().find("from a newer peer") != std::string::npos);
}
