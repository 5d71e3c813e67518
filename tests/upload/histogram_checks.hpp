// What the histogram upload tests write and check: histograms.jsonl lines
// as the run host writes them, and, the run directory's histograms.jsonl
// being the truth, each of its histograms on the server once, in the forms
// of docs/UPLOADS.md.
#pragma once

#include "io/store/histogram_log.hpp"
#include "tests/io/files.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/uploading.hpp"

#include <boost/test/unit_test.hpp>

#include <simdjson.h>

#include <algorithm>
#include <cfloat>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace chorus::test {

struct LoggedHistogram {
  std::int64_t step = 0;
  double timestamp = 0;
  std::string column;
  Histogram value;
};

/// histograms.jsonl of `run_dir`, each line read through store::read_histogram_line.
inline std::vector<LoggedHistogram> read_histograms(const std::string& run_dir) {
  std::vector<LoggedHistogram> out;
  simdjson::dom::parser parser;
  std::istringstream in(test::files::slurp(run_dir + "/histograms.jsonl"));
  for (std::string line; std::getline(in, line);) {
    simdjson::dom::element e;
    BOOST_REQUIRE(parser.parse(line).get(e) == simdjson::SUCCESS);
    const Result<store::HistogramLine> h = store::read_histogram_line(e);
    BOOST_REQUIRE_MESSAGE(h.has_value(), (h ? "" : h.error().message()));
    out.push_back({h->step, h->timestamp, h->column(), h->value});
  }
  return out;
}

/// Appends the histograms of steps [first, first + n) to histograms.jsonl,
/// as the run host writes them: at even steps "grad" (two ranks merged;
/// ~2500 buckets, so W&B's bins are merged to fit; NaN and infinities every
/// fourth step), at steps divisible by 3 "act" of ranks 0 and 1 (a few
/// buckets with gaps between), and at step 6 "dead" (NaN only).
inline void histograms(RunFixture& run, std::int64_t first, std::int64_t n) {
  std::string out;
  for (std::int64_t s = first; s < first + n; ++s) {
    const std::int64_t ts_us = 1'700'000'000'000'000 + s * 250'000, runtime_us = s * 250'000;
    if (s % 3 == 0) {
      for (int rank = 0; rank < 2; ++rank) {
        Histogram h;
        for (int i = 1; i <= 20; ++i) h.add(static_cast<double>(i * i) * static_cast<double>(s + 1 + rank));
        store::append_histogram_line(out, s, ts_us, runtime_us, "act", rank, 0, h);
      }
    }
    if (s == 6) {
      Histogram h;
      for (int i = 0; i < 3; ++i) h.add(std::numeric_limits<double>::quiet_NaN());
      store::append_histogram_line(out, s, ts_us, runtime_us, "dead", -1, 0, h);
    }
    if (s % 2 == 0) {
      Histogram h;
      for (int i = -2000; i <= 2000; ++i) h.add(static_cast<double>(i) * 1e-3 * static_cast<double>(s + 1));
      if (s % 4 == 0) {
        h.add(std::numeric_limits<double>::quiet_NaN());
        h.add(std::numeric_limits<double>::infinity());
        h.add(-std::numeric_limits<double>::infinity());
      }
      store::append_histogram_line(out, s, ts_us, runtime_us, "grad", -1, 2, h);
    }
  }
  run.append("histograms.jsonl", out);
}

