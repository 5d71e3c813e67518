// The MLflow backend's artifacts (io/upload/mlflow_backend.hpp): each file
// of artifacts.jsonl streamed from disk to the server's proxied artifact
// store, one a call.
#include "io/upload/mlflow_backend.hpp"

namespace chorus::io::detail {

Sent MlflowBackend::send_artifact(const RunSnapshot& run, const ArtifactEntry& a, UploadState& st) {
  Sent s;
  if (a.name.empty() || a.name.find("..") != std::string::npos) {
    s.artifacts = 1;
    s.refused.push_back("{\"part\":\"artifacts\",\"why\":\"an artifacts.jsonl line without a valid name\"}");
    return s;
  }
  // artifact_uri is mlflow-artifacts:/<experiment>/<run>/artifacts (the server's proxied store).
  std::string path;
  constexpr std::string_view proxied = "mlflow-artifacts:";
  if (artifact_uri_.starts_with(proxied)) {
    path = artifact_uri_.substr(proxied.size());
    while (path.starts_with("/")) path.erase(0, 1);
  } else {
    path = st.experiment + "/" + st.remote_run + "/artifacts";
  }
  HttpRequest req;
  req.method = "PUT";
  std::string encoded;
  std::size_t start = 0;
  while (start <= a.name.size()) {
    std::size_t slash = a.name.find('/', start);
    if (slash == std::string::npos) slash = a.name.size();
    if (!encoded.empty()) encoded += '/';
    encoded += url_encode(std::string_view(a.name).substr(start, slash - start));
    start = slash + 1;
  }
  req.url = target_.base_url + "/api/2.0/mlflow-artifacts/artifacts/" + path + "/" + encoded;
  req.upload_file = run.dir + "/artifacts/" + a.name;
  add_credentials(req);
  HttpResponse r = perform_capped(http_, req, std::chrono::milliseconds(600'000));
  if (r.status == 0 && r.transport_error.starts_with("cannot read")) {
    s.artifacts = 1;
    s.refused.push_back("{\"part\":\"artifacts\",\"name\":\"" + a.name + "\",\"why\":\"the file is missing\"}");
    s.message = "MLflow artifact " + a.name + ": " + r.transport_error;
    return s;
  }
  if (!r.ok()) {
    Sent f = failed(r, "storing artifact " + a.name);
    if (r.status == 404 || r.status == 501)
      f.message += " (start the server with --serve-artifacts / --artifacts-destination)";
    return f;
  }
  s.artifacts = 1;
  return s;
}

} // namespace chorus::io::detail
