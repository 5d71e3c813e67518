// A tracking server on loopback for the upload tests and benchmark: MLflow's
// REST 2.0 API with proxied artifacts, and W&B's GraphQL upsertBucket and
// file_stream, answering as the real servers do (where this double and a
// real server differ, the double is wrong), plus faults on
// command and a view of everything it received.
//
//   chorus::test::TrackingServer server;            // http://127.0.0.1:<port>
//   server.fail_next(2, {.status = 503});           // the next two requests get 503
//   ... drive the code under test at server.base_url() ...
//   BOOST_TEST(server.metric_history(run, "loss").size() == 100);
//
// Every method is thread-safe; inspection returns copies. The server runs on
// its own threads (one accepts, one per connection) from the constructor to
// the destructor, which closes every connection and joins them.
//
// What it answers, beyond the calls and limits of the real servers (README, "Uploading to MLflow and W&B"):
//  - MLflow: a fresh server has experiment "0" ("Default"); new experiments
//    get "1", "2", ... Answers leave out empty lists, as protobuf's JSON does
//    (get-history answers {} when there are no points, artifacts/list no
//    "files" for an empty directory).
//    NaN goes out as "NaN", the stored infinities as ±1.7976931348623157e+308.
//    A proxied artifact's path is percent-decoded until it stops changing,
//    refused (400 "Invalid path") with a '#' in it, and stored under the
//    decoded name, as 2.10's validate_path_is_safe does.
//    A run id that is not [A-Za-z0-9][\w-]{0,255} gets 400, an unknown one
//    404. Also served: experiments/get, runs/log-metric, runs/search (with
//    the filters `tags.<key> = '<v>'` and `attributes.status = '<s>'`, joined
//    by AND; newest first; a page token is the offset). A wrong method gets
//    405, an unknown path 404 (text bodies, as Flask's).
//  - W&B: GraphQL errors come back with HTTP 200 ({"errors": [...]}), bad
//    credentials with 401, file_stream errors as {"error": "..."}. A
//    history, events or summary line must be a JSON object, and is kept as
//    sent, whatever its values (a histogram's {"_type": "histogram", ...}
//    among them: the server checks no value's form, wandb.Histogram does). The bucket
//    also carries eventsLineCount and logLineCount. An upsert with no
//    project goes to "uncategorized", with no name gets a random 8-character
//    one; a new run's displayName is its name until one is sent. A run's
//    state is "running" when it is made, then what an upsertBucket's
//    `state` sets (a resumed run is upserted back to "running"), and
//    "finished" (exit code 0 or none) or "failed" (any other) once a
//    file_stream request says "complete": true. Files: the createRunFiles
//    mutation answers each name with a signed upload URL on this server
//    (/wandb-storage/<entity>/<project>/<run>/<name>?sig=...) and the
//    upload header "x-ms-blob-type:BlockBlob", as a W&B server on Azure
//    storage does; a PUT there stores the file, and is refused without that
//    header (400), with a wrong signature (403), or with an Authorization
//    header (400: the URL is the credential). A file_stream request's
//    "uploaded" names files uploaded.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace chorus::test {

/// PEM files for serving HTTPS.
struct TlsFiles {
  std::string cert; // the server's certificate
  std::string key;  // its private key
  std::string ca;   // the CA that signed it: what a client trusts (CURLOPT_CAINFO)
};

/// Writes a fresh CA (EC P-256) and a server certificate it signs, valid for
/// 127.0.0.1 and localhost (subjectAltName), into `dir`, which must exist:
/// ca.pem, server.pem, server.key. Two calls make two unrelated CAs, so a
/// client given the other one's ca.pem must refuse the server. Throws
/// std::runtime_error with OpenSSL's reason.
TlsFiles write_test_certificates(const std::string& dir);

// ---------------------------------------------------------------- MLflow

struct MetricPoint {
  double value = 0;            // infinities arrive as ±1.7976931348623157e308, NaN as NaN
  std::int64_t timestamp = 0;  // ms
  std::int64_t step = 0;
};

struct MlflowExperiment {
  std::string id;   // "0" is the "Default" experiment every server starts with
  std::string name;
  std::string artifact_location; // "mlflow-artifacts:/<id>" unless the client gave one
};

