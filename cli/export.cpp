// `chorus export`: a run's history for other tools (CSV, JSON lines), and a
// run or a group as TensorBoard event files. Every format streams: a run of
// any length exports in memory that grows with its keys, not its rows.
#include "cli/cli.hpp"
#include "cli/group_info.hpp"
#include "cli/histogram_lines.hpp"
#include "cli/locate.hpp"
#include "cli/run_info.hpp"
#include "cli/series.hpp"
#include "io/store/history_row.hpp"
#include "io/store/json_lines.hpp"
#include "io/upload/tensorboard_run.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

namespace chorus::cli {
namespace fs = std::filesystem;
int export_main(std::span<char* const> args); // below

const Command export_command{
    .name = "export",
    .summary = "a run's history as CSV or JSON lines; a run or a group as TensorBoard event files",
    .usage = "[OPTIONS] RUN --csv FILE\n[OPTIONS] RUN --jsonl FILE\n[OPTIONS] RUN|GROUP --tensorboard DIR",
    .help = R"(Writes a run's history (history.jsonl) for other tools. RUN is a run
directory, or a run id (or the start of one) looked up under DIR; GROUP a
group directory or a group's name. Any length of history exports in bounded
memory: the file is read as a stream (twice for CSV: once for its columns).

--csv FILE writes a row per step and a column per key: _step, _timestamp
and _runtime first, then the keys in the order they first appear (per-rank
columns, key/rank-N, included); a cell is empty where the row has no value
of its key. NaN and infinities are written NaN, inf and -inf, as pandas
reads them. A key holding a comma or a quote is quoted (RFC 4180).

--jsonl FILE writes the history's lines as JSON lines, each with _step,
_timestamp, _runtime and the keys --metric picks (all of them without it).

--csv and --jsonl hold the history's scalars only: histograms
(histograms.jsonl) and images, text and tables (media.jsonl) are left out;
--tensorboard exports them, and Python's chorus.open(RUN) reads them.

A run that did not end is exported as far as its files go, and a note on
stderr says so: still running, or crashed (its host is gone: its lease
expired, or on its own machine nobody holds its write-ahead log), with its
last committed step and why.

--tensorboard DIR writes event files that TensorBoard reads
(`tensorboard --logdir DIR`): the run's keys in DIR/RUN-ID/, its per-rank
columns as runs of their own, DIR/RUN-ID/rank-N/ (so each key's chart holds a
curve per rank), its system metrics in DIR/RUN-ID/node-N/ and rank-N/, its
config and summary as text, its histograms (histograms.jsonl) as
TensorBoard's histograms, each column where its scalars would go (act/rank-1
as tag act of DIR/RUN-ID/rank-1/), and its images, text and tables
(media.jsonl) for TensorBoard's images and text dashboards, each rank's in
DIR/RUN-ID/rank-N/ (in DIR/RUN-ID/ for a run of one rank) under its key. A
group writes each of its runs on this machine so. Scalars, histograms and
media carry their step and wall time; TensorBoard keeps scalars as 32-bit
floats, and shows no caption.
A second export into the same DIR adds files beside the first: export into
an empty directory.

FILE '-' is the standard output.

options:
  --dir DIR       where to look up a run id or a group (default: $CHORUS_DIR,
                  else ./chorus-runs)
  --metric PATTERN
                  export only the keys PATTERN takes (repeatable): a key and
                  its per-rank columns (loss), a glob (train/*), or /REGEX/
  --smooth W      --csv and --jsonl: each key's values smoothed as
                  TensorBoard's slider does (a debiased moving average, W from
                  0 to below 1)
  --no-system     leave the system metrics out of --tensorboard
  -h, --help      this text

exit codes: 0 exported, 1 the run cannot be found or read, or the output
cannot be written, 2 a wrong command line.
)",
    .main = export_main,
};

namespace {

struct ExportArgs {
  std::string target, dir, csv, jsonl, tensorboard;
  std::vector<std::string> metrics;
  KeyFilter wanted;
  double smooth = 0;
  bool system = true;
};

/// --smooth: each key's values as TensorBoard's smoothing (series.hpp).
class Smoother {
public:
  explicit Smoother(double weight) : w_(weight) {}
  [[nodiscard]] bool on() const noexcept { return w_ > 0; }
  double operator()(std::string_view key, double v) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) it = by_key_.emplace(std::string(key), Smoothing(w_)).first;
    return it->second(v);
  }

private:
  double w_;
  std::map<std::string, Smoothing, std::less<>> by_key_;
};

Error parse(std::span<char* const> words, ExportArgs& a, bool& help) {
  ArgCursor c(words);
  std::string v;
  while (!c.done() && c.error().empty()) {
    if (c.flag({"-h", "--help"})) {
      help = true;
      return {};
    }
    if (c.option({"--dir"}, v)) {
      a.dir = v;
    } else if (c.option({"--csv"}, v)) {
      a.csv = v;
    } else if (c.option({"--jsonl"}, v)) {
      a.jsonl = v;
    } else if (c.option({"--tensorboard"}, v)) {
      a.tensorboard = v;
    } else if (c.option({"--metric"}, v)) {
      a.metrics.push_back(v);
    } else if (c.option({"--smooth"}, v)) {
      c.smoothing(v, a.smooth);
    } else if (c.flag({"--no-system"})) {
      a.system = false;
    } else {
      c.operand(a.target, "run or group");
    }
  }
  if (!c.error().empty()) return invalid(c.error());
  Result<KeyFilter> wanted = metric_filter(a.metrics);
  if (!wanted) return wanted.error();
  a.wanted = std::move(*wanted);
  if (a.target.empty()) return invalid("missing RUN: a run directory or a run id");
  const int formats = int(!a.csv.empty()) + int(!a.jsonl.empty()) + int(!a.tensorboard.empty());
  if (formats == 0) return invalid("nothing to write: give --csv FILE, --jsonl FILE or --tensorboard DIR");
  if (formats > 1) return invalid("one format at a time: --csv, --jsonl or --tensorboard");
  if (a.smooth > 0 && !a.tensorboard.empty())
    return invalid("--smooth is for --csv and --jsonl: TensorBoard smooths the raw values itself (its slider)");
  return {};
}

/// A file written through stdio, '-' the standard output; every failure
/// (a full disk, a closed pipe) is named with the file.
class Output {
public:
  static Result<Output> open(const std::string& path) {
    if (path == "-") return Output(stdout, "the standard output", false);
    std::FILE* f = std::fopen(path.c_str(), "we");
    if (f == nullptr)
      return file_problem("cannot write " + path + ": " + std::strerror(errno) +
                          "; give a FILE in a directory that exists and that you may write to");
    return Output(f, path, true);
  }
  Output(Output&& o) noexcept : f_(std::exchange(o.f_, nullptr)), name_(std::move(o.name_)), owned_(o.owned_) {}
  ~Output() {
    if (owned_ && f_ != nullptr) std::fclose(f_);
  }

  void put(std::string_view s) {
    if (!failed_ && std::fwrite(s.data(), 1, s.size(), f_) != s.size()) failed_ = errno != 0 ? errno : EIO;
  }
  /// Flushes (and closes the file); why the output is incomplete.
  [[nodiscard]] Error finish() {
    if (!failed_ && std::fflush(f_) != 0) failed_ = errno;
    if (owned_) {
      if (std::fclose(f_) != 0 && !failed_) failed_ = errno;
      f_ = nullptr;
    }
    if (failed_)
      return file_problem("could not write " + name_ + ": " + std::strerror(failed_) +
                          (owned_ ? "; free space or choose another FILE, then export again" : ""));
    return {};
  }

private:
  Output(std::FILE* f, std::string name, bool owned) : f_(f), name_(std::move(name)), owned_(owned) {}
  std::FILE* f_;
  std::string name_;
  bool owned_;
  int failed_ = 0;
};

/// A cell: integers as integers, others in the shortest form that reads back
/// the same double; NaN, inf, -inf.
void put_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
    return;
  }
  if (std::isinf(v)) {
    out += v > 0 ? "inf" : "-inf";
    return;
  }
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void put_value(std::string& out, const simdjson::dom::element& e) {
  switch (e.type()) {
  case simdjson::dom::element_type::INT64: out += std::to_string(std::int64_t(e)); return;
  case simdjson::dom::element_type::UINT64: out += std::to_string(std::uint64_t(e)); return;
  default:
    if (const std::optional<double> v = store::metric_value(e)) put_number(out, *v);
  }
}

void put_csv_field(std::string& out, std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) {
    out += s;
    return;
  }
  out += '"';
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  out += '"';
}

/// Warns of lines a read skipped; a read that failed is an error.
Error check_read(const store::JsonLines& lines, const std::string& path) {
  if (lines.problem) return lines.problem;
  if (lines.skipped > 0)
    std::fprintf(stderr, "chorus export: %s: skipped %llu damaged line(s), the first at line %llu (%s); the rest is "
                         "exported\n",
                 path.c_str(), static_cast<unsigned long long>(lines.skipped),
                 static_cast<unsigned long long>(lines.first_skipped_line), lines.first_skipped_why.c_str());
  return {};
}

/// A time of `row` (_timestamp, _runtime) as written, where the row has it
/// as a number (store::HistoryRow): the export copies its text.
std::optional<simdjson::dom::element> time_as_written(const store::HistoryRow& row, std::string_view key) {
  if (!(key == "_timestamp" ? row.timestamp() : row.runtime())) return std::nullopt;
  return row.object()[key].value_unsafe();
}

Error export_csv(const std::string& run_dir, const ExportArgs& a) {
  const std::string path = run_dir + "/history.jsonl";
  // First pass: the columns, in the order keys first appear, and the rows
  // to write (a live run's later rows are left to a later export).
  std::vector<std::string> keys;
  std::map<std::string, std::size_t, std::less<>> column; // looked up by view: no string per value
  const store::JsonLines first = store::read_json_lines(path, [&](const simdjson::dom::object& line_object) -> std::string_view {
    const store::HistoryRow row(line_object);
    if (!row) return row.why();
    for (const store::RowValue& v : row.metrics()) {
      if ((a.wanted && !a.wanted(v.key)) || column.contains(v.key)) continue;
      column.emplace(std::string(v.key), keys.size());
      keys.emplace_back(v.key);
    }
    return {};
  });
  if (Error e = check_read(first, path)) return e;
  Result<Output> out = Output::open(a.csv);
  if (!out) return out.error();
  std::string line = "_step,_timestamp,_runtime";
  for (const std::string& k : keys) {
    line += ',';
    put_csv_field(line, k);
  }
  line += '\n';
  out->put(line);
  std::vector<std::string> cells(keys.size());
  std::uint64_t rows = 0;
  Smoother smooth(a.smooth);
  store::read_json_lines(path, [&](const simdjson::dom::object& line_object) -> std::string_view {
    const store::HistoryRow row(line_object);
    if (rows == first.used || !row) return {};
    ++rows;
    for (std::string& c : cells) c.clear();
    line = std::to_string(row.step());
    for (std::string_view key : {"_timestamp", "_runtime"}) {
      line += ',';
      if (const std::optional<simdjson::dom::element> t = time_as_written(row, key)) put_value(line, *t);
    }
    for (const store::RowValue& v : row.metrics()) {
      auto it = column.find(v.key);
      if (it == column.end()) continue;
      if (smooth.on())
        put_number(cells[it->second], smooth(v.key, v.value));
      else
        put_value(cells[it->second], v.json);
    }
    for (const std::string& c : cells) line.append(",").append(c);
    line += '\n';
    out->put(line);
    return {};
  });
  return out->finish();
}

Error export_jsonl(const std::string& run_dir, const ExportArgs& a) {
  const std::string path = run_dir + "/history.jsonl";
  Result<Output> out = Output::open(a.jsonl);
  if (!out) return out.error();
  std::string line;
  Smoother smooth(a.smooth);
  auto field = [&line](std::string_view key) {
    if (line.size() > 1) line.push_back(',');
    core::append_json_string(line, key);
    line += ':';
  };
  const store::JsonLines lines = store::read_json_lines(path, [&](const simdjson::dom::object& line_object) -> std::string_view {
    const store::HistoryRow row(line_object);
    if (!row) return row.why();
    // Not line = "{": GCC 12's -Wrestrict misfires on that in Release builds.
    line.clear();
    line.push_back('{');
    field("_step");
    line += std::to_string(row.step());
    for (std::string_view key : {"_timestamp", "_runtime"})
      if (const std::optional<simdjson::dom::element> t = time_as_written(row, key)) {
        field(key);
        line += simdjson::minify(*t);
      }
    for (const store::RowValue& v : row.metrics()) {
      if (a.wanted && !a.wanted(v.key)) continue;
      field(v.key);
      if (smooth.on() && std::isfinite(v.value))
        core::append_json_number(line, smooth(v.key, v.value));
      else
        line += simdjson::minify(v.json);
    }
    // The contributions of the keys kept only.
    bool any = false;
    for (const store::RowValue& n : row.counts()) {
      if (a.wanted && !a.wanted(n.key)) continue;
      if (any) {
        line += ',';
      } else {
        field("_count");
        line += '{';
      }
      any = true;
      core::append_json_string(line, n.key);
      line.append(":").append(simdjson::minify(n.json));
    }
    if (any) line += '}';
    line += "}\n";
    out->put(line);
    return {};
  });
  if (Error e = check_read(lines, path)) return e;
  return out->finish();
}

/// On stderr (the output may be stdout), where a run did not end: crashed
/// because its host is gone (io/store/lease.hpp), or still running.
void note_state(const RunInfo& info) {
  if (info.host_lost())
    std::fprintf(stderr, "chorus export: %s crashed: %s; exporting what its files hold\n", info.id.c_str(),
                 info.error.value_or(info.liveness.why).c_str());
  else if (info.readable() && info.state == "running")
    std::fprintf(stderr, "chorus export: %s is still running: exporting the rows committed so far\n", info.id.c_str());
}

/// One run into DIR/RUN-ID/ (io/upload/tensorboard_run.hpp); says what it wrote.
Error export_tensorboard_run(const std::string& run_dir, const ExportArgs& a) {
  const RunInfo info = read_run(run_dir);
  note_state(info);
  const std::string id = fs::path(run_dir).filename().string();
  const std::string into = (fs::path(a.tensorboard) / id).string();
  const double start = info.start_time.value_or(0);
  upload::TensorBoardRun tb(into);
  tb.world_size(info.world_size.value_or(1));
  simdjson::dom::parser parser;
  const std::string config = run_dir + "/config.json";
  std::error_code ec;
  if (fs::exists(config, ec)) {
    const Result<simdjson::dom::element> doc = store::load_json_file(config, parser);
    if (doc && doc->is_object()) tb.config(doc->get_object().value_unsafe(), start);
    else if (!doc) std::fprintf(stderr, "chorus export: %s; the config is left out\n", doc.error().message().c_str());
  }
  const std::string history = run_dir + "/history.jsonl";
  const store::JsonLines rows = store::read_json_lines(history, [&](const simdjson::dom::object& row) -> std::string_view {
    return tb.history_row(row, a.wanted);
  });
  if (rows.problem && fs::exists(history, ec)) return rows.problem;
  (void)check_read(rows, history);
  const std::string histograms = run_dir + "/histograms.jsonl";
  if (fs::exists(histograms, ec)) {
    const store::JsonLines lines =
        read_histogram_lines(histograms, [&](const store::HistogramLine& h) { tb.histogram(h, a.wanted); });
    if (Error e = check_read(lines, histograms)) return e;
  }
  const std::string media = run_dir + "/media.jsonl";
  if (fs::exists(media, ec)) {
    std::uint64_t unreadable = 0;
    Error first;
    const store::JsonLines lines = read_media_lines(media, [&](const store::MediaLine& m) {
      if (Error e = tb.media(m, run_dir, a.wanted); e && unreadable++ == 0) first = std::move(e);
    });
    if (Error e = check_read(lines, media)) return e;
    if (unreadable > 0)
      std::fprintf(stderr, "chorus export: %llu media file(s) left out, the first: %s; the rest is exported\n",
                   static_cast<unsigned long long>(unreadable), first.message().c_str());
  }
  if (a.system && fs::exists(run_dir + "/system.jsonl", ec)) {
    const store::JsonLines samples = store::read_json_lines(run_dir + "/system.jsonl", [&](const simdjson::dom::object& row) {
      tb.system_row(row, a.wanted);
      return std::string_view();
    });
    (void)check_read(samples, run_dir + "/system.jsonl");
  }
  const std::string summary = run_dir + "/summary.json";
  if (fs::exists(summary, ec)) {
    const Result<simdjson::dom::element> doc = store::load_json_file(summary, parser);
    if (doc && doc->is_object())
      tb.text("summary", upload::markdown_table(doc->get_object().value_unsafe()), info.end_time.value_or(start));
  }
  if (Error e = tb.close()) return e;
  std::string extras;
  if (tb.histograms() > 0) extras = " and " + std::to_string(tb.histograms()) + " histograms";
  if (tb.media_files() > 0) extras += " and " + std::to_string(tb.media_files()) + " images, texts and tables";
  std::printf("%s: %llu scalars from %llu rows%s into %s (%zu event files)\n", id.c_str(),
              static_cast<unsigned long long>(tb.scalars()), static_cast<unsigned long long>(rows.used), extras.c_str(),
              into.c_str(), tb.files().size());
  return {};
}

/// A run, or each of a group's runs on this machine.
Error export_tensorboard(const Located& found, const ExportArgs& a) {
  std::vector<std::string> dirs;
  if (!found.group.empty()) {
    const GroupInfo g = read_group(found.group);
    for (const GroupMemberView& m : g.members) {
      if (m.run) dirs.push_back(m.run->dir);
      else std::fprintf(stderr, "chorus export: %s's run is not on this machine: export it where it is\n", m.id().c_str());
    }
    if (dirs.empty()) return invalid("group " + found.group + " has no run on this machine to export");
  } else {
    dirs.push_back(found.run);
  }
  for (const std::string& d : dirs)
    if (Error e = export_tensorboard_run(d, a)) return e;
  std::printf("see them with: tensorboard --logdir %s\n", a.tensorboard.c_str());
  return {};
}

} // namespace

int export_main(std::span<char* const> words) {
  ExportArgs a;
  if (std::optional<int> done = parse_words(export_command, words, a, &parse)) return *done;
  const Result<Located> found = locate(a.target, a.dir);
  if (!found) return failure("export", found.error().message());
  if (!found->group.empty() && a.tensorboard.empty())
    return failure("export", "'" + a.target + "' is a group: --csv and --jsonl take one run (export its runs one at a "
                             "time), --tensorboard DIR takes the whole group");
  Error e;
  if (a.tensorboard.empty()) note_state(read_run(found->run));
  if (!a.csv.empty()) e = export_csv(found->run, a);
  else if (!a.jsonl.empty()) e = export_jsonl(found->run, a);
  else e = export_tensorboard(*found, a);
  if (e) return failure("export", e.message());
  return exit_ok;
}

} // namespace chorus::cli
