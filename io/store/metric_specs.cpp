#include "io/store/metric_specs.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "runtime/core/json.hpp"
#include "runtime/core/options.hpp"

#include <simdjson.h>

#include <algorithm>

namespace chorus::store {
namespace {

/// `key` as a JSON string, safe in any message.
std::string quoted(std::string_view key) {
  std::string out;
  core::append_json_string(out, key);
  return out;
}

Error damaged(std::string_view key, std::string_view what, std::string_view text) {
  std::string m = "declares ";
  m.append(quoted(key)).append(" with ").append(what).append(" ").append(quoted(text));
  m.append(", which this version of chorus does not know");
  return Error(Errc::invalid_argument, std::move(m));
}

} // namespace

const MetricSpec* MetricSpecs::find(std::string_view key) const {
  auto it = std::find_if(specs.begin(), specs.end(), [&](const auto& s) { return s.first == key; });
  return it == specs.end() ? nullptr : &it->second;
}

void MetricSpecs::set(std::string_view key, MetricSpec spec) {
  auto it = std::find_if(specs.begin(), specs.end(), [&](const auto& s) { return s.first == key; });
  if (it == specs.end())
    specs.emplace_back(std::string(key), std::move(spec));
  else
    it->second = std::move(spec);
}

std::string MetricSpecs::json() const {
  std::string out;
  core::JsonWriter w(out);
  w.begin_object();
  for (const auto& [key, s] : specs) {
    w.key(key).begin_object();
    w.key("reduce").string(to_string(s.reduce));
    w.key("summary").string(to_string(s.summary));
    w.key("step_metric");
    if (s.step_metric.empty())
      w.null();
    else
      w.string(s.step_metric);
    w.end_object();
  }
  w.end_object();
  return out;
}

Result<MetricSpecs> MetricSpecs::parse(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::object doc;
  if (auto e = parser.parse(json.data(), json.size()).get(doc))
    return Error(Errc::invalid_argument, std::string("is not a JSON object (") + simdjson::error_message(e) +
                                             "): it is damaged, or was cut short while being written");
  MetricSpecs out;
  for (auto field : doc) {
    const std::string_view key = field.key;
    simdjson::dom::object o;
    if (field.value.get(o) != simdjson::SUCCESS)
      return Error(Errc::invalid_argument, "holds " + quoted(key) + ", which is not a declaration object");
    MetricSpec s;
    std::string_view text;
    if (o["reduce"].get(text) == simdjson::SUCCESS) {
      const std::optional<Reduce> r = chorus::core::parse_reduce(text);
      if (!r) return damaged(key, "reduce", text);
      s.reduce = *r;
    }
    if (o["summary"].get(text) == simdjson::SUCCESS) {
      const std::optional<Summary> m = chorus::core::parse_summary(text);
      if (!m) return damaged(key, "summary", text);
      s.summary = *m;
    }
    if (o["step_metric"].get(text) == simdjson::SUCCESS) s.step_metric = text;
    out.set(key, std::move(s));
  }
  return out;
}

Result<MetricSpecs> MetricSpecs::read(const std::string& run_dir) {
  const std::string path = run_dir + "/metrics.json";
  Result<std::string> text = platform::read_text(path, true);
  if (!text) return text.error();
  if (text->empty()) return MetricSpecs{};
  Result<MetricSpecs> specs = parse(*text);
  if (!specs)
    return Error(Errc::invalid_argument, path + " " + specs.error().message() + ". chorus recover " + run_dir +
                                             " rebuilds it from the run's write-ahead log");
  return specs;
}

} // namespace chorus::store
