#include "io/store/group_file.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <limits>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace chorus::store {
namespace {

constexpr std::size_t max_text = 4096;           // a name, host, directory or message
constexpr std::size_t max_ranks = 65536;

constexpr std::array<std::string_view, 7> member_states = {"running", "finished", "failed", "crashed",
                                                           "killed",  "missing",  "unknown"};

bool known_state(std::string_view s) {
  return std::find(member_states.begin(), member_states.end(), s) != member_states.end();
}

// The fields of a member and of a manifest, named once for the writer and
// the reader (M: the struct, const or not).
template <class M>
auto texts_of_member(M& m) {
  return std::array{std::pair{"id", &m.id},       std::pair{"name", &m.name},   std::pair{"dir", &m.dir},
                    std::pair{"host", &m.host},   std::pair{"state", &m.state}, std::pair{"message", &m.message}};
}
template <class M>
auto numbers_of_member(M& m) {
  return std::array{std::pair{"index", &m.index}, std::pair{"pid", &m.pid}, std::pair{"node", &m.node},
                    std::pair{"rows", &m.rows}};
}
template <class G>
auto texts_of_group(G& g) {
  return std::array{std::pair{"group", &g.group},       std::pair{"project", &g.project}, std::pair{"mode", &g.mode},
                    std::pair{"scope", &g.scope},       std::pair{"launcher", &g.launcher},
                    std::pair{"job_id", &g.job_id},     std::pair{"host", &g.host},       std::pair{"state", &g.state}};
}
template <class T>
auto times_of(T& t) {
  return std::array{std::pair{"start_time", &t.start_time}, std::pair{"end_time", &t.end_time}};
}

void optional_time(core::JsonWriter& w, std::string_view key, const std::optional<double>& t) {
  w.key(key);
  if (t)
    w.number(*t);
  else
    w.null();
}

void write_member(core::JsonWriter& w, const GroupMember& m, const std::map<std::int64_t, std::int64_t>* codes) {
  w.begin_object();
  for (auto [key, v] : numbers_of_member(m)) w.key(key).integer(*v);
  for (auto [key, v] : texts_of_member(m)) w.key(key).string(*v);
  for (auto [key, v] : times_of(m)) optional_time(w, key, *v);
  w.key("ranks").begin_array();
  for (const GroupRank& r : m.ranks) {
    w.begin_object();
    w.key("rank").integer(r.rank);
    w.key("state").string(r.state);
    w.key("last_step").integer(r.last_step);
    w.end_object();
  }
  w.end_array();
  if (codes != nullptr) {
    // A view of the group's exit codes, for a reader of this member alone.
    w.key("exit_codes").begin_object();
    for (const auto& [rank, code] : *codes) w.key(std::to_string(rank)).integer(code);
    w.end_object();
  }
  w.key("summary").raw(m.summary);
  w.end_object();
}

/// Reads `key` as a string of at most `limit` bytes into `out`; a missing
/// key leaves `out` alone. False for a value of another type or too long.
bool text(simdjson::dom::object& o, const char* key, std::string& out, std::size_t limit = max_text) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return true;
  std::string_view v;
  if (e.get(v) != simdjson::SUCCESS || v.size() > limit) return false;
  out = v;
  return true;
}

bool integer(simdjson::dom::object& o, const char* key, std::int64_t& out) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return true;
  return e.get(out) == simdjson::SUCCESS;
}

bool seconds(simdjson::dom::object& o, const char* key, std::optional<double>& out) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return true;
  double v = 0;
  if (e.get(v) != simdjson::SUCCESS) return false;
  out = v;
  return true;
}

Error read_member(simdjson::dom::object& o, GroupMember& m) {
  auto bad = [&](std::string_view field) {
    return Error(Errc::invalid_argument, "member field \"" + std::string(field) + "\" is missing or malformed");
  };
  for (auto [key, out] : texts_of_member(m))
    if (!text(o, key, *out)) return bad(key);
  if (!known_state(m.state)) return bad("state");
  for (auto [key, out] : numbers_of_member(m))
    if (!integer(o, key, *out)) return bad(key);
  if (m.index < 0 || m.index >= static_cast<std::int64_t>(max_ranks)) return bad("index");
  for (auto [key, out] : times_of(m))
    if (!seconds(o, key, *out)) return bad(key);
  simdjson::dom::array ranks;
  if (o["ranks"].get(ranks) == simdjson::SUCCESS) {
    if (ranks.size() > max_ranks) return bad("ranks");
    m.ranks.clear();
    for (simdjson::dom::element e : ranks) {
      simdjson::dom::object ro;
      GroupRank r;
      if (e.get(ro) != simdjson::SUCCESS || !integer(ro, "rank", r.rank) || !integer(ro, "last_step", r.last_step) ||
          !text(ro, "state", r.state) || !known_state(r.state) || r.rank < 0 ||
          r.rank > std::numeric_limits<int>::max()) // ranks are ints everywhere else
        return bad("ranks");
      m.ranks.push_back(std::move(r));
    }
  }
  simdjson::dom::element summary;
  if (o["summary"].get(summary) == simdjson::SUCCESS) {
    if (!summary.is_object()) return bad("summary");
    m.summary = simdjson::minify(summary);
    if (m.summary.size() > max_member_summary) return bad("summary");
  }
  return {};
}

