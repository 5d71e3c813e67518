// `chorus show GROUP`: the runs of a group side by side. Everything a member
// has on this machine (run.json, config.json, summary.json, history.jsonl)
// is read from its run directory; a member whose directory is elsewhere (on
// another node's disk) is shown from what it reported to group.json.
#include "cli/cli.hpp"
#include "cli/group_info.hpp"
#include "cli/series.hpp"
#include "io/store/json_lines.hpp"
#include "io/store/metric_specs.hpp"

#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

namespace chorus::cli {
namespace fs = std::filesystem;
namespace {

using Object = std::map<std::string, std::string>; // key -> value as shown

/// A JSON object's members, strings unquoted and the rest as compact JSON; empty when unreadable.
Object object_of(simdjson::dom::element doc) {
  Object out;
  simdjson::dom::object obj;
  if (doc.get(obj) != simdjson::SUCCESS) return out;
  for (auto [key, value] : obj) {
    std::string_view s;
    double d = 0;
    if (value.get(s) == simdjson::SUCCESS)
      out[std::string(key)] = std::string(s);
    else if (!value.is_bool() && value.get(d) == simdjson::SUCCESS)
      out[std::string(key)] = format_number(d);
    else
      out[std::string(key)] = simdjson::minify(value);
  }
  return out;
}

Object load_object(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  simdjson::dom::parser parser;
  const Result<simdjson::dom::element> doc = store::load_json_file(path, parser);
  if (!doc) return {};
  return object_of(*doc);
}

Object parse_object(const std::string& text) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(text).get(doc) != simdjson::SUCCESS) return {};
  return object_of(doc);
}

/// What the sections show of one member.
struct Column {
  const GroupMemberView* view;
  Object config, summary;
  Object finals;                            // metric -> its last value
  bool has_data = false;                    // a history here, or a reported summary
  Object declared;                          // key -> its summary where not its last (metrics.json, where here)
};

Column read_column(const GroupMemberView& v, bool history) {
  Column c{&v, {}, {}, {}, false, {}};
  if (v.run && v.run->readable()) {
    c.config = load_object(v.run->dir + "/config.json");
    c.summary = load_object(v.run->dir + "/summary.json");
    if (const Result<store::MetricSpecs> specs = store::MetricSpecs::read(v.run->dir))
      for (const auto& [key, spec] : specs->specs)
        if (spec.summary != Summary::last) c.declared[key] = std::string(to_string(spec.summary));
  } else if (v.member) {
    c.summary = parse_object(v.member->summary);
  }
  std::error_code ec;
  if (history && v.run && fs::exists(v.run->dir + "/history.jsonl", ec)) {
    const History h = read_history(v.run->dir + "/history.jsonl", [](std::string_view) { return true; });
    for (const Series& s : h.series)
      if (s.points() > 0) c.finals[s.key()] = format_number(s.last());
    if (h.rows > 0) c.has_data = true;
  } else {
    // The summary's automatic part holds each metric's last value, but for a key declared with another summary.
    for (const auto& [k, val] : c.summary)
      if (!k.starts_with('_') && parse_double(val) && !c.declared.contains(std::string(base_key(k)))) c.finals[k] = val;
    c.has_data = !c.summary.empty();
  }
  return c;
}

/// Rows of `key -> one cell per column`, printed as tables of as many
/// member columns as fit in `width` (the key column repeats in each).
std::string side_by_side(const std::vector<std::string>& labels,
                         const std::vector<std::pair<std::string, std::vector<std::string>>>& rows, int width) {
  if (rows.empty() || labels.empty()) return {};
  constexpr std::size_t cell_limit = 24, key_limit = 32;
  std::size_t key_w = 3;
  for (const auto& [k, cells] : rows) key_w = std::max(key_w, std::min(display_width(k), key_limit));
  std::vector<std::size_t> col_w(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    col_w[i] = std::min(display_width(labels[i]), cell_limit);
    for (const auto& [k, cells] : rows) col_w[i] = std::max(col_w[i], std::min(display_width(cells[i]), cell_limit));
  }
  std::string out;
  for (std::size_t first = 0; first < labels.size();) {
    std::size_t used = 2 + key_w, last = first;
    while (last < labels.size() && (last == first || used + 2 + col_w[last] <= static_cast<std::size_t>(width)))
      used += 2 + col_w[last++];
    Table t;
    std::vector<std::string> head{"KEY"};
    for (std::size_t i = first; i < last; ++i) head.push_back(clip(labels[i], static_cast<int>(cell_limit)));
    t.add(std::move(head));
    for (const auto& [k, cells] : rows) {
      std::vector<std::string> line{clip(k, static_cast<int>(key_limit))};
      for (std::size_t i = first; i < last; ++i) line.push_back(clip(cells[i], static_cast<int>(cell_limit)));
      t.add(std::move(line));
    }
    if (first > 0) out += "\n";
    for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
    first = last;
  }
  return out;
}

