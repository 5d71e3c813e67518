#include "cli/run_info.hpp"
#include "cli/cli.hpp"
#include "io/platform/posix.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>

namespace chorus::cli {

namespace fs = std::filesystem;
namespace {

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
  const std::optional<std::int64_t> step = store::last_committed_step(r.dir);
  if (!step) return;
  for (RankInfo& k : r.ranks) {
    if (!running(k) || *step <= k.last_step) continue;
    k.last_step = *step;
    k.committed = true;
  }
}

} // namespace

std::int64_t RunInfo::crashed_ranks() const {
  return std::count_if(ranks.begin(), ranks.end(), [](const RankInfo& r) { return r.state == "crashed"; });
}

std::string RunInfo::shown_state() const {
  if (!readable()) return "unreadable";
  if (state.empty()) return "-";
  const std::string s = reported_state();
  return segments.size() > 1 ? s + " (" + std::to_string(segments.size()) + " attempts)" : s;
}

std::optional<double> RunInfo::duration() const {
  if (!start_time) return std::nullopt;
  if (end_time) return *end_time - *start_time;
  if (state == "running" && liveness.life == store::HostLife::alive) {
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
    r.problem = Error(Errc::io_error, present(dir + "/wal") ? "no run.json yet, but a WAL: the run is starting (its "
                                                              "host writes run.json a few ms after making the WAL), or "
                                                              "its host died before writing it; if it stays so, try "
                                                              "chorus recover " + dir
                                                            : "no run.json");
    return r;
  }
  Result<store::RunRecord> run = store::RunRecord::read(path);
  if (!run) {
    // The run is named beside the problem (ls, show): its file by name alone reads better.
    std::string why = run.error().message();
    for (std::size_t at; (at = why.find(dir + "/")) != std::string::npos;) why.erase(at, dir.size() + 1);
    r.problem = Error(run.error().code(), std::move(why));
    return r;
  }
  r.state = run->state;
  // From here on the record is as readers report it; `state` keeps run.json's word.
  r.liveness = store::apply_liveness(*run, dir, platform::unix_now_us());
  static_cast<store::RunIdentity&>(r) = *run;
  r.dir = dir;
  if (r.id.empty()) r.id = fs::path(dir).filename().string();
  r.world_size = run->world_size;
  r.rows = run->rows;
  r.rejected = run->rejected;
  r.error = run->error;
  const auto seconds = [](const std::optional<std::int64_t>& us) {
    return us ? std::optional<double>(store::RunRecord::seconds(*us)) : std::nullopt;
  };
  r.start_time = seconds(run->start_us);
  r.end_time = seconds(run->end_us);
  for (const store::RunRecord::Rank& k : run->ranks)
    r.ranks.push_back({k.rank, k.state, k.last_step, k.host, k.message, seconds(k.joined_us)});
  std::sort(r.ranks.begin(), r.ranks.end(), [](const RankInfo& a, const RankInfo& b) { return a.rank < b.rank; });
  for (const store::RunRecord::Segment& g : run->segments)
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
  if (r.state == "running" && !r.host_lost()) fill_running_steps(r);
  return r;
}

bool is_run_dir(const std::string& dir) { return present(dir + "/run.json") || present(dir + "/wal"); }

std::vector<RunGroup> find_runs(const std::string& root, const std::function<void(const std::string&)>& looked) {
  std::vector<RunGroup> groups;
  const auto look = [&looked](const std::string& dir) {
    if (looked) looked(dir);
  };
  look(root);
  for (const std::string& project_dir : subdirs(root)) {
    look(project_dir);
    const std::string project = fs::path(project_dir).filename().string();
    RunGroup loose{project, {}, {}};
    for (const std::string& child : subdirs(project_dir)) {
      look(child);
      if (is_run_dir(child)) {
        loose.run_dirs.push_back(child);
        continue;
      }
      RunGroup g{project, fs::path(child).filename().string(), {}, child};
      for (const std::string& run : subdirs(child)) {
        look(run);
        if (is_run_dir(run)) g.run_dirs.push_back(run);
      }
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
