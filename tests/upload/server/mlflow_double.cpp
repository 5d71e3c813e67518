// The MLflow double (mlflow_double.hpp): names checked as MLflow checks
// them, answers written as protobuf's JSON writes them, then the calls.
#include "tests/upload/server/mlflow_double.hpp"
#include "tests/upload/server/text.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>

namespace chorus::test::server {

namespace {

using simdjson::dom::element_type;

// Characters as Python counts them (code points of UTF-8).
std::size_t code_points(std::string_view s) {
  return static_cast<std::size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xc0) != 0x80; }));
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------ reading

// A metric value: a JSON number, or a string that Python's float() reads
// ("NaN", "Infinity", "-Infinity", "1.5").
std::optional<double> as_metric_value(element e) {
  switch (e.type()) {
  case element_type::INT64: return static_cast<double>(checked(e.get_int64()));
  case element_type::UINT64: return static_cast<double>(checked(e.get_uint64()));
  case element_type::DOUBLE: return checked(e.get_double());
  case element_type::STRING: {
    std::string_view s = checked(e.get_string());
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    s = trim(s);
    if (s.starts_with("+")) s.remove_prefix(1);
    double v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc{} || r.ptr != s.data() + s.size() || s.empty()) return std::nullopt;
    return v;
  }
  default: return std::nullopt;
  }
}

MetricIn read_metric(simdjson::dom::object m, const std::string& path) {
  MetricIn out;
  out.key = required_string(m, "key", path + ".key");
  const auto value = member(m, "value");
  if (!value || (value->is_string() && checked(value->get_string()).empty())) missing(path + ".value");
  const auto ts = member(m, "timestamp");
  if (!ts || (ts->is_string() && checked(ts->get_string()).empty())) missing(path + ".timestamp");
  const auto v = as_metric_value(*value);
  if (!v)
    invalid("Got invalid value " + std::string(simdjson::minify(*value)) + " for metric '" + out.key +
            "'. Please specify value as a valid double (64-bit floating point)");
  out.value = *v;
  const auto t = as_int64(*ts);
  if (!t || *t < 0)
    invalid("Got invalid timestamp " + std::string(simdjson::minify(*ts)) + " for metric '" + out.key +
            "'. Timestamp must be a nonnegative long (64-bit integer) ");
  out.timestamp = *t;
  if (const auto step = member(m, "step")) {
    const auto s = as_int64(*step);
    if (!s)
      invalid("Got invalid step " + std::string(simdjson::minify(*step)) + " for metric '" + out.key +
              "'. Step must be a valid long (64-bit integer).");
    out.step = *s;
  }
  return out;
}

std::vector<KeyValue> read_pairs(simdjson::dom::object o, std::string_view list) {
  std::vector<KeyValue> out;
  const auto a = optional_array(o, list);
  if (!a) return out;
  std::size_t i = 0;
  for (const element e : *a) {
    const std::string path = std::string(list) + "[" + std::to_string(i++) + "]";
    simdjson::dom::object kv;
    if (e.get_object().get(kv) != simdjson::SUCCESS) invalid_param(list);
    out.push_back({required_string(kv, "key", path + ".key"), optional_string(kv, "value").value_or("")});
  }
  return out;
}

// A GET call's run: run_id, else the older run_uuid.
const std::string& query_run_id(const std::map<std::string, std::string>& q) {
  auto it = q.find("run_id");
  if (it == q.end() || it->second.empty()) it = q.find("run_uuid");
  if (it == q.end() || it->second.empty()) missing("run_id");
  return it->second;
}

struct Clause {
  bool tag = true; // else attributes.status
  std::string key, value;
};

