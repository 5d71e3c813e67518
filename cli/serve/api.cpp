#include "cli/serve/api.hpp"
#include "cli/serve/index_store.hpp"
#include "io/platform/posix.hpp"

#include "cli/group_info.hpp"
#include "cli/run_info.hpp"
#include "io/store/artifacts.hpp"
#include "io/store/barrier_log.hpp"
#include "io/store/history_value.hpp"
#include "io/store/json_lines.hpp"
#include "io/store/metric_specs.hpp"
#include "runtime/core/fnv.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <pwd.h>
#include <span>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>

namespace chorus::cli::serve {
namespace fs = std::filesystem;
namespace {

/// Summary values the runs list shows beside each run.
constexpr std::size_t listed_summary_values = 6;
/// The longest path a request may name.
constexpr std::size_t max_rel_bytes = 1024;

void opt_number(core::JsonWriter& w, std::string_view key, const std::optional<double>& v) {
  w.key(key);
  if (v && std::isfinite(*v)) w.number(*v);
  else w.null();
}

void opt_integer(core::JsonWriter& w, std::string_view key, const std::optional<std::int64_t>& v) {
  w.key(key);
  if (v) w.integer(*v);
  else w.null();
}

/// The real path of `path`, or "" where it does not resolve.
std::string real(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return {};
  return buf;
}

bool inside(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.starts_with(dir) && (dir.ends_with('/') || path[dir.size()] == '/');
}

/// The parts of a relative path a request named, or why it names none.
std::string split_rel(std::string_view rel, std::vector<std::string_view>& parts) {
  if (rel.empty()) return "no path given";
  if (rel.size() > max_rel_bytes) return "the path is longer than " + std::to_string(max_rel_bytes) + " bytes";
  if (rel.front() == '/') return "an absolute path: name a run by its path under the runs directory";
  for (std::size_t at = 0; at <= rel.size();) {
    const std::size_t end = std::min(rel.find('/', at), rel.size());
    const std::string_view part = rel.substr(at, end - at);
    if (part.empty()) return "an empty part in the path";
    if (part == "." || part == "..") return "'.' and '..' are not taken in a path";
    if (part.front() == '.') return "a hidden name in the path";
    if (part.find('\0') != std::string_view::npos) return "a NUL byte in the path";
    parts.push_back(part);
    at = end + 1;
  }
  return {};
}

/// A file's size, time and inode as a short text that changes when it does; "" where it is not there.
std::string stamp_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "-";
  return std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_ino);
}

/// What changes when a run's run.json, summary.json or metrics.json does
/// (16 hex digits): GET /api/run's `stamp` and its `run` event's, so that a
/// page reads the run again only where it changed.
std::string run_files_stamp(const std::string& dir) {
  return runs_version(stamp_of(dir + "/run.json") + "|" + stamp_of(dir + "/summary.json") + "|" +
                      stamp_of(dir + "/metrics.json"));
}

std::string_view host_life_name(store::HostLife h) {
  switch (h) {
  case store::HostLife::alive: return "alive";
  case store::HostLife::gone: return "gone";
  case store::HostLife::unknown: break;
  }
  return "unknown";
}

/// A JSON file of the run (config.json, summary.json) as minified JSON
/// text: "null" where it is not there; an error where it cannot be read.
Result<std::string> json_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::string("null");
  simdjson::dom::parser parser;
  const Result<simdjson::dom::element> doc = store::load_json_file(path, parser);
  if (!doc) return doc.error();
  return simdjson::minify(*doc);
}

/// The keys the declarations chart others against (their step metrics):
/// the history's index keeps every point of them.
std::vector<std::string> step_metrics(const Result<store::MetricSpecs>& specs) {
  std::vector<std::string> out;
  if (!specs) return out;
  for (const auto& [key, spec] : specs->specs)
    if (!spec.step_metric.empty() && spec.step_metric != "_step" &&
        std::find(out.begin(), out.end(), spec.step_metric) == out.end())
      out.push_back(spec.step_metric);
  return out;
}

/// The first numbers of summary.json (bookkeeping keys left out), as a JSON object.
std::string summary_picks(const std::string& dir) {
  simdjson::dom::parser parser;
  simdjson::dom::object obj;
  const Result<simdjson::dom::element> doc = store::load_json_file(dir + "/summary.json", parser);
  if (!doc || doc->get(obj) != simdjson::SUCCESS) return "{}";
  std::string out;
  core::JsonWriter w(out);
  w.begin_object();
  std::size_t n = 0;
  for (auto [key, value] : obj) {
    if (key.starts_with('_')) continue;
    const std::optional<double> v = store::metric_value(value);
    if (!v) continue;
    w.key(key).number(*v);
    if (++n == listed_summary_values) break;
  }
  w.end_object();
  return out;
}

void identity(core::JsonWriter& w, const RunInfo& r) {
  w.key("id").string(r.id).key("name").string(r.name.empty() ? r.id : r.name);
  w.key("project").string(r.project).key("group").string(r.group);
  w.key("job_type").string(r.job_type).key("notes").string(r.notes);
  w.key("mode").string(r.mode).key("scope").string(r.scope);
  w.key("host").string(r.host).key("pid").integer(r.pid);
  w.key("launcher").string(r.launcher).key("job_id").string(r.job_id);
  // The state as every reader reports it (crashed where the host is lost), and as run.json has it.
  w.key("state").string(r.reported_state()).key("shown_state").string(r.shown_state());
  w.key("recorded_state").string(r.state);
  w.key("host_life").string(host_life_name(r.liveness.life)).key("host_lost").boolean(r.host_lost());
  // Files a crash of the machine cut short after the end (run_error says which).
  w.key("files_cut").boolean(!r.liveness.cut.empty());
  if (r.error) w.key("run_error").string(*r.error);
  opt_number(w, "start_time", r.start_time);
  opt_number(w, "end_time", r.end_time);
  opt_number(w, "duration", r.duration());
  opt_integer(w, "world_size", r.world_size);
  opt_integer(w, "rows", r.rows);
  opt_integer(w, "rejected", r.rejected);
  w.key("crashed_ranks").integer(r.crashed_ranks());
}

