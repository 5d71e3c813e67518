// `chorus show`: one run (or one group of runs) on one screen.
#include "cli/chart.hpp"
#include "cli/cli.hpp"
#include "cli/group_info.hpp"
#include "cli/json_lines.hpp"
#include "cli/run_info.hpp"
#include "cli/series.hpp"
#include "cli/system_section.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sys/ioctl.h>
#include <unistd.h>

namespace chorus::cli {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view help_text = R"(usage: chorus show [OPTIONS] RUN|GROUP

Shows a run: its identity, its ranks and their states, config, summary, what
its machines did, and a terminal chart per metric of its history (x = _step).
RUN is a run directory, or a run id (or the start of one) looked up under DIR.

Shows a group (the runs of one job: a run per rank or per node) with its
members side by side: the group's identity and state (from its group.json),
each member's state, host, node, global ranks, last step, rows and exit
codes, then the config keys whose values differ, the summaries, and the last
value of each metric every member logged, a column per member. GROUP is a
group directory, or a group's name looked up under DIR. A member whose run
directory is on another machine is shown from what it reported to the group.

What the machines did comes from system.jsonl (see CHORUS_SYSTEM_INTERVAL): a
row per node (CPU, memory, disk and network) and one per rank (its process's
CPU and memory and, where it has one, its GPU's use, memory, temperature and
power), with each rank's GPU use (else CPU use) over time where it fits.

With many metrics, the plain and reduced keys get charts and the per-rank
columns (key/rank-N) a one-line sparkline each. NaN and infinite values are
left out of the charts and counted. Histories of any length are read as a
stream and downsampled to the chart's width.

A run whose run.json says "running" but whose host no longer holds its
write-ahead log has crashed: show says so; 'chorus recover RUN' rebuilds it.

options:
  --dir DIR       where to look up a run id (default: $CHORUS_DIR, else
                  ./chorus-runs)
  --metric KEY    chart KEY and its per-rank columns only (repeatable)
  --charts N      charts at most; further keys get sparklines (default 12)
  --width W       columns to draw in (default: the terminal's, else 100)
  --height H      rows per chart (default 10)
  --ascii         ASCII instead of Unicode braille and block characters
  --no-history    skip history.jsonl (no charts, no sparklines of metrics; a
                  group's final values come from its members' summaries)
  --no-system     skip system.jsonl (the nodes' and ranks' CPU, memory, GPU)
  -h, --help      this text

exit codes: 0 shown, 1 the run cannot be found or read, 2 a wrong command line.
)";

struct ShowArgs {
  std::string run, dir;
  std::vector<std::string> metrics;
  int charts = 12, width = 0, height = 10;
  bool ascii = false, history = true, system = true;
};

int terminal_width() {
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"))
    if (auto n = parse_int(c, 20, 10000)) return static_cast<int>(*n);
  return 100;
}

std::string parse(std::span<char* const> words, ShowArgs& a, bool& help) {
  ArgCursor c(words);
  std::string v;
  while (!c.done() && c.error().empty()) {
    if (c.flag({"-h", "--help"})) {
      help = true;
      return {};
    }
    if (c.option({"--dir"}, v)) {
      a.dir = v;
    } else if (c.option({"--metric"}, v)) {
      a.metrics.push_back(v);
    } else if (c.option({"--charts"}, v)) {
      c.integer("--charts", v, 0, 100000, a.charts);
    } else if (c.option({"--width"}, v)) {
      c.integer("--width", v, 30, 10000, a.width);
    } else if (c.option({"--height"}, v)) {
      c.integer("--height", v, 2, 1000, a.height);
    } else if (c.flag({"--ascii"})) {
      a.ascii = true;
    } else if (c.flag({"--no-history"})) {
      a.history = false;
    } else if (c.flag({"--no-system"})) {
      a.system = false;
    } else if (c.peek().starts_with("-")) {
      c.fail("unknown option '" + std::string(c.peek()) + "'");
    } else if (!a.run.empty()) {
      c.fail("one run at a time, not '" + a.run + "' and '" + std::string(c.peek()) + "'");
    } else {
      a.run = c.peek();
      c.next();
    }
  }
  if (!c.error().empty()) return c.error();
  if (a.run.empty()) return "missing RUN: a run directory or a run id";
  return {};
}

// A config.json or summary.json, one "key = value" line per member.
std::string json_section(const std::string& title, const std::string& path, int width, std::size_t limit) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return {};
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::object obj;
  if (std::string problem = load_json_file(path, parser, doc); !problem.empty())
    return title + "\n  unreadable: " + problem + "\n\n";
  if (doc.get(obj) != simdjson::SUCCESS) return title + "\n  unreadable: " + path + " is not a JSON object\n\n";
  Table t;
  std::size_t n = 0, shown = 0;
  for (auto [key, value] : obj) {
    if (++n > limit) continue;
    ++shown;
    std::string_view s;
    t.add({std::string(key), "= " + (value.get(s) == simdjson::SUCCESS ? std::string(s) : simdjson::minify(value))});
  }
  if (n == 0) return {};
  std::string out = title + "\n";
  for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
  if (n > shown) out += "  ... and " + std::to_string(n - shown) + " more in " + path + "\n";
  return out + "\n";
}