/// The group directory's lock, held while group.json is read and replaced.
class DirLock {
public:
  explicit DirLock(const std::string& dir) : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ < 0) return;
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~DirLock() {
    if (fd_ >= 0) platform::close_fd(fd_); // closing releases the lock
  }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  [[nodiscard]] bool held() const noexcept { return fd_ >= 0; }

private:
  int fd_;
};

} // namespace

GroupMember* GroupManifest::member(std::int64_t index) {
  for (GroupMember& m : members)
    if (m.index == index) return &m;
  return nullptr;
}

const GroupMember* GroupManifest::member(std::int64_t index) const {
  return const_cast<GroupManifest*>(this)->member(index);
}

std::map<std::int64_t, std::int64_t> GroupManifest::exit_codes_of(const GroupMember& m) const {
  std::map<std::int64_t, std::int64_t> out;
  for (const GroupRank& r : m.ranks)
    if (auto it = exit_codes.find(r.rank); it != exit_codes.end()) out.insert(*it);
  return out;
}

void GroupManifest::settle() {
  std::sort(members.begin(), members.end(), [](const GroupMember& a, const GroupMember& b) { return a.index < b.index; });
  for (const GroupMember& m : members)
    if (m.start_time && (!start_time || *m.start_time < *start_time)) start_time = m.start_time;
  if (static_cast<std::int64_t>(members.size()) < size) return;
  // As a run's end names its ranks' worst: failed, else crashed (a run gone
  // without a word, one missing or unknown), else killed, else finished.
  bool failed = false, crashed = false, killed = false;
  std::optional<double> end;
  for (const GroupMember& m : members) {
    if (!m.ended()) return;
    failed = failed || m.state == "failed";
    crashed = crashed || m.state == "crashed" || m.state == "missing" || m.state == "unknown";
    killed = killed || m.state == "killed";
    if (m.end_time && (!end || *m.end_time > *end)) end = m.end_time;
  }
  state = failed ? "failed" : crashed ? "crashed" : killed ? "killed" : "finished";
  if (end) end_time = end;
}

std::string member_json(const GroupMember& m) {
  std::string out;
  core::JsonWriter w(out);
  write_member(w, m, nullptr);
  return out;
}

Result<GroupMember> parse_member(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  if (auto e = parser.parse(json.data(), json.size()).get(o))
    return Error(Errc::invalid_argument, std::string("a member report is not a JSON object: ") + simdjson::error_message(e));
  GroupMember m;
  if (Error e = read_member(o, m)) return e;
  return m;
}

std::string group_json(const GroupManifest& g) {
  std::string out;
  core::JsonWriter w(out);
  w.begin_object();
  for (auto [key, v] : texts_of_group(g)) w.key(key).string(*v);
  w.key("size").integer(g.size);
  for (auto [key, v] : times_of(g)) optional_time(w, key, *v);
  w.key("members").begin_array();
  for (const GroupMember& m : g.members) {
    const auto codes = g.exit_codes_of(m);
    write_member(w, m, &codes);
  }
  w.end_array();
  w.key("exit_codes").begin_object();
  for (const auto& [rank, code] : g.exit_codes) w.key(std::to_string(rank)).integer(code);
  w.end_object();
  w.end_object();
  out.push_back('\n');
  return out;
}

Result<GroupManifest> read_group_file(const std::string& group_dir) {
  const std::string path = group_dir + "/group.json";
  const Result<std::string> content = platform::read_text(path);
  if (!content) return content.error();
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  if (auto e = parser.parse(*content).get(o))
    return {Errc::invalid_argument, path + " is not a JSON object (" + simdjson::error_message(e) + ")"};
  GroupManifest g;
  auto bad = [&](std::string_view why) {
    return Error{Errc::invalid_argument, path + ": " + std::string(why)};
  };
  for (auto [key, field] : texts_of_group(g))
    if (!text(o, key, *field)) return bad(std::string("\"") + key + "\" is not a short string");
  if (!integer(o, "size", g.size) || g.size < 0) return bad("\"size\" is not a count");
  for (auto [key, field] : times_of(g))
    if (!seconds(o, key, *field)) return bad(std::string("\"") + key + "\" is not a number");
  simdjson::dom::array members;
  if (o["members"].get(members) == simdjson::SUCCESS) {
    for (simdjson::dom::element e : members) {
      simdjson::dom::object mo;
      GroupMember m;
      if (e.get(mo) != simdjson::SUCCESS) return bad("a member is not an object");
      if (Error bad_member = read_member(mo, m)) return bad(bad_member.message());
      g.members.push_back(std::move(m));
    }
  }
  simdjson::dom::object codes;
  if (o["exit_codes"].get(codes) == simdjson::SUCCESS) {
    for (auto [key, value] : codes) {
      std::int64_t rank = 0, code = 0;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), rank);
      if (ec != std::errc{} || end != key.data() + key.size() || rank < 0 || value.get(code) != simdjson::SUCCESS)
        return bad("\"exit_codes\" maps ranks to whole numbers");
      g.exit_codes[rank] = code;
    }
  }
  return g;
}

Error update_group_file(const std::string& group_dir, const std::function<bool(GroupManifest&, bool)>& update) {
  DirLock lock(group_dir);
  if (!lock.held()) return platform::os_error("open", group_dir, errno);
  Result<GroupManifest> read = read_group_file(group_dir);
  const bool exists = read.has_value();
  GroupManifest g = std::move(read).value_or(GroupManifest{});
  if (!update(g, exists)) return {};
  return platform::write_file_atomic(group_dir + "/group.json", group_json(g));
}

} // namespace chorus::store
