// Uploading a run directory to a tracking server (README, "Uploading to MLflow and W&B").
//
// The run directory is the only source: the Uploader reads the committed
// files (history.jsonl, system.jsonl, histograms.jsonl, media.jsonl,
// events.jsonl, config.json, summary.json, artifacts.jsonl, run.json) from where the target's offsets say it stopped,
// a bounded slice at a time. So a server that is down costs disk, not
// memory, and the live upload (the Uploader actor on the run host) and
// `chorus sync` are the same code resuming from the same offsets, kept in
// <run>/upload/<target>.json after every delivered request.
//
//   run directory ──read slice──► Uploader ──Batch──► Backend ──HTTP──► server
//        ▲                            │                 (io/upload/registry.hpp)
//        └──── upload/<target>.json ◄─┘ offsets, after every answer
#pragma once

#include "io/store/line_reader.hpp"
#include "io/store/run_record.hpp"
#include "io/upload/http.hpp"

#include "runtime/core/result.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::upload {

using SteadyTime = std::chrono::steady_clock::time_point;

/// Where to upload, from a URL (mlflow://HOST:PORT, wandb://HOST[/ENTITY]:
/// the grammar is runtime/core/upload_url.hpp's, the backends
/// io/upload/registry.hpp's). Credentials never go in the URL (W&B's key is
/// read from WANDB_API_KEY).
struct UploadTarget {
  std::string backend;  // the scheme's backend: "mlflow", "wandb"
  std::string url;      // as given (no credentials)
  std::string base_url; // "http://host:port" or "https://host"; "" for a local backend
  std::string dir;      // a local backend's directory (tensorboard:DIR), absolute
  std::string entity;   // W&B: from the URL's path, else $WANDB_ENTITY, else the key's own
  std::string id;       // names the target's files in upload/: "mlflow-host-5000"
  /// A backend whose URL's path is a secret (BackendSpec::secret_path, a
  /// webhook's): the path and query as given ("/services/T/B/X"), sent and
  /// never shown nor written. Then `url` shows "NAME://HOST/…" and `id`
  /// names the host and a hash of the path.
  std::string path;

  /// An error names the URL forms above.
  [[nodiscard]] static Result<UploadTarget> parse(std::string_view url);
};

/// Complete lines of an append-only file from `from`: at most `max_bytes`
/// of them (but at least one whole line, of at most store::max_line_bytes). A
/// partial last line (a writer mid-append) is left for later. A missing file
/// reads as empty. A line longer than the bound ends the reading as every
/// reader of a run's lines ends it (store::line_too_long): the lines before it
/// are in the slice, then `damaged` says why nothing more of the file is
/// read, and `to_end` holds (nothing after it can be taken).
struct LineSlice {
  std::string buf;
  std::vector<std::string_view> lines; // without '\n'
  std::vector<store::Cursor> after;           // after[i]: the cursor just past lines[i]
  bool to_end = false; // every complete line the file held was read (not cut at max_bytes), or up to `damaged`
  Error damaged;       // the line after the last one read runs past store::max_line_bytes
};
/// `limit`: read no byte past it (a live run's DurableBounds); a slice that
/// reaches it is `to_end`, as one that reaches the file's end.
[[nodiscard]] Error read_lines(const std::string& path, store::Cursor from, std::size_t max_bytes, LineSlice& out,
                               std::uint64_t limit = UINT64_MAX);

