// The MLflow backend (REST 2.0, as a 2.10 tracking server answers):
//
//   open    experiment get-or-create (a race with other runs creating it is
//           settled by reading it back); the run this chorus run already
//           has there (runs/search by its chorus.run_id tag), else
//           runs/create with chorus's tags; runs/get of the run already
//           made, whose tags say what the server has;
//   send    config → params (100 a request), history and system lines →
//           log-batch (io/upload/mlflow_points.hpp: 999 metrics and a slot tag a
//           request, several in flight at once), histograms → an artifact
//           each and their quantiles as metrics, images, text and tables →
//           the artifact store as MLflow's client lays them out,
//           artifacts → the artifact store (streamed from disk), summary →
//           tags, the end state → runs/update.
//
// Exactly once: io/upload/mlflow_spans.hpp. A batch the server refuses (400) is
// split in halves until the refused values are alone; those are recorded in
// upload/<id>.refused.jsonl.
//
// Keys the server would refuse (characters outside [\w./\- ], more than 250
// bytes, '.', '..' or empty path segments) are mapped deterministically to
// `<cleaned>-<hash>`, and the mapping is kept in upload/<id>.keys.json.
//
// This file: the requests and their credentials, send() (which part of a
// Batch goes first), and the backend's registration; the other parts are
// listed in io/upload/mlflow_backend.hpp.
#include "io/upload/mlflow_backend.hpp"

#include <cstdlib>

namespace chorus::upload {

MlflowBackend::MlflowBackend(const UploadTarget& target, HttpClient& http) : target_(target), http_(http) {
  if (const char* t = std::getenv("MLFLOW_TRACKING_TOKEN"); t && *t) {
    auth_header_ = "Authorization: Bearer ";
    auth_header_ += t;
  } else if (const char* u = std::getenv("MLFLOW_TRACKING_USERNAME"); u && *u) {
    user_ = u;
    if (const char* p = std::getenv("MLFLOW_TRACKING_PASSWORD")) password_ = p;
  }
}

Sent MlflowBackend::send(const RunSnapshot& run, const Batch& b, UploadState& st) {
  if (b.config) {
    Sent s = send_config(*b.config, st);
    if (s.delivery != Delivery::ok || !s.config) return s;
    if (b.history.empty() && b.system.empty() && b.histograms.empty() && b.media.empty() && b.artifacts.empty() &&
        !b.summary && !b.final)
      return s;
    Batch rest = b;
    rest.config = nullptr;
    Sent sent = send(run, rest, st);
    sent.config = true;
    return sent;
  }
  // With several waiting, values, histograms and media take turns.
  const bool waiting[] = {!b.history.empty() || !b.system.empty(), !b.histograms.empty(), !b.media.empty()};
  for (int i = 0; i < 3; ++i) {
    const int part = (turn_ + i) % 3;
    if (!waiting[part]) continue;
    turn_ = (part + 1) % 3;
    if (part == 0) return points_.send(b, st);
    return part == 1 ? send_histograms(b, st) : send_media(run, b, st);
  }
  if (!b.artifacts.empty()) return send_artifact(run, b.artifacts.front(), st);
  Sent s;
  if (b.summary) {
    s = send_summary(*b.summary, st);
    if (s.delivery != Delivery::ok) return s;
  }
  if (b.final) {
    Sent f = send_end(run, st);
    if (f.delivery != Delivery::ok) {
      f.summary = s.summary;
      return f;
    }
    s.final = true;
  }
  return s;
}

HttpResponse MlflowBackend::call(const std::string& method, const std::string& path, std::string body) {
  HttpRequest req = request(method, path, std::move(body));
  return perform_capped(http_, req, mlflow_request_cap);
}

HttpRequest MlflowBackend::request(const std::string& method, const std::string& path, std::string body) const {
  HttpRequest req;
  req.method = method;
  // What stores points or makes runs is sent once; a lost answer is settled by reading back.
  req.idempotent = !(path == "runs/log-batch" || path == "runs/create");
  req.url = target_.base_url + "/api/2.0/mlflow/" + path;
  if (req.method == "POST") req.headers.emplace_back("Content-Type: application/json");
  add_credentials(req);
  req.body = std::move(body);
  return req;
}

void MlflowBackend::add_credentials(HttpRequest& req) const {
  if (!auth_header_.empty()) req.headers.push_back(auth_header_);
  req.user = user_;
  req.password = password_;
}

Sent MlflowBackend::refused(std::string why) {
  Sent s;
  s.delivery = Delivery::refused;
  s.stop = true;
  s.message = "MLflow: " + why;
  return s;
}

namespace backends {

// mlflow://, listed in io/CMakeLists.txt: its log-batches go out a sliding
// window at a time, and its URL takes no path.
BackendSpec mlflow() {
  return {.connections = mlflow_max_window,
          .path = {},
          .path_variable = {},
          .make = [](const BackendContext& c) -> Result<std::unique_ptr<Backend>> {
            return std::unique_ptr<Backend>(std::make_unique<MlflowBackend>(c.target, *c.http));
          }};
}

} // namespace backends

} // namespace chorus::upload
