#include "runtime/client/log_clock.hpp"

#include <atomic>
#include <cmath>

#if CHORUS_HAS_TSC
#include <cpuid.h>
#endif

namespace chorus::client {

namespace {

std::atomic<bool> steady_forced{false};

bool invariant_tsc() noexcept {
#if CHORUS_HAS_TSC
  unsigned a = 0, b = 0, c = 0, d = 0;
  // __get_cpuid checks that the extended leaf exists.
  return __get_cpuid(0x80000007u, &a, &b, &c, &d) != 0 && (d & (1u << 8)) != 0;
#else
  return false;
#endif
}

std::int64_t steady_now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// The sign of a 63-bit stamp difference.
std::int64_t stamp_diff(std::uint64_t a, std::uint64_t b) noexcept {
  return static_cast<std::int64_t>((a - b) << 1) >> 1;
}

/// The TSC's rate against steady_clock: the process's first reading, and
/// the rate once fixed.
struct Calibration {
  std::uint64_t tsc = 0;
  std::int64_t steady = 0;
  std::atomic<double> fixed{0.0};

  Calibration() noexcept {
#if CHORUS_HAS_TSC
    // The closest of a few readings: the clock's read between two of the counter.
    std::uint64_t best = ~std::uint64_t{0};
    for (int i = 0; i < 5; ++i) {
      const std::uint64_t t1 = __rdtsc();
      const std::int64_t s = steady_now_ns();
      const std::uint64_t t2 = __rdtsc();
      if (t2 - t1 < best) {
        best = t2 - t1;
        tsc = (t1 + (t2 - t1) / 2) & stamp_mask;
        steady = s;
      }
    }
#endif
  }
};

Calibration& calibration() noexcept {
  static Calibration c;
  return c;
}

} // namespace

LogClock::Source LogClock::process_source() noexcept {
  static const bool tsc = invariant_tsc();
  if (!tsc || steady_forced.load(std::memory_order_relaxed)) return Source::steady;
  (void)calibration();
  return Source::tsc;
}

void LogClock::force_steady(bool on) noexcept { steady_forced.store(on, std::memory_order_relaxed); }

double LogClock::ns_per_tick(std::uint64_t stamp, std::int64_t steady) const noexcept {
  if (!tsc_) return 1.0;
  Calibration& c = calibration();
  if (const double r = c.fixed.load(std::memory_order_acquire); r > 0) return r;
  const std::int64_t ticks = stamp_diff(stamp, c.tsc);
  const std::int64_t ns = steady - c.steady;
  // No measurable time yet: every stamp is as old as the reading, which is now.
  if (ticks <= 0 || ns <= 0) return 0.0;
  const double r = static_cast<double>(ns) / static_cast<double>(ticks);
  if (ns < std::chrono::nanoseconds(calibration_span).count()) return r;
  double expected = 0.0;
  if (c.fixed.compare_exchange_strong(expected, r, std::memory_order_acq_rel)) return r;
  return expected; // another consumer fixed it first
}

void StampConverter::anchor() noexcept {
  const std::uint64_t s1 = clock_.now();
  const std::int64_t unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
  const std::int64_t steady = steady_now_ns();
  const std::uint64_t s2 = clock_.now();
  anchor_stamp_ = (s1 + stamp_diff(s2, s1) / 2) & stamp_mask;
  anchor_unix_ns_ = unix_ns;
  ns_per_tick_ = clock_.ns_per_tick(anchor_stamp_, steady);
  anchored_ = true;
}

std::int64_t StampConverter::unix_us(std::uint64_t stamp) noexcept {
  if (!anchored_) anchor();
  const double age_ns = static_cast<double>(stamp_diff(anchor_stamp_, stamp)) * ns_per_tick_;
  const std::int64_t ns = anchor_unix_ns_ - std::llround(age_ns);
  std::int64_t us = ns >= 0 ? ns / 1000 : -((-ns + 999) / 1000);
  const bool later = !converted_ || stamp_diff(stamp, last_stamp_) >= 0;
  if (later) {
    if (converted_ && us < last_us_) us = last_us_;
    last_stamp_ = stamp;
    last_us_ = us;
    converted_ = true;
  }
  return us;
}

} // namespace chorus::client
