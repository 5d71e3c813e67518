// `chorus sync RUN|GROUP --to URL`: upload runs made offline, or whose live
// upload was cut off, resuming from their offsets (every point once), and
// `chorus sync --status`: how far each run's upload to each target got.
#include "cli/cli.hpp"
#include "cli/recover.hpp"
#include "cli/run_info.hpp"
#include "io/upload/upload.hpp"
#include "runtime/core/upload_url.hpp"

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

namespace chorus::cli {
int sync_main(std::span<char* const> args); // below
std::string backend_urls();                 // below

const Command sync_command{
    .name = "sync",
    .summary = "upload runs to MLflow, W&B or TensorBoard files (offline runs, cut-off uploads), or show how far "
               "their uploads got (--status)",
    .usage = "RUN|GROUP --to URL [--dir DIR] [--timeout SECONDS]\n--status [RUN|GROUP|DIR]",
    .help = R"(Uploads a run, or every run of a group, to a tracking server: the history,
system metrics, config, summary, artifacts and the end state. It resumes
where the run's earlier uploads to that server stopped (the offsets in
RUN/upload/), so every point arrives once, whether the run was made offline,
its live upload was cut off, or an earlier sync was interrupted.

  RUN|GROUP        a run or group directory, or a run id (or its prefix) under DIR
  --to URL         the target, one of (with where its key comes from,
                   if the server wants one):
@GENERATED@
  --dir DIR        where runs are looked up by id (default $CHORUS_DIR or ./chorus-runs)
  --timeout S      give up after S seconds (default 600; 0: no limit), a request
                   in flight then included, keeping the offsets, so that the
                   next sync goes on from there. Otherwise each request has
                   its own limit (30 s; 10 min for an artifact)
  --status         for each run under DIR (or the run or group given), each
                   target it was uploaded to: done, or how many values are left,
                   and the last problem

A run that is still running on a live host is uploaded by that host: sync
refuses it. A run whose host is gone (its lease expired, or on the host's
own machine nobody holds its write-ahead log) has crashed: sync first
rebuilds its files from its write-ahead log, as `chorus recover` does (the
rows the host committed but never wrote to history.jsonl, and the end
state), keeping the files it replaces as NAME.bak, then uploads them. So
does a run whose files a crash of the machine cut short after its end
(shorter than its run.json records them): its files are rebuilt from the
log, then uploaded; without the log it is not uploaded.

exit codes: 0 everything uploaded (or --status printed), 1 something was
left (the message says whether syncing again goes on, or what must change
first), 2 the command line was wrong.
)",
    .main = sync_main,
    .generated = backend_urls,
};

/// The --to URLs of every upload backend, for sync's help.
std::string backend_urls() {
  std::string backends;
  for (const core::UploadScheme& s : core::upload_schemes()) {
    backends += "                     " + s.usage(false);
    if (s.local) backends += " (event files written into DIR)";
    else backends += " or " + s.usage(true);
    if (!s.credentials.empty()) backends += "\n                       (" + std::string(s.credentials) + ")";
    backends += '\n';
  }
  return backends;
}

