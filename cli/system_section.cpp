#include "cli/system_section.hpp"

#include "cli/chart.hpp"
#include "cli/cli.hpp"
#include "cli/series.hpp"
#include "io/store/json_lines.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <vector>

namespace chorus::cli {
namespace {

constexpr double missing = std::numeric_limits<double>::quiet_NaN();

// One figure over the samples of one node or rank.
struct Stat {
  std::uint64_t n = 0;
  double sum = 0, min = 0, max = 0, last = 0;

  void add(double v) {
    min = n == 0 ? v : std::min(min, v);
    max = n == 0 ? v : std::max(max, v);
    sum += v;
    last = v;
    ++n;
  }
  [[nodiscard]] double mean() const { return sum / static_cast<double>(n); }
};

// A node or a rank: its figures by name ("cpu.percent", "gpu.power_w").
struct Source {
  std::uint64_t samples = 0;
  std::int64_t node = -1; // a rank's node, from _node
  std::map<std::string, Stat, std::less<>> stats;
  // A rank's use over time, one point per sample, for its sparkline.
  Series gpu{"gpu.utilization_percent"}, cpu{"proc.cpu.percent"};

  [[nodiscard]] const Stat* stat(std::string_view name) const {
    if (name.empty()) return nullptr;
    const auto it = stats.find(name);
    return it == stats.end() ? nullptr : &it->second;
  }
};

using Sources = std::map<std::int64_t, Source>; // by node or rank number

struct Machines {
  Sources nodes, ranks;
  double first_time = missing, last_time = missing; // _timestamp

