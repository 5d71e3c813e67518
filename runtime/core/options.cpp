// Options as one process uses them: CHORUS_* applied, every value checked,
// defaults derived from the job, and this process's place in its run.
#include "runtime/core/options.hpp"

#include "runtime/core/fnv.hpp"
#include "runtime/core/upload_url.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <system_error>

namespace chorus::core {
namespace {

constexpr std::size_t max_name_bytes = 128;
constexpr std::size_t min_queue = 1024, max_queue = std::size_t{1} << 26;
constexpr std::uint16_t default_port = 29501;

/// Where a value came from: an environment variable (a bad one is
/// Errc::bad_environment) or an Options field (Errc::invalid_argument).
struct Origin {
  std::string name;
  bool env = false;
};

Origin option(std::string_view field) { return {"Options::" + std::string(field), false}; }
Origin variable(std::string_view name) { return {std::string(name), true}; }

Error bad(const Origin& o, std::string_view value, std::string_view problem, std::string_view takes) {
  const std::string shown(value.substr(0, 64));
  return Error(o.env ? Errc::bad_environment : Errc::invalid_argument,
               o.name + "='" + shown + (value.size() > 64 ? "...' " : "' ") + std::string(problem) + ": " + o.name +
                   " takes " + std::string(takes) + ".");
}

/// A CHORUS_* value; an empty one counts as unset, as for the launcher's.
std::optional<std::string> lookup(const Env& env, std::string_view name) {
  std::optional<std::string> v = env(name);
  if (v && v->empty()) return std::nullopt;
  return v;
}

bool valid_utf8(std::string_view s) {
  static constexpr std::uint32_t least[] = {0, 0x80, 0x800, 0x10000};
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : 4;
    if (n == 4 || s.size() - i <= n) return false;
    std::uint32_t cp = n == 0 ? c : c & (0x3Fu >> n);
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not UTF-8.
    if (cp < least[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
    i += n + 1;
  }
  return true;
}

bool id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

/// Why `s` cannot name a directory (project, group, name) or a run id, or
/// nothing if it can.
std::optional<std::string_view> name_problem(std::string_view s, bool id) {
  if (s.empty()) return "is empty";
  if (s.size() > max_name_bytes) return "is longer than 128 bytes";
  if (s == "." || s == "..") return "is a relative directory";
  if (s.find('/') != std::string_view::npos) return "contains '/'";
  if (s.find('\0') != std::string_view::npos) return "contains a NUL byte";
  if (!valid_utf8(s)) return "is not valid UTF-8";
  if (id && !std::all_of(s.begin(), s.end(), id_char)) return "contains a character other than A-Z a-z 0-9 . _ -";
  return std::nullopt;
}

constexpr std::string_view name_takes = "a directory name: 1 to 128 bytes of UTF-8, without '/' or NUL, not '.' or '..'";
constexpr std::string_view id_takes = "1 to 128 of the characters A-Z a-z 0-9 . _ -, not '.' or '..'";

/// An enum spelled as to_string spells it.
template <class E, std::size_t N>
std::optional<E> parse_enum(std::string_view text, const E (&values)[N]) {
  for (E e : values)
    if (to_string(e) == text) return e;
  return std::nullopt;
}

} // namespace

// Flyte's words, and the C++ enum names beside them.
std::optional<Mode> parse_mode(std::string_view text) {
  if (text == "automatic") return Mode::automatic;
  if (text == "per_rank") return Mode::per_rank;
  return parse_enum(text, {Mode::automatic, Mode::shared, Mode::per_rank});
}
std::optional<Scope> parse_scope(std::string_view text) {
  if (text == "node") return Scope::node;
  return parse_enum(text, {Scope::global, Scope::node});
}
std::optional<Resume> parse_resume(std::string_view text) {
  return parse_enum(text, {Resume::never, Resume::allow, Resume::must});
}
std::optional<Reduce> parse_reduce(std::string_view text) {
  return parse_enum(text, {Reduce::none, Reduce::mean, Reduce::sum, Reduce::min, Reduce::max, Reduce::first,
                           Reduce::merge});
}
std::optional<Summary> parse_summary(std::string_view text) {
  return parse_enum(text, {Summary::last, Summary::min, Summary::max, Summary::mean});
}

namespace {

/// Decimal seconds, e.g. "30" or "1.5", within [min, max] (or exactly 0 when `zero`).
std::optional<double> parse_seconds(std::string_view text, double min, double max, bool zero) {
  double d = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), d, std::chars_format::fixed);
  if (ec != std::errc() || p != text.data() + text.size() || !std::isfinite(d)) return std::nullopt;
  if ((zero && d == 0) || (d >= min && d <= max)) return d;
  return std::nullopt;
}

std::chrono::milliseconds to_ms(double seconds) {
  // A positive timeout stays positive when it is below a millisecond.
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000)));
}