// runs/search's filter: see MlflowDouble::search_runs.
std::vector<Clause> parse_filter(std::string_view f) {
  std::vector<Clause> out;
  const auto bad = [&] { invalid("Invalid filter '" + std::string(f) + "'"); };
  std::string_view rest = trim(f);
  while (!rest.empty()) {
    Clause c;
    if (rest.starts_with("tags.")) {
      rest.remove_prefix(5);
    } else if (rest.starts_with("attributes.status") || rest.starts_with("attribute.status")) {
      c.tag = false;
      rest.remove_prefix(rest.find('.') + 7);
    } else {
      bad();
    }
    if (c.tag) {
      if (!rest.empty() && (rest.front() == '"' || rest.front() == '`')) {
        const std::size_t close = rest.find(rest.front(), 1);
        if (close == std::string_view::npos) bad();
        c.key = std::string(rest.substr(1, close - 1));
        rest.remove_prefix(close + 1);
      } else {
        std::size_t n = 0;
        while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_' || rest[n] == '.')) ++n;
        if (n == 0) bad();
        c.key = std::string(rest.substr(0, n));
        rest.remove_prefix(n);
      }
    }
    rest = trim(rest);
    if (!rest.starts_with("=") || rest.starts_with("==")) bad();
    rest = trim(rest.substr(1));
    if (rest.empty() || (rest.front() != '\'' && rest.front() != '"')) bad();
    const std::size_t close = rest.find(rest.front(), 1);
    if (close == std::string_view::npos) bad();
    c.value = std::string(rest.substr(1, close - 1));
    rest = trim(rest.substr(close + 1));
    out.push_back(std::move(c));
    if (rest.empty()) break;
    if (rest.size() < 4 || lower(rest.substr(0, 4)) != "and ") bad();
    rest = trim(rest.substr(4));
  }
  return out;
}

// ------------------------------------------------------------ names

// Python's posixpath.normpath.
std::string normpath(std::string_view p) {
  if (p.empty()) return ".";
  int slashes = p.starts_with("/") ? 1 : 0;
  if (p.starts_with("//") && !p.starts_with("///")) slashes = 2;
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (start <= p.size()) {
    const std::size_t slash = p.find('/', start);
    const std::string_view c = p.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    start = slash == std::string_view::npos ? p.size() + 1 : slash + 1;
    if (c.empty() || c == ".") continue;
    if (c != ".." || (slashes == 0 && parts.empty()) || (!parts.empty() && parts.back() == ".."))
      parts.push_back(c);
    else if (!parts.empty())
      parts.pop_back();
  }
  std::string out(static_cast<std::size_t>(slashes), '/');
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.push_back('/');
    out += parts[i];
  }
  return out.empty() ? "." : out;
}

// MLflow's `^[/\w.\- ]*$` (Python's `$` also matches before one final
// newline; non-ASCII counts as a word character, as most of it does in
// Python's Unicode \w).
bool good_key_chars(std::string_view k) {
  if (k.ends_with("\n")) k.remove_suffix(1);
  return std::all_of(k.begin(), k.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x80 || std::isalnum(u) || c == '_' || c == '/' || c == '.' || c == '-' || c == ' ';
  });
}

// MLflow's _validate_{metric,param,tag}_name and the key's length limit.
// `what` is "metric"/"parameter"/"tag", `length_what` "Metric name"/"Param key"/"Tag key".
void check_key(std::string_view what, std::string_view length_what, const std::string& key) {
  const std::string head = "Invalid " + std::string(what) + " name: '" + key + "'. ";
  if (!good_key_chars(key))
    invalid(head + "Names may only contain alphanumerics, underscores (_), dashes (-), periods (.), spaces ( ), "
                   "and slashes (/).");
  const std::string norm = normpath(key);
  if (norm != key || norm == "." || norm.starts_with("..") || norm.starts_with("/"))
    invalid(head + "Names may be treated as files in certain cases, and must not resolve to other names when "
                   "treated as such. This name would resolve to '" + norm + "'");
  if (const std::size_t n = code_points(key); n > 250)
    invalid(std::string(length_what) + " '" + key.substr(0, 250) + "' had length " + std::to_string(n) +
            ", which exceeded length limit of 250");
}

void check_value_length(std::string_view what, const std::string& value, std::size_t limit) {
  if (const std::size_t n = code_points(value); n > limit)
    invalid(std::string(what) + " '" + value.substr(0, 250) + "' had length " + std::to_string(n) +
            ", which exceeded length limit of " + std::to_string(limit));
}

// A tag as runs/create, log-batch and set-tag check it.
void check_tag(const KeyValue& t) {
  check_key("tag", "Tag key", t.key);
  check_value_length("Tag value", t.value, 5000);
}