std::string identity(const GroupInfo& g) {
  Table t;
  auto row = [&](std::string k, std::string v) {
    if (!v.empty()) t.add({std::move(k), std::move(v)});
  };
  const store::GroupManifest* m = g.manifest ? &*g.manifest : nullptr;
  row("project", m ? m->project : g.project);
  if (m) {
    row("mode", m->mode + ", scope " + m->scope);
    row("host", m->host.empty() ? "" : m->host + " (global rank 0)");
    if (!m->launcher.empty() && m->launcher != "none") row("launcher", m->launcher + (m->job_id.empty() ? "" : ", job " + m->job_id));
  }
  row("dir", g.dir);
  std::map<std::string, int> states;
  for (const GroupMemberView& v : g.members) ++states[v.state()];
  std::string runs = std::to_string(g.members.size());
  if (m && m->size != static_cast<std::int64_t>(g.members.size())) runs += " of " + std::to_string(m->size);
  std::string counts;
  for (const auto& [state, n] : states) counts.append(counts.empty() ? "" : ", ").append(std::to_string(n) + " " + state);
  row("runs", runs + (counts.empty() ? "" : ": " + counts));
  if (m) {
    row("started", m->start_time ? format_time(*m->start_time) : "");
    row("ended", m->end_time ? format_time(*m->end_time) : "");
    if (m->start_time && m->end_time) row("duration", format_duration(*m->end_time - *m->start_time));
    row("state", m->state);
    if (!m->exit_codes.empty()) row("exit codes", exit_codes_cell(m->exit_codes));
  } else {
    row("group.json", !g.problem ? "none: the runs under the directory are shown" : "unreadable: " + g.problem.message());
  }
  return "group " + (m ? m->group : g.name) + "\n" + t.render("  ") + "\n";
}

std::string members_section(const GroupInfo& g, int width) {
  const store::GroupManifest* m = g.manifest ? &*g.manifest : nullptr;
  Table t;
  t.add({"MEMBER", "RUN", "STATE", "HOST", "NODE", "RANKS", "LAST STEP", "ROWS", "EXIT", "DURATION"});
  std::string notes;
  for (const GroupMemberView& v : g.members) {
    const store::GroupMember* gm = v.member ? &*v.member : nullptr;
    const RunInfo* r = v.run && v.run->readable() ? &*v.run : nullptr;
    std::int64_t last = -1;
    if (r)
      for (const RankInfo& k : r->ranks) last = std::max(last, k.last_step);
    else if (gm)
      for (const store::GroupRank& k : gm->ranks) last = std::max(last, k.last_step);
    std::string host = r ? r->host : gm ? gm->host : "";
    std::string rows = r && r->rows && r->state != "running" ? std::to_string(*r->rows)
                       : gm && gm->ended() && gm->state != "missing" ? std::to_string(gm->rows) : "-";
    std::optional<double> duration;
    if (r)
      duration = r->duration();
    else if (gm && gm->start_time && gm->end_time)
      duration = *gm->end_time - *gm->start_time;
    std::string ranks = v.ranks();
    if (ranks.empty() && r && r->world_size) ranks = std::to_string(*r->world_size) + " here";
    t.add({v.label, v.id().empty() ? "-" : v.id(), v.state(), host.empty() ? "-" : host,
           gm ? std::to_string(gm->node) : "-", ranks.empty() ? "-" : ranks, last < 0 ? "-" : std::to_string(last),
           rows, exit_codes_cell(v.exit_codes(m)), duration ? format_duration(*duration) : "-"});
    if (gm && !gm->message.empty() && v.state() != "finished") notes += "  " + v.label + ": " + gm->message + "\n";
    if (!r && v.run) notes += "  " + v.label + ": run.json unreadable: " + v.run->problem.message() + "\n";
  }
  std::string out = "members (" + std::to_string(g.members.size()) + ")\n";
  for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
  for (const std::string& line : split_lines(notes)) out += clip(line, width) + "\n";
  return out + "\n";
}