/// Applies CHORUS_* to `o`; the first malformed value is the error.
Error apply_env(Options& o, const Env& env) {
  struct NameVar {
    std::string Options::*field;
    std::string_view var;
    bool id;
  };
  for (const NameVar& n : {NameVar{&Options::project, "CHORUS_PROJECT", false},
                           NameVar{&Options::group, "CHORUS_GROUP", false},
                           NameVar{&Options::run_id, "CHORUS_RUN_ID", true},
                           NameVar{&Options::name, "CHORUS_NAME", false}}) {
    if (auto v = lookup(env, n.var)) {
      if (auto why = name_problem(*v, n.id)) return bad(variable(n.var), *v, *why, n.id ? id_takes : name_takes);
      o.*n.field = std::move(*v);
    }
  }
  for (auto [field, var] : {std::pair{&Options::dir, "CHORUS_DIR"}, std::pair{&Options::upload, "CHORUS_UPLOAD"},
                            std::pair{&Options::tls_dir, "CHORUS_TLS_DIR"}})
    if (auto v = lookup(env, var)) o.*field = std::move(*v);

  if (auto v = lookup(env, "CHORUS_MODE")) {
    auto m = parse_mode(*v);
    if (!m) return bad(variable("CHORUS_MODE"), *v, "is not a mode", mode_takes);
    o.mode = *m;
  }
  if (auto v = lookup(env, "CHORUS_SCOPE")) {
    auto s = parse_scope(*v);
    if (!s) return bad(variable("CHORUS_SCOPE"), *v, "is not a scope", scope_takes);
    o.scope = *s;
  }
  if (auto v = lookup(env, "CHORUS_RESUME")) {
    auto r = parse_resume(*v);
    if (!r) return bad(variable("CHORUS_RESUME"), *v, "is not a resume policy", resume_takes);
    o.resume = *r;
  }
  if (auto v = lookup(env, "CHORUS_PORT")) {
    unsigned port = 0;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), port);
    if (ec != std::errc() || p != v->data() + v->size() || port < 1 || port > 65535)
      return bad(variable("CHORUS_PORT"), *v, "is not a port", "a port number in 1..65535");
    o.port = static_cast<std::uint16_t>(port);
  }
  for (auto [field, var] : {std::pair{&Options::init_timeout, "CHORUS_INIT_TIMEOUT"},
                            std::pair{&Options::finish_timeout, "CHORUS_FINISH_TIMEOUT"},
                            std::pair{&Options::upload_timeout, "CHORUS_UPLOAD_TIMEOUT"},
                            std::pair{&Options::heartbeat_interval, "CHORUS_HEARTBEAT_INTERVAL"},
                            std::pair{&Options::connection_timeout, "CHORUS_CONNECTION_TIMEOUT"}}) {
    if (auto v = lookup(env, var)) {
      auto s = parse_seconds(*v, 0.0, 1e9, false);
      if (!s || *s <= 0) return bad(variable(var), *v, "is not a timeout", "seconds greater than 0, like 30 or 2.5");
      o.*field = to_ms(*s);
    }
  }
  if (auto v = lookup(env, "CHORUS_STALL_AFTER")) {
    auto s = parse_seconds(*v, 0.0, 1e9, true);
    if (!s) return bad(variable("CHORUS_STALL_AFTER"), *v, "is not a duration", "seconds, 0 (off) or more, like 300");
    o.stall_after = to_ms(*s);
  }
  if (auto v = lookup(env, "CHORUS_UPLOAD_BUFFER")) {
    auto mib = parse_seconds(*v, 0.0625, 1024, false); // a plain decimal number, here in MiB
    if (!mib) return bad(variable("CHORUS_UPLOAD_BUFFER"), *v, "is not a size", "MiB, from 0.0625 to 1024, like 4");
    o.upload_buffer = static_cast<std::size_t>(*mib * 1048576.0);
  }
  if (auto v = lookup(env, "CHORUS_SYSTEM_INTERVAL")) {
    auto s = parse_seconds(*v, 0.1, 1e9, true);
    if (!s) return bad(variable("CHORUS_SYSTEM_INTERVAL"), *v, "is not an interval", "seconds, 0 (off) or at least 0.1");
    o.system_interval = *s;
  }
  if (auto v = lookup(env, "CHORUS_INSECURE")) {
    static constexpr std::pair<std::string_view, bool> words[] = {{"1", true},    {"0", false},  {"true", true},
                                                                  {"false", false}, {"yes", true}, {"no", false}};
    std::string lower = *v;
    for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    const auto* w = std::find_if(std::begin(words), std::end(words), [&](const auto& x) { return x.first == lower; });
    if (w == std::end(words)) return bad(variable("CHORUS_INSECURE"), *v, "is not a yes or no", "1, 0, true, false, yes or no");
    o.insecure = w->second;
  }
  return {};
}