// Artifact paths may not climb out of their root.
void check_artifact_path(const std::string& path) {
  if (path.starts_with("/") || path.find('\\') != std::string::npos || normpath(path) != path || path.starts_with(".."))
    invalid("Invalid path");
}

// The path a proxied artifact PUT or GET names, as 2.10's
// validate_path_is_safe makes it: percent-decoded again until it stops
// changing (so "%41" is "A" and "%2523" is "#"), refused with a '#' in it,
// and stored under that decoded name.
std::string safe_artifact_path(std::string path) {
  for (int i = 0;; ++i) {
    std::string decoded = percent_decode(path, false);
    if (decoded == path) break;
    if (i == 10) invalid("Failed to decode url");
    path = std::move(decoded);
  }
  if (path.find('#') != std::string::npos) invalid("Invalid path");
  check_artifact_path(path);
  return path;
}

bool known_status(std::string_view s) {
  return s == "RUNNING" || s == "SCHEDULED" || s == "FINISHED" || s == "FAILED" || s == "KILLED";
}

bool good_run_id(std::string_view id) {
  if (id.empty() || id.size() > 256 || !std::isalnum(static_cast<unsigned char>(id[0]))) return false;
  return std::all_of(id.begin(), id.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

std::string artifact_root(const MlflowRun& run) { return run.experiment_id + "/" + run.id + "/artifacts"; }

// ------------------------------------------------------------ answers

Answer mlflow_error(const Refusal& r) {
  std::string body = R"({"error_code": )";
  put_string(body, r.code);
  body += R"(, "message": )";
  put_string(body, r.message);
  body += "}";
  return {r.status, std::move(body), "application/json", {}};
}

// A double as protobuf's JSON writes it: the shortest round-trip form, NaN
// and the infinities as strings.
void put_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "\"NaN\"";
  } else if (std::isinf(v)) {
    out += v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  } else {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
  }
}

void put_run_info(std::string& o, const MlflowRun& run, const std::string& user_id) {
  o += R"({"run_id": )" + json_quoted(run.id) + R"(, "run_uuid": )" + json_quoted(run.id) + R"(, "run_name": )" +
       json_quoted(run.name) + R"(, "experiment_id": )" + json_quoted(run.experiment_id) + R"(, "user_id": )" +
       json_quoted(user_id) + R"(, "status": )" + json_quoted(run.status) +
       R"(, "start_time": )" + std::to_string(run.start_time);
  if (run.end_time) o += R"(, "end_time": )" + std::to_string(*run.end_time);
  o += R"(, "artifact_uri": )" + json_quoted(run.artifact_uri) + R"(, "lifecycle_stage": "active"})";
}

void put_metric(std::string& o, const std::string& key, const MetricPoint& m) {
  o += R"({"key": )" + json_quoted(key) + R"(, "value": )";
  put_double(o, m.value);
  o += R"(, "timestamp": )" + std::to_string(m.timestamp) + R"(, "step": )" + std::to_string(m.step) + "}";
}

// A key-value list, left out when empty (as protobuf's JSON leaves out empty repeated fields).
void put_pairs(std::string& o, std::string_view name, const std::map<std::string, std::string>& kv, bool& first) {
  if (kv.empty()) return;
  o += first ? "" : ", ";
  first = false;
  o += json_quoted(name) + ": [";
  bool f = true;
  for (const auto& [k, v] : kv) {
    o += f ? "" : ", ";
    f = false;
    o += R"({"key": )" + json_quoted(k) + R"(, "value": )" + json_quoted(v) + "}";
  }
  o += "]";
}

// The latest point of a key as the stores pick it: the greatest (step, timestamp, value).
const MetricPoint& latest(const std::vector<MetricPoint>& points) {
  const MetricPoint* best = &points.front();
  for (const MetricPoint& m : points) {
    if (m.step != best->step ? m.step > best->step
                             : m.timestamp != best->timestamp ? m.timestamp > best->timestamp
                                                              : m.value > best->value)
      best = &m;
  }
  return *best;
}

