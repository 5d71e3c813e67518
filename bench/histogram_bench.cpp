// bench_histogram: what a histogram costs the trainer's thread (a target of
// BENCHMARKS.md: 1 M host floats bucketed and logged in <= 2 ms). For 1 M
// floats and 1 M doubles drawn from a normal distribution of sigma 0.02 (as
// gradients are), each timed on this thread, p50 and p99 over many
// repetitions:
//
//   - chorus::Histogram's construction alone (the bucketing);
//   - run.log_histogram("grad", values) on a live single-process run: the
//     bucketing and the hand-over to the ring; its ticket is awaited between
//     calls (outside the clock), so the queue never fills;
//   - references in the same binary: a memcpy of the values (the floor of
//     touching them), and a plain two-pass fixed-width histogram of 64 bins
//     (a min/max pass, then a bin pass, as numpy.histogram does).
//
// The cases take turns, one repetition each in a round, so that a slower
// moment of the machine falls on all of them alike. Every case starts alike:
// after a pause of 1 ms (so that the run host has written the line of the
// log_histogram before, and the cores are as idle for each), the values are
// read once, so that they are in the cache as far as they fit, as a
// gradient just computed would be; then the clock starts.
#include "local_run.hpp"

#include <chorus/chorus.hpp>

#include <array>
#include <bit>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using bench::num;

constexpr std::size_t n_values = 1'000'000;
constexpr double sigma = 0.02;
constexpr int warmup = 20;
constexpr int repetitions = 400;
constexpr double target_ms = 2.0;

volatile std::uint64_t sink; // what the timed calls produce goes here, so none is optimised away