  // Keys are "system.NAME/node-N" or "system.NAME/rank-N"; others are not ours.
  std::string_view take(const simdjson::dom::object& line) {
    std::int64_t node = -1;
    if (line["_node"].get(node) != simdjson::SUCCESS) node = -1;
    touched_.clear();
    for (auto [key, value] : line) {
      double v = 0;
      const auto slash = key.rfind('/');
      if (!key.starts_with("system.") || slash == std::string_view::npos || slash <= 7 ||
          value.get(v) != simdjson::SUCCESS)
        continue;
      const std::string_view name = key.substr(7, slash - 7), label = key.substr(slash + 1);
      Sources* of = label.starts_with("node-") ? &nodes : label.starts_with("rank-") ? &ranks : nullptr;
      const auto id = of ? parse_int(label.substr(5), 0, std::numeric_limits<int>::max()) : std::nullopt;
      if (!id) continue;
      Source& s = (*of)[*id];
      if (std::find(touched_.begin(), touched_.end(), &s) == touched_.end()) {
        touched_.push_back(&s);
        ++s.samples;
        if (of == &ranks && node >= 0) s.node = node;
      }
      auto it = s.stats.find(name);
      if (it == s.stats.end()) it = s.stats.emplace(std::string(name), Stat{}).first;
      it->second.add(v);
      const auto step = static_cast<std::int64_t>(s.samples) - 1;
      if (name == "gpu.utilization_percent") s.gpu.add(step, v);
      if (name == "proc.cpu.percent") s.cpu.add(step, v);
    }
    if (touched_.empty()) return "no system figures";
    double t = 0;
    if (line["_timestamp"].get(t) == simdjson::SUCCESS) {
      first_time = std::isnan(first_time) ? t : std::min(first_time, t);
      last_time = std::isnan(last_time) ? t : std::max(last_time, t);
    }
    return {};
  }

private:
  std::vector<Source*> touched_; // by the line being taken
};

enum class Form { max, mean_max, last_max, max_of_total, means };
enum class Unit { percent, bytes, rate, celsius, watts };

// A column shows one figure (`a`), or two side by side (`a` / `b`). Its
// heading takes two lines: `header` and what the form shows ("mean / max").
struct Column {
  std::string_view header, a, b;
  Form form;
  Unit unit;
};

constexpr std::string_view form_names[] = {"max", "mean / max", "last / max", "max / total", "mean"};

constexpr Column node_columns[] = {
    {"CPU %", "cpu.percent", "", Form::mean_max, Unit::percent},
    {"MEMORY", "memory.used_bytes", "memory.total_bytes", Form::max_of_total, Unit::bytes},
    {"DISK %", "disk.percent", "", Form::max, Unit::percent},
    {"DISK READ / WRITE", "disk.read_bytes_per_s", "disk.write_bytes_per_s", Form::means, Unit::rate},
    {"NET RX / TX", "network.rx_bytes_per_s", "network.tx_bytes_per_s", Form::means, Unit::rate},
};

constexpr Column rank_columns[] = {
    {"CPU %", "proc.cpu.percent", "", Form::mean_max, Unit::percent},
    {"RSS", "proc.memory.rss_bytes", "", Form::last_max, Unit::bytes},
    {"GPU %", "gpu.utilization_percent", "", Form::mean_max, Unit::percent},
    {"GPU MEMORY", "gpu.memory.used_bytes", "gpu.memory.total_bytes", Form::max_of_total, Unit::bytes},
    {"GPU TEMP", "gpu.temperature_c", "", Form::max, Unit::celsius},
    {"GPU POWER", "gpu.power_w", "", Form::mean_max, Unit::watts},
};

// Three figures at most in units of bytes ("12.3", "512"), whole numbers otherwise.
std::string fixed(double v, bool fraction) {
  if (std::isnan(v)) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", fraction && std::fabs(v) < 99.95 ? 1 : 0, v);
  return buf;
}

// "87", "61 °C", "1.2 GiB"; a pair shares the unit: "12.3 / 62.8 GiB", "1.5 / - MiB/s".
std::string figures(Unit unit, double x, std::optional<double> y = std::nullopt) {
  static constexpr const char* bytes[] = {" B", " KiB", " MiB", " GiB", " TiB", " PiB"};
  const char* suffix = unit == Unit::celsius ? " °C" : unit == Unit::watts ? " W" : "";
  double scale = 1;
  if (unit == Unit::bytes || unit == Unit::rate) {
    const double top = std::max(std::isnan(x) ? 0 : std::fabs(x), y && !std::isnan(*y) ? std::fabs(*y) : 0);
    std::size_t k = 0;
    for (; k + 1 < std::size(bytes) && top >= scale * 1024; ++k) scale *= 1024;
    suffix = bytes[k];
  }
  const bool fraction = scale > 1;
  std::string out = fixed(x / scale, fraction);
  if (y) out.append(" / ").append(fixed(*y / scale, fraction));
  out.append(suffix);
  if (unit == Unit::rate) out.append("/s");
  return out;
}

std::string cell(const Source& s, const Column& c) {
  const Stat* a = s.stat(c.a);
  const Stat* b = s.stat(c.b);
  if (a == nullptr && b == nullptr) return "-";
  switch (c.form) {
  case Form::max: return figures(c.unit, a->max);
  case Form::mean_max: return figures(c.unit, a->mean(), a->max);
  case Form::last_max: return figures(c.unit, a->last, a->max);
  case Form::max_of_total: return figures(c.unit, a ? a->max : missing, b ? b->max : missing);
  case Form::means: return figures(c.unit, a ? a->mean() : missing, b ? b->mean() : missing);
  }
  return "-";
}

// One row per node or rank, and only the columns some row has figures for.
std::vector<std::vector<std::string>> table_rows(const Sources& sources, std::string_view label,
                                                 std::span<const Column> columns) {
  const bool nodes_known = // ranks only
      std::any_of(sources.begin(), sources.end(), [](const auto& s) { return s.second.node >= 0; });
  std::vector<const Column*> shown;
  for (const Column& c : columns)
    if (std::any_of(sources.begin(), sources.end(),
                    [&](const auto& s) { return s.second.stat(c.a) || s.second.stat(c.b); }))
      shown.push_back(&c);
  std::vector<std::vector<std::string>> rows(2);
  rows[0] = {std::string(label)};
  if (nodes_known) rows[0].emplace_back("NODE");
  rows[0].emplace_back("SAMPLES");
  rows[1].resize(rows[0].size());
  for (const Column* c : shown) {
    rows[0].emplace_back(c->header);
    rows[1].emplace_back(form_names[static_cast<std::size_t>(c->form)]);
  }
  for (const auto& [id, s] : sources) {
    std::vector<std::string>& row = rows.emplace_back();
    row.push_back(std::to_string(id));
    if (nodes_known) row.push_back(s.node >= 0 ? std::to_string(s.node) : "-");
    row.push_back(std::to_string(s.samples));
    for (const Column* c : shown) row.push_back(cell(s, *c));
  }
  return rows;
}

std::string render(const std::vector<std::vector<std::string>>& rows) {
  Table t;
  for (const auto& row : rows) t.add(row);
  return t.render("  ");
}

std::size_t widest_line(const std::string& text) {
  std::size_t w = 0;
  for (const std::string& line : split_lines(text)) w = std::max(w, display_width(line));
  return w;
}

// Each rank's GPU use (its process's CPU use where it has no GPU figures), if the table leaves room.
void add_sparklines(std::vector<std::vector<std::string>>& rows, const Sources& ranks, int width, bool ascii) {
  constexpr int least = 8, most = 40;
  const int room = width - static_cast<int>(widest_line(render(rows))) - 2;
  std::uint64_t points = 0;
  bool gpu = false, cpu = false;
  for (const auto& [id, s] : ranks) {
    const Series& trend = s.gpu.points() > 0 ? s.gpu : s.cpu;
    points = std::max(points, trend.points());
    (s.gpu.points() > 0 ? gpu : cpu) = true;
  }
  if (room < least || points < 2) return;
  const int spark_w = static_cast<int>(std::min<std::uint64_t>({static_cast<std::uint64_t>(room), most, points}));
  rows[0].emplace_back(gpu ? "GPU % OVER TIME" : "CPU % OVER TIME");
  rows[1].emplace_back(gpu && cpu ? "(no GPU: CPU %)" : "");
  std::size_t i = 2;
  for (const auto& [id, s] : ranks) {
    const Series& trend = s.gpu.points() > 0 ? s.gpu : s.cpu;
    // Percentages on one scale for every rank, so that ranks compare at a glance.
    const double top = &trend == &s.gpu ? 100 : std::max(100.0, trend.max());
    const int w = static_cast<int>(std::min<std::uint64_t>(static_cast<std::uint64_t>(spark_w), trend.points()));
    rows[i++].push_back(trend.points() < 2 ? "-" : render_sparkline(trend, w, ascii, 0, top));
  }
}

// "2 lines skipped: 1 not JSON (first: line 5), 1 unfinished last line (a write cut short)".
std::string skipped_lines(const store::JsonLines& lines) {
  const std::uint64_t other = lines.skipped - lines.not_json, unfinished = lines.unfinished ? 1 : 0;
  const std::uint64_t total = lines.skipped + unfinished;
  if (total == 0) return {};
  const bool one_reason = (lines.not_json > 0) + (other > 0) + (unfinished > 0) == 1;
  std::string out = "  ";
  out.append(std::to_string(total)).append(total == 1 ? " line skipped:" : " lines skipped:");
  auto reason = [&](std::uint64_t n, std::string_view why) {
    if (n == 0) return;
    out.append(out.back() == ':' ? " " : ", ");
    if (!one_reason) out.append(std::to_string(n)).append(" ");
    out.append(why);
  };
  reason(lines.not_json, "not JSON");
  reason(other, "without system figures");
  if (lines.skipped > 0) out.append(" (first: line ").append(std::to_string(lines.first_skipped_line)).append(")");
  reason(unfinished, "unfinished last line (a write cut short)");
  return out;
}

std::string plural(std::size_t n, std::string_view what) {
  std::string out = std::to_string(n);
  return out.append(" ").append(what).append(n == 1 ? "" : "s");
}

} // namespace

std::string system_section(const RunInfo& r, int width, bool ascii) {
  const std::string path = r.dir + "/system.jsonl";
  std::error_code ec;
  Machines m;
  store::JsonLines lines;
  if (std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    lines = store::read_json_lines(path, [&](const simdjson::dom::object& line) { return m.take(line); });
    if (lines.problem) return "system\n  unreadable: " + lines.problem.message() + "\n\n";
  }
  std::string out;
  const std::string skipped = skipped_lines(lines);
  if (lines.used == 0) {
    out = "system: no samples (CHORUS_SYSTEM_INTERVAL=0, or the run was shorter than one interval)\n";
    if (!skipped.empty()) out.append(clip(skipped, width)).append("\n");
    return out.append("\n");
  }
  out.append("system (").append(plural(m.nodes.size(), "node")).append(", ").append(plural(m.ranks.size(), "rank"));
  out.append("; ").append(plural(lines.used, "sample"));
  if (m.last_time > m.first_time) out.append(" over ").append(format_duration(m.last_time - m.first_time));
  out.append(")\n");
  if (!skipped.empty()) out.append(clip(skipped, width)).append("\n");
  auto table = [&](const std::vector<std::vector<std::string>>& rows) {
    for (const std::string& line : split_lines(render(rows))) out.append(clip(line, width)).append("\n");
  };
  if (!m.nodes.empty()) table(table_rows(m.nodes, "NODE", node_columns));
  if (!m.nodes.empty() && !m.ranks.empty()) out.append("\n");
  if (!m.ranks.empty()) {
    auto rows = table_rows(m.ranks, "RANK", rank_columns);
    add_sparklines(rows, m.ranks, width, ascii);
    table(rows);
  }
  return out.append("\n");
}

} // namespace chorus::cli
