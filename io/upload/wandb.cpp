// The W&B backend (GraphQL + file_stream, as the W&B servers answer):
//
//   open    upsertBucket (name = the run id, so that a retry or a resumed
//           upload finds the same run) with the config, and state
//           "running" while the run trains or a resumed attempt is still to
//           end on the server (so that its earlier end is undone); the
//           server's historyLineCount says where its history ends;
//   send    one file_stream request: history rows → wandb-history.jsonl,
//           a step's histograms in its row as W&B's own histograms, and its
//           images, text and tables there as W&B's files, uploaded before
//           (io/upload/wandb_media.hpp; a step of histograms or media only a
//           row of its own), system lines →
//           wandb-events.jsonl, summary.json → wandb-summary.json, and at
//           the end "complete" and the exit code; a changed config goes
//           through upsertBucket again.
//
// Exactly once: file_stream places lines at the offsets the request names,
// so a request sent again (its answer lost, the process killed) replaces the
// same lines with themselves. The Uploader hands over whole steps only
// (HistogramUse::by_step), so a row is the same whenever it is made: history
// row N is line N + UploadState::histogram_rows of wandb-history.jsonl.
//
// Client-side limits, as the official client keeps them: one request per
// CHORUS_WANDB_INTERVAL seconds (default 15) while the run trains, requests
// under 10 MiB, and at the end everything left at once.
#include "io/platform/posix.hpp"
#include "io/store/histogram_log.hpp"
#include "io/store/history_row.hpp"
#include "io/upload/backends.hpp"
#include "io/upload/media_lines.hpp"
#include "io/upload/wandb_media.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace chorus::upload {
namespace {

constexpr std::size_t max_request = 8u << 20; // under the ~10 MiB the server takes
constexpr std::size_t max_row = max_request - (64u << 10); // a row goes whole in one request
constexpr std::size_t max_files = 32; // media files uploaded before one request's rows
constexpr std::size_t max_bins = 512; // the most a W&B histogram has (wandb.Histogram.MAX_LENGTH)
constexpr std::chrono::milliseconds request_cap{30'000};
constexpr std::chrono::milliseconds ended_interval{500}; // ~2 requests a second per run at most

constexpr const char* upsert_query =
    "mutation UpsertBucket($id: String, $name: String, $project: String, $entity: String, $groupName: String, "
    "$displayName: String, $notes: String, $config: JSONString, $jobType: String, $state: String, $host: String, "
    "$tags: [String!], $summaryMetrics: JSONString) { upsertBucket(input: {id: $id, name: $name, modelName: "
    "$project, entityName: $entity, groupName: $groupName, displayName: $displayName, notes: $notes, config: "
    "$config, jobType: $jobType, state: $state, host: $host, tags: $tags, summaryMetrics: $summaryMetrics}) { "
    "bucket { id name displayName project { name entity { name } } historyLineCount } inserted } }";

/// `h` as W&B's own histogram: {"_type": "histogram", "values": [counts],
/// "bins": [edges]}, len(bins) = len(values) + 1. Its finite buckets, a gap
/// between two a bin of 0; past max_bins, adjacent bins are added together
/// whole, those whose lower edges fall in one of max_bins equal parts of the
/// range, so every edge is a bucket's bound and every count stays exact.
/// NaN and the infinities have no place in it (docs/UPLOADS.md); with no
/// finite value it is one empty bin over [0, 1], as numpy makes one.
void wandb_histogram(std::string& out, const Histogram& h) {
  std::vector<double> edges;
  std::vector<std::uint64_t> counts;
  for (const Histogram::Bucket& b : h.buckets()) {
    const double lo = std::clamp(b.lo, -DBL_MAX, DBL_MAX), hi = std::clamp(b.hi, -DBL_MAX, DBL_MAX);
    if (edges.empty()) edges.push_back(lo);
    else if (lo > edges.back()) counts.push_back(0), edges.push_back(lo);
    counts.push_back(b.count);
    edges.push_back(hi);
  }
  if (counts.empty()) edges = {0, 1}, counts = {0};
  if (counts.size() > max_bins) {
    // In halves, so that the range of the whole double line does not overflow.
    const double low = edges.front() / 2, range = edges.back() / 2 - low;
    std::vector<double> merged_edges{edges.front()};
    std::vector<std::uint64_t> merged;
    std::size_t part = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const auto at = std::min(max_bins - 1, static_cast<std::size_t>((edges[i] / 2 - low) / range * max_bins));
      if (merged.empty() || at != part) {
        if (!merged.empty()) merged_edges.push_back(edges[i]);
        merged.push_back(0);
        part = at;
      }
      merged.back() += counts[i];
    }
    merged_edges.push_back(edges.back());
    edges = std::move(merged_edges);
    counts = std::move(merged);
  }
  core::JsonWriter w(out);
  w.begin_object().key("_type").string("histogram").key("values").begin_array();
  for (const std::uint64_t c : counts) w.uinteger(c);
  w.end_array().key("bins").begin_array();
  for (const double e : edges) w.number(e);
  w.end_array().end_object();
}

class WandbBackend final : public Backend {
public:
  WandbBackend(const UploadTarget& target, HttpClient& http, std::string key, std::chrono::milliseconds interval)
      : target_(target), http_(http), key_(std::move(key)), interval_(interval) {}

