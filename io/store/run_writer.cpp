// RunWriter (run_writer.hpp): the readable files of a run directory.
#include "io/store/run_writer.hpp"
#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/store/barrier_log.hpp"
#include "io/store/event_log.hpp"
#include "io/store/histogram_log.hpp"
#include "io/store/history_blocks.hpp"
#include "io/store/media_log.hpp"
#include "io/store/metric_specs.hpp"
#include "io/store/run_record.hpp"
#include "runtime/core/json.hpp"
#include "runtime/core/strings.hpp"
#include "runtime/core/wire.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace chorus::store {
namespace {

// A JSON object merged key by key (a later value replaces an earlier one),
// keeping the order keys first appeared in. Values are kept as JSON text.
struct ObjectMerge {
  std::vector<std::pair<std::string, std::string>> items;
  std::unordered_map<std::string, std::size_t> index;

  void set(std::string_view key, std::string json) {
    auto [it, fresh] = index.try_emplace(std::string(key), items.size());
    if (fresh)
      items.emplace_back(key, std::move(json));
    else
      items[it->second].second = std::move(json);
  }
  [[nodiscard]] bool has(const std::string& key) const { return index.contains(key); }
};

// One column of the history: a key, or a key/rank-N, with what its
// summary may take (define_metric's summary: its last, smallest, largest or
// mean value, NaN left out).
struct Series {
  std::string name;
  std::string quoted; // "name": ready to append
  std::uint32_t key = 0;
  double last = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0;
  std::uint64_t n = 0; // values that are not NaN

  void take(double v) {
    last = v;
    if (std::isnan(v)) return;
    min = std::min(min, v);
    max = std::max(max, v);
    sum += v;
    ++n;
  }
  /// Its value in the summary, as `how` says (its last where it has no other).
  [[nodiscard]] double summary(Summary how) const {
    if (n == 0) return last;
    switch (how) {
      case Summary::min: return min;
      case Summary::max: return max;
      case Summary::mean: return sum / static_cast<double>(n);
      case Summary::last: break;
    }
    return last;
  }
};

// One attempt of the run: a run_start to its run_end (Options::resume).
struct Segment {
  std::int64_t start_us = 0;
  std::optional<std::int64_t> end_us;
  RunState state = RunState::running;
};

struct RankInfo {
  RunState state = RunState::running;
  std::int64_t last_step = -1;
  std::string host;
  std::string message;
  bool operator==(const RankInfo&) const = default;
};

} // namespace

// A line file of the run, opened (made) by its first line.
struct LineFile {
  const char* name;
  std::unique_ptr<platform::AppendFile> f;
  bool failed = false; // it could not be opened: the run's error says why
};

struct RunWriter::State {
  std::string dir;
  std::function<std::string_view(std::uint32_t)> key_name;
  Error error;
  std::string kept_error; // keep_error's

  std::unique_ptr<platform::AppendFile> history;
  // Made by their first line: a run that refuses nothing, and logs no
  // histogram, media or event, has none of these files (each reader takes a
  // missing one as empty), and its start makes that many inodes fewer.
  LineFile rejected_file{"rejected.jsonl"};
  LineFile histograms{"histograms.jsonl"}; // io/store/histogram_log.hpp
  LineFile media_file{"media.jsonl"};      // beside media/ (io/store/media_log.hpp)
  LineFile events_file{store::events_file}; // io/store/event_log.hpp
  // A summary of history.jsonl per block of rows, for its readers that draw
  // a long run at once (io/store/history_blocks.hpp): made by its first block.
  LineFile blocks_file{store::history_blocks_file};
  HistoryBlockWriter blocks;
  std::string block_line;
  std::unique_ptr<platform::AppendFile> system_file; // opened by the first system line, appended to
  std::unique_ptr<BarrierLog> barriers;    // made by the first barrier, appended to
  std::string line; // reused for every line, so rows do not allocate

  std::vector<Series> series;
  std::unordered_map<std::uint64_t, std::uint32_t> series_of; // key << 32 | rank
  // The last row's columns in order (key << 32 | rank, series): a row's
  // columns are mostly the last one's, found without a look-up.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> last_columns;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> counts; // series, count; per row

