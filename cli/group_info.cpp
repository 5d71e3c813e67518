#include "cli/group_info.hpp"

#include "io/platform/posix.hpp"
#include "io/store/json_lines.hpp"

#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <limits>

namespace chorus::cli {
namespace fs = std::filesystem;
namespace {

/// "rank-2" for the run "job-7-rank-2" of the group "job-7"; the name itself otherwise.
std::string short_label(const std::string& name, const std::string& group) {
  if (name.size() > group.size() + 1 && name.starts_with(group) && name[group.size()] == '-')
    return name.substr(group.size() + 1);
  return name;
}

/// A run's summary.json as one line of JSON, as a member's report would
/// carry it; "{}" where there is none (or it is not an object).
std::string summary_of(const std::string& run_dir) {
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  const Result<simdjson::dom::element> doc = store::load_json_file(run_dir + "/summary.json", parser);
  if (!doc || doc->get(o) != simdjson::SUCCESS) return "{}";
  std::string json = simdjson::minify(o);
  return json.size() <= store::max_member_summary ? json : "{}";
}

bool same_dir(const std::string& a, const std::string& b) {
  std::error_code ec;
  return a == b || (!a.empty() && !b.empty() && fs::equivalent(a, b, ec));
}

} // namespace

std::string GroupMemberView::id() const {
  if (member && !member->id.empty()) return member->id;
  return run ? run->id : std::string();
}

std::string GroupMemberView::state() const {
  if (member && member->ended() && (!run || !run->readable() || run->state == "running")) return member->state;
  if (run && run->readable()) return run->shown_state();
  return member ? member->state : std::string("-");
}

std::string GroupMemberView::ranks() const {
  if (!member || member->ranks.empty()) return {};
  std::vector<std::int64_t> r;
  for (const store::GroupRank& k : member->ranks) r.push_back(k.rank);
  std::sort(r.begin(), r.end());
  // Ranks are not negative, so the difference fits; as unsigned it cannot overflow.
  if (r.size() > 1 && static_cast<std::uint64_t>(r.back()) - static_cast<std::uint64_t>(r.front()) == r.size() - 1)
    return std::to_string(r.front()) + "-" + std::to_string(r.back());
  std::string out;
  for (std::int64_t k : r) out.append(out.empty() ? "" : ",").append(std::to_string(k));
  return out;
}

std::map<std::int64_t, std::int64_t> GroupMemberView::exit_codes(const store::GroupManifest* g) const {
  if (run && !run->exit_codes.empty()) return {run->exit_codes.begin(), run->exit_codes.end()};
  if (g != nullptr && member) return g->exit_codes_of(*member);
  return {};
}

std::string exit_codes_cell(const std::map<std::int64_t, std::int64_t>& codes) {
  if (codes.empty()) return "-";
  if (std::all_of(codes.begin(), codes.end(), [](const auto& c) { return c.second == 0; })) return "0";
  if (codes.size() == 1) return std::to_string(codes.begin()->second);
  std::string out;
  for (const auto& [rank, code] : codes)
    out.append(out.empty() ? "" : " ").append(std::to_string(rank)).append("=").append(std::to_string(code));
  return out;
}

GroupInfo read_group(const std::string& dir) {
  GroupInfo g;
  g.dir = dir;
  g.name = fs::path(dir).filename().string();
  g.project = fs::path(dir).parent_path().filename().string();
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir + "/group.json", ec))) {
    if (Result<store::GroupManifest> m = store::read_group_file(dir))
      g.manifest = std::move(*m);
    else
      g.problem = m.error();
  }
  std::vector<RunInfo> runs;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec) && is_run_dir(it->path().string())) runs.push_back(read_run(it->path().string()));
  std::sort(runs.begin(), runs.end(), [](const RunInfo& a, const RunInfo& b) {
    return std::pair(a.start_time.value_or(0), a.id) < std::pair(b.start_time.value_or(0), b.id);
  });
  std::vector<bool> taken(runs.size(), false);
  const std::string group = g.manifest ? g.manifest->group : g.name;
  if (g.manifest) {
    for (const store::GroupMember& m : g.manifest->members) {
      GroupMemberView v;
      v.member = m;
      for (std::size_t i = 0; i < runs.size(); ++i)
        if (!taken[i] && !m.id.empty() && (runs[i].id == m.id || same_dir(runs[i].dir, m.dir))) {
          v.run = runs[i];
          taken[i] = true;
          break;
        }
      v.label = m.state == "missing" && m.id.empty() ? "place-" + std::to_string(m.index) : short_label(m.name, group);
      g.members.push_back(std::move(v));
    }
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (taken[i]) continue;
    GroupMemberView v;
    v.label = short_label(runs[i].name.empty() ? runs[i].id : runs[i].name, group);
    v.run = std::move(runs[i]);
    g.members.push_back(std::move(v));
  }
  // Two columns under one heading would be ambiguous: fall back to run ids.
  for (GroupMemberView& v : g.members)
    if (std::count_if(g.members.begin(), g.members.end(), [&](const GroupMemberView& o) { return o.label == v.label; }) > 1 &&
        !v.id().empty())
      v.label = v.id();
  return g;
}