  Sent open(const RunSnapshot& run, UploadState& st) override {
    const std::string config = platform::read_text(run.dir + "/config.json", true).value_or(std::string());
    std::int64_t lines = 0;
    // A resumed run (Options::resume) trains again after an earlier
    // attempt's end went up, and W&B keeps the state that end set: so the
    // run is set running again until this attempt's end completes it (also
    // where that attempt ended before any of it went up, synced later).
    Sent s = upsert(run, st, config.empty() ? nullptr : &config, &lines, !run.ended || st.earlier_end_delivered());
    if (s.delivery != Delivery::ok) return s;
    if (static_cast<std::uint64_t>(lines) < st.history.lines + st.histogram_rows) {
      // The server has fewer lines than were delivered (it lost some): send
      // them again from where it stands.
      skip_ = static_cast<std::uint64_t>(lines);
      st.history = {};
      st.histograms = {};
      st.media = {};
      st.histogram_rows = 0;
    }
    return s;
  }

  Sent send(const RunSnapshot& run, const Batch& b, UploadState& st) override {
    const auto now = std::chrono::steady_clock::now();
    const bool ending = run.ended;
    const auto interval = ending ? ended_interval : interval_;
    if (last_ != SteadyTime() && now < last_ + interval) {
      Sent wait;
      wait.not_before = last_ + interval;
      return wait;
    }
    if (b.config) {
      Sent s = upsert(run, st, b.config, nullptr);
      if (s.delivery != Delivery::ok) return s;
      s.config = true;
      return s;
    }

    Sent s;
    std::string body;
    core::JsonWriter w(body);
    w.begin_object().key("files").begin_object();
    // History: the rows the server already has (after a rewind) are skipped.
    Rows rows = history_rows(run, b, st, w, body);
    Sent skipped; // what a failed request still consumed: the rows skipped
    consume(skipped, rows.skipped);
    const std::size_t h = rows.sent.history;
    std::uint64_t points = rows.points;
    std::size_t e = 0;
    if (!b.system.empty() && body.size() < max_request / 2) {
      w.key("wandb-events.jsonl").begin_object().key("offset").uinteger(b.system_from.lines);
      w.key("content").begin_array();
      for (; e < b.system.size() && body.size() + b.system[e].size() < max_request; ++e) {
        w.string(b.system[e]);
        points += count_values(b.system[e]);
      }
      w.end_array().end_object();
    }
    const bool all = h == b.history.size() && rows.sent.histograms == b.histograms.size() &&
                     rows.sent.media == b.media.size() && e == b.system.size();
    std::string summary_line;
    if (b.summary && all) {
      summary_line = minify(*b.summary);
      w.key("wandb-summary.json").begin_object().key("offset").integer(0).key("content").begin_array();
      w.string(summary_line).end_array().end_object();
    }
    w.end_object();
    if (!rows.files.empty()) { // as W&B's client says which of the run's files it uploaded
      w.key("uploaded").begin_array();
      for (const WandbMedia& m : rows.files) w.string(m.name);
      w.end_array();
    }
    const bool final = b.final && all && (b.summary == nullptr || !summary_line.empty());
    if (final) w.key("complete").boolean(true).key("exitcode").integer(run.exit_code);
    w.end_object();

    if (rows.count == 0 && e == 0 && summary_line.empty() && !final) return skipped;
    // The files first: a row never names a file the server does not have.
    if (Sent f = upload_wandb_files(http_, target_, key_, st, rows.files, parser_); f.delivery != Delivery::ok) {
      consume(f, std::move(rows.skipped));
      return f;
    }
    HttpResponse r = post(target_.base_url + "/files/" + url_encode(st.entity) + "/" + url_encode(st.project) + "/" +
                              url_encode(st.remote_run) + "/file_stream",
                          std::move(body));
    last_ = std::chrono::steady_clock::now();
    if (!r.ok()) {
      Sent f = failed(r, "file_stream");
      consume(f, std::move(rows.skipped));
      return f;
    }
    consume(s, std::move(rows.sent));
    if (!s.refused.empty())
      s.message = "W&B: histograms.jsonl or media.jsonl lines were left out; they are listed in upload/" + target_.id +
                  ".refused.jsonl";
    s.system = e;
    s.summary = !summary_line.empty();
    s.final = final;
    s.points = points;
    simdjson::dom::element doc;
    bool stopped = false;
    if (parser_.parse(r.body).get(doc) == simdjson::SUCCESS && doc["stopped"].get(stopped) == simdjson::SUCCESS &&
        stopped && !final) {
      s.delivery = Delivery::refused;
      s.stop = true;
      s.message = "W&B: the run was stopped on the server, and a stopped W&B run takes no more data; what is left stays in the run directory (to upload it elsewhere, sync it to another target)";
    }
    return s;
  }