void put_run(std::string& o, const MlflowRun& run, const std::string& user_id) {
  o += R"({"info": )";
  put_run_info(o, run, user_id);
  o += R"(, "data": {)";
  bool first = true;
  if (!run.metrics.empty()) {
    first = false;
    o += R"("metrics": [)";
    bool f = true;
    for (const auto& [key, points] : run.metrics) {
      o += f ? "" : ", ";
      f = false;
      put_metric(o, key, latest(points));
    }
    o += "]";
  }
  put_pairs(o, "params", run.params, first);
  put_pairs(o, "tags", run.tags, first);
  o += R"(}, "inputs": {}})";
}

} // namespace

// ================================================================ the double

MlflowDouble::MlflowDouble(bool dedup_metrics) : dedup_metrics_(dedup_metrics) {
  experiments_.push_back({"0", "Default", "mlflow-artifacts:/0"});
  experiment_times_.push_back(now_ms());
}

Answer MlflowDouble::call(const Request& req, Parsers& p, std::string_view call) {
  using Get = Answer (MlflowDouble::*)(const Query&);
  using Post = Answer (MlflowDouble::*)(simdjson::dom::object, Parsers&);
  struct Route {
    std::string_view call;
    Get get;
    Post post;
  };
  static const Route routes[] = {
      {"experiments/get-by-name", &MlflowDouble::experiment_by_name, nullptr},
      {"experiments/get", &MlflowDouble::experiment_by_id, nullptr},
      {"experiments/create", nullptr, &MlflowDouble::create_experiment},
      {"runs/create", nullptr, &MlflowDouble::create_run},
      {"runs/update", nullptr, &MlflowDouble::update_run},
      {"runs/get", &MlflowDouble::get_run, nullptr},
      {"runs/search", nullptr, &MlflowDouble::search_runs},
      {"runs/log-batch", nullptr, &MlflowDouble::log_batch},
      {"runs/log-metric", nullptr, &MlflowDouble::log_metric},
      {"runs/log-parameter", nullptr, &MlflowDouble::log_parameter},
      {"runs/set-tag", nullptr, &MlflowDouble::set_tag},
      {"metrics/get-history", &MlflowDouble::metric_history, nullptr},
      {"artifacts/list", &MlflowDouble::list_artifacts, nullptr},
  };
  const auto route =
      std::find_if(std::begin(routes), std::end(routes), [&](const Route& r) { return r.call == call; });
  if (route == std::end(routes)) return plain(404, "Not Found");
  try {
    if (route->get != nullptr) {
      if (req.method != "GET") return plain(405, "Method Not Allowed");
      return (this->*route->get)(req.query);
    }
    if (req.method != "POST") return plain(405, "Method Not Allowed");
    const std::string* type = req.header("content-type");
    if (type == nullptr) invalid("Bad Request. Content-Type header is missing.");
    if (lower(trim(std::string_view(*type).substr(0, type->find(';')))) != "application/json")
      invalid("Bad Request. Content-Type must be one of ['application/json'].");
    // As Flask's get_json(silent=True): a body that is no JSON object reads as {}.
    simdjson::dom::object o;
    if (p.doc.parse(req.body).get_object().get(o) != simdjson::SUCCESS)
      if (p.doc.parse("{}", 2).get_object().get(o) != simdjson::SUCCESS) return plain(500, "simdjson");
    return (this->*route->post)(o, p);
  } catch (const Refusal& r) {
    return mlflow_error(r);
  }
}

void MlflowDouble::put_experiment(std::string& o, const MlflowExperiment& e) const {
  const std::string t = std::to_string(experiment_times_[std::stoul(e.id)]);
  o += R"({"experiment_id": )" + json_quoted(e.id) + R"(, "name": )" + json_quoted(e.name) + R"(, "artifact_location": )" +
       json_quoted(e.artifact_location) + R"(, "lifecycle_stage": "active", "last_update_time": )" + t +
       R"(, "creation_time": )" + t + "}";
}

Answer MlflowDouble::experiment_by_name(const Query& q) {
  const auto it = q.find("experiment_name");
  if (it == q.end() || it->second.empty()) missing("experiment_name");
  for (const auto& e : experiments_) {
    if (e.name != it->second) continue;
    std::string o = R"({"experiment": )";
    put_experiment(o, e);
    return json(o + "}");
  }
  refuse(404, "RESOURCE_DOES_NOT_EXIST", "Could not find experiment with name '" + it->second + "'");
}

