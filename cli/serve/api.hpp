// The JSON API of `chorus serve`, apart from HTTP: what each endpoint answers
// for the runs under one directory, and the one place where a path from a
// request becomes a path on disk (it must lead to a run or a group inside the
// directory, through no link out of it). cli/serve/server.cpp puts it on HTTP.
#pragma once

#include "cli/serve/histogram_index.hpp"
#include "cli/serve/lines_index.hpp"
#include "cli/serve/media_index.hpp"
#include "io/platform/dir_watch.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::cli::serve {

/// An answer: an HTTP status and a JSON body (`{"error": ...}` for a refusal).
struct Reply {
  int status = 200;
  std::string body;
};

/// A path a request named, made a path on disk: `dir` where it may be read,
/// else the status (4xx) and why.
struct Resolved {
  std::string dir;
  int status = 0;
  std::string why;
  explicit operator bool() const { return status == 0; }
};

/// `{"error": why}`.
[[nodiscard]] Reply refusal(int status, std::string_view why);

/// Why the user `chorus serve` runs as is not shown `path` (the runs
/// directory, a directory below it, or a file of a run), or "" where it is.
/// The kernel must let that user read it (access(2) with the effective ids:
/// a directory also entered). And where serve runs as root, which the
/// kernel lets read anything, a path another user owns must also let root
/// read it by its mode as it stands to a user who is not its owner: its
/// group's bits where root is in its group, else the bits for everyone. So
/// root shows only what each owner lets other users read, never a private
/// (0700) run of another user.
[[nodiscard]] std::string not_shown(const std::string& path);

/// How often an event stream looks again whether a running run's host lives
/// (its lease, or its WAL lock: io/store/lease.hpp).
inline constexpr std::chrono::seconds liveness_look{2};

/// What an event stream has told a page of a run so far.
struct Seen {
  bool started = false;
  std::uint64_t history_rows = 0, system_rows = 0;
  std::size_t history_keys = 0;
  bool history_indexing = false;
  bool system_indexing = false;
  std::uint64_t histogram_lines = 0;
  bool histograms_indexing = false;
  std::uint64_t media_lines = 0;
  bool media_indexing = false;
  std::string run_stamp; // run.json's and summary.json's size and time
  bool running = false;  // the run read running (its host alive, or not known to be gone)
  std::chrono::steady_clock::time_point run_looked; // when it was last read
};

/// Api::runs_stamp() made short (16 hex digits): GET /api/runs's `version`,
/// which a page gives GET /api/runs/stream as `since`.
[[nodiscard]] std::string runs_version(std::string_view stamp);

class Api {
public:
  /// `root` is the directory the runs are under, as its real path;
  /// `cache_bytes` bounds what the indexes of the runs opened hold together
  /// (the least recently used go first; the one in use always stays).
  /// `store`, where given, keeps the indexes of long files between runs of
  /// the server; `built`, where given, is called (from another thread) when
  /// a long file's index, built in the background, is whole.
  Api(std::string root, std::size_t cache_bytes, std::shared_ptr<IndexStore> store = nullptr,
      std::function<void()> built = {});
  ~Api();

  [[nodiscard]] const std::string& root() const noexcept { return root_; }

  /// GET /api/runs: every run by project and group, the newest first.
  /// One listing at a time: a second waits, then finds the runs the first
  /// read (those not running) in its cache, a stat or two each. Where the
  /// runs' directories are watched (runs_stamp) and saw no change at all
  /// since the last answer, and no run is running, that answer is given again.
  Reply runs();
  /// What tells whether GET /api/runs would answer anything new: the times
  /// of the directories down to the runs' own (a run's run.json,
  /// summary.json and lease.json are replaced by rename, which changes its
  /// directory's time), and whether each run reads running; while one does,
  /// also the time in steps of `running_every`, so that its progress is
  /// shown again that often, and a lease that ran out is seen. Looked at afresh at most once
  /// per `stamp_every`, for any number of pages following the list
  /// (GET /api/runs/stream); `fresh`: looked at now, whatever the last look's age.
  /// On a local filesystem the directories are watched (inotify), and a look
  /// finds nothing changed without one stat; elsewhere (NFS, where other
  /// hosts' changes raise no event) each look stats them.
  std::string runs_stamp(bool fresh = false);
  static constexpr std::chrono::milliseconds stamp_every{250};
  static constexpr std::chrono::seconds running_every{5};
  /// GET /api/run?run=REL: a run's identity, ranks, config, summary,
  /// artifacts, its metrics' declarations, its history's keys and its system keys.
  Reply run(std::string_view rel);
  /// GET /api/series?run=REL&file=history|system&key=K...: series for a chart.
  Reply series(std::string_view rel, FileKind kind, const SeriesRequest& r);
  /// GET /api/histograms?run=REL&column=C...: a histogram column's quantiles
  /// over its steps and one step's buckets, for a chart.
  Reply histograms(std::string_view rel, const HistogramRequest& r);
  /// GET /api/media?run=REL[&key=K[&step=S]]: the run's image, text and
  /// table keys; with `key`, that key's steps and the entries of one step.
  Reply media(std::string_view rel, std::string_view key, std::optional<std::int64_t> step);
  /// GET /api/group?group=REL: a group's manifest and members.
  Reply group(std::string_view rel);