  [[nodiscard]] HistogramUse histograms() const noexcept override { return HistogramUse::by_step; }
  [[nodiscard]] bool media() const noexcept override { return true; }

private:
  /// What history_rows consumed of a Batch.
  struct Consumed {
    std::size_t history = 0, histograms = 0, media = 0;
    std::uint64_t histogram_rows = 0; // rows without a history line
    std::vector<std::string> refused;
  };
  struct Rows {
    Consumed skipped;        // rows the server already has (consumed before those sent)
    Consumed sent;           // everything consumed once the request is delivered, the skipped included
    std::size_t count = 0;   // rows in the request
    std::uint64_t points = 0; // history values in them
    std::vector<WandbMedia> files; // the files the rows sent name, uploaded before them
  };

  static void consume(Sent& s, Consumed c) {
    s.history = c.history;
    s.histograms = c.histograms;
    s.media = c.media;
    s.histogram_rows = c.histogram_rows;
    s.refused = std::move(c.refused);
  }

  /// The Batch's history rows, histograms and media merged by step into
  /// W&B's history rows, written into `w` as "wandb-history.jsonl" (none
  /// where no row goes): as many as fit in one request after the rows the
  /// server has. A histogram or media that would make its row too long for
  /// one request is left out and recorded as refused.
  Rows history_rows(const RunSnapshot& run, const Batch& b, const UploadState& st, core::JsonWriter& w,
                    const std::string& body) {
    Rows out;
    Consumed at; // what the rows so far consume
    std::uint64_t next_row = st.history.lines + st.histogram_rows; // its line in wandb-history.jsonl
    std::string row;
    bool open = false;
    while (at.history < b.history.size() || at.histograms < b.histograms.size() || at.media < b.media.size()) {
      Consumed after = at;
      row.clear();
      std::optional<std::int64_t> row_step; // the step of the next history row, if it has one
      std::uint64_t row_points = 0;         // its values
      simdjson::dom::object obj;
      const bool history_left = after.history < b.history.size();
      if (history_left) {
        const std::string_view text = b.history[after.history];
        if (history_parser_.parse(text.data(), text.size()).get(obj) == simdjson::SUCCESS)
          if (const store::HistoryRow r(obj); r) row_step = r.step();
      }
      const std::optional<store::HistogramLine> first = next_histogram(b, after);
      std::optional<store::MediaLine> media = next_media(b, after);
      // The row's step: the least of the files' next steps (a history line without one goes alone).
      std::optional<std::int64_t> step = row_step;
      if (!history_left || row_step) {
        if (first && (!step || first->step < *step)) step = first->step;
        if (media && (!step || media->step < *step)) step = media->step;
      }
      const bool take_history = history_left && row_step == step;
      const bool take_histograms = first && step == first->step;
      const bool take_media = media && step == media->step;
      if (take_history) {
        row_points = count_values(b.history[after.history]);
        row = b.history[after.history++];
        if (take_histograms || take_media) { // the row's closing '}' goes after its histograms and media
          while (!row.empty() && row.back() != '}') row.pop_back();
          if (!row.empty()) row.pop_back();
        }
      } else {
        row = "{\"_step\":" + std::to_string(*step) + ",\"_timestamp\":";
        core::append_json_number(row, take_histograms ? first->timestamp : media->timestamp);
        row += ",\"_runtime\":";
        core::append_json_number(row, take_histograms ? first->runtime : media->runtime);
        ++after.histogram_rows;
      }
      std::vector<std::string> columns;
      std::vector<WandbMedia> row_files;
      // Appends `value` under `column` to the row, or records why it cannot go.
      const auto add = [&](std::string column, std::string_view part_name, std::string_view value) {
        std::string part = ",";
        core::append_json_string(part, column);
        part += ':';
        part += value;
        const bool again = std::find(columns.begin(), columns.end(), column) != columns.end();
        if (again || row.size() + part.size() + 1 > max_row) {
          std::string why = "{\"part\":\"" + std::string(part_name) + "\",\"step\":" + std::to_string(*step) + ",\"column\":";
          core::append_json_string(why, column);
          after.refused.push_back(why + (again ? ",\"why\":\"a second value of its column at its step\"}"
                                               : ",\"why\":\"its W&B history row would pass the " +
                                                     std::to_string(max_row >> 10) + " KiB a request takes\"}"));
          return false;
        }
        row += part;
        columns.push_back(std::move(column));
        return true;
      };
      if (take_histograms) {
        std::string value;
        for (std::optional<store::HistogramLine> line = first; line && line->step == *step; line = next_histogram(b, after)) {
          ++after.histograms;
          value.clear();
          wandb_histogram(value, line->value);
          add(line->column(), "histograms", value);
        }
      }
      for (; take_media && media && media->step == *step; media = next_media(b, after)) {
        ++after.media;
        Result<WandbMedia> file = wandb_media(run.dir, run.world_size, *media, table_parser_);
        if (!file) {
          after.refused.push_back(refused_media(*media, file.error().message()));
          continue;
        }
        if (add(file->column, "media", file->value)) row_files.push_back(std::move(*file));
      }
      if (take_histograms || take_media) row += '}';
      if (next_row < skip_) { // the server has it
        ++next_row;
        at = std::move(after);
        out.skipped = at;
        continue;
      }
      if (out.count > 0 &&
          (body.size() + row.size() >= max_request || out.files.size() + row_files.size() > max_files))
        break;
      if (!open) {
        w.key("wandb-history.jsonl").begin_object().key("offset").uinteger(next_row).key("content").begin_array();
        open = true;
      }
      w.string(row);
      out.points += row_points;
      ++out.count;
      ++next_row;
      for (WandbMedia& f : row_files) out.files.push_back(std::move(f));
      at = std::move(after);
    }
    if (open) w.end_array().end_object();
    out.sent = std::move(at);
    return out;
  }

