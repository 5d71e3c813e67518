// The loopback tracking server (tracking_server.hpp): the MLflow and W&B
// doubles (server/mlflow_double.hpp, server/wandb_double.hpp) behind the
// HTTP transport (server/http.hpp), which routes each request to its API
// by path. The doubles are not thread-safe; one mutex serializes what the
// connections' threads and the inspection calls do to them.
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/server/http.hpp"
#include "tests/upload/server/mlflow_double.hpp"
#include "tests/upload/server/wandb_double.hpp"

#include <mutex>
#include <string_view>

namespace chorus::test {

namespace {

constexpr std::string_view mlflow_prefix = "/api/2.0/mlflow/";
constexpr std::string_view artifacts_prefix = "/api/2.0/mlflow-artifacts/";
constexpr std::string_view artifact_files_prefix = "/api/2.0/mlflow-artifacts/artifacts/";

bool is_file_stream(std::string_view path) { return path.starts_with("/files/") && path.ends_with("/file_stream"); }
constexpr std::string_view wandb_storage_prefix = "/wandb-storage/";

// What a request is, for ServerStats::by_kind.
std::string kind_of(std::string_view path) {
  if (path.starts_with(mlflow_prefix)) return "mlflow/" + std::string(path.substr(mlflow_prefix.size()));
  if (path.starts_with(artifacts_prefix)) return "mlflow-artifacts";
  if (path == "/graphql") return "wandb/graphql";
  if (is_file_stream(path)) return "wandb/file_stream";
  if (path.starts_with(wandb_storage_prefix)) return "wandb/storage";
  return "other";
}

} // namespace

struct TrackingServer::Impl {
  Options opt;
  mutable std::mutex mu; // the doubles
  server::MlflowDouble mlflow;
  server::WandbDouble wandb;
  server::HttpServer http; // last: its threads, which use the doubles, are joined first

  explicit Impl(Options o)
      : opt(std::move(o)), mlflow(opt.mlflow_dedup_metrics),
        wandb(opt.wandb_api_key, opt.wandb_entity, opt.wandb_max_body),
        http(opt.tls, opt.port, opt.record_requests, {kind_of, [this](const server::Request& req) { return answer(req); }}) {}

  [[nodiscard]] std::string base_url() const {
    return std::string(opt.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(http.port());
  }

  server::Answer answer(const server::Request& req) {
    thread_local server::Parsers parsers; // a connection is a thread: its parsers, reused request after request
    std::lock_guard lk(mu);
    const std::string_view path = req.path;
    if (path.starts_with(mlflow_prefix)) return mlflow.call(req, parsers, path.substr(mlflow_prefix.size()));
    if (path.starts_with(artifact_files_prefix)) return mlflow.artifact(req, path.substr(artifact_files_prefix.size()));
    if (path == "/graphql") return wandb.graphql(req, parsers, base_url());
    if (is_file_stream(path)) return wandb.file_stream(req, parsers);
    if (path.starts_with(wandb_storage_prefix)) return wandb.storage(req, path.substr(wandb_storage_prefix.size()));
    return server::plain(404, "Not Found");
  }
};

TrackingServer::TrackingServer() : TrackingServer(Options{}) {}
TrackingServer::TrackingServer(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
TrackingServer::~TrackingServer() = default;

std::uint16_t TrackingServer::port() const noexcept { return impl_->http.port(); }

std::string TrackingServer::base_url() const { return impl_->base_url(); }

// ---------------------------------------------------------------- faults

void TrackingServer::fail_next(int n, InjectedAnswer answer) { impl_->http.fail_next(n, std::move(answer)); }

void TrackingServer::reset_next(int n, ResetPoint at, std::string path_contains) {
  impl_->http.reset_next(n, at, std::move(path_contains));
}

void TrackingServer::hold_next(int n, std::chrono::milliseconds longest, unsigned release_after,
                               std::string path_contains) {
  impl_->http.hold_next(n, longest, release_after, std::move(path_contains));
}

void TrackingServer::set_delay(std::chrono::milliseconds delay, std::string path_contains) {
  impl_->http.set_delay(delay, std::move(path_contains));
}

void TrackingServer::outage(std::chrono::milliseconds duration) { impl_->http.outage(duration); }

bool TrackingServer::in_outage() const { return impl_->http.in_outage(); }

void TrackingServer::refuse_key(std::string key) {
  std::lock_guard lk(impl_->mu);
  impl_->mlflow.refuse_key(std::move(key));
}

void TrackingServer::set_wandb_rate_limit(unsigned requests_per_second) {
  std::lock_guard lk(impl_->mu);
  impl_->wandb.set_rate_limit(requests_per_second);
}

bool TrackingServer::stop_wandb_run(const std::string& entity, const std::string& project, const std::string& name) {
  std::lock_guard lk(impl_->mu);
  return impl_->wandb.stop(entity, project, name);
}

void TrackingServer::clear_faults() {
  impl_->http.clear_faults();
  std::lock_guard lk(impl_->mu);
  impl_->mlflow.clear_refused_keys();
}

// ---------------------------------------------------------------- inspection

std::vector<MlflowExperiment> TrackingServer::experiments() const {
  std::lock_guard lk(impl_->mu);
  return impl_->mlflow.experiments();
}

std::vector<MlflowRun> TrackingServer::mlflow_runs() const {
  std::lock_guard lk(impl_->mu);
  return impl_->mlflow.runs();
}

std::optional<MlflowRun> TrackingServer::mlflow_run(const std::string& run_id) const {
  std::lock_guard lk(impl_->mu);
  const MlflowRun* run = impl_->mlflow.run(run_id);
  if (run == nullptr) return std::nullopt;
  return *run;
}

std::vector<MetricPoint> TrackingServer::metric_history(const std::string& run_id, const std::string& key) const {
  std::lock_guard lk(impl_->mu);
  const MlflowRun* run = impl_->mlflow.run(run_id);
  if (run == nullptr) return {};
  const auto m = run->metrics.find(key);
  return m == run->metrics.end() ? std::vector<MetricPoint>{} : m->second;
}

std::map<std::string, std::string> TrackingServer::artifacts(const std::string& run_id) const {
  std::lock_guard lk(impl_->mu);
  return impl_->mlflow.artifacts(run_id);
}

std::vector<WandbRun> TrackingServer::wandb_runs() const {
  std::lock_guard lk(impl_->mu);
  return impl_->wandb.runs();
}

std::optional<WandbRun> TrackingServer::wandb_run(const std::string& entity, const std::string& project,
                                                  const std::string& name) const {
  std::lock_guard lk(impl_->mu);
  const WandbRun* run = impl_->wandb.run(entity, project, name);
  if (run == nullptr) return std::nullopt;
  return *run;
}

ServerStats TrackingServer::stats() const { return impl_->http.stats(); }

std::vector<std::string> TrackingServer::authorization_headers() const { return impl_->http.authorization_headers(); }

std::vector<RecordedRequest> TrackingServer::requests() const { return impl_->http.requests(); }

} // namespace chorus::test