namespace {

namespace fs = std::filesystem;

volatile std::sig_atomic_t interrupted = 0;
extern "C" void on_interrupt(int) { interrupted = 1; }

struct SyncArgs {
  std::string target, url, dir;
  double timeout = 600;
  bool status = false;
};

Error parse(std::span<char* const> words, SyncArgs& a, bool& help) {
  ArgCursor c(words);
  while (!c.done() && c.error().empty()) {
    std::string v;
    if (c.flag({"-h", "--help"})) {
      help = true;
      return {};
    }
    if (c.flag({"--status"})) {
      a.status = true;
    } else if (c.option({"--to"}, a.url)) {
    } else if (c.option({"--dir"}, a.dir)) {
    } else if (c.option({"--timeout"}, v)) {
      auto t = parse_double(v);
      if (!t || *t < 0) c.fail("--timeout takes seconds (0 or more), not '" + v + "'");
      else a.timeout = *t;
    } else if (c.peek().starts_with("-") && c.peek() != "-") {
      c.fail("unknown option '" + std::string(c.peek()) + "'");
    } else if (a.target.empty()) {
      a.target = c.peek();
      c.next();
    } else {
      c.fail("one run or group at a time (also got '" + std::string(c.peek()) + "')");
    }
  }
  if (!c.error().empty()) return invalid(c.error());
  if (!a.status && a.target.empty()) return invalid("which run or group? (chorus sync RUN|GROUP --to URL)");
  if (!a.status && a.url.empty()) return invalid("where to? (--to " + core::upload_url_forms(false) + ")");
  return {};
}

/// The run directories `arg` names: a run, a group (its runs), a root (all
/// runs below), or a run id under `root`.
Result<std::vector<std::string>> runs_named(const std::string& arg, const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::is_directory(arg, ec)) {
    if (is_run_dir(arg)) {
      out.push_back(arg);
      return out;
    }
    for (const RunGroup& g : find_runs(arg)) out.insert(out.end(), g.run_dirs.begin(), g.run_dirs.end());
    // A group directory: its runs sit right below it.
    for (const auto& e : fs::directory_iterator(arg, ec))
      if (e.is_directory(ec) && is_run_dir(e.path().string()) &&
          std::find(out.begin(), out.end(), e.path().string()) == out.end())
        out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    if (out.empty()) return invalid(arg + " holds no runs (no run.json or wal below it)");
    return out;
  }
  Result<std::string> dir = locate_run(arg, root);
  if (!dir) return dir.error();
  out.push_back(std::move(*dir));
  return out;
}