/// A run that has ended with history rows for steps [0, 40) and histograms
/// for steps [0, 44): steps 40 and 42 have histograms only (41 and 43 have none).
inline void ended_histogram_run(RunFixture& run) {
  run.history(0, 40);
  histograms(run, 0, 44);
  run.write_run_json("finished", 1'700'000'100.0);
}

/// MLflow: each histogram's <column>/p50, /p90, /p99 once at its step and
/// time (none for one of NaN only), and its artifact
/// histograms/<column>/step_<step>.json; nothing else under histograms/.
inline void check_mlflow_histograms(const TrackingServer& server, const std::string& run_id, const std::string& run_dir) {
  const std::vector<LoggedHistogram> logged = read_histograms(run_dir);
  BOOST_REQUIRE(!logged.empty());
  std::map<std::string, std::size_t> per_key;
  const auto artifacts = server.artifacts(run_id);
  std::set<std::string> expected_artifacts;
  simdjson::dom::parser parser;
  for (const LoggedHistogram& h : logged) {
    BOOST_TEST_CONTEXT(h.column << " at step " << h.step) {
      if (h.value.count() != h.value.nan_count()) {
        for (const auto& [q, name] : {std::pair{0.5, "/p50"}, std::pair{0.9, "/p90"}, std::pair{0.99, "/p99"}}) {
          const std::string key = h.column + name;
          ++per_key[key];
          std::size_t found = 0;
          for (const MetricPoint& p : server.metric_history(run_id, key)) {
            if (p.step != h.step) continue;
            ++found;
            const double want = std::clamp(h.value.quantile(q), -DBL_MAX, DBL_MAX); // infinities as MLflow keeps them
            BOOST_TEST(p.value == want, key);
            BOOST_TEST(p.timestamp == std::llround(h.timestamp * 1000));
          }
          BOOST_TEST(found == 1u, key);
        }
      }
      const std::string path = "histograms/" + h.column + "/step_" + std::to_string(h.step) + ".json";
      expected_artifacts.insert(path);
      const auto a = artifacts.find(path);
      BOOST_REQUIRE_MESSAGE(a != artifacts.end(), path);
      simdjson::dom::element doc;
      BOOST_REQUIRE(parser.parse(a->second).get(doc) == simdjson::SUCCESS);
      BOOST_TEST(doc["step"].get_int64().value() == h.step);
      BOOST_TEST(std::string(doc["column"].get_string().value()) == h.column);
      BOOST_TEST(doc["count"].get_uint64().value() == h.value.count());
      BOOST_TEST(doc["nan"].get_uint64().value() == h.value.nan_count());
      BOOST_TEST(doc["inf"].get_uint64().value() == h.value.pos_inf_count());
      BOOST_TEST(doc["-inf"].get_uint64().value() == h.value.neg_inf_count());
      const std::vector<Histogram::Bucket> buckets = h.value.buckets();
      const simdjson::dom::array got = doc["buckets"].get_array().value();
      BOOST_REQUIRE_EQUAL(got.size(), buckets.size());
      std::size_t i = 0;
      for (simdjson::dom::element b : got) {
        BOOST_TEST(b.at(0).get_double().value() == buckets[i].lo);
        BOOST_TEST(b.at(1).get_double().value() == buckets[i].hi);
        BOOST_TEST(b.at(2).get_uint64().value() == buckets[i].count);
        ++i;
      }
    }
  }
  for (const auto& [key, n] : per_key) BOOST_TEST(server.metric_history(run_id, key).size() == n, key);
  for (const auto& [path, content] : artifacts)
    if (path.starts_with("histograms/")) BOOST_TEST(expected_artifacts.count(path) == 1u, path);
}

/// W&B: one history row a step, in step order; each history.jsonl row as
/// written with the step's histograms after its values; each histogram
/// once, in the row of its step under its column, as {"_type": "histogram",
/// "values", "bins"}: at most 512 bins, edges ascending and bucket bounds,
/// each bucket's count whole in one bin, NaN and infinities left out.
inline void check_wandb_histograms(const WandbRun& remote, const std::string& run_dir) {
  simdjson::dom::parser parser, line_parser;
  std::map<std::int64_t, std::string> rows = rows_by_step(remote);
  std::set<std::int64_t> steps;
  std::istringstream history(test::files::slurp(run_dir + "/history.jsonl"));
  for (std::string line; std::getline(history, line);) {
    simdjson::dom::element doc;
    BOOST_REQUIRE(line_parser.parse(line).get(doc) == simdjson::SUCCESS);
    const std::int64_t step = doc["_step"].get_int64().value();
    steps.insert(step);
    BOOST_REQUIRE_MESSAGE(rows.count(step), "no row of step " << step);
    BOOST_TEST(rows[step].starts_with(line.substr(0, line.size() - 1)), rows[step]);
  }
  std::size_t columns = 0;
  for (const auto& [step, row] : rows) {
    const simdjson::dom::object o = parser.parse(row).get_object().value();
    for (auto f : o) {
      std::string_view type;
      columns += f.value.is_object() && f.value["_type"].get(type) == simdjson::SUCCESS && type == "histogram";
    }
  }
  const std::vector<LoggedHistogram> logged = read_histograms(run_dir);
  BOOST_TEST(columns == logged.size()); // each once, nothing else
  for (const LoggedHistogram& h : logged) {
    BOOST_TEST_CONTEXT(h.column << " at step " << h.step) {
      steps.insert(h.step);
      BOOST_REQUIRE(rows.count(h.step));
      simdjson::dom::element doc;
      BOOST_REQUIRE(parser.parse(rows[h.step]).get(doc) == simdjson::SUCCESS);
      simdjson::dom::element hist;
      BOOST_REQUIRE(doc[h.column].get(hist) == simdjson::SUCCESS);
      BOOST_TEST(std::string(hist["_type"].get_string().value()) == "histogram");
      std::vector<std::uint64_t> values;
      std::vector<double> bins;
      const simdjson::dom::array value_array = hist["values"].get_array().value();
      const simdjson::dom::array bin_array = hist["bins"].get_array().value();
      for (auto v : value_array) values.push_back(v.get_uint64().value());
      for (auto b : bin_array) bins.push_back(b.get_double().value());
      BOOST_REQUIRE_EQUAL(bins.size(), values.size() + 1);
      BOOST_TEST(values.size() <= 512u);
      BOOST_TEST(std::is_sorted(bins.begin(), bins.end(), std::less_equal<>()));
      std::uint64_t sum = 0;
      for (const std::uint64_t v : values) sum += v;
      BOOST_TEST(sum == h.value.finite_count()); // count less NaN and the infinities
      if (h.value.finite_count() == 0) {
        BOOST_TEST((bins == std::vector<double>{0, 1}));
        continue;
      }
      // Each bucket whole in one bin, and each bin the sum of its buckets.
      std::vector<std::uint64_t> again(values.size(), 0);
      for (const Histogram::Bucket& b : h.value.buckets()) {
        const auto at = std::upper_bound(bins.begin(), bins.end(), b.lo) - bins.begin() - 1;
        BOOST_REQUIRE(at >= 0);
        BOOST_REQUIRE(static_cast<std::size_t>(at) < values.size());
        BOOST_TEST(bins[static_cast<std::size_t>(at)] <= b.lo);
        BOOST_TEST(b.hi <= bins[static_cast<std::size_t>(at) + 1]);
        again[static_cast<std::size_t>(at)] += b.count;
      }
      BOOST_TEST(again == values);
      const std::vector<Histogram::Bucket> buckets = h.value.buckets();
      BOOST_TEST(bins.front() == buckets.front().lo);
      BOOST_TEST(bins.back() == buckets.back().hi);
    }
  }
  BOOST_TEST(rows.size() == steps.size());
}

} // namespace chorus::test