  ObjectMerge config;
  ObjectMerge summary;
  MetricSpecs metrics;                               // metrics.json
  std::unordered_map<std::uint32_t, Summary> summary_of; // key -> its summary, where not last
  RunRecord identity; // who the run is, from run_start
  bool config_dirty = false;
  bool summary_dirty = false;
  bool metrics_dirty = false;
  bool run_json_dirty = false; // rank states changed since run.json was written
  // run.json, config.json and summary.json as the start wrote them, without
  // an fsync: the next flush or the run's end writes them durably, or the
  // WAL's sync covers them (wal_backed); the WAL has what they say
  // meanwhile, for `chorus recover`.
  bool start_unsynced = false;
  bool wal_backed = false; // end_backed_by_wal
  bool end_files_written = false; // end_files() wrote the end's files but run.json
  bool end_files_durable = false; // and synced them
  bool end_spare = false;         // and the disk had room to spare then
  // The lengths run.json records once the run has ended (RunRecord::lengths).
  std::vector<std::pair<std::string, std::uint64_t>> end_lengths;
  // run.json of the end, staged by stage_run_end() with this text.
  std::optional<platform::StagedFile> staged_end;
  std::string staged_end_text;

  std::map<int, RankInfo> ranks; // the current attempt's
  std::map<int, std::int64_t> joined; // the current attempt's: when each rank joined (unix µs)
  std::vector<Segment> segments;
  // The exit codes `chorus launch` added to an earlier run.json, by attempt:
  // they are nowhere in the WAL, so a rebuild carries them over.
  std::vector<std::optional<ExitCodes>> exit_codes;
  std::uint32_t world_size = 0;
  std::uint64_t rows = 0;
  std::uint64_t rejected_values = 0;
  std::int64_t last_step = 0;
  std::int64_t last_ts_us = 0;
  std::int64_t last_runtime_us = 0;

  simdjson::dom::parser parser;

  void fail(Error e) {
    if (e && !error) error = std::move(e);
  }

  // The append-only file `name`, or nullptr where it cannot be opened (the
  // run's error says why).
  std::unique_ptr<platform::AppendFile> open_file(const char* name, bool truncate) {
    Result<std::unique_ptr<platform::AppendFile>> f = platform::AppendFile::open(file(name), truncate);
    if (f) return std::move(*f);
    fail(f.error());
    return nullptr;
  }

  // Where an earlier writer of this directory (a resume, `chorus recover`)
  // left `lf`, it is emptied now, as history.jsonl is: the WAL writes every
  // line again.
  void empty_if_there(LineFile& lf) {
    Result<std::unique_ptr<platform::AppendFile>> f = platform::AppendFile::open_existing(file(lf.name), /*truncate=*/true);
    if (!f) return fail(f.error()), void(lf.failed = true);
    lf.f = std::move(*f);
  }

  // `lf`, made by its first line; nullptr where it cannot be (the run's error says why).
  platform::AppendFile* lines(LineFile& lf) {
    if (!lf.f && !lf.failed) lf.failed = !(lf.f = open_file(lf.name, /*truncate=*/false));
    return lf.f.get();
  }

  // Room held on the run's disk for its last words: where the disk fills up
  // under the run, freeing it lets the end state and the reason reach run.json.
  static constexpr off_t room = 256 << 10;
  bool holds_room = false;
  void hold_room() {
    const int fd = platform::open_private(file(".reserve"), O_WRONLY | O_CREAT | O_TRUNC).value_or(-1);
    if (fd < 0) return;
    holds_room = ::posix_fallocate(fd, 0, room) == 0;
    platform::close_fd(fd);
    if (!holds_room) ::unlink(file(".reserve").c_str());
  }
  void release_room() {
    if (holds_room) ::unlink(file(".reserve").c_str());
    holds_room = false;
  }
  // Whether the run's disk has room to spare for the end's writes with the
  // reserve still held: then it is freed after them (its removal, which
  // discards its blocks on a disk mounted so, is off the finish's path).
  [[nodiscard]] bool room_to_spare() const {
    struct statvfs fs {};
    if (!holds_room || ::statvfs(dir.c_str(), &fs) != 0) return false;
    return static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize >= 64ull * room;
  }
  // The disk failed: the end state and the reason go into the room the run held.
  void end_in_room() {
    release_room();
    write_summary();
    write_run_json();
  }
  [[nodiscard]] std::string file(std::string_view name) const { return dir + "/" + std::string(name); }

  /// The series of `key` and `rank` (`id`: key << 32 | rank), made where it is new.
  Series& series_for(std::uint64_t id, std::uint32_t key, std::int32_t rank) {
    auto [it, fresh] = series_of.try_emplace(id, static_cast<std::uint32_t>(series.size()));
    if (fresh) {
      Series s;
      s.key = key;
      s.name = std::string(key_name(key));
      if (rank >= 0) s.name.append("/rank-").append(std::to_string(rank));
      core::append_json_string(s.quoted, s.name);
      s.quoted.push_back(':');
      series.push_back(std::move(s));
    }
    return series[it->second];
  }

