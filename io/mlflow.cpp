// The MLflow backend (REST 2.0, ../shared/BACKENDS.md):
//
//   open    experiment get-or-create (a race with other runs creating it is
//           settled by reading it back), runs/create with chorus's tags, or
//           runs/get of the run already made, whose offset tag says what the
//           server has;
//   send    config → params (100 a request), history and system lines →
//           log-batch (999 metrics and the offset tag, within the 1000
//           entries a request), artifacts → the artifact store (streamed),
//           summary → tags, the end state → runs/update.
//
// Exactly once: every log-batch carries the tag chorus.upload.offset, the
// position in the run directory just past its last metric, so that the
// server keeps, with the points themselves, how far it got. After a crash
// between the server's answer and the local offsets file, open() takes the
// server's word. A batch the server refuses (400) is split in halves until
// the refused values are alone; those are recorded in upload/<id>.refused.jsonl.
//
// Keys the server would refuse (characters outside [\w./\- ], more than 250
// bytes, '.', '..' or empty path segments) are mapped deterministically to
// `<cleaned>-<hash>`, and the mapping is kept in upload/<id>.keys.json.
#include "io/backends.hpp"
#include "io/json.hpp"
#include "io/posix.hpp"
#include "io/run_dir.hpp"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <unordered_map>

