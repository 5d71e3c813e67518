// `chorus ls`: every run under a run directory, by project and group.
#include "cli/cli.hpp"
#include "cli/group_info.hpp"
#include "cli/run_info.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

namespace chorus::cli {
int ls_main(std::span<char* const> args); // below

const Command ls_command{
    .name = "ls",
    .summary = "list the runs under a run directory, grouped by project and group",
    .usage = "[DIR]",
    .help = R"(Lists the runs under DIR (default: $CHORUS_DIR, else ./chorus-runs), laid out
as DIR/PROJECT/GROUP/RUN-ID, grouped by project and group: projects by name,
the groups of a project by start time, the newest last, and the runs of a
group by start time too. For each run: its id, state, ranks (world size, and
how many crashed), history rows, start time, duration and name, from the
run's run.json.

The runs of a job with several runs (a run per rank, or per node) form a
group: its heading adds what the group's group.json says (how many runs, mode
and scope, the group's state and duration, the ranks' exit codes), its
members come first in their order in the job, with the global ranks each
holds, and a member whose run directory is not under DIR (another node's
disk), or that never started, is listed from group.json.

A run whose run.json is missing or broken is listed as "unreadable" with the
reason; the listing goes on. A run whose run.json says "running" but whose
host is gone is listed as "crashed", here or on any machine that sees its
directory: its host stopped renewing its lease (lease.json, renewed every 5 s,
expired 30 s after the last renewal) or, on the host's own machine, no
process holds its write-ahead log. A note under the listing names such runs
and why; 'chorus recover RUN' rebuilds their files.

options:
  -h, --help   this text

exit codes: 0 listed (even with unreadable runs), 1 DIR is not a directory,
2 a wrong command line.
)",
    .main = ls_main,
};

namespace {

std::string ranks_cell(const GroupMemberView& v) {
  std::string s = "-";
  if (v.run && v.run->world_size) {
    s = std::to_string(*v.run->world_size);
    if (const auto crashed = v.run->crashed_ranks(); crashed > 0) s += " (" + std::to_string(crashed) + " crashed)";
  } else if (v.member && !v.member->ranks.empty()) {
    s = std::to_string(v.member->ranks.size());
  }
  // A member of a group: which of the job's ranks it holds.
  if (const std::string global = v.ranks(); !global.empty())
    s += (v.member->ranks.size() == 1 ? " (rank " : " (ranks ") + global + ")";
  return s;
}

/// "  (group: 4 runs, new global, finished, 3.2s, exit codes: 0)" from group.json.
std::string group_note(const GroupInfo& info) {
  if (info.problem) return "  (group.json unreadable: " + info.problem.message() + ")";
  if (!info.manifest) return {};
  const store::GroupManifest& g = *info.manifest;
  std::string note = "  (group: " + std::to_string(g.size) + (g.size == 1 ? " run, " : " runs, ") + g.mode + " " +
                     g.scope + ", " + g.state;
  if (g.start_time && g.end_time) note += ", " + format_duration(*g.end_time - *g.start_time);
  if (!g.exit_codes.empty()) note += ", exit codes: " + exit_codes_cell(g.exit_codes);
  return note + ")";
}

/// A group as ls lists it: group.json and its runs, or the runs directly
/// under a project, by start time.
GroupInfo read_listing(const RunGroup& g) {
  if (!g.dir.empty()) return read_group(g.dir);
  GroupInfo info;
  for (const std::string& d : g.run_dirs) info.members.push_back({{}, std::nullopt, read_run(d)});
  std::stable_sort(info.members.begin(), info.members.end(), [](const GroupMemberView& a, const GroupMemberView& b) {
    return a.run->start_time.value_or(0) < b.run->start_time.value_or(0);
  });
  return info;
}

/// When a group started: group.json's start, else its first member's; none
/// where no run says.
std::optional<double> started(const GroupInfo& info) {
  if (info.manifest && info.manifest->start_time) return *info.manifest->start_time;
  std::optional<double> first;
  for (const GroupMemberView& v : info.members) {
    const std::optional<double> t = v.run ? v.run->start_time : v.member ? v.member->start_time : std::nullopt;
    if (t && (!first || *t < *first)) first = t;
  }
  return first;
}

/// Appends a group's heading (with what its group.json says) and its runs as
/// a table to `out`; each run whose host is lost to `lost`, and each whose
/// files a crash cut short after its end to `cut` (for notes).
void print_runs(const RunGroup& g, const GroupInfo& info, std::string& out, std::vector<const RunInfo*>& lost,
                std::vector<const RunInfo*>& cut) {
  out += g.project;
  if (!g.group.empty()) out += " / " + g.group;
  out += group_note(info);
  out += '\n';
  const store::GroupManifest* manifest = info.manifest ? &*info.manifest : nullptr;
  bool codes = false;
  for (const GroupMemberView& v : info.members) codes = codes || !v.exit_codes(manifest).empty();
  Table t;
  std::vector<std::string> heading{"RUN", "STATE", "RANKS", "ROWS", "STARTED", "DURATION"};
  if (codes) heading.push_back("EXIT");
  heading.push_back("NAME");
  t.add(std::move(heading));
  std::string broken;
  std::size_t rows = 0;
  for (const GroupMemberView& v : info.members) {
    if (v.run && !v.run->readable()) {
      broken += "  " + v.run->id + "  unreadable: " + v.run->problem.message() + "\n";
      continue;
    }
    std::vector<std::string> row;
    if (v.run) {
      const RunInfo& r = *v.run;
      if (r.host_lost()) lost.push_back(&r);
      if (!r.liveness.cut.empty()) cut.push_back(&r);
      const auto d = r.duration();
      // run.json's row count is written at the end: while running it lags.
      const bool rows_known = r.rows && r.state != "running";
      row = {r.id, v.state(), ranks_cell(v), rows_known ? std::to_string(*r.rows) : "-",
             r.start_time ? format_time(*r.start_time) : "-", d ? format_duration(*d) : "-"};
    } else {
      // Known from group.json only: its run directory is on another machine, or it never started.
      const store::GroupMember& m = *v.member;
      const bool timed = m.start_time && m.end_time;
      row = {m.id.empty() ? "-" : m.id, m.state, ranks_cell(v), m.ended() ? std::to_string(m.rows) : "-",
             m.start_time ? format_time(*m.start_time) : "-", timed ? format_duration(*m.end_time - *m.start_time) : "-"};
    }
    if (codes) row.push_back(exit_codes_cell(v.exit_codes(manifest)));
    std::string name = v.run ? (v.run->name == v.run->id ? "" : v.run->name) : v.member->name;
    if (!v.run && v.member->state == "missing")
      name = "place " + std::to_string(v.member->index) + ": never registered";
    else if (!v.run)
      name += " (on " + (v.member->host.empty() ? std::string("another host") : v.member->host) + ", not here)";
    row.push_back(std::move(name));
    t.add(std::move(row));
    ++rows;
  }
  if (rows > 0) out += t.render("  ");
  out += broken;
}

/// Under the listing: `heading`, then each of `runs` (the first ten) with what `why` says of it.
template <class Why>
std::string note(const std::string& heading, const std::vector<const RunInfo*>& runs, Why why) {
  if (runs.empty()) return {};
  constexpr std::size_t listed = 10;
  std::string out = "\n" + heading + ":\n";
  for (std::size_t i = 0; i < runs.size() && i < listed; ++i) out += "  " + runs[i]->id + ": " + why(*runs[i]) + "\n";
  if (runs.size() > listed) out += "  ... and " + std::to_string(runs.size() - listed) + " more\n";
  return out;
}

} // namespace

