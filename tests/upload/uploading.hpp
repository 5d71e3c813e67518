// What the Uploader tests share: quick retries, pumping an Uploader until
// it is done, the faults and the lost offsets a run goes up through, and
// checking that every point arrived once.
#pragma once

#include "io/upload/upload.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tracking_server.hpp"

#include <boost/test/unit_test.hpp>

#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace chorus::test {

using namespace std::chrono_literals;

inline upload::UploadSettings quick() {
  upload::UploadSettings s;
  s.backoff_base = 50ms;
  s.backoff_max = 400ms;
  return s;
}

/// quick(), but a pause of `pause` after every failure: longer than the other
/// answers of a window take however slow the machine, so that a pump ends
/// in that wait instead of retrying within it.
inline upload::UploadSettings patient(std::chrono::milliseconds pause) {
  upload::UploadSettings s = quick();
  s.backoff_base = s.backoff_max = pause;
  return s;
}

inline upload::UploadTarget target(const std::string& url) {
  auto t = upload::UploadTarget::parse(url);
  BOOST_REQUIRE_MESSAGE(t, t.error().message());
  return *t;
}

inline std::string mlflow_url(const TrackingServer& s) { return "mlflow://127.0.0.1:" + std::to_string(s.port()); }
inline std::string wandb_url(const TrackingServer& s) { return "wandb+http://127.0.0.1:" + std::to_string(s.port()); }

/// Pumps until done or stopped (or `limit`), sleeping through waits.
inline upload::Uploader::Progress drain(upload::Uploader& up, std::chrono::milliseconds limit = 30s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  upload::Uploader::Progress p;
  while (std::chrono::steady_clock::now() < end) {
    p = up.pump(end);
    if (p.done || p.stopped) break;
    if (p.wait_until) std::this_thread::sleep_until(std::min(*p.wait_until, end));
    else if (p.caught_up) break;
  }
  return p;
}

/// An environment variable set for the object's lifetime.
struct Env {
  std::string name;
  Env(std::string n, const std::string& v) : name(std::move(n)) { ::setenv(name.c_str(), v.c_str(), 1); }
  ~Env() { ::unsetenv(name.c_str()); }
};

/// Uploads the run in `run_dir` to `url` until done; the offsets it ends with.
inline upload::UploadState upload_all(const std::string& run_dir, const std::string& url,
                                  std::chrono::milliseconds limit = 30s) {
  upload::Uploader up(run_dir, target(url), quick());
  BOOST_REQUIRE(!up.open());
  const upload::Uploader::Progress p = drain(up, limit);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  return up.state();
}

/// A second Uploader of a run whose upload is done has nothing left to do, and sends nothing.
inline void check_nothing_left(const TrackingServer& server, const std::string& run_dir, const std::string& url) {
  const auto before = server.stats().requests;
  upload_all(run_dir, url);
  BOOST_TEST(server.stats().requests == before);
}

/// Runs `body` once for MLflow and once for W&B, each against a server of
/// its own (W&B's key set, its client-side interval off).
inline void for_each_backend(const std::function<void(TrackingServer& server, bool wandb)>& body) {
  Env key("WANDB_API_KEY", "chorus-test-key");
  Env interval("CHORUS_WANDB_INTERVAL", "0");
  for (const bool wandb : {false, true}) {
    BOOST_TEST_CONTEXT((wandb ? "W&B" : "MLflow")) {
      TrackingServer server;
      body(server, wandb);
    }
  }
}

/// As if the uploading process was killed after its requests were stored,
/// before it saved any offsets but the remote run's: the offsets file of
/// `url` holds the remote run of `delivered` alone.
inline void forget_offsets(const std::string& run_dir, const std::string& url, const upload::UploadState& delivered) {
  upload::UploadState opened;
  opened.url = delivered.url;
  opened.remote_run = delivered.remote_run;
  opened.experiment = delivered.experiment;
  opened.entity = delivered.entity;
  opened.project = delivered.project;
  BOOST_REQUIRE(!opened.save(run_dir + "/upload/" + target(url).id + ".json"));
}

