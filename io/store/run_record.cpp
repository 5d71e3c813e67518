#include "io/store/run_record.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <iterator>

namespace chorus::store {
namespace {

using simdjson::SUCCESS;
using simdjson::dom::element;

// How a member's value is taken: one of the wrong type is left out, one that
// no field can hold is named in `damage` (the first only).
struct Reader {
  std::string& damage;

  static void text(element v, std::string& out) {
    std::string_view s;
    if (v.get(s) == SUCCESS) out = s;
  }

  // A whole number; one written as a double is cut to its integer part.
  void whole(element v, std::string_view key, std::optional<std::int64_t>& out) {
    std::int64_t i = 0;
    double d = 0;
    if (v.get(i) == SUCCESS) {
      out = i;
    } else if (v.get(d) == SUCCESS) {
      if (d >= -0x1p63 && d < 0x1p63)
        out = static_cast<std::int64_t>(d);
      else if (damage.empty())
        damage = "\"" + std::string(key) + "\" is " + simdjson::minify(v) + ", beyond a whole number's range";
    }
  }
  void whole(element v, std::string_view key, std::int64_t& out) {
    std::optional<std::int64_t> w;
    whole(v, key, w);
    if (w) out = *w;
  }

  // Unix seconds as microseconds; a time no calendar holds is left out.
  static void time(element v, std::optional<std::int64_t>& out) {
    constexpr std::int64_t limit = INT64_MAX / 1'000'000;
    std::int64_t i = 0;
    double d = 0;
    if (v.get(i) == SUCCESS) {
      if (i >= -limit && i <= limit) out = i * 1'000'000;
    } else if (v.get(d) == SUCCESS && std::isfinite(d) && std::fabs(d) < static_cast<double>(limit)) {
      out = std::llround(d * 1e6);
    }
  }

  // {"RANK": CODE, ...}: a key that is no rank, or a code that is no whole number, is left out.
  static void codes(element v, std::optional<ExitCodes>& out) {
    simdjson::dom::object o;
    if (v.get(o) != SUCCESS) return;
    out.emplace();
    for (auto [key, value] : o) {
      std::int64_t rank = -1, code = 0;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), rank);
      if (ec == std::errc() && end == key.data() + key.size() && rank >= 0 && rank <= INT_MAX &&
          value.get(code) == SUCCESS)
        out->emplace_back(rank, code);
    }
  }

  // Each object of the array `v` (what is not one is left out).
  template <class Take>
  static void objects(element v, Take take) {
    simdjson::dom::array a;
    if (v.get(a) != SUCCESS) return;
    for (element e : a)
      if (simdjson::dom::object o; e.get(o) == SUCCESS) take(o);
  }

  void segments(element v, std::vector<RunRecord::Segment>& out) {
    objects(v, [&](simdjson::dom::object o) {
      RunRecord::Segment& s = out.emplace_back();
      if (element x; o["start_time"].get(x) == SUCCESS) time(x, s.start_us);
      if (element x; o["end_time"].get(x) == SUCCESS) time(x, s.end_us);
      if (element x; o["state"].get(x) == SUCCESS) text(x, s.state);
      if (element x; o["exit_codes"].get(x) == SUCCESS) codes(x, s.exit_codes);
    });
  }

  // {"FILE": BYTES, ...}: a length that is no whole number >= 0 is left out.
  static void lengths(element v, std::vector<std::pair<std::string, std::uint64_t>>& out) {
    simdjson::dom::object o;
    if (v.get(o) != SUCCESS) return;
    for (auto [key, value] : o)
      if (std::uint64_t n = 0; value.get(n) == SUCCESS) out.emplace_back(std::string(key), n);
  }

  void ranks(element v, std::vector<RunRecord::Rank>& out) {
    objects(v, [&](simdjson::dom::object o) {
      RunRecord::Rank& r = out.emplace_back();
      if (element x; o["rank"].get(x) == SUCCESS) whole(x, "rank", r.rank);
      if (element x; o["state"].get(x) == SUCCESS) text(x, r.state);
      if (element x; o["last_step"].get(x) == SUCCESS) whole(x, "last_step", r.last_step);
      if (element x; o["host"].get(x) == SUCCESS) text(x, r.host);
      if (element x; o["message"].get(x) == SUCCESS) text(x, r.message);
      if (element x; o["joined"].get(x) == SUCCESS) time(x, r.joined_us);
    });
  }
};

// run.json's members, each with how it is read.
struct Member {
  std::string_view key;
  void (*read)(RunRecord&, element, Reader&);
};