int ls_main(std::span<char* const> words) {
  ArgCursor c(words);
  std::string dir;
  while (!c.done()) {
    if (c.flag({"-h", "--help"})) return print_help(ls_command);
    c.operand(dir, "directory");
    if (!c.error().empty()) return usage_error("ls", c.error());
  }
  if (dir.empty()) dir = default_runs_dir();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return failure("ls", "no run directory at " + dir + ": pass the directory the runs were written to, or set CHORUS_DIR");

  struct Listed {
    RunGroup group;
    GroupInfo info;
    std::optional<double> start;
  };
  std::vector<Listed> groups;
  std::size_t n = 0;
  for (RunGroup& g : find_runs(dir)) {
    n += g.run_dirs.size();
    GroupInfo info = read_listing(g);
    const auto start = started(info);
    groups.push_back({std::move(g), std::move(info), start});
  }
  // Projects by name; within one, groups by start time, the newest last as
  // runs are within a group (group names, random or a job id, say nothing of
  // when); groups no run dates come last.
  std::stable_sort(groups.begin(), groups.end(), [](const Listed& a, const Listed& b) {
    if (a.group.project != b.group.project) return a.group.project < b.group.project;
    if (a.start.has_value() != b.start.has_value()) return a.start.has_value();
    return a.start.value_or(0) < b.start.value_or(0);
  });
  std::string out = dir + ": " + std::to_string(n) + (n == 1 ? " run" : " runs") + "\n";
  std::vector<const RunInfo*> lost, cut;
  for (const Listed& g : groups) {
    out += '\n';
    print_runs(g.group, g.info, out, lost, cut);
  }
  out += note("crashed: run.json says running, but the run's host was lost; 'chorus recover RUN' rebuilds the run's "
              "files",
              lost, [](const RunInfo& r) { return r.liveness.why; });
  out += note("files cut short: a crash of the machine after the run's end left them shorter than its run.json "
              "records",
              cut, [](const RunInfo& r) { return r.liveness.cut; });
  std::fputs(out.c_str(), stdout);
  return exit_ok;
}

} // namespace chorus::cli
