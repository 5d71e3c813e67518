// The W&B double (wandb_double.hpp): GraphQL, file_stream and storage
// requests read and checked, then applied to the runs.
#include "tests/upload/server/wandb_double.hpp"
#include "tests/upload/server/text.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace chorus::test::server {

namespace {

Answer graphql_error(int status, std::string_view message) {
  return {status, R"({"errors": [{"message": )" + json_quoted(message) + "}]}", "application/json", {}};
}

Answer stream_error(int status, std::string_view message) {
  return {status, R"({"error": )" + json_quoted(message) + "}", "application/json", {}};
}

// A GraphQL variable of string type: absent or null reads as unset.
std::optional<std::string> variable(simdjson::dom::object vars, std::string_view name) {
  const auto e = member(vars, name);
  if (!e) return std::nullopt;
  std::string_view s;
  if (e->get_string().get(s) != simdjson::SUCCESS)
    refuse(200, "", "Variable \"$" + std::string(name) + "\" got invalid value; expected type String");
  return std::string(s);
}

// config must be a JSON object string of {"key": {"value": v}}; summaryMetrics a JSON object string.
void check_json_object(Parsers& p, std::string_view name, const std::string& text, bool config) {
  simdjson::dom::object o;
  if (p.inner.parse(text).get_object().get(o) != simdjson::SUCCESS)
    refuse(200, "", "Variable \"$" + std::string(name) + "\": not a JSON object string");
  if (!config) return;
  for (const auto field : o) {
    simdjson::dom::object wrapped;
    element v;
    if (field.value.get_object().get(wrapped) != simdjson::SUCCESS || wrapped.at_key("value").get(v) != simdjson::SUCCESS)
      refuse(200, "", "config key '" + std::string(field.key) + "' is not shaped {\"value\": ...}");
  }
}

// The run's string fields that an upsertBucket sets, by variable, in the order they are read.
constexpr std::pair<std::string_view, std::string WandbRun::*> string_fields[] = {
    {"groupName", &WandbRun::group}, {"displayName", &WandbRun::display_name}, {"notes", &WandbRun::notes},
    {"config", &WandbRun::config},   {"jobType", &WandbRun::job_type},         {"state", &WandbRun::state},
    {"host", &WandbRun::host},       {"summaryMetrics", &WandbRun::summary_metrics},
};

std::vector<std::string>* line_file(WandbRun& r, const std::string& name) {
  if (name == "wandb-history.jsonl") return &r.history;
  if (name == "wandb-events.jsonl") return &r.events;
  if (name == "output.log") return &r.output;
  return &r.other_files[name];
}

// Checks the whole request, then applies it: lines go at `offset`
// (replacing what is there, so a resend is idempotent); an offset past
// the end is refused; the summary's last line replaces it.
void stream_into(WandbRun& r, const std::string& body, Parsers& p) {
  simdjson::dom::object root;
  if (p.doc.parse(body).get_object().get(root) != simdjson::SUCCESS) invalid("body is not a JSON object");
  struct Update {
    std::string file;
    std::size_t offset = 0;
    std::vector<std::string> lines;
  };
  std::vector<Update> updates;
  if (const auto files = member(root, "files")) {
    simdjson::dom::object fo;
    if (files->get_object().get(fo) != simdjson::SUCCESS) invalid("files is not an object");
    for (const auto f : fo) {
      Update u{std::string(f.key), 0, {}};
      simdjson::dom::object spec;
      if (f.value.get_object().get(spec) != simdjson::SUCCESS) invalid(u.file + " is not an object");
      if (const auto off = member(spec, "offset")) {
        const auto v = as_int64(*off);
        if (!v || *v < 0 || off->is_string()) invalid(u.file + ": offset is not a non-negative integer");
        u.offset = static_cast<std::size_t>(*v);
      }
      if (const auto content = optional_array(spec, "content")) {
        for (const element line : *content) {
          std::string_view s;
          if (line.get_string().get(s) != simdjson::SUCCESS) invalid(u.file + ": content is not an array of strings");
          u.lines.emplace_back(s);
        }
      }
      const bool objects = u.file == "wandb-history.jsonl" || u.file == "wandb-events.jsonl" ||
                           u.file == "wandb-summary.json";
      for (const auto& line : u.lines) {
        simdjson::dom::object o;
        if (objects && p.inner.parse(line).get_object().get(o) != simdjson::SUCCESS)
          invalid(u.file + ": line is not a JSON object: " + line.substr(0, 200));
      }
      if (u.file != "wandb-summary.json") {
        const std::vector<std::string>* lines = line_file(r, u.file);
        if (u.offset > lines->size())
          invalid(u.file + ": offset " + std::to_string(u.offset) + " is past its end (" +
                  std::to_string(lines->size()) + " lines)");
      }
      updates.push_back(std::move(u));
    }
  }
  std::optional<bool> complete;
  if (const auto c = member(root, "complete")) {
    bool b = false;
    if (c->get_bool().get(b) != simdjson::SUCCESS) invalid("complete is not a boolean");
    complete = b;
  }
  std::vector<std::string> uploaded;
  if (const auto names = optional_array(root, "uploaded")) {
    for (const element name : *names) {
      std::string_view s;
      if (name.get_string().get(s) != simdjson::SUCCESS) invalid("uploaded is not an array of strings");
      uploaded.emplace_back(s);
    }
  }
  std::optional<int> exitcode;
  if (const auto e = member(root, "exitcode")) {
    std::int64_t v = 0;
    if (e->get_int64().get(v) != simdjson::SUCCESS || v < INT32_MIN || v > INT32_MAX)
      invalid("exitcode is not an integer");
    exitcode = static_cast<int>(v);
  }
  for (auto& u : updates) {
    if (u.file == "wandb-summary.json") {
      if (!u.lines.empty()) r.summary = u.lines.back();
      continue;
    }
    std::vector<std::string>& lines = *line_file(r, u.file);
    lines.resize(u.offset);
    for (auto& l : u.lines) lines.push_back(std::move(l));
  }
  for (auto& name : uploaded) r.uploaded.push_back(std::move(name));
  if (exitcode) r.exitcode = exitcode;
  if (complete && *complete) {
    r.complete = true;
    r.state = r.exitcode.value_or(0) == 0 ? "finished" : "failed";
  }
}

} // namespace

