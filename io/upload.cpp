// The Uploader (io/upload.hpp): run directory → Backend, with the delivery
// rules, the offsets and the lock.
#include "io/upload.hpp"

#include "io/json.hpp"
#include "io/posix.hpp"
#include "io/run_dir.hpp"
#include "io/upload/registry.hpp"
#include "runtime/fnv.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <dirent.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace chorus::io {
namespace {

using detail::os_error;

// FNV-1a 64 from a basis one digit short of the standard one: upload/<id>.json
// keeps these digests of what went up, so changing it would send config.json
// and summary.json again to every target a run already reached.
constexpr std::uint64_t digest_basis = 1469598103934665603ull;

std::string digest(std::string_view s) {
  const std::uint64_t h = chorus::detail::fnv1a64(s, digest_basis);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::int64_t seconds_to_ms(double s) { return static_cast<std::int64_t>(std::llround(s * 1000.0)); }

void write_cursor(JsonWriter& w, std::string_view name, const Cursor& c) {
  w.key(name).begin_object().key("lines").uinteger(c.lines).key("bytes").uinteger(c.bytes).end_object();
}

bool read_cursor(simdjson::dom::element doc, const char* name, Cursor& c) {
  simdjson::dom::element e;
  if (doc[name].get(e) != simdjson::SUCCESS) return true;
  std::uint64_t lines = 0, bytes = 0;
  if (e["lines"].get(lines) != simdjson::SUCCESS || e["bytes"].get(bytes) != simdjson::SUCCESS) return false;
  c = {lines, bytes};
  return true;
}

} // namespace

// ---------------------------------------------------------------------------

Error read_lines(const std::string& path, Cursor from, std::size_t max_bytes, LineSlice& out) {
  out.buf.clear();
  out.lines.clear();
  out.after.clear();
  Error err;
  int err_no = 0;
  const int fd = detail::open_regular(path, O_RDONLY, err, &err_no); // never blocks on a FIFO planted there
  if (fd < 0) return err_no == ENOENT ? Error() : err;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    detail::close_fd(fd);
    return os_error("cannot stat", path, e);
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < from.bytes) {
    detail::close_fd(fd);
    return Error(Errc::io_error, path + " is shorter (" + std::to_string(size) + " bytes) than what was already uploaded (" +
                                     std::to_string(from.bytes) +
                                     " bytes): it was rewritten. Remove the target's file in upload/ to upload the run "
                                     "again as a new remote run");
  }
  // Whole lines, read max_bytes (at least 64 KiB) at a time: those of the
  // first read that holds a newline, and of the reads before it.
  LineReader lines(fd, path, from, {.chunk = std::max<std::size_t>(max_bytes, 1u << 16), .max_line = 0, .end = size});
  std::vector<std::size_t> starts;
  for (std::string_view line;;) {
    if (lines.cursor() != from && lines.read_to() - from.bytes >= max_bytes && !lines.holds_line()) break;
    const LineReader::Next next = lines.next(line);
    if (next == LineReader::Next::failed) {
      out.buf.clear();
      out.after.clear();
      return lines.error();
    }
    if (next != LineReader::Next::line) break;
    if (line.empty()) continue; // not a record (and not counted as one by anybody)
    starts.push_back(out.buf.size());
    out.buf.append(line).push_back('\n');
    out.after.push_back(lines.cursor());
  }
  for (std::size_t i = 0; i < starts.size(); ++i)
    out.lines.emplace_back(out.buf.data() + starts[i], (i + 1 < starts.size() ? starts[i + 1] : out.buf.size()) - starts[i] - 1);
  // Blank lines at the end still move the cursor past them.
  if (!out.after.empty()) out.after.back() = lines.cursor();
  return {};
}

// ---------------------------------------------------------------------------

