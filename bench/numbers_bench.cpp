// bench_numbers: the text of every number history.jsonl holds
// (core::append_json_number, core::shortest underneath) beside std::to_chars
// writing the same text in the same loop, on four kinds of values: random
// doubles, float32 metrics made doubles, short decimals (learning rates,
// accuracies over 100 or 1,000 samples, powers of two) and bench_sdk_workload's
// values. Each figure is the smallest of many passes over 10,000 values (the
// least disturbed), in ns a value; the two take turns.
//
//   bench_numbers [PASSES]    (default 300)
#include "bench.hpp"

#include "runtime/core/json.hpp"

#include <charconv>
#include <random>
#include <string>
#include <vector>

namespace {

struct Set {
  const char* name;
  std::vector<double> v;
};

std::vector<Set> sets() {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0, 10);
  std::vector<Set> out(4);
  out[0].name = "random doubles in [0, 10)";
  out[1].name = "float32 values made doubles";
  out[2].name = "short decimals (0.001, 0.85, 1.25, 4096)";
  out[3].name = "bench_sdk_workload's values";
  const double rates[] = {0.001, 3e-4, 1e-5, 0.1, 2.5e-4, 0.01};
  for (int i = 0; i < 10'000; ++i) {
    out[0].v.push_back(u(rng));
    out[1].v.push_back(static_cast<double>(static_cast<float>(u(rng) * 0.1)));
    out[2].v.push_back(i % 4 == 0   ? rates[i % 6]
                       : i % 4 == 1 ? (i % 1000) / 1000.0
                       : i % 4 == 2 ? (i % 100) / 100.0 + 1
                                    : static_cast<double>(1 << (i % 17)));
  }
  for (int s = 0; s < 100; ++s)
    for (int k = 0; k < 100; ++k) out[3].v.push_back(0.001 * s + 0.5 * k + 3);
  return out;
}

template <class F>
double pass(const std::vector<double>& values, std::string& out, F&& write) {
  out.clear();
  const std::int64_t t0 = bench::now_ns();
  for (const double v : values) {
    out.push_back(',');
    write(out, v);
  }
  return static_cast<double>(bench::now_ns() - t0) / static_cast<double>(values.size());
}

} // namespace

int main(int argc, char** argv) {
  const int passes = argc > 1 ? std::max(1, std::atoi(argv[1])) : 300;
  std::string ours, theirs;
  ours.reserve(1 << 20);
  theirs.reserve(1 << 20);
  bench::Table t({"values", "chorus ns", "std::to_chars ns", "chorus / to_chars", "same text"});
  for (const Set& s : sets()) {
    double best_ours = 1e9, best_theirs = 1e9;
    for (int p = 0; p < passes; ++p) {
      best_ours = std::min(best_ours, pass(s.v, ours, [](std::string& o, double v) { chorus::core::append_json_number(o, v); }));
      best_theirs = std::min(best_theirs, pass(s.v, theirs, [](std::string& o, double v) {
        char buf[32];
        o.append(buf, static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf));
      }));
    }
    t.add({s.name, bench::num(best_ours), bench::num(best_theirs), bench::num(best_ours / best_theirs, 2),
           ours == theirs ? "yes" : "NO"});
  }
  std::printf("a number's text for history.jsonl, the smallest of %d passes over 10,000 values\n\n", passes);
  t.print();
  return 0;
}