  /// The series of a row's `i`-th value: the last row's `i`-th where it is the same.
  Series& column(std::size_t i, std::uint32_t key, std::int32_t rank) {
    const std::uint64_t id = (std::uint64_t{key} << 32) | static_cast<std::uint32_t>(rank);
    if (i < last_columns.size() && last_columns[i].first == id) [[likely]]
      return series[last_columns[i].second];
    Series& col = series_for(id, key, rank);
    const auto at = static_cast<std::uint32_t>(&col - series.data());
    if (i < last_columns.size())
      last_columns[i] = {id, at};
    else
      last_columns.emplace_back(id, at);
    return col;
  }

  // Merges the members of a JSON object into `into`; false if it is not one.
  bool merge(ObjectMerge& into, std::string_view json, std::string_view what) {
    simdjson::dom::object obj;
    if (auto e = parser.parse(json.data(), json.size()).get(obj)) {
      fail(Error{Errc::invalid_argument, std::string(what) + " was not a JSON object (" + simdjson::error_message(e) +
                                             "); it was left out of " + dir + ". Pass key/value fields."});
      return false;
    }
    for (auto [k, v] : obj) into.set(k, simdjson::minify(v));
    return true;
  }

  [[nodiscard]] static std::string object_text(const ObjectMerge& obj) {
    std::string out;
    core::JsonWriter w(out);
    w.begin_object();
    for (const auto& [k, v] : obj.items) w.key(k).raw(v);
    w.end_object();
    out.push_back('\n');
    return out;
  }

  void write_config(bool durable = true) {
    fail(platform::write_file_atomic(file("config.json"), object_text(config), durable));
    config_dirty = false;
  }

  // The JSON file `name` staged to be made durable (platform::StagedFile):
  // with `text()` where it changed since the start wrote it without a sync;
  // else as that file stands (no new file, nothing written twice), or with
  // `text()` if it is gone. Nothing where it cannot be (the run's error says why).
  template <class Text>
  std::optional<platform::StagedFile> stage(const char* name, bool changed, Text text) {
    const std::string path = file(name);
    if (!changed) {
      Result<platform::StagedFile> kept = platform::StagedFile::existing(path);
      if (kept && kept->staged()) return std::move(*kept);
    }
    Result<platform::StagedFile> staged = platform::StagedFile::replace(path, text());
    if (staged) return std::move(*staged);
    fail(staged.error());
    return std::nullopt;
  }

  void commit(std::optional<platform::StagedFile>& staged) {
    if (staged) fail(staged->commit());
  }

  // stage() and commit() at once; `dirty` is cleared.
  template <class Text>
  void make_durable(const char* name, bool& dirty, Text text) {
    std::optional<platform::StagedFile> f = stage(name, dirty, text);
    commit(f);
    dirty = false;
  }

  void write_summary(bool durable = true) {
    fail(platform::write_file_atomic(file("summary.json"), summary_text() + "\n", durable));
    summary_dirty = false;
  }

  /// summary.json's object: the automatic last values, and run.summary over them.
  [[nodiscard]] std::string summary_text() const {
    std::string out;
    core::JsonWriter w(out);
    w.begin_object();
    if (rows != 0) {
      // The automatic part: W&B's _step/_runtime/_timestamp and each column's last value.
      std::string t;
      if (!summary.has("_step")) w.key("_step").integer(last_step);
      if (!summary.has("_runtime")) {
        core::append_json_seconds(t, last_runtime_us);
        w.key("_runtime").raw(t);
      }
      if (!summary.has("_timestamp")) {
        t.clear();
        core::append_json_seconds(t, last_ts_us);
        w.key("_timestamp").raw(t);
      }
      for (const Series& s : series) {
        if (summary.has(s.name)) continue;
        const auto how = summary_of.find(s.key);
        w.key(s.name).number(how == summary_of.end() ? s.last : s.summary(how->second));
      }
    }
    for (const auto& [k, v] : summary.items) w.key(k).raw(v);
    w.end_object();
    return out;
  }

  /// The length of each file the WAL backs that the run has, as it stands
  /// (RunRecord::lengths); a file that cannot be looked at is left out.
  [[nodiscard]] std::vector<std::pair<std::string, std::uint64_t>> lengths() const {
    std::vector<std::pair<std::string, std::uint64_t>> out;
    for (const BackedFile& b : backed_files)
      if (const std::optional<std::uint64_t> n = file_length(dir, b.name)) out.emplace_back(std::string(b.name), *n);
    return out;
  }