/// A row of a side-by-side table: each column's value of `key` in `field`, "-" where it has none.
std::vector<std::string> cells_of(const std::vector<Column>& cols, Object Column::*field, const std::string& key) {
  std::vector<std::string> cells;
  for (const Column& c : cols) {
    auto it = (c.*field).find(key);
    cells.push_back(it == (c.*field).end() ? "-" : it->second);
  }
  return cells;
}

std::vector<std::string> labels_of(const std::vector<Column>& cols) {
  std::vector<std::string> out;
  for (const Column& c : cols) out.push_back(c.view->label);
  return out;
}

std::string config_section(const std::vector<Column>& cols, int width) {
  std::set<std::string> keys;
  for (const Column& c : cols)
    for (const auto& [k, v] : c.config) keys.insert(k);
  if (keys.empty()) return {};
  std::vector<std::pair<std::string, std::vector<std::string>>> differ;
  std::string same;
  for (const std::string& k : keys) {
    // Members without a config here (elsewhere, or it never got written) are left out of the comparison.
    std::vector<std::string> cells = cells_of(cols, &Column::config, k);
    std::set<std::string> values;
    for (std::size_t i = 0; i < cols.size(); ++i)
      if (!cols[i].config.empty()) values.insert(cells[i]);
    if (values.size() == 1)
      same.append(same.empty() ? "" : ", ").append(k + "=" + *values.begin());
    else
      differ.emplace_back(k, std::move(cells));
  }
  std::string out = "config (" + std::to_string(keys.size()) + (keys.size() == 1 ? " key, " : " keys, ") +
                    std::to_string(differ.size()) + " differ)\n";
  out += side_by_side(labels_of(cols), differ, width);
  if (!same.empty()) out += clip("  the same on every member: " + same, width) + "\n";
  return out + "\n";
}

std::string finals_section(const std::vector<Column>& cols, int width, std::set<std::string>& common) {
  std::vector<const Column*> with;
  for (const Column& c : cols)
    if (c.has_data) with.push_back(&c);
  if (with.empty()) return {};
  for (const auto& final : with.front()->finals) {
    const std::string& k = final.first; // a name of its own: clang before 16 captures no structured binding
    if (std::all_of(with.begin(), with.end(), [&](const Column* c) { return c->finals.contains(k); })) common.insert(k);
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  for (const std::string& k : common) rows.emplace_back(k, cells_of(cols, &Column::finals, k));
  if (rows.empty()) return "final values\n  no metric is common to every member\n\n";
  rows.insert(rows.begin(), {"_step", cells_of(cols, &Column::summary, "_step")});
  return "final values (the last value of each metric every member logged)\n" +
         side_by_side(labels_of(cols), rows, width) + "\n";
}

std::string summary_section(const std::vector<Column>& cols, int width, const std::set<std::string>& shown) {
  std::set<std::string> keys;
  // A key among the final values is left out, unless its summary is declared other than its last value.
  for (const Column& c : cols)
    for (const auto& [k, v] : c.summary)
      if (!k.starts_with('_') && (!shown.contains(k) || c.declared.contains(std::string(base_key(k))))) keys.insert(k);
  if (keys.empty()) return {};
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  for (const std::string& k : keys) {
    std::vector<std::string> cells = cells_of(cols, &Column::summary, k);
    // A value declared as the key's min, max or mean says which.
    for (std::size_t i = 0; i < cols.size(); ++i)
      if (const auto d = cols[i].declared.find(std::string(base_key(k))); d != cols[i].declared.end() && cells[i] != "-")
        cells[i].append(" (").append(d->second).append(")");
    rows.emplace_back(k, std::move(cells));
  }
  return "summary\n" + side_by_side(labels_of(cols), rows, width) + "\n";
}

} // namespace

std::string render_group(const GroupInfo& g, int width, bool history) {
  std::string out = identity(g) + members_section(g, width);
  std::vector<Column> cols;
  for (const GroupMemberView& v : g.members)
    if (!(v.member && v.member->state == "missing" && !v.run)) cols.push_back(read_column(v, history));
  std::set<std::string> common;
  const std::string finals = finals_section(cols, width, common);
  out += config_section(cols, width) + summary_section(cols, width, common) + finals;
  return out;
}

} // namespace chorus::cli