Error UploadState::load(const std::string& path) {
  std::string text;
  if (Error e = detail::read_text(path, text, true)) return e;
  if (text.empty()) return {};
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  auto bad = [&] {
    return Error(Errc::io_error, path + " is not a valid upload offsets file: remove it to upload the run again "
                                        "from the start (as a new remote run)");
  };
  if (parser.parse(text).get(doc) != simdjson::SUCCESS || !doc.is_object()) return bad();
  auto str = [&](const char* k, std::string& out) {
    std::string_view v;
    if (doc[k].get(v) == simdjson::SUCCESS) out = std::string(v);
  };
  auto num = [&](const char* k, std::uint64_t& out) {
    std::uint64_t v = 0;
    if (doc[k].get(v) == simdjson::SUCCESS) out = v;
  };
  str("url", url);
  str("remote_run", remote_run);
  str("experiment", experiment);
  str("entity", entity);
  str("project", project);
  str("config_sent", config_sent);
  str("summary_sent", summary_sent);
  str("final_sent", final_sent);
  str("last_error", last_error);
  num("points", points);
  num("refused", refused);
  num("history_part", history_part);
  num("system_part", system_part);
  num("final_attempt", final_attempt);
  if (!final_sent.empty() && final_attempt == 0) final_attempt = 1; // written before final_attempt
  if (!read_cursor(doc, "history", history) || !read_cursor(doc, "system", system) ||
      !read_cursor(doc, "artifacts", artifacts))
    return bad();
  return {};
}

namespace {

std::string render_state(const UploadState& s) {
  std::string out;
  JsonWriter w(out);
  w.begin_object();
  w.key("url").string(s.url).key("remote_run").string(s.remote_run).key("experiment").string(s.experiment);
  w.key("entity").string(s.entity).key("project").string(s.project);
  write_cursor(w, "history", s.history);
  w.key("history_part").uinteger(s.history_part);
  write_cursor(w, "system", s.system);
  w.key("system_part").uinteger(s.system_part);
  write_cursor(w, "artifacts", s.artifacts);
  w.key("config_sent").string(s.config_sent).key("summary_sent").string(s.summary_sent);
  w.key("final_sent").string(s.final_sent).key("final_attempt").uinteger(s.final_attempt);
  w.key("points").uinteger(s.points).key("refused").uinteger(s.refused);
  w.key("last_error").string(s.last_error);
  w.end_object();
  out.push_back('\n');
  return out;
}

/// Replaces `path` with `content` through a rename, without the fsync of
/// write_file_atomic: a crash of the process leaves the old or the new file,
/// a crash of the machine may lose the latest replacements.
Error replace_file(const std::string& path, std::string_view content) {
  const auto slash = path.rfind('/') + 1; // hidden, as write_file_atomic's
  const std::string tmp = path.substr(0, slash) + "." + path.substr(slash) + ".tmp." + std::to_string(::getpid());
  Error err;
  const int fd = detail::open_private(tmp, O_WRONLY | O_CREAT | O_TRUNC, err);
  if (fd < 0) return err;
  err = detail::write_all(fd, content, tmp);
  detail::close_fd(fd);
  if (!err && ::rename(tmp.c_str(), path.c_str()) != 0) err = os_error("rename to " + path, tmp, errno);
  if (err) ::unlink(tmp.c_str());
  return err;
}

} // namespace

Error UploadState::save(const std::string& path) const { return write_file_atomic(path, render_state(*this)); }

// ---------------------------------------------------------------------------

std::optional<RunSnapshot> RunSnapshot::read(const std::string& run_dir, Error& error) {
  const std::string path = run_dir + "/run.json";
  Error e;
  const std::optional<RunRecord> run = RunRecord::read(path, e);
  if (!run) {
    // A file that cannot be read at all may be in no run directory; a damaged one says how to rebuild it.
    error = Error(Errc::io_error, e.code() == Errc::io_error ? e.message() + " (is " + run_dir + " a run directory?)"
                                                            : e.message());
    return std::nullopt;
  }
  if (run->id.empty()) {
    error = Error(Errc::io_error, path + " has no run id: run `chorus recover " + run_dir + "` to rebuild it from the WAL");
    return std::nullopt;
  }
  RunSnapshot r;
  static_cast<RunIdentity&>(r) = *run;
  r.dir = run_dir;
  if (r.name.empty()) r.name = r.id;
  r.state = run->state;
  if (run->start_us) r.start_ms = seconds_to_ms(RunRecord::seconds(*run->start_us));
  if (run->end_us) r.end_ms = seconds_to_ms(RunRecord::seconds(*run->end_us));
  r.attempts = run->segments.empty() ? 1 : run->segments.size();
  r.ended = !r.state.empty() && r.state != "running";
  r.exit_code = r.state == "finished" ? 0 : r.state == "killed" ? 143 : 1;
  if (r.ended && run->exit_codes) {
    int worst = 0;
    for (const auto& [rank, c] : *run->exit_codes)
      if (c != 0 && (worst == 0 || c > worst)) worst = static_cast<int>(c);
    if (worst != 0 || r.state == "finished") r.exit_code = worst;
  }
  if (r.ended && r.end_ms == 0) r.end_ms = r.start_ms;
  return r;
}