const MlflowExperiment& MlflowDouble::find_experiment(const std::string& id) const {
  std::size_t index = 0;
  const auto r = std::from_chars(id.data(), id.data() + id.size(), index);
  if (r.ec != std::errc{} || r.ptr != id.data() + id.size() || index >= experiments_.size())
    refuse(404, "RESOURCE_DOES_NOT_EXIST", "No Experiment with id=" + id + " exists");
  return experiments_[index];
}

Answer MlflowDouble::experiment_by_id(const Query& q) {
  const auto it = q.find("experiment_id");
  if (it == q.end() || it->second.empty()) missing("experiment_id");
  std::string o = R"({"experiment": )";
  put_experiment(o, find_experiment(it->second));
  return json(o + "}");
}

Answer MlflowDouble::create_experiment(simdjson::dom::object o, Parsers&) {
  const std::string name = required_string(o, "name");
  const auto location = optional_string(o, "artifact_location");
  (void)optional_array(o, "tags");
  if (code_points(name) > 500) invalid("Experiment name exceeds the maximum length of 500 characters");
  for (const auto& e : experiments_)
    if (e.name == name) refuse(400, "RESOURCE_ALREADY_EXISTS", "Experiment '" + name + "' already exists.");
  const std::string id = std::to_string(experiments_.size());
  experiments_.push_back({id, name, location && !location->empty() ? *location : "mlflow-artifacts:/" + id});
  experiment_times_.push_back(now_ms());
  return json(R"({"experiment_id": )" + json_quoted(id) + "}");
}

MlflowDouble::Run& MlflowDouble::find_run(const std::string& id) {
  if (!good_run_id(id)) invalid("Invalid run ID: '" + id + "'");
  const auto it = runs_.find(id);
  if (it == runs_.end()) refuse(404, "RESOURCE_DOES_NOT_EXIST", "Run '" + id + "' not found");
  return it->second;
}

std::string MlflowDouble::new_run_id() {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng_()),
                static_cast<unsigned long long>(rng_()));
  return buf;
}

Answer MlflowDouble::create_run(simdjson::dom::object o, Parsers&) {
  const std::string experiment_id = optional_string(o, "experiment_id").value_or("0");
  const auto run_name = optional_string(o, "run_name");
  const std::int64_t start_time = optional_int(o, "start_time").value_or(0);
  const std::string user_id = optional_string(o, "user_id").value_or("");
  const std::vector<KeyValue> tags = read_pairs(o, "tags");
  for (const auto& t : tags) check_tag(t);
  const MlflowExperiment& exp = find_experiment(experiment_id.empty() ? "0" : experiment_id);
  Run r;
  r.run.id = new_run_id();
  r.run.experiment_id = exp.id;
  r.run.status = "RUNNING";
  r.run.start_time = start_time;
  r.run.artifact_uri = exp.artifact_location + "/" + r.run.id + "/artifacts";
  r.user_id = user_id;
  for (const auto& t : tags) r.run.tags[t.key] = t.value;
  if (run_name && !run_name->empty())
    r.run.name = *run_name;
  else if (const auto it = r.run.tags.find("mlflow.runName"); it != r.run.tags.end())
    r.run.name = it->second;
  else
    r.run.name = "run-" + std::to_string(runs_.size() + 1);
  r.run.tags["mlflow.runName"] = r.run.name;
  std::string out = R"({"run": )";
  put_run(out, r.run, r.user_id);
  runs_.emplace(r.run.id, std::move(r));
  return json(out + "}");
}

Answer MlflowDouble::update_run(simdjson::dom::object o, Parsers&) {
  const std::string run_id = optional_string(o, "run_id").value_or(optional_string(o, "run_uuid").value_or(""));
  if (run_id.empty()) missing("run_id");
  const auto status = optional_string(o, "status");
  const auto end_time = optional_int(o, "end_time");
  const auto run_name = optional_string(o, "run_name");
  if (status && !known_status(*status)) invalid_param("status");
  Run& r = find_run(run_id);
  if (status) r.run.status = *status;
  if (end_time) r.run.end_time = *end_time;
  if (run_name && !run_name->empty()) {
    r.run.name = *run_name;
    r.run.tags["mlflow.runName"] = *run_name;
  }
  std::string out = R"({"run_info": )";
  put_run_info(out, r.run, r.user_id);
  return json(out + "}");
}

