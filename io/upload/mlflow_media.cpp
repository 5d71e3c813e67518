// The MLflow backend's images, text and tables (io/upload/mlflow_backend.hpp;
// docs/UPLOADS.md, "Images, text and tables"), laid out as MLflow's own
// client lays them out, so that its UI shows them:
//
//   image  images/<column, '/' as '.'>+step+<step>+timestamp+<ms>+<id>.png
//          and ...+compressed.webp beside it (log_image(key=, step=)), the
//          run's tag mlflow.loggedImages = "True";
//   table  tables/<column>/step_<step>.json (log_table's "columns"/"data"
//          form, which chorus's table file already is), listed in the run's
//          tag mlflow.loggedArtifacts as {"path": ..., "type": "table"};
//   text   text/<column>/step_<step>.md (log_text: the text, as it is).
//
// Every name follows from the line (its column, step and time), never from
// chance, so an artifact sent again replaces itself. Exactly once as the
// histograms: a few lines a call, their artifacts first, then one
// log-batch of tags, whose chorus.upload.media records how far media.jsonl
// is delivered; after a lost answer, or on taking up the run again, the
// run's tags say whether it was stored.
#include "io/upload/media_lines.hpp"
#include "io/upload/mlflow_backend.hpp"
#include "runtime/core/fnv.hpp"

#include <cmath>
#include <cstdio>
#include <sys/stat.h>

namespace chorus::upload {
namespace {

constexpr const char* media_tag = "chorus.upload.media"; // "<lines>.<bytes>" of media.jsonl
constexpr const char* logged_images_tag = "mlflow.loggedImages";
constexpr const char* logged_artifacts_tag = "mlflow.loggedArtifacts";
constexpr std::size_t media_a_call = 8;

/// The uuid part of an image's name, made from its column and step: a
/// uuid's shape, its first character a letter past 'f' (as MLflow's client
/// makes its own, so that no '%'-escape can start there), the same each time.
std::string image_id(std::string_view column, std::int64_t step) {
  const std::string seed = std::string(column) + '\n' + std::to_string(step);
  const std::uint64_t hi = chorus::core::fnv1a64(seed), lo = chorus::core::fnv1a64(seed, hi);
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(hi), static_cast<unsigned long long>(lo));
  std::string out;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) out.push_back('-');
    out.push_back(hex[i]);
  }
  out[0] = static_cast<char>('g' + hi % 20);
  return out;
}

/// The artifacts of one media line, under its (MLflow-mapped) column.
std::vector<std::string> artifact_names(const store::MediaLine& m, const std::string& column) {
  const std::string step = std::to_string(m.step);
  if (m.kind == "table") return {"tables/" + column + "/step_" + step + ".json"};
  if (m.kind == "text") return {"text/" + column + "/step_" + step + ".md"};
  // MLflow's UI reads the images/ folder alone, a key's '/' written as '#'; a
  // tracking server refuses '#' in an artifact path, so '.' stands for it.
  std::string flat = column;
  for (char& c : flat)
    if (c == '/') c = '.';
  const auto ms = static_cast<std::int64_t>(std::llround(m.timestamp * 1000.0));
  const std::string stem = "images/" + flat + "+step+" + step + "+timestamp+" + std::to_string(ms) + "+" + image_id(column, m.step);
  return {stem + ".png", stem + "+compressed.webp"};
}

/// mlflow.loggedArtifacts's value, as MLflow's client writes it (Python's json.dumps).
std::string logged_artifacts_value(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out = "[";
  for (const auto& [path, type] : entries) {
    if (out.size() > 1) out += ", ";
    out += "{\"path\": ";
    core::append_json_string(out, path);
    out += ", \"type\": ";
    core::append_json_string(out, type);
    out += '}';
  }
  return out + "]";
}

bool regular_file(const std::string& path) {
  struct stat sb {};
  return ::stat(path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
}

} // namespace