  void write_run_json(bool durable = true) {
    fail(run_record().write(file("run.json"), durable));
    run_json_dirty = false;
  }

  /// run.json's text once the current attempt ends as `state` at `ts_us`,
  /// with the lengths as they stand: what run_end() would write now.
  [[nodiscard]] std::string end_text(RunState state, std::int64_t ts_us) {
    const Segment live = segments.back();
    auto lengths_before = std::move(end_lengths);
    segments.back().state = state;
    segments.back().end_us = ts_us;
    end_lengths = lengths();
    std::string text = run_record().text();
    segments.back() = live;
    end_lengths = std::move(lengths_before);
    return text;
  }

  /// run.json's record, as things stand.
  [[nodiscard]] RunRecord run_record() const {
    RunRecord r = identity;
    // The run's times and state: from its first attempt's start to its last's end.
    const Segment none;
    const Segment& last = segments.empty() ? none : segments.back();
    // The last attempt's exit codes, where a rebuild knows them already: they
    // stay at the top level, where launch adds them to the live run.json, so
    // that a rebuild from the WAL gives the same file. (A run.json written
    // before the first run_start, for a WAL that failed, has no attempt yet: no codes.)
    if (!segments.empty() && segments.size() <= exit_codes.size()) r.exit_codes = exit_codes[segments.size() - 1];
    const std::string exit_failure =
        last.state == RunState::finished && r.exit_codes ? failure_of_exit_codes(*r.exit_codes) : "";
    r.state = to_string(exit_failure.empty() ? last.state : RunState::failed);
    r.start_us = segments.empty() ? 0 : segments.front().start_us;
    r.end_us = last.end_us;
    for (std::size_t i = 0; i < segments.size(); ++i) {
      RunRecord::Segment& g = r.segments.emplace_back();
      g.start_us = segments[i].start_us;
      g.end_us = segments[i].end_us;
      g.state = to_string(segments[i].state);
      if (i + 1 < segments.size() && i < exit_codes.size()) g.exit_codes = exit_codes[i];
    }
    r.world_size = world_size;
    r.rows = static_cast<std::int64_t>(rows);
    r.rejected = static_cast<std::int64_t>(rejected_values);
    r.lengths = end_lengths;
    // What could not be written, where the files are incomplete (the WAL or a
    // file of the run, or as the rebuilt run.json recorded it: keep_error);
    // else why the run did not finish, rank by rank.
    if (error.code() == Errc::io_error)
      r.error = error.message();
    else if (!kept_error.empty())
      r.error = kept_error;
    else if (!exit_failure.empty())
      r.error = exit_failure;
    else if (last.state != RunState::running && last.state != RunState::finished)
      if (std::string why = ranks_ended(); !why.empty()) r.error = std::move(why);
    for (const auto& [rank, k] : ranks) {
      RunRecord::Rank& out =
          r.ranks.emplace_back(RunRecord::Rank{rank, std::string(to_string(k.state)), k.last_step, k.host, k.message});
      if (const auto at = joined.find(rank); at != joined.end()) out.joined_us = at->second;
    }
    return r;
  }

  /// The ranks that did not finish, those that ended alike together:
  /// "rank 1 failed (ended its run with exit code 1: ValueError: boom);
  /// ranks 0, 2-3 killed (stopped by SIGTERM)". At most a few kinds, then
  /// how many more.
  [[nodiscard]] std::string ranks_ended() const {
    std::vector<std::pair<std::pair<RunState, std::string>, std::vector<int>>> kinds;
    for (const auto& entry : ranks) {
      const int rank = entry.first;
      const auto& k = entry.second;
      if (k.state == RunState::finished || k.state == RunState::running) continue;
      auto it = std::find_if(kinds.begin(), kinds.end(),
                             [&](const auto& g) { return g.first.first == k.state && g.first.second == k.message; });
      if (it == kinds.end())
        kinds.push_back({{k.state, k.message}, {rank}});
      else
        it->second.push_back(rank);
    }
    // The cause first: failures, then ranks lost, then those a signal stopped.
    auto severity = [](RunState st) { return st == RunState::failed ? 0 : st == RunState::crashed ? 1 : 2; };
    std::stable_sort(kinds.begin(), kinds.end(),
                     [&](const auto& a, const auto& b) { return severity(a.first.first) < severity(b.first.first); });
    constexpr std::size_t shown = 4;
    std::string out;
    for (std::size_t i = 0; i < kinds.size() && i < shown; ++i) {
      if (i != 0) out.append("; ");
      out.append(chorus::core::rank_list(kinds[i].second)).append(" ").append(to_string(kinds[i].first.first));
      if (!kinds[i].first.second.empty()) out.append(" (").append(kinds[i].first.second).append(")");
    }
    if (kinds.size() > shown) out.append("; and ").append(std::to_string(kinds.size() - shown)).append(" more kinds (see ranks)");
    return out;
  }