WandbDouble::WandbDouble(std::string api_key, std::string default_entity, std::size_t max_body)
    : api_key_(std::move(api_key)), default_entity_(std::move(default_entity)), max_body_(max_body) {}

bool WandbDouble::authorized(const Request& req) const {
  const std::string* h = req.header("authorization");
  if (h == nullptr || lower(std::string_view(*h).substr(0, 6)) != "basic ") return false;
  const auto decoded = base64_decode(trim(std::string_view(*h).substr(6)));
  return decoded && *decoded == "api:" + api_key_;
}

WandbDouble::Run* WandbDouble::find(const std::string& entity, const std::string& project, const std::string& name) {
  const auto it = runs_.find({entity, project, name});
  return it == runs_.end() ? nullptr : &it->second;
}

std::string WandbDouble::new_name() {
  static constexpr std::string_view chars = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(chars[rng_() % chars.size()]);
  return s;
}

Answer WandbDouble::graphql(const Request& req, Parsers& p, const std::string& base_url) {
  if (req.method != "POST") return plain(405, "Method Not Allowed");
  if (req.body.size() > max_body_) return graphql_error(413, "request body too large");
  if (!authorized(req)) return graphql_error(401, "user is not logged in");
  simdjson::dom::object root;
  std::string_view query;
  if (p.doc.parse(req.body).get_object().get(root) != simdjson::SUCCESS ||
      root.at_key("query").get_string().get(query) != simdjson::SUCCESS)
    return graphql_error(400, "Must provide query string.");
  const bool files = query.find("createRunFiles") != std::string_view::npos;
  if (!files && query.find("upsertBucket") == std::string_view::npos)
    return graphql_error(200, "this server answers only the upsertBucket and createRunFiles mutations");
  simdjson::dom::object vars;
  if (const auto v = member(root, "variables"); v && v->get_object().get(vars) != simdjson::SUCCESS)
    return graphql_error(200, "variables must be an object");
  if (!member(root, "variables") && p.inner.parse("{}", 2).get_object().get(vars) != simdjson::SUCCESS)
    return plain(500, "simdjson");
  try {
    return files ? create_run_files(vars, base_url) : upsert(vars, p);
  } catch (const Refusal& r) {
    return graphql_error(r.status, r.message);
  }
}

