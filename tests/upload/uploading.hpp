// What the Uploader tests share: quick retries, pumping an Uploader until
// it is done, and checking that every point arrived once.
#pragma once

#include "io/upload/upload.hpp"
#include "tests/upload/tracking_server.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace chorus::test {

using namespace std::chrono_literals;

inline io::UploadSettings quick() {
  io::UploadSettings s;
  s.backoff_base = 50ms;
  s.backoff_max = 400ms;
  return s;
}

inline io::UploadTarget target(const std::string& url) {
  auto t = io::UploadTarget::parse(url);
  BOOST_REQUIRE_MESSAGE(t, t.error().message());
  return *t;
}

inline std::string mlflow_url(const TrackingServer& s) { return "mlflow://127.0.0.1:" + std::to_string(s.port()); }
inline std::string wandb_url(const TrackingServer& s) { return "wandb+http://127.0.0.1:" + std::to_string(s.port()); }

/// Pumps until done or stopped (or `limit`), sleeping through waits.
inline io::Uploader::Progress drain(io::Uploader& up, std::chrono::milliseconds limit = 30s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  io::Uploader::Progress p;
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
inline io::UploadState upload_all(const std::string& run_dir, const std::string& url,
                                  std::chrono::milliseconds limit = 30s) {
  io::Uploader up(run_dir, target(url), quick());
  BOOST_REQUIRE(!up.open());
  const io::Uploader::Progress p = drain(up, limit);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  return up.state();
}

/// A second Uploader of a run whose upload is done has nothing left to do, and sends nothing.
inline void check_nothing_left(const TrackingServer& server, const std::string& run_dir, const std::string& url) {
  const auto before = server.stats().requests;
  upload_all(run_dir, url);
  BOOST_TEST(server.stats().requests == before);
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
