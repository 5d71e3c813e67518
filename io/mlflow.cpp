// The MLflow backend (REST 2.0, as a 2.10 tracking server answers):
//
//   open    experiment get-or-create (a race with other runs creating it is
//           settled by reading it back); the run this chorus run already
//           has there (runs/search by its chorus.run_id tag), else
//           runs/create with chorus's tags; runs/get of the run already
//           made, whose tags say what the server has;
//   send    config → params (100 a request), history and system lines →
//           log-batch (io/mlflow_points.hpp: 999 metrics and a slot tag a
//           request, several in flight at once), artifacts → the artifact
//           store (streamed from disk), summary → tags, the end state →
//           runs/update.
//
// Exactly once: io/mlflow_spans.hpp. A batch the server refuses (400) is
// split in halves until the refused values are alone; those are recorded in
// upload/<id>.refused.jsonl.
//
// Keys the server would refuse (characters outside [\w./\- ], more than 250
// bytes, '.', '..' or empty path segments) are mapped deterministically to
// `<cleaned>-<hash>`, and the mapping is kept in upload/<id>.keys.json.
#include "io/backends.hpp"
#include "io/json.hpp"
#include "io/mlflow_points.hpp"
#include "io/posix.hpp"
#include "io/run_dir.hpp"
#include "runtime/fnv.hpp"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <unordered_map>

namespace chorus::io::detail {
namespace {

constexpr std::size_t max_params = 100, max_tags = 100;
constexpr std::size_t max_key = 250, max_param_value = 6000, max_tag_value = 5000;

bool key_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-' || c == ' ' || c == '/';
}

/// The key as MLflow takes it: unchanged if valid, else cleaned and suffixed
/// with a hash of the original (so two keys never meet).
std::string clean_key(std::string_view key) {
  std::string out;
  bool changed = false;
  std::size_t start = 0;
  while (start <= key.size()) {
    std::size_t slash = key.find('/', start);
    if (slash == std::string_view::npos) slash = key.size();
    std::string_view seg = key.substr(start, slash - start);
    start = slash + 1;
    if (seg.empty()) {
      changed = true; // a leading, trailing or doubled '/'
      continue;
    }
    if (!out.empty()) out.push_back('/');
    if (seg == "." || seg == "..") {
      out.append(seg.size(), '_');
      changed = true;
      continue;
    }
    for (unsigned char c : seg) {
      if (key_char(c)) {
        out.push_back(static_cast<char>(c));
      } else {
        changed = true;
        if (c < 0x80 || (c & 0xC0) == 0xC0) out.push_back('_'); // one '_' per character, not per byte
      }
    }
  }
  if (out.empty()) changed = true;
  if (!changed && out.size() <= max_key) return out;
  char suffix[10];
  std::snprintf(suffix, sizeof suffix, "-%08x", chorus::detail::fnv1a32(key));
  if (out.size() > max_key - 9) out.resize(max_key - 9);
  while (!out.empty() && out.back() == '/') out.pop_back();
  out += suffix;
  return out;
}

std::string state_status(const std::string& state) {
  if (state == "finished") return "FINISHED";
  if (state == "killed") return "KILLED";
  return "FAILED";
}

class MlflowBackend final : public Backend, MlflowApi {
public:
  MlflowBackend(const UploadTarget& target, HttpClient& http) : target_(target), http_(http) {
    if (const char* t = std::getenv("MLFLOW_TRACKING_TOKEN"); t && *t) {
      auth_header_ = "Authorization: Bearer ";
      auth_header_ += t;
    } else if (const char* u = std::getenv("MLFLOW_TRACKING_USERNAME"); u && *u) {
      user_ = u;
      if (const char* p = std::getenv("MLFLOW_TRACKING_PASSWORD")) password_ = p;
    }
  }

  [[nodiscard]] bool live_summary() const noexcept override { return false; }