Answer WandbDouble::create_run_files(simdjson::dom::object vars, const std::string& base_url) {
  std::string names[3]; // entity, project, run: String!
  constexpr std::string_view required[] = {"entity", "project", "run"};
  for (int i = 0; i < 3; ++i) {
    const auto v = variable(vars, required[i]);
    if (!v) refuse(200, "", "Variable \"$" + std::string(required[i]) + "\" of required type \"String!\" was not provided.");
    names[i] = *v;
  }
  const auto files = optional_array(vars, "files");
  if (!files) refuse(200, "", "Variable \"$files\" of required type \"[String!]!\" was not provided.");
  std::vector<std::string> wanted;
  for (const element f : *files) {
    std::string_view name;
    if (f.get_string().get(name) != simdjson::SUCCESS || name.empty())
      refuse(200, "", "Variable \"$files\" got invalid value; expected type String!");
    wanted.emplace_back(name);
  }
  Run* run = find(names[0], names[1], names[2]);
  if (run == nullptr) refuse(200, "", "run " + names[0] + "/" + names[1] + "/" + names[2] + " not found");
  std::string out = R"({"data": {"createRunFiles": {"runID": )" + json_quoted(run->run.id) +
                    R"(, "uploadHeaders": ["x-ms-blob-type:BlockBlob"], "files": [)";
  for (std::size_t i = 0; i < wanted.size(); ++i) {
    std::string& sig = run->signatures[wanted[i]];
    if (sig.empty()) sig = new_name() + new_name();
    const std::string url = base_url + "/wandb-storage/" +
                            percent_encode_path(names[0] + "/" + names[1] + "/" + names[2] + "/" + wanted[i]) +
                            "?sig=" + sig;
    out += (i ? ", " : "") + std::string(R"({"name": )") + json_quoted(wanted[i]) + R"(, "uploadUrl": )" +
           json_quoted(url) + "}";
  }
  return json(out + "]}}}");
}

Answer WandbDouble::storage(const Request& req, std::string_view rest) {
  // <entity>/<project>/<run>/<name, which may hold '/'>
  const std::string path = percent_decode(rest, false);
  std::string parts[3];
  std::size_t at = 0;
  for (std::string& part : parts) {
    const std::size_t slash = path.find('/', at);
    if (slash == std::string::npos) return plain(404, "Not Found");
    part = path.substr(at, slash - at);
    at = slash + 1;
  }
  const std::string name = path.substr(at);
  if (req.method != "PUT") return plain(405, "Method Not Allowed");
  Run* run = find(parts[0], parts[1], parts[2]);
  const auto sig = req.query.find("sig");
  if (run == nullptr || name.empty() || sig == req.query.end() || run->signatures[name] != sig->second)
    return plain(403, "AuthenticationFailed: the signature of this upload URL does not match");
  if (req.header("authorization") != nullptr)
    return plain(400, "InvalidAuthenticationInfo: a signed upload URL takes no Authorization header");
  const std::string* blob_type = req.header("x-ms-blob-type");
  if (blob_type == nullptr || trim(*blob_type) != "BlockBlob")
    return plain(400, "MissingRequiredHeader: x-ms-blob-type");
  run->run.files[name] = req.body;
  return {201, "", "text/plain", {}};
}