/// Checks the fields the environment did not replace (those were checked
/// as they were read) and the rest of the Options.
Error check_options(const Options& o, const Options& given) {
  struct NameField {
    std::string Options::*field;
    std::string_view option;
    bool id;
    bool optional;
  };
  for (const NameField& n : {NameField{&Options::project, "project", false, false},
                             NameField{&Options::group, "group", false, true},
                             NameField{&Options::run_id, "run_id", true, true},
                             NameField{&Options::name, "name", false, true}}) {
    const std::string& v = o.*n.field;
    if (v != given.*n.field || (n.optional && v.empty())) continue;
    if (auto why = name_problem(v, n.id)) return bad(option(n.option), v, *why, n.id ? id_takes : name_takes);
  }
  if (o.mode != Mode::automatic && o.mode != Mode::shared && o.mode != Mode::per_rank)
    return bad(option("mode"), std::to_string(static_cast<int>(o.mode)), "is not a mode", "Mode::automatic, shared or per_rank");
  if (o.scope != Scope::global && o.scope != Scope::node)
    return bad(option("scope"), std::to_string(static_cast<int>(o.scope)), "is not a scope", "Scope::global or node");
  if (o.resume != Resume::never && o.resume != Resume::allow && o.resume != Resume::must)
    return bad(option("resume"), std::to_string(static_cast<int>(o.resume)), "is not a resume policy",
               "Resume::never, allow or must");
  if (o.overflow != Overflow::block && o.overflow != Overflow::drop_newest)
    return bad(option("overflow"), std::to_string(static_cast<int>(o.overflow)), "is not a policy",
               "Overflow::block or drop_newest");
  for (auto [field, name] : {std::pair{&Options::init_timeout, "init_timeout"},
                             std::pair{&Options::finish_timeout, "finish_timeout"},
                             std::pair{&Options::upload_timeout, "upload_timeout"},
                             std::pair{&Options::barrier_timeout, "barrier_timeout"},
                             std::pair{&Options::heartbeat_interval, "heartbeat_interval"},
                             std::pair{&Options::connection_timeout, "connection_timeout"}})
    if ((o.*field).count() <= 0)
      return bad(option(name), std::to_string((o.*field).count()) + " ms", "is not positive", "a duration above 0");
  if (o.stall_after.count() < 0)
    return bad(option("stall_after"), std::to_string(o.stall_after.count()) + " ms", "is negative",
               "a duration of 0 (off) or more");
  // A peer probed less often than the silence allowed would be dropped between probes.
  if (o.connection_timeout <= o.heartbeat_interval) {
    // Named as it was set: from the environment (in seconds) or in Options.
    const bool env = o.connection_timeout != given.connection_timeout || o.heartbeat_interval != given.heartbeat_interval;
    const auto secs = [](std::chrono::milliseconds d) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", static_cast<double>(d.count()) / 1000.0);
      return std::string(buf);
    };
    if (env)
      return bad(variable("CHORUS_CONNECTION_TIMEOUT"), secs(o.connection_timeout),
                 "is not longer than the heartbeat interval (CHORUS_HEARTBEAT_INTERVAL, " + secs(o.heartbeat_interval) +
                     " s)",
                 "seconds, more than the heartbeat interval");
    return bad(option("connection_timeout"), std::to_string(o.connection_timeout.count()) + " ms",
               "is not longer than heartbeat_interval (" + std::to_string(o.heartbeat_interval.count()) + " ms)",
               "a duration longer than heartbeat_interval");
  }
  if (o.queue_capacity < min_queue || o.queue_capacity > max_queue)
    return bad(option("queue_capacity"), std::to_string(o.queue_capacity), "is out of range",
               "1024 to 67108864 values");
  if (!std::isfinite(o.system_interval) || (o.system_interval != 0 && (o.system_interval < 0.1 || o.system_interval > 1e9)))
    return bad(option("system_interval"), std::to_string(o.system_interval), "is out of range",
               "seconds, 0 (off) or at least 0.1");
  if (!o.upload.empty()) {
    // The scheme and the credentials are checked here; the rest of the URL
    // where the upload starts (upload::UploadTarget::parse), which names it.
    const Origin where = o.upload != given.upload ? variable("CHORUS_UPLOAD") : option("upload");
    UploadUrl url;
    switch (UploadUrl::parse(o.upload, url)) {
    case UploadUrl::Problem::no_scheme:
    case UploadUrl::Problem::unknown_scheme:
    case UploadUrl::Problem::empty:
      return bad(where, shown_upload_url(o.upload), "is not an upload target",
                 upload_url_forms(false) + " (" + upload_other_protocols() + " for the other protocol)");
    case UploadUrl::Problem::credentials:
      return bad(where, url.masked(), "has credentials in it (they would be written into the run's files)",
                 "the URL without them, and the key where its backend reads it: " + upload_credentials());
    case UploadUrl::Problem::none:
    case UploadUrl::Problem::no_host: break;
    }
  }
  if (o.upload_buffer < (64u << 10) || o.upload_buffer > (std::size_t{1} << 30))
    return bad(option("upload_buffer"), std::to_string(o.upload_buffer), "is out of range", "64 KiB to 1 GiB");
  if (o.dir.find('\0') != std::string::npos) return bad(option("dir"), o.dir, "contains a NUL byte", "a path");
  return {};
}