std::string count(std::uint64_t n) {
  char buf[32];
  if (n >= 10'000'000) std::snprintf(buf, sizeof buf, "%.1fM", static_cast<double>(n) / 1e6);
  else if (n >= 10'000) std::snprintf(buf, sizeof buf, "%.1fk", static_cast<double>(n) / 1e3);
  else std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
  return buf;
}

/// Rebuilds the run in `dir` from its WAL (as `chorus recover` does, the
/// replaced files kept as NAME.bak) before its files are uploaded: once the
/// end state is delivered, rows that only the WAL held would never go up.
/// `what` says why, after the run's label. False (said on stderr) where the
/// rebuild failed: uploading then would deliver the end without those rows.
bool rebuild_from_wal(const std::string& dir, const std::string& label, const std::string& what,
                      const RecoverOptions& o) {
  std::fprintf(stderr,
               "chorus sync: %s %s; rebuilding its files from its write-ahead log (as `chorus recover` "
               "does; the replaced ones kept as NAME.bak), then uploading every committed row and its end state\n",
               label.c_str(), what.c_str());
  if (const Result<std::string> report = recover_run(dir, o); !report) {
    std::fprintf(stderr,
                 "chorus sync: %s: its files could not be rebuilt from its write-ahead log: %s. Nothing was uploaded: "
                 "its end state would close the upload without the rows only the log holds. Sync again once that "
                 "is fixed (`chorus recover %s --dry-run` reads the log and changes nothing); to upload the files "
                 "as they are instead, move %s/wal out of the run directory first\n",
                 label.c_str(), report.error().message().c_str(), dir.c_str(), dir.c_str());
    return false;
  }
  return true;
}

bool has_wal(const std::string& dir) {
  struct stat st {};
  return ::lstat((dir + "/wal").c_str(), &st) == 0;
}

/// A run whose host is known to be gone: rebuilt from its WAL where it has
/// one here; else its files are all there is, and they go up as they are.
bool rebuild_lost_run(const std::string& dir, const RunInfo& info, const std::string& label) {
  if (!has_wal(dir)) {
    // Copied here without its WAL, say: the files are all there is.
    std::fprintf(stderr,
                 "chorus sync: %s crashed: %s; it has no write-ahead log here (%s/wal) to rebuild its files from: "
                 "uploading what its files hold, then its end state\n",
                 label.c_str(), info.liveness.why.c_str(), dir.c_str());
    return true;
  }
  RecoverOptions o;
  o.unended_reason = "the run host died before this rank finished (marked by chorus sync, from the write-ahead log)";
  return rebuild_from_wal(dir, label, "crashed: " + info.liveness.why, o);
}

/// A run whose files a crash of the machine cut short after its end:
/// rebuilt from its WAL, which holds them whole. Without the log nothing
/// goes up: the end state would close the upload on files that lack rows.
bool rebuild_cut_run(const std::string& dir, const RunInfo& info, const std::string& label) {
  if (!has_wal(dir)) {
    std::fprintf(stderr,
                 "chorus sync: %s: %s; it has no write-ahead log here (%s/wal) to rebuild them from: nothing was "
                 "uploaded; sync it where its log is\n",
                 label.c_str(), info.liveness.cut.c_str(), dir.c_str());
    return false;
  }
  return rebuild_from_wal(dir, label, "has files a crash of the machine cut short: " + info.liveness.cut, {});
}

/// Uploads one run; true when its end state (or, for a run without one,
/// everything there is) was delivered.
bool sync_run(const std::string& dir, const upload::UploadTarget& target, double timeout_s, bool tty) {
  RunInfo info = read_run(dir);
  const std::string label = info.id.empty() ? dir : info.id;
  if (info.state == "running" && info.liveness.life == store::HostLife::alive) {
    std::fprintf(stderr, "chorus sync: %s is running, and its host (pid %lld on %s) uploads it; sync it after it ends\n",
                 label.c_str(), static_cast<long long>(info.pid), info.host.c_str());
    return false;
  }
  if (info.host_lost()) {
    if (!rebuild_lost_run(dir, info, label)) return false;
    info = read_run(dir); // run.json now records the end the log gives (or still reads crashed, from its lease)
  } else if (!info.liveness.cut.empty()) {
    if (!rebuild_cut_run(dir, info, label)) return false;
    info = read_run(dir);
  }
  // A run whose host is lost reads crashed here as in the Uploader (upload::RunSnapshot): its end goes up.
  const bool ended = info.readable() && info.reported_state() != "running";
  if (!ended && info.readable())
    std::fprintf(stderr,
                 "chorus sync: %s has no end state, and whether its host (on %s) lives cannot be told from here%s%s: "
                 "uploading what it holds; `chorus recover %s` first gives it its end state\n",
                 label.c_str(), info.host.empty() ? "an unknown machine" : info.host.c_str(),
                 info.liveness.why.empty() ? " (it renews no lease)" : ": ", info.liveness.why.c_str(), dir.c_str());
  upload::Uploader up(dir, target);
  if (Error e = up.open()) {
    std::fprintf(stderr, "chorus sync: %s: %s\n", label.c_str(), e.message().c_str());
    return false;
  }
  const std::uint64_t total = up.points_pending();
  const std::uint64_t before = up.state().points + up.state().refused;
  const auto start = std::chrono::steady_clock::now();
  const auto limit = timeout_s > 0 ? start + std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000))
                                   : upload::SteadyTime::max();
  auto last_print = start - std::chrono::seconds(10);
  upload::Uploader::Progress p;
  auto show = [&](bool last) {
    const auto now = std::chrono::steady_clock::now();
    if (!last && now - last_print < std::chrono::milliseconds(tty ? 200 : 5000)) return;
    last_print = now;
    const std::uint64_t sent = up.state().points + up.state().refused - before;
    const double secs = std::chrono::duration<double>(now - start).count();
    const int width = 24;
    const int filled = total == 0 ? width : static_cast<int>(static_cast<double>(width) * static_cast<double>(std::min(sent, total)) / static_cast<double>(total));
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(width - filled), '.');
    std::fprintf(stderr, "%s%-10s [%s] %s/%s values  %s/s%s", tty ? "\r" : "", label.c_str(), bar.c_str(),
                 count(sent).c_str(), count(total).c_str(), count(secs > 0 ? static_cast<std::uint64_t>(static_cast<double>(sent) / secs) : 0).c_str(),
                 tty && !last ? "" : "\n");
    std::fflush(stderr);
  };
  // --timeout bounds the whole sync, a request in flight included; the 250 ms
  // slice only decides when to look at the progress line and the signals,
  // never how long a request may take (a slow server still answers).
  if (timeout_s > 0) up.cut_requests_at(limit);
  for (;;) {
    p = up.pump(std::min(limit, std::chrono::steady_clock::now() + std::chrono::milliseconds(250)));
    show(false);
    if (p.done || p.stopped || interrupted || std::chrono::steady_clock::now() >= limit) break;
    if (p.caught_up && !ended) break; // all there is, without an end
    if (p.wait_until) {
      while (!interrupted && std::chrono::steady_clock::now() < std::min(*p.wait_until, limit))
        ::usleep(50'000);
    }
  }
  show(true);
  const upload::UploadState& st = up.state();
  if (p.done || (p.caught_up && !ended)) {
    std::printf("%s: uploaded to %s (remote run %s): %llu values in all%s\n", label.c_str(), target.url.c_str(),
                st.remote_run.c_str(), static_cast<unsigned long long>(st.points),
                st.refused ? (", " + std::to_string(st.refused) + " refused (see " + dir + "/upload/" + target.id + ".refused.jsonl)").c_str() : "");
    return p.done || !ended;
  }
  const auto left = static_cast<unsigned long long>(up.points_pending());
  if (p.stopped && !interrupted) {
    // Sending the same again cannot succeed: say what has to change instead.
    std::fprintf(stderr,
                 "chorus sync: %s: %s; %llu values left in the run directory, not sent: syncing again goes on only "
                 "once what is named here is changed\n",
                 label.c_str(), p.error.c_str(), left);
    return false;
  }
  std::fprintf(stderr, "chorus sync: %s: %s; %llu values left, run `chorus sync` again to go on from here\n",
               label.c_str(),
               interrupted ? "interrupted" : !p.error.empty() ? p.error.c_str() : "the time (--timeout) ran out", left);
  return false;
}