Answer WandbDouble::upsert(simdjson::dom::object vars, Parsers& p) {
  // Every variable is read (and checked) before anything changes.
  const auto id = variable(vars, "id");
  const auto name_v = variable(vars, "name");
  const auto project_v = variable(vars, "project");
  const auto entity_v = variable(vars, "entity");
  std::vector<std::optional<std::string>> values; // string_fields' variables
  for (const auto& field : string_fields) values.push_back(variable(vars, field.first));
  std::optional<std::vector<std::string>> tags;
  if (const auto t = member(vars, "tags")) {
    simdjson::dom::array a;
    if (t->get_array().get(a) != simdjson::SUCCESS)
      refuse(200, "", "Variable \"$tags\" got invalid value; expected type [String]");
    tags.emplace();
    for (const element e : a) {
      std::string_view s;
      if (e.get_string().get(s) != simdjson::SUCCESS)
        refuse(200, "", "Variable \"$tags\" got invalid value; expected type [String]");
      tags->emplace_back(s);
    }
  }
  // `vars` may live in the inner parser (no variables sent), which these checks reuse: they come last.
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::string_view variable_name = string_fields[i].first;
    if (values[i] && (variable_name == "config" || variable_name == "summaryMetrics"))
      check_json_object(p, variable_name, *values[i], variable_name == "config");
  }

  Run* run = nullptr;
  if (id)
    for (auto& [k, r] : runs_)
      if (r.run.id == *id) run = &r;
  if (run == nullptr) {
    const std::string entity = entity_v && !entity_v->empty() ? *entity_v : default_entity_;
    const std::string project = project_v && !project_v->empty() ? *project_v : "uncategorized";
    const std::string name = name_v && !name_v->empty() ? *name_v : new_name();
    run = find(entity, project, name);
    if (run == nullptr) {
      run = &runs_[{entity, project, name}];
      run->run.entity = entity;
      run->run.project = project;
      run->run.name = name;
      run->run.display_name = name;
      run->run.state = "running";
      run->run.id = base64_encode("Run:v1:" + name + ":" + project + ":" + entity);
    }
  }
  WandbRun& r = run->run;
  const bool created = r.upserts == 0;
  ++r.upserts;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i]) r.*string_fields[i].second = *values[i];
  if (tags) r.tags = *tags;
  std::string out = R"({"data": {"upsertBucket": {"bucket": {"id": )" + json_quoted(r.id) + R"(, "name": )" +
                    json_quoted(r.name) + R"(, "displayName": )" + json_quoted(r.display_name) +
                    R"(, "project": {"name": )" + json_quoted(r.project) + R"(, "entity": {"name": )" + json_quoted(r.entity) +
                    R"(}}, "historyLineCount": )" + std::to_string(r.history.size()) +
                    R"(, "eventsLineCount": )" + std::to_string(r.events.size()) + R"(, "logLineCount": )" +
                    std::to_string(r.output.size()) + R"(}, "inserted": )" + (created ? "true" : "false") + "}}}";
  return json(out);
}

Answer WandbDouble::file_stream(const Request& req, Parsers& p) {
  // /files/<entity>/<project>/<run>/file_stream
  const std::string_view middle = std::string_view(req.path).substr(7, req.path.size() - 7 - 12);
  std::vector<std::string> parts;
  for (std::size_t start = 0; start <= middle.size();) {
    const std::size_t slash = middle.find('/', start);
    const std::size_t end = slash == std::string_view::npos ? middle.size() : slash;
    parts.push_back(percent_decode(middle.substr(start, end - start), false));
    start = end + 1;
  }
  if (parts.size() != 3 || std::any_of(parts.begin(), parts.end(), [](auto& s) { return s.empty(); }))
    return plain(404, "Not Found");
  if (req.method != "POST") return plain(405, "Method Not Allowed");
  if (req.body.size() > max_body_) return stream_error(413, "request body too large");
  if (!authorized(req)) return stream_error(401, "user is not logged in");
  Run* run = find(parts[0], parts[1], parts[2]);
  if (run == nullptr) return stream_error(404, "run " + parts[0] + "/" + parts[1] + "/" + parts[2] + " not found");
  const Clock::time_point now = Clock::now();
  while (!run->recent.empty() && now - run->recent.front() >= std::chrono::seconds(1)) run->recent.pop_front();
  if (rate_limit_ > 0 && run->recent.size() >= rate_limit_) {
    Answer a = stream_error(429, "rate limit exceeded");
    a.headers = {"Retry-After: 1", "RateLimit-Limit: " + std::to_string(rate_limit_), "RateLimit-Remaining: 0",
                 "RateLimit-Reset: 1"};
    return a;
  }
  try {
    stream_into(run->run, req.body, p);
  } catch (const Refusal& r) {
    return stream_error(r.status, r.message);
  }
  run->recent.push_back(now);
  ++run->run.file_stream_requests;
  std::string out = R"({"exitcode": null, "limits": {})";
  if (run->run.stopped) out += R"(, "stopped": true)";
  return json(out + "}");
}

bool WandbDouble::stop(const std::string& entity, const std::string& project, const std::string& name) {
  Run* r = find(entity, project, name);
  if (r == nullptr) return false;
  r->run.stopped = true;
  return true;
}

std::vector<WandbRun> WandbDouble::runs() const {
  std::vector<WandbRun> out;
  for (const auto& [k, r] : runs_) out.push_back(r.run);
  return out;
}

const WandbRun* WandbDouble::run(const std::string& entity, const std::string& project, const std::string& name) const {
  const auto it = runs_.find({entity, project, name});
  return it == runs_.end() ? nullptr : &it->second.run;
}

} // namespace chorus::test::server