std::string identity(const RunInfo& r) {
  Table t;
  auto row = [&](std::string k, std::string v) {
    if (!v.empty()) t.add({std::move(k), std::move(v)});
  };
  row("id", r.id);
  row("name", r.name == r.id ? "" : r.name);
  row("project", r.project);
  row("group", r.group);
  row("job type", r.job_type);
  row("notes", r.notes);
  row("mode", r.mode + (r.scope.empty() ? "" : ", scope " + r.scope));
  std::string host = r.host;
  if (r.pid > 0) host += " (pid " + std::to_string(r.pid) + ")";
  row("host", host);
  if (!r.launcher.empty() && r.launcher != "none") row("launcher", r.launcher + (r.job_id.empty() ? "" : ", job " + r.job_id));
  row("dir", r.dir);
  row("started", r.start_time ? format_time(*r.start_time) : "");
  row("ended", r.end_time ? format_time(*r.end_time) : "");
  if (auto d = r.duration()) row("duration", format_duration(*d));
  std::string state = r.state;
  if (r.state == "running" && r.host_life == HostLife::unknown)
    state += " (its host, " + (r.host.empty() ? std::string("unknown") : r.host) + ", cannot be checked from here)";
  if (r.host_crashed()) state += ", but its host is gone: it CRASHED";
  row("state", state);
  // A resumed run: when each job that ran it started and stopped, and how it ended.
  if (r.segments.size() > 1)
    for (std::size_t i = 0; i < r.segments.size(); ++i) {
      const RunInfo::Segment& g = r.segments[i];
      row("attempt " + std::to_string(i + 1), (g.start_time ? format_time(*g.start_time) : "?") + " - " +
                                                  (g.end_time ? format_time(*g.end_time) : "...") + ", " + g.state);
    }
  // run.json's row count is written at the end: while running it lags (the history section counts).
  std::string rows = r.rows && r.state != "running" ? std::to_string(*r.rows) : "";
  if (r.rejected && *r.rejected > 0) rows += " (" + std::to_string(*r.rejected) + " values rejected: see rejected.jsonl)";
  row("rows", rows);
  std::string out = "run " + r.id + "\n" + t.render("  ");
  if (r.host_crashed())
    out += "\n  No process holds this run's write-ahead log (" + r.dir + "/wal), so the host that\n"
           "  wrote it died; its files may lack the last rows and the final states.\n"
           "  Rebuild them from the log with:  chorus recover " + r.dir + "\n";
  return out + "\n";
}

std::string ranks_section(const RunInfo& r, int width) {
  if (r.ranks.empty()) return {};
  Table t;
  t.add({"RANK", "STATE", "LAST STEP", "HOST", "MESSAGE"});
  for (const RankInfo& k : r.ranks)
    t.add({std::to_string(k.rank), k.state, k.last_step < 0 ? "-" : std::to_string(k.last_step), k.host, k.message});
  std::string out = "ranks (" + std::to_string(r.ranks.size()) + ")\n";
  for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
  if (!r.exit_codes.empty()) {
    // Keyed by global rank: in a node-scope or per-rank run these are not the RANK column's numbers.
    std::string codes = "  exit codes (chorus launch, by global rank):";
    for (const auto& [rank, code] : r.exit_codes) {
      codes += " " + std::to_string(rank) + "=" + std::to_string(code);
      if (code > 128) codes += " (signal " + std::to_string(code - 128) + ")";
    }
    out += clip(codes, width) + "\n";
  }
  return out + "\n";
}

