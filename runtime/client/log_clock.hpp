// When a value was logged. The trainer's thread reads a stamp in a few
// cycles (the CPU's time-stamp counter where it is invariant, else
// steady_clock); the RankProxy turns stamps into wall time as it drains the
// ring, with a rate calibrated once a process.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define CHORUS_HAS_TSC 1
#else
#define CHORUS_HAS_TSC 0
#endif

namespace chorus::client {

/// Stamps keep 63 bits: a ring slot's word keeps the last bit for itself (ingest.hpp).
inline constexpr std::uint64_t stamp_mask = ~std::uint64_t{0} >> 1;

/// Where a run's stamps come from, chosen when the run is made.
class LogClock {
public:
  enum class Source : std::uint8_t {
    tsc,    // the time-stamp counter: cpuid 0x80000007 EDX bit 8 says it is invariant
    steady, // steady_clock's nanoseconds: no invariant TSC (or forced, for tests)
  };

  /// The source of runs made now: the TSC where it is invariant, unless
  /// force_steady(true) was called. Its first call takes the calibration's
  /// first reading (see ns_per_tick).
  static Source process_source() noexcept;
  /// Runs made after this call stamp with steady_clock (the fallback) while
  /// `on`: the tests of the fallback path.
  static void force_steady(bool on) noexcept;

  explicit LogClock(Source s) noexcept : tsc_(s == Source::tsc) {}
  [[nodiscard]] Source source() const noexcept { return tsc_ ? Source::tsc : Source::steady; }

  /// A stamp, now. No fence: a few nanoseconds of reordering are below what a timestamp shows.
  [[gnu::always_inline]] std::uint64_t now() const noexcept {
#if CHORUS_HAS_TSC
    if (tsc_) return __rdtsc() & stamp_mask;
#endif
    return steady_ns() & stamp_mask;
  }

  /// Nanoseconds per tick of this source: 1 for steady_clock; for the TSC,
  /// measured against steady_clock from the process's first reading to the
  /// reading (`stamp`, `steady`) given, and fixed once that span is long
  /// enough (calibration_span). Until then the span so far is used, which is
  /// longer than the age of any stamp converted with it.
  [[nodiscard]] double ns_per_tick(std::uint64_t stamp, std::int64_t steady) const noexcept;

  static constexpr std::chrono::milliseconds calibration_span{200};

private:
  static std::int64_t steady_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  bool tsc_;
};

/// Turns a run's stamps into Unix time, on the consumer's thread: each stamp
/// by its age at the last anchor (a reading of the stamp and the wall clock
/// side by side), so that the wall clock's own steps and slews are followed
/// and a rate's small error only scales the age, never the whole run.
class StampConverter {
public:
  explicit StampConverter(LogClock clock) noexcept : clock_(clock) {}

  /// Reads the stamp and the wall clock now: the reference for the stamps
  /// read before it (one per frame the consumer sends).
  void anchor() noexcept;
  /// Unix microseconds of `stamp`. Never earlier than what an earlier stamp
  /// got: a later call is never dated before an earlier one.
  [[nodiscard]] std::int64_t unix_us(std::uint64_t stamp) noexcept;

private:
  LogClock clock_;
  std::uint64_t anchor_stamp_ = 0;
  std::int64_t anchor_unix_ns_ = 0;
  double ns_per_tick_ = 1.0;
  bool anchored_ = false;
  std::uint64_t last_stamp_ = 0;
  std::int64_t last_us_ = 0;
  bool converted_ = false;
};

} // namespace chorus::client
