// The MLflow double: MLflow's REST 2.0 calls and proxied artifacts,
// with its checks, limits and error answers, over a store held in memory
// (what it answers: tracking_server.hpp). Not thread-safe: TrackingServer
// serializes the calls.
#pragma once

#include "tests/upload/server/http.hpp"
#include "tests/upload/server/json.hpp"
#include "tests/upload/tracking_server.hpp"

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace chorus::test::server {

// A metric, parameter or tag as a request carries it.
struct MetricIn {
  std::string key;
  double value = 0;
  std::int64_t timestamp = 0, step = 0;
};
struct KeyValue {
  std::string key, value;
};

class MlflowDouble {
public:
  /// `dedup_metrics`: TrackingServer::Options::mlflow_dedup_metrics.
  explicit MlflowDouble(bool dedup_metrics);

  /// /api/2.0/mlflow/<call>.
  Answer call(const Request& req, Parsers& p, std::string_view call);
  /// /api/2.0/mlflow-artifacts/artifacts/<path>: PUT stores a file, GET reads it back.
  Answer artifact(const Request& req, std::string_view raw_path);

  /// A logged key the server refuses (TrackingServer::refuse_key); clear_refused_keys drops them.
  void refuse_key(std::string key);
  void clear_refused_keys();

  [[nodiscard]] const std::vector<MlflowExperiment>& experiments() const { return experiments_; }
  [[nodiscard]] std::vector<MlflowRun> runs() const;
  /// Null for an unknown run.
  [[nodiscard]] const MlflowRun* run(const std::string& id) const;
  /// The run's artifacts: path under its artifact root -> contents.
  [[nodiscard]] std::map<std::string, std::string> artifacts(const std::string& run_id) const;

private:
  struct Run {
    MlflowRun run;
    std::string user_id;
    // Points stored per key, for dedup_metrics: (timestamp, step, value bits).
    std::map<std::string, std::set<std::tuple<std::int64_t, std::int64_t, std::uint64_t>>> seen;
  };
  using Query = std::map<std::string, std::string>;

  void put_experiment(std::string& o, const MlflowExperiment& e) const;
  const MlflowExperiment& find_experiment(const std::string& id) const;
  Run& find_run(const std::string& id);
  std::string new_run_id();
  void log(const std::string& run_id, const std::vector<MetricIn>& metrics, const std::vector<KeyValue>& params,
           const std::vector<KeyValue>& tags);

  // The calls: GET ones read the query, POST ones the body.
  Answer experiment_by_name(const Query& q);
  Answer experiment_by_id(const Query& q);
  Answer create_experiment(simdjson::dom::object o, Parsers& p);
  Answer create_run(simdjson::dom::object o, Parsers& p);
  Answer update_run(simdjson::dom::object o, Parsers& p);
  Answer get_run(const Query& q);
  Answer search_runs(simdjson::dom::object o, Parsers& p);
  Answer log_batch(simdjson::dom::object o, Parsers& p);
  Answer log_metric(simdjson::dom::object o, Parsers& p);
  Answer log_parameter(simdjson::dom::object o, Parsers& p);
  Answer set_tag(simdjson::dom::object o, Parsers& p);
  Answer metric_history(const Query& q);
  Answer list_artifacts(const Query& q);

  const bool dedup_metrics_;
  std::vector<MlflowExperiment> experiments_; // index = id
  std::vector<std::int64_t> experiment_times_;
  std::map<std::string, Run> runs_;
  std::map<std::string, std::string> artifact_files_; // "<exp>/<run>/artifacts/<path>" -> bytes
  std::set<std::string> refused_keys_;
  std::mt19937_64 rng_{std::random_device{}()};
};

} // namespace chorus::test::server