Answer MlflowDouble::get_run(const Query& q) {
  const Run& r = find_run(query_run_id(q));
  std::string out = R"({"run": )";
  put_run(out, r.run, r.user_id);
  return json(out + "}");
}

// runs/search as MLflow 2.10 answers it, for the filters its clients send:
// clauses `tags.<key> = '<value>'` (the key bare, "quoted" or `quoted`)
// and `attributes.status = '<status>'`, joined by AND. Newest run first;
// {"runs": [...], "next_page_token"?}, {} when nothing matches.
Answer MlflowDouble::search_runs(simdjson::dom::object o, Parsers&) {
  std::set<std::string> experiment_ids;
  if (const auto ids = member(o, "experiment_ids")) {
    simdjson::dom::array a;
    if (ids->get_array().get(a) != simdjson::SUCCESS) invalid_param("experiment_ids");
    for (auto e : a) experiment_ids.insert(std::string(checked(e.get_string())));
  }
  const std::int64_t max_results = optional_int(o, "max_results").value_or(1000);
  if (max_results <= 0 || max_results > 50000)
    invalid("Invalid value " + std::to_string(max_results) +
            " for parameter 'max_results' supplied. It must be at most 50000, but got value " +
            std::to_string(max_results));
  const std::string page_token = optional_string(o, "page_token").value_or("");
  std::size_t offset = 0;
  if (!page_token.empty()) {
    auto [end, ec] = std::from_chars(page_token.data(), page_token.data() + page_token.size(), offset);
    if (ec != std::errc() || end != page_token.data() + page_token.size()) invalid("Invalid page token, could not base64-decode");
  }
  const auto clauses = parse_filter(optional_string(o, "filter").value_or(""));
  std::vector<const Run*> found;
  for (const auto& [id, r] : runs_) {
    if (experiment_ids.count(r.run.experiment_id) == 0) continue;
    const bool match = std::all_of(clauses.begin(), clauses.end(), [&](const auto& c) {
      if (c.tag) {
        const auto it = r.run.tags.find(c.key);
        return it != r.run.tags.end() && it->second == c.value;
      }
      return r.run.status == c.value;
    });
    if (match) found.push_back(&r);
  }
  std::sort(found.begin(), found.end(), [](const Run* a, const Run* b) {
    return a->run.start_time != b->run.start_time ? a->run.start_time > b->run.start_time : a->run.id < b->run.id;
  });
  std::string out = "{";
  const std::size_t end = std::min(found.size(), offset + static_cast<std::size_t>(max_results));
  if (offset < end) {
    out += R"("runs": [)";
    for (std::size_t i = offset; i < end; ++i) {
      if (i > offset) out += ", ";
      put_run(out, found[i]->run, found[i]->user_id);
    }
    out += "]";
    if (end < found.size()) out += R"(, "next_page_token": )" + json_quoted(std::to_string(end));
  }
  return json(out + "}");
}