Error check_topology(const Topology& t) {
  const auto fail = [&](std::string why) {
    return Error(Errc::invalid_argument, "Options::topology is inconsistent: " + why +
                                             ". Leave Options::topology unset to read the launcher's environment.");
  };
  if (t.world_size < 1) return fail("world_size " + std::to_string(t.world_size) + " is below 1");
  if (t.rank < 0 || t.rank >= t.world_size) return fail("rank " + std::to_string(t.rank) + " is not in [0, world_size)");
  if (t.local_world_size < 1 || t.local_world_size > t.world_size)
    return fail("local_world_size " + std::to_string(t.local_world_size) + " is not in [1, world_size]");
  if (t.local_rank < 0 || t.local_rank >= t.local_world_size)
    return fail("local_rank " + std::to_string(t.local_rank) + " is not in [0, local_world_size)");
  if (t.num_nodes < 1 || t.num_nodes > t.world_size)
    return fail("num_nodes " + std::to_string(t.num_nodes) + " is not in [1, world_size]");
  if (t.node_rank < 0 || t.node_rank >= t.num_nodes)
    return fail("node_rank " + std::to_string(t.node_rank) + " is not in [0, num_nodes)");
  if (t.num_nodes == 1 && t.local_world_size != t.world_size)
    return fail("local_world_size " + std::to_string(t.local_world_size) + " differs from world_size " +
                std::to_string(t.world_size) + " on a single node (num_nodes 1)");
  if (t.master_port < 0 || t.master_port > 65535)
    return fail("master_port " + std::to_string(t.master_port) + " is not in [0, 65535]");
  return {};
}

/// Keeps the characters a run id may hold; the rest become '-'.
std::string id_chars(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (!id_char(c)) c = '-';
  return out;
}

