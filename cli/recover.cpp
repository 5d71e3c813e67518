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
#include "io/store/run_writer.hpp"
#include "io/store/wal.hpp"
#include "io/store/wal_replay.hpp"
#include "runtime/core/merger.hpp"
#include "runtime/core/wire.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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
    .help = R"(Rebuilds a run's readable files (history.jsonl, config.json, summary.json,
rejected.jsonl, metrics.json, run.json) from its write-ahead log, after its
host crashed.
RUN is a run directory, or a run id looked up under DIR.

The log is read from the start; frames whose checksum fails are skipped (each
damaged stretch is reported), and a torn tail, a frame the crash cut short, is
cut off the file. If the log ends without the run's end, its host died: every
rank still running is marked crashed, and so is the run, at the time of the
last frame. The files are rebuilt in a directory inside the run and then moved
into place; the files they replace are kept as NAME.bak.

Recover refuses a run whose log a process still holds (its host is alive).

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
constexpr const char* rebuilt_files[] = {"history.jsonl", "histograms.jsonl", "media.jsonl", "config.json", "summary.json",
                                         "rejected.jsonl", "metrics.json", "run.json"};

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
class StoppedRanks final : public detail::HistorySink {
public:
  StoppedRanks(io::RunWriter& writer, RunState stopped) : writer_(writer), stopped_(stopped) {}
  bool stopping = false;

  void run_start(std::string_view run_json, std::int64_t ts_us, std::uint32_t world_size) override {
    writer_.run_start(run_json, ts_us, world_size);
  }
  void row(const detail::Row& row) override { writer_.row(row); }
  void config(int rank, std::string_view json) override { writer_.config(rank, json); }
  void summary(int rank, std::string_view json) override { writer_.summary(rank, json); }
  void rejected(int rank, std::uint64_t seq, std::int64_t step,
                std::span<const std::pair<std::string_view, double>> values, const Error& why) override {
    writer_.rejected(rank, seq, step, values, why);
  }
  void rank_joined(int rank, std::int64_t ts_us) override { writer_.rank_joined(rank, ts_us); }
  void rank_state(int rank, RunState state, std::int64_t last_step, std::string_view host,
                  std::string_view reason) override {
    writer_.rank_state(rank, stopping && state == RunState::crashed ? stopped_ : state, last_step, host, reason);
  }
  void completed(int rank, std::uint64_t seq, const Error* err) override { writer_.completed(rank, seq, err); }
  void run_end(RunState state, std::int64_t ts_us) override { writer_.run_end(state, ts_us); }

private:
  io::RunWriter& writer_;
  RunState stopped_;
};

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

// Moves the rebuilt files over the old ones, run.json last, so that a reader
// sees the final state only once everything else is in place.
Result<std::string> install(const std::string& tmp, const std::string& dir, bool backup) {
  std::string moved;
  // media/'s files first (the WAL rebuilds each to the same bytes): then
  // media.jsonl, which names them, never names one that is not there.
  std::error_code ec;
  if (fs::is_directory(tmp + "/media", ec)) {
    std::uint64_t files = 0;
    for (auto it = fs::recursive_directory_iterator(tmp + "/media", ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      const fs::path to = fs::path(dir) / fs::relative(it->path(), tmp, ec);
      if (Error e = io::make_dirs(to.parent_path().string())) return e;
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
    if (!fs::exists(from, ec)) continue;
    if (backup && fs::exists(fs::symlink_status(to, ec))) {
      const std::string bak = to + ".bak";
      fs::remove(bak, ec);
      // A hard link keeps the old file while the rename below replaces its name at once.
      fs::create_hard_link(to, bak, ec);
      if (ec)
        return Error(Errc::io_error, "cannot keep " + to + " as " + bak + " (a hard link to it: " + ec.message() +
                                         "; the filesystem may not allow hard links, or " + bak +
                                         " may be in the way). Nothing was replaced yet: remove or move aside " + bak +
                                         ", or copy the old files aside yourself and run recover again with "
                                         "--no-backup");
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

  // Cutting the torn tail takes the WAL's writer lock, so a live host makes
  // this fail rather than have its log rewritten under it.
  io::WalScan cut;
  if (!a.dry_run) {
    Result<io::WalScan> cutting = io::truncate_torn_tail(wal);
    if (!cutting)
      return Error(cutting.error().code(), cutting.error().message() +
             (cutting.error().message().find("another process") != std::string::npos
                  ? " (recover is for a run whose host died; this one's is alive)"
                  : ""));
    cut = std::move(*cutting);
  }

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

  detail::Merger* merger_ptr = nullptr;
  io::RunWriter writer(tmp, [&](std::uint32_t key) { return merger_ptr->key_name(key); });
  (void)writer.carry_over(dir + "/run.json");
  StoppedRanks sink(writer, a.unended);
  detail::Merger merger(sink);
  merger_ptr = &merger;

  io::WalReplay replay;
  {
    Progress progress(static_cast<std::uint64_t>(st.st_size));
    Result<io::WalReplay> replayed = io::replay_wal(
        wal, merger,
        [&](const wire::Frame& f, std::int64_t ts, std::uint64_t offset) {
          progress.at(offset);
          sink.stopping = a.stopped_at_us > 0 && f.type == wire::FrameType::host_event && ts >= a.stopped_at_us;
        });
    if (!replayed) return replayed.error();
    replay = std::move(*replayed);
  }
  const io::WalScan& scan = replay.scan;
  const bool ended = replay.ended;
  const RunState end_state = replay.end_state;
  const std::uint64_t malformed = replay.malformed;
  if (!merger.started())
    return Error(Errc::io_error, "the log at " + wal + " has no run start (" + std::to_string(scan.frames) +
                                  " frames read): the host died before the run began; there is nothing to rebuild");

  int marked = 0;
  sink.stopping = a.unended != RunState::crashed;
  if (!ended) {
    const auto closing = io::closing_frames(merger, replay.last_ts, a.unended, a.unended_reason);
    marked = static_cast<int>(closing.size()) - 1; // a rank_dead for each, then the run_end
    for (const auto& frame : closing) merger.apply(frame);
  }
  writer.flush();
  if (writer.error()) return Error(writer.error().code(), "rebuilding the files failed: " + writer.error().message());

  const bool torn = a.dry_run ? scan.torn_tail : cut.torn_tail;
  const io::WalScan& damage = a.dry_run ? scan : cut;
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
            " rejected values\n";
  report += ended ? "  state      " + std::string(to_string(end_state)) + ", as the log records\n"
                  : "  state      " + std::string(to_string(a.unended)) +
                        ": the log stops before the run's end, so its host died; " + std::to_string(marked) +
                        (marked == 1 ? " rank" : " ranks") + " marked " + std::string(to_string(a.unended)) + "\n";
  if (a.dry_run) {
    report += "  (dry run: nothing changed)\n";
    return report;
  }
  const Result<std::string> moved = install(tmp, dir, a.backup);
  if (!moved) return moved.error();
  report += "  files      " + *moved + (a.backup ? " (the old ones kept as *.bak)" : "") + "\n";
  return report;
}

} // namespace chorus::cli