  /// The run directory `rel` (PROJECT/GROUP/RUN or PROJECT/RUN, relative
  /// to the root) names. Refused: anything but plain names (no "..", ".",
  /// empty or hidden parts, no absolute path), a path leading out of the root
  /// through a link (403), a directory that holds no run (404).
  [[nodiscard]] Resolved resolve_run(std::string_view rel) const;
  /// The group directory `rel` (PROJECT/GROUP) names, on the same rules.
  [[nodiscard]] Resolved resolve_group(std::string_view rel) const;
  /// The artifact file `name` of the run `rel` (artifacts/NAME), inside the run's directory.
  [[nodiscard]] Resolved resolve_artifact(std::string_view rel, std::string_view name) const;
  /// The media file a line of the run's media.jsonl names for `key` at
  /// `step` from `rank` (never a path from the request), inside the run's
  /// media/ through no link out of it; `type` is its Content-Type.
  [[nodiscard]] Resolved resolve_media(std::string_view rel, std::string_view key, std::int64_t step, int rank,
                                       std::string_view& type);

  /// What changed in the run `rel` since `seen`, as server-sent events
  /// (`history`, `system`, `histograms`, `media`, `run`); "" where nothing did.
  std::string changes(std::string_view rel, Seen& seen);

  /// Bytes the indexes of runs hold.
  [[nodiscard]] std::size_t cached_bytes();

private:
  struct RunFiles {
    RunFiles(const std::string& dir, const std::shared_ptr<IndexStore>& store, const std::function<void()>& built)
        : history(dir + "/history.jsonl", FileKind::history), system(dir + "/system.jsonl", FileKind::system),
          histograms(dir + "/histograms.jsonl"), media(dir + "/media.jsonl") {
      history.keep_in(store);
      system.keep_in(store);
      history.when_built(built);
      system.when_built(built);
      // Where serve runs as root, a run's summary is read only where its owner lets others read it.
      history.shown_by([](const std::string& path) { return not_shown(path).empty(); });
    }
    [[nodiscard]] std::size_t memory() const {
      return history.memory() + system.memory() + histograms.memory() + media.memory();
    }
    LinesIndex history, system;
    HistogramIndex histograms;
    MediaIndex media;
    std::atomic<std::uint64_t> used{0};
    std::mutex specs_mutex;
    std::string specs_stamp; // metrics.json's, when its step metrics were last given to `history`
  };
  struct ListEntry {
    std::string stamp; // run.json's and summary.json's
    double start = 0;
    std::string json;
  };

  /// The indexes of the run in `dir`, those asked for refreshed.
  std::shared_ptr<RunFiles> files(const std::string& dir, bool history, bool system, bool histograms, bool media);
  void evict();
  [[nodiscard]] std::string rel_of(const std::string& dir) const;
  /// What of a directory is to be shown: a run (each file of it that is
  /// read), its entry in a list (run.json, summary.json, lease.json), a group.
  enum class Shown { run, list_entry, group };
  /// Why the run or group directory `dir` (a real path inside the root) is
  /// not shown (not_shown: it, a directory above it up to the root, or a
  /// file of it that `what` reads), or "". `looked` keeps what was found of
  /// the directories above it, for a listing of many.
  [[nodiscard]] std::string hidden(const std::string& dir, Shown what,
                                   std::map<std::string, std::string>* looked = nullptr) const;

  const std::string root_;
  const std::size_t cache_bytes_;
  const std::shared_ptr<IndexStore> store_;
  const std::function<void()> built_;
  std::mutex mutex_; // guards the maps below
  std::map<std::string, std::shared_ptr<RunFiles>> files_;
  std::map<std::string, ListEntry> listed_;
  std::mutex list_mutex_; // one runs() at a time; guards the two below
  std::string last_list_;  // runs()'s last answer, where it may stand (else empty)
  std::uint64_t last_list_changes_ = 0; // changes_ when it was made
  std::atomic<std::uint64_t> clock_{0};
  struct Liveness {
    std::uint64_t dir_time = 0; // the run directory's time when it was read
    bool running = false;
    std::chrono::steady_clock::time_point looked{};
  };
  std::mutex stamp_mutex_; // guards the members below: runs_stamp()'s last look
  std::string stamp_;
  std::chrono::steady_clock::time_point stamp_at_{};
  std::vector<std::string> looked_;         // the directories the last listing looked at
  std::vector<std::uint64_t> looked_times_; // and their times then
  std::vector<std::pair<std::string, std::size_t>> run_dirs_; // the runs it found, and where in looked_
  std::map<std::string, Liveness> live_;
  bool live_now_ = false;     // whether a run read running at the last look
  std::uint64_t changes_ = 0; // looks that found (or could not rule out) a change
  platform::DirWatch watch_;  // of looked_, where it can answer for them all
};

} // namespace chorus::cli::serve
