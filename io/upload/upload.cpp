// The Uploader (io/upload/upload.hpp): the pump that reads the run directory into
// Batches, hands them to the target's backend, advances the offsets by what
// was consumed, and applies the delivery rules (backoff, Retry-After, a
// refusal reported once). Its parts are in io/upload/: the backends'
// registry, the offsets file, the slices read, the lock.
#include "io/upload/upload.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/upload/lock.hpp"
#include "io/upload/offsets.hpp"
#include "io/upload/registry.hpp"
#include "io/upload/slices.hpp"

#include <cstdio>
#include <sys/stat.h>

namespace chorus::upload {

using upload::delivered_digest;

struct Uploader::Impl {
  std::string dir;
  UploadTarget target;
  UploadSettings settings;
  std::string upload_dir, lock_file, refused_file;
  std::unique_ptr<HttpClient> http; // for a backend that speaks HTTP
  std::unique_ptr<Backend> backend;
  UploadState st;
  OffsetsWriter offsets;
  Backoff backoff;
  bool remote_open = false;
  int lock_fd = -1;
  std::optional<SteadyTime> wait_until;
  std::string reported; // the last problem printed, so that each is printed once
  bool stopped = false;
  bool resume_checked = false; // whether a delivered end was checked against a resumed run
  std::string stop_reason;

  KeptSlice history, system, histograms, media, events;
  std::optional<SteadyTime> ended_at; // when run.json was first seen to hold the run's end
  StepsBefore before; // histograms.jsonl's and media.jsonl's last steps as read before history.jsonl
  LineSlice artifacts;
  std::vector<ArtifactEntry> entries;
  std::string config, summary;
  /// A file of the run read up to a line too long (store::line_too_long), the
  /// first met: what it holds after that line cannot be uploaded, so the run's
  /// end is not sent, and the upload stops once the rest has gone.
  Error damaged;

  Impl(std::string d, UploadTarget t, UploadSettings s)
      : dir(std::move(d)), target(std::move(t)), settings(s),
        offsets(dir + "/upload/" + target.id + ".json"), backoff(s.backoff_base, s.backoff_max) {
    upload_dir = dir + "/upload";
    lock_file = upload_dir + "/" + target.id + ".lock";
    refused_file = upload_dir + "/" + target.id + ".refused.jsonl";
  }
  ~Impl() {
    if (lock_fd >= 0) (void)offsets.flush(st);
    if (lock_fd >= 0) platform::close_fd(lock_fd);
  }

  void report(const std::string& what) {
    if (what == reported) return;
    reported = what;
    std::fprintf(stderr, "chorus: upload to %s: %s\n", target.url.c_str(), what.c_str());
  }

  void save() {
    if (Error e = offsets.save(st)) report(e.message());
  }

  void record_refused(const std::vector<std::string>& lines) {
    if (lines.empty()) return;
    const Result<std::unique_ptr<platform::AppendFile>> f = platform::AppendFile::open(refused_file);
    if (!f) return report(f.error().message());
    for (const std::string& l : lines) {
      (void)(*f)->write(l);
      (void)(*f)->write("\n");
    }
    if (Error e = (*f)->flush()) report(e.message());
  }