/// A run goes up to MLflow and to W&B through each fault mid-upload:
/// `grow(run, 0)`'s part goes up, then the fault, then `grow(run, 1)`'s as
/// the run grows; once the run ends and all is up, `check(server, wandb, run)`.
inline void through_each_fault(const std::function<void(RunFixture&, int half)>& grow,
                               const std::function<void(const TrackingServer&, bool wandb, const RunFixture&)>& check) {
  struct Fault {
    const char* name;
    std::function<void(TrackingServer&)> apply; // not "inject": the CAF test DSL (tests/actors/caf_dsl.hpp) has a macro of that name
  };
  const std::vector<Fault> faults{
      {"500s", [](TrackingServer& s) { s.fail_next(4, {500, "", "", ""}); }},
      {"reset before applied", [](TrackingServer& s) { s.reset_next(3, ResetPoint::after_body); }},
      {"reset after applied", [](TrackingServer& s) { s.reset_next(3, ResetPoint::after_handling); }},
      {"file resets", [](TrackingServer& s) {
         s.reset_next(3, ResetPoint::after_handling, "mlflow-artifacts");
         s.reset_next(3, ResetPoint::after_handling, "wandb-storage");
       }},
      {"outage", [](TrackingServer& s) { s.outage(1500ms); }},
  };
  for (const Fault& f : faults) {
    BOOST_TEST_CONTEXT(f.name) {
      for_each_backend([&](TrackingServer& server, bool wandb) {
        RunFixture run;
        grow(run, -1); // its run.json, before an Uploader reads it
        upload::Uploader up(run.dir(), target(wandb ? wandb_url(server) : mlflow_url(server)), quick());
        BOOST_REQUIRE(!up.open());
        grow(run, 0);
        drain(up, 10s);
        f.apply(server);
        grow(run, 1);
        drain(up, 10s);
        run.write_run_json("finished", 1'700'000'100.0);
        const auto p = drain(up);
        BOOST_REQUIRE_MESSAGE(p.done, p.error);
        check(server, wandb, run);
      });
    }
  }
}

/// A W&B run's history rows by step, checking that there is one row a
/// step, in step order.
inline std::map<std::int64_t, std::string> rows_by_step(const WandbRun& remote) {
  simdjson::dom::parser parser;
  std::map<std::int64_t, std::string> rows;
  std::int64_t last = -1;
  for (const std::string& row : remote.history) {
    simdjson::dom::element doc;
    BOOST_REQUIRE_MESSAGE(parser.parse(row).get(doc) == simdjson::SUCCESS, row);
    const std::int64_t step = doc["_step"].get_int64().value();
    BOOST_TEST(step > last, "step " << step << " after " << last); // one row a step, in order
    last = step;
    rows[step] = row;
  }
  return rows;
}

/// The one MLflow run on the server.
inline MlflowRun only_run(const TrackingServer& s) {
  auto runs = s.mlflow_runs();
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  return runs.front();
}

/// Every key k0..k{keys-1} has exactly the steps [0, steps) once, with the
/// fixture's values. (Several log-batches are in flight at once, so the
/// server may store them in another order than they were logged.)
inline void check_history(const TrackingServer& s, const std::string& run_id, std::int64_t steps, int keys = 3) {
  for (int k = 0; k < keys; ++k) {
    auto points = s.metric_history(run_id, "k" + std::to_string(k));
    std::stable_sort(points.begin(), points.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    BOOST_REQUIRE_EQUAL(points.size(), static_cast<std::size_t>(steps));
    for (std::int64_t i = 0; i < steps; ++i) {
      BOOST_REQUIRE_EQUAL(points[i].step, i);
      BOOST_REQUIRE_EQUAL(points[i].value, static_cast<double>(i * 10 + k));
      BOOST_REQUIRE_EQUAL(points[i].timestamp, 1'700'000'000'000 + i * 250);
    }
  }
}

} // namespace chorus::test
