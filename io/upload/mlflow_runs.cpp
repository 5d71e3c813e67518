// The MLflow backend's run (io/upload/mlflow_backend.hpp): its experiment
// got or created, the run found again or created with chorus's tags, taken
// up after a restart (what the server holds, RUNNING again for a resumed
// attempt), and its end state.
#include "io/upload/mlflow_backend.hpp"

#include "runtime/core/json.hpp"

namespace chorus::upload {
namespace {

std::string state_status(const std::string& state) {
  if (state == "finished") return "FINISHED";
  if (state == "killed") return "KILLED";
  return "FAILED";
}

} // namespace

Sent MlflowBackend::open(const RunSnapshot& run, UploadState& st) {
  keys_file_ = run.dir + "/upload/" + target_.id + ".keys.json";
  load_keys();
  if (!st.remote_run.empty()) return reopen(run, st);

  std::string experiment;
  if (Sent s = find_experiment(run.project, experiment); s.delivery != Delivery::ok) return s;

  // A run made before for this chorus run (the server spelled another way,
  // localhost after 127.0.0.1, or a runs/create whose answer was lost) is
  // taken again, so that one chorus run is one MLflow run.
  std::string existing;
  if (Sent s = find_run(run, experiment, existing); s.delivery != Delivery::ok) return s;
  if (!existing.empty()) {
    st.remote_run = existing;
    st.experiment = experiment;
    return reopen(run, st);
  }
  return create_run(run, experiment, st);
}

/// The experiment: get, or create; a 400 RESOURCE_ALREADY_EXISTS means
/// another run made it first: read it again.
Sent MlflowBackend::find_experiment(const std::string& name, std::string& experiment) {
  for (int attempt = 0; attempt < 3 && experiment.empty(); ++attempt) {
    HttpResponse r = call("GET", "experiments/get-by-name?experiment_name=" + url_encode(name), {});
    if (r.ok()) {
      simdjson::dom::element doc;
      std::string_view id;
      if (parser_.parse(r.body).get(doc) == simdjson::SUCCESS &&
          doc["experiment"]["experiment_id"].get(id) == simdjson::SUCCESS)
        experiment = std::string(id);
      else
        return refused("experiments/get-by-name answered without an experiment id");
      break;
    }
    if (r.status != 404) return failed(r, "reading experiment '" + name + "'");
    std::string body;
    core::JsonWriter(body).begin_object().key("name").string(name).end_object();
    r = call("POST", "experiments/create", body);
    if (r.ok()) {
      simdjson::dom::element doc;
      std::string_view id;
      if (parser_.parse(r.body).get(doc) == simdjson::SUCCESS && doc["experiment_id"].get(id) == simdjson::SUCCESS)
        experiment = std::string(id);
      break;
    }
    if (!(r.status == 400 && r.body.find("RESOURCE_ALREADY_EXISTS") != std::string::npos))
      return failed(r, "creating experiment '" + name + "'");
  }
  if (experiment.empty()) return refused("could not create or find experiment '" + name + "'");
  return {};
}

Sent MlflowBackend::create_run(const RunSnapshot& run, const std::string& experiment, UploadState& st) {
  std::string body;
  core::JsonWriter w(body);
  w.begin_object().key("experiment_id").string(experiment).key("run_name").string(run.name);
  w.key("start_time").integer(run.start_ms).key("tags").begin_array();
  auto tag = [&](std::string_view k, std::string_view v) {
    if (v.empty()) return;
    w.begin_object().key("key").string(k).key("value").string(v.substr(0, mlflow_max_tag_value)).end_object();
  };
  tag("mlflow.runName", run.name);
  tag("mlflow.note.content", run.notes);
  tag("chorus.run_id", run.id);
  tag("chorus.group", run.group);
  tag("chorus.mode", run.mode);
  tag("chorus.scope", run.scope);
  tag("chorus.host", run.host);
  tag("chorus.job_type", run.job_type);
  for (std::string_view kind : {"rank", "node"}) {
    // Built by appending to a fresh string: GCC 12's -Wrestrict misfires on
    // "literal" + std::string in a Release build.
    std::string marker("-");
    marker.append(kind).append("-");
    const std::size_t at = run.name.rfind(marker);
    if (at != std::string::npos && at + marker.size() < run.name.size() &&
        run.name.find_first_not_of("0123456789", at + marker.size()) == std::string::npos)
      tag("chorus." + std::string(kind), run.name.substr(at + marker.size()));
  }
  w.end_array().end_object();
  HttpResponse r = call("POST", "runs/create", body);
  if (!r.ok()) return failed(r, "creating the run");
  simdjson::dom::element doc;
  std::string_view run_id, artifact_uri;
  if (parser_.parse(r.body).get(doc) != simdjson::SUCCESS ||
      doc["run"]["info"]["run_id"].get(run_id) != simdjson::SUCCESS)
    return refused("runs/create answered without a run id");
  if (doc["run"]["info"]["artifact_uri"].get(artifact_uri) == simdjson::SUCCESS) artifact_uri_ = artifact_uri;
  st.remote_run = std::string(run_id);
  st.experiment = experiment;
  return {};
}

/// The run in `experiment` tagged chorus.run_id = run.id, if there is one:
/// the one that holds uploaded data when several do (an empty one left by
/// a lost runs/create answer before this check existed), else the oldest.
Sent MlflowBackend::find_run(const RunSnapshot& run, const std::string& experiment, std::string& found) {
  std::string body;
  core::JsonWriter w(body);
  w.begin_object().key("experiment_ids").begin_array().string(experiment).end_array();
  std::string filter = "tags.\"chorus.run_id\" = '";
  for (char c : run.id) filter += c == '\'' ? std::string("\\'") : std::string(1, c);
  filter += "'";
  w.key("filter").string(filter).key("max_results").integer(100).end_object();
  HttpResponse r = call("POST", "runs/search", body);
  if (!r.ok()) return failed(r, "looking for a run already made for " + run.id);
  simdjson::dom::element doc;
  simdjson::dom::array runs;
  if (parser_.parse(r.body).get(doc) != simdjson::SUCCESS) return refused("runs/search answered something that is not JSON");
  if (doc["runs"].get(runs) != simdjson::SUCCESS) return {}; // none: protobuf's JSON leaves out an empty list
  bool found_data = false;
  for (auto candidate : runs) { // newest first
    std::string_view id;
    if (candidate["info"]["run_id"].get(id) != simdjson::SUCCESS) continue;
    simdjson::dom::array metrics;
    const bool data = candidate["data"]["metrics"].get(metrics) == simdjson::SUCCESS && metrics.size() > 0;
    if (found_data && !data) continue;
    found = std::string(id);
    found_data = found_data || data;
  }
  return {};
}

Sent MlflowBackend::reopen(const RunSnapshot& run, UploadState& st) {
  HttpResponse r = call("GET", "runs/get?run_id=" + url_encode(st.remote_run), {});
  if (r.status == 404)
    return refused("run " + st.remote_run + " (from upload/" + target_.id +
                   ".json) is not on the server any more: remove that file to upload the run again as a new run");
  if (!r.ok()) return failed(r, "reading run " + st.remote_run);
  simdjson::dom::element doc;
  if (parser_.parse(r.body).get(doc) != simdjson::SUCCESS) return refused("runs/get answered something that is not JSON");
  std::string_view uri;
  if (doc["run"]["info"]["artifact_uri"].get(uri) == simdjson::SUCCESS) artifact_uri_ = uri;
  // A resumed run (Options::resume) trains again after an earlier
  // attempt's end went up. MLflow keeps a run's status as last set, and
  // takes points for a FINISHED run all the same: so the run is marked
  // RUNNING again, as mlflow.start_run(run_id=...) does, until this
  // attempt's end replaces status and end_time. So is a resumed attempt
  // that ended before any of it went up (synced later): the earlier end
  // does not hold for what is sent now.
  std::string_view status;
  if ((!run.ended || st.earlier_end_delivered()) &&
      doc["run"]["info"]["status"].get(status) == simdjson::SUCCESS && status != "RUNNING") {
    std::string body;
    core::JsonWriter(body).begin_object().key("run_id").string(st.remote_run).key("status").string("RUNNING").end_object();
    if (HttpResponse u = call("POST", "runs/update", body); !u.ok())
      return failed(u, "marking run " + st.remote_run + " RUNNING again for its resumed attempt");
  }
  simdjson::dom::array params;
  if (doc["run"]["data"]["params"].get(params) == simdjson::SUCCESS) {
    for (auto p : params) {
      std::string_view k, v;
      if (p["key"].get(k) == simdjson::SUCCESS && p["value"].get(v) == simdjson::SUCCESS)
        params_sent_[std::string(k)] = std::string(v);
    }
  }
  points_.take_up(doc, run.dir, st);
  take_up_histograms(doc, st);
  take_up_media(doc, st);
  return {};
}

Sent MlflowBackend::send_end(const RunSnapshot& run, const UploadState& st) {
  std::string body;
  core::JsonWriter(body)
      .begin_object()
      .key("run_id")
      .string(st.remote_run)
      .key("status")
      .string(state_status(run.state))
      .key("end_time")
      .integer(run.end_ms)
      .end_object();
  HttpResponse r = call("POST", "runs/update", body);
  if (!r.ok()) return failed(r, "setting the end state");
  return {};
}

} // namespace chorus::upload