  /// The histogram at `at.histograms` on, passing over (and recording as
  /// refused) lines that are no histogram; nothing past the Batch's.
  std::optional<store::HistogramLine> next_histogram(const Batch& b, Consumed& at) {
    for (; at.histograms < b.histograms.size(); ++at.histograms) {
      const std::string_view text = b.histograms[at.histograms];
      simdjson::dom::element doc;
      Result<store::HistogramLine> line = Error(Errc::invalid_argument, "a histograms.jsonl line that is not JSON");
      if (histogram_parser_.parse(text.data(), text.size()).get(doc) == simdjson::SUCCESS) line = store::read_histogram_line(doc);
      if (line) return std::move(*line);
      std::string bad = "{\"part\":\"histograms\",\"line\":" + std::to_string(b.histograms_from.lines + at.histograms) + ",\"why\":";
      core::append_json_string(bad, line.error().message());
      at.refused.push_back(bad + "}");
    }
    return std::nullopt;
  }

  /// The media line at `at.media` on, as next_histogram; its views live
  /// until the next call.
  std::optional<store::MediaLine> next_media(const Batch& b, Consumed& at) {
    for (; at.media < b.media.size(); ++at.media)
      if (std::optional<store::MediaLine> line = read_media(media_parser_, b, at.media, at.refused)) return line;
    return std::nullopt;
  }

