#include "cli/run_info.hpp"
#include "cli/cli.hpp"
#include "cli/json_lines.hpp"
#include "io/platform/posix.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace chorus::cli {

using io::detail::this_host;
namespace fs = std::filesystem;
namespace {

// Whether some process holds a lock on the file `st` names, from /proc/locks
// (lines like "1: FLOCK  ADVISORY  WRITE 5887 fe:00:10953153 0 EOF"). Asking
// there, rather than trying the lock, never gets in a starting host's way.
std::optional<bool> locked(const struct stat& st) {
  std::ifstream in("/proc/locks");
  if (!in) return std::nullopt;
  for (std::string line; std::getline(in, line);) {
    unsigned maj = 0, min = 0;
    unsigned long long ino = 0;
    for (std::size_t at = 0; (at = line.find(':', at)) != std::string::npos; ++at) {
      const std::size_t start = line.rfind(' ', at);
      if (start == std::string::npos) continue;
      if (std::sscanf(line.c_str() + start + 1, "%x:%x:%llu", &maj, &min, &ino) == 3 && maj == ::major(st.st_dev) &&
          min == ::minor(st.st_dev) && ino == st.st_ino)
        return true;
    }
  }
  return false;
}

HostLife host_life(const RunInfo& r) {
  const bool here = !r.host.empty() && r.host == this_host();
  struct stat st {};
  if (::lstat((r.dir + "/wal").c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    if (auto held = locked(st)) {
      if (*held) return HostLife::alive;
      return here ? HostLife::gone : HostLife::unknown;
    }
  }
  if (here && r.pid > 0 && r.pid <= std::numeric_limits<pid_t>::max()) return ::kill(static_cast<pid_t>(r.pid), 0) == 0 || errno == EPERM ? HostLife::alive : HostLife::gone;
  return HostLife::unknown;
}

// Whether a directory entry `path` is there, whatever it is (a link that
// leads nowhere, or loops, included), so that a planted one is read and
// reported rather than taken for a missing file.
bool present(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

std::vector<std::string> subdirs(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(".") && it->is_directory(ec)) out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// run.json is rewritten as ranks join and end, not at every step. While the
// run goes on, each running rank has reached at least the last committed
// row, whose step summary.json (rewritten at every flush) holds as _step.
void fill_running_steps(RunInfo& r) {
  const auto running = [](const RankInfo& k) { return k.state == "running"; };
  if (std::none_of(r.ranks.begin(), r.ranks.end(), running)) return;
  simdjson::dom::parser parser;
  std::int64_t step = 0;
  const Result<simdjson::dom::element> doc = load_json_file(r.dir + "/summary.json", parser);
  if (!doc || (*doc)["_step"].get(step) != simdjson::SUCCESS) return;
  for (RankInfo& k : r.ranks) {
    if (!running(k) || step <= k.last_step) continue;
    k.last_step = step;
    k.committed = true;
  }
}

} // namespace

std::int64_t RunInfo::crashed_ranks() const {
  return std::count_if(ranks.begin(), ranks.end(), [](const RankInfo& r) { return r.state == "crashed"; });
}

std::string RunInfo::shown_state() const {
  if (!readable()) return "unreadable";
  if (host_crashed()) return "crashed?";
  if (state.empty()) return "-";
  return segments.size() > 1 ? state + " (" + std::to_string(segments.size()) + " attempts)" : state;
}

std::optional<double> RunInfo::duration() const {
  if (!start_time) return std::nullopt;
  if (end_time) return *end_time - *start_time;
  if (state == "running" && host_life == HostLife::alive) {
    const auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    return now - *start_time;
  }
  return std::nullopt;
}

RunInfo read_run(const std::string& dir) {
  RunInfo r;
  r.dir = dir;
  r.id = fs::path(dir).filename().string();
  const std::string path = dir + "/run.json";
  if (!present(path)) {
    r.problem = Error(Errc::io_error, present(dir + "/wal") ? "no run.json, but a WAL: the host may have died before "
                                                              "writing it; try chorus recover " + dir
                                                            : "no run.json");
    return r;
  }
  const Result<io::RunRecord> run = io::RunRecord::read(path);
  if (!run) {
    // The run is named beside the problem (ls, show): its file by name alone reads better.
    std::string why = run.error().message();
    for (std::size_t at; (at = why.find(dir + "/")) != std::string::npos;) why.erase(at, dir.size() + 1);
    r.problem = Error(run.error().code(), std::move(why));
    return r;
  }
  static_cast<io::RunIdentity&>(r) = *run;
  r.dir = dir;
  if (r.id.empty()) r.id = fs::path(dir).filename().string();
  r.state = run->state;
  r.world_size = run->world_size;
  r.rows = run->rows;
  r.rejected = run->rejected;
  const auto seconds = [](const std::optional<std::int64_t>& us) {
    return us ? std::optional<double>(io::RunRecord::seconds(*us)) : std::nullopt;
  };
  r.start_time = seconds(run->start_us);
  r.end_time = seconds(run->end_us);
  for (const io::RunRecord::Rank& k : run->ranks) r.ranks.push_back({k.rank, k.state, k.last_step, k.host, k.message});
  std::sort(r.ranks.begin(), r.ranks.end(), [](const RankInfo& a, const RankInfo& b) { return a.rank < b.rank; });
  for (const io::RunRecord::Segment& g : run->segments)
    r.segments.push_back({seconds(g.start_us), seconds(g.end_us), g.state});
  if (run->exit_codes) {
    r.exit_codes = *run->exit_codes;
    std::sort(r.exit_codes.begin(), r.exit_codes.end());
  }
  if (!run->damage.empty())
    r.problem = Error(Errc::io_error,
                      "run.json: " + run->damage + ". The file is damaged: chorus recover rebuilds it from the WAL");
  else if (r.state.empty())
    r.problem = Error(Errc::io_error, "run.json has no \"state\"");
  if (r.state == "running") {
    r.host_life = host_life(r);
    fill_running_steps(r);
  }
  return r;
}

bool is_run_dir(const std::string& dir) { return present(dir + "/run.json") || present(dir + "/wal"); }

std::vector<RunGroup> find_runs(const std::string& root) {
  std::vector<RunGroup> groups;
  for (const std::string& project_dir : subdirs(root)) {
    const std::string project = fs::path(project_dir).filename().string();
    RunGroup loose{project, {}, {}};
    for (const std::string& child : subdirs(project_dir)) {
      if (is_run_dir(child)) {
        loose.run_dirs.push_back(child);
        continue;
      }
      RunGroup g{project, fs::path(child).filename().string(), {}, child};
      for (const std::string& run : subdirs(child))
        if (is_run_dir(run)) g.run_dirs.push_back(run);
      if (!g.run_dirs.empty()) groups.push_back(std::move(g));
    }
    if (!loose.run_dirs.empty()) groups.push_back(std::move(loose));
  }
  return groups;
}

std::vector<std::string> find_run_by_id(const std::string& root, const std::string& id) {
  std::vector<std::string> exact, prefix;
  for (const RunGroup& g : find_runs(root))
    for (const std::string& d : g.run_dirs) {
      const std::string name = fs::path(d).filename().string();
      if (name == id)
        exact.push_back(d);
      else if (name.starts_with(id))
        prefix.push_back(d);
    }
  return exact.empty() ? prefix : exact;
}

Result<std::string> locate_run(const std::string& arg, const std::string& root) {
  std::error_code ec;
  if (fs::is_directory(arg, ec)) return arg;
  if (arg.find('/') != std::string::npos) return invalid("no directory at " + arg + ": pass a run's directory, or its id");
  const std::vector<std::string> found = find_run_by_id(root, arg);
  if (found.size() == 1) return found.front();
  if (found.empty())
    return invalid("no run '" + arg + "' under " + root +
                   ": pass the run's directory, or where the runs are with --dir (or CHORUS_DIR)");
  std::string list;
  for (const std::string& f : found) list += "\n  " + f;
  return invalid("'" + arg + "' names " + std::to_string(found.size()) + " runs; pass one of:" + list);
}

} // namespace chorus::cli