constexpr Member members[] = {
    {"id", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.id); }},
    {"name", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.name); }},
    {"project", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.project); }},
    {"group", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.group); }},
    {"job_type", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.job_type); }},
    {"notes", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.notes); }},
    {"mode", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.mode); }},
    {"scope", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.scope); }},
    {"host", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.host); }},
    {"pid", [](RunRecord& r, element v, Reader& in) { in.whole(v, "pid", r.pid); }},
    {"dir", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.dir); }},
    {"launcher", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.launcher); }},
    {"job_id", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.job_id); }},
    {"nodes", [](RunRecord& r, element v, Reader& in) { in.whole(v, "nodes", r.nodes); }},
    {"group_index", [](RunRecord& r, element v, Reader& in) { in.whole(v, "group_index", r.group_index); }},
    {"rank", [](RunRecord& r, element v, Reader& in) { in.whole(v, "rank", r.rank); }},
    {"node", [](RunRecord& r, element v, Reader& in) { in.whole(v, "node", r.node); }},
    {"state", [](RunRecord& r, element v, Reader&) { Reader::text(v, r.state); }},
    {"start_time", [](RunRecord& r, element v, Reader&) { Reader::time(v, r.start_us); }},
    {"end_time", [](RunRecord& r, element v, Reader&) { Reader::time(v, r.end_us); }},
    {"segments", [](RunRecord& r, element v, Reader& in) { in.segments(v, r.segments); }},
    {"exit_codes", [](RunRecord& r, element v, Reader&) { Reader::codes(v, r.exit_codes); }},
    {"world_size", [](RunRecord& r, element v, Reader& in) { in.whole(v, "world_size", r.world_size); }},
    {"rows", [](RunRecord& r, element v, Reader& in) { in.whole(v, "rows", r.rows); }},
    {"rejected", [](RunRecord& r, element v, Reader& in) { in.whole(v, "rejected", r.rejected); }},
    {"lengths", [](RunRecord& r, element v, Reader&) { Reader::lengths(v, r.lengths); }},
    {"error",
     [](RunRecord& r, element v, Reader&) {
       if (std::string_view s; v.get(s) == SUCCESS) r.error = std::string(s);
     }},
    {"ranks", [](RunRecord& r, element v, Reader& in) { in.ranks(v, r.ranks); }},
};

constexpr std::uint32_t bit(std::string_view key) {
  for (std::size_t i = 0; i < std::size(members); ++i)
    if (members[i].key == key) return std::uint32_t{1} << i;
  return 0;
}
static_assert(std::size(members) <= 32);

// The members of the identity (from "id" to "nodes"), and those written
// even without a value: the identity's, "state", "end_time" (null), and the arrays.
constexpr std::uint32_t identity_members = (bit("nodes") << 1) - 1;
constexpr std::uint32_t always_written = identity_members | bit("state") | bit("end_time") | bit("segments") | bit("ranks");

// Writes members, one the parsed text lacked only once it has a value.
struct Out {
  core::JsonWriter& w;
  std::uint32_t lacking;

  [[nodiscard]] bool shown(std::string_view key, bool has_value) const { return has_value || (lacking & bit(key)) == 0; }
  void text(std::string_view key, const std::string& v) {
    if (shown(key, !v.empty())) w.key(key).string(v);
  }
  void whole(std::string_view key, std::int64_t v) {
    if (shown(key, v != 0)) w.key(key).integer(v);
  }
  void whole(std::string_view key, const std::optional<std::int64_t>& v) {
    if (v) w.key(key).integer(*v);
  }
  void end_time(const std::optional<std::int64_t>& end_us) {
    if (!shown("end_time", end_us.has_value())) return;
    w.key("end_time");
    if (end_us)
      w.seconds(*end_us);
    else
      w.null();
  }
  void codes(const ExitCodes& codes) {
    w.key("exit_codes").begin_object();
    for (const auto& [rank, code] : codes) w.key(std::to_string(rank)).integer(code);
    w.end_object();
  }

  void identity(const RunRecord& r) {
    text("id", r.id);
    text("name", r.name);
    text("project", r.project);
    text("group", r.group);
    text("job_type", r.job_type);
    text("notes", r.notes);
    text("mode", r.mode);
    text("scope", r.scope);
    text("host", r.host);
    whole("pid", r.pid);
    text("dir", r.dir);
    text("launcher", r.launcher);
    text("job_id", r.job_id);
    whole("nodes", r.nodes);
  }
  void place(const RunRecord& r) {
    whole("group_index", r.group_index);
    whole("rank", r.rank);
    whole("node", r.node);
  }
  void unknown(const RunRecord& r) {
    for (const auto& [k, v] : r.unknown) w.key(k).raw(v);
  }
};

} // namespace

std::optional<std::uint64_t> file_length(const std::string& run_dir, std::string_view name) {
  struct stat st {};
  const std::string path = run_dir + "/" + std::string(name);
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<std::uint64_t>(st.st_size);
}