void ranks(core::JsonWriter& w, const RunInfo& r) {
  w.key("ranks").begin_array();
  for (const RankInfo& k : r.ranks) {
    w.begin_object().key("rank").integer(k.rank).key("state").string(k.state);
    w.key("last_step").integer(k.last_step).key("committed").boolean(k.committed);
    w.key("host").string(k.host).key("message").string(k.message);
    if (k.joined && std::isfinite(*k.joined)) w.key("joined").number(*k.joined); // as run.json has it
    w.key("exit_code");
    const auto code = std::find_if(r.exit_codes.begin(), r.exit_codes.end(), [&](const auto& c) { return c.first == k.rank; });
    if (code != r.exit_codes.end()) w.integer(code->second);
    else w.null();
    w.end_object();
  }
  w.end_array();
  w.key("exit_codes").begin_object();
  for (const auto& [rank, code] : r.exit_codes) w.key(std::to_string(rank)).integer(code);
  w.end_object();
}

/// Whether `step` is behind `furthest`: by more than 1% of it, and by 2 steps at least
/// (ranks that keep pace differ by a step now and then).
bool behind(std::int64_t step, std::int64_t furthest) {
  const std::int64_t gap = furthest - step;
  return gap >= 2 && gap * 100 > furthest;
}

/// The barriers of barriers.jsonl: the last of them as their lines have
/// them, and per rank the totals over all.
void barriers(core::JsonWriter& w, const store::BarrierSummary& b) {
  w.key("barriers").begin_object().key("missing").boolean(b.missing).key("total").uinteger(b.total);
  w.key("failed").uinteger(b.failed);
  w.key("skipped").uinteger(b.skipped).key("first_skipped").string(b.first_skipped);
  if (b.problem) w.key("error").string(b.problem.message());
  w.key("records").begin_array();
  for (const store::BarrierRecord& r : b.records) w.raw(store::barrier_line(r));
  w.end_array().key("ranks").begin_array();
  for (const store::BarrierSummary::Rank& k : b.ranks) {
    if (k.barriers == 0) continue;
    w.begin_object().key("rank").integer(k.rank).key("barriers").uinteger(k.barriers).key("absent").uinteger(k.absent);
    w.key("last").uinteger(k.last).key("waited").number(k.waited_s).key("caused").number(k.caused_s).end_object();
  }
  w.end_array().end_object();
}

void index_state(core::JsonWriter& w, const IndexState& s) {
  w.key("rows").uinteger(s.rows).key("skipped").uinteger(s.skipped);
  w.key("first_skipped").string(s.first_skipped).key("unfinished").boolean(s.unfinished);
  w.key("missing").boolean(s.missing).key("last_step").integer(s.last_step).key("bytes").uinteger(s.bytes);
  w.key("indexing").boolean(s.indexing);
  if (s.problem) w.key("error").string(s.problem.message());
}

/// Where an indexed file has no such entry: why it may have none yet ("" where it is read whole).
std::string not_read_yet(std::string_view file, const IndexState& s) {
  if (s.missing) return " (it has no " + std::string(file) + ")";
  if (s.indexing) return " yet (its " + std::string(file) + " is still being read: ask again)";
  return {};
}

/// The files of a run that serve reads, and its directories it serves
/// files from: under root, each must be shown (not_shown) for the run to be.
constexpr const char* run_files_read[] = {"run.json",        "config.json",      "summary.json",  "metrics.json",
                                          "history.jsonl",   "system.jsonl",     "histograms.jsonl", "media.jsonl",
                                          "events.jsonl",    "barriers.jsonl",   "artifacts.jsonl", "lease.json",
                                          "artifacts",       "media"};
/// Those its entry in the runs list is read from (the rest are checked when the run is opened).
constexpr const char* entry_files_read[] = {"run.json", "summary.json", "lease.json"};

bool in_group(gid_t gid) {
  if (gid == ::getegid()) return true;
  const int n = ::getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(static_cast<std::size_t>(n));
  const int got = ::getgroups(n, groups.data());
  return got > 0 && std::find(groups.begin(), groups.begin() + got, gid) != groups.begin() + got;
}

} // namespace

namespace {

/// The user serve runs as (it never changes).
uid_t serving_user() {
  static const uid_t me = ::geteuid();
  return me;
}

/// Root's own rule, on what lstat found of `path`: a path another user owns
/// is shown where its mode lets root read it as one who is not its owner
/// (its group's bits where root is in its group, else everyone's); "" where
/// it does, else why not. Root passes every other check of the kernel.
std::string root_may_not_read(const std::string& path, const struct stat& st) {
  if (st.st_uid == serving_user() || S_ISLNK(st.st_mode)) return {};
  const bool dir = S_ISDIR(st.st_mode);
  const bool group = in_group(st.st_gid);
  const mode_t need = group ? (S_IRGRP | (dir ? S_IXGRP : 0)) : (S_IROTH | (dir ? S_IXOTH : 0));
  if ((st.st_mode & need) == need) return {};
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  return path + " belongs to " + platform::user_named(st.st_uid) + ", and its mode " + mode + " does not let " +
         (group ? "its group" : "other users") +
         " read it: chorus serve runs as root here, and shows only what a run's owner lets other users read "
         "(serve it as its owner, or let others read it: chmod -R go+rX)";
}

} // namespace