// The stores' log_batch: every check over the whole batch first, then all of it applied.
void MlflowDouble::log(const std::string& run_id, const std::vector<MetricIn>& metrics,
                       const std::vector<KeyValue>& params, const std::vector<KeyValue>& tags) {
  if (!good_run_id(run_id)) invalid("Invalid run ID: '" + run_id + "'");
  for (const auto& m : metrics) check_key("metric", "Metric name", m.key);
  for (const auto& p : params) {
    check_key("parameter", "Param key", p.key);
    check_value_length("Param value", p.value, 6000);
  }
  for (const auto& t : tags) check_tag(t);
  const auto refused = [&](const std::string& key) {
    if (refused_keys_.count(key) != 0) invalid("Invalid key '" + key + "': refused by this server");
  };
  for (const auto& m : metrics) refused(m.key);
  for (const auto& p : params) refused(p.key);
  for (const auto& t : tags) refused(t.key);
  const auto limit = [](std::string_view what, std::size_t limit, std::size_t n) {
    if (n > limit)
      invalid("A batch logging request can contain at most " + std::to_string(limit) + " " + std::string(what) +
              ". Got " + std::to_string(n) + " " + std::string(what) + ". Please split up " + std::string(what) +
              " across multiple requests and try again.");
  };
  limit("metrics", 1000, metrics.size());
  limit("params", 100, params.size());
  limit("tags", 100, tags.size());
  limit("metrics, params, and tags", 1000, metrics.size() + params.size() + tags.size());
  std::set<std::string> param_keys;
  for (const auto& p : params)
    if (!param_keys.insert(p.key).second)
      invalid("Duplicate parameter keys have been submitted: ['" + p.key +
              "']. Please ensure the request contains only one param value per param key.");
  Run& r = find_run(run_id);
  for (const auto& p : params) {
    const auto it = r.run.params.find(p.key);
    if (it != r.run.params.end() && it->second != p.value)
      invalid("Changing param values is not allowed. Param with key='" + p.key + "' was already logged with value='" +
              it->second + "' for run ID='" + run_id + "'. Attempted logging new value '" + p.value + "'.");
  }
  for (const auto& p : params) r.run.params[p.key] = p.value;
  for (const auto& m : metrics) {
    const double max = std::numeric_limits<double>::max();
    const double v = std::isinf(m.value) ? std::copysign(max, m.value) : m.value;
    if (dedup_metrics_) {
      const double canonical = std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : v;
      std::uint64_t bits = 0;
      std::memcpy(&bits, &canonical, sizeof bits);
      if (!r.seen[m.key].emplace(m.timestamp, m.step, bits).second) continue;
    }
    r.run.metrics[m.key].push_back({v, m.timestamp, m.step});
  }
  for (const auto& t : tags) {
    r.run.tags[t.key] = t.value;
    if (t.key == "mlflow.runName") r.run.name = t.value;
  }
}

Answer MlflowDouble::log_batch(simdjson::dom::object o, Parsers&) {
  const std::string run_id = required_string(o, "run_id");
  std::vector<MetricIn> metrics;
  if (const auto a = optional_array(o, "metrics")) {
    std::size_t i = 0;
    for (const element e : *a) {
      simdjson::dom::object m;
      if (e.get_object().get(m) != simdjson::SUCCESS) invalid_param("metrics");
      metrics.push_back(read_metric(m, "metrics[" + std::to_string(i++) + "]"));
    }
  }
  log(run_id, metrics, read_pairs(o, "params"), read_pairs(o, "tags"));
  return json("{}");
}

Answer MlflowDouble::log_metric(simdjson::dom::object o, Parsers&) {
  const std::string run_id = required_string(o, "run_id");
  log(run_id, {read_metric(o, "metric")}, {}, {});
  return json("{}");
}

Answer MlflowDouble::log_parameter(simdjson::dom::object o, Parsers&) {
  const std::string run_id = required_string(o, "run_id");
  log(run_id, {}, {{required_string(o, "key"), optional_string(o, "value").value_or("")}}, {});
  return json("{}");
}

Answer MlflowDouble::set_tag(simdjson::dom::object o, Parsers&) {
  const std::string run_id = required_string(o, "run_id");
  log(run_id, {}, {}, {{required_string(o, "key"), optional_string(o, "value").value_or("")}});
  return json("{}");
}

// page_token: base64 of {"offset": N}, as MLflow's search tokens are.
Answer MlflowDouble::metric_history(const Query& q) {
  const std::string& run_id = query_run_id(q);
  const auto key = q.find("metric_key");
  if (key == q.end() || key->second.empty()) missing("metric_key");
  std::size_t max_results = 0; // 0: all
  if (const auto m = q.find("max_results"); m != q.end() && !m->second.empty()) {
    const auto v = parse_int(m->second);
    if (!v || *v < 0) invalid_param("max_results");
    max_results = static_cast<std::size_t>(*v);
  }
  std::size_t offset = 0;
  if (const auto t = q.find("page_token"); t != q.end() && !t->second.empty()) {
    const auto decoded = base64_decode(t->second);
    std::size_t n = 0;
    const bool ok = decoded && std::sscanf(decoded->c_str(), "{\"offset\": %zu}", &n) == 1 &&
                    *decoded == "{\"offset\": " + std::to_string(n) + "}";
    if (!ok) invalid("Invalid page token, could not base64-decode");
    offset = n;
  }
  const Run& r = find_run(run_id);
  const auto points_it = r.run.metrics.find(key->second);
  static const std::vector<MetricPoint> none;
  const std::vector<MetricPoint>& points = points_it == r.run.metrics.end() ? none : points_it->second;
  const std::size_t begin = std::min(offset, points.size());
  const std::size_t end = max_results == 0 ? points.size() : std::min(points.size(), begin + max_results);
  std::string out = "{";
  if (end > begin) {
    out += R"("metrics": [)";
    for (std::size_t i = begin; i < end; ++i) {
      if (i > begin) out += ", ";
      put_metric(out, key->second, points[i]);
    }
    out += "]";
  }
  if (end < points.size()) {
    out += end > begin ? ", " : "";
    out += R"("next_page_token": )" + json_quoted(base64_encode("{\"offset\": " + std::to_string(end) + "}"));
  }
  return json(out + "}");
}