void MlflowBackend::read_logged_artifacts(simdjson::dom::element run) {
  logged_artifacts_.clear();
  const std::optional<std::string_view> value = run_tag(run, logged_artifacts_tag);
  simdjson::dom::parser parser; // `run` lives in parser_
  simdjson::dom::array entries;
  if (!value || parser.parse(value->data(), value->size()).get(entries) != simdjson::SUCCESS) return;
  for (auto e : entries) {
    std::string_view path, type;
    if (e["path"].get(path) == simdjson::SUCCESS && e["type"].get(type) == simdjson::SUCCESS)
      logged_artifacts_.emplace_back(path, type);
  }
}

void MlflowBackend::take_up_media(simdjson::dom::element run, UploadState& st) {
  if (const std::optional<store::Cursor> stored = cursor_tag(run, media_tag); stored && stored->bytes > st.media.bytes)
    st.media = *stored;
  read_logged_artifacts(run);
}

Sent MlflowBackend::send_media(const RunSnapshot& run, const Batch& b, UploadState& st) {
  Sent s;
  if (media_uncertain_) {
    simdjson::dom::element doc;
    if (Sent f = read_run(st, doc); f.delivery != Delivery::ok) return f;
    media_uncertain_ = false;
    read_logged_artifacts(doc);
    // The log-batch whose answer was lost was stored, with its artifacts before it.
    if ((s.media = lines_stored(doc, media_tag, b.media_from, b.media_after)) > 0) return s;
  }
  std::vector<HttpRequest> puts;
  std::vector<std::string> names;
  std::vector<std::pair<std::string, std::string>> listed = logged_artifacts_;
  bool images = false;
  std::size_t n = 0;
  for (; n < b.media.size() && n < media_a_call; ++n) {
    const std::optional<store::MediaLine> line = read_media(parser_, b, n, s.refused);
    if (!line) continue;
    const std::string file = run.dir + "/" + std::string(line->path);
    if (!regular_file(file)) {
      s.refused.push_back(refused_media(*line, "its file under media/ is missing"));
      continue;
    }
    const std::string column = map_key(media_column(*line, run.world_size));
    for (std::string& name : artifact_names(*line, column)) {
      HttpRequest& put = puts.emplace_back(artifact_put(st, name));
      put.upload_file = file;
      if (line->kind == "table") {
        // Listed while the tag has room (MLflow keeps 5000 characters of a tag).
        listed.emplace_back(name, "table");
        if (logged_artifacts_value(listed).size() > mlflow_max_tag_value) listed.pop_back();
      }
      names.push_back(std::move(name));
    }
    images = images || line->kind == "image";
  }
  save_keys();
  if (!s.refused.empty())
    s.message = "MLflow: media.jsonl lines were left out; they are listed in upload/" + target_.id + ".refused.jsonl";
  if (Sent f = put_artifacts(puts, names, mlflow_file_cap); f.delivery != Delivery::ok) return f;

  std::string body;
  core::JsonWriter w(body);
  w.begin_object().key("run_id").string(st.remote_run).key("tags").begin_array();
  w.begin_object().key("key").string(media_tag).key("value").string(encode_cursor(b.media_after[n - 1])).end_object();
  // As MLflow's client sets it: Python's str(True).
  if (images) w.begin_object().key("key").string(logged_images_tag).key("value").string("True").end_object();
  if (listed != logged_artifacts_)
    w.begin_object().key("key").string(logged_artifacts_tag).key("value").string(logged_artifacts_value(listed)).end_object();
  w.end_array().end_object();
  HttpResponse r = call("POST", "runs/log-batch", std::move(body));
  if (!r.ok()) {
    media_uncertain_ = classify(r) != Delivery::refused; // it may be stored: the run's tags say
    return failed(r, "recording the media delivered");
  }
  logged_artifacts_ = std::move(listed);
  s.media = n;
  return s;
}

} // namespace chorus::upload
