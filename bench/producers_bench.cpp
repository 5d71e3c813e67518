// bench_producers: end-to-end values per second from many producers in one
// rank (README, "Many producers in one rank"). One process, one rank; each
// producer thread logs its own keys at explicit steps 0..steps-1 through its
// own chorus::Writer, at its own pace. The clock runs from the release of the
// threads (their writers made beforehand) to the return of finish, which
// returns once everything is on disk. Afterwards history.jsonl is read back:
// every row must hold every producer's values, and nothing may be rejected.
// The yardstick: the same calls made by one thread through run.log, each step
// every producer's call in turn (the most one stream can take in order).
#include "bench.hpp"

#include <chorus/chorus.hpp>

#include <simdjson.h>

#include <array>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace {

using bench::num;

constexpr int producers = 8;
constexpr int steps = 50'000;
constexpr int keys = 4; // per producer
constexpr int repetitions = 3;

struct Result {
  double seconds = 0;
  std::uint64_t rejected = 0, dropped = 0;
  std::uint64_t rows = 0, bad_rows = 0; // bad: a wrong step or a missing value
};

/// Counts the rows of `run_dir`'s history and those without `fields` fields or in the wrong place.
void check_history(const bench::fs::path& run_dir, std::size_t fields, Result& res) {
  simdjson::padded_string text;
  simdjson::dom::parser parser;
  simdjson::dom::document_stream stream;
  if (simdjson::padded_string::load((run_dir / "history.jsonl").string()).get(text) ||
      parser.parse_many(text).get(stream)) {
    res.bad_rows = 1;
    return;
  }
  for (auto doc : stream) {
    simdjson::dom::object row;
    std::int64_t step = -1;
    const bool ok = !doc.get(row) && !row["_step"].get(step) && step == static_cast<std::int64_t>(res.rows) &&
                    row.size() == fields;
    res.bad_rows += ok ? 0 : 1;
    ++res.rows;
  }
}

/// One run: `producers` producers logging `keys` values a step, each on a
/// thread with its own writer, or (without `writers`) all on one thread through run.log.
Result run_once(bool writers) {
  bench::TempDir dir;
  chorus::Options opt;
  opt.project = "bench";
  opt.dir = (dir.path / "runs").string();
  opt.read_env = false;
  opt.topology = chorus::Topology{};
  opt.system_interval = 0;
  chorus::Run run = chorus::init(opt);

  std::vector<chorus::Writer> ws;
  if (writers)
    for (int p = 0; p < producers; ++p) ws.push_back(run.writer());
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  const int thread_count = writers ? producers : 1;
  for (int t = 0; t < thread_count; ++t)
    threads.emplace_back([&, t] {
      const int first = writers ? t : 0, last = writers ? t + 1 : producers; // the producers this thread plays
      std::vector<std::string> names;
      std::vector<std::array<chorus::Metric, keys>> values(static_cast<std::size_t>(last - first));
      names.reserve(values.size() * keys); // the metrics view these strings
      for (int p = first; p < last; ++p)
        for (int k = 0; k < keys; ++k) {
          // Appended to a fresh string: GCC 12's -Wrestrict misfires on "p" + std::string in Release.
          std::string& name = names.emplace_back("p");
          name.append(std::to_string(p)).append("_k").append(std::to_string(k));
          values[p - first][k].key = names.back();
        }
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (std::int64_t s = 0; s < steps; ++s)
        for (int p = first; p < last; ++p) {
          auto& v = values[p - first];
          for (int k = 0; k < keys; ++k) v[k].value = static_cast<double>(s + k);
          (void)(writers ? ws[p].log(v, {.step = s}) : run.log(v, {.step = s}));
        }
      if (writers) (void)ws[t].close();
    });
  const std::int64_t t0 = bench::now_ns();
  go.store(true, std::memory_order_release);
  for (auto& t : threads) t.join();
  const chorus::FinishResult r = run.finish().wait();
  Result res;
  res.seconds = static_cast<double>(bench::now_ns() - t0) / 1e9;
  if (r.error) std::fprintf(stderr, "finish: %s\n", r.error.message().c_str());
  res.rejected = r.rejected;
  res.dropped = r.dropped;
  check_history(r.run_dir, 3 + static_cast<std::size_t>(producers) * keys, res); // _step, _timestamp, _runtime
  return res;
}

} // namespace

int main() {
  const unsigned cores = std::thread::hardware_concurrency();
  std::printf("bench_producers: one rank, %d producers logging %d steps x %d values each at explicit steps, "
              "flat out; %u cores; %d runs a case\n\n",
              producers, steps, keys, cores, repetitions);
  bench::Table t({"case", "run", "values", "seconds", "M values/s", "rows", "bad rows", "rejected", "dropped"});
  bool all_ok = true;
  struct Case {
    const char* name;
    bool writers;
  };
  for (const Case c : {Case{"1 thread, run.log", false}, Case{"8 threads, a writer each", true}}) {
    std::vector<double> rates;
    for (int i = 0; i < repetitions; ++i) {
      const Result r = run_once(c.writers);
      const double values = static_cast<double>(producers) * steps * keys;
      rates.push_back(values / r.seconds);
      const bool ok = r.rejected == 0 && r.dropped == 0 && r.bad_rows == 0 && r.rows == steps;
      all_ok = all_ok && ok;
      t.add({c.name, std::to_string(i + 1), num(values, 0), num(r.seconds, 3), num(values / r.seconds / 1e6, 2),
             std::to_string(r.rows), std::to_string(r.bad_rows), std::to_string(r.rejected),
             std::to_string(r.dropped)});
    }
    std::printf("%s: median %.2f M values/s\n", c.name, bench::median(rates) / 1e6);
  }
  std::printf("\n");
  t.print();
  std::printf("\nnothing rejected, dropped or missing: %s\n", all_ok ? "yes" : "NO");
  return all_ok ? 0 : 1;
}