/// Keeps the compiler from dropping stores to `p` as dead.
inline void escape(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

/// The reference: numpy.histogram's way with 64 fixed-width bins over [min, max].
template <class T>
std::uint64_t two_pass_histogram(std::span<const T> v, std::array<std::uint64_t, 64>& bins) {
  T lo = v[0], hi = v[0];
  for (const T x : v) {
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  bins.fill(0);
  const double first = lo;
  const double norm = static_cast<double>(bins.size()) / (static_cast<double>(hi) - first);
  for (const T x : v) {
    auto i = static_cast<std::size_t>((static_cast<double>(x) - first) * norm);
    if (i >= bins.size()) i = bins.size() - 1; // x == max lands in the last bin
    ++bins[i];
  }
  return bins[bins.size() / 2];
}

struct Samples {
  std::vector<double> ns;
  void add(std::int64_t t0) { ns.push_back(static_cast<double>(bench::now_ns() - t0)); }
  [[nodiscard]] double p(double q) const {
    std::vector<double> v = ns;
    return bench::quantile(v, q);
  }
};

/// The cases of one element type, measured on a live run.
template <class T>
struct Cases {
  std::span<const T> values;
  std::vector<T> copy;
  std::array<std::uint64_t, 64> bins{};
  Samples construct, log, memcpy_ref, two_pass_ref;
  std::uint64_t log_errors = 0;

  explicit Cases(std::span<const T> v) : values(v), copy(v.size(), T{}) {}

  /// What comes before every timed case: a pause, then every value read.
  void prepare() const {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    Bits s = 0;
    for (const T x : values) s ^= std::bit_cast<Bits>(x);
    sink = s;
  }

  /// One repetition of every case; `timed` false: a warm-up.
  void round(chorus::Run& run, bool timed) {
    prepare();
    std::int64_t t0 = bench::now_ns();
    {
      const chorus::Histogram h(values);
      sink = h.count();
    }
    if (timed) construct.add(t0);

    prepare();
    t0 = bench::now_ns();
    const chorus::Pending p = run.log_histogram("grad", values);
    if (timed) log.add(t0);
    if (p.wait()) ++log_errors;

    prepare();
    t0 = bench::now_ns();
    std::memcpy(copy.data(), values.data(), values.size_bytes());
    escape(copy.data());
    if (timed) memcpy_ref.add(t0);

    prepare();
    t0 = bench::now_ns();
    sink = two_pass_histogram(values, bins);
    if (timed) two_pass_ref.add(t0);
  }
};

std::string ms(double ns) { return num(ns / 1e6, 3); }
std::string ratio(double a, double b) { return num(a / b, 2) + "x"; }

template <class T>
void add_rows(bench::Table& t, const char* type, const Cases<T>& c) {
  const auto row = [&](const std::string& what, const Samples& s) {
    t.add({std::string(type) + "  " + what, ms(s.p(0.5)), ms(s.p(0.99)), ratio(c.log.p(0.5), s.p(0.5)),
           ratio(c.log.p(0.99), s.p(0.99))});
  };
  row("chorus::Histogram(values)", c.construct);
  row("run.log_histogram(\"grad\", values)", c.log);
  row("reference: memcpy", c.memcpy_ref);
  row("reference: two-pass 64-bin histogram", c.two_pass_ref);
}

/// The bytes of a histogram's encoding in a frame: 12 a non-empty bucket and 52 of header.
std::size_t encoded_bytes(const chorus::Histogram& h) { return h.buckets().size() * 12 + 52; }

} // namespace

int main() {
  std::mt19937_64 rng(20261128);
  std::normal_distribution<double> normal(0.0, sigma);
  std::vector<float> floats(n_values);
  std::vector<double> doubles(n_values);
  for (float& f : floats) f = static_cast<float>(normal(rng));
  for (double& d : doubles) d = normal(rng);

  std::printf("bench_histogram: 1 M floats and 1 M doubles, normal (sigma %.2f); %d repetitions a case after %d of "
              "warm-up, the cases taking turns; %u cores\n\n",
              sigma, repetitions, warmup, std::thread::hardware_concurrency());

  // A single-process run in a directory of its own, without system samples.
  bench::TempDir dir;
  chorus::Run run = bench::local_run(dir);

  Cases<float> f(floats);
  Cases<double> d(doubles);
  for (int i = 0; i < warmup + repetitions; ++i) {
    f.round(run, i >= warmup);
    d.round(run, i >= warmup);
  }
  const chorus::FinishResult r = run.finish().wait();
  if (r.error) std::fprintf(stderr, "finish: %s\n", r.error.message().c_str());

  // What the run directory holds: a line per log_histogram call.
  std::size_t lines = 0, bytes = 0;
  {
    std::ifstream in(bench::fs::path(r.run_dir) / "histograms.jsonl");
    for (std::string line; std::getline(in, line); ++lines) bytes += line.size() + 1;
  }
  const std::size_t logged = 2 * static_cast<std::size_t>(warmup + repetitions);

  bench::Table t({"case (ms)", "p50", "p99", "log_histogram / this, p50", "p99"});
  add_rows(t, "1 M floats ", f);
  add_rows(t, "1 M doubles", d);
  t.print();

  // Small histograms (a layer's bias, a batch's losses): their fixed cost.
  bench::Table small({"floats", "chorus::Histogram(values) p50 (us)", "p99 (us)"});
  for (const std::size_t n : {std::size_t{10}, std::size_t{1000}, std::size_t{10000}}) {
    const std::span<const float> v(floats.data(), n);
    std::vector<double> us;
    for (int i = 0; i < 2000; ++i) {
      const std::int64_t t0 = bench::now_ns();
      const chorus::Histogram h{v};
      const std::int64_t t1 = bench::now_ns();
      if (h.count() != n) return 1;
      us.push_back(static_cast<double>(t1 - t0) / 1e3);
    }
    small.add({std::to_string(n), bench::num(bench::quantile(us, 0.5)), bench::num(bench::quantile(us, 0.99))});
  }
  std::printf("\n");
  small.print();

  const chorus::Histogram hf{std::span<const float>(floats)};
  const chorus::Histogram hd{std::span<const double>(doubles)};
  std::printf("\nencoding of the histogram (non-empty buckets x 12 + 52 bytes): floats %zu buckets, %zu bytes; "
              "doubles %zu buckets, %zu bytes (the values themselves: %zu and %zu bytes)\n",
              hf.buckets().size(), encoded_bytes(hf), hd.buckets().size(), encoded_bytes(hd),
              n_values * sizeof(float), n_values * sizeof(double));
  std::printf("histograms.jsonl: %zu lines (%zu logged), %.0f bytes a line\n", lines, logged,
              lines ? static_cast<double>(bytes) / static_cast<double>(lines) : 0.0);

  const bool ok = f.log_errors == 0 && d.log_errors == 0 && !r.error && r.rejected == 0 && r.dropped == 0 &&
                  lines == logged;
  const double p50 = f.log.p(0.5) / 1e6, p99 = f.log.p(0.99) / 1e6;
  std::printf("\ntarget: 1 M floats bucketed and logged <= %.0f ms on the trainer thread: p50 %.3f ms -> %s; "
              "p99 %.3f ms -> %s\n",
              target_ms, p50, bench::verdict(p50 <= target_ms).c_str(), p99, bench::verdict(p99 <= target_ms).c_str());
  std::printf("every histogram committed, none refused: %s\n",
              ok ? "yes" : ("NO (" + std::to_string(f.log_errors + d.log_errors) + " tickets with an error, " +
                            std::to_string(r.rejected) + " rejected, " + std::to_string(lines) + " lines)")
                               .c_str());
  return ok ? 0 : 1;
}