/// The group every rank of a job derives alike, named so that a person can
/// tell jobs apart: the launcher, then its job id (`chorus launch` makes one
/// up that starts with the launch's date and time), else where the job meets
/// (FNV-1a of MASTER_ADDR, MASTER_PORT and WORLD_SIZE); for a single process,
/// its run id or "default". Never a rank's own clock: ranks would disagree.
std::string derive_group(const Topology& t, const std::string& run_id) {
  const std::string launcher = t.launcher.empty() || t.launcher == "none" ? "job" : id_chars(t.launcher);
  if (!t.job_id.empty()) return (launcher + "-" + id_chars(t.job_id)).substr(0, max_name_bytes);
  if (t.world_size > 1) {
    const std::uint64_t h =
        fnv1a64(t.master_addr + '\0' + std::to_string(t.master_port) + '\0' + std::to_string(t.world_size));
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(h & 0xffffffffu));
    return launcher + "-" + hex;
  }
  return run_id.empty() ? "default" : run_id;
}

/// The ports a job's id maps to where nothing names its run host's port:
/// below Linux's default ephemeral range (32768-60999), from which any
/// outgoing connection may take its local end and so hold the port, and
/// below torchrun's rendezvous (29400) and store (29500) ports. Their count
/// is a prime, so that numeric job ids less than that far apart (Slurm's
/// come one after another) never share a port.
constexpr unsigned job_ports_first = 20000, job_ports = 9397;
/// Steps of one job are this far apart among the job ports: near the count
/// over the golden ratio, so that no small multiple of it lands near a
/// neighbouring job's port.
constexpr std::uint64_t step_stride = 5807;

/// A job id or step as a number: itself where it is one, else its hash.
std::uint64_t id_number(std::string_view id) {
  std::uint64_t n = 0;
  auto [p, ec] = std::from_chars(id.data(), id.data() + id.size(), n);
  return ec == std::errc() && p == id.data() + id.size() ? n : fnv1a64(id);
}

/// The run host's port derived from the launcher's job id and step: every
/// rank of a job reads the same id and step, so each derives the same port
/// without a word between them, and two jobs on one node get different ones.
std::uint16_t job_port(const Topology& t) {
  const std::uint64_t step = t.job_step.empty() ? 0 : id_number(t.job_step) % job_ports;
  return static_cast<std::uint16_t>(job_ports_first + (id_number(t.job_id) % job_ports + step * step_stride) % job_ports);
}

/// The job a port was derived from, as messages name it.
std::string job_name(const Topology& t) {
  const auto cut = [](const std::string& id) { return id.size() > 64 ? id.substr(0, 64) + "..." : id; };
  return t.launcher + " job " + cut(t.job_id) + (t.job_step.empty() ? std::string() : " step " + cut(t.job_step));
}

} // namespace