  Error read_parts() {
    // What histograms.jsonl and media.jsonl held as read before history.jsonl now is.
    before = {last_step(histograms), last_step(media)};
    // A live run's files are read as far as its synced WAL backs them
    // (DurableBounds), history.jsonl's bound first: the others' are as new.
    const auto bound = [d = settings.durable.get()](const std::atomic<std::uint64_t> DurableBounds::* b) {
      return d ? (d->*b).load() : UINT64_MAX;
    };
    if (Error e = history.refresh(dir + "/history.jsonl", st.history, settings.read_bytes, {},
                                  bound(&DurableBounds::history)))
      return e;
    if (Error e = system.refresh(dir + "/system.jsonl", st.system, settings.read_bytes)) return e;
    const HistogramUse use = backend->histograms();
    // By step, histograms.jsonl and media.jsonl are read anew each time, in
    // that order after history.jsonl: what they hold then says which of the
    // rows read are whole (whole_steps).
    const bool by_step = use == HistogramUse::by_step;
    const SteadyTime fresh_after = by_step ? SteadyTime::max() : SteadyTime{};
    using Lines = upload::KeptSlice::Lines;
    if (use != HistogramUse::none) {
      if (Error e = histograms.refresh(dir + "/histograms.jsonl", st.histograms, settings.read_bytes, fresh_after,
                                       bound(&DurableBounds::histograms)))
        return e;
      if (by_step) {
        history.index_steps(Lines::history);
        histograms.index_steps(Lines::histograms);
      }
    }
    if (backend->media()) {
      if (Error e = media.refresh(dir + "/media.jsonl", st.media, settings.read_bytes, fresh_after,
                                  bound(&DurableBounds::media)))
        return e;
      if (by_step) media.index_steps(Lines::media);
    }
    // Read after run.json (pump reads it first): once the run is seen ended,
    // the end goes only after every line of a slice read since then. (The
    // events the end itself brings are written just after run.json's end:
    // the webhook waits for them, io/upload/webhook.cpp.)
    if (backend->events())
      if (Error e = events.refresh(dir + "/events.jsonl", st.events, settings.read_bytes, ended_at.value_or(SteadyTime{}),
                                   bound(&DurableBounds::events)))
        return e;
    if (Error e = read_lines(dir + "/artifacts.jsonl", st.artifacts, 1u << 20, artifacts)) return e;
    read_artifacts(artifacts.lines, entries);
    damaged = {};
    for (const LineSlice* l : {&history.slice, &system.slice, &histograms.slice, &media.slice, &events.slice, &artifacts})
      if (l->damaged && !damaged) damaged = l->damaged;
    Result<std::string> c = platform::read_text(dir + "/config.json", true);
    if (!c) return c.error();
    Result<std::string> s = platform::read_text(dir + "/summary.json", true);
    if (!s) return s.error();
    config = std::move(*c);
    summary = std::move(*s);
    return {};
  }

  /// A resumed run (Options::resume) runs again after an earlier attempt's
  /// end went up: its new attempt goes on from the offsets, to the same
  /// remote run, and its own end is sent in turn. That attempt may have
  /// ended already, with nothing uploading it (a job without CHORUS_UPLOAD,
  /// synced later): its end is still not sent.
  void check_resumed() {
    if (st.final_sent.empty() || resume_checked) return;
    resume_checked = true;
    if (auto run = RunSnapshot::read(dir); run && (!run->ended || !st.end_delivered(run->attempts)))
      st.final_sent.clear();
  }

  /// The next Batch: what the run directory holds beyond the offsets.
  /// Empty (nothing to send now) when it holds nothing new.
  std::optional<Batch> next_batch(const RunSnapshot& run) {
    Batch b;
    b.history = history.lines();
    b.system = system.lines();
    b.history_from = st.history;
    b.system_from = st.system;
    b.histograms_from = st.histograms;
    b.media_from = st.media;
    b.events_from = st.events;
    b.history_after = history.after();
    b.system_after = system.after();
    const HistogramUse use = backend->histograms();
    if (use != HistogramUse::none) {
      b.histograms = histograms.lines();
      b.histograms_after = histograms.after();
    }
    if (backend->media()) {
      b.media = media.lines();
      b.media_after = media.after();
    }
    if (backend->events()) {
      b.events = events.lines();
      b.events_after = events.after();
    }
    bool left_out = false; // lines of steps not yet whole
    if (use == HistogramUse::by_step) {
      const WholeSteps whole =
          whole_steps(history, histograms, backend->media() ? &media : nullptr, before, ended_at);
      left_out = whole.history < b.history.size() || whole.histograms < b.histograms.size() ||
                 whole.media < b.media.size();
      b.history = b.history.first(whole.history);
      b.history_after = b.history_after.first(whole.history);
      b.histograms = b.histograms.first(whole.histograms);
      b.histograms_after = b.histograms_after.first(whole.histograms);
      b.media = b.media.first(whole.media);
      b.media_after = b.media_after.first(whole.media);
    }
    b.artifacts = entries;
    const bool config_changed = !config.empty() && delivered_digest(config) != st.config_sent;
    if (config_changed) b.config = &config;
    const bool rest_empty = b.history.empty() && b.system.empty() && b.histograms.empty() && b.media.empty() &&
                            b.events.empty() && b.artifacts.empty() && !config_changed;
    const bool summary_changed = !summary.empty() && delivered_digest(summary) != st.summary_sent;
    b.final = run.ended && rest_empty && !left_out && !damaged;
    if (summary_changed && (backend->live_summary() || b.final)) b.summary = &summary;
    if (rest_empty && !b.summary && !b.final) return std::nullopt;
    return b;
  }