// ---------------------------------------------------------------------------

struct Uploader::Impl {
  std::string dir;
  UploadTarget target;
  UploadSettings settings;
  std::string upload_dir, state_file, lock_file, refused_file;
  std::unique_ptr<HttpClient> http; // for a backend that speaks HTTP
  std::unique_ptr<Backend> backend;
  UploadState st;
  Backoff backoff;
  bool remote_open = false;
  int lock_fd = -1;
  std::optional<SteadyTime> wait_until;
  std::string reported; // the last problem printed, so that each is printed once
  bool stopped = false;
  bool resume_checked = false; // whether a delivered end was checked against a resumed run
  std::string stop_reason;

  // A history or system slice is kept while the backend takes it a request
  // at a time (MLflow takes ~100 lines of a 4 MiB slice a request), from its
  // line `next` on, and read again once less than half a slice is left of
  // it: each byte is read at most about twice, not once a request.
  struct Kept {
    LineSlice slice;
    Cursor from;          // where the slice starts in the file
    std::size_t next = 0; // its first line not consumed

    /// The slice from `at`: what is left of the kept one when `at` is the
    /// start of one of its lines and at least half of `read_bytes` is left.
    Error refresh(const std::string& path, Cursor at, std::size_t read_bytes) {
      if (!slice.lines.empty()) {
        const auto& after = slice.after;
        std::size_t i = 0;
        if (at != from) {
          const auto it = std::lower_bound(after.begin(), after.end(), at.bytes,
                                           [](const Cursor& c, std::uint64_t b) { return c.bytes < b; });
          i = it == after.end() || *it != at ? after.size() + 1 : static_cast<std::size_t>(it - after.begin()) + 1;
        }
        if (i <= after.size() && after.back().bytes - at.bytes >= read_bytes / 2) {
          next = i;
          return {};
        }
      }
      from = at;
      next = 0;
      return read_lines(path, at, read_bytes, slice);
    }
    [[nodiscard]] std::span<const std::string_view> lines() const { return std::span(slice.lines).subspan(next); }
    [[nodiscard]] std::span<const Cursor> after() const { return std::span(slice.after).subspan(next); }
  };
  Kept history, system;
  LineSlice artifacts;
  std::vector<ArtifactEntry> entries;
  std::string config, summary;

  Impl(std::string d, UploadTarget t, UploadSettings s)
      : dir(std::move(d)), target(std::move(t)), settings(s), backoff(s.backoff_base, s.backoff_max) {
    upload_dir = dir + "/upload";
    state_file = upload_dir + "/" + target.id + ".json";
    lock_file = upload_dir + "/" + target.id + ".lock";
    refused_file = upload_dir + "/" + target.id + ".refused.jsonl";
  }
  ~Impl() {
    if (pending_durable && lock_fd >= 0) (void)st.save(state_file);
    if (lock_fd >= 0) detail::close_fd(lock_fd);
  }

  void report(const std::string& what) {
    if (what == reported) return;
    reported = what;
    std::fprintf(stderr, "chorus: upload to %s: %s\n", target.url.c_str(), what.c_str());
  }

  // The offsets are replaced after every answer, but made durable (fsync) at
  // most once per `durable_every`, and whenever the remote run or the end
  // state changes: an fsync costs milliseconds on many disks, one per
  // request capped MLflow at ~100 requests a second. What a crash of the
  // machine could lose (the last second's offsets) is settled with the
  // server as after a lost answer: MLflow's offset tag says what it
  // stored, W&B's file_stream places lines at their offsets.
  static constexpr std::chrono::milliseconds durable_every{1000};
  SteadyTime durable_at{};
  std::string durable_run, durable_final;
  bool pending_durable = false;