/// What a target has received from a run, persisted in
/// <run>/upload/<target.id>.json (atomically, after every answer).
struct UploadState {
  std::string url;         // the target URL (no credentials)
  std::string remote_run;  // MLflow run id / W&B run name
  std::string experiment;  // MLflow experiment id
  std::string entity, project; // W&B, as the server named them
  store::Cursor history, system, artifacts, histograms;
  store::Cursor media; // media.jsonl, for a backend that takes it (Backend::media)
  store::Cursor events; // events.jsonl, for a backend that takes it (Backend::events)
  // Values of the next history/system line already delivered, when one line
  // holds more values than one request takes.
  std::uint64_t history_part = 0, system_part = 0;
  // W&B: the rows of its history with no history.jsonl line (a step of
  // histograms or media only): its history line for history.jsonl's line N
  // is N + those before it.
  std::uint64_t histogram_rows = 0;
  std::string config_sent;  // digest of config.json as delivered ("" = never)
  std::string summary_sent; // digest of summary.json as delivered
  // The end state once delivered ("finished", ...), and the attempt it
  // ended: run.json's number of `segments` then (an offsets file from
  // before final_attempt reads as 1, the earliest it can be). A resumed
  // run's later attempt has not ended on the server: the Uploader clears
  // final_sent for it and keeps final_attempt, so that the server-side run
  // is set running again until that attempt's own end goes up.
  std::string final_sent;
  std::uint64_t final_attempt = 0;
  std::uint64_t points = 0;  // values delivered
  std::uint64_t refused = 0; // values the server refused (see upload/<id>.refused.jsonl)
  std::string last_error;    // the latest problem, for `chorus sync --status`

  [[nodiscard]] Error load(const std::string& path); // a missing file leaves the defaults
  [[nodiscard]] Error save(const std::string& path) const;

  /// Whether the end of the latest of a run's `attempts` (run.json's
  /// segments; 0, none in the file, counts as the first) was delivered.
  [[nodiscard]] bool end_delivered(std::uint64_t attempts) const noexcept {
    return !final_sent.empty() && final_attempt >= attempts; // final_attempt >= 1 with final_sent
  }
  /// Whether the server holds an earlier attempt's end but not the latest's
  /// (a resumed run): it is to be set running again.
  [[nodiscard]] bool earlier_end_delivered() const noexcept { return final_sent.empty() && final_attempt != 0; }
};

/// run.json, as the backends need it: its identity (`dir` the run directory
/// read, `name` the id where it has none) and how it stands.
struct RunSnapshot : store::RunIdentity {
  std::int64_t start_ms = 0;
  std::int64_t end_ms = 0;   // 0 while running
  std::string state;         // "running", "finished", "failed", "killed", "crashed"
  std::uint64_t attempts = 1; // run.json's `segments`: 2 and more for a resumed run (1 in one without them)
  std::int64_t world_size = 1; // run.json's: its ranks (1 where it says none)
  bool ended = false;        // a final state
  int exit_code = 0;         // worst rank exit code if known, else 0 / 1 from the state

  [[nodiscard]] static Result<RunSnapshot> read(const std::string& run_dir);
};

/// An artifacts.jsonl line: a file copied into <run>/artifacts/.
struct ArtifactEntry {
  std::string name;   // relative path under artifacts/
  std::string type;
  std::string sha256;
  std::uint64_t size = 0;
};

/// Values in the run's history.jsonl and system.jsonl past `state`'s
/// offsets (not yet delivered nor refused), as store::line_values counts
/// them; reads the files.
[[nodiscard]] std::uint64_t points_pending(const std::string& run_dir, const UploadState& state);

/// The targets a run has offsets for: (target id, path of its upload/<id>.json).
[[nodiscard]] std::vector<std::pair<std::string, std::string>> upload_targets(const std::string& run_dir);

/// What a backend does with histograms.jsonl (Backend::histograms).
enum class HistogramUse {
  none,  // not read: its Batches hold no histograms
  apart, // its lines as they come, apart from the history rows (MLflow)
  // Whole steps only: a Batch holds the history rows and histogram (and
  // media) lines of the steps the files are known to hold whole, so that
  // the backend can send a step's row, histograms and media as one (W&B).
  by_step,
};

