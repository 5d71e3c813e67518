// <chorus/caf.hpp>: chorus in an orchestrator's own actor system, its actors
// logging by typed messages to the rank's proxy; and the actor_train sample
// under `chorus launch`, three ranks in one shared run.
#define BOOST_TEST_MODULE e2e_caf
#include "local_run.hpp"

#include <chorus/caf.hpp>

#include <caf/all.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <string>
#include <vector>

using namespace e2e;
using chorus::actors::leave_atom;
using chorus::actors::log_atom;
using chorus::actors::open_atom;
using chorus::actors::rank_proxy;
using chorus::actors::Values;

namespace {

using go_atom = caf::atom_constant<caf::atom("go")>;

/// An orchestrator's actor system, configured for the run `opts` makes.
struct Orchestrator {
  explicit Orchestrator(const chorus::Options& opts) : sys(prepare(cfg, opts)) {}
  static caf::actor_system_config& prepare(caf::actor_system_config& cfg, const chorus::Options& opts) {
    const chorus::Error e = chorus::actors::configure(cfg, opts);
    BOOST_TEST_REQUIRE(!e, e.message());
    return cfg;
  }
  caf::actor_system_config cfg;
  caf::actor_system sys;
};

/// A one-process run in an orchestrator's system, and the rank's proxy.
struct ActorRun {
  explicit ActorRun(std::size_t queue_capacity = 0)
      : opts(options(dir, queue_capacity)), o(opts), run(chorus::actors::init(o.sys, opts)),
        proxy(chorus::actors::proxy(run)) {
    BOOST_TEST_REQUIRE(static_cast<bool>(proxy));
  }
  static chorus::Options options(const TempDir& dir, std::size_t queue_capacity) {
    chorus::Options opts = local_options(dir, "caf");
    if (queue_capacity != 0) opts.queue_capacity = queue_capacity;
    return opts;
  }
  /// Finishes the run, which refused and dropped nothing, and reads back its `n` rows.
  std::vector<Row> finish_clean(std::size_t n) {
    const chorus::FinishResult r = run.finish().wait();
    BOOST_TEST(!r.error, r.error.message());
    BOOST_TEST(r.rejected == 0u);
    BOOST_TEST(r.dropped == 0u);
    std::vector<Row> rows = read_history(r.run_dir);
    BOOST_TEST_REQUIRE(rows.size() == n);
    return rows;
  }
  TempDir dir;
  chorus::Options opts;
  Orchestrator o;
  chorus::Run run;
  rank_proxy proxy;
};

/// The same, with the least queue there is (Options::queue_capacity).
struct SmallQueueRun : ActorRun {
  SmallQueueRun() : ActorRun(1024) {}
};

/// What a producer actor saw of its replies.
struct Tally {
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::string first_error; // written once, by the actor that failed first
  std::atomic<bool> has_error{false};
  void fail(const caf::error& e) {
    ++failed;
    if (!has_error.exchange(true)) first_error = chorus::actors::to_error(e).message();
  }
};

/// Logs `key` at steps 0..steps-1, each once the previous reply came.
caf::behavior paced_producer(caf::event_based_actor* self, rank_proxy proxy, std::string key, int steps,
                             Tally* tally) {
  auto next = std::make_shared<std::function<void(int)>>();
  *next = [=](int step) {
    if (step == steps) return self->quit();
    self->request(proxy, caf::infinite, log_atom::value, std::int64_t{step}, Values{{key, step + 0.5}})
        .then(
            [=](caf::ok_atom) {
              ++tally->ok;
              (*next)(step + 1);
            },
            [=](const caf::error& e) {
              tally->fail(e);
              self->quit();
            });
  };
  return {
      [=](open_atom) {
        auto rp = self->make_response_promise<caf::ok_atom>();
        self->request(proxy, caf::infinite, open_atom::value)
            .then([=](caf::ok_atom) mutable { rp.deliver(caf::ok_atom::value); },
                  [=](const caf::error& e) mutable { rp.deliver(e); });
        return rp;
      },
      [=](go_atom) { (*next)(0); },
  };
}

/// Fires `steps` requests at once, without waiting for replies.
caf::behavior eager_producer(caf::event_based_actor* self, rank_proxy proxy, std::string key, int steps,
                             Tally* tally) {
  for (int step = 0; step < steps; ++step)
    self->request(proxy, caf::infinite, log_atom::value, Values{{key, double(step)}})
        .then([=](caf::ok_atom) { ++tally->ok; }, [=](const caf::error& e) { tally->fail(e); });
  return {[](go_atom) {}};
}

/// The reply to one request of `msg` from a scoped actor: empty where ok.
template <class... Ts>
chorus::Error ask(caf::scoped_actor& self, const rank_proxy& proxy, Ts&&... msg) {
  chorus::Error out(chorus::Errc::internal, "no reply");
  self->request(proxy, caf::infinite, std::forward<Ts>(msg)...)
      .receive([&](caf::ok_atom) { out = {}; }, [&](const caf::error& e) { out = chorus::actors::to_error(e); });
  return out;
}

} // namespace