  void save() {
    const auto now = std::chrono::steady_clock::now();
    const bool durable =
        now - durable_at >= durable_every || st.remote_run != durable_run || st.final_sent != durable_final;
    if (!durable) {
      if (Error e = replace_file(state_file, render_state(st))) report(e.message());
      pending_durable = true;
      return;
    }
    if (Error e = st.save(state_file)) return report(e.message());
    durable_at = now;
    durable_run = st.remote_run;
    durable_final = st.final_sent;
    pending_durable = false;
  }

  void record_refused(const std::vector<std::string>& lines) {
    if (lines.empty()) return;
    Error err;
    auto f = AppendFile::open(refused_file, err);
    if (!f) return report(err.message());
    for (const std::string& l : lines) {
      (void)f->write(l);
      (void)f->write("\n");
    }
    if (Error e = f->flush()) report(e.message());
  }

  Error read_parts(const RunSnapshot& run) {
    if (Error e = history.refresh(dir + "/history.jsonl", st.history, settings.read_bytes)) return e;
    if (Error e = system.refresh(dir + "/system.jsonl", st.system, settings.read_bytes)) return e;
    if (Error e = read_lines(dir + "/artifacts.jsonl", st.artifacts, 1u << 20, artifacts)) return e;
    entries.clear();
    simdjson::dom::parser parser;
    for (std::string_view line : artifacts.lines) {
      ArtifactEntry a;
      simdjson::dom::element doc;
      std::string_view v;
      if (parser.parse(line.data(), line.size()).get(doc) == simdjson::SUCCESS) {
        if (doc["name"].get(v) == simdjson::SUCCESS) a.name = std::string(v);
        if (doc["type"].get(v) == simdjson::SUCCESS) a.type = std::string(v);
        if (doc["sha256"].get(v) == simdjson::SUCCESS) a.sha256 = std::string(v);
        std::uint64_t size = 0;
        if (doc["size"].get(size) == simdjson::SUCCESS) a.size = size;
      }
      entries.push_back(std::move(a)); // a malformed line stays an entry without a name: the backend skips it
    }
    if (Error e = detail::read_text(dir + "/config.json", config, true)) return e;
    if (Error e = detail::read_text(dir + "/summary.json", summary, true)) return e;
    (void)run;
    return {};
  }

