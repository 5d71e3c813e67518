// The run host's preparation: see actors/run_host_setup.hpp.
#include "actors/run_host_setup.hpp"
#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/store/run_record.hpp"
#include "io/store/wal.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <random>
#include <sstream>

namespace chorus::detail {

using io::detail::this_host;
using io::detail::unix_now_us;

namespace {

std::string new_run_id() {
  static constexpr char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::random_device rd;
  std::mt19937_64 gen((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(unix_now_us()));
  std::string id(8, '0');
  for (char& c : id) c = digits[gen() % 36];
  return id;
}

std::string identity_json(const Settings& s, const std::string& id, const std::string& dir, std::int64_t start_us) {
  io::RunRecord r;
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

// SIGINT and SIGTERM make the run host's WAL durable before the process
// goes: appends are already in the kernel, fdatasync puts them on disk. Only
// a default disposition is replaced, so a trainer's own handlers stay in
// charge; the handler restores the previous disposition and re-raises.
std::atomic<int> signal_wal_fd{-1};
struct sigaction previous_sigint, previous_sigterm;

extern "C" void sync_wal_and_reraise(int sig) {
  const int saved_errno = errno;
  if (int fd = signal_wal_fd.load(std::memory_order_relaxed); fd >= 0) ::fdatasync(fd);
  ::sigaction(sig, sig == SIGINT ? &previous_sigint : &previous_sigterm, nullptr);
  ::raise(sig);
  errno = saved_errno;
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

} // namespace

Result<std::shared_ptr<RunHost>> prepare_run_host(const Settings& s, FinishState& finish) {
  auto host = std::make_shared<RunHost>();
  host->settings = s;
  host->run_id = s.opts.run_id.empty() ? new_run_id() : s.opts.run_id;
  host->run_dir = (std::filesystem::path(s.opts.dir) / s.opts.project / s.opts.group / host->run_id).string();
  host->start_us = unix_now_us();
  if (Error e = check_resume(s.opts, *host)) return e;
  if (Error e = io::make_dirs(host->run_dir)) return e;
  if (Error e = io::make_dirs(host->run_dir + "/artifacts")) return e;
  Result<std::unique_ptr<io::WalWriter>> wal = io::WalWriter::open(host->run_dir + "/wal");
  if (!wal) return wal.error();
  host->wal = std::move(*wal);
  host->run_json = identity_json(s, host->run_id, host->run_dir, host->start_us);
  host->job = job_identity(s);
  host->finish = &finish;
  return host;
}

/// Under `chorus launch`, tells it where this run lives (one line appended to
/// the file CHORUS_LAUNCH_RUNS names), so that it can add the ranks' exit
/// codes to run.json once they have exited. The line is "RANK<TAB>DIR": a
/// per-rank run takes its own rank's code only, "*" every rank launch started.
void note_run_for_launcher(const Settings& s, const std::string& run_dir) {
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

void sync_wal_on_signals(int fd) {
  signal_wal_fd.store(fd, std::memory_order_relaxed);
  for (auto [sig, previous] : {std::pair{SIGINT, &previous_sigint}, std::pair{SIGTERM, &previous_sigterm}}) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
        (current.sa_flags & SA_SIGINFO) != 0)
      continue;
    struct sigaction ours {};
    ours.sa_handler = sync_wal_and_reraise;
    sigemptyset(&ours.sa_mask);
    ::sigaction(sig, &ours, previous);
  }
}

void stop_syncing_wal_on_signals() { signal_wal_fd.store(-1, std::memory_order_relaxed); }

/// Where `chorus launch` started this rank: why the run host's process is
/// known to have exited (its rank is in the launch's CHORUS_LAUNCH_EXITS
/// file, "RANK CODE" a line), else "".
std::string launched_host_exit(const Settings& s) {
  const char* file = s.opts.read_env ? std::getenv("CHORUS_LAUNCH_EXITS") : nullptr;
  if (file == nullptr || *file == '\0') return {};
  const Result<std::string> text = io::detail::read_text(file, true, 1 << 20);
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

} // namespace chorus::detail