  Sent open(const RunSnapshot& run, UploadState& st) override {
    keys_file_ = run.dir + "/upload/" + target_.id + ".keys.json";
    load_keys();
    if (!st.remote_run.empty()) return reopen(run, st);

    // The experiment: get, or create; a 400 RESOURCE_ALREADY_EXISTS means
    // another run made it first: read it again.
    std::string experiment;
    for (int attempt = 0; attempt < 3 && experiment.empty(); ++attempt) {
      HttpResponse r = call("GET", "experiments/get-by-name?experiment_name=" + url_encode(run.project), {});
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
      if (r.status != 404) return failed(r, "reading experiment '" + run.project + "'");
      std::string body;
      JsonWriter(body).begin_object().key("name").string(run.project).end_object();
      r = call("POST", "experiments/create", body);
      if (r.ok()) {
        simdjson::dom::element doc;
        std::string_view id;
        if (parser_.parse(r.body).get(doc) == simdjson::SUCCESS && doc["experiment_id"].get(id) == simdjson::SUCCESS)
          experiment = std::string(id);
        break;
      }
      if (!(r.status == 400 && r.body.find("RESOURCE_ALREADY_EXISTS") != std::string::npos))
        return failed(r, "creating experiment '" + run.project + "'");
    }
    if (experiment.empty()) return refused("could not create or find experiment '" + run.project + "'");

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

    std::string body;
    JsonWriter w(body);
    w.begin_object().key("experiment_id").string(experiment).key("run_name").string(run.name);
    w.key("start_time").integer(run.start_ms).key("tags").begin_array();
    auto tag = [&](std::string_view k, std::string_view v) {
      if (v.empty()) return;
      w.begin_object().key("key").string(k).key("value").string(v.substr(0, max_tag_value)).end_object();
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
      const std::string marker = "-" + std::string(kind) + "-";
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

  Sent send(const RunSnapshot& run, const Batch& b, UploadState& st) override {
    if (b.config) {
      Sent s = send_config(*b.config, st);
      if (s.delivery != Delivery::ok || !s.config) return s;
      if (b.history.empty() && b.system.empty() && b.artifacts.empty() && !b.summary && !b.final) return s;
      Sent rest = send(run, Batch{b.history, b.system, b.history_from, b.system_from, b.history_after, b.system_after,
                                  nullptr, b.summary, b.artifacts, b.final},
                       st);
      rest.config = true;
      return rest;
    }
    if (!b.history.empty() || !b.system.empty()) return points_.send(b, st);
    if (!b.artifacts.empty()) return send_artifact(run, b.artifacts.front(), st);
    Sent s;
    if (b.summary) {
      s = send_summary(*b.summary, st);
      if (s.delivery != Delivery::ok) return s;
    }
    if (b.final) {
      std::string body;
      JsonWriter(body)
          .begin_object()
          .key("run_id")
          .string(st.remote_run)
          .key("status")
          .string(state_status(run.state))
          .key("end_time")
          .integer(run.end_ms)
          .end_object();
      HttpResponse r = call("POST", "runs/update", body);
      if (!r.ok()) {
        Sent f = failed(r, "setting the end state");
        f.summary = s.summary;
        return f;
      }
      s.final = true;
    }
    return s;
  }

private:
  HttpResponse call(const std::string& method, const std::string& path, std::string body) {
    HttpRequest req = request(method, path, std::move(body));
    return perform_capped(http_, req, mlflow_request_cap);
  }

  HttpRequest request(const std::string& method, const std::string& path, std::string body) const override {
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

  void add_credentials(HttpRequest& req) const {
    if (!auth_header_.empty()) req.headers.push_back(auth_header_);
    req.user = user_;
    req.password = password_;
  }

  static Sent failed(const HttpResponse& r, const std::string& what) { return mlflow_failed(r, what); }

  static Sent refused(std::string why) {
    Sent s;
    s.delivery = Delivery::refused;
    s.stop = true;
    s.message = "MLflow: " + why;
    return s;
  }

  /// The run in `experiment` tagged chorus.run_id = run.id, if there is one:
  /// the one that holds uploaded data when several do (an empty one left by
  /// a lost runs/create answer before this check existed), else the oldest.
  Sent find_run(const RunSnapshot& run, const std::string& experiment, std::string& found) {
    std::string body;
    JsonWriter w(body);
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

  Sent reopen(const RunSnapshot& run, UploadState& st) {
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
      JsonWriter(body).begin_object().key("run_id").string(st.remote_run).key("status").string("RUNNING").end_object();
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
    return {};
  }

  // --- keys ---------------------------------------------------------------

  const std::string& map_key(std::string_view key) override {
    auto it = keys_.find(key);
    if (it != keys_.end()) return it->second;
    std::string mapped = clean_key(key);
    auto [pos, fresh] = keys_.emplace(std::string(key), std::move(mapped));
    if (pos->second != key) {
      mapped_.emplace_back(pos->first, pos->second);
      keys_dirty_ = true;
    }
    return pos->second;
  }

  void load_keys() {
    std::string text;
    if (read_text(keys_file_, text, true) || text.empty()) return;
    simdjson::dom::element doc;
    simdjson::dom::object obj;
    if (parser_.parse(text).get(doc) != simdjson::SUCCESS || doc.get(obj) != simdjson::SUCCESS) return;
    for (auto f : obj) {
      std::string_view v;
      if (f.value.get(v) == simdjson::SUCCESS) {
        keys_.emplace(std::string(f.key), std::string(v));
        mapped_.emplace_back(std::string(f.key), std::string(v));
      }
    }
  }

  void save_keys() override {
    if (!keys_dirty_) return;
    std::string out;
    JsonWriter w(out);
    w.begin_object();
    for (const auto& [k, v] : mapped_) w.key(k).string(v);
    w.end_object();
    out.push_back('\n');
    if (!write_file_atomic(keys_file_, out)) keys_dirty_ = false;
  }

  // --- config → params ------------------------------------------------------

  static void flatten(std::string prefix, simdjson::dom::element e, std::vector<std::pair<std::string, std::string>>& out) {
    simdjson::dom::object obj;
    if (e.get(obj) == simdjson::SUCCESS) {
      for (auto f : obj) {
        std::string k = prefix;
        if (!k.empty()) k += '.';
        k.append(f.key);
        flatten(std::move(k), f.value, out);
      }
      return;
    }
    std::string_view s;
    std::string v;
    if (e.get(s) == simdjson::SUCCESS)
      v = std::string(s);
    else
      v = simdjson::minify(e);
    out.emplace_back(std::move(prefix), std::move(v));
  }

  Sent send_config(const std::string& config, UploadState& st) {
    simdjson::dom::element doc;
    Sent s;
    if (parser_.parse(config).get(doc) != simdjson::SUCCESS || !doc.is_object()) {
      s.config = true; // nothing a retry could fix; the file is the user's to mend
      s.message = "MLflow: config.json is not a JSON object; its params were not uploaded";
      return s;
    }
    std::vector<std::pair<std::string, std::string>> flat;
    flatten({}, doc, flat);
    // New params go as params; a changed value (MLflow refuses those) as the tag chorus.param.<key>.
    std::vector<std::pair<std::string, std::string>> params, tags;
    for (auto& [k, v] : flat) {
      std::string key = map_key(k);
      if (v.size() > max_param_value) v.resize(max_param_value);
      auto it = params_sent_.find(key);
      if (it == params_sent_.end())
        params.emplace_back(std::move(key), std::move(v));
      else if (it->second != v)
        tags.emplace_back(clean_key("chorus.param." + key), v.substr(0, max_tag_value));
    }
    save_keys();
    std::size_t pi = 0, ti = 0;
    while (pi < params.size() || ti < tags.size()) {
      std::string body;
      JsonWriter w(body);
      w.begin_object().key("run_id").string(st.remote_run).key("params").begin_array();
      const std::size_t pend = std::min(params.size(), pi + max_params);
      for (std::size_t i = pi; i < pend; ++i)
        w.begin_object().key("key").string(params[i].first).key("value").string(params[i].second).end_object();
      w.end_array().key("tags").begin_array();
      const std::size_t tend = std::min(tags.size(), ti + max_tags);
      for (std::size_t i = ti; i < tend; ++i)
        w.begin_object().key("key").string(tags[i].first).key("value").string(tags[i].second).end_object();
      w.end_array().end_object();
      HttpResponse r = call("POST", "runs/log-batch", body);
      if (!r.ok()) return failed(r, "logging the config as params");
      for (std::size_t i = pi; i < pend; ++i) params_sent_[params[i].first] = params[i].second;
      pi = pend;
      ti = tend;
    }
    s.config = true;
    return s;
  }

  // --- artifacts, summary --------------------------------------------------------

  Sent send_artifact(const RunSnapshot& run, const ArtifactEntry& a, UploadState& st) {
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

  Sent send_summary(const std::string& summary, UploadState& st) {
    Sent s;
    simdjson::dom::element doc;
    simdjson::dom::object obj;
    if (parser_.parse(summary).get(doc) != simdjson::SUCCESS || doc.get(obj) != simdjson::SUCCESS) {
      s.summary = true;
      return s;
    }
    std::vector<std::pair<std::string, std::string>> tags;
    for (auto f : obj) {
      if (f.key.starts_with("_")) continue;
      std::string_view sv;
      std::string v = f.value.get(sv) == simdjson::SUCCESS ? std::string(sv) : simdjson::minify(f.value);
      tags.emplace_back(clean_key("summary." + std::string(f.key)), v.substr(0, max_tag_value));
    }
    for (std::size_t i = 0; i < tags.size(); i += max_tags) {
      std::string body;
      JsonWriter w(body);
      w.begin_object().key("run_id").string(st.remote_run).key("tags").begin_array();
      for (std::size_t j = i; j < std::min(tags.size(), i + max_tags); ++j)
        w.begin_object().key("key").string(tags[j].first).key("value").string(tags[j].second).end_object();
      w.end_array().end_object();
      HttpResponse r = call("POST", "runs/log-batch", body);
      if (!r.ok()) return failed(r, "logging the summary as tags");
    }
    s.summary = true;
    return s;
  }

  UploadTarget target_;
  HttpClient& http_;
  std::string auth_header_, user_, password_;
  simdjson::dom::parser parser_;
  std::string artifact_uri_;
  std::string keys_file_;
  std::map<std::string, std::string, std::less<>> keys_;
  std::vector<std::pair<std::string, std::string>> mapped_;
  bool keys_dirty_ = false;
  MlflowPoints points_{*this, http_, target_.id};
  std::unordered_map<std::string, std::string> params_sent_;
};

} // namespace
} // namespace chorus::io::detail

namespace chorus::io::backends {

// mlflow://, listed in io/CMakeLists.txt: its requests go out a window at a
// time, and its URL takes no path.
BackendSpec mlflow() {
  return {.connections = detail::mlflow_window,
          .path = {},
          .path_variable = {},
          .make = [](const BackendContext& c, Error&) -> std::unique_ptr<Backend> {
            return std::make_unique<detail::MlflowBackend>(c.target, *c.http);
          }};
}

} // namespace chorus::io::backends