std::string not_shown(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return {}; // not there: nothing to show, nothing to hide
  const uid_t me = serving_user();
  if (me == 0) return root_may_not_read(path, st);
  const int want = R_OK | (S_ISDIR(st.st_mode) ? X_OK : 0);
  if (::faccessat(AT_FDCWD, path.c_str(), want, AT_EACCESS | AT_SYMLINK_NOFOLLOW) == 0) return {};
  if (errno != EACCES && errno != EPERM) return {}; // another trouble: met, and named, where it is read
  return path + " cannot be read by " + platform::user_named(me) + ", whom chorus serve runs as (" + std::strerror(errno) + ")";
}

Reply refusal(int status, std::string_view why) {
  std::string body;
  core::JsonWriter(body).begin_object().key("error").string(why).end_object();
  return {status, std::move(body)};
}

Api::Api(std::string root, std::size_t cache_bytes, std::shared_ptr<IndexStore> store, std::function<void()> built)
    : root_(std::move(root)), cache_bytes_(cache_bytes), store_(std::move(store)), built_(std::move(built)) {}
Api::~Api() = default;

std::string Api::rel_of(const std::string& dir) const {
  if (dir.size() > root_.size() && dir.starts_with(root_) && dir[root_.size()] == '/') return dir.substr(root_.size() + 1);
  return dir;
}

std::string Api::hidden(const std::string& dir, Shown what, std::map<std::string, std::string>* looked) const {
  // The root and each directory below it down to `dir` (those above it
  // looked at once per listing).
  for (std::size_t at = root_.size(); at != std::string::npos; at = dir.find('/', at + 1)) {
    const std::string above = dir.substr(0, at);
    std::string why;
    if (looked == nullptr) {
      why = not_shown(above);
    } else {
      const auto [it, fresh] = looked->try_emplace(above);
      if (fresh) it->second = not_shown(above);
      why = it->second;
    }
    if (!why.empty()) return why;
  }
  if (std::string why = not_shown(dir); !why.empty()) return why;
  // The kernel guards the files of a run an unprivileged user reads; root's
  // reads are checked here, file by file (through the directory, once opened).
  if (serving_user() != 0) return {};
  if (what == Shown::group) return not_shown(dir + "/group.json");
  const int at = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (at < 0) return {}; // met, and named, where the run is read
  std::string why;
  const std::span<const char* const> names =
      what == Shown::run ? std::span<const char* const>(run_files_read) : std::span<const char* const>(entry_files_read);
  for (const char* name : names) {
    struct stat st {};
    if (::fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (why = root_may_not_read(dir + "/" + name, st); !why.empty()) break;
  }
  ::close(at);
  return why;
}

Resolved Api::resolve_run(std::string_view rel) const {
  std::vector<std::string_view> parts;
  if (std::string why = split_rel(rel, parts); !why.empty()) return {{}, 400, why};
  if (parts.size() < 2 || parts.size() > 3)
    return {{}, 400, "a run is named PROJECT/GROUP/RUN (or PROJECT/RUN) under the runs directory"};
  const std::string dir = real(root_ + "/" + std::string(rel));
  if (dir.empty()) return {{}, 404, "no run " + std::string(rel) + " under " + root_};
  if (!inside(dir, root_)) return {{}, 403, std::string(rel) + " leads out of " + root_ + " (through a link)"};
  if (std::string why = hidden(dir, Shown::run); !why.empty()) return {{}, 403, why};
  if (!is_run_dir(dir)) return {{}, 404, std::string(rel) + " is not a run directory (no run.json, no WAL)"};
  return {dir, 0, {}};
}

Resolved Api::resolve_group(std::string_view rel) const {
  std::vector<std::string_view> parts;
  if (std::string why = split_rel(rel, parts); !why.empty()) return {{}, 400, why};
  if (parts.size() != 2) return {{}, 400, "a group is named PROJECT/GROUP under the runs directory"};
  const std::string dir = real(root_ + "/" + std::string(rel));
  if (dir.empty()) return {{}, 404, "no group " + std::string(rel) + " under " + root_};
  if (!inside(dir, root_)) return {{}, 403, std::string(rel) + " leads out of " + root_ + " (through a link)"};
  if (std::string why = hidden(dir, Shown::group); !why.empty()) return {{}, 403, why};
  if (!is_group_dir(dir)) return {{}, 404, std::string(rel) + " is not a group directory"};
  return {dir, 0, {}};
}

Resolved Api::resolve_artifact(std::string_view rel, std::string_view name) const {
  Resolved run = resolve_run(rel);
  if (!run) return run;
  if (Error e = store::validate_artifact_name(name)) return {{}, 400, e.message()};
  const std::string base = real(run.dir + "/artifacts");
  const std::string file = real(run.dir + "/artifacts/" + std::string(name));
  if (base.empty() || file.empty()) return {{}, 404, "run " + std::string(rel) + " has no artifact file " + std::string(name)};
  if (!inside(base, run.dir) || !inside(file, base))
    return {{}, 403, "artifact " + std::string(name) + " leads out of its run directory (through a link)"};
  for (std::size_t at = base.size(); at != std::string::npos; at = file.find('/', at + 1))
    if (std::string why = not_shown(file.substr(0, at)); !why.empty()) return {{}, 403, why};
  if (std::string why = not_shown(file); !why.empty()) return {{}, 403, why};
  return {file, 0, {}};
}

Resolved Api::resolve_media(std::string_view rel, std::string_view key, std::int64_t step, int rank,
                            std::string_view& type) {
  Resolved run = resolve_run(rel);
  if (!run) return run;
  const std::optional<MediaFile> m = files(run.dir, false, false, false, true)->media.file(key, step, rank);
  if (!m)
    return {{}, 404, "run " + std::string(rel) + " has no media of key " + std::string(key) + " at step " +
                         std::to_string(step) + " from rank " + std::to_string(rank)};
  // The line's path is under media/ (store::read_media_line); no link may lead it out of there.
  const std::string base = real(run.dir + "/media");
  const std::string file = real(run.dir + "/" + m->path);
  if (base.empty() || file.empty()) return {{}, 404, "run " + std::string(rel) + " has no file " + m->path};
  if (!inside(base, run.dir) || !inside(file, base))
    return {{}, 403, m->path + " leads out of its run's media/ (through a link)"};
  for (std::size_t at = base.size(); at != std::string::npos; at = file.find('/', at + 1))
    if (std::string why = not_shown(file.substr(0, at)); !why.empty()) return {{}, 403, why};
  if (std::string why = not_shown(file); !why.empty()) return {{}, 403, why};
  type = m->type;
  return {file, 0, {}};
}

std::shared_ptr<Api::RunFiles> Api::files(const std::string& dir, bool history, bool system, bool histograms,
                                          bool media) {
  std::shared_ptr<RunFiles> f;
  {
    std::lock_guard lock(mutex_);
    auto& slot = files_[dir];
    if (!slot) slot = std::make_shared<RunFiles>(dir, store_, built_);
    f = slot;
  }
  f->used = ++clock_;
  if (history) {
    // A key declared as another's step metric keeps all its points, so that charts against it are exact.
    const std::string stamp = stamp_of(dir + "/metrics.json");
    std::lock_guard lock(f->specs_mutex);
    if (stamp != f->specs_stamp) {
      f->specs_stamp = stamp;
      const Result<store::MetricSpecs> specs = store::MetricSpecs::read(dir);
      f->history.keep_points(step_metrics(specs));
      f->history.count_ranks(specs); // a key declared `first` is left out of _count/min
    }
  }
  if (history) f->history.refresh();
  if (system) f->system.refresh();
  if (histograms) f->histograms.refresh();
  if (media) f->media.refresh();
  // After every look, not only where a file grew: an index being built (in the
  // background, or on threads for another request) grows between two, and counts.
  evict();
  return f;
}

void Api::evict() {
  std::lock_guard lock(mutex_);
  for (;;) {
    std::size_t total = 0;
    std::map<std::string, std::shared_ptr<RunFiles>>::iterator oldest = files_.end();
    for (auto it = files_.begin(); it != files_.end(); ++it) {
      total += it->second->memory();
      // One in use elsewhere (a request, an event stream) stays.
      if (it->second.use_count() == 1 && (oldest == files_.end() || it->second->used < oldest->second->used))
        oldest = it;
    }
    if (total <= cache_bytes_ || oldest == files_.end()) return;
    files_.erase(oldest);
  }
}

std::size_t Api::cached_bytes() {
  std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const auto& [dir, f] : files_) total += f->memory();
  return total;
}

