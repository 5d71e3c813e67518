// The MLflow backend's artifacts and histograms (io/upload/mlflow_backend.hpp):
// each file of artifacts.jsonl streamed from disk to the server's proxied
// artifact store, one a call; each line of histograms.jsonl as an artifact
// (histograms/<column>/step_<step>.json) and its quantiles as metrics
// (<column>/p50, /p90, /p99), a few lines a call (docs/UPLOADS.md).
//
// Exactly once: an artifact PUT again replaces the file with the same
// bytes. The quantiles go in one log-batch at a time, whose tag
// chorus.upload.histograms records how far histograms.jsonl is delivered
// with it: after a lost answer, or on taking up the run again, the run's
// tags say whether that log-batch was stored.
#include "io/store/histogram_log.hpp"
#include "io/upload/mlflow_backend.hpp"
#include "runtime/core/json.hpp"

#include <cfloat>
#include <charconv>
#include <cmath>

namespace chorus::upload {
namespace {

constexpr const char* histograms_tag = "chorus.upload.histograms"; // "<lines>.<bytes>" of histograms.jsonl
constexpr std::size_t histograms_a_call = 8;
constexpr std::pair<double, std::string_view> quantiles[] = {{0.5, "/p50"}, {0.9, "/p90"}, {0.99, "/p99"}};

std::optional<store::Cursor> decode_cursor(std::string_view v) {
  store::Cursor c;
  const char* end = v.data() + v.size();
  auto r = std::from_chars(v.data(), end, c.lines);
  if (r.ec != std::errc() || r.ptr == end || *r.ptr != '.') return std::nullopt;
  r = std::from_chars(r.ptr + 1, end, c.bytes);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return c;
}

/// A bucket's bound as JSON takes it: the outermost buckets reach past the doubles.
double finite_bound(double b) { return std::clamp(b, -DBL_MAX, DBL_MAX); }

/// The artifact of one histogram (docs/UPLOADS.md).
std::string histogram_artifact(const store::HistogramLine& line, const std::string& column) {
  const Histogram& h = line.value;
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("step").integer(line.step).key("timestamp").number(line.timestamp);
  w.key("column").string(column).key("count").uinteger(h.count()).key("sum").number(h.sum());
  const bool finite = h.finite_count() != 0;
  w.key("min");
  finite ? w.number(h.min()) : w.null();
  w.key("max");
  finite ? w.number(h.max()) : w.null();
  w.key("nan").uinteger(h.nan_count()).key("inf").uinteger(h.pos_inf_count()).key("-inf").uinteger(h.neg_inf_count());
  w.key("buckets").begin_array();
  for (const Histogram::Bucket& b : h.buckets())
    w.begin_array().number(finite_bound(b.lo)).number(finite_bound(b.hi)).uinteger(b.count).end_array();
  w.end_array().end_object();
  out.push_back('\n');
  return out;
}

} // namespace

std::string encode_cursor(const store::Cursor& c) { return std::to_string(c.lines) + "." + std::to_string(c.bytes); }

std::optional<std::string_view> run_tag(simdjson::dom::element run, std::string_view tag) {
  simdjson::dom::array tags;
  if (run["run"]["data"]["tags"].get(tags) != simdjson::SUCCESS) return std::nullopt;
  for (auto t : tags) {
    std::string_view k, v;
    if (t["key"].get(k) == simdjson::SUCCESS && k == tag && t["value"].get(v) == simdjson::SUCCESS) return v;
  }
  return std::nullopt;
}

std::optional<store::Cursor> cursor_tag(simdjson::dom::element run, std::string_view tag) {
  const std::optional<std::string_view> v = run_tag(run, tag);
  return v ? decode_cursor(*v) : std::nullopt;
}

std::size_t lines_stored(simdjson::dom::element run, std::string_view tag, store::Cursor from, std::span<const store::Cursor> after) {
  const std::optional<store::Cursor> stored = cursor_tag(run, tag);
  if (!stored || stored->bytes <= from.bytes) return 0;
  for (std::size_t i = 0; i < after.size(); ++i)
    if (after[i] == *stored) return i + 1;
  return 0;
}

Sent MlflowBackend::read_run(const UploadState& st, simdjson::dom::element& run) {
  HttpResponse r = call("GET", "runs/get?run_id=" + url_encode(st.remote_run), {});
  if (!r.ok()) return failed(r, "reading run " + st.remote_run + " back");
  if (parser_.parse(r.body).get(run) != simdjson::SUCCESS) return refused("runs/get answered something that is not JSON");
  return {};
}

Sent MlflowBackend::put_artifacts(std::vector<HttpRequest>& puts, const std::vector<std::string>& names,
                                  std::chrono::milliseconds cap) {
  const std::size_t at_once = std::min(http_.parallel(), mlflow_window);
  for (std::size_t i = 0; i < puts.size(); i += at_once) {
    const std::size_t k = std::min(at_once, puts.size() - i);
    for (HttpRequest& put : std::span(puts).subspan(i, k)) put.timeout = cap;
    const std::vector<HttpResponse> answers = http_.perform_all(std::span(puts).subspan(i, k));
    for (std::size_t j = 0; j < k; ++j)
      if (Sent f = stored_artifact(answers[j], names[i + j]); f.delivery != Delivery::ok) return f;
  }
  return {};
}

HttpRequest MlflowBackend::artifact_put(const UploadState& st, const std::string& name) const {
  HttpRequest put;
  put.method = "PUT";
  put.url = artifact_url(st, name);
  add_credentials(put);
  return put;
}

std::string MlflowBackend::artifact_url(const UploadState& st, std::string_view name) const {
  // artifact_uri is mlflow-artifacts:/<experiment>/<run>/artifacts (the server's proxied store).
  std::string path;
  constexpr std::string_view proxied = "mlflow-artifacts:";
  if (artifact_uri_.starts_with(proxied)) {
    path = artifact_uri_.substr(proxied.size());
    while (path.starts_with("/")) path.erase(0, 1);
  } else {
    path = st.experiment + "/" + st.remote_run + "/artifacts";
  }
  std::string url = target_.base_url + "/api/2.0/mlflow-artifacts/artifacts/" + path;
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t slash = name.find('/', start);
    if (slash == std::string::npos) slash = name.size();
    url += '/';
    url += url_encode(name.substr(start, slash - start));
    start = slash + 1;
  }
  return url;
}

