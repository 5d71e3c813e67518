// Many producers in one rank: threads that share one Run, each with its own
// writer (README, "Many producers in one rank").
#define BOOST_TEST_MODULE e2e_producers
#include "local_run.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <string>
#include <thread>
#include <vector>

using namespace e2e;

namespace {

chorus::Options local_options(const TempDir& dir) { return e2e::local_options(dir, "producers"); }

/// Finishes `run`, which must have rejected nothing, and reads back its history.
std::vector<Row> finish_clean(chorus::Run& run) {
  const chorus::FinishResult r = run.finish().wait();
  BOOST_TEST(!r.error, r.error.message());
  BOOST_TEST(r.rejected == 0u);
  const fs::path rejected = fs::path(r.run_dir) / "rejected.jsonl";
  BOOST_TEST((!fs::exists(rejected) || fs::file_size(rejected) == 0), slurp(rejected));
  return read_history(r.run_dir);
}

} // namespace

// The reported case: producers of one rank log explicit steps 0..1999 each,
// at their own pace. Through one stream most of them were backwards_step.
BOOST_AUTO_TEST_CASE(threads_with_their_own_writers_lose_nothing) {
  constexpr int producers = 8;
  constexpr int steps = 2000;
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  BOOST_REQUIRE(run);
  // Made before any logs, so that none joins behind rows already committed.
  std::vector<chorus::Writer> writers;
  for (int p = 0; p < producers; ++p) writers.push_back(run.writer());
  std::vector<chorus::Error> last(producers);
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p)
    threads.emplace_back([&, p] {
      const std::string key = "p" + std::to_string(p);
      chorus::Pending t;
      for (int s = 0; s < steps; ++s) t = writers[p].log({{key, s + p / 10.0}}, {.step = s});
      last[p] = t.wait();
      if (!last[p]) last[p] = writers[p].close().wait();
    });
  for (auto& t : threads) t.join();
  for (const auto& e : last) BOOST_TEST(!e, e.message());
  const std::vector<Row> rows = finish_clean(run);
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    BOOST_TEST(rows[s].step() == s);
    for (int p = 0; p < producers; ++p) BOOST_TEST(rows[s].num.at("p" + std::to_string(p)) == s + p / 10.0);
  }
}

// Run::log itself is safe from many threads: each call is one automatic step
// of the default stream, whatever thread makes it.
BOOST_AUTO_TEST_CASE(run_log_from_many_threads_takes_every_call) {
  constexpr int producers = 4;
  constexpr int calls = 500;
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p)
    threads.emplace_back([&, p] {
      const std::string key = "t" + std::to_string(p);
      for (int i = 0; i < calls; ++i) (void)run.log({{key, 1.0}});
    });
  for (auto& t : threads) t.join();
  const std::vector<Row> rows = finish_clean(run);
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(producers * calls));
  std::vector<int> per_producer(producers);
  for (std::size_t s = 0; s < rows.size(); ++s) {
    BOOST_TEST(rows[s].step() == static_cast<std::int64_t>(s));
    for (int p = 0; p < producers; ++p) per_producer[p] += static_cast<int>(rows[s].num.count("t" + std::to_string(p)));
  }
  for (int n : per_producer) BOOST_TEST(n == calls);
}

BOOST_AUTO_TEST_CASE(a_writers_own_mistakes_are_named) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  chorus::Writer w = run.writer();
  BOOST_REQUIRE(w);
  BOOST_TEST(!w.log({{"x", 1.0}}, {.step = 10}).wait());
  const chorus::Error back = w.log({{"x", 2.0}}, {.step = 5}).wait();
  BOOST_TEST((back.code() == chorus::Errc::backwards_step));
  BOOST_TEST(back.message().find("writer") != std::string::npos, back.message());
  BOOST_TEST(!w.close().wait());
  BOOST_TEST(!w);
  BOOST_TEST(!w.log({{"x", 3.0}}).wait()); // a closed writer is inactive: a no-op

  // Past the bound, a writer's calls say what to do.
  std::vector<chorus::Writer> many;
  for (int i = 0; i < 4096; ++i) many.push_back(run.writer());
  chorus::Writer extra = run.writer();
  const chorus::Error full = extra.log({{"x", 1.0}}).wait();
  BOOST_TEST((full.code() == chorus::Errc::invalid_argument));
  BOOST_TEST(full.message().find("4096") != std::string::npos, full.message());
  many.clear();
  BOOST_TEST(!run.writer().log({{"x", 4.0}}, {.step = 11}).wait()); // closing gave the ids back

  chorus::Writer late_made_before = run.writer();
  (void)run.finish().wait();
  BOOST_TEST((late_made_before.log({{"x", 1.0}}).wait().code() == chorus::Errc::finished));
  BOOST_TEST((run.writer().log({{"x", 1.0}}).wait().code() == chorus::Errc::finished));
}

BOOST_AUTO_TEST_CASE(an_inactive_run_gives_inactive_writers) {
  chorus::Run run;
  chorus::Writer w = run.writer();
  BOOST_TEST(!w);
  BOOST_TEST(!w.log({{"x", 1.0}}).wait());
}