struct MlflowRun {
  std::string id; // 32 hex digits
  std::string experiment_id;
  std::string name;           // run_name (also the mlflow.runName tag)
  std::string status;         // RUNNING, SCHEDULED, FINISHED, FAILED, KILLED
  std::int64_t start_time = 0; // ms, as the client sent it (0 if it sent none)
  std::optional<std::int64_t> end_time;
  std::string artifact_uri;   // mlflow-artifacts:/<experiment>/<run>/artifacts
  std::map<std::string, std::string> tags, params;
  /// Every point stored per key, in arrival order (a resent point is stored
  /// again, as 2.10's file store does, unless Options::mlflow_dedup_metrics).
  std::map<std::string, std::vector<MetricPoint>> metrics;
};

// ---------------------------------------------------------------- W&B

struct WandbRun {
  std::string id; // the bucket's opaque id, as upsertBucket answers it
  std::string entity, project, name;
  std::string display_name, group, job_type, notes, host;
  std::string state;           // "running", "finished", "failed", or what an upsert set (see above)
  std::string config;          // the JSON string last sent ("" if never)
  std::string summary_metrics; // upsertBucket's summaryMetrics, as sent ("" if never)
  std::vector<std::string> tags;
  std::vector<std::string> history; // wandb-history.jsonl, one JSON object per line
  std::vector<std::string> events;  // wandb-events.jsonl
  std::vector<std::string> output;  // output.log
  std::string summary;              // wandb-summary.json's one line ("" if never)
  std::map<std::string, std::vector<std::string>> other_files; // any other file_stream file
  std::map<std::string, std::string> files; // uploaded through createRunFiles' URLs: name -> contents
  std::vector<std::string> uploaded;        // names file_stream requests said were uploaded, in order
  bool complete = false;            // a file_stream request said "complete": true (ever: a later upsert keeps it)
  std::optional<int> exitcode;      // its "exitcode"
  bool stopped = false;             // stop_wandb_run() was called
  std::uint64_t upserts = 0;        // upsertBucket calls that named this run
  std::uint64_t file_stream_requests = 0; // accepted (200) ones
};

// ---------------------------------------------------------------- faults

/// An answer to inject instead of the real one.
struct InjectedAnswer {
  int status = 503;
  std::string body;          // "" gives {"error_code": "...", "message": "injected <status>"}
  std::string retry_after;   // a Retry-After header's value ("1", an HTTP date), "" for none
  std::string path_contains; // only requests whose target (path and query) contains this ("" = any)
};

/// Where a reset request's connection is cut (SO_LINGER 0, so the client
/// sees a TCP RST, never an answer). Note that libcurl sends a request once
/// more by itself, on a new connection, when a kept-alive connection closes
/// before any byte of the answer: that resend is another request here (it
/// takes the next fault), so on a reused connection reset_next(1, ...)
/// shows the caller no error, and reset_next(2, ...) does.
enum class ResetPoint {
  after_headers,  // the headers are read, the body is not: the request is not applied
  after_body,     // the whole request is read but not applied
  after_handling, // the request is applied, then the answer is lost
};

/// Counters since the server started.
struct ServerStats {
  std::uint64_t requests = 0;    // every request whose headers were read, faulted or not
  std::uint64_t connections = 0; // TCP connections accepted (keep-alive keeps this low)
  /// Requests per kind: "mlflow/<call>" (e.g. "mlflow/runs/log-batch"),
  /// "mlflow-artifacts", "wandb/graphql", "wandb/file_stream", "wandb/storage", "other".
  std::map<std::string, std::uint64_t> by_kind;
  /// hold_next: the most requests like a held one that arrived while it was held.
  std::uint64_t overtaken = 0;
};

/// A request as received, when Options::record_requests is on.
struct RecordedRequest {
  std::string method;
  std::string target; // path and query, as sent
  std::vector<std::pair<std::string, std::string>> headers; // names lower-cased
  std::string body;   // de-chunked
  /// Requests the server was serving (read, not yet answered) when this one
  /// arrived, this one included: what the client had in flight at once.
  unsigned in_flight = 0;
};

// ---------------------------------------------------------------- server