  /// One line of rejected.jsonl: who, where, why, then `values(w)` writes
  /// the "values" member (and what follows it); `n` values are counted.
  template <class Values>
  void write_rejected(int rank, std::uint64_t seq, std::int64_t step, const Error& why, std::size_t n,
                      Values&& values) {
    line.clear();
    core::JsonWriter w(line);
    w.begin_object();
    w.key("rank").integer(rank);
    w.key("seq").uinteger(seq);
    w.key("step");
    if (step == core::wire::auto_step || step == core::wire::same_step)
      w.null();
    else
      w.integer(step);
    w.key("error").string(to_string(why.code()));
    w.key("message").string(why.message());
    w.key("values");
    values(w);
    w.end_object();
    line.push_back('\n');
    if (platform::AppendFile* f = lines(rejected_file)) fail(f->write(line));
    rejected_values += n;
  }

  void write_metrics(bool durable = true) {
    std::string out = metrics.json();
    out.push_back('\n');
    fail(platform::write_file_atomic(file("metrics.json"), out, durable));
    metrics_dirty = false;
  }

  /// Writes what the append files buffer.
  void flush_lines() {
    if (histograms.f) fail(histograms.f->flush()); // before history.jsonl, as row() keeps them
    if (media_file.f) fail(media_file.f->flush());
    if (history) fail(history->flush());
    if (blocks_file.f) fail(blocks_file.f->flush()); // after history.jsonl: its blocks' bytes are there
    if (barriers) fail(barriers->flush());
    if (system_file) fail(system_file->flush());
    if (rejected_file.f) fail(rejected_file.f->flush());
  }
};

RunWriter::RunWriter(std::string dir, std::function<std::string_view(std::uint32_t)> key_name)
    : s_(std::make_unique<State>()) {
  s_->dir = std::move(dir);
  s_->key_name = std::move(key_name);
  s_->line.reserve(4096);
  if (Error e = platform::make_dirs(s_->dir)) {
    s_->fail(std::move(e));
    return;
  }
  s_->history = s_->open_file("history.jsonl", /*truncate=*/true);
  for (LineFile* lf : {&s_->rejected_file, &s_->histograms, &s_->media_file, &s_->events_file, &s_->blocks_file})
    s_->empty_if_there(*lf);
}

RunWriter::~RunWriter() {
  flush();
  s_->release_room();
}

void RunWriter::release_room() { s_->release_room(); }

void RunWriter::stage_run_end(RunState state, std::int64_t ts_us) {
  State& s = *s_;
  s.staged_end.reset();
  if (!s.wal_backed || s.segments.empty() || s.error.code() == Errc::io_error) return;
  std::string text = s.end_text(state, ts_us);
  Result<platform::StagedFile> staged = platform::StagedFile::replace(s.file("run.json"), text);
  if (!staged) return; // run_end() writes it, and says why if it cannot
  s.staged_end.emplace(std::move(*staged));
  s.staged_end_text = std::move(text);
}

void RunWriter::run_start(std::string_view run_json, std::int64_t ts_us, std::uint32_t world_size) {
  State& s = *s_;
  s.segments.push_back(Segment{ts_us, std::nullopt, RunState::running});
  s.end_lengths.clear(); // an earlier attempt's end
  s.ranks.clear(); // a resumed attempt's ranks join afresh
  s.joined.clear();
  s.world_size = world_size;
  s.identity = {};
  if (const Result<RunRecord> parsed = RunRecord::parse(run_json))
    s.identity = parsed->identity();
  else
    s.fail(Error{Errc::invalid_argument,
                 "run_start's identity " + parsed.error().message() + "; it was left out of " + s.dir});
  // Readers find every file from the start, if empty. Not synced: nothing
  // waits on them before the WAL's first sync (which holds the run's start,
  // for `chorus recover`); what changes later is written durably, and the
  // run's end writes them durably, or under the WAL's sync (end_backed_by_wal).
  s.write_run_json(/*durable=*/false);
  s.write_config(/*durable=*/false);
  s.write_summary(/*durable=*/false);
  s.start_unsynced = true;
  s.flush_lines();
  if (s.metrics_dirty) s.write_metrics();
  s.hold_room();
}