  /// Moves the offsets over what the backend consumed of `b`.
  void advance(const RunSnapshot& run, const Batch& b, const Sent& sent) {
    bool moved = false;
    if (sent.history > 0) st.history = b.history_after[sent.history - 1], moved = true;
    if (sent.system > 0) st.system = b.system_after[sent.system - 1], moved = true;
    if (sent.histograms > 0) st.histograms = b.histograms_after[sent.histograms - 1], moved = true;
    if (sent.media > 0) st.media = b.media_after[sent.media - 1], moved = true;
    if (sent.events > 0) st.events = b.events_after[sent.events - 1], moved = true;
    st.histogram_rows += sent.histogram_rows;
    if (sent.artifacts > 0) st.artifacts = artifacts.after[sent.artifacts - 1], moved = true;
    if (sent.config) st.config_sent = delivered_digest(config), moved = true;
    if (sent.summary) st.summary_sent = delivered_digest(summary), moved = true;
    if (sent.final) {
      st.final_sent = run.state.empty() ? "ended" : run.state;
      st.final_attempt = run.attempts;
      moved = true;
    }
    st.points += sent.points;
    st.refused += sent.refused_points;
    record_refused(sent.refused);
    if (moved || sent.points || sent.refused_points) {
      if (sent.delivery == Delivery::ok) st.last_error.clear();
      save();
    }
  }

  /// The delivery rules, after an answer: back off from what may succeed
  /// later (Retry-After honoured), wait out a client-side rate limit, report
  /// each problem once. False where the answer stops the upload.
  bool settle(const Sent& sent) {
    switch (sent.delivery) {
      case Delivery::ok:
        backoff.reset();
        if (!reported.empty() && st.last_error.empty()) {
          report("delivering again");
          reported.clear();
        }
        if (sent.not_before) wait_until = sent.not_before;
        if (!sent.message.empty()) report(sent.message); // refused values, reported once
        return true;
      case Delivery::retry: {
        const auto wait = backoff.next(sent.retry_after);
        wait_until = std::chrono::steady_clock::now() + wait;
        st.last_error = sent.message;
        save();
        report(sent.message + "; retrying (the data stays in the run directory)");
        return true;
      }
      case Delivery::refused: return false;
    }
    return false;
  }

  Progress pump(SteadyTime start_by) {
    Progress p;
    for (;;) {
      check_resumed();
      if (!st.final_sent.empty()) {
        p.done = p.caught_up = true;
        return p;
      }
      if (stopped) {
        p.stopped = true;
        p.error = stop_reason;
        return p;
      }
      const auto now = std::chrono::steady_clock::now();
      if (wait_until && now < *wait_until) {
        p.wait_until = wait_until;
        p.error = st.last_error;
        return p;
      }
      wait_until.reset();
      if (now >= start_by) {
        p.error = st.last_error;
        return p;
      }
      auto run = RunSnapshot::read(dir);
      if (!run) return stop(p, run.error().message());
      // A live run's end goes once its WAL holds it synced, with every line before it.
      if (settings.durable && !settings.durable->ended.load()) run->ended = false;
      if (!run->ended) ended_at.reset();
      else if (!ended_at) ended_at = now;
      Sent sent;
      if (!remote_open) {
        sent = backend->open(*run, st);
        if (sent.delivery == Delivery::ok) {
          remote_open = true;
          save();
        }
      } else {
        if (Error e = read_parts()) return stop(p, e.message());
        const std::optional<Batch> b = next_batch(*run);
        // Everything before a line too long has gone: nothing after it ever can.
        if (!b && damaged) return stop(p, damaged.message() + "; what comes before it is uploaded, the run's end is not");
        if (!b) {
          p.caught_up = true;
          p.error = st.last_error;
          return p;
        }
        sent = backend->send(*run, *b, st);
        advance(*run, *b, sent);
      }
      if (!settle(sent)) return stop(p, sent.message);
    }
  }

