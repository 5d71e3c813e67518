#include "io/store/lease.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/store/history_row.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace chorus::store {
namespace {

using simdjson::SUCCESS;

std::string lease_path(const std::string& run_dir) { return run_dir + "/" + std::string(lease_file); }

// Unix seconds as microseconds; none for what is no number a calendar holds.
std::optional<std::int64_t> time_us(simdjson::dom::element v) {
  double d = 0;
  if (v.get(d) != SUCCESS || !std::isfinite(d) || std::fabs(d) >= static_cast<double>(INT64_MAX / 1'000'000))
    return std::nullopt;
  return std::llround(d * 1e6);
}

// Whether some process holds a lock on the file `st` names, from /proc/locks
// (lines like "1: FLOCK  ADVISORY  WRITE 5887 fe:00:10953153 0 EOF"). Asking
// there, rather than trying the lock, never gets in a starting host's way.
std::optional<bool> locked(const struct stat& st) {
  std::ifstream in("/proc/locks");
  if (!in) return std::nullopt;
  for (std::string line; std::getline(in, line);) {
    unsigned maj = 0, min = 0;
    unsigned long long ino = 0;
    for (std::size_t at = 0; (at = line.find(':', at)) != std::string::npos; ++at) {
      const std::size_t start = line.rfind(' ', at);
      if (start == std::string::npos) continue;
      if (std::sscanf(line.c_str() + start + 1, "%x:%x:%llu", &maj, &min, &ino) == 3 && maj == ::major(st.st_dev) &&
          min == ::minor(st.st_dev) && ino == st.st_ino)
        return true;
    }
  }
  return false;
}

std::string host_named(const std::string& host, std::int64_t pid) {
  std::string s = "its host (pid ";
  s.append(std::to_string(pid)).append(" on ").append(host.empty() ? "an unknown machine" : host).append(")");
  return s;
}

// "2025-11-28 00:57:03 UTC".
std::string utc_text(std::int64_t us) {
  const std::time_t t = static_cast<std::time_t>(us / 1'000'000);
  std::tm tm{};
  char buf[64] = "?";
  if (::gmtime_r(&t, &tm) != nullptr) std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// On the run host's own machine: its WAL lock, else its pid. Unknown where neither tells.
Liveness on_its_machine(const RunIdentity& run, const std::string& run_dir) {
  // The reader is the host itself (its Uploader): no need to ask /proc.
  if (run.pid == static_cast<std::int64_t>(::getpid())) return {HostLife::alive, {}, {}};
  const std::string wal = run_dir + "/wal";
  struct stat st {};
  if (::lstat(wal.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    if (const std::optional<bool> held = locked(st)) {
      // The lock goes with the process, whatever its lease says: the stronger sign.
      if (*held) return {HostLife::alive, {}, {}};
      std::string why = host_named(run.host, run.pid);
      why.append(" no longer holds the run's write-ahead log (").append(wal).append("): it died");
      return {HostLife::gone, std::move(why), {}};
    }
  }
  if (run.pid > 0 && run.pid <= std::numeric_limits<pid_t>::max()) {
    if (::kill(static_cast<pid_t>(run.pid), 0) == 0 || errno == EPERM) return {HostLife::alive, {}, {}};
    return {HostLife::gone, host_named(run.host, run.pid) + " is no longer running: it died", {}};
  }
  return {};
}

} // namespace

Lease lease_now(std::int64_t now_us) {
  return {platform::this_host(), static_cast<std::int64_t>(::getpid()), now_us,
          now_us + std::chrono::duration_cast<std::chrono::microseconds>(lease_expiry).count()};
}

Error renew_lease(const std::string& run_dir, const Lease& lease) {
  std::string text;
  core::JsonWriter w(text);
  w.begin_object().key("host").string(lease.host).key("pid").integer(lease.pid);
  w.key("renewed").seconds(lease.renewed_us).key("interval").integer(lease_interval.count());
  w.key("expires").seconds(lease.expires_us).end_object();
  text.push_back('\n');
  return platform::write_file_atomic(lease_path(run_dir), text, /*durable=*/false);
}

void end_lease(const std::string& run_dir) {
  // Gone already (a run of an earlier version, or ended twice): nothing to do.
  (void)::unlink(lease_path(run_dir).c_str());
}

Result<std::optional<Lease>> read_lease(const std::string& run_dir) {
  const std::string path = lease_path(run_dir);
  const Result<std::string> text = platform::read_text(path, /*missing_ok=*/true, 1u << 16);
  if (!text) return text.error();
  if (text->empty()) {
    // read_text gives "" for a missing file; an empty one that is there is damaged.
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return std::optional<Lease>();
  }
  const auto damaged = [&](std::string what) {
    std::string msg = path + " " + what +
                      ": it is damaged. Its run host rewrites it every " + std::to_string(lease_interval.count()) +
                      " s while it lives; where none does, `chorus recover " + run_dir + "` ends the run";
    return Error(Errc::io_error, std::move(msg));
  };
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (const auto e = parser.parse(text->data(), text->size()).get(doc))
    return damaged(std::string("is not valid JSON (") + simdjson::error_message(e) + ")");
  simdjson::dom::object o;
  if (doc.get(o) != SUCCESS) return damaged("is not a JSON object");
  Lease l;
  std::string_view host;
  if (o["host"].get(host) != SUCCESS) return damaged("has no \"host\" string");
  l.host = host;
  if (o["pid"].get(l.pid) != SUCCESS) return damaged("has no whole \"pid\"");
  simdjson::dom::element v;
  std::optional<std::int64_t> renewed, expires;
  if (o["renewed"].get(v) == SUCCESS) renewed = time_us(v);
  if (o["expires"].get(v) == SUCCESS) expires = time_us(v);
  if (!renewed) return damaged("has no \"renewed\" time (unix seconds)");
  if (!expires) return damaged("has no \"expires\" time (unix seconds)");
  l.renewed_us = *renewed;
  l.expires_us = *expires;
  return std::optional<Lease>(std::move(l));
}

Liveness host_liveness(const RunIdentity& run, const std::string& run_dir, std::int64_t now_us) {
  Result<std::optional<Lease>> read = read_lease(run_dir);
  std::optional<Lease> lease = read ? std::move(*read) : std::nullopt;
  // A lease of another host or process: an earlier attempt's, not this one's.
  if (lease && !run.host.empty() && run.pid > 0 && (lease->host != run.host || lease->pid != run.pid))
    lease.reset();
  if (!run.host.empty() && run.host == platform::this_host()) {
    Liveness here = on_its_machine(run, run_dir);
    here.lease = lease;
    if (here.life != HostLife::unknown) return here;
  }
  if (!read) return {HostLife::unknown, read.error().message(), {}};
  if (!lease) return {};
  if (now_us <= lease->expires_us) return {HostLife::alive, {}, lease};
  const std::int64_t ago_s = (now_us - lease->renewed_us) / 1'000'000;
  std::string why = host_named(lease->host, lease->pid);
  why.append(" stopped renewing its lease at ").append(utc_text(lease->renewed_us)).append(", ");
  why.append(std::to_string(ago_s)).append(" s ago: it died or hangs");
  return {HostLife::gone, std::move(why), lease};
}

std::optional<std::int64_t> last_committed_step(const std::string& run_dir) {
  const Result<std::string> text = platform::read_text(run_dir + "/summary.json", /*missing_ok=*/true);
  if (!text || text->empty()) return std::nullopt;
  simdjson::dom::parser parser;
  simdjson::dom::object doc;
  if (parser.parse(text->data(), text->size()).get(doc) != SUCCESS) return std::nullopt;
  const HistoryRow last(doc); // the last row's own fields, as a row has them
  if (!last) return std::nullopt;
  return last.step();
}

namespace {

/// The files of an ended run that are shorter than its run.json records
/// them (or, for a file replaced whole, of another length), and what to do;
/// "" where none is. Only the files a run's end writes are looked at: never
/// a path that run.json names.
std::string cut_files(const RunRecord& r, const std::string& run_dir) {
  std::string cut;
  for (const auto& length : r.lengths) {
    // Named, not bound: clang before 16 cannot capture a structured binding in a lambda.
    const std::string& name = length.first;
    const std::uint64_t recorded = length.second;
    const auto* b = std::find_if(std::begin(backed_files), std::end(backed_files),
                                 [&](const BackedFile& f) { return f.name == name; });
    if (b == std::end(backed_files)) continue;
    const std::optional<std::uint64_t> size = file_length(run_dir, name);
    if (size && (b->replaced ? *size == recorded : *size >= recorded)) continue;
    cut.append(cut.empty() ? "" : ", ").append(name);
    if (size)
      cut.append(" holds ").append(std::to_string(*size)).append(" bytes, not the ");
    else
      cut.append(" is missing, not ");
    cut.append(std::to_string(recorded)).append(" the run's end wrote");
  }
  if (!cut.empty())
    cut.append(" (the machine stopped before they reached its disk): `chorus recover ")
        .append(run_dir)
        .append("` rebuilds them from the run's write-ahead log");
  return cut;
}

} // namespace

Liveness apply_liveness(RunRecord& r, const std::string& run_dir, std::int64_t now_us) {
  if (r.state != "running") {
    Liveness ended;
    if (!r.lengths.empty()) ended.cut = cut_files(r, run_dir);
    if (!ended.cut.empty()) r.error = r.error ? *r.error + "; " + ended.cut : ended.cut;
    return ended;
  }
  Liveness l = host_liveness(r, run_dir, now_us);
  if (l.life != HostLife::gone) return l;
  const std::optional<std::int64_t> step = last_committed_step(run_dir);
  const std::optional<std::int64_t> end = l.lease ? std::optional(l.lease->renewed_us) : std::nullopt;
  r.state = "crashed";
  if (!r.end_us) r.end_us = end;
  if (!r.segments.empty() && r.segments.back().state == "running") {
    r.segments.back().state = "crashed";
    if (!r.segments.back().end_us) r.segments.back().end_us = end;
  }
  std::string lost = "its run host (pid ";
  lost.append(std::to_string(r.pid)).append(" on ").append(r.host.empty() ? "an unknown machine" : r.host);
  lost.append(") was lost");
  for (RunRecord::Rank& k : r.ranks) {
    if (k.state != "running") continue;
    k.state = "crashed";
    if (step && *step > k.last_step) k.last_step = *step;
    k.message = k.message.empty() ? lost : lost + "; " + k.message;
  }
  if (!r.error) {
    std::string error = l.why;
    if (step)
      error.append("; last committed step ").append(std::to_string(*step));
    else
      error.append("; no step was committed");
    error.append("; `chorus recover ").append(run_dir).append("` rebuilds the run's files");
    r.error = std::move(error);
  }
  return l;
}

Result<RunRecord> read_run_record(const std::string& run_dir, Liveness* liveness) {
  Result<RunRecord> r = RunRecord::read(run_dir + "/run.json");
  if (!r) return r;
  Liveness l = apply_liveness(*r, run_dir, platform::unix_now_us());
  if (liveness) *liveness = std::move(l);
  return r;
}

} // namespace chorus::store