void RunWriter::row(const chorus::core::Row& row) {
  State& s = *s_;
  std::string& l = s.line;
  // The rows of earlier steps are out before this step's histograms and
  // media: a reader that sees a line of step t in histograms.jsonl or
  // media.jsonl finds every history row before t (the W&B upload's join by
  // step counts on it, io/upload/slices.cpp whole_steps).
  if ((!row.media.empty() || !row.histograms.empty()) && s.history) s.fail(s.history->flush());
  if (!row.media.empty()) {
    // Each file before its line: a line never names a file that is not there.
    for (const auto& m : row.media) {
      const std::string_view key = s.key_name(m.key);
      const std::string path = media_path(key, m.rank, row.step, m.value->extension());
      const std::string full = s.file(path);
      Error e = platform::make_dirs(full.substr(0, full.rfind('/')));
      if (!e)
        e = platform::write_file_atomic(full, std::string_view(m.value->data.data(), m.value->data.size()), /*durable=*/false);
      if (e) {
        s.fail(std::move(e));
        continue;
      }
      l.clear();
      append_media_line(l, row.step, row.ts_us, row.runtime_us, key, m.rank, *m.value, path);
      if (platform::AppendFile* f = s.lines(s.media_file)) s.fail(f->write(l)), s.fail(f->flush());
    }
    if (row.values.empty() && row.histograms.empty()) {
      s.last_step = row.step;
      return;
    }
  }
  if (!row.histograms.empty()) {
    l.clear();
    for (const auto& h : row.histograms)
      append_histogram_line(l, row.step, row.ts_us, row.runtime_us, s.key_name(h.key), h.rank, h.count, *h.value);
    // Out before the step's history row can be: a reader that joins the two
    // files by step (the W&B upload) never sees the row before its histograms.
    if (platform::AppendFile* f = s.lines(s.histograms)) s.fail(f->write(l)), s.fail(f->flush());
    if (row.values.empty()) { // a step of histograms only has no history row
      s.last_step = row.step;
      return;
    }
  }
  l.clear();
  // Where the row's line starts in history.jsonl: what is out, and what is buffered.
  const std::uint64_t start = s.history ? s.history->size() + s.history->buffered() : 0;
  s.blocks.row(start, row.step);
  l.append("{\"_step\":");
  core::append_json_int(l, row.step);
  l.append(",\"_timestamp\":");
  core::append_json_seconds(l, row.ts_us);
  l.append(",\"_runtime\":");
  core::append_json_seconds(l, row.runtime_us);
  s.counts.clear();
  for (std::size_t i = 0; i < row.values.size(); ++i) {
    const auto& v = row.values[i];
    Series& col = s.column(i, v.key, v.rank);
    col.take(v.value);
    s.blocks.value(static_cast<std::uint32_t>(&col - s.series.data()), col.quoted, v.value);
    l.push_back(',');
    l.append(col.quoted);
    core::append_json_number(l, v.value);
    if (v.count != 0) s.counts.emplace_back(static_cast<std::uint32_t>(&col - s.series.data()), v.count);
  }
  if (!s.counts.empty()) {
    l.append(",\"_count\":{");
    for (std::size_t i = 0; i < s.counts.size(); ++i) {
      if (i != 0) l.push_back(',');
      l.append(s.series[s.counts[i].first].quoted);
      core::append_json_int(l, s.counts[i].second);
    }
    l.push_back('}');
  }
  l.append("}\n");
  if (s.history) s.fail(s.history->write(l));
  if (s.history && s.blocks.end_row(start + l.size(), s.block_line)) {
    if (platform::AppendFile* f = s.lines(s.blocks_file)) s.fail(f->write(s.block_line));
    s.block_line.clear();
  }
  ++s.rows;
  s.last_step = row.step;
  s.last_ts_us = row.ts_us;
  s.last_runtime_us = row.runtime_us;
  s.summary_dirty = true;
}

void RunWriter::config(int /*rank*/, std::string_view json_object) {
  // Ranks share one config, as W&B's does: the last write of a key wins.
  if (s_->merge(s_->config, json_object, "a config() call")) s_->config_dirty = true;
}