// Six actors log explicit steps 0..999 each, each waiting for its replies:
// every value lands, in one row a step, nothing rejected.
BOOST_FIXTURE_TEST_CASE(actors_log_their_own_steps_and_lose_nothing, ActorRun) {
  constexpr int actors = 6;
  constexpr int steps = 1000;
  Tally tally;
  {
    caf::scoped_actor self{o.sys};
    std::vector<caf::actor> producers;
    for (int a = 0; a < actors; ++a)
      producers.push_back(o.sys.spawn(paced_producer, proxy, "a" + std::to_string(a), steps, &tally));
    // Every stream is open before any logs: none joins behind committed steps.
    for (const auto& p : producers)
      self->request(p, caf::infinite, open_atom::value).receive([](caf::ok_atom) {}, [&](const caf::error& e) {
        BOOST_FAIL("open: " << chorus::actors::to_error(e).message());
      });
    for (const auto& p : producers) self->send(p, go_atom::value);
    self->wait_for(producers);
  }
  BOOST_TEST(tally.ok.load() == actors * steps);
  BOOST_TEST(tally.failed.load() == 0, tally.first_error);
  const std::vector<Row> rows = finish_clean(steps);
  for (int s = 0; s < steps; ++s) {
    BOOST_TEST(rows[s].step() == s);
    for (int a = 0; a < actors; ++a) BOOST_TEST(rows[s].num.at("a" + std::to_string(a)) == s + 0.5);
  }
}

// Requests faster than the queue drains (a queue of 1,024 values, 20,000
// requests in flight): the proxy holds what does not fit, drops nothing, and
// answers every one.
BOOST_FIXTURE_TEST_CASE(a_full_queue_holds_messages_and_drops_none, SmallQueueRun) {
  constexpr int steps = 20000;
  Tally tally;
  {
    caf::scoped_actor self{o.sys};
    auto p = o.sys.spawn(eager_producer, proxy, "x", steps, &tally);
    // It is done once every reply came; it has nothing else to do.
    while (tally.ok.load() + tally.failed.load() < steps) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    self->send_exit(p, caf::exit_reason::user_shutdown);
  }
  BOOST_TEST(tally.failed.load() == 0, tally.first_error);
  const std::vector<Row> rows = finish_clean(steps);
  for (int s = 0; s < steps; ++s) BOOST_TEST_REQUIRE(rows[s].num.at("x") == double(s));
}

// A reply carries the error the call's ticket would: a step below the
// actor's last, a bad key, a call after finish.
BOOST_FIXTURE_TEST_CASE(errors_come_back_as_the_tickets_would, ActorRun) {
  Tally tally;
  auto other = o.sys.spawn(paced_producer, proxy, "n", 1, &tally);
  {
    caf::scoped_actor self{o.sys};
    self->request(other, caf::infinite, open_atom::value).receive([](caf::ok_atom) {}, [](const caf::error&) {});
    BOOST_TEST(!ask(self, proxy, log_atom::value, std::int64_t{5}, Values{{"m", 1.0}}));
    const chorus::Error back = ask(self, proxy, log_atom::value, std::int64_t{3}, Values{{"m", 2.0}});
    BOOST_TEST((back.code() == chorus::Errc::backwards_step), back.message());
    const chorus::Error key = ask(self, proxy, log_atom::value, std::int64_t{6}, Values{{"", 2.0}});
    BOOST_TEST((key.code() == chorus::Errc::invalid_key), key.message());
    const chorus::Error negative = ask(self, proxy, log_atom::value, std::int64_t{-1}, Values{{"m", 2.0}});
    BOOST_TEST((negative.code() == chorus::Errc::invalid_argument), negative.message());
    BOOST_TEST(!ask(self, proxy, leave_atom::value));
  }
  {
    // Another actor has a stream of its own, opened before the first log
    // above: its step 0 is in order.
    caf::scoped_actor self{o.sys};
    self->send(other, go_atom::value);
    self->wait_for(other);
  }
  BOOST_TEST(tally.ok.load() == 1, tally.first_error);
  const chorus::FinishResult r = run.finish().wait();
  BOOST_TEST(!r.error, r.error.message());
  BOOST_TEST(r.rejected == 3u); // the backwards step, the bad key, the negative step
  {
    caf::scoped_actor self{o.sys};
    const chorus::Error late = ask(self, proxy, log_atom::value, Values{{"m", 3.0}});
    BOOST_TEST((late.code() == chorus::Errc::finished), late.message());
  }
  const std::vector<Row> rows = read_history(r.run_dir);
  BOOST_REQUIRE_EQUAL(rows.size(), 2u);
  BOOST_TEST(rows[0].step() == 0);
  BOOST_TEST(rows[0].num.at("n") == 0.5);
  BOOST_TEST(rows[1].step() == 5);
  BOOST_TEST(rows[1].num.at("m") == 1.0);
}

