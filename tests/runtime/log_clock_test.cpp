// When a value was logged: stamps read on the trainer's thread (the TSC where
// it is invariant, steady_clock otherwise or when forced) and turned into
// wall time by the consumer later. Every bound here is an order of events
// (before the call <= the value's time <= after it), with a tolerance for
// the conversion, never a measure of speed.
#define BOOST_TEST_MODULE runtime_log_clock
#include <boost/test/unit_test.hpp>

#include "runtime/client/log_clock.hpp"
#include "tests/e2e/local_run.hpp"

#include <chorus/chorus.hpp>

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

using chorus::client::LogClock;
using chorus::client::StampConverter;

namespace {

using Source = LogClock::Source;

// What a conversion may be off by: the two clocks' readings side by side
// and the rounding to microseconds.
constexpr std::int64_t tolerance_us = 1000;

std::int64_t unix_us_now() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Forces the fallback for the runs made while it lives.
struct Forced {
  explicit Forced(bool steady) { LogClock::force_steady(steady); }
  ~Forced() { LogClock::force_steady(false); }
};

/// The sources this machine has: steady_clock always, the TSC where it is invariant.
std::vector<Source> sources() {
  std::vector<Source> out{Source::steady};
  if (LogClock::process_source() == Source::tsc) out.push_back(Source::tsc);
  return out;
}

/// A 1024 x 1024 noisy image: the run's consumer holds everything logged
/// after it until its PNG is encoded, so values wait in the ring a while.
std::vector<std::uint8_t> noise() {
  std::vector<std::uint8_t> px(1024 * 1024 * 3);
  std::uint32_t x = 12345;
  for (auto& p : px) {
    x = x * 1664525u + 1013904223u;
    p = static_cast<std::uint8_t>(x >> 24);
  }
  return px;
}

/// Logs a value while the consumer is held, and checks that its row carries
/// the time of the call, not of the drain.
void logged_time_is_the_calls(bool steady) {
  Forced forced(steady);
  chorus::test::TempDir dir;
  chorus::Run run = chorus::init(e2e::local_options(dir, "clock"));
  const std::vector<std::uint8_t> px = noise();
  (void)run.log_image("held", chorus::Image::from_pixels(px, 1024, 1024, 3), {.step = 0});
  const std::int64_t before = unix_us_now();
  (void)run.log({{"loss", 1.0}}, {.step = 1});
  const std::int64_t after = unix_us_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(50)); // the drain comes later still
  const chorus::FinishResult r = run.finish().wait();
  BOOST_TEST_REQUIRE(!r.error, r.error.message());
  const std::vector<e2e::Row> rows = e2e::read_history(r.run_dir);
  bool found = false;
  for (const e2e::Row& row : rows) {
    if (row.step() != 1) continue;
    found = true;
    const auto ts = static_cast<std::int64_t>(std::llround(row.num.at("_timestamp") * 1e6));
    BOOST_TEST(ts >= before - tolerance_us, "logged at " << ts << ", called at " << before << " or after");
    BOOST_TEST(ts <= after + tolerance_us, "logged at " << ts << ", returned at " << after);
  }
  BOOST_TEST(found);
}

} // namespace

BOOST_AUTO_TEST_CASE(forcing_the_fallback_makes_runs_stamp_with_steady_clock) {
  {
    Forced forced(true);
    BOOST_TEST((LogClock::process_source() == Source::steady));
  }
  // Where the TSC is invariant it is the default again.
  BOOST_TEST((LogClock::process_source() == sources().back()));
}

BOOST_AUTO_TEST_CASE(a_stamp_converted_later_is_the_time_it_was_taken) {
  for (Source source : sources()) {
    const LogClock clock(source);
    StampConverter convert(clock);
    const std::int64_t before = unix_us_now();
    const std::uint64_t stamp = clock.now();
    const std::int64_t after = unix_us_now();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    convert.anchor();
    const std::int64_t us = convert.unix_us(stamp);
    BOOST_TEST(us >= before - tolerance_us);
    BOOST_TEST(us <= after + tolerance_us);
  }
}

BOOST_AUTO_TEST_CASE(calibration_is_monotone) {
  // Across the span that fixes the TSC's rate and after it, a later stamp is
  // never dated before an earlier one, whatever anchor converted it.
  for (Source source : sources()) {
    const LogClock clock(source);
    StampConverter convert(clock);
    std::int64_t last = 0;
    std::uint64_t last_stamp = 0;
    const auto end = std::chrono::steady_clock::now() + LogClock::calibration_span + std::chrono::milliseconds(100);
    for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
      const std::uint64_t stamp = clock.now();
      if (i % 7 == 0) convert.anchor();
      const std::int64_t us = convert.unix_us(stamp);
      BOOST_TEST_REQUIRE(stamp >= last_stamp);
      BOOST_TEST_REQUIRE(us >= last);
      last = us;
      last_stamp = stamp;
      if (i % 1000 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    // The rate, once fixed, stays: two readings give the same rate.
    const auto steady_ns = [] {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    const double r1 = clock.ns_per_tick(clock.now(), steady_ns());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const double r2 = clock.ns_per_tick(clock.now(), steady_ns());
    BOOST_TEST(r1 > 0.0);
    BOOST_TEST(r1 == r2);
  }
}

BOOST_AUTO_TEST_CASE(a_row_carries_the_time_of_the_log_call_not_of_the_drain) { logged_time_is_the_calls(false); }

BOOST_AUTO_TEST_CASE(the_steady_clock_fallback_gives_the_same_result) { logged_time_is_the_calls(true); }