int status(const SyncArgs& a) {
  const std::string root = a.dir.empty() ? default_runs_dir() : a.dir;
  const Result<std::vector<std::string>> named = runs_named(a.target.empty() ? root : a.target, root);
  if (!named) return failure("sync", named.error().message());
  const std::vector<std::string>& runs = *named;
  Table t;
  t.add({"RUN", "TARGET", "STATE", "SENT", "LEFT", "REMOTE", "PROBLEM"});
  for (const std::string& dir : runs) {
    const RunInfo info = read_run(dir);
    const std::string label = info.id.empty() ? fs::path(dir).filename().string() : info.id;
    auto targets = upload::upload_targets(dir);
    if (targets.empty()) {
      t.add({label, "-", "not uploaded", "", "", "", ""});
      continue;
    }
    for (const auto& [id, path] : targets) {
      upload::UploadState st;
      if (Error e = st.load(path)) {
        t.add({label, id, "unreadable", "", "", "", e.message()});
        continue;
      }
      const std::uint64_t left = upload::points_pending(dir, st);
      const bool ended = info.readable() && info.reported_state() != "running";
      // A resumed run's later attempt is not done where only an earlier one's end went up.
      const std::string state = st.end_delivered(info.segments.size()) ? "done (" + st.final_sent + ")"
                                : left                 ? "behind"
                                : ended ? info.reported_state() + ", end state not yet delivered"
                                        : "no end state yet";
      t.add({label, st.url.empty() ? id : st.url, state, count(st.points), count(left), st.remote_run,
             clip(st.last_error, 60)});
    }
  }
  std::fputs(t.render("").c_str(), stdout);
  return exit_ok;
}

} // namespace

int sync_main(std::span<char* const> words) {
  SyncArgs a;
  if (std::optional<int> done = parse_words(sync_command, words, a, &parse)) return *done;
  if (a.status) return status(a);
  auto target = upload::UploadTarget::parse(a.url);
  if (!target) return usage_error("sync", target.error().message());
  const std::string root = a.dir.empty() ? default_runs_dir() : a.dir;
  const Result<std::vector<std::string>> named = runs_named(a.target, root);
  if (!named) return failure("sync", named.error().message());
  const std::vector<std::string>& runs = *named;
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  int failed = 0;
  for (const std::string& dir : runs) {
    if (interrupted) break;
    if (!sync_run(dir, *target, a.timeout, tty)) ++failed;
  }
  if (interrupted) return exit_failure;
  return failed ? exit_failure : exit_ok;
}

} // namespace chorus::cli