// Each actor that logged holds a stream, and a rank has at most 4096: the
// stream of an actor that terminated is given back. 4,500 short-lived
// actors log one value each, one after the other.
BOOST_FIXTURE_TEST_CASE(streams_of_terminated_actors_are_given_back, ActorRun) {
  constexpr int actors = 4500;
  Tally tally;
  {
    caf::scoped_actor self{o.sys};
    for (int a = 0; a < actors; ++a) {
      auto p = o.sys.spawn(paced_producer, proxy, "k", 1, &tally);
      self->send(p, go_atom::value);
      self->wait_for(p);
    }
  }
  BOOST_TEST(tally.failed.load() == 0, tally.first_error);
  BOOST_TEST(tally.ok.load() == actors);
  BOOST_TEST(finish_clean(1).front().num.at("k") == 0.5);
}

/// Options for rank `rank` of a two-rank job on this node, in `mode`.
chorus::Options two_ranks(const TempDir& dir, chorus::Mode mode, int rank) {
  chorus::Options opts = local_options(dir, "caf");
  opts.mode = mode;
  opts.topology->rank = opts.topology->local_rank = rank;
  opts.topology->world_size = opts.topology->local_world_size = 2;
  return opts;
}

// An inactive run (a rank that does not log in this mode) has no proxy.
BOOST_AUTO_TEST_CASE(an_inactive_run_has_no_proxy) {
  TempDir dir;
  const chorus::Options opts = two_ranks(dir, chorus::Mode::automatic, 1);
  Orchestrator o(opts);
  chorus::Error err;
  chorus::Run run = chorus::actors::init(o.sys, opts, err);
  BOOST_TEST(!err, err.message());
  BOOST_TEST(!run);
  BOOST_TEST(!chorus::actors::proxy(run));
}

// A run whose processes link needs the middleman chorus sets up: an actor
// system made without configure() is refused with the fix.
BOOST_AUTO_TEST_CASE(a_run_that_links_needs_a_configured_system) {
  TempDir dir;
  const chorus::Options opts = two_ranks(dir, chorus::Mode::shared, 0);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  chorus::Error err;
  chorus::Run run = chorus::actors::init(sys, opts, err);
  BOOST_TEST(!run);
  BOOST_TEST((err.code() == chorus::Errc::invalid_argument), err.message());
  BOOST_TEST(err.message().find("chorus::actors::configure") != std::string::npos, err.message());
}

// The sample: three ranks under `chorus launch`, each with a trainer, an
// evaluator and a loader actor, in one shared run.
BOOST_AUTO_TEST_CASE(actor_train_sample_three_ranks_one_run) {
  constexpr int steps = 200;
  if (!fs::exists(bin("actor_train"))) {
    BOOST_TEST_MESSAGE("skipped: the samples are not built (CHORUS_BUILD_SAMPLES=OFF)");
    return;
  }
  TempDir dir;
  const Output out = run("CHORUS_DIR=" + dir.path.string() + " " + bin("chorus") + " launch -n 3 --master-port " +
                         std::to_string(test_port(41)) + " -- " + bin("actor_train") + " --steps " +
                         std::to_string(steps));
  BOOST_TEST_REQUIRE(out.status == 0, out.text);
  const auto runs = find_runs(dir.path);
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  const fs::path rejected = runs[0] / "rejected.jsonl";
  BOOST_TEST((!fs::exists(rejected) || fs::file_size(rejected) == 0), slurp(rejected));
  const std::vector<Row> rows = read_history(runs[0]);
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const Row& row = rows[s];
    BOOST_TEST(row.step() == s);
    BOOST_TEST(row.count.at("loss") == 3.0);                // every rank's trainer
    BOOST_TEST(row.num.at("data/batches") == 3.0 * (s + 1)); // every rank's loader, summed
    BOOST_TEST(row.num.count("lr") == 1u);                  // one column, rank 0's
    const bool evaluated = s % 50 == 0 || s == steps - 1;
    BOOST_TEST(row.count.count("eval/loss") == (evaluated ? 1u : 0u), "step " << s);
    if (evaluated) BOOST_TEST(row.count.at("eval/loss") == 3.0);
  }
  // Trained: the held-out loss fell.
  BOOST_TEST(rows.back().num.at("eval/loss") < rows.front().num.at("eval/loss") / 10);
}