  Progress stop(Progress& p, std::string why) {
    stopped = true;
    stop_reason = why;
    st.last_error = why;
    save();
    report(why + "; stopped: what is not uploaded stays in the run directory, and `chorus sync` sends it once that is changed");
    p.stopped = true;
    p.error = std::move(why);
    return p;
  }
};

Uploader::Uploader(std::string run_dir, UploadTarget target, UploadSettings settings)
    : impl_(std::make_unique<Impl>(std::move(run_dir), std::move(target), settings)) {}

Uploader::~Uploader() = default;

Error Uploader::open() {
  Impl& s = *impl_;
  if (Error e = platform::make_dirs(s.upload_dir)) return e;
  const Result<int> lock = take_upload_lock(s.lock_file, s.dir + " to " + s.target.url);
  if (!lock) return lock.error();
  s.lock_fd = *lock;
  if (Error e = s.st.load(s.offsets.path())) return e;
  // Same target id, another spelling (wandb:// and wandb+https://): the offsets still hold.
  s.st.url = s.target.url;
  const std::optional<BackendSpec> spec = find_backend(s.target.backend);
  if (!spec) return Error(Errc::invalid_argument, "no upload backend is named '" + s.target.backend + "'");
  if (spec->connections > 0) s.http = std::make_unique<HttpClient>(spec->connections);
  Result<std::unique_ptr<Backend>> backend = spec->make(BackendContext{s.target, s.http.get()});
  if (!backend) return backend.error();
  s.backend = std::move(*backend);
  return {};
}

Uploader::Progress Uploader::pump(SteadyTime start_by) {
  if (!impl_->backend) {
    Progress p;
    p.stopped = true;
    p.error = "the Uploader was not opened";
    return p;
  }
  return impl_->pump(start_by);
}

// A backend that speaks no HTTP has no request to cut and is never unreachable.
void Uploader::cut_requests_at(SteadyTime at) noexcept {
  if (impl_->http) impl_->http->cut_at(at);
}
void Uploader::limit_silence(std::chrono::milliseconds grace) noexcept {
  if (impl_->http) impl_->http->limit_silence(grace);
}
bool Uploader::unreachable() const noexcept { return impl_->http && impl_->http->unreachable(); }
void Uploader::retry_now() noexcept { impl_->wait_until.reset(); }

const UploadState& Uploader::state() const noexcept { return impl_->st; }
const UploadTarget& Uploader::target() const noexcept { return impl_->target; }
std::string Uploader::state_path() const { return impl_->offsets.path(); }

std::uint64_t Uploader::points_pending() const { return upload::points_pending(impl_->dir, impl_->st); }

std::uint64_t Uploader::bytes_pending() const {
  std::uint64_t n = 0;
  const bool histograms = impl_->backend && impl_->backend->histograms() != HistogramUse::none;
  const bool media = impl_->backend && impl_->backend->media();
  const bool events = impl_->backend && impl_->backend->events();
  for (auto [file, cursor] : {std::pair{"/history.jsonl", impl_->st.history}, std::pair{"/system.jsonl", impl_->st.system},
                              std::pair{"/histograms.jsonl", impl_->st.histograms},
                              std::pair{"/media.jsonl", impl_->st.media}, std::pair{"/events.jsonl", impl_->st.events}}) {
    if (!histograms && std::string_view(file) == "/histograms.jsonl") continue;
    if (!media && std::string_view(file) == "/media.jsonl") continue;
    if (!events && std::string_view(file) == "/events.jsonl") continue;
    struct stat sb {};
    if (::stat((impl_->dir + file).c_str(), &sb) == 0 && static_cast<std::uint64_t>(sb.st_size) > cursor.bytes)
      n += static_cast<std::uint64_t>(sb.st_size) - cursor.bytes;
  }
  return n;
}

} // namespace chorus::upload