Result<Settings> resolve(const Options& opts, const Env& env) {
  Settings s;
  s.opts = opts;
  Options& o = s.opts;
  if (opts.read_env)
    if (Error e = apply_env(o, env)) return e;
  if (Error e = check_options(o, opts)) return e;

  if (opts.topology) {
    if (Error e = check_topology(*opts.topology)) return e;
    s.topo = *opts.topology;
  } else {
    Result<Topology> detected = detect_topology(env);
    if (!detected) return detected.error();
    s.topo = std::move(*detected);
  }
  const Topology& t = s.topo;
  o.topology = t;

  // Every rank must agree on the directory, so it is made absolute here.
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::absolute(o.dir.empty() ? "chorus-runs" : o.dir, ec);
  if (ec) {
    return Error(Errc::io_error, "cannot make the run directory '" + o.dir + "' absolute: " + ec.message() +
                                      ". Set CHORUS_DIR to an absolute path");
  }
  dir = dir.lexically_normal();
  if (!dir.has_filename() && dir.has_parent_path() && dir != dir.root_path()) dir = dir.parent_path();
  o.dir = dir.string();

  if (o.group.empty()) o.group = derive_group(t, o.run_id);

  const bool node = o.scope == Scope::node;
  std::string suffix;
  switch (o.mode) {
  case Mode::automatic:
    s.active = node ? t.local_rank == 0 : t.rank == 0;
    s.is_host = s.active;
    s.run_rank = 0;
    s.run_world = 1;
    if (node) suffix = "-node-" + std::to_string(t.node_rank);
    break;
  case Mode::shared:
    s.active = true;
    s.is_host = node ? t.local_rank == 0 : t.rank == 0;
    s.run_rank = node ? t.local_rank : t.rank;
    s.run_world = node ? t.local_world_size : t.world_size;
    if (node) suffix = "-node-" + std::to_string(t.node_rank);
    break;
  case Mode::per_rank:
    s.active = true;
    s.is_host = true;
    s.run_rank = 0;
    s.run_world = 1;
    suffix = "-rank-" + std::to_string(t.rank);
    break;
  }
  if (!o.run_id.empty()) o.run_id += suffix;
  s.run_name = o.name.empty() ? (suffix.empty() ? std::string() : o.group + suffix) : o.name + suffix;

  // torchrun's own store listens on MASTER_PORT, so the run host takes the next one.
  unsigned port = o.port;
  if (port == 0 && t.master_port == 65535) {
    return Error(Errc::bad_environment, "MASTER_PORT=65535 leaves no port for the run host, which listens on "
                                         "MASTER_PORT+1: set CHORUS_PORT to a free port on every rank");
  }
  if (port == 0 && t.master_port > 0) port = static_cast<unsigned>(t.master_port) + 1;
  // Without either, two jobs on one node (mpirun, srun, mpiexec name no
  // port) would meet on the default port: the host of the second could not
  // listen, and its ranks would join the first job's run.
  if (port == 0 && !t.job_id.empty()) {
    port = job_port(t);
    s.port_job = job_name(t);
  }
  // A job of Hydra (MPICH's mpiexec) across nodes has no id to derive it
  // from: Hydra names none, and its proxy names the job only on one node
  // (hydra_job in topology.cpp). Two such jobs sharing nodes would meet on
  // the default port, so it is refused where the job's processes meet: a run
  // of several ranks, or a group of several runs.
  const int runs = o.mode == Mode::per_rank ? t.world_size : node ? t.num_nodes : 1;
  if (port == 0 && t.job_id.empty() && t.launcher == "mpich" && t.num_nodes > 1 && (s.run_world > 1 || runs > 1)) {
    return Error(Errc::bad_environment,
                  "MPICH's Hydra (mpiexec) names no job id, so a job across " + std::to_string(t.num_nodes) +
                      " nodes cannot be told from another job on the same nodes: set CHORUS_PORT to the same free "
                      "port on every rank of the job (and MASTER_ADDR to global rank 0's host)");
  }
  if (port == 0) port = default_port;
  const unsigned base_port = port;
  // Node runs may share one machine (a simulated cluster): each node gets its own port.
  if (o.mode == Mode::shared && node) port += static_cast<unsigned>(t.node_rank);
  if (port > 65535) {
    return Error(Errc::bad_environment, "the run host of node " + std::to_string(t.node_rank) + " would listen on port " +
                                             std::to_string(port) + " (the base port plus the node index), past 65535: "
                                             "set CHORUS_PORT lower");
  }
  s.port = static_cast<std::uint16_t>(port);

  // Several runs make a group, kept by global rank 0. Its port is the base
  // port, or the one after the nodes' where node runs listen.
  if (runs > 1) {
    const unsigned group_port = base_port + (o.mode == Mode::shared && node ? static_cast<unsigned>(t.num_nodes) : 0u);
    if (group_port > 65535) {
      return Error(Errc::bad_environment, "the job's group would listen on port " + std::to_string(group_port) +
                                               " (the base port plus the number of nodes), past 65535: set "
                                               "CHORUS_PORT lower");
    }
    s.group_size = runs;
    s.group_index = o.mode == Mode::per_rank ? t.rank : t.node_rank;
    s.group_port = static_cast<std::uint16_t>(group_port);
    s.group_address = t.num_nodes <= 1 ? std::string("127.0.0.1") : !o.host_address.empty() ? o.host_address : t.master_addr;
  }

  // A run within a node, or a job on one node, is hosted on this machine (the
  // host then listens on loopback only); across nodes, rank 0 is at MASTER_ADDR.
  if (node || t.num_nodes <= 1) {
    s.host_address = !node && !o.host_address.empty() ? o.host_address : "127.0.0.1";
  } else {
    s.host_address = !o.host_address.empty() ? o.host_address : t.master_addr;
    if (s.host_address.empty() && o.mode == Mode::shared) {
      return Error(Errc::bad_environment,
                    "a shared run across " + std::to_string(t.num_nodes) + " nodes needs the address of global rank 0, "
                    "and the launcher (" + t.launcher + ") does not give it: set MASTER_ADDR to rank 0's host on "
                    "every rank, or Options::host_address");
    }
  }
  return s;
}