Answer MlflowDouble::list_artifacts(const Query& q) {
  const std::string& run_id = query_run_id(q);
  const auto p = q.find("path");
  const std::string path = p == q.end() ? "" : p->second;
  if (!path.empty()) check_artifact_path(path);
  const Run& r = find_run(run_id);
  const std::string base = artifact_root(r.run) + "/" + (path.empty() ? "" : path + "/");
  std::map<std::string, std::optional<std::size_t>> entries; // child -> size (nullopt: a directory)
  for (auto f = artifact_files_.lower_bound(base); f != artifact_files_.end() && f->first.starts_with(base); ++f) {
    const std::string_view rest = std::string_view(f->first).substr(base.size());
    const std::size_t slash = rest.find('/');
    if (slash == std::string_view::npos)
      entries[std::string(rest)] = f->second.size();
    else
      entries.emplace(std::string(rest.substr(0, slash)), std::nullopt);
  }
  std::string out = R"({"root_uri": )" + json_quoted(r.run.artifact_uri);
  if (!entries.empty()) {
    out += R"(, "files": [)";
    bool first = true;
    for (const auto& [name, size] : entries) {
      out += first ? "" : ", ";
      first = false;
      out += R"({"path": )" + json_quoted(path.empty() ? name : path + "/" + name);
      out += size ? R"(, "is_dir": false, "file_size": )" + std::to_string(*size) + "}" : R"(, "is_dir": true})";
    }
    out += "]";
  }
  return json(out + "}");
}

Answer MlflowDouble::artifact(const Request& req, std::string_view raw_path) {
  try {
    const std::string path = safe_artifact_path(percent_decode(raw_path, false));
    if (req.method == "PUT") {
      artifact_files_[path] = req.body;
      return json("{}");
    }
    if (req.method != "GET") return plain(405, "Method Not Allowed");
    const auto it = artifact_files_.find(path);
    if (it == artifact_files_.end()) refuse(404, "RESOURCE_DOES_NOT_EXIST", "No such file: '" + path + "'");
    return {200, it->second, "application/octet-stream", {}};
  } catch (const Refusal& r) {
    return mlflow_error(r);
  }
}

// ------------------------------------------------------------ faults and inspection

void MlflowDouble::refuse_key(std::string key) { refused_keys_.insert(std::move(key)); }

void MlflowDouble::clear_refused_keys() { refused_keys_.clear(); }

std::vector<MlflowRun> MlflowDouble::runs() const {
  std::vector<MlflowRun> out;
  for (const auto& [id, r] : runs_) out.push_back(r.run);
  return out;
}

const MlflowRun* MlflowDouble::run(const std::string& id) const {
  const auto it = runs_.find(id);
  return it == runs_.end() ? nullptr : &it->second.run;
}

std::map<std::string, std::string> MlflowDouble::artifacts(const std::string& run_id) const {
  std::map<std::string, std::string> out;
  const MlflowRun* r = run(run_id);
  if (r == nullptr) return out;
  const std::string base = artifact_root(*r) + "/";
  for (auto f = artifact_files_.lower_bound(base); f != artifact_files_.end() && f->first.starts_with(base); ++f)
    out.emplace(f->first.substr(base.size()), f->second);
  return out;
}

} // namespace chorus::test::server
