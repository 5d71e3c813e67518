// `chorus ls`: every run under a run directory, by project and group.
#include "cli/cli.hpp"
#include "cli/run_info.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace chorus::cli {
namespace {

constexpr std::string_view help_text = R"(usage: chorus ls [DIR]

Lists the runs under DIR (default: $CHORUS_DIR, else ./chorus-runs), laid out
as DIR/PROJECT/GROUP/RUN-ID, grouped by project and group and ordered by start
time. For each run: its id, state, ranks (world size, and how many crashed),
history rows, start time, duration and name, from the run's run.json.

A run whose run.json is missing or broken is listed as "unreadable" with the
reason; the listing goes on. A run whose run.json says "running" but whose
host no longer holds its write-ahead log is shown as "crashed?": rebuild its
files with 'chorus recover RUN'.

options:
  -h, --help   this text

exit codes: 0 listed (even with unreadable runs), 1 DIR is not a directory,
2 a wrong command line.
)";

std::string ranks_cell(const RunInfo& r) {
  if (!r.world_size) return "-";
  std::string s = std::to_string(*r.world_size);
  if (const auto crashed = r.crashed_ranks(); crashed > 0) s += " (" + std::to_string(crashed) + " crashed)";
  return s;
}

} // namespace

bool print_runs(const RunGroup& g, std::string& out) {
  std::vector<RunInfo> runs;
  for (const std::string& d : g.run_dirs) runs.push_back(read_run(d));
  std::stable_sort(runs.begin(), runs.end(), [](const RunInfo& a, const RunInfo& b) {
    if (a.readable() != b.readable()) return a.readable();
    return a.start_time.value_or(0) < b.start_time.value_or(0);
  });
  out += g.project;
  if (!g.group.empty()) out += " / " + g.group;
  out += '\n';
  Table t;
  t.add({"RUN", "STATE", "RANKS", "ROWS", "STARTED", "DURATION", "NAME"});
  bool host_crashed = false;
  std::string broken;
  std::size_t broken_count = 0;
  for (const RunInfo& r : runs) {
    if (!r.readable()) {
      broken += "  " + r.id + "  unreadable: " + r.problem + "\n";
      ++broken_count;
      continue;
    }
    host_crashed = host_crashed || r.host_crashed();
    const auto d = r.duration();
    // run.json's row count is written at the end: while running it lags.
    const bool rows_known = r.rows && r.state != "running";
    t.add({r.id, r.shown_state(), ranks_cell(r), rows_known ? std::to_string(*r.rows) : "-",
           r.start_time ? format_time(*r.start_time) : "-", d ? format_duration(*d) : "-",
           r.name == r.id ? "" : r.name});
  }
  if (runs.size() > broken_count) out += t.render("  ");
  out += broken;
  return host_crashed;
}

int ls_main(std::span<char* const> words) {
  ArgCursor c(words);
  std::string dir;
  while (!c.done()) {
    if (c.flag({"-h", "--help"})) {
      std::fputs(help_text.data(), stdout);
      return exit_ok;
    }
    if (c.peek().starts_with("-") && c.peek() != "-") return usage_error("ls", "unknown option '" + std::string(c.peek()) + "'");
    if (!dir.empty()) return usage_error("ls", "one directory at a time, not '" + dir + "' and '" + std::string(c.peek()) + "'");
    dir = c.peek();
    c.next();
  }
  if (dir.empty()) dir = default_runs_dir();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return failure("ls", "no run directory at " + dir + ": pass the directory the runs were written to, or set CHORUS_DIR");

  const std::vector<RunGroup> groups = find_runs(dir);
  std::size_t n = 0;
  for (const RunGroup& g : groups) n += g.run_dirs.size();
  std::string out = dir + ": " + std::to_string(n) + (n == 1 ? " run" : " runs") + "\n";
  bool host_crashed = false;
  for (const RunGroup& g : groups) {
    out += '\n';
    host_crashed = print_runs(g, out) || host_crashed;
  }
  if (host_crashed)
    out += "\ncrashed?: run.json says running, but no process holds the run's write-ahead log: its host died.\n"
           "          'chorus recover RUN' rebuilds the run's files and marks it crashed.\n";
  std::fputs(out.c_str(), stdout);
  return exit_ok;
}

} // namespace chorus::cli