namespace chorus::io::detail {
namespace {

constexpr std::size_t max_metrics = 999; // + the offset tag = MLflow's 1000 entries
constexpr std::size_t max_params = 100, max_tags = 100;
constexpr std::size_t max_key = 250, max_param_value = 6000, max_tag_value = 5000;
constexpr const char* offset_tag = "chorus.upload.offset";
constexpr std::chrono::milliseconds request_cap{30'000};

std::uint32_t fnv32(std::string_view s) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

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
  std::snprintf(suffix, sizeof suffix, "-%08x", fnv32(key));
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

/// "h=<lines>.<bytes>.<part>;s=<lines>.<bytes>.<part>"
std::string encode_offset(Cursor h, std::uint64_t hp, Cursor s, std::uint64_t sp) {
  return "h=" + std::to_string(h.lines) + "." + std::to_string(h.bytes) + "." + std::to_string(hp) +
         ";s=" + std::to_string(s.lines) + "." + std::to_string(s.bytes) + "." + std::to_string(sp);
}

bool decode_offset(std::string_view v, Cursor& h, std::uint64_t& hp, Cursor& s, std::uint64_t& sp) {
  auto three = [](std::string_view part, Cursor& c, std::uint64_t& p) {
    std::uint64_t n[3];
    const char* at = part.data();
    const char* end = part.data() + part.size();
    for (int i = 0; i < 3; ++i) {
      auto r = std::from_chars(at, end, n[i]);
      if (r.ec != std::errc()) return false;
      at = r.ptr;
      if (i < 2) {
        if (at == end || *at != '.') return false;
        ++at;
      }
    }
    if (at != end) return false;
    c = {n[0], n[1]};
    p = n[2];
    return true;
  };
  const std::size_t semi = v.find(';');
  if (!v.starts_with("h=") || semi == std::string_view::npos || v.substr(semi + 1, 2) != "s=") return false;
  return three(v.substr(2, semi - 2), h, hp) && three(v.substr(semi + 3), s, sp);
}

bool after(Cursor a, std::uint64_t ap, Cursor b, std::uint64_t bp) {
  return a.bytes > b.bytes || (a.bytes == b.bytes && ap > bp);
}

/// One metric to send, and where it sits in the run directory.
struct Point {
  std::string key; // mapped
  double value;
  std::int64_t ts_ms;
  std::int64_t step;
  bool history;     // else system
  std::size_t line; // index in the Batch's slice
  std::uint64_t index; // value index within its line
};

class MlflowBackend final : public Backend {
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

  Sent open(const RunSnapshot& run, UploadState& st, SteadyTime deadline) override {
    keys_file_ = run.dir + "/upload/" + target_.id + ".keys.json";
    load_keys();
    if (!st.remote_run.empty()) return reopen(run, st, deadline);

    // The experiment: get, or create; a 400 RESOURCE_ALREADY_EXISTS means
    // another run made it first: read it again.
    std::string experiment;
    for (int attempt = 0; attempt < 3 && experiment.empty(); ++attempt) {
      HttpResponse r = call("GET", "experiments/get-by-name?experiment_name=" + url_encode(run.project), {}, deadline);
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
      r = call("POST", "experiments/create", body, deadline);
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
    HttpResponse r = call("POST", "runs/create", body, deadline);
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
      Sent s = send_config(*b.config, st, b.deadline);
      if (s.delivery != Delivery::ok || !s.config) return s;
      if (b.history.empty() && b.system.empty() && b.artifacts.empty() && !b.summary && !b.final) return s;
      Sent rest = send(run, Batch{b.history, b.system, b.history_from, b.system_from, b.history_after, b.system_after,
                                  nullptr, b.summary, b.artifacts, b.final, b.deadline},
                       st);
      rest.config = true;
      return rest;
    }
    if (!b.history.empty() || !b.system.empty()) return send_points(b, st);
    if (!b.artifacts.empty()) return send_artifact(run, b.artifacts.front(), st, b.deadline);
    Sent s;
    if (b.summary) {
      s = send_summary(*b.summary, st, b.deadline);
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
      HttpResponse r = call("POST", "runs/update", body, b.deadline);
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
  HttpResponse call(const std::string& method, const std::string& path, std::string body, SteadyTime deadline) {
    HttpRequest req;
    req.method = method;
    // What stores points or makes runs is sent once; a lost answer is settled by reading back.
    req.idempotent = !(path == "runs/log-batch" || path == "runs/create");
    req.url = target_.base_url + "/api/2.0/mlflow/" + path;
    return perform(std::move(req), std::move(body), deadline);
  }

  HttpResponse perform(HttpRequest req, std::string body, SteadyTime deadline) {
    if (req.method == "POST") req.headers.emplace_back("Content-Type: application/json");
    if (!auth_header_.empty()) req.headers.push_back(auth_header_);
    req.user = user_;
    req.password = password_;
    req.body = std::move(body);
    return perform_until(http_, req, deadline, request_cap);
  }

  static Sent failed(const HttpResponse& r, const std::string& what) {
    return not_delivered(r, "MLflow", what, "set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD");
  }

  static Sent refused(std::string why) {
    Sent s;
    s.delivery = Delivery::refused;
    s.stop = true;
    s.message = "MLflow: " + why;
    return s;
  }

  Sent reopen(const RunSnapshot& run, UploadState& st, SteadyTime deadline) {
    HttpResponse r = call("GET", "runs/get?run_id=" + url_encode(st.remote_run), {}, deadline);
    if (r.status == 404)
      return refused("run " + st.remote_run + " (from upload/" + target_.id +
                     ".json) is not on the server any more: remove that file to upload the run again as a new run");
    if (!r.ok()) return failed(r, "reading run " + st.remote_run);
    simdjson::dom::element doc;
    if (parser_.parse(r.body).get(doc) != simdjson::SUCCESS) return refused("runs/get answered something that is not JSON");
    std::string_view uri;
    if (doc["run"]["info"]["artifact_uri"].get(uri) == simdjson::SUCCESS) artifact_uri_ = uri;
    simdjson::dom::array tags, params;
    Cursor h = st.history, s = st.system;
    std::uint64_t hp = st.history_part, sp = st.system_part;
    if (doc["run"]["data"]["tags"].get(tags) == simdjson::SUCCESS) {
      for (auto t : tags) {
        std::string_view k, v;
        if (t["key"].get(k) != simdjson::SUCCESS || t["value"].get(v) != simdjson::SUCCESS || k != offset_tag) continue;
        if (!decode_offset(v, h, hp, s, sp)) h = st.history, hp = st.history_part, s = st.system, sp = st.system_part;
      }
    }
    if (doc["run"]["data"]["params"].get(params) == simdjson::SUCCESS) {
      for (auto p : params) {
        std::string_view k, v;
        if (p["key"].get(k) == simdjson::SUCCESS && p["value"].get(v) == simdjson::SUCCESS)
          params_sent_[std::string(k)] = std::string(v);
      }
    }
    // The server got a batch whose answer was lost: take its word, and count
    // what it got as delivered (after the last use of `doc`: counting parses).
    if (after(h, hp, st.history, st.history_part)) {
      st.points += values_between(run.dir + "/history.jsonl", st.history, st.history_part, h, hp);
      st.history = h, st.history_part = hp;
    }
    if (after(s, sp, st.system, st.system_part)) {
      st.points += values_between(run.dir + "/system.jsonl", st.system, st.system_part, s, sp);
      st.system = s, st.system_part = sp;
    }
    return {};
  }

  /// The values of a JSON-lines file from one position (cursor and values
  /// of its line already counted) to another, as gather() counts them.
  std::uint64_t values_between(const std::string& path, Cursor from, std::uint64_t from_part, Cursor to,
                               std::uint64_t to_part) {
    std::uint64_t n = 0;
    LineSlice slice;
    while (from.bytes < to.bytes) {
      if (read_lines(path, from, 1u << 20, slice) || slice.lines.empty()) return n;
      for (std::size_t i = 0; i < slice.lines.size() && from.bytes < to.bytes; ++i) {
        const std::uint64_t v = count_values(slice.lines[i]);
        n += v - std::min(v, from_part);
        from_part = 0;
        from = slice.after[i];
      }
    }
    return n + (to_part > from_part ? to_part - from_part : 0);
  }

  // --- keys ---------------------------------------------------------------

  const std::string& map_key(std::string_view key) {
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

  void save_keys() {
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

  Sent send_config(const std::string& config, UploadState& st, SteadyTime deadline) {
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
      HttpResponse r = call("POST", "runs/log-batch", body, deadline);
      if (!r.ok()) return failed(r, "logging the config as params");
      for (std::size_t i = pi; i < pend; ++i) params_sent_[params[i].first] = params[i].second;
      pi = pend;
      ti = tend;
    }
    s.config = true;
    return s;
  }

  // --- history and system → metrics --------------------------------------------

  /// Reads up to max_metrics points from the Batch, history first.
  void gather(const Batch& b, const UploadState& st, std::vector<Point>& points, std::vector<std::string>& bad) {
    std::size_t metrics = 0; // points to send; the end-of-line markers are not sent and not counted
    auto take = [&](std::span<const std::string_view> lines, Cursor from, bool history, std::uint64_t part) {
      for (std::size_t i = 0; i < lines.size() && metrics < max_metrics; ++i) {
        simdjson::dom::element doc;
        simdjson::dom::object obj;
        if (parser_.parse(lines[i].data(), lines[i].size()).get(doc) != simdjson::SUCCESS ||
            doc.get(obj) != simdjson::SUCCESS) {
          std::string line = "{\"part\":\"";
          line += history ? "history" : "system";
          line += "\",\"line\":" + std::to_string(from.lines + i) + ",\"why\":\"not a JSON object\"}";
          bad.push_back(std::move(line));
          points.push_back(Point{{}, 0, 0, 0, history, i, ~std::uint64_t{0}}); // a marker that consumes the line
          continue;
        }
        double ts = 0;
        if (obj["_timestamp"].get(ts) != simdjson::SUCCESS) ts = 0;
        std::int64_t step = static_cast<std::int64_t>(from.lines + i);
        std::int64_t logged_step = 0;
        if (history && obj["_step"].get(logged_step) == simdjson::SUCCESS) step = logged_step;
        std::uint64_t index = 0;
        for (auto f : obj) {
          if (f.key.starts_with("_")) continue;
          double v;
          std::string_view s;
          if (f.value.get(v) != simdjson::SUCCESS) {
            if (f.value.get(s) != simdjson::SUCCESS) continue;
            if (s == "NaN") v = std::nan("");
            else if (s == "Infinity") v = HUGE_VAL;
            else if (s == "-Infinity") v = -HUGE_VAL;
            else continue;
          }
          const std::uint64_t at = index++;
          if (i == 0 && at < part) continue; // sent before
          std::string key;
          if (!history && f.key.starts_with("system.")) {
            key = "system/";
            key.append(f.key.substr(7));
          } else {
            key = std::string(f.key);
          }
          points.push_back(Point{map_key(key), v, static_cast<std::int64_t>(std::llround(ts * 1000.0)), step, history, i, at});
          if (++metrics >= max_metrics) return;
        }
        // A line whose every value fitted: a marker so the line counts as consumed even with no values.
        points.push_back(Point{{}, 0, 0, 0, history, i, ~std::uint64_t{0}});
      }
    };
    take(b.history, b.history_from, true, st.history_part);
    if (metrics < max_metrics) take(b.system, b.system_from, false, st.system_part);
  }

  /// Where the run directory stands after points[0..end).
  struct Position {
    Cursor history, system;
    std::uint64_t history_part, system_part;
    std::size_t history_lines = 0, system_lines = 0; // whole lines consumed in this Batch
  };
  Position position(const Batch& b, const UploadState& st, const std::vector<Point>& points, std::size_t end) const {
    Position p{st.history, st.system, st.history_part, st.system_part};
    for (std::size_t i = 0; i < end; ++i) {
      const Point& pt = points[i];
      if (pt.index == ~std::uint64_t{0}) { // end of line
        if (pt.history) {
          p.history = b.history_after[pt.line];
          p.history_part = 0;
          p.history_lines = pt.line + 1;
        } else {
          p.system = b.system_after[pt.line];
          p.system_part = 0;
          p.system_lines = pt.line + 1;
        }
      } else if (pt.history) {
        p.history_part = pt.index + 1;
      } else {
        p.system_part = pt.index + 1;
      }
    }
    return p;
  }

  /// After a log-batch whose answer did not come (or was an error the
  /// server may still have acted on), the server's offset tag says whether
  /// it stored the batch: what it has is counted as delivered, not sent again.
  Sent reconcile(const Batch& b, UploadState& st) {
    Sent s;
    HttpResponse r = call("GET", "runs/get?run_id=" + url_encode(st.remote_run), {}, b.deadline);
    if (!r.ok()) return failed(r, "reading run " + st.remote_run + " back");
    uncertain_ = false;
    simdjson::dom::element doc;
    simdjson::dom::array tags;
    if (parser_.parse(r.body).get(doc) != simdjson::SUCCESS || doc["run"]["data"]["tags"].get(tags) != simdjson::SUCCESS)
      return s;
    for (auto t : tags) {
      std::string_view k, v;
      if (t["key"].get(k) != simdjson::SUCCESS || t["value"].get(v) != simdjson::SUCCESS || k != offset_tag) continue;
      Cursor h, y;
      std::uint64_t hp = 0, yp = 0;
      if (!decode_offset(v, h, hp, y, yp)) break;
      // The values the server has beyond our offsets count as delivered.
      auto skip = [&](Cursor server, std::uint64_t server_part, Cursor from, std::span<const std::string_view> lines,
                      std::span<const Cursor> after, std::uint64_t& part, std::size_t& consumed) {
        if (!(server.bytes > from.bytes || (server.bytes == from.bytes && server_part > part))) return;
        std::size_t n = 0;
        while (n < after.size() && after[n].bytes <= server.bytes) ++n;
        const std::uint64_t new_part = (n > 0 ? after[n - 1].bytes : from.bytes) == server.bytes ? server_part : 0;
        std::uint64_t values = 0;
        for (std::size_t i = 0; i < n; ++i) values += count_values(lines[i]);
        values += new_part;
        s.points += values - std::min(values, part);
        consumed = n;
        part = new_part;
      };
      skip(h, hp, b.history_from, b.history, b.history_after, st.history_part, s.history);
      skip(y, yp, b.system_from, b.system, b.system_after, st.system_part, s.system);
    }
    return s;
  }

  /// The values of a line, as gather() counts them.
  std::uint64_t count_values(std::string_view line) {
    simdjson::dom::object obj;
    if (parser_.parse(line.data(), line.size()).get(obj) != simdjson::SUCCESS) return 0;
    std::uint64_t n = 0;
    for (auto f : obj) {
      if (f.key.starts_with("_")) continue;
      std::string_view sv;
      if (f.value.is_number() || (f.value.get(sv) == simdjson::SUCCESS && (sv == "NaN" || sv == "Infinity" || sv == "-Infinity"))) ++n;
    }
    return n;
  }

  Sent send_points(const Batch& b, UploadState& st) {
    if (uncertain_) {
      Sent s = reconcile(b, st);
      if (s.delivery != Delivery::ok || s.history > 0 || s.system > 0) return s;
    }
    std::vector<Point> points;
    Sent s;
    gather(b, st, points, s.refused);
    save_keys();
    std::size_t done = 0; // points[0..done) are delivered (or refused and recorded)
    // Ranges to send, last first: split in halves on a 400.
    std::vector<std::pair<std::size_t, std::size_t>> todo{{0, points.size()}};
    while (!todo.empty()) {
      auto [lo, hi] = todo.back();
      todo.pop_back();
      std::size_t real = 0;
      for (std::size_t i = lo; i < hi; ++i) real += points[i].index != ~std::uint64_t{0};
      const Position pos = position(b, st, points, hi);
      if (real == 0) {
        // Lines without values: nothing to send. The local offsets move past
        // them; the server's offset tag moves with the next request.
        done = hi;
        continue;
      }
      std::string body;
      JsonWriter w(body);
      w.begin_object().key("run_id").string(st.remote_run).key("metrics").begin_array();
      for (std::size_t i = lo; i < hi; ++i) {
        const Point& p = points[i];
        if (p.index == ~std::uint64_t{0}) continue;
        w.begin_object().key("key").string(p.key).key("value").number(p.value);
        w.key("timestamp").integer(p.ts_ms).key("step").integer(p.step).end_object();
      }
      w.end_array().key("tags").begin_array();
      w.begin_object()
          .key("key")
          .string(offset_tag)
          .key("value")
          .string(encode_offset(pos.history, pos.history_part, pos.system, pos.system_part))
          .end_object();
      w.end_array().end_object();
      HttpResponse r = call("POST", "runs/log-batch", body, b.deadline);
      const Delivery d = classify(r);
      if (d == Delivery::ok) {
        s.points += real;
        done = hi;
        continue;
      }
      if (d == Delivery::refused && r.status == 400 && real > 1) {
        // Find the refused values: each half on its own, first half first.
        std::size_t mid = lo + (hi - lo) / 2;
        todo.emplace_back(mid, hi);
        todo.emplace_back(lo, mid);
        continue;
      }
      if (d == Delivery::refused && r.status == 400) {
        for (std::size_t i = lo; i < hi; ++i) {
          const Point& p = points[i];
          if (p.index == ~std::uint64_t{0}) continue;
          std::string line;
          JsonWriter lw(line);
          lw.begin_object().key("part").string(p.history ? "history" : "system").key("key").string(p.key);
          lw.key("step").integer(p.step).key("value").number(p.value).key("why").string(describe(r)).end_object();
          s.refused.push_back(std::move(line));
          ++s.refused_points;
        }
        if (s.message.empty()) s.message = "MLflow refused a value (" + describe(r) + "); such values are listed in upload/" + target_.id + ".refused.jsonl";
        // Not on the server, so not in its offset tag: if this process dies
        // before its offsets file is saved, these values are refused (and
        // listed) once more, and nothing is sent twice.
        done = hi;
        continue;
      }
      // Retry later (or stop): what was delivered before stays delivered.
      uncertain_ = true;
      Sent f = failed(r, "logging metrics");
      f.points = s.points;
      f.refused = std::move(s.refused);
      f.refused_points = s.refused_points;
      apply(b, st, points, done, f);
      return f;
    }
    apply(b, st, points, done, s);
    return s;
  }

  void apply(const Batch& b, UploadState& st, const std::vector<Point>& points, std::size_t done, Sent& s) const {
    const Position p = position(b, st, points, done);
    s.history = p.history_lines;
    s.system = p.system_lines;
    st.history_part = p.history_part;
    st.system_part = p.system_part;
  }

  // --- artifacts, summary --------------------------------------------------------

  Sent send_artifact(const RunSnapshot& run, const ArtifactEntry& a, UploadState& st, SteadyTime deadline) {
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
    if (!auth_header_.empty()) req.headers.push_back(auth_header_);
    req.user = user_;
    req.password = password_;
    HttpResponse r = perform_until(http_, req, deadline, std::chrono::milliseconds(600'000));
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

  Sent send_summary(const std::string& summary, UploadState& st, SteadyTime deadline) {
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
      HttpResponse r = call("POST", "runs/log-batch", body, deadline);
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
  bool uncertain_ = false; // a log-batch's fate is unknown: read the offset tag back first
  std::unordered_map<std::string, std::string> params_sent_;
};

} // namespace

std::unique_ptr<Backend> make_mlflow_backend(const UploadTarget& target, HttpClient& http) {
  return std::make_unique<MlflowBackend>(target, http);
}

} // namespace chorus::io::detail
