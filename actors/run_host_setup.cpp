// The run host's preparation: see actors/run_host_setup.hpp.
#include "actors/run_host_setup.hpp"
#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/platform/random.hpp"
#include "io/store/run_record.hpp"
#include "io/store/wal.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <sstream>

namespace chorus::actors {

using platform::this_host;
using platform::unix_now_us;

namespace {

/// Eight random base-36 digits: from the kernel's random source (one call,
/// no generator to seed), else from the time and the process id.
std::string new_run_id() {
  static constexpr char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::uint64_t bits = 0;
  if (platform::random_bytes(&bits, sizeof bits, "a run id")) {
    bits = static_cast<std::uint64_t>(unix_now_us()) ^ static_cast<std::uint64_t>(::getpid()) << 40;
    bits = (bits ^ (bits >> 30)) * 0xbf58476d1ce4e5b9u; // splitmix64's finalizer
    bits = (bits ^ (bits >> 27)) * 0x94d049bb133111ebu;
    bits ^= bits >> 31;
  }
  std::string id(8, '0');
  for (char& c : id) {
    c = digits[bits % 36];
    bits /= 36;
  }
  return id;
}

std::string identity_json(const core::Settings& s, const std::string& id, const std::string& dir, std::int64_t start_us) {
  store::RunRecord r;
  r.id = id;
  r.name = s.run_name.empty() ? id : s.run_name;
  r.project = s.opts.project;
  r.group = s.opts.group;
  r.job_type = s.opts.job_type;
  r.notes = s.opts.notes;
  r.mode = to_string(s.opts.mode);
  r.scope = to_string(s.opts.scope);
  r.host = this_host();
  r.pid = ::getpid();
  r.dir = dir;
  r.launcher = s.topo.launcher;
  r.job_id = s.topo.job_id;
  r.nodes = s.topo.num_nodes;
  r.start_us = start_us;
  if (s.group_size > 0) {
    // Its place in the job's group, the global rank of its first place, its node.
    r.group_index = s.group_index;
    r.rank = s.topo.rank;
    r.node = s.topo.node_rank;
  }
  return r.identity_json();
}

/// Whether a run directory that exists (or not) may be used under
/// Options::resume; marks `host` resumed where its run goes on.
Error check_resume(const Options& o, RunHost& host) {
  if (o.resume == Resume::must && o.run_id.empty())
    return {Errc::invalid_argument, "CHORUS_RESUME=must continues a run named by its id, and no run id is set: set "
                                    "CHORUS_RUN_ID (Options::run_id) to the id of the run to resume"};
  std::error_code ec;
  const bool exists = std::filesystem::exists(host.run_dir, ec);
  if (exists && o.resume == Resume::never)
    return {Errc::invalid_argument, "run directory " + host.run_dir +
                                        " already exists: run ids must be unique; choose another run_id "
                                        "(CHORUS_RUN_ID) or leave it unset, or set CHORUS_RESUME=allow "
                                        "(Options::resume) to continue that run"};
  if (!exists && o.resume == Resume::must)
    return {Errc::invalid_argument, "CHORUS_RESUME=must, but there is no run " + host.run_id + " to resume (no " +
                                        host.run_dir + "): check CHORUS_RUN_ID, CHORUS_DIR, CHORUS_PROJECT and "
                                        "CHORUS_GROUP, or set CHORUS_RESUME=allow to start the run if it is new"};
  host.resumed = exists;
  return {};
}

/// The runs named `id` in the project's other groups than `group`: a run id
/// names one run in a project, whatever job (and so group) made it.
std::vector<std::filesystem::path> same_id_elsewhere(const Options& o, const std::string& id) {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  const std::filesystem::path project = std::filesystem::path(o.dir) / o.project;
  for (std::filesystem::directory_iterator it(project, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() == o.group || !it->is_directory(ec)) continue;
    if (std::filesystem::is_directory(it->path() / id, ec)) found.push_back(it->path() / id);
  }
  std::sort(found.begin(), found.end());
  return found;
}

/// Where the run id names a run of another group of the project (a
/// requeued job whose launcher gave it a new job id, and so a new group):
/// under Options::resume allow or must it is that run that goes on (its
/// directory and group in `dir` and `group`); under never it is refused, as
/// an id used twice. Returns why the run cannot start, if it cannot.
Error find_by_id(const core::Settings& s, const std::string& id, std::string& dir, std::string& group) {
  const Options& o = s.opts;
  std::error_code ec;
  if (o.run_id.empty() || std::filesystem::exists(dir, ec)) return {};
  const std::vector<std::filesystem::path> found = same_id_elsewhere(o, id);
  if (found.empty()) return {};
  if (o.resume == Resume::never)
    return {Errc::invalid_argument, "run id " + id + " is taken in project " + o.project + " by " + found.front().string() +
                                        ": a run id names one run in a project; choose another run_id (CHORUS_RUN_ID) "
                                        "or leave it unset, or set CHORUS_RESUME=allow (Options::resume) to continue "
                                        "that run"};
  std::string where;
  for (const auto& f : found) where.append(where.empty() ? "" : ", ").append(f.string());
  if (found.size() > 1)
    return {Errc::invalid_argument, "run id " + id + " names " + std::to_string(found.size()) + " runs in project " +
                                        o.project + " (" + where + "): set CHORUS_GROUP (Options::group) to the group "
                                        "of the one to continue"};
  const std::string other = found.front().parent_path().filename().string();
  if (s.group_size > 0)
    return {Errc::invalid_argument, "run id " + id + " names the run " + where + " of group " + other + ", and this "
                                        "job's runs form group " + o.group + ": set CHORUS_GROUP=" + other +
                                        " (Options::group) on every rank so that the job's runs continue together"};
  dir = found.front().string();
  group = other;
  return {};
}

} // namespace

Result<std::shared_ptr<RunHost>> prepare_run_host(const core::Settings& s, client::FinishState& finish) {
  auto host = std::make_shared<RunHost>();
  host->settings = s;
  host->run_id = s.opts.run_id.empty() ? new_run_id() : s.opts.run_id;
  host->run_dir = (std::filesystem::path(s.opts.dir) / s.opts.project / s.opts.group / host->run_id).string();
  host->start_us = unix_now_us();
  // A requeued job may derive another group: its run id finds its run.
  std::string group = s.opts.group;
  if (Error e = find_by_id(s, host->run_id, host->run_dir, group)) return e;
  if (Error e = check_resume(s.opts, *host)) return e;
  if (Error e = platform::make_dirs(host->run_dir)) return e;
  Result<std::unique_ptr<store::WalWriter>> wal = store::WalWriter::open(host->run_dir + "/wal");
  if (!wal) return wal.error();
  host->wal = std::move(*wal);
  // The run's identity names the group it is in; the job's identity (what
  // its ranks' joins must match) stays what they derived.
  core::Settings in_group = s;
  in_group.opts.group = group;
  host->run_json = identity_json(in_group, host->run_id, host->run_dir, host->start_us);
  host->job = core::job_identity(s);
  host->finish = &finish;
  return host;
}

/// Under `chorus launch`, tells it where this run lives (one line appended to
/// the file CHORUS_LAUNCH_RUNS names), so that it can add the ranks' exit
/// codes to run.json once they have exited. The line is "RANK<TAB>DIR": a
/// per-rank run takes its own rank's code only, "*" every rank launch started.
void note_run_for_launcher(const core::Settings& s, const std::string& run_dir) {
  const char* file = s.opts.read_env ? std::getenv("CHORUS_LAUNCH_RUNS") : nullptr;
  if (file == nullptr || *file == '\0') return;
  const int fd = ::open(file, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return; // launch is gone or made none: nothing to tell
  std::string line = s.opts.mode == Mode::per_rank ? std::to_string(s.topo.rank) : std::string("*");
  line.append("\t").append(run_dir).append("\n");
  const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  (void)written; // best effort: without the line, launch reports the codes as missing
}

/// Where `chorus launch` started this rank: why the run host's process is
/// known to have exited (its rank is in the launch's CHORUS_LAUNCH_EXITS
/// file, "RANK CODE" a line), else "".
std::string launched_host_exit(const core::Settings& s) {
  const char* file = s.opts.read_env ? std::getenv("CHORUS_LAUNCH_EXITS") : nullptr;
  if (file == nullptr || *file == '\0') return {};
  const Result<std::string> text = platform::read_text(file, true, 1 << 20);
  if (!text) return {};
  // The run's places are consecutive global ranks; its host holds the first.
  const int host = s.topo.rank - s.run_rank;
  std::istringstream lines(*text);
  for (int rank = 0, code = 0; lines >> rank >> code;)
    if (rank == host)
      return "the run host (rank " + std::to_string(host) + ") exited with code " + std::to_string(code) +
             " before this rank joined, as chorus launch saw: see that rank's output for why";
  return {};
}

} // namespace chorus::actors