std::string port_name(const Settings& s, std::uint16_t port) {
  return "CHORUS_PORT " + std::to_string(port) + (s.port_job.empty() ? std::string() : ", derived from the " + s.port_job);
}

namespace {

/// job_identity's fields, in order: "job" is the launcher's job (or where it
/// meets), the rest what every rank of it must agree on.
constexpr std::string_view identity_fields[] = {"job", "project", "group", "ranks", "mode", "scope", "run id"};

/// The value of `field` in an identity ("" where it has none).
std::string_view field_of(std::string_view identity, std::string_view field) {
  for (std::size_t at = 0; at < identity.size();) {
    std::size_t end = identity.find('\n', at);
    if (end == std::string_view::npos) end = identity.size();
    const std::string_view line = identity.substr(at, end - at);
    if (line.size() > field.size() && line.starts_with(field) && line[field.size()] == '=')
      return line.substr(field.size() + 1);
    at = end + 1;
  }
  return {};
}

/// Where a field that ranks disagree on is set, to say how to fix it.
std::string_view set_by(std::string_view field) {
  if (field == "project") return "chorus.init(project=...), Options::project or CHORUS_PROJECT";
  if (field == "group") return "Options::group or CHORUS_GROUP (or leave it to the launcher's job)";
  if (field == "ranks") return "WORLD_SIZE, and the mode and scope";
  if (field == "mode") return "Options::mode or CHORUS_MODE";
  if (field == "scope") return "Options::scope or CHORUS_SCOPE";
  return "Options::run_id or CHORUS_RUN_ID";
}

} // namespace

std::string job_identity(const Settings& s) {
  const Topology& t = s.topo;
  std::string job;
  if (!t.job_id.empty())
    job.append(t.launcher).append(" job ").append(t.job_id).append(t.job_step.empty() ? "" : "." + t.job_step);
  else
    job.append("the job meeting at ").append(t.master_addr).append(":").append(std::to_string(t.master_port));
  const std::string values[] = {job,
                                s.opts.project,
                                s.opts.group,
                                std::to_string(s.run_world),
                                std::string(to_string(s.opts.mode)),
                                std::string(to_string(s.opts.scope)),
                                s.opts.run_id};
  std::string out;
  for (std::size_t i = 0; i < std::size(identity_fields); ++i) {
    // A value holds no newline (names are checked), so each line is one field.
    std::string v = values[i];
    for (char& c : v)
      if (c == '\n') c = ' ';
    if (i != 0) out.push_back('\n');
    out.append(identity_fields[i]).append("=").append(v);
  }
  return out;
}

std::string job_text(std::string_view identity) {
  std::string out;
  out.append("project ").append(field_of(identity, "project"));
  out.append(", group ").append(field_of(identity, "group"));
  out.append(", ").append(field_of(identity, "ranks")).append(" ranks");
  out.append(", mode ").append(field_of(identity, "mode"));
  out.append(", scope ").append(field_of(identity, "scope"));
  if (const std::string_view id = field_of(identity, "run id"); !id.empty()) out.append(", run id ").append(id);
  if (const std::string_view job = field_of(identity, "job"); !job.empty()) out.append("; ").append(job);
  return out;
}

std::string job_disagreement(std::string_view theirs, std::string_view ours) {
  const std::string_view job = field_of(ours, "job");
  if (job.empty() || field_of(theirs, "job") != job) return {};
  std::string out;
  for (std::string_view field : identity_fields) {
    if (field == "job" || field_of(theirs, field) == field_of(ours, field)) continue;
    if (!out.empty()) out.append("; ");
    out.append(field).append(" \"").append(field_of(theirs, field)).append("\" there, \"");
    out.append(field_of(ours, field)).append("\" on the run host (set by ").append(set_by(field)).append(")");
  }
  return out;
}

} // namespace chorus::core