/// What the run directory holds beyond the target's offsets (one slice).
struct Batch {
  std::span<const std::string_view> history; // history.jsonl lines
  std::span<const std::string_view> system;  // system.jsonl lines
  std::span<const std::string_view> histograms; // histograms.jsonl lines (none for HistogramUse::none)
  std::span<const std::string_view> media;      // media.jsonl lines (none unless Backend::media)
  std::span<const std::string_view> events;     // events.jsonl lines (none unless Backend::events)
  // Where the slices start, and the cursor just past each line.
  store::Cursor history_from, system_from, histograms_from, media_from, events_from;
  std::span<const store::Cursor> history_after, system_after, histograms_after, media_after, events_after;
  const std::string* config = nullptr;       // config.json, if it changed since delivered
  const std::string* summary = nullptr;      // summary.json, if it changed
  std::span<const ArtifactEntry> artifacts;
  bool final = false; // the run has ended and everything else is delivered: send the end state
};

/// What one call to a backend did: how much of each part of the Batch it
/// consumed (a prefix: delivered, or refused and reported in `refused`).
struct Sent {
  Delivery delivery = Delivery::ok;
  std::size_t history = 0, system = 0, artifacts = 0, histograms = 0, media = 0, events = 0;
  std::uint64_t histogram_rows = 0;  // W&B: rows without a history line among them (UploadState::histogram_rows)
  bool config = false, summary = false, final = false;
  std::uint64_t points = 0;          // values delivered
  std::vector<std::string> refused;  // JSON lines for upload/<id>.refused.jsonl
  std::uint64_t refused_points = 0;
  std::string message;               // the cause, when not ok (names the fix where there is one)
  std::optional<std::chrono::milliseconds> retry_after; // the server asked to wait
  std::optional<SteadyTime> not_before; // client-side rate limit: call again no earlier
  bool stop = false; // cannot go on (bad credentials, run stopped on the server)
};

/// One tracking server's protocol. Each call makes at most a few requests,
/// each within its own timeout (the HTTP client's caps), so that a slow
/// server still answers: the Uploader's time slice decides only whether a
/// call starts. Only HttpClient::cut_at cuts a request short.
class Backend {
public:
  virtual ~Backend() = default;
  /// Finds or creates the remote run and reconciles `state` with what the
  /// server already has, so that nothing is sent twice.
  virtual Sent open(const RunSnapshot& run, UploadState& state) = 0;
  /// Sends a prefix of `batch`; the Uploader advances the offsets by what was consumed.
  virtual Sent send(const RunSnapshot& run, const Batch& batch, UploadState& state) = 0;
  /// Whether summary.json goes up while the run trains (W&B), or only with the end state (MLflow).
  [[nodiscard]] virtual bool live_summary() const noexcept { return true; }
  /// Whether and how it takes histograms.jsonl; one that takes it consumes
  /// its lines through Sent::histograms.
  [[nodiscard]] virtual HistogramUse histograms() const noexcept { return HistogramUse::none; }
  /// Whether it takes media.jsonl (consumed through Sent::media): joined to
  /// the rows by step as histograms() is by_step, else apart, as they come.
  [[nodiscard]] virtual bool media() const noexcept { return false; }
  /// Whether it takes events.jsonl (consumed through Sent::events), as the
  /// lines come. The run's end goes (Batch::final) only once every line of
  /// a read made after run.json said the run ended is consumed.
  [[nodiscard]] virtual bool events() const noexcept { return false; }
};