std::string history_section(const RunInfo& r, const ShowArgs& a, int width) {
  const std::string path = r.dir + "/history.jsonl";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return "history\n  no history.jsonl\n";
  std::function<bool(std::string_view)> wanted;
  if (!a.metrics.empty())
    wanted = [&](std::string_view key) {
      for (const std::string& m : a.metrics)
        if (key == m || (key.starts_with(m) && key.substr(m.size()).starts_with("/rank-"))) return true;
      return false;
    };
  const History h = read_history(path, wanted);
  if (!h.problem.empty()) return "history\n  unreadable: " + h.problem + "\n";
  std::string out = "history (" + std::to_string(h.rows) + (h.rows == 1 ? " row, " : " rows, ") +
                    std::to_string(h.series.size()) + (h.series.size() == 1 ? " key" : " keys") + ")\n";
  if (h.bad_lines > 0)
    out += "  " + std::to_string(h.bad_lines) + " unreadable lines skipped (first: " + h.first_bad + ")\n";
  if (h.series.empty()) {
    out += a.metrics.empty() ? "  nothing logged\n" : "  no such key: see the keys with 'chorus show RUN'\n";
    return out;
  }
  // Charts for the plain and reduced keys first; per-rank columns and what
  // does not fit get a sparkline.
  std::vector<const Series*> charted, sparked;
  const bool all = !a.metrics.empty() || h.series.size() <= static_cast<std::size_t>(a.charts);
  for (const Series& s : h.series)
    (charted.size() < static_cast<std::size_t>(a.charts) && (all || !s.per_rank()) ? charted : sparked).push_back(&s);
  const ChartStyle style{width, a.height, a.ascii};
  for (const Series* s : charted) out += "\n" + render_chart(*s, style);
  if (!sparked.empty()) {
    std::size_t kw = 0;
    for (const Series* s : sparked) kw = std::max(kw, display_width(s->key()));
    kw = std::min<std::size_t>(kw, 40);
    const int spark_w = std::clamp(width / 3, 10, 60);
    out += "\n";
    for (const Series* s : sparked) {
      std::string k = clip(s->key(), static_cast<int>(kw));
      k.append(kw - display_width(k), ' ');
      std::string line = "  " + k + "  " + render_sparkline(*s, spark_w, a.ascii);
      if (s->points() > 0)
        line += "  min " + format_number(s->min()) + "  max " + format_number(s->max()) + "  last " +
                format_number(s->last());
      line += "  (" + std::to_string(s->points()) + " pts";
      if (s->nans() > 0) line += ", " + std::to_string(s->nans()) + " NaN";
      if (s->infs() > 0) line += ", " + std::to_string(s->infs()) + " inf";
      line += ")";
      out += clip(line, width) + "\n";
    }
  }
  return out;
}

int show_group(const std::string& dir, const ShowArgs& a) {
  std::fputs(render_group(read_group(dir), a.width > 0 ? a.width : terminal_width(), a.history).c_str(), stdout);
  return exit_ok;
}

/// A name under `root` that is a group's and no run's (exactly): the group's directory.
std::string group_named(const std::string& name, const std::string& root, std::string& problem) {
  if (name.find('/') != std::string::npos) return {};
  const std::vector<std::string> groups = find_group_by_name(root, name);
  if (groups.empty()) return {};
  for (const std::string& d : find_run_by_id(root, name))
    if (fs::path(d).filename() == name) return {};
  if (groups.size() == 1) return groups.front();
  problem = "'" + name + "' names " + std::to_string(groups.size()) + " groups; pass one's directory:";
  for (const std::string& g : groups) problem += "\n  " + g;
  return {};
}

} // namespace

int show_main(std::span<char* const> words) {
  ShowArgs a;
  bool help = false;
  if (std::string problem = parse(words, a, help); !problem.empty()) return usage_error("show", problem);
  if (help) {
    std::fputs(help_text.data(), stdout);
    return exit_ok;
  }
  std::string dir;
  std::error_code ec;
  if (fs::is_regular_file(a.run, ec) && fs::path(a.run).filename() == "run.json") {
    dir = fs::path(a.run).parent_path().string();
  } else if (fs::is_directory(a.run, ec)) {
    if (!is_run_dir(a.run)) {
      if (is_group_dir(a.run)) return show_group(a.run, a);
      return failure("show", a.run + " is not a run directory (no run.json, no wal): pass a run's directory or id");
    }
    dir = a.run;
  } else {
    const std::string root = a.dir.empty() ? default_runs_dir() : a.dir;
    std::string problem;
    if (const std::string group = group_named(a.run, root, problem); !group.empty()) return show_group(group, a);
    if (!problem.empty()) return failure("show", problem);
    if (problem = locate_run(a.run, root, dir); !problem.empty()) return failure("show", problem);
  }
  const RunInfo r = read_run(dir);
  const int width = a.width > 0 ? a.width : terminal_width();
  if (!r.readable()) {
    std::string msg = "cannot read the run at " + dir + ": " + r.problem;
    if (fs::exists(dir + "/wal", ec) && msg.find("recover") == std::string::npos)
      msg += ". If its host crashed, 'chorus recover " + dir + "' rebuilds its files from the WAL";
    return failure("show", msg);
  }
  std::string out = identity(r) + ranks_section(r, width) + json_section("config", dir + "/config.json", width, 100) +
                    json_section("summary", dir + "/summary.json", width, 60);
  if (a.system) out += system_section(r, width, a.ascii);
  if (a.history) out += history_section(r, a, width);
  std::fputs(out.c_str(), stdout);
  return exit_ok;
}

} // namespace chorus::cli