Reply Api::runs() {
  std::lock_guard one(list_mutex_);
  // Taken first: a change while the list is read is told to the page again.
  // A fresh look (with the watch, one read of its events): a change made
  // before this request is in this answer.
  const std::string version = runs_version(runs_stamp(/*fresh=*/true));
  std::uint64_t changes = 0;
  bool still = false; // nothing below the root can have changed unseen, and nothing runs
  {
    std::lock_guard look(stamp_mutex_);
    changes = changes_;
    still = watch_.complete() && !live_now_;
  }
  // The last answer stands where the watch saw nothing at all change since
  // (a run added or removed, a file of one replaced, or who may read it),
  // and no run is running (its duration and host move with time).
  if (still && !last_list_.empty() && last_list_changes_ == changes) return {200, last_list_};
  const std::vector<RunGroup> groups = find_runs(root_);
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("root").string(root_).key("version").string(version).key("groups").begin_array();
  std::size_t count = 0, not_listed = 0;
  std::string first_not_listed;
  std::map<std::string, std::string> looked; // the directories above the runs: why each is not shown
  std::map<std::string, bool> plain;         // and whether each is a directory, not a link
  const auto is_plain = [&](const std::string& dir) {
    const auto [it, fresh] = plain.try_emplace(dir);
    struct stat st {};
    if (fresh) it->second = ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    return it->second;
  };
  std::map<std::string, ListEntry> listed;
  for (const RunGroup& g : groups) {
    // A group's runs, the newest first; a run whose directory leads out of
    // the root, or that is not shown to the user serve runs as, is left out.
    std::vector<std::pair<double, std::string>> entries;
    for (const std::string& d : g.run_dirs) {
      // Found below the root (a real path) through directories that are no
      // links, a run's directory is its real path: one lstat a run (and one
      // a group) instead of resolving each part of its path.
      bool direct = d.starts_with(root_ + "/");
      for (std::size_t at = root_.size() + 1; direct && at != std::string::npos; at = d.find('/', at + 1))
        direct = is_plain(d.substr(0, d.find('/', at + 1)));
      const std::string dir_real = direct ? d : real(d);
      if (dir_real.empty() || !inside(dir_real, root_)) continue;
      if (std::string why = hidden(dir_real, Shown::list_entry, &looked); !why.empty()) {
        if (not_listed++ == 0) first_not_listed = std::move(why);
        continue;
      }
      const std::string stamp = stamp_of(d + "/run.json") + "|" + stamp_of(d + "/summary.json");
      {
        std::lock_guard lock(mutex_);
        const auto it = listed_.find(d);
        if (it != listed_.end() && it->second.stamp == stamp) {
          entries.emplace_back(it->second.start, it->second.json);
          listed[d] = it->second;
          continue;
        }
      }
      const RunInfo r = read_run(d);
      std::string entry;
      core::JsonWriter e(entry);
      e.begin_object().key("path").string(rel_of(d));
      identity(e, r);
      if (r.problem) e.key("error").string(r.problem.message());
      e.key("summary").raw(summary_picks(d));
      e.end_object();
      // A running run's duration and host change with time: it is read again each time.
      if (r.state != "running") listed[d] = {stamp, r.start_time.value_or(0), entry};
      entries.emplace_back(r.start_time.value_or(0), std::move(entry));
    }
    if (entries.empty()) continue;
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    w.begin_object().key("project").string(g.project).key("group").string(g.group);
    w.key("path").string(g.group.empty() ? g.project : g.project + "/" + g.group);
    if (!g.dir.empty()) {
      std::error_code ec;
      if (std::string why = not_shown(g.dir + "/group.json"); !why.empty()) {
        w.key("error").string(why);
      } else if (fs::exists(fs::symlink_status(g.dir + "/group.json", ec))) {
        if (Result<store::GroupManifest> m = store::read_group_file(g.dir)) {
          w.key("manifest").begin_object().key("state").string(m->state).key("size").integer(m->size);
          w.key("mode").string(m->mode).key("scope").string(m->scope);
          opt_number(w, "start_time", m->start_time);
          opt_number(w, "end_time", m->end_time);
          w.end_object();
        } else {
          w.key("error").string(m.error().message());
        }
      }
    }
    w.key("runs").begin_array();
    for (const auto& [start, json] : entries) w.raw(json);
    w.end_array().end_object();
    count += entries.size();
  }
  w.end_array().key("count").uinteger(count);
  // Runs left out for the user serve runs as: how many, and why the first.
  w.key("not_shown").uinteger(not_listed);
  if (not_listed > 0) w.key("not_shown_why").string(first_not_listed);
  w.end_object();
  {
    // What was listed this time only: runs since removed are forgotten.
    std::lock_guard lock(mutex_);
    listed_ = std::move(listed);
  }
  last_list_ = still ? out : std::string();
  last_list_changes_ = changes;
  return {200, std::move(out)};
}