  Progress pump(SteadyTime start_by) {
    Progress p;
    for (;;) {
      if (!st.final_sent.empty() && !resume_checked) {
        // A resumed run (Options::resume) runs again after an earlier
        // attempt's end went up: its new attempt goes on from the offsets,
        // to the same remote run, and its own end is sent in turn. That
        // attempt may have ended already, with nothing uploading it (a job
        // without CHORUS_UPLOAD, synced later): its end is still not sent.
        resume_checked = true;
        Error ignored;
        if (auto run = RunSnapshot::read(dir, ignored); run && (!run->ended || !st.end_delivered(run->attempts)))
          st.final_sent.clear();
      }
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
      Error err;
      auto run = RunSnapshot::read(dir, err);
      if (!run) return stop(p, err.message());
      Sent sent;
      if (!remote_open) {
        sent = backend->open(*run, st);
        if (sent.delivery == Delivery::ok) {
          remote_open = true;
          save();
        }
      } else {
        if (Error e = read_parts(*run)) return stop(p, e.message());
        Batch b;
        b.history = history.lines();
        b.system = system.lines();
        b.history_from = st.history;
        b.system_from = st.system;
        b.history_after = history.after();
        b.system_after = system.after();
        b.artifacts = entries;
        const bool config_changed = !config.empty() && digest(config) != st.config_sent;
        if (config_changed) b.config = &config;
        const bool rest_empty = b.history.empty() && b.system.empty() && b.artifacts.empty() && !config_changed;
        const bool summary_changed = !summary.empty() && digest(summary) != st.summary_sent;
        b.final = run->ended && rest_empty;
        if (summary_changed && (backend->live_summary() || b.final)) b.summary = &summary;
        if (rest_empty && !b.summary && !b.final) {
          p.caught_up = true;
          p.error = st.last_error;
          return p;
        }
        sent = backend->send(*run, b, st);
        bool moved = false;
        if (sent.history > 0) st.history = b.history_after[sent.history - 1], moved = true;
        if (sent.system > 0) st.system = b.system_after[sent.system - 1], moved = true;
        if (sent.artifacts > 0) st.artifacts = artifacts.after[sent.artifacts - 1], moved = true;
        if (sent.config) st.config_sent = digest(config), moved = true;
        if (sent.summary) st.summary_sent = digest(summary), moved = true;
        if (sent.final) {
          st.final_sent = run->state.empty() ? "ended" : run->state;
          st.final_attempt = run->attempts;
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
      switch (sent.delivery) {
        case Delivery::ok:
          backoff.reset();
          if (!reported.empty() && st.last_error.empty()) {
            report("delivering again");
            reported.clear();
          }
          if (sent.not_before) wait_until = sent.not_before;
          if (!sent.message.empty()) report(sent.message); // refused values, reported once
          break;
        case Delivery::retry: {
          const auto wait = backoff.next(sent.retry_after);
          wait_until = std::chrono::steady_clock::now() + wait;
          st.last_error = sent.message;
          save();
          report(sent.message + "; retrying (the data stays in the run directory)");
          break;
        }
        case Delivery::refused:
          return stop(p, sent.message);
      }
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
  if (Error e = make_dirs(s.upload_dir)) return e;
  Error err;
  s.lock_fd = detail::open_private(s.lock_file, O_RDWR | O_CREAT, err);
  if (s.lock_fd < 0) return err;
  if (::flock(s.lock_fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    (void)detail::read_text(s.lock_file, holder, true);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    detail::close_fd(s.lock_fd);
    s.lock_fd = -1;
    return Error(Errc::invalid_argument, "another process" + (holder.empty() ? std::string() : " (pid " + holder + ")") +
                                             " is uploading " + s.dir + " to " + s.target.url +
                                             ": wait for it to end, or stop it");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(s.lock_fd, 0) == 0) (void)detail::write_all(s.lock_fd, pid, s.lock_file);
  if (Error e = s.st.load(s.state_file)) return e;
  // Same target id, another spelling (wandb:// and wandb+https://): the offsets still hold.
  s.st.url = s.target.url;
  const std::optional<BackendSpec> spec = find_backend(s.target.backend);
  if (!spec) return Error(Errc::invalid_argument, "no upload backend is named '" + s.target.backend + "'");
  if (spec->connections > 0) s.http = std::make_unique<HttpClient>(spec->connections);
  s.backend = spec->make(BackendContext{s.target, s.http.get()}, err);
  if (!s.backend) return err;
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
std::string Uploader::state_path() const { return impl_->state_file; }

std::uint64_t Uploader::points_pending() const { return io::points_pending(impl_->dir, impl_->st); }

std::uint64_t Uploader::bytes_pending() const {
  std::uint64_t n = 0;
  for (auto [file, cursor] : {std::pair{"/history.jsonl", impl_->st.history}, std::pair{"/system.jsonl", impl_->st.system}}) {
    struct stat sb {};
    if (::stat((impl_->dir + file).c_str(), &sb) == 0 && static_cast<std::uint64_t>(sb.st_size) > cursor.bytes)
      n += static_cast<std::uint64_t>(sb.st_size) - cursor.bytes;
  }
  return n;
}

std::uint64_t points_pending(const std::string& run_dir, const UploadState& state) {
  std::uint64_t n = 0;
  simdjson::dom::parser parser;
  auto count = [&](const std::string& path, Cursor from, std::uint64_t part) {
    LineSlice slice;
    for (;;) {
      if (read_lines(path, from, 4u << 20, slice) || slice.lines.empty()) return;
      for (std::string_view line : slice.lines) {
        simdjson::dom::object obj;
        if (parser.parse(line.data(), line.size()).get(obj) != simdjson::SUCCESS) continue;
        std::uint64_t values = 0;
        for (auto field : obj)
          if (!field.key.starts_with("_") && (field.value.is_number() || field.value.is_string())) ++values;
        n += values - std::min(values, part);
        part = 0;
      }
      from = slice.after.back();
    }
  };
  count(run_dir + "/history.jsonl", state.history, state.history_part);
  count(run_dir + "/system.jsonl", state.system, state.system_part);
  return n;
}

std::vector<std::pair<std::string, std::string>> upload_targets(const std::string& run_dir) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string dir = run_dir + "/upload";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.ends_with(".json") || name.ends_with(".keys.json")) continue;
    out.emplace_back(std::string(name.substr(0, name.size() - 5)), dir + "/" + std::string(name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace chorus::io
