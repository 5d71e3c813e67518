// `chorus recover`: a run's readable files rebuilt from its write-ahead log.
//
// The WAL holds every frame the run host applied, in order, and the Merger is
// deterministic in its input, so replaying the frames through a fresh Merger
// into a RunWriter reproduces what the host had committed. The rebuild goes
// to a directory beside the old files and replaces them only once complete,
// so a recover that fails, or is interrupted, leaves the run as it found it.
#include "cli/recover.hpp"
#include "cli/cli.hpp"
#include "cli/run_info.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/store/event_log.hpp"
#include "io/store/history_blocks.hpp"
#include "io/store/line_reader.hpp"
#include "io/store/run_record.hpp"
#include "io/store/run_writer.hpp"
#include "io/store/wal.hpp"
#include "io/store/wal_replay.hpp"
#include "runtime/core/merger.hpp"
#include "runtime/core/wire.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <variant>

namespace chorus::cli {
namespace fs = std::filesystem;
int recover_main(std::span<char* const> args); // below

const Command recover_command{
    .name = "recover",
    .summary = "rebuild a run's files from its write-ahead log after its host crashed",
    .usage = "[OPTIONS] RUN",
    .help = R"(Rebuilds a run's readable files (history.jsonl and its block summary
history_blocks.jsonl, histograms.jsonl, media.jsonl and media/, config.json,
summary.json, rejected.jsonl, metrics.json, events.jsonl, run.json) from its
write-ahead log, after its host crashed. Events the run told after its log
stopped (a log that could not be written) are kept from events.jsonl.
RUN is a run directory, or a run id looked up under DIR.

The log is read from the start; frames whose checksum fails are skipped (each
damaged stretch is reported), and a torn tail, a frame the crash cut short, is
cut off the file. If the log ends without the run's end but holds every
rank's end, the run ended as its ranks did (failed where one failed, else
crashed, killed or finished): its host answered finish once those were on
disk, before its own record of the end was. If a rank still runs in the log,
its host died: every rank still running is marked crashed, and so is the
run, at the time of the last frame. But where run.json records that the host
ended the run failed, with an error (its write-ahead log could not be
written: a full disk, a failing device), the run keeps that end and that
error. The files are rebuilt in a directory inside the run and then moved
into place; the files they replace are kept as NAME.bak.

Recover refuses a run whose log a process still holds (its host is alive).
Before it changes anything it checks what could stop it half way: a log or
run.json this user may not read or write (run it as the run's owner), a
directory where a rebuilt file belongs (move it aside), an old file that
cannot be kept as NAME.bak.

options:
  --dir DIR      where to look up a run id (default: $CHORUS_DIR, else ./chorus-runs)
  --dry-run      read the log and report, change nothing
  --no-backup    do not keep the replaced files as NAME.bak
  -h, --help     this text

exit codes: 0 rebuilt (or, with --dry-run, readable), 1 the run cannot be
recovered (no log, a live host, a log without a run start, an I/O error),
2 a wrong command line.
)",
    .main = recover_main,
};

namespace {

// run.json last: install() moves them in this order.
constexpr const char* rebuilt_files[] = {"history.jsonl", store::history_blocks_file, "histograms.jsonl", "media.jsonl",
                                         "config.json", "summary.json", "rejected.jsonl", "metrics.json", "events.jsonl",
                                         "run.json"};

struct RecoverArgs {
  std::string run, dir;
  bool dry_run = false, backup = true;
};

Error parse(std::span<char* const> words, RecoverArgs& a, bool& help) {
  ArgCursor c(words);
  std::string v;
  while (!c.done() && c.error().empty()) {
    if (c.flag({"-h", "--help"})) {
      help = true;
      return {};
    }
    if (c.option({"--dir"}, v))
      a.dir = v;
    else if (c.flag({"--dry-run"}))
      a.dry_run = true;
    else if (c.flag({"--no-backup"}))
      a.backup = false;
    else if (c.peek().starts_with("-"))
      c.fail("unknown option '" + std::string(c.peek()) + "'");
    else if (!a.run.empty())
      c.fail("one run at a time, not '" + a.run + "' and '" + std::string(c.peek()) + "'");
    else {
      a.run = c.peek();
      c.next();
    }
  }
  if (!c.error().empty()) return invalid(c.error());
  if (a.run.empty()) return invalid("missing RUN: a run directory or a run id");
  return {};
}

// The rebuilt files' writer, but a rank that died of the job's stop signal
// (while `stopping`) is written with the state the run was stopped with.
class StoppedRanks final : public core::HistorySink {
public:
  StoppedRanks(store::RunWriter& writer, RunState stopped_as) : stopped(stopped_as), writer_(writer) {}
  bool stopping = false;
  RunState stopped;