std::string runs_version(std::string_view stamp) {
  const std::uint64_t h = core::fnv1a64(stamp);
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

namespace {

/// A directory's time and inode, folded into one number (0: it is gone).
std::uint64_t dir_time(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return 0;
  return (static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1'000'000'007ULL + static_cast<std::uint64_t>(st.st_mtim.tv_nsec)) ^
         (static_cast<std::uint64_t>(st.st_ino) << 1);
}

} // namespace

std::string Api::runs_stamp(bool fresh) {
  std::lock_guard look(stamp_mutex_);
  const auto now = std::chrono::steady_clock::now();
  if (!fresh && !stamp_.empty() && now - stamp_at_ < stamp_every) return stamp_;
  // The times of the directories the last listing looked at: where none
  // changed, nothing was added, removed or replaced below the root (a run's
  // run.json, summary.json and lease.json are replaced by rename), and the
  // runs need no listing again. Where the watch answers for all of them and
  // tells of no change, not one is looked at; else one stat a directory.
  const bool quiet = !looked_.empty() && !watch_.changed();
  if (!quiet) ++changes_;
  if (quiet && !live_now_) {
    stamp_at_ = now; // nothing changed, and no run is running: the stamp stands
    return stamp_;
  }
  if (!quiet) {
    bool same = !looked_.empty();
    for (std::size_t i = 0; i < looked_.size() && same; ++i) same = dir_time(looked_[i]) == looked_times_[i];
    if (!same) {
      // Each directory watched and its time taken before it is read: a
      // change made after that is seen by the next look.
      looked_.clear();
      looked_times_.clear();
      run_dirs_.clear();
      // A complete watch keeps its watches (adding one twice is harmless; a
      // removed directory's goes with it); an incomplete one tries afresh.
      if (!watch_.complete()) watch_.restart();
      const std::vector<RunGroup> groups = find_runs(root_, [this](const std::string& dir) {
        watch_.add(dir);
        looked_times_.push_back(dir_time(dir));
        looked_.push_back(dir);
      });
      std::unordered_map<std::string_view, std::size_t> at;
      for (std::size_t i = 0; i < looked_.size(); ++i) at.emplace(looked_[i], i);
      for (const RunGroup& g : groups)
        for (const std::string& d : g.run_dirs) run_dirs_.emplace_back(d, at.at(d));
    }
  }
  std::uint64_t h = core::fnv1a64_basis;
  for (const std::uint64_t t : looked_times_) h = core::fnv1a64_step(h, t);
  // Whether each run reads running (its host not known gone): read again
  // where its directory changed, and every running_every while it runs.
  bool live = false;
  std::map<std::string, Liveness> seen;
  for (const auto& [d, i] : run_dirs_) {
    const std::uint64_t t = looked_times_[i];
    Liveness l;
    if (const auto it = live_.find(d);
        it != live_.end() && it->second.dir_time == t && !(it->second.running && now - it->second.looked >= running_every))
      l = it->second;
    else
      l = {t, read_run(d).reported_state() == "running", now};
    live = live || l.running;
    h = core::fnv1a64_step(h, l.running ? 1 : 2);
    seen.emplace(d, l);
  }
  live_ = std::move(seen);
  live_now_ = live;
  stamp_ = runs_version(std::string_view(reinterpret_cast<const char*>(&h), sizeof h));
  if (live) {
    const auto since = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
    stamp_ += " live " + std::to_string(since.count() / running_every.count());
  }
  stamp_at_ = now;
  return stamp_;
}

Reply Api::run(std::string_view rel) {
  const Resolved where = resolve_run(rel);
  if (!where) return refusal(where.status, where.why);
  const std::string& dir = where.dir;
  // Taken first: a change while the files are read is told by the run's events.
  const std::string stamp = run_files_stamp(dir);
  const RunInfo r = read_run(dir);
  std::vector<std::string> errors, warnings;
  if (r.problem) errors.push_back(r.problem.message());
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("path").string(rel).key("stamp").string(stamp);
  identity(w, r);
  ranks(w, r);
  w.key("segments").begin_array();
  for (const RunInfo::Segment& s : r.segments) {
    w.begin_object().key("state").string(s.state);
    opt_number(w, "start_time", s.start_time);
    opt_number(w, "end_time", s.end_time);
    w.end_object();
  }
  w.end_array();
  for (const char* name : {"config", "summary"}) {
    const Result<std::string> json = json_file(dir + "/" + name + ".json");
    w.key(name);
    if (json) {
      w.raw(*json);
    } else {
      w.null();
      errors.push_back(json.error().message());
    }
  }
  // Its metrics' declarations (metrics.json): {} where none was declared.
  {
    const Result<store::MetricSpecs> specs = store::MetricSpecs::read(dir);
    w.key("metrics");
    if (specs) {
      w.raw(specs->json());
    } else {
      w.null();
      errors.push_back(specs.error().message());
    }
  }
  // Where the run belongs to a group: the group's path.
  if (const std::size_t slash = rel.rfind('/'); std::count(rel.begin(), rel.end(), '/') == 2)
    w.key("group_path").string(rel.substr(0, slash));
  // Artifacts, as artifacts.jsonl lists them.
  w.key("artifacts").begin_array();
  const std::string artifacts = dir + "/artifacts.jsonl";
  std::error_code ec;
  if (fs::exists(fs::symlink_status(artifacts, ec))) {
    const store::JsonLines lines = store::read_json_lines(artifacts, [&](const simdjson::dom::object& line) -> std::string_view {
      // A field missing or of another type is shown as its default.
      const std::optional<store::ArtifactRecord> a = store::artifact_record(line);
      if (!a) return "no name";
      w.begin_object().key("name").string(a->name).key("type").string(a->type).key("size").uinteger(a->size);
      w.key("sha256").string(a->sha256).key("rank").integer(a->rank).key("step").integer(a->step);
      w.key("timestamp").number(static_cast<double>(a->ts_us) / 1e6);
      w.key("available").boolean(static_cast<bool>(resolve_artifact(rel, a->name)));
      w.end_object();
      return {};
    });
    if (lines.problem) errors.push_back(lines.problem.message());
    if (lines.skipped > 0) warnings.push_back("artifacts.jsonl: " + std::to_string(lines.skipped) + " damaged line(s) skipped");
  }
  w.end_array();
  // Barriers: how long each rank waited at each, and for whom.
  const store::BarrierSummary bs = store::BarrierLog::read(dir);
  barriers(w, bs);
  if (bs.problem) errors.push_back(bs.problem.message());
  if (bs.skipped > 0)
    warnings.push_back(std::string(store::BarrierLog::file_name) + ": " + std::to_string(bs.skipped) +
                       " damaged line(s) skipped (" + bs.first_skipped + "); the others are shown");
  const std::shared_ptr<RunFiles> f = files(dir, true, true, true, true);
  // The ranks that hold the others back: those the others waited longest for
  // at barriers, and those whose last step is behind the furthest rank's.
  {
    std::map<std::int64_t, std::string> why;
    double most = 0;
    for (const store::BarrierSummary::Rank& k : bs.ranks) most = std::max(most, k.caused_s);
    // Ranks that keep pace still come last to a barrier now and then, by a
    // step's jitter: milliseconds a barrier, a few to a few tens of
    // milliseconds over a whole run. So a rank is marked only where the wall
    // time it cost each other rank on average (its caused waits, which add up
    // over the others, divided by their number) is at least 1 s, a delay a
    // person notices, and at least 1% of the run's wall time so far, a loss of
    // throughput worth looking into however long the run: both far above
    // that jitter.
    constexpr double least_lost_s = 1.0, least_lost_share = 0.01;
    double wall = r.duration().value_or(0); // start to end, or to now while its host lives
    if (wall <= 0 && !bs.records.empty()) {  // else: to the last barrier's release
      const double released = static_cast<double>(bs.records.back().released_us) / 1e6;
      if (r.start_time) wall = released - *r.start_time;
      if (wall <= 0) wall = released - static_cast<double>(bs.records.front().opened_us) / 1e6;
    }
    std::int64_t listed = 0;
    for (const store::BarrierSummary::Rank& k : bs.ranks) listed += k.barriers > 0 ? 1 : 0;
    const double others = static_cast<double>(std::max<std::int64_t>(1, listed - 1));
    for (const store::BarrierSummary::Rank& k : bs.ranks) {
      if (most <= 0 || k.caused_s * 2 < most || k.last == 0) continue;
      const double lost = k.caused_s / others;
      if (lost < least_lost_s || lost < least_lost_share * wall) continue;
      char text[160];
      std::snprintf(text, sizeof text, "the others waited %.3f s for it, at %llu of %llu barriers%s", k.caused_s,
                    static_cast<unsigned long long>(k.last), static_cast<unsigned long long>(k.barriers),
                    k.absent ? " (it never reached some)" : "");
      why[k.rank] = text;
    }
    std::map<std::int64_t, std::int64_t> at; // each rank's last step
    for (const auto& [key, step] : f->history.last_steps("_progress/rank-")) {
      char* end = nullptr;
      const long long rank = std::strtoll(key.c_str() + 15, &end, 10);
      if (end && *end == '\0' && rank >= 0) at[rank] = step;
    }
    // A rank that ended reported its own last step; a running one has reached at
    // least the last committed row (a row commits once every rank is past it),
    // whatever its last per-rank value, which a rank logging those every N
    // steps leaves up to N - 1 steps back.
    for (const RankInfo& k : r.ranks)
      if (k.last_step >= 0) at[k.rank] = std::max(at[k.rank], k.last_step);
    std::int64_t furthest = -1;
    std::int64_t lead = -1;
    for (const auto& [rank, step] : at)
      if (step > furthest) furthest = step, lead = rank;
    for (const auto& [rank, step] : at) {
      if (!behind(step, furthest)) continue;
      std::string& text = why[rank];
      if (!text.empty()) text += "; ";
      text += "at step " + std::to_string(step) + ", " + std::to_string(furthest - step) + " behind rank " +
              std::to_string(lead);
    }
    w.key("laggards").begin_array();
    for (const auto& [rank, text] : why) w.begin_object().key("rank").integer(rank).key("why").string(text).end_object();
    w.end_array();
  }
  // What could not be read of an indexed file, among the run's problems.
  auto file_problems = [&](std::string_view name, const IndexState& s) {
    if (s.problem) errors.push_back(s.problem.message());
    if (s.skipped > 0)
      warnings.push_back(std::string(name) + ".jsonl: " + std::to_string(s.skipped) + " damaged line(s) skipped (" +
                         s.first_skipped + ")");
  };
  for (const auto& [name, index] : {std::pair{"history", &f->history}, std::pair{"system", &f->system}}) {
    const IndexState s = index->state();
    w.key(name).begin_object();
    index_state(w, s);
    w.key("keys");
    index->keys_json(w.out());
    w.end_object();
    file_problems(name, s);
  }
  // histograms.jsonl's columns and media.jsonl's keys, beside where their reading stands.
  auto listed = [&](std::string_view name, std::string_view list, const IndexState& s, auto&& write_list) {
    w.key(name).begin_object();
    index_state(w, s);
    w.key(list);
    write_list();
    w.end_object();
    file_problems(name, s);
  };
  listed("histograms", "columns", f->histograms.state(), [&] { f->histograms.columns_json(w); });
  listed("media", "keys", f->media.state(), [&] { f->media.keys_json(w); });
  w.key("warnings").begin_array();
  for (const std::string& s : warnings) w.string(s);
  w.end_array().key("errors").begin_array();
  for (const std::string& s : errors) w.string(s);
  w.end_array();
  if (!errors.empty()) w.key("error").string(errors.front());
  w.end_object();
  return {200, std::move(out)};
}

Reply Api::series(std::string_view rel, FileKind kind, const SeriesRequest& r) {
  const Resolved where = resolve_run(rel);
  if (!where) return refusal(where.status, where.why);
  const std::shared_ptr<RunFiles> f =
      files(where.dir, kind == FileKind::history, kind == FileKind::system, false, false);
  const LinesIndex& index = kind == FileKind::history ? f->history : f->system;
  std::string out;
  index.series_json(r, out);
  const IndexState s = index.state();
  if (s.problem) {
    // The file could not be read to its end: say so beside what was read.
    out.pop_back();
    out += ",\"problem\":";
    core::append_json_string(out, s.problem.message());
    out += '}';
  }
  return {200, std::move(out)};
}

Reply Api::histograms(std::string_view rel, const HistogramRequest& r) {
  const Resolved where = resolve_run(rel);
  if (!where) return refusal(where.status, where.why);
  const std::shared_ptr<RunFiles> f = files(where.dir, false, false, true, false);
  const IndexState s = f->histograms.state();
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("run").string(rel);
  index_state(w, s);
  const Result<bool> found = f->histograms.column_json(r, w);
  if (!found) return refusal(409, found.error().message());
  if (!*found)
    return refusal(404, "run " + std::string(rel) + " has no histogram column " + r.column +
                            not_read_yet("histograms.jsonl", s));
  w.end_object();
  return {200, std::move(out)};
}

Reply Api::media(std::string_view rel, std::string_view key, std::optional<std::int64_t> step) {
  const Resolved where = resolve_run(rel);
  if (!where) return refusal(where.status, where.why);
  const std::shared_ptr<RunFiles> f = files(where.dir, false, false, false, true);
  const IndexState s = f->media.state();
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("run").string(rel);
  index_state(w, s);
  if (key.empty()) {
    w.key("keys");
    f->media.keys_json(w);
  } else if (!f->media.key_json(key, step, rel, w)) {
    return refusal(404,
                   "run " + std::string(rel) + " has no media key " + std::string(key) + not_read_yet("media.jsonl", s));
  }
  w.end_object();
  return {200, std::move(out)};
}

Reply Api::group(std::string_view rel) {
  const Resolved where = resolve_group(rel);
  if (!where) return refusal(where.status, where.why);
  GroupInfo g = read_group(where.dir);
  // A member whose run directory is not shown to the user serve runs as is
  // listed from group.json only, or not at all.
  for (GroupMemberView& v : g.members) {
    if (!v.run) continue;
    const std::string d = real(v.run->dir);
    if (d.empty() || !inside(d, root_) || !hidden(d, Shown::list_entry).empty()) v.run.reset();
  }
  std::erase_if(g.members, [](const GroupMemberView& v) { return !v.run && !v.member; });
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("path").string(rel).key("project").string(g.project).key("name").string(g.name);
  if (g.problem) w.key("error").string(g.problem.message());
  const store::GroupManifest* m = g.manifest ? &*g.manifest : nullptr;
  if (m) {
    w.key("manifest").begin_object().key("state").string(m->state).key("size").integer(m->size);
    w.key("mode").string(m->mode).key("scope").string(m->scope).key("launcher").string(m->launcher);
    w.key("job_id").string(m->job_id).key("host").string(m->host);
    opt_number(w, "start_time", m->start_time);
    opt_number(w, "end_time", m->end_time);
    w.key("exit_codes").begin_object();
    for (const auto& [rank, code] : m->exit_codes) w.key(std::to_string(rank)).integer(code);
    w.end_object().end_object();
  }
  // Each member's last step, and the furthest: members far behind it are marked.
  std::vector<std::int64_t> last_steps;
  for (const GroupMemberView& v : g.members) {
    std::int64_t last_step = -1;
    if (v.run)
      for (const RankInfo& k : v.run->ranks) last_step = std::max(last_step, k.last_step);
    if (v.member)
      for (const store::GroupRank& k : v.member->ranks) last_step = std::max(last_step, k.last_step);
    last_steps.push_back(last_step);
  }
  const std::int64_t furthest = last_steps.empty() ? -1 : *std::max_element(last_steps.begin(), last_steps.end());
  w.key("members").begin_array();
  for (std::size_t i = 0; i < g.members.size(); ++i) {
    const GroupMemberView& v = g.members[i];
    w.begin_object().key("label").string(v.label).key("id").string(v.id()).key("state").string(v.state());
    w.key("ranks").string(v.ranks()).key("exit_codes").string(exit_codes_cell(v.exit_codes(m)));
    std::string path;
    if (v.run) {
      const std::string candidate = std::string(rel) + "/" + fs::path(v.run->dir).filename().string();
      if (resolve_run(candidate)) path = candidate;
    }
    w.key("path").string(path);
    w.key("last_step").integer(last_steps[i]);
    if (last_steps[i] >= 0 && behind(last_steps[i], furthest)) w.key("behind").integer(furthest - last_steps[i]);
    if (v.member) {
      w.key("host").string(v.member->host).key("node").integer(v.member->node).key("rows").integer(v.member->rows);
      w.key("message").string(v.member->message);
      opt_number(w, "start_time", v.member->start_time);
      opt_number(w, "end_time", v.member->end_time);
    } else if (v.run) {
      w.key("host").string(v.run->host);
      opt_integer(w, "rows", v.run->rows);
      opt_number(w, "start_time", v.run->start_time);
      opt_number(w, "end_time", v.run->end_time);
    }
    if (v.run && v.run->problem) w.key("error").string(v.run->problem.message());
    w.end_object();
  }
  w.end_array().end_object();
  return {200, std::move(out)};
}

std::string Api::changes(std::string_view rel, Seen& seen) {
  const Resolved where = resolve_run(rel);
  if (!where) return {};
  const std::shared_ptr<RunFiles> f = files(where.dir, true, true, true, true);
  std::string out;
  auto event = [&](std::string_view name, auto&& fill) {
    out += "event: ";
    out += name;
    out += "\ndata: ";
    core::JsonWriter w(out);
    w.begin_object().key("run").string(rel);
    fill(w);
    w.end_object();
    out += "\n\n";
  };
  const IndexState h = f->history.state();
  if (!seen.started || h.rows != seen.history_rows || h.keys != seen.history_keys || h.indexing != seen.history_indexing) {
    event("history", [&](core::JsonWriter& w) { index_state(w, h), w.key("keys").uinteger(h.keys); });
    seen.history_rows = h.rows;
    seen.history_keys = h.keys;
    seen.history_indexing = h.indexing;
  }
  const IndexState s = f->system.state();
  if (!seen.started || s.rows != seen.system_rows || s.indexing != seen.system_indexing) {
    event("system", [&](core::JsonWriter& w) { index_state(w, s); });
    seen.system_rows = s.rows;
    seen.system_indexing = s.indexing;
  }
  // histograms.jsonl and media.jsonl: their lines, taken or skipped, and whether they are still being read.
  auto lines_event = [&](std::string_view name, std::string_view count, const IndexState& st, std::uint64_t& lines,
                         bool& indexing) {
    if (seen.started && st.rows + st.skipped == lines && st.indexing == indexing) return;
    event(name, [&](core::JsonWriter& w) { index_state(w, st), w.key(count).uinteger(st.keys); });
    lines = st.rows + st.skipped;
    indexing = st.indexing;
  };
  lines_event("histograms", "columns", f->histograms.state(), seen.histogram_lines, seen.histograms_indexing);
  lines_event("media", "keys", f->media.state(), seen.media_lines, seen.media_indexing);
  // metrics.json too: a late declaration changes how a page charts its keys.
  const std::string stamp = run_files_stamp(where.dir);
  // A host that dies changes no file: a running run's liveness is looked at now and then.
  const auto now = std::chrono::steady_clock::now();
  const bool changed = !seen.started || stamp != seen.run_stamp;
  if (changed || (seen.running && now - seen.run_looked >= liveness_look)) {
    const RunInfo r = read_run(where.dir);
    seen.run_looked = now;
    if (changed || r.reported_state() != "running")
      event("run", [&](core::JsonWriter& w) {
        w.key("stamp").string(stamp);
        identity(w, r);
        ranks(w, r);
        if (r.problem) w.key("error").string(r.problem.message());
      });
    seen.running = r.reported_state() == "running";
    seen.run_stamp = stamp;
  }
  seen.started = true;
  return out;
}

} // namespace chorus::cli::serve