  static std::uint64_t count_values(std::string_view line) {
    // Values are the top-level keys not starting with '_': count `,"` and `{"`
    // followed by another character than '_' (the lines are chorus's own JSON).
    std::uint64_t n = 0;
    int depth = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (in_string) {
        if (c == '\\') ++i;
        else if (c == '"') in_string = false;
        continue;
      }
      if (c == '"') {
        in_string = true;
        if (depth == 1 && i > 0 && (line[i - 1] == '{' || line[i - 1] == ',') && i + 1 < line.size() && line[i + 1] != '_') ++n;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        --depth;
      }
    }
    return n;
  }

  std::string minify(const std::string& json) {
    simdjson::dom::element doc;
    if (parser_.parse(json).get(doc) != simdjson::SUCCESS) return "{}";
    return simdjson::minify(doc);
  }

  /// {"key": {"value": v}} from config.json's {"key": v}.
  std::string wandb_config(const std::string& config) {
    simdjson::dom::element doc;
    simdjson::dom::object obj;
    std::string out;
    core::JsonWriter w(out);
    w.begin_object();
    if (parser_.parse(config).get(doc) == simdjson::SUCCESS && doc.get(obj) == simdjson::SUCCESS)
      for (auto f : obj) w.key(f.key).begin_object().key("value").raw(simdjson::minify(f.value)).end_object();
    w.end_object();
    return out;
  }

  HttpResponse post(std::string url, std::string body) {
    HttpRequest req;
    req.method = "POST";
    req.url = std::move(url);
    req.body = std::move(body);
    req.headers.emplace_back("Content-Type: application/json");
    req.user = "api";
    req.password = key_;
    return perform_capped(http_, req, request_cap);
  }

  static Sent failed(const HttpResponse& r, const std::string& what) {
    return not_delivered(r, "W&B", what, "check WANDB_API_KEY");
  }