void refresh_member(store::GroupMember& m, const RunInfo& run) {
  if (!run.readable()) return;
  if (run.state == "running") {
    // Its host has exited (launch saw it go) without ending the run.
    if (m.ended()) return;
    m.state = "crashed";
    m.message = "its run host exited before the run ended; 'chorus recover " + run.dir + "' rebuilds the run";
    for (store::GroupRank& r : m.ranks)
      if (r.state == "running") r.state = "crashed";
    if (!m.end_time) m.end_time = static_cast<double>(platform::unix_now_us()) / 1e6; // about when it went
    return;
  }
  m.state = run.state;
  if (run.end_time) m.end_time = run.end_time;
  if (run.rows) m.rows = *run.rows;
  if (run.ranks.size() == m.ranks.size())
    for (std::size_t i = 0; i < m.ranks.size(); ++i) {
      m.ranks[i].state = run.ranks[i].state;
      m.ranks[i].last_step = run.ranks[i].last_step;
    }
  if (m.state != "finished" && m.message.empty()) m.message = "as its run.json records";
}

std::optional<store::GroupMember> member_from_run(const RunInfo& run) {
  // Ranks are ints: a run.json that says otherwise is not taken for a member (and its sums cannot overflow).
  auto a_rank = [](std::int64_t r) { return r >= 0 && r <= std::numeric_limits<int>::max(); };
  if (!run.readable() || !run.group_index || !run.rank || !a_rank(*run.rank)) return std::nullopt;
  if (!std::all_of(run.ranks.begin(), run.ranks.end(), [&](const RankInfo& k) { return a_rank(k.rank); }))
    return std::nullopt;
  store::GroupMember m;
  m.index = *run.group_index;
  m.id = run.id;
  m.name = run.name.empty() ? run.id : run.name;
  m.dir = run.dir;
  m.host = run.host;
  m.pid = run.pid;
  m.node = run.node.value_or(0);
  m.start_time = run.start_time;
  m.summary = summary_of(run.dir);
  for (const RankInfo& k : run.ranks) m.ranks.push_back({*run.rank + k.rank, "running", k.last_step});
  m.state = "running";
  m.message = "no report of this run reached the group (see its host's output); chorus launch took it from its run.json";
  refresh_member(m, run);
  return m;
}

Error record_group_exit_codes(const std::string& group_dir, const std::map<std::int64_t, std::int64_t>& codes,
                              const std::vector<std::string>& run_dirs) {
  std::error_code ec;
  if (!fs::exists(group_dir + "/group.json", ec)) return {};
  return store::update_group_file(group_dir, [&](store::GroupManifest& g, bool exists) {
    if (!exists) return false;
    for (const auto& [rank, code] : codes) g.exit_codes[rank] = code;
    for (const std::string& d : run_dirs) {
      const RunInfo run = read_run(d);
      auto it = std::find_if(g.members.begin(), g.members.end(), [&](const store::GroupMember& m) { return same_dir(d, m.dir); });
      if (it != g.members.end()) {
        refresh_member(*it, run);
      } else if (auto m = member_from_run(run); m && m->index < g.size) {
        // A run whose report never reached group.json (its host was stopped first).
        std::erase_if(g.members, [&](const store::GroupMember& x) { return x.index == m->index && x.state == "missing"; });
        if (g.member(m->index) == nullptr) g.members.push_back(std::move(*m));
      }
    }
    g.settle();
    return true;
  });
}

std::vector<std::string> find_group_by_name(const std::string& root, const std::string& name) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path candidate = it->path() / name;
    if (it->is_directory(ec) && fs::is_directory(candidate, ec) && is_group_dir(candidate.string()))
      out.push_back(candidate.string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_group_dir(const std::string& dir) {
  std::error_code ec;
  if (is_run_dir(dir)) return false;
  if (fs::exists(fs::symlink_status(dir + "/group.json", ec))) return true;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (is_run_dir(it->path().string())) return true;
  return false;
}

} // namespace chorus::cli