class TrackingServer {
public:
  struct Options {
    /// Serve HTTPS with these files (see write_test_certificates); plain HTTP if empty.
    std::optional<TlsFiles> tls;
    /// W&B: the API key, the Basic password that user "api" must send.
    std::string wandb_api_key = "chorus-test-key";
    /// W&B: the entity of an upsertBucket that names none (the key's own).
    std::string wandb_entity = "chorus-user";
    /// W&B: a larger request body gets 413.
    std::size_t wandb_max_body = std::size_t{10} << 20;
    /// MLflow: store a metric point equal in key, value, timestamp and step to
    /// a stored one only once (the SQL store's behaviour; the file store, the
    /// default, stores it again).
    bool mlflow_dedup_metrics = false;
    /// Keep every request (see requests()): headers, bodies, for checking
    /// that credentials go only where they belong.
    bool record_requests = false;
    /// 0: an ephemeral port.
    std::uint16_t port = 0;
  };

  /// Listens on 127.0.0.1 before returning. Throws std::runtime_error when
  /// it cannot (or when the TLS files do not load).
  TrackingServer();
  explicit TrackingServer(Options options);
  ~TrackingServer();
  TrackingServer(const TrackingServer&) = delete;
  TrackingServer& operator=(const TrackingServer&) = delete;

  [[nodiscard]] std::uint16_t port() const noexcept;
  /// "http://127.0.0.1:<port>", or https:// with Options::tls.
  [[nodiscard]] std::string base_url() const;

  // ---- faults. Each request takes at most one injected fault: a reset
  // first, else an injected answer; the first matching rule of each kind is
  // used up. A delay applies besides.

  /// The next `n` requests (matching answer.path_contains) get `answer`
  /// without being handled.
  void fail_next(int n, InjectedAnswer answer);
  /// The next `n` requests (whose target contains `path_contains`) have their
  /// connection reset at `at`.
  void reset_next(int n, ResetPoint at = ResetPoint::after_body, std::string path_contains = {});
  /// Every request (whose target contains `path_contains`) waits `delay`
  /// before it is handled and answered, until set_delay(0ms). A client that
  /// gives up meanwhile does not stop its request from being applied.
  void set_delay(std::chrono::milliseconds delay, std::string path_contains = {});
  /// The next `n` requests (whose target contains `path_contains`) are read,
  /// then held until `release_after` more such requests have arrived (or
  /// `longest` has passed) before being handled and answered: a client that
  /// waits for every answer of a window before sending more sends none
  /// meanwhile. ServerStats::overtaken counts the arrivals.
  void hold_next(int n, std::chrono::milliseconds longest, unsigned release_after, std::string path_contains = {});
  /// The server goes away for `duration`: open connections are closed and
  /// new ones refused (the listening socket is closed, then opened again on
  /// the same port). Returns once connections are refused. Calling it during
  /// an outage extends it.
  void outage(std::chrono::milliseconds duration);
  /// Whether an outage is on (the port refuses connections).
  [[nodiscard]] bool in_outage() const;
  /// MLflow: a log-batch, log-metric, log-parameter or set-tag naming this
  /// key gets 400 INVALID_PARAMETER_VALUE, as a key the server cannot take would.
  void refuse_key(std::string key);
  /// W&B: a file_stream rate limit per run (more requests than this within
  /// a second get 429 with Retry-After); 0 turns it off (the default).
  void set_wandb_rate_limit(unsigned requests_per_second);
  /// W&B: the run's file_stream answers say "stopped": true from now on.
  /// False if there is no such run.
  bool stop_wandb_run(const std::string& entity, const std::string& project, const std::string& name);
  /// Drops pending injected answers, resets, holds, the delay and refused keys.
  void clear_faults();

  // ---- inspection (copies)

  [[nodiscard]] std::vector<MlflowExperiment> experiments() const;
  [[nodiscard]] std::vector<MlflowRun> mlflow_runs() const;
  [[nodiscard]] std::optional<MlflowRun> mlflow_run(const std::string& run_id) const;
  /// One key's points in arrival order (empty for an unknown run or key).
  [[nodiscard]] std::vector<MetricPoint> metric_history(const std::string& run_id, const std::string& key) const;
  /// The run's artifacts: path under its artifact root -> contents.
  [[nodiscard]] std::map<std::string, std::string> artifacts(const std::string& run_id) const;

  [[nodiscard]] std::vector<WandbRun> wandb_runs() const;
  [[nodiscard]] std::optional<WandbRun> wandb_run(const std::string& entity, const std::string& project,
                                                  const std::string& name) const;

  [[nodiscard]] ServerStats stats() const;
  /// Every Authorization header value received, in order.
  [[nodiscard]] std::vector<std::string> authorization_headers() const;
  /// Every request received (empty unless Options::record_requests).
  [[nodiscard]] std::vector<RecordedRequest> requests() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace chorus::test