/// How much of a live run's line files its fdatasync'ed WAL backs, as the
/// run host says after each sync (actors/run.cpp): a live upload reads no
/// further, and sends the run's end only once that end is durable, so that
/// no server holds a value that a crash of the machine could take from the
/// run (`chorus recover` rebuilds the files from the WAL alone).
struct DurableBounds {
  std::atomic<std::uint64_t> history{0}, histograms{0}, media{0}, events{0};
  std::atomic<bool> ended{false}; // the run's end is in the synced WAL
  /// Moves each bound up to the given end (never down); history's last, so
  /// that an upload that reads history.jsonl first, then the others, finds
  /// in them every histogram and media of the rows it read (slices.hpp).
  void raise(std::uint64_t h, std::uint64_t g, std::uint64_t m, std::uint64_t e) noexcept {
    const auto up = [](std::atomic<std::uint64_t>& b, std::uint64_t v) {
      for (std::uint64_t at = b.load(); at < v && !b.compare_exchange_weak(at, v);) {
      }
    };
    up(media, m);
    up(histograms, g);
    up(events, e);
    up(history, h);
  }
  /// No bound any more: the WAL could not be written, nothing more will be
  /// synced, and the files hold what the run has (its run.json says why).
  void lift() noexcept {
    raise(UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX);
    ended = true;
  }
};

struct UploadSettings {
  std::chrono::milliseconds backoff_base{500};
  std::chrono::milliseconds backoff_max{60'000};
  std::size_t read_bytes = 4u << 20; // per file per slice: bounds the memory an upload holds
  /// A live run's (the run host sets it); none for `chorus sync`, which reads the files whole.
  std::shared_ptr<const DurableBounds> durable;
};

/// Reads the run directory and feeds a Backend, with the delivery rules:
/// backoff with jitter on what may succeed later, Retry-After honoured, a
/// refused 4xx reported once and never retried, offsets saved after every
/// answer. Holds upload/<id>.lock so that one process at a time uploads a
/// run to a target.
class Uploader {
public:
  Uploader(std::string run_dir, UploadTarget target, UploadSettings settings = {});
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  /// Takes the lock and loads the offsets. An error names the holder's pid
  /// when another process is uploading this run to this target.
  [[nodiscard]] Error open();

  struct Progress {
    bool done = false;      // the end state is delivered: nothing left, ever
    bool caught_up = false; // nothing left now (the run may still write more)
    bool stopped = false;   // cannot go on (see error)
    std::optional<SteadyTime> wait_until; // backing off or rate limited until then
    std::string error;      // the latest problem, "" if none
  };
  /// Sends until caught up, done, stopped, a wait is needed, or `start_by`:
  /// no backend call (a few requests: a window of log-batches, an artifact)
  /// starts after it, and one under way then runs on, each request to its
  /// own timeout (30 s; 10 min for an artifact). So `start_by` is a time
  /// slice, not a limit on a request (cut_requests_at is).
  Progress pump(SteadyTime start_by);

  /// No request runs past `at`: one in flight then is cut. For a caller
  /// that must end by a time (a run's finish, `chorus sync --timeout`); may
  /// be called from another thread while pump runs.
  void cut_requests_at(SteadyTime at) noexcept;

  /// From now on a request to a target that has not answered since its last
  /// failure (or never has) gets at most `grace` to answer, one in flight
  /// included (HttpClient::limit_silence); one that answers keeps its own
  /// timeout. May be called from another thread while pump runs.
  void limit_silence(std::chrono::milliseconds grace) noexcept;
  /// The target did not answer its last requests (HttpClient::unreachable):
  /// a caller that must end soon stops trying.
  [[nodiscard]] bool unreachable() const noexcept;
  /// Ends a backoff now, so that the next pump tries at once: one more
  /// chance for a target that was down, before a caller gives up on it.
  void retry_now() noexcept;

  [[nodiscard]] const UploadState& state() const noexcept;
  /// Values in history.jsonl and system.jsonl not yet delivered (or refused); counts by reading the files.
  [[nodiscard]] std::uint64_t points_pending() const;
  /// Bytes of history.jsonl and system.jsonl (and histograms.jsonl,
  /// media.jsonl and events.jsonl, for a backend that takes them) not yet delivered: a stat() each, cheap however
  /// far behind the upload is.
  [[nodiscard]] std::uint64_t bytes_pending() const;
  [[nodiscard]] const UploadTarget& target() const noexcept;
  [[nodiscard]] std::string state_path() const;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace chorus::upload