void RunWriter::summary(int /*rank*/, std::string_view json_object) {
  if (s_->merge(s_->summary, json_object, "a summary() call")) s_->summary_dirty = true;
}

void RunWriter::rejected(int rank, std::uint64_t seq, std::int64_t step,
                         std::span<const std::pair<std::string_view, double>> values, const Error& why) {
  State& s = *s_;
  s.write_rejected(rank, seq, step, why, values.size(), [&](core::JsonWriter& w) {
    w.begin_object();
    for (const auto& [k, v] : values) w.key(k).number(v);
    w.end_object();
  });
}

void RunWriter::refused(int rank, std::uint64_t seq, std::int64_t step, const Error& why, std::string_view values,
                        std::uint32_t n) {
  State& s = *s_;
  s.write_rejected(rank, seq, step, why, n, [&](core::JsonWriter& w) {
    // The rank made the object (its values as JSON); one that is not whole is kept as text.
    simdjson::dom::object checked;
    if (s.parser.parse(values.data(), values.size()).get(checked) == simdjson::SUCCESS)
      w.raw(values);
    else
      w.string(values);
    w.key("count").integer(n);
  });
}

void RunWriter::metric(std::uint32_t key, Reduce reduce, Summary summary, std::uint32_t step_key) {
  State& s = *s_;
  MetricSpec spec{reduce, summary, step_key == no_step_key ? std::string() : std::string(s.key_name(step_key))};
  s.metrics.set(s.key_name(key), std::move(spec));
  if (summary == Summary::last)
    s.summary_of.erase(key);
  else
    s.summary_of[key] = summary;
  s.metrics_dirty = s.summary_dirty = true;
}

void RunWriter::rank_state(int rank, RunState state, std::int64_t last_step, std::string_view host,
                           std::string_view reason) {
  RankInfo next{state, last_step, std::string(host), std::string(reason)};
  auto [it, fresh] = s_->ranks.try_emplace(rank, next);
  if (!fresh) {
    if (it->second == next) return;
    it->second = std::move(next);
  }
  // Written at the next flush, not per change: a job of R ranks joining and
  // finishing would otherwise rewrite (and sync) a file of R ranks 2R times.
  s_->run_json_dirty = true;
}

void RunWriter::rank_joined(int rank, std::int64_t ts_us) {
  // A rank's first join stands: one repeated (a replay that met it twice) moves nothing.
  if (s_->joined.try_emplace(rank, ts_us).second) s_->run_json_dirty = true;
}

void RunWriter::completed(int, std::uint64_t, const Error*) {}

std::string RunWriter::summary_json() const { return s_->summary_text(); }

void RunWriter::end_files() {
  State& s = *s_;
  // Written once, but again where the WAL no longer backs them (it failed meanwhile): then they are synced.
  if (s.end_files_written && (s.end_files_durable || s.wal_backed)) return;
  s.end_files_written = true;
  s.end_files_durable = !s.wal_backed;
  // The room is freed first where the disk may not take the end (it failed,
  // or is nearly full), else once the end is written (or failed for room).
  const bool spare = s.error.code() != Errc::io_error && s.room_to_spare();
  if (!spare) s.release_room();
  if (s.error.code() == Errc::io_error) s.end_in_room(); // the disk is failing: the end takes the room first
  // The line files first, then summary.json and the other JSON files, then
  // run.json, each after the lines it counts. Every file to be synced has
  // its writes started at once, so that each sync waits for its own, already
  // under way. Where the WAL's sync makes the end durable, only the files it
  // does not hold are synced (system.jsonl, barriers.jsonl), and the others
  // are only written out: their writeback started here would be a syscall
  // and the start of the device's work on the finish's path, for files no
  // sync waits on. Else every line file is synced, each only where
  // something was written since its last sync, and each JSON file.
  const bool durable = !s.wal_backed;
  const std::initializer_list<platform::AppendFile*> backed = {s.history.get(), s.histograms.f.get(),
                                                               s.media_file.f.get(), s.rejected_file.f.get()};
  for (platform::AppendFile* f : backed)
    if (f) s.fail(durable ? f->start_sync() : f->flush());
  if (s.system_file) s.fail(s.system_file->start_sync());
  if (s.barriers) s.fail(s.barriers->start_sync());
  if (durable)
    for (platform::AppendFile* f : backed)
      if (f) s.fail(f->sync());
  if (s.system_file) s.fail(s.system_file->sync());
  if (s.barriers) s.fail(s.barriers->sync());
  if (s.metrics_dirty) s.write_metrics(durable);
  // config.json as the start wrote it stands where the WAL backs it; else it is made durable.
  if (durable && (s.config_dirty || s.start_unsynced))
    s.make_durable("config.json", s.config_dirty, [&] { return s.object_text(s.config); });
  else if (s.config_dirty)
    s.write_config(/*durable=*/false);
  s.write_summary(durable);
  s.start_unsynced = false;
  s.end_spare = spare;
}