Sent MlflowBackend::stored_artifact(const HttpResponse& r, const std::string& name) {
  if (r.ok()) return {};
  Sent f = failed(r, "storing artifact " + name);
  if (r.status == 404 || r.status == 501) f.message += " (start the server with --serve-artifacts / --artifacts-destination)";
  return f;
}

Sent MlflowBackend::send_artifact(const RunSnapshot& run, const ArtifactEntry& a, UploadState& st) {
  Sent s;
  if (a.name.empty() || a.name.find("..") != std::string::npos) {
    s.artifacts = 1;
    s.refused.push_back("{\"part\":\"artifacts\",\"why\":\"an artifacts.jsonl line without a valid name\"}");
    return s;
  }
  HttpRequest req = artifact_put(st, a.name);
  req.upload_file = run.dir + "/artifacts/" + a.name;
  HttpResponse r = perform_capped(http_, req, mlflow_file_cap);
  if (r.status == 0 && r.transport_error.starts_with("cannot read")) {
    s.artifacts = 1;
    s.refused.push_back("{\"part\":\"artifacts\",\"name\":\"" + a.name + "\",\"why\":\"the file is missing\"}");
    s.message = "MLflow artifact " + a.name + ": " + r.transport_error;
    return s;
  }
  if (Sent f = stored_artifact(r, a.name); f.delivery != Delivery::ok) return f;
  s.artifacts = 1;
  return s;
}

void MlflowBackend::take_up_histograms(simdjson::dom::element run, UploadState& st) {
  // The server stored a log-batch whose answer was lost (or the offsets file is new): take its word.
  if (const std::optional<store::Cursor> stored = cursor_tag(run, histograms_tag); stored && stored->bytes > st.histograms.bytes)
    st.histograms = *stored;
}