  Sent upsert(const RunSnapshot& run, UploadState& st, const std::string* config,
              std::int64_t* history_lines, bool running = false) {
    std::string body;
    core::JsonWriter w(body);
    w.begin_object().key("query").string(upsert_query).key("variables").begin_object();
    w.key("name").string(run.id).key("project").string(run.project);
    if (!target_.entity.empty()) w.key("entity").string(target_.entity);
    if (!run.group.empty()) w.key("groupName").string(run.group);
    w.key("displayName").string(run.name);
    if (!run.notes.empty()) w.key("notes").string(run.notes);
    if (!run.job_type.empty()) w.key("jobType").string(run.job_type);
    if (!run.host.empty()) w.key("host").string(run.host);
    if (config) w.key("config").string(wandb_config(*config));
    if (running) w.key("state").string("running");
    w.key("tags").begin_array();
    if (!run.mode.empty()) w.string("mode:" + run.mode);
    if (!run.scope.empty()) w.string("scope:" + run.scope);
    w.end_array();
    w.end_object().end_object();
    HttpResponse r = post(target_.base_url + "/graphql", std::move(body));
    if (!r.ok()) return failed(r, "upsertBucket");
    simdjson::dom::element doc, bucket;
    simdjson::dom::array errors;
    if (parser_.parse(r.body).get(doc) != simdjson::SUCCESS) {
      Sent s;
      s.delivery = Delivery::retry;
      s.message = "W&B upsertBucket answered something that is not JSON";
      return s;
    }
    if (doc["errors"].get(errors) == simdjson::SUCCESS && errors.size() > 0) {
      Sent s;
      s.delivery = Delivery::refused;
      s.stop = true;
      s.message = "W&B upsertBucket: " + describe(r);
      return s;
    }
    if (doc["data"]["upsertBucket"]["bucket"].get(bucket) != simdjson::SUCCESS) {
      Sent s;
      s.delivery = Delivery::retry;
      s.message = "W&B upsertBucket answered without a bucket";
      return s;
    }
    std::string_view v;
    if (bucket["name"].get(v) == simdjson::SUCCESS) st.remote_run = std::string(v);
    if (bucket["project"]["name"].get(v) == simdjson::SUCCESS) st.project = std::string(v);
    if (bucket["project"]["entity"]["name"].get(v) == simdjson::SUCCESS) st.entity = std::string(v);
    if (st.remote_run.empty()) st.remote_run = run.id;
    if (st.project.empty()) st.project = run.project;
    std::int64_t count = 0;
    if (history_lines && bucket["historyLineCount"].get(count) == simdjson::SUCCESS) *history_lines = count;
    return {};
  }

  UploadTarget target_;
  HttpClient& http_;
  std::string key_;
  std::chrono::milliseconds interval_;
  SteadyTime last_{};
  std::uint64_t skip_ = 0;
  simdjson::dom::parser parser_, history_parser_, histogram_parser_, media_parser_, table_parser_;
};

Result<std::unique_ptr<Backend>> make_wandb_backend(const BackendContext& context) {
  const UploadTarget& target = context.target;
  const char* key = std::getenv("WANDB_API_KEY");
  if (!key || !*key)
    return Error(Errc::invalid_argument, "uploading to " + target.url +
                                             " needs a W&B API key: set WANDB_API_KEY (it is never written to the run "
                                             "directory)");
  std::chrono::milliseconds interval{15'000};
  if (const char* v = std::getenv("CHORUS_WANDB_INTERVAL"); v && *v) {
    double secs = -1;
    const char* end = v + std::strlen(v);
    auto r = std::from_chars(v, end, secs);
    if (r.ec != std::errc() || r.ptr != end || !(secs >= 0) || secs > 3600)
      return Error(Errc::bad_environment, std::string("CHORUS_WANDB_INTERVAL='") + v +
                                              "' is not a number of seconds between 0 and 3600 (the least time "
                                              "between two W&B requests while a run trains; default 15)");
    interval = std::chrono::milliseconds(static_cast<std::int64_t>(secs * 1000));
  }
  return std::unique_ptr<Backend>(std::make_unique<WandbBackend>(target, *context.http, key, interval));
}

} // namespace

} // namespace chorus::upload

namespace chorus::upload::backends {

// wandb://, listed in io/CMakeLists.txt: one request at a time, and the URL
// may name the entity (else WANDB_ENTITY does, else the key's own).
BackendSpec wandb() {
  return {.connections = 1, .path = "a W&B entity", .path_variable = "WANDB_ENTITY", .make = make_wandb_backend};
}

} // namespace chorus::upload::backends
