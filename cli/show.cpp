// `chorus show`: one run (or one group of runs) on one screen.
#include "cli/chart.hpp"
#include "cli/cli.hpp"
#include "cli/group_info.hpp"
#include "cli/histogram_section.hpp"
#include "cli/locate.hpp"
#include "cli/media_section.hpp"
#include "cli/run_info.hpp"
#include "cli/series.hpp"
#include "cli/system_section.hpp"
#include "io/store/barrier_log.hpp"
#include "io/store/history_row.hpp"
#include "io/store/json_lines.hpp"
#include "io/store/metric_specs.hpp"
#include "runtime/core/strings.hpp"

#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace chorus::cli {
namespace fs = std::filesystem;
int show_main(std::span<char* const> args); // below

const Command show_command{
    .name = "show",
    .summary = "a run's identity, ranks, config, summary and a chart per metric; a group's runs side by side",
    .usage = "[OPTIONS] RUN|GROUP\n[OPTIONS] RUN RUN...",
    .help = R"(Shows a run: its identity, its ranks and their states (a running rank's last
step is the run's last committed row) and how long each waited at barriers
(barriers.jsonl), config, summary (with the last row's
step, time and runtime on one line; a value declared as the key's min, max
or mean over the run, by define_metric, says which), what its machines did,
and a terminal chart per metric of its history (x = _step, or the time into
the run; a key declared with a step metric says which, as `chorus serve`
charts it against that metric). RUN is a run directory, or a run id (or the
start of one) looked up under DIR.

Shows several runs (up to 8) over each other: a row per run, marked with the
character its curves are drawn with, then a chart per metric holding a curve
per run and a legend naming the runs (where curves meet, the later run's
marker shows).

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

A run that logged histograms (histograms.jsonl) gets a line per histogram
column (its key, or key/rank-N for a rank's own): its steps, the last step's
count (and of it the NaN and infinite values), min, median and max, and
sparklines of its median and of its 5th to 95th percentile spread over the
steps. --metric picks histogram columns as it picks keys.

A run that logged images, text or tables (media.jsonl) gets a line per media
column (key/rank-N where several ranks logged the key): its kind, how many
files over which steps, their size, and the path of its last file under the
run directory.

With many metrics, the plain and reduced keys get charts and the per-rank
columns (key/rank-N) a one-line sparkline each. NaN and infinite values are
left out of the charts and counted. Histories of any length are read as a
stream and downsampled to the chart's width.

Each rank is shown with its state, last step, host and message (why it
failed, crashed or was killed); a run of many ranks puts alike neighbours
(same state, step and message) on one row. Where two ranks or more joined,
a line says how far apart they joined (when the run host accepted each, from
the run's start) and which ranks never did. A run whose run.json says
"running" but whose host is gone (its lease expired or, on the host's own
machine, nobody holds its write-ahead log) has crashed: show says so, with
its last committed step and why; 'chorus recover RUN' rebuilds its files.

options:
  --dir DIR       where to look up a run id (default: $CHORUS_DIR, else
                  ./chorus-runs)
  --metric PATTERN
                  chart only the keys PATTERN takes (repeatable): a key and
                  its per-rank columns (loss), a glob (train/*), or /REGEX/
  --smooth W      smooth each curve as TensorBoard does (a debiased moving
                  average; W from 0, none, to below 1, e.g. 0.6)
  --x step|time   the x axis: the rows' _step (default), or the time into
                  the run (their _runtime)
  -f, --follow    redraw as the run grows (about once a second, when its
                  files change) until it ends; Ctrl-C stops
  --charts N      charts at most; further keys get sparklines (default 12)
  --width W       columns to draw in (default: the terminal's, else 100)
  --height H      rows per chart (default 10)
  --ascii         ASCII instead of Unicode braille and block characters
  --no-history    skip history.jsonl (no charts, no sparklines of metrics; a
                  group's final values come from its members' summaries)
  --no-system     skip system.jsonl (the nodes' and ranks' CPU, memory, GPU)
  -h, --help      this text

exit codes: 0 shown, 1 the run cannot be found or read, 2 a wrong command line.
)",
    .main = show_main,
};

namespace {

struct ShowArgs {
  std::vector<std::string> runs;
  std::string dir;
  std::vector<std::string> metrics;
  KeyFilter wanted; // from metrics
  HistoryShape shape;
  int charts = 12, width = 0, height = 10;
  bool ascii = false, history = true, system = true, follow = false;
};

int terminal_width() {
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"))
    if (auto n = parse_int(c, 20, 10000)) return static_cast<int>(*n);
  return 100;
}

Error parse(std::span<char* const> words, ShowArgs& a, bool& help) {
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
    } else if (c.option({"--smooth"}, v)) {
      c.smoothing(v, a.shape.smooth);
    } else if (c.option({"--x"}, v)) {
      if (v == "step") a.shape.x = XAxis::step;
      else if (v == "time") a.shape.x = XAxis::time;
      else c.fail("--x takes step (the rows' _step) or time (the time into the run), not '" + v + "'");
    } else if (c.flag({"--follow", "-f"})) {
      a.follow = true;
    } else if (c.flag({"--ascii"})) {
      a.ascii = true;
    } else if (c.flag({"--no-history"})) {
      a.history = false;
    } else if (c.flag({"--no-system"})) {
      a.system = false;
    } else if (c.peek().starts_with("-")) {
      c.fail("unknown option '" + std::string(c.peek()) + "'");
    } else {
      a.runs.emplace_back(c.peek());
      c.next();
    }
  }
  if (!c.error().empty()) return invalid(c.error());
  Result<KeyFilter> wanted = metric_filter(a.metrics);
  if (!wanted) return wanted.error();
  a.wanted = std::move(*wanted);
  if (a.runs.empty()) return invalid("missing RUN: a run directory or a run id");
  if (a.follow && a.runs.size() > 1) return invalid("--follow follows one run: name one");
  if (a.runs.size() > max_overlay)
    return invalid(std::to_string(a.runs.size()) + " runs: one chart tells at most " + std::to_string(max_overlay) +
           " apart (a marker each); give fewer");
  return {};
}

// What summary.json keeps of the last row (_step, _runtime, _timestamp, as
// W&B's summary does) is not something the user logged: one line of it, in
// words, rather than three raw keys among theirs, read as the row's own
// (store::HistoryRow). "" where none is there.
std::string last_row(simdjson::dom::object obj) {
  const store::HistoryRow row(obj);
  std::string out;
  if (row) out += "step " + std::to_string(row.step());
  if (const std::optional<double> at = row.timestamp()) out += (out.empty() ? "" : ", ") + format_time(*at);
  if (const std::optional<double> runtime = row.runtime())
    out += (out.empty() ? "" : ", ") + format_duration(*runtime) + " into the run";
  return out.empty() ? out : "  last row: " + out;
}

/// The declaration of `key` in metrics.json (`specs`, where it could be
/// read), a per-rank column taking its key's; null where it has none.
const store::MetricSpec* declaration(const Result<store::MetricSpecs>& specs, std::string_view key) {
  return specs ? specs->find(base_key(key)) : nullptr;
}

/// What a chart of `key` says of its x where it is declared with a step metric.
std::string step_metric_note(const store::MetricSpec* d) {
  if (!d || d->step_metric.empty() || d->step_metric == "_step") return {};
  std::string note = "x: ";
  note.append(d->step_metric).append(" (its step metric: drawn against _step here, against ");
  return note.append(d->step_metric).append(" by chorus serve)");
}

// A config.json or summary.json, one "key = value" line per member; a
// summary's bookkeeping keys make one line of their own, and a value declared
// as the key's min, max or mean (`specs`) says which.
std::string json_section(const std::string& title, const std::string& path, int width, std::size_t limit,
                         bool summary = false, const Result<store::MetricSpecs>* specs = nullptr) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return {};
  simdjson::dom::parser parser;
  simdjson::dom::object obj;
  const Result<simdjson::dom::element> doc = store::load_json_file(path, parser);
  if (!doc) return title + "\n  unreadable: " + doc.error().message() + "\n\n";
  if (doc->get(obj) != simdjson::SUCCESS) return title + "\n  unreadable: " + path + " is not a JSON object\n\n";
  Table t;
  std::size_t n = 0, shown = 0;
  for (auto [key, value] : obj) {
    if (summary && store::row_field(key)) continue;
    if (++n > limit) continue;
    ++shown;
    std::string_view s;
    std::string cell = "= " + (value.get(s) == simdjson::SUCCESS ? std::string(s) : simdjson::minify(value));
    if (const store::MetricSpec* d = specs ? declaration(*specs, key) : nullptr; d && d->summary != Summary::last)
      cell.append(" (").append(to_string(d->summary)).append(")");
    t.add({std::string(key), std::move(cell)});
  }
  const std::string row = summary ? last_row(obj) : std::string();
  if (n == 0 && row.empty()) return {};
  std::string out = title + "\n";
  if (!row.empty()) out += clip(row, width) + "\n";
  for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
  if (n > shown) out += "  ... and " + std::to_string(n - shown) + " more in " + path + "\n";
  return out + "\n";
}

/// How the ranks' joins spread (run.json's ranks' "joined": when the run
/// host accepted each, in the last attempt), where two ranks or more have
/// one: "64 ranks within 0.41 s of each other (first rank 3 at +0.02 s, last
/// rank 17 at +0.43 s after the run started); 1 never joined: rank 5". ""
/// where fewer joined.
std::string join_spread(const RunInfo& r) {
  // Beyond this, a world size is not believed (a damaged file): only the ranks listed count.
  constexpr std::int64_t max_world = std::int64_t{1} << 20;
  const std::int64_t world = r.world_size && *r.world_size > 0 && *r.world_size <= max_world ? *r.world_size : 0;
  std::vector<bool> listed(static_cast<std::size_t>(world), false);
  std::vector<int> absent;
  const RankInfo* first = nullptr;
  const RankInfo* last = nullptr;
  std::size_t joined = 0;
  for (const RankInfo& k : r.ranks) { // in rank order: ties name the lowest rank first, the highest last
    if (k.rank >= 0 && k.rank < world) listed[static_cast<std::size_t>(k.rank)] = true;
    if (!k.joined || !std::isfinite(*k.joined)) {
      if (k.rank >= 0 && k.rank <= INT_MAX) absent.push_back(static_cast<int>(k.rank));
      continue;
    }
    ++joined;
    if (!first || *k.joined < *first->joined) first = &k;
    if (!last || *k.joined >= *last->joined) last = &k;
  }
  if (joined < 2) return {};
  // Ranks run.json does not list yet have not joined either.
  for (std::int64_t i = 0; i < world; ++i)
    if (!listed[static_cast<std::size_t>(i)]) absent.push_back(static_cast<int>(i));
  std::sort(absent.begin(), absent.end());
  absent.erase(std::unique(absent.begin(), absent.end()), absent.end());
  // The joins are the last attempt's: a resumed run's offsets are from its start.
  std::optional<double> start = r.start_time;
  std::string since = "the run started";
  if (r.segments.size() > 1) {
    start = r.segments.back().start_time;
    since = "attempt " + std::to_string(r.segments.size()) + " started";
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu ranks within %.2f s of each other", joined, *last->joined - *first->joined);
  std::string out = buf;
  if (start && std::isfinite(*start))
    std::snprintf(buf, sizeof buf, " (first rank %lld at %+.2f s, last rank %lld at %+.2f s after %s)",
                  static_cast<long long>(first->rank), *first->joined - *start, static_cast<long long>(last->rank),
                  *last->joined - *start, since.c_str());
  else
    std::snprintf(buf, sizeof buf, " (first rank %lld, last rank %lld)", static_cast<long long>(first->rank),
                  static_cast<long long>(last->rank));
  out += buf;
  if (!absent.empty())
    out.append("; ")
        .append(std::to_string(absent.size()))
        .append(r.reported_state() == "running" ? " not joined yet: " : " never joined: ")
        .append(chorus::core::rank_list(absent));
  return out;
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
  row("joined", join_spread(r));
  std::string state = r.reported_state();
  if (r.state == "running" && r.liveness.life == store::HostLife::unknown) {
    state += " (its host, " + (r.host.empty() ? std::string("unknown") : r.host) + ", cannot be checked from here";
    state += r.liveness.why.empty() ? ": it renews no lease)" : ": " + r.liveness.why + ")";
  }
  if (r.host_lost()) state += " (run.json says running, but its host was lost)";
  row("state", state);
  if (r.error) row("error", *r.error);
  // run.json's own error kept: why the host is known to be gone, beside it.
  if (r.host_lost() && (!r.error || r.error->find(r.liveness.why) == std::string::npos))
    row("host lost", r.liveness.why + "; `chorus recover " + r.dir + "` rebuilds the run's files");
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
  return "run " + r.id + "\n" + t.render("  ") + "\n";
}

// Past this many ranks, neighbours alike (state, last step, message) share a
// row, and at most rank_rows_shown rows are shown.
constexpr std::size_t ranks_one_a_row = 32;
constexpr std::size_t rank_rows_shown = 40;

/// The RANK, STATE, LAST STEP, HOST and MESSAGE rows of `ranks`.
std::vector<std::vector<std::string>> rank_rows(const std::vector<RankInfo>& ranks) {
  std::vector<std::vector<std::string>> rows;
  const auto step = [](std::int64_t s) { return s < 0 ? std::string("-") : std::to_string(s); };
  if (ranks.size() <= ranks_one_a_row) {
    for (const RankInfo& k : ranks) rows.push_back({std::to_string(k.rank), k.state, step(k.last_step), k.host, k.message});
    return rows;
  }
  for (std::size_t i = 0; i < ranks.size();) {
    const RankInfo& first = ranks[i];
    std::size_t j = i + 1;
    bool one_host = true;
    for (; j < ranks.size(); ++j) {
      const RankInfo& k = ranks[j];
      if (k.rank != ranks[j - 1].rank + 1 || k.state != first.state || k.last_step != first.last_step ||
          k.message != first.message)
        break;
      one_host = one_host && k.host == first.host;
    }
    std::string host = first.host;
    if (!one_host) {
      std::vector<std::string> hosts;
      for (std::size_t h = i; h < j; ++h) hosts.push_back(ranks[h].host);
      std::sort(hosts.begin(), hosts.end());
      host = std::to_string(std::unique(hosts.begin(), hosts.end()) - hosts.begin()) + " hosts";
    }
    const std::string label = j - i == 1 ? std::to_string(first.rank)
                                         : std::to_string(first.rank) + "-" + std::to_string(ranks[j - 1].rank);
    rows.push_back({label, first.state, step(first.last_step), host, first.message});
    i = j;
  }
  return rows;
}

std::string ranks_section(const RunInfo& r, int width) {
  if (r.ranks.empty()) return {};
  Table t;
  t.add({"RANK", "STATE", "LAST STEP", "HOST", "MESSAGE"});
  bool committed = false;
  std::map<std::string, std::size_t> states;
  for (const RankInfo& k : r.ranks) {
    committed = committed || k.committed;
    ++states[k.state];
  }
  const std::vector<std::vector<std::string>> rows = rank_rows(r.ranks);
  for (std::size_t i = 0; i < rows.size() && i < rank_rows_shown; ++i) t.add(rows[i]);
  std::string out = "ranks (" + std::to_string(r.ranks.size());
  if (r.ranks.size() > ranks_one_a_row) {
    // Many ranks: how many are in each state, before the rows that sum them up.
    std::string counts;
    for (const auto& [state, n] : states) counts.append(counts.empty() ? ": " : ", ").append(std::to_string(n) + " " + state);
    out += counts;
  }
  out += ")\n";
  for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
  if (rows.size() > rank_rows_shown)
    out += clip("  ... and " + std::to_string(rows.size() - rank_rows_shown) + " more rows: every rank is in " + r.dir +
                    "/run.json",
                width) + "\n";
  if (committed)
    out += clip("  a running rank's last step is the run's last committed row (a rank may be ahead of it)", width) +
           "\n";
  if (!r.exit_codes.empty()) {
    // Keyed by global rank: in a node-scope or per-rank run these are not the RANK column's numbers.
    std::string codes = "  exit codes (chorus launch, by global rank):";
    for (const auto& [rank, code] : r.exit_codes) {
      codes += " " + std::to_string(rank) + "=" + std::to_string(code);
      if (code > 128) codes += " (signal " + std::to_string(code - 128) + ")";
    }
    out += clip(codes, width) + "\n";
  }
  // Barriers (barriers.jsonl): how many, each rank's waits, and whom the others waited for.
  const store::BarrierSummary b = store::BarrierLog::read(r.dir);
  if (!b.missing) {
    char buf[96];
    std::string line = "  barriers: " + std::to_string(b.total) + " released";
    if (b.failed > 0) line += ", " + std::to_string(b.failed) + " with an error";
    line += "; waited in all:";
    const store::BarrierSummary::Rank* most = nullptr;
    for (const store::BarrierSummary::Rank& k : b.ranks) {
      if (k.barriers == 0) continue;
      std::snprintf(buf, sizeof buf, " rank %d %.3f s", k.rank, k.waited_s);
      line += buf;
      if (k.caused_s > 0 && (!most || k.caused_s > most->caused_s)) most = &k;
    }
    if (most) {
      std::snprintf(buf, sizeof buf, "; the others waited longest for rank %d (%.3f s)", most->rank, most->caused_s);
      line += buf;
    }
    out += clip(line, width) + "\n";
    if (b.skipped > 0)
      out += clip("  barriers.jsonl: " + std::to_string(b.skipped) + " damaged line(s) skipped (" + b.first_skipped + ")",
                  width) + "\n";
    if (b.problem) out += clip("  barriers.jsonl: " + b.problem.message(), width) + "\n";
  }
  return out + "\n";
}

std::string history_section(const RunInfo& r, const ShowArgs& a, int width, const Result<store::MetricSpecs>& specs) {
  const std::string path = r.dir + "/history.jsonl";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return "history\n  no history.jsonl\n";
  const History h = read_history(path, a.wanted, a.shape);
  if (h.problem) return "history\n  unreadable: " + h.problem.message() + "\n";
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
  std::vector<std::string_view> keys;
  for (const Series& s : h.series) keys.push_back(s.key());
  const std::vector<bool> chart = chart_choice(keys, static_cast<std::size_t>(a.charts), !a.metrics.empty());
  std::vector<const Series*> charted, sparked;
  for (std::size_t i = 0; i < h.series.size(); ++i) (chart[i] ? charted : sparked).push_back(&h.series[i]);
  const ChartStyle style{width, a.height, a.ascii};
  for (const Series* s : charted) out += "\n" + render_chart(*s, style, step_metric_note(declaration(specs, s->key())));
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

/// The run at `dir`, or why it cannot be shown.
Result<RunInfo> read_readable(const std::string& dir) {
  RunInfo r = read_run(dir);
  if (r.readable()) return r;
  std::string msg = "cannot read the run at " + dir + ": " + r.problem.message();
  std::error_code ec;
  if (fs::exists(dir + "/wal", ec) && msg.find("recover") == std::string::npos)
    msg += ". If its host crashed, 'chorus recover " + dir + "' rebuilds its files from the WAL";
  return Error(r.problem.code(), std::move(msg));
}

/// How a run is named in an overlay's legend: its name and id, or its id.
std::string run_label(const RunInfo& r) { return r.name.empty() || r.name == r.id ? r.id : r.name + " (" + r.id + ")"; }

/// Several runs over each other: a row per run, then a chart per metric
/// with a series per run, told apart by their markers.
std::string overlay(const std::vector<RunInfo>& runs, const ShowArgs& a, int width) {
  Table t;
  t.add({"", "RUN", "STATE", "ROWS", "STARTED", "DURATION", "NAME"});
  std::vector<std::string> names;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunInfo& r = runs[i];
    const auto d = r.duration();
    t.add({std::string(1, overlay_marker(i)), r.id, r.shown_state(),
           r.rows && r.state != "running" ? std::to_string(*r.rows) : "-",
           r.start_time ? format_time(*r.start_time) : "-", d ? format_duration(*d) : "-", r.name == r.id ? "" : r.name});
    names.push_back(run_label(r));
  }
  std::string out = "runs (" + std::to_string(runs.size()) + ")\n";
  for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
  if (!a.history) return out;

  std::vector<History> histories;
  std::vector<std::string_view> keys; // every run's, in the order they first appear
  std::map<std::string_view, std::vector<const Series*>> by_key;
  out += "\nhistory\n";
  for (const RunInfo& r : runs) histories.push_back(read_history(r.dir + "/history.jsonl", a.wanted, a.shape));
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const History& h = histories[i];
    if (h.problem) out += clip("  " + runs[i].id + ": unreadable: " + h.problem.message(), width) + "\n";
    for (const Series& s : h.series) {
      auto [it, fresh] = by_key.try_emplace(s.key(), runs.size(), nullptr);
      if (fresh) keys.push_back(s.key());
      it->second[i] = &s;
    }
  }
  if (keys.empty())
    return out + (a.metrics.empty() ? "  nothing logged\n" : "  no such key: see the keys with 'chorus show RUN'\n");
  const std::vector<bool> chart = chart_choice(keys, static_cast<std::size_t>(a.charts), !a.metrics.empty());
  const ChartStyle style{width, a.height, a.ascii};
  std::vector<Result<store::MetricSpecs>> specs;
  for (const RunInfo& r : runs) specs.push_back(store::MetricSpecs::read(r.dir));
  // A step metric is said where every run declares the same one for the key.
  const auto note = [&](std::string_view key) {
    const std::string first = step_metric_note(declaration(specs.front(), key));
    for (const Result<store::MetricSpecs>& s : specs)
      if (step_metric_note(declaration(s, key)) != first) return std::string();
    return first;
  };
  std::string rest;
  for (std::size_t k = 0; k < keys.size(); ++k) {
    if (chart[k]) out += "\n" + render_overlay(std::string(keys[k]), by_key[keys[k]], names, style, note(keys[k]));
    else rest += (rest.empty() ? "" : ", ") + std::string(keys[k]);
  }
  if (!rest.empty()) out += "\n" + clip("  not charted: " + rest, width) + "\n  (chart a key with --metric KEY)\n";
  return out;
}

/// One run on one screen.
std::string render_run(const RunInfo& r, const ShowArgs& a, int width) {
  const Result<store::MetricSpecs> specs = store::MetricSpecs::read(r.dir);
  std::string out = identity(r) + ranks_section(r, width) +
                    json_section("config", r.dir + "/config.json", width, 100) +
                    json_section("summary", r.dir + "/summary.json", width, 60, true, &specs);
  if (!specs) out.append("metrics\n  unreadable: ").append(specs.error().message()).append("\n\n");
  if (a.system) out += system_section(r, width, a.ascii);
  if (a.history) out += history_section(r, a, width, specs);
  if (const std::string h = histogram_section(r, a.wanted, width, a.ascii); !h.empty()) out += "\n" + h;
  if (const std::string m = media_section(r, a.wanted, width); !m.empty()) out += "\n" + m;
  return out;
}

/// What show reads of a run, as the sizes and times of its files: a change
/// is a reason to draw it again.
std::string files_stamp(const std::string& dir) {
  std::string out;
  for (const char* f : {"run.json", "history.jsonl", "histograms.jsonl", "media.jsonl", "system.jsonl", "config.json", "summary.json",
                        "metrics.json"}) {
    struct stat st {};
    if (::stat((dir + "/" + f).c_str(), &st) != 0) {
      out += "-;";
      continue;
    }
    out.append(std::to_string(st.st_size)).append(":").append(std::to_string(st.st_mtim.tv_sec)).append(".");
    out.append(std::to_string(st.st_mtim.tv_nsec)).append(";");
  }
  return out;
}

volatile std::sig_atomic_t stop_following = 0;
extern "C" void on_stop_following(int) { stop_following = 1; }

/// --follow: the run drawn again whenever its files change (looked at ten
/// times a second, drawn at most once a second), until it is no longer
/// running (finished, failed, or its host gone) or Ctrl-C. A host that dies
/// changes no file: whether it lives is looked at once a second.
int follow(const std::string& dir, const ShowArgs& a) {
  std::signal(SIGINT, on_stop_following);
  std::signal(SIGTERM, on_stop_following);
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  std::string drawn;
  auto last_draw = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  auto last_look = last_draw;
  while (stop_following == 0) {
    const std::string stamp = files_stamp(dir);
    const auto now = std::chrono::steady_clock::now();
    bool changed = stamp != drawn;
    if (!changed && now - last_look >= std::chrono::seconds(1)) {
      last_look = now;
      changed = read_run(dir).host_lost();
    }
    if (changed && now - last_draw >= std::chrono::seconds(1)) {
      drawn = stamp;
      last_draw = std::chrono::steady_clock::now();
      Result<RunInfo> run = read_readable(dir);
      if (!run) return failure("show", run.error().message());
      const bool live = run->state == "running" && !run->host_lost();
      const int width = a.width > 0 ? a.width : terminal_width();
      // A terminal is cleared and drawn again; a pipe gets each frame after a blank line.
      std::string frame = tty ? "\x1b[H\x1b[2J" : "\n";
      frame += render_run(*run, a, width);
      if (live) frame += "\nfollowing " + run->id + ": drawn again as it grows; Ctrl-C stops\n";
      std::fputs(frame.c_str(), stdout);
      std::fflush(stdout);
      if (!live) return exit_ok;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return exit_ok;
}

} // namespace

int show_main(std::span<char* const> words) {
  ShowArgs a;
  if (std::optional<int> done = parse_words(show_command, words, a, &parse)) return *done;
  const int width = a.width > 0 ? a.width : terminal_width();
  std::vector<RunInfo> runs;
  for (const std::string& arg : a.runs) {
    const Result<Located> found = locate(arg, a.dir);
    if (!found) return failure("show", found.error().message());
    if (!found->group.empty()) {
      if (a.runs.size() == 1) return show_group(found->group, a);
      return failure("show", "'" + arg + "' is a group, not a run: show it alone (its runs side by side), or name "
                             "its runs to chart them over the others");
    }
    Result<RunInfo> run = read_readable(found->run);
    if (!run) return failure("show", run.error().message());
    runs.push_back(std::move(*run));
  }
  if (runs.size() > 1) {
    std::fputs(overlay(runs, a, width).c_str(), stdout);
    return exit_ok;
  }
  if (a.follow) return follow(runs.front().dir, a);
  std::fputs(render_run(runs.front(), a, width).c_str(), stdout);
  return exit_ok;
}

} // namespace chorus::cli