Sent MlflowBackend::send_histograms(const Batch& b, UploadState& st) {
  Sent s;
  if (histograms_uncertain_) {
    simdjson::dom::element doc;
    if (Sent f = read_run(st, doc); f.delivery != Delivery::ok) return f;
    histograms_uncertain_ = false;
    // The log-batch whose answer was lost was stored, with its artifacts before it.
    if ((s.histograms = lines_stored(doc, histograms_tag, b.histograms_from, b.histograms_after)) > 0) return s;
  }
  // One line a call after a refusal, until past the lines of the refused log-batch.
  const std::size_t most = st.histograms.bytes < one_by_one_until_.bytes ? 1 : histograms_a_call;
  std::string body;
  core::JsonWriter w(body);
  w.begin_object().key("run_id").string(st.remote_run).key("metrics").begin_array();
  std::vector<HttpRequest> puts;
  std::vector<std::string> names;
  std::vector<std::string> metrics; // "<key>\n<step>\n<value>", for the refused file
  std::size_t n = 0;
  for (; n < b.histograms.size() && n < most; ++n) {
    simdjson::dom::element doc;
    const std::string_view text = b.histograms[n];
    Result<store::HistogramLine> line = Error(Errc::invalid_argument, "a histograms.jsonl line that is not JSON");
    if (parser_.parse(text.data(), text.size()).get(doc) == simdjson::SUCCESS) line = store::read_histogram_line(doc);
    if (!line) {
      std::string bad = "{\"part\":\"histograms\",\"line\":" + std::to_string(b.histograms_from.lines + n) + ",\"why\":";
      core::append_json_string(bad, line.error().message());
      s.refused.push_back(bad + "}");
      continue;
    }
    const std::string column = map_key(line->column());
    names.push_back("histograms/" + column + "/step_" + std::to_string(line->step) + ".json");
    HttpRequest& put = puts.emplace_back(artifact_put(st, names.back()));
    put.body = histogram_artifact(*line, line->column());
    put.headers.emplace_back("Content-Type: application/json");
    const Histogram& h = line->value;
    if (h.count() == h.nan_count()) continue; // no value to rank
    const auto ts = static_cast<std::int64_t>(std::llround(line->timestamp * 1000.0));
    for (const auto& [q, suffix] : quantiles) {
      const std::string& key = map_key(line->column() + std::string(suffix));
      const double v = h.quantile(q);
      w.begin_object().key("key").string(key).key("value").number(v);
      w.key("timestamp").integer(ts).key("step").integer(line->step).end_object();
      std::string m;
      core::JsonWriter(m).begin_object().key("part").string("histograms").key("key").string(key).key("step").integer(line->step)
          .key("value").number(v);
      metrics.push_back(std::move(m));
    }
  }
  save_keys();
  if (Sent f = put_artifacts(puts, names, mlflow_request_cap); f.delivery != Delivery::ok) return f;
  if (!metrics.empty()) {
    w.end_array().key("tags").begin_array();
    w.begin_object().key("key").string(histograms_tag).key("value").string(encode_cursor(b.histograms_after[n - 1]));
    w.end_object().end_array().end_object();
    HttpResponse r = call("POST", "runs/log-batch", std::move(body));
    if (!r.ok() && r.status == 400 && classify(r) == Delivery::refused) {
      if (most > 1) { // find the refused line alone, the lines before it as they were
        one_by_one_until_ = b.histograms_after[n - 1];
        s.refused.clear();
        return s;
      }
      for (std::string& m : metrics) { // each an object still open
        m += ",\"why\":";
        core::append_json_string(m, describe(r));
        s.refused.push_back(m + "}");
      }
      s.refused_points = metrics.size();
      s.message = "MLflow refused a value (" + describe(r) + "); such values are listed in upload/" + target_.id +
                  ".refused.jsonl";
    } else if (!r.ok()) {
      histograms_uncertain_ = true; // it may be stored: the run's tags say, before anything is sent again
      return failed(r, "logging histogram quantiles");
    }
  }
  s.histograms = n;
  return s;
}

} // namespace chorus::upload