void RunWriter::run_end(RunState state, std::int64_t ts_us) {
  State& s = *s_;
  if (!s.segments.empty()) {
    s.segments.back().state = state;
    s.segments.back().end_us = ts_us;
  }
  end_files();
  s.end_files_written = false; // a later attempt's end writes its own
  // run.json last, as readers see the end there, with the lengths of what
  // it counts as they stand now.
  s.end_lengths = s.lengths();
  std::optional<platform::StagedFile> staged = std::exchange(s.staged_end, std::nullopt);
  if (staged && s.wal_backed && s.staged_end_text == s.run_record().text()) {
    s.fail(staged->commit(/*durable=*/false));
    s.run_json_dirty = false;
  } else {
    s.write_run_json(!s.wal_backed); // a staged text that no longer says the end is dropped
  }
  if (s.end_spare && s.error.code() == Errc::io_error) s.end_in_room(); // the disk filled under the end's own writes
  // Otherwise the room goes once the run's end is answered (release_room), or with the writer.
}

std::optional<RunState> RunWriter::carry_over(const std::string& run_json_path) {
  State& s = *s_;
  // No run.json, or a torn one, has nothing to carry over; one that is not a
  // regular file (a FIFO, a link) is not opened as one (RunRecord::read refuses it).
  const Result<RunRecord> run = RunRecord::read(run_json_path);
  if (!run) return std::nullopt;
  s.exit_codes.clear();
  for (const RunRecord::Segment& seg : run->segments) s.exit_codes.push_back(seg.exit_codes);
  // launch adds the codes of the attempt that ended last at the top level.
  if (run->exit_codes) {
    if (s.exit_codes.empty()) s.exit_codes.emplace_back();
    s.exit_codes.back() = run->exit_codes;
  }
  return run->run_state();
}

void RunWriter::end_backed_by_wal(bool backed) noexcept { s_->wal_backed = backed; }

void RunWriter::note_error(const Error& e) {
  s_->error = e; // the run's own failure outranks a file's
  s_->run_json_dirty = true;
}

void RunWriter::keep_error(std::string why) {
  s_->kept_error = std::move(why);
  s_->run_json_dirty = true;
}

void RunWriter::system_line(std::string_view json_line) {
  State& s = *s_;
  if (!s.system_file && !(s.system_file = s.open_file("system.jsonl", /*truncate=*/false))) return;
  s.fail(s.system_file->write(json_line));
  s.fail(s.system_file->write("\n"));
}

void RunWriter::event(const core::wire::EventRecord& event) {
  State& s = *s_;
  platform::AppendFile* f = s.lines(s.events_file);
  if (!f) return;
  s.fail(f->write(event.json));
  s.fail(f->write("\n"));
  s.fail(f->flush());
}

void RunWriter::barrier(const BarrierRecord& record) {
  State& s = *s_;
  if (!s.barriers) s.barriers = std::make_unique<BarrierLog>(s.dir);
  s.fail(s.barriers->append(record));
}

void RunWriter::flush() {
  State& s = *s_;
  s.flush_lines();
  const bool again = std::exchange(s.start_unsynced, false);
  if (s.config_dirty || again) s.make_durable("config.json", s.config_dirty, [&] { return s.object_text(s.config); });
  if (s.summary_dirty || again) s.make_durable("summary.json", s.summary_dirty, [&] { return s.summary_text() + "\n"; });
  if (s.metrics_dirty) s.write_metrics();
  if (s.run_json_dirty || again) s.write_run_json(); // its counts move without making it dirty
}

const Error& RunWriter::error() const noexcept { return s_->error; }
const std::string& RunWriter::dir() const noexcept { return s_->dir; }
std::uint64_t RunWriter::rows() const noexcept { return s_->rows; }
std::uint64_t RunWriter::rejected_values() const noexcept { return s_->rejected_values; }

RunWriter::LineEnds RunWriter::written() const noexcept {
  const auto size = [](const std::unique_ptr<platform::AppendFile>& f) { return f ? f->size() : 0; };
  return {size(s_->history), size(s_->histograms.f), size(s_->media_file.f), size(s_->events_file.f)};
}

} // namespace chorus::store