  void run_start(std::string_view run_json, std::int64_t ts_us, std::uint32_t world_size) override {
    writer_.run_start(run_json, ts_us, world_size);
  }
  void row(const core::Row& row) override { writer_.row(row); }
  void config(int rank, std::string_view json) override { writer_.config(rank, json); }
  void summary(int rank, std::string_view json) override { writer_.summary(rank, json); }
  void rejected(int rank, std::uint64_t seq, std::int64_t step,
                std::span<const std::pair<std::string_view, double>> values, const Error& why) override {
    writer_.rejected(rank, seq, step, values, why);
  }
  void rank_joined(int rank, std::int64_t ts_us) override { writer_.rank_joined(rank, ts_us); }
  void rank_state(int rank, RunState state, std::int64_t last_step, std::string_view host,
                  std::string_view reason) override {
    writer_.rank_state(rank, stopping && state == RunState::crashed ? stopped : state, last_step, host, reason);
  }
  void completed(int rank, std::uint64_t seq, const Error* err) override { writer_.completed(rank, seq, err); }
  void event(const core::wire::EventRecord& e) override {
    writer_.event(e);
    ++events;
  }
  void run_end(RunState state, std::int64_t ts_us) override { writer_.run_end(state, ts_us); }
  std::uint64_t events = 0; // rebuilt from the log, numbered 0..events-1

private:
  store::RunWriter& writer_;
};

/// The events the run told after its log stopped (its write-ahead log
/// failed, so the end's events reached events.jsonl only): the lines of
/// `dir`'s events.jsonl numbered from `from` on, appended to `tmp`'s
/// rebuilt one. How many, or why they could not be kept.
Result<std::uint64_t> keep_later_events(const std::string& dir, const std::string& tmp, std::uint64_t from) {
  const std::string live = dir + "/" + store::events_file;
  Result<int> fd = platform::open_regular(live, O_RDONLY, true);
  if (!fd) return fd.error();
  if (*fd < 0) return std::uint64_t{0};
  store::LineReader reader(*fd, live, {}, {});
  std::string later;
  std::uint64_t kept = 0;
  std::string_view line;
  store::LineReader::Next next;
  while ((next = reader.next(line)) == store::LineReader::Next::line) {
    const Result<store::EventLine> e = store::parse_event_line(line);
    if (!e || e->seq < from + kept) continue;
    if (e->seq != from + kept) break; // a gap: what follows is not the run's own sequence
    later.append(line).push_back('\n');
    ++kept;
  }
  if (next == store::LineReader::Next::failed) return reader.error();
  if (kept == 0) return kept;
  const std::string to = tmp + "/" + store::events_file;
  Result<int> out = platform::open_private(to, O_WRONLY | O_APPEND | O_CREAT);
  if (!out) return out.error();
  const Error e = platform::write_all(*out, later, to);
  ::close(*out);
  if (e) return e;
  return kept;
}

// Shows how far a long replay has got, on a terminal only.
class Progress {
public:
  explicit Progress(std::uint64_t total) : total_(total), on_(total > (64u << 20) && ::isatty(STDERR_FILENO)) {}
  void at(std::uint64_t offset) {
    if (!on_) return;
    const int pct = static_cast<int>(offset * 100 / total_);
    if (pct == shown_) return;
    shown_ = pct;
    std::fprintf(stderr, "\rchorus recover: reading the log... %d%%", pct);
  }
  ~Progress() {
    if (on_ && shown_ >= 0) std::fputs("\r\033[K", stderr);
  }

private:
  std::uint64_t total_;
  bool on_;
  int shown_ = -1;
};

/// The permission error `err` met on `path` of the run in `dir` (`what`
/// recover could not do, naming it): the file, the errno's text, whose it
/// is, and the fix (as the run's owner, or with this user given access;
/// `or_else` another way). Recover meets these before it changes anything,
/// and says so.
Error permission_error(const std::string& path, int err, const std::string& what, const std::string& dir,
                       std::string_view why = {}, std::string_view or_else = {}) {
  std::string m = what + ": " + std::strerror(err);
  struct stat st {}, dir_st {};
  const bool known = ::lstat(path.c_str(), &st) == 0;
  if (known) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    m += " (it belongs to " + platform::user_named(st.st_uid) + ", mode " + mode + ", and chorus recover runs as " +
         platform::user_named(::geteuid()) + std::string(why) + ")";
  }
  m += ". Run chorus recover as the run's owner";
  if (::stat(dir.c_str(), &dir_st) == 0 && dir_st.st_uid != ::geteuid()) {
    passwd pw{}, *found = nullptr;
    char buf[4096];
    if (::getpwuid_r(dir_st.st_uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr)
      m += " (sudo -u " + std::string(found->pw_name) + " chorus recover " + dir + ")";
  }
  m += ", or give this user access to the file (chmod or chown, as its owner or root)";
  m += or_else;
  m += ". Nothing was changed";
  return Error(Errc::io_error, std::move(m));
}

/// Where this process may not access `path` as `mode` asks (R_OK, W_OK),
/// by its effective ids: the permission error; none where it may, where the
/// file is not there, or where the cause is another (met, and named, where
/// the file is opened).
Error check_access(const std::string& path, int mode, const std::string& what, const std::string& dir) {
  if (::faccessat(AT_FDCWD, path.c_str(), mode, AT_EACCESS | AT_SYMLINK_NOFOLLOW) == 0) return {};
  const int e = errno;
  if (e != EACCES && e != EPERM) return {};
  return permission_error(path, e, what + " " + path, dir);
}

/// A directory where recover puts a rebuilt file (or keeps the old one as
/// NAME.bak): named, with the fix. Nothing can move a file over it.
Error directory_in_the_way(const std::string& dir, bool backup) {
  for (const char* name : rebuilt_files)
    for (const std::string& to : {dir + "/" + name, dir + "/" + name + ".bak"}) {
      if (!backup && to.ends_with(".bak")) continue;
      struct stat st {};
      if (::lstat(to.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      const bool bak = to.ends_with(".bak");
      return Error(Errc::io_error, to + " is a directory, not a file: recover puts the run's " +
                                       (bak ? "old " + std::string(name) + " there (its backup)"
                                            : "rebuilt " + std::string(name) + " there") +
                                       ". Move it aside (mv " + to + " " + to + ".aside) and run chorus recover "
                                       "again" + (bak ? ", or run it with --no-backup" : "") + ". Nothing was changed");
    }
  return {};
}

/// Keeps each file the rebuild replaces as a hard link in `old` (inside the
/// directory it is rebuilt in), to become NAME.bak once the rebuilt one is
/// in its place. Done before anything changes: a file that cannot be kept
/// stops recover with the run as it was.
Error keep_old_files(const std::string& dir, const std::string& old) {
  if (Error e = platform::make_dirs(old)) return e;
  for (const char* name : rebuilt_files) {
    const std::string from = dir + "/" + name;
    struct stat st {};
    if (::lstat(from.c_str(), &st) != 0) continue;
    // link() takes a symbolic link itself, never what it leads to.
    if (::link(from.c_str(), (old + "/" + name).c_str()) == 0) continue;
    const int e = errno;
    if (e == EPERM || e == EACCES)
      return permission_error(from, e, "cannot keep " + from + " as " + from + ".bak (a hard link to it)", dir,
                              ": the kernel lets a process hard-link only a file it owns or may read and write",
                              ", or pass --no-backup to replace it without keeping it");
    return Error(Errc::io_error, "cannot keep " + from + " as " + from + ".bak (a hard link to it: " +
                                     std::strerror(e) +
                                     "; the filesystem may not allow hard links). Nothing was changed: copy the old "
                                     "files aside yourself and run recover again with --no-backup");
  }
  return {};
}

// Moves the rebuilt files over the old ones, run.json last, so that a reader
// sees the final state only once everything else is in place; the old ones
// kept by keep_old_files become NAME.bak.
Result<std::string> install(const std::string& tmp, const std::string& dir, bool backup) {
  std::string moved;
  // The old history's block summary goes before the history is replaced: a
  // reader never takes it for the new one's (the new one follows the history).
  std::error_code gone;
  fs::remove(dir + "/" + store::history_blocks_file, gone);
  // media/'s files first (the WAL rebuilds each to the same bytes): then
  // media.jsonl, which names them, never names one that is not there.
  std::error_code ec;
  if (fs::is_directory(tmp + "/media", ec)) {
    std::uint64_t files = 0;
    for (auto it = fs::recursive_directory_iterator(tmp + "/media", ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      const fs::path to = fs::path(dir) / fs::relative(it->path(), tmp, ec);
      if (Error e = platform::make_dirs(to.parent_path().string())) return e;
      fs::rename(it->path(), to, ec);
      if (ec) return Error(Errc::io_error, "cannot move " + it->path().string() + " to " + to.string() + ": " + ec.message());
      ++files;
    }
    if (ec) return Error(Errc::io_error, "cannot read the rebuilt media in " + tmp + "/media: " + ec.message());
    if (files != 0) moved = "media/ (" + std::to_string(files) + (files == 1 ? " file)" : " files)");
  }
  for (const char* name : rebuilt_files) {
    const std::string from = tmp + "/" + name, to = dir + "/" + name;
    std::error_code ec;
    if (!fs::exists(from, ec)) {
      // The rebuild made no such file (the log holds none of its lines): one
      // the run had is replaced by an empty one, never left as it was.
      if (!fs::exists(fs::symlink_status(to, ec))) continue;
      const Result<int> made = platform::open_private(from, O_WRONLY | O_CREAT | O_TRUNC);
      if (!made) return made.error();
      platform::close_fd(*made);
    }
    // The old file, linked before anything changed, takes NAME.bak's place
    // (the rename below then replaces NAME at once).
    if (const std::string old = tmp + "/.old/" + name; backup && fs::exists(fs::symlink_status(old, ec))) {
      fs::rename(old, to + ".bak", ec);
      if (ec) return Error(Errc::io_error, "cannot keep the old " + to + " as " + to + ".bak: " + ec.message() +
                                               (moved.empty() ? std::string(". Nothing was replaced")
                                                              : ". Replaced so far: " + moved));
    }
    fs::rename(from, to, ec);
    if (ec) return Error(Errc::io_error, "cannot move " + from + " to " + to + ": " + ec.message());
    moved += std::string(moved.empty() ? "" : " ") + name;
  }
  return moved;
}

} // namespace

int recover_main(std::span<char* const> words) {
  RecoverArgs a;
  if (std::optional<int> done = parse_words(recover_command, words, a, &parse)) return *done;
  const Result<std::string> dir = locate_run(a.run, a.dir.empty() ? default_runs_dir() : a.dir);
  if (!dir) return failure("recover", dir.error().message());
  RecoverOptions o;
  o.dry_run = a.dry_run;
  o.backup = a.backup;
  const Result<std::string> report = recover_run(*dir, o);
  if (!report) return failure("recover", report.error().message());
  std::fputs(report->c_str(), stdout);
  return exit_ok;
}

Result<std::string> recover_run(const std::string& dir, const RecoverOptions& a) {
  std::string report;
  const std::string wal = dir + "/wal";
  struct stat st {};
  if (::lstat(wal.c_str(), &st) != 0)
    return Error(Errc::io_error, "no write-ahead log at " + wal + " (" + std::strerror(errno) +
                                  "): there is nothing to rebuild the run from");
  // Checked before the torn tail is cut, so that a run that cannot be
  // rebuilt is left exactly as it was.
  if (!a.dry_run && ::access(dir.c_str(), W_OK) != 0)
    return Error(Errc::io_error, "the run directory " + dir + " is not writable (" + std::strerror(errno) +
           "): recover rebuilds the run's files inside it. Make it writable (chmod u+w " + dir +
           ", or remount its filesystem read-write) and run recover again, or pass --dry-run to only read the log");

  // Permissions next (the effective user's: root passes them), so that
  // recover stops before it changes anything where it could not finish.
  if (Error e = check_access(wal, a.dry_run ? R_OK : R_OK | W_OK,
                             a.dry_run ? "cannot read the write-ahead log" : "cannot read and write the write-ahead log",
                             dir))
    return e;
  // run.json gives what the log lacks (exit codes, an end recorded there only).
  if (Error e = check_access(dir + "/run.json", R_OK, "cannot read", dir)) return e;
  const Error in_the_way = directory_in_the_way(dir, a.backup);
  if (in_the_way && !a.dry_run) return in_the_way;

  // Inside the run directory, so the rebuilt files move into place by rename;
  // a dry run leaves the run directory alone.
  std::string tmp = a.dry_run ? (fs::temp_directory_path() / "chorus-recover-XXXXXX").string() : dir + "/.recover-XXXXXX";
  if (::mkdtemp(tmp.data()) == nullptr)
    return Error(Errc::io_error, "cannot make the directory " + tmp + " to rebuild in: " + std::strerror(errno) +
           (a.dry_run ? ". Set TMPDIR to a writable directory" : ". Make " + dir + " writable (chmod u+w " + dir + ")"));
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(path, e);
    }
  } cleanup{tmp};
  if (!a.dry_run && a.backup)
    if (Error e = keep_old_files(dir, tmp + "/.old")) return e;

  // Cutting the torn tail takes the WAL's writer lock, so a live host makes
  // this fail rather than have its log rewritten under it.
  store::WalScan cut;
  if (!a.dry_run) {
    Result<store::WalScan> cutting = store::truncate_torn_tail(wal);
    if (!cutting)
      return Error(cutting.error().code(), cutting.error().message() +
             (cutting.error().message().find("another process") != std::string::npos
                  ? " (recover is for a run whose host died; this one's is alive)"
                  : ""));
    cut = std::move(*cutting);
  }

  // An end that only run.json records: a host whose write-ahead log could
  // not be written (a full disk, a failing device) ended the run failed,
  // with why, in run.json, and could not log that end.
  const Result<store::RunRecord> recorded = store::RunRecord::read(dir + "/run.json");
  core::Merger* merger_ptr = nullptr;
  store::RunWriter writer(tmp, [&](std::uint32_t key) { return merger_ptr->key_name(key); });
  (void)writer.carry_over(dir + "/run.json");
  StoppedRanks sink(writer, a.unended);
  core::Merger merger(sink);
  merger_ptr = &merger;

  store::WalReplay replay;
  {
    Progress progress(static_cast<std::uint64_t>(st.st_size));
    Result<store::WalReplay> replayed = store::replay_wal(
        wal, merger,
        [&](const core::wire::Frame& f, std::int64_t ts, std::uint64_t offset) {
          progress.at(offset);
          sink.stopping = a.stopped_at_us > 0 && f.type == core::wire::FrameType::host_event && ts >= a.stopped_at_us;
        });
    if (!replayed) return replayed.error();
    replay = std::move(*replayed);
  }
  const store::WalScan& scan = replay.scan;
  const bool ended = replay.ended;
  const RunState end_state = replay.end_state;
  const std::uint64_t malformed = replay.malformed;
  if (!merger.started())
    return Error(Errc::io_error, "the log at " + wal + " has no run start (" + std::to_string(scan.frames) +
                                  " frames read): the host died before the run began; there is nothing to rebuild");

  int marked = 0;
  // The log stops before the run's end. Where run.json records that the
  // host ended the run failed, and why (its WAL could not be written), the
  // run keeps that end and that error; else its host died (a.unended).
  const bool kept_failure = !ended && recorded && recorded->state == to_string(RunState::failed) && recorded->error &&
                            !recorded->error->empty();
  // The log holds every rank's end: the run's end follows from them
  // (store::derived_end), whatever became of the end's own frame.
  const std::optional<RunState> ranks_end = ended || kept_failure ? std::nullopt : store::derived_end(merger);
  const bool derived = ranks_end.has_value();
  const RunState unended = kept_failure ? RunState::failed : ranks_end.value_or(a.unended);
  if (!ended) {
    std::int64_t at = replay.last_ts;
    std::string reason = a.unended_reason;
    if (kept_failure) {
      if (recorded->end_us && *recorded->end_us > at) at = *recorded->end_us;
      reason = "the run host ended the run failed before its write-ahead log recorded this rank's end (the run's "
               "error says why; marked by chorus recover)";
      writer.keep_error(*recorded->error);
    }
    sink.stopped = unended;
    sink.stopping = !derived && unended != RunState::crashed; // a derived end marks no rank
    const auto closing = store::closing_frames(merger, at, unended, reason);
    marked = static_cast<int>(closing.size()) - 1; // a rank_dead for each, then the run_end
    for (const auto& frame : closing) merger.apply(frame);
  }
  writer.flush();
  if (writer.error()) return Error(writer.error().code(), "rebuilding the files failed: " + writer.error().message());
  const Result<std::uint64_t> later_events = keep_later_events(dir, tmp, sink.events);
  if (!later_events) return later_events.error();

  const bool torn = a.dry_run ? scan.torn_tail : cut.torn_tail;
  const store::WalScan& damage = a.dry_run ? scan : cut;
  report = "chorus recover: " + dir + "\n";
  report += "  log        " + std::to_string(scan.frames) + " frames read from " + wal + "\n";
  report += "  corrupt    " + std::to_string(scan.corrupt_regions) +
            (scan.corrupt_regions == 1 ? " damaged region skipped" : " damaged regions skipped");
  if (malformed > 0) report += ", " + std::to_string(malformed) + " frames refused by the merge";
  report += "\n";
  if (torn) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(st.st_size) - damage.good_end;
    report += "  torn tail  " + std::to_string(bytes) + " bytes at offset " + std::to_string(damage.good_end) +
              (a.dry_run ? " (would be cut)\n" : " cut\n");
  } else {
    report += "  torn tail  none\n";
  }
  for (std::size_t i = 0; i < damage.problems.size() && i < 10; ++i) report += "             " + damage.problems[i] + "\n";
  report += "  rebuilt    " + std::to_string(writer.rows()) + " rows, " + std::to_string(writer.rejected_values()) +
            " rejected values, " + std::to_string(sink.events) + " events\n";
  if (*later_events > 0)
    report += "  events     " + std::to_string(*later_events) +
              " told after the log stopped, kept from events.jsonl (the log does not hold them)\n";
  const std::string ranks_marked =
      std::to_string(marked) + (marked == 1 ? " rank" : " ranks") + " marked " + std::string(to_string(unended));
  if (ended)
    report += "  state      " + std::string(to_string(end_state)) + ", as the log records\n";
  else if (derived)
    report += "  state      " + std::string(to_string(unended)) +
              ", as every rank's end in the log makes it: the log stops before the run's own end record\n";
  else if (kept_failure)
    report += "  state      failed, as run.json records: the log stops before the run's end, which its host could "
              "record in run.json only; " + ranks_marked + "\n  error      " + *recorded->error + "\n";
  else
    report += "  state      " + std::string(to_string(unended)) + ": the log stops before the run's end, so its host died; " +
              ranks_marked + "\n";
  if (a.dry_run) {
    if (in_the_way) report += "  in the way " + in_the_way.message() + "\n";
    report += "  (dry run: nothing changed)\n";
    return report;
  }
  const Result<std::string> moved = install(tmp, dir, a.backup);
  if (!moved) return moved.error();
  report += "  files      " + *moved + (a.backup ? " (the old ones kept as *.bak)" : "") + "\n";
  return report;
}

} // namespace chorus::cli