std::string failure_of_exit_codes(const ExitCodes& codes) {
  for (const auto& [rank, code] : codes)
    if (code != 0)
      return "rank " + std::to_string(rank) + " exited with code " + std::to_string(code) + " after the run ended";
  return {};
}

Result<RunRecord> RunRecord::parse(std::string_view json) {
  simdjson::dom::parser parser;
  element doc;
  if (auto e = parser.parse(json.data(), json.size()).get(doc))
    return Error(Errc::invalid_argument, std::string("is not valid JSON (") + simdjson::error_message(e) +
                                             "): it is damaged, or was cut short while being written");
  simdjson::dom::object o;
  if (doc.get(o) != SUCCESS) return Error(Errc::invalid_argument, "is not a JSON object");
  RunRecord r;
  Reader in{r.damage};
  // The first of a repeated member counts, as for a lookup by key.
  std::uint32_t seen = 0;
  for (auto field : o) {
    // Named, not bound: clang before 16 cannot capture a structured binding in a lambda.
    const std::string_view key = field.key;
    const simdjson::dom::element value = field.value;
    const auto* m = std::find_if(std::begin(members), std::end(members), [&](const Member& x) { return x.key == key; });
    if (m != std::end(members)) {
      const std::uint32_t b = std::uint32_t{1} << (m - std::begin(members));
      if ((seen & b) == 0) m->read(r, value, in);
      seen |= b;
    } else if (std::none_of(r.unknown.begin(), r.unknown.end(), [&](const auto& u) { return u.first == key; })) {
      r.unknown.emplace_back(std::string(key), simdjson::minify(value));
    }
  }
  r.lacking_ = always_written & ~seen;
  return r;
}

Result<RunRecord> RunRecord::read(const std::string& path) {
  const Result<std::string> text = platform::read_text(path);
  if (!text) return text.error();
  Result<RunRecord> r = parse(*text);
  if (r) return r;
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  return Error(Errc::invalid_argument, path + " " + r.error().message() + ". chorus recover " + dir +
                                           " rebuilds it from the run's write-ahead log");
}

RunRecord RunRecord::identity() const {
  RunRecord r = *this;
  r.state.clear();
  r.end_us.reset();
  r.segments.clear();
  r.exit_codes.reset();
  r.world_size.reset();
  r.rows.reset();
  r.rejected.reset();
  r.lengths.clear();
  r.error.reset();
  r.ranks.clear();
  r.damage.clear();
  r.lacking_ &= identity_members;
  return r;
}

std::string RunRecord::identity_json() const { return render(false); }

std::string RunRecord::json() const { return render(true); }

std::string RunRecord::render(bool whole) const {
  std::string out;
  core::JsonWriter w(out);
  Out o{w, lacking_};
  w.begin_object();
  o.identity(*this);
  // A run host's identity object has its start here; run.json has it with the end.
  if (!whole && start_us) w.key("start_time").seconds(*start_us);
  o.place(*this);
  o.unknown(*this);
  if (!whole) {
    w.end_object();
    return out;
  }
  o.text("state", state);
  if (start_us) w.key("start_time").seconds(*start_us);
  o.end_time(end_us);
  if (o.shown("segments", !segments.empty())) {
    w.key("segments").begin_array();
    for (const Segment& g : segments) {
      w.begin_object();
      if (g.start_us) w.key("start_time").seconds(*g.start_us);
      Out{w, 0}.end_time(g.end_us);
      w.key("state").string(g.state);
      if (g.exit_codes) o.codes(*g.exit_codes);
      w.end_object();
    }
    w.end_array();
  }
  if (exit_codes) o.codes(*exit_codes);
  o.whole("world_size", world_size);
  o.whole("rows", rows);
  o.whole("rejected", rejected);
  if (!lengths.empty()) {
    w.key("lengths").begin_object();
    for (const auto& [file, n] : lengths) w.key(file).uinteger(n);
    w.end_object();
  }
  if (error) w.key("error").string(*error);
  if (o.shown("ranks", !ranks.empty())) {
    w.key("ranks").begin_array();
    for (const Rank& r : ranks) {
      w.begin_object();
      w.key("rank").integer(r.rank);
      w.key("state").string(r.state);
      w.key("last_step").integer(r.last_step);
      w.key("host").string(r.host);
      w.key("message").string(r.message);
      if (r.joined_us) w.key("joined").seconds(joined_ms(*r.joined_us));
      w.end_object();
    }
    w.end_array();
  }
  w.end_object();
  return out;
}

Error RunRecord::write(const std::string& path, bool durable) const {
  return platform::write_file_atomic(path, text(), durable);
}

std::optional<RunState> run_state_named(std::string_view name) {
  for (RunState s : {RunState::running, RunState::finished, RunState::failed, RunState::crashed, RunState::killed})
    if (to_string(s) == name) return s;
  return std::nullopt;
}

} // namespace chorus::store
