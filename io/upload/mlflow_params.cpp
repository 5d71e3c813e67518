// The MLflow backend's params and tags (io/upload/mlflow_backend.hpp):
// config.json flattened into params (a changed value, which MLflow refuses,
// as the tag chorus.param.<key>), summary.json into summary.<key> tags.
#include "io/upload/mlflow_backend.hpp"

#include "runtime/core/json.hpp"

#include <algorithm>

namespace chorus::upload {
namespace {

void flatten(std::string prefix, simdjson::dom::element e, std::vector<std::pair<std::string, std::string>>& out) {
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

/// `pairs` [from, to) as a JSON array of {"key", "value"} objects.
void write_pairs(core::JsonWriter& w, const std::vector<std::pair<std::string, std::string>>& pairs, std::size_t from,
                 std::size_t to) {
  w.begin_array();
  for (std::size_t i = from; i < to; ++i)
    w.begin_object().key("key").string(pairs[i].first).key("value").string(pairs[i].second).end_object();
  w.end_array();
}

} // namespace

Sent MlflowBackend::send_config(const std::string& config, UploadState& st) {
  simdjson::dom::element doc;
  Sent s;
  if (parser_.parse(config).get(doc) != simdjson::SUCCESS || !doc.is_object()) {
    s.config = true; // nothing a retry could fix; the file is the user's to mend
    s.message = "MLflow: config.json is not a JSON object; its params were not uploaded";
    return s;
  }
  Pairs flat;
  flatten({}, doc, flat);
  // New params go as params; a changed value (MLflow refuses those) as the tag chorus.param.<key>.
  Pairs params, tags;
  for (auto& [k, v] : flat) {
    std::string key = map_key(k);
    if (v.size() > mlflow_max_param_value) v.resize(mlflow_max_param_value);
    auto it = params_sent_.find(key);
    if (it == params_sent_.end())
      params.emplace_back(std::move(key), std::move(v));
    else if (it->second != v)
      tags.emplace_back(mlflow_clean_key("chorus.param." + key), v.substr(0, mlflow_max_tag_value));
  }
  save_keys();
  s = log_params_and_tags(st, &params, tags, "logging the config as params");
  if (s.delivery == Delivery::ok) s.config = true;
  return s;
}

Sent MlflowBackend::send_summary(const std::string& summary, UploadState& st) {
  Sent s;
  simdjson::dom::element doc;
  simdjson::dom::object obj;
  if (parser_.parse(summary).get(doc) != simdjson::SUCCESS || doc.get(obj) != simdjson::SUCCESS) {
    s.summary = true;
    return s;
  }
  Pairs tags;
  for (auto f : obj) {
    if (f.key.starts_with("_")) continue;
    std::string_view sv;
    std::string v = f.value.get(sv) == simdjson::SUCCESS ? std::string(sv) : simdjson::minify(f.value);
    tags.emplace_back(mlflow_clean_key("summary." + std::string(f.key)), v.substr(0, mlflow_max_tag_value));
  }
  s = log_params_and_tags(st, nullptr, tags, "logging the summary as tags");
  if (s.delivery == Delivery::ok) s.summary = true;
  return s;
}

Sent MlflowBackend::log_params_and_tags(const UploadState& st, const Pairs* params, const Pairs& tags,
                                        const std::string& what) {
  const std::size_t n = params ? params->size() : 0;
  std::size_t pi = 0, ti = 0;
  while (pi < n || ti < tags.size()) {
    std::string body;
    core::JsonWriter w(body);
    w.begin_object().key("run_id").string(st.remote_run);
    const std::size_t pend = std::min(n, pi + mlflow_max_params);
    if (params) write_pairs(w.key("params"), *params, pi, pend);
    const std::size_t tend = std::min(tags.size(), ti + mlflow_max_tags);
    write_pairs(w.key("tags"), tags, ti, tend);
    w.end_object();
    HttpResponse r = call("POST", "runs/log-batch", body);
    if (!r.ok()) return failed(r, what);
    for (std::size_t i = pi; i < pend; ++i) params_sent_[(*params)[i].first] = (*params)[i].second;
    pi = pend;
    ti = tend;
  }
  return {};
}

} // namespace chorus::upload
