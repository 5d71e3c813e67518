// `chorus launch`: the command line, the rendezvous port and the ranks'
// environment. The ranks themselves are run in launch.cpp.
#include "cli/cli.hpp"
#include "cli/group_info.hpp"
#include "cli/launch.hpp"
#include "cli/recover.hpp"
#include "cli/run_info.hpp"
#include "io/platform/random.hpp"
#include "io/store/run_record.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <netinet/in.h>
#include <optional>
#include <random>
#include <string_view>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

extern char** environ;

namespace chorus::cli {
int launch_main(std::span<char* const> args); // below

const Command launch_command{
    .name = "launch",
    .summary = "start N local ranks with torchrun's environment, prefix their output, forward signals and exit "
               "with the worst rank's code",
    .usage = "-n N [OPTIONS] [--] PROGRAM [ARGS...]",
    .help = R"(Starts N ranks of PROGRAM on this node with the environment torchrun gives its
workers, so that chorus::init (and torch.distributed) find their place:
  RANK=K*N+i  LOCAL_RANK=i  WORLD_SIZE=M*N  LOCAL_WORLD_SIZE=N  GROUP_RANK=K
  GROUP_WORLD_SIZE=M  ROLE_RANK=RANK  ROLE_WORLD_SIZE=WORLD_SIZE  ROLE_NAME=default
  MASTER_ADDR  MASTER_PORT  TORCHELASTIC_RUN_ID  TORCHELASTIC_RESTART_COUNT=0
  TORCHELASTIC_MAX_RESTARTS=0
(i the local rank, K the node rank, M the number of nodes). The rest of the
environment is passed on unchanged.

options:
  -n, --nproc-per-node N  ranks to start on this node (required)
  --nnodes M              nodes in the job (default 1)
  --node-rank K           this node's index, 0..M-1 (default 0)
  --master-addr A         address of node 0 (default 127.0.0.1; required on
                          every node but node 0)
  --master-port P         rendezvous port on node 0. Default: with one node, a
                          free port P whose neighbour P+1 is free too (chorus's
                          run host listens on MASTER_PORT+1); with several
                          nodes, 29500, because every node must agree on it
  --run-id ID             TORCHELASTIC_RUN_ID, the job's identity; give every
                          node the same one (default: the launch's date and
                          time and a random part, 20250301-142233-3fa9c1)
  --fail-fast             when a rank fails, stop the others (SIGTERM, then
                          SIGKILL after the grace period). By default they run
                          on: they may still finish with their data
  --grace SECONDS         how long stopping ranks get before SIGKILL (default 10)
  --on-stall wait|kill    what to do when a run of the job tells that a rank
                          stalled (its events.jsonl's `stalled`: its steps
                          stopped while others went on, for CHORUS_STALL_AFTER).
                          wait (the default): nothing, the job goes on. kill:
                          a line names the rank, and every rank is stopped as
                          on SIGTERM (SIGKILL after the grace period), so that
                          the runs end killed; launch then exits with 124
  --no-prefix             ranks write straight to launch's stdout and stderr,
                          unprefixed (lines of different ranks may then mix)
  -h, --help              this text

output: every line a rank writes is printed whole, on the same stream (stdout
or stderr), as "[rank R] LINE" with R the global rank. A line longer than
64 KiB is cut into pieces; a last line without a newline is printed when the
rank's output ends.

signals: SIGINT, SIGTERM, SIGHUP and SIGQUIT go on to every rank and the
processes it started, and each rank records itself killed, naming the signal,
once what it logged is committed; a second SIGINT, or the grace period running
out, sends SIGKILL (a rank it stops mid-finish reads crashed). SIGUSR1 and
SIGUSR2 are passed on. Ranks read /dev/null as stdin when
launch's stdin is a terminal.

exit code: the worst rank's. A rank's code is its exit status, or 128+S when
signal S ended it; the highest wins, and 0 means every rank exited 0. Ranks
that --fail-fast stopped do not count: the code is the failure's. If launch
was stopped by signal S and every rank still exited 0: 128+S. 124 when
--on-stall=kill stopped the job, whatever the ranks' codes. 1 when the ranks
could not be started, 2 for a wrong command line. Each failed rank gets a line
on stderr at the end.

examples:
  chorus launch -n 4 -- ./train --epochs 3
  chorus launch -n 8 --nnodes 2 --node-rank 1 --master-addr node0 \
                --run-id "$SLURM_JOB_ID" -- ./train
)",
    .main = launch_main,
};

namespace {

constexpr int default_master_port = 29500;

bool bindable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// A port the kernel calls free, with a free neighbour for chorus's run host.
// Another process may take it before the ranks do; a fixed --master-port
// is the way out when that happens.
std::optional<int> free_port_pair() {
  for (int attempt = 0; attempt < 32; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return std::nullopt;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    ::close(fd);
    if (port > 0 && port < 65535 && bindable(port + 1)) return port;
  }
  return std::nullopt;
}

/// The job id launch makes up when none is given: the launch's local date
/// and time and a random part ("20250301-142233-3fa9c1"), so that the
/// groups named after it (torchrun-<id>) tell jobs apart at a glance and
/// sort by when they started. Made once, here, and handed to every rank in
/// TORCHELASTIC_RUN_ID: the ranks never read a clock for it.
std::string made_up_job_id() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%d-%H%M%S-", &local);
  std::random_device rd;
  std::uniform_int_distribution<unsigned> hex(0, 15);
  std::string id = when;
  for (int i = 0; i < 6; ++i) id.push_back("0123456789abcdef"[hex(rd)]);
  return id;
}

/// Why `program` cannot be started, if it cannot. A name with a '/' is a path, and
/// must be an executable file there; a bare name is looked up in PATH, as
/// execvp does.
Error cannot_start(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    struct stat st {};
    if (::stat(program.c_str(), &st) != 0) {
      std::string where;
      if (program.front() != '/') {
        std::error_code ec;
        where = " (in " + std::filesystem::current_path(ec).string() + ")";
      }
      return invalid("cannot start '" + program + "': " + std::strerror(errno) + where + ": check the path");
    }
    if (S_ISDIR(st.st_mode)) return invalid("cannot start '" + program + "': it is a directory: give the program in it");
    if (::access(program.c_str(), X_OK) != 0)
      return invalid("cannot start '" + program + "': it is not executable: make it so (chmod +x " + program +
                     "), or start it through its interpreter (-- python3 " + program + ")");
    return {};
  }
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = rest.find(':');
    // An empty PATH entry is the current directory. Built by appending to a
    // fresh string: GCC 12's -Wrestrict misfires on reassigned or added strings.
    const std::string_view dir = rest.substr(0, colon);
    std::string candidate(dir.empty() ? std::string_view(".") : dir);
    candidate.append("/").append(program);
    if (::access(candidate.c_str(), X_OK) == 0) return {};
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return invalid("cannot find '" + program + "' in PATH: give its path (./" + program +
                 " for one in this directory), or add its directory to PATH");
}

// Reads the options; an error is a usage problem.
Error parse(std::span<char* const> words, LaunchArgs& a, bool& help) {
  ArgCursor c(words);
  std::string v;
  bool addr_given = false, port_given = false, nproc_given = false;
  while (!c.done() && c.error().empty()) {
    if (c.flag({"--"})) break;
    if (c.flag({"-h", "--help"})) {
      help = true;
      return {};
    }
    if (c.option({"-n", "--nproc-per-node", "--nproc_per_node"}, v)) {
      c.integer("-n", v, 1, 4096, a.nproc);
      nproc_given = true;
    } else if (c.option({"--nnodes"}, v)) {
      c.integer("--nnodes", v, 1, 65536, a.nnodes);
    } else if (c.option({"--node-rank", "--node_rank"}, v)) {
      c.integer("--node-rank", v, 0, 65535, a.node_rank);
    } else if (c.option({"--master-addr", "--master_addr"}, v)) {
      a.master_addr = v;
      addr_given = true;
      if (v.empty()) c.fail("--master-addr is empty: give node 0's host name or IP address");
    } else if (c.option({"--master-port", "--master_port"}, v)) {
      c.integer("--master-port", v, 1, 65535, a.master_port);
      port_given = true;
    } else if (c.option({"--run-id", "--run_id"}, v)) {
      a.run_id = v;
      if (v.empty()) c.fail("--run-id is empty: give the job's identity, the same on every node");
    } else if (c.option({"--grace"}, v)) {
      const auto g = parse_double(v);
      if (g && *g >= 0)
        a.grace_s = *g;
      else
        c.fail("--grace takes seconds (a number >= 0), not '" + v + "'");
    } else if (c.option({"--on-stall", "--on_stall"}, v)) {
      if (v == "wait")
        a.on_stall = OnStall::wait;
      else if (v == "kill")
        a.on_stall = OnStall::kill;
      else
        c.fail("--on-stall takes wait (the job goes on) or kill (stop every rank when one stalls), not '" + v + "'");
    } else if (c.flag({"--fail-fast"})) {
      a.fail_fast = true;
    } else if (c.flag({"--no-prefix"})) {
      a.prefix = false;
    } else if (c.peek().starts_with("-")) {
      c.fail("unknown option '" + std::string(c.peek()) + "'; put the program after '--' if it is the program's");
    } else {
      break; // the program starts here
    }
  }
  if (!c.error().empty()) return invalid(c.error());
  for (char* w : c.rest()) a.program.emplace_back(w);
  if (!nproc_given) return invalid("missing -n N: how many ranks to start on this node");
  if (a.program.empty()) return invalid("missing the program to run: chorus launch -n N -- PROGRAM [ARGS...]");
  if (a.node_rank >= a.nnodes)
    return invalid("--node-rank " + std::to_string(a.node_rank) + " is not below --nnodes " + std::to_string(a.nnodes) +
           ": node ranks run from 0 to nnodes-1");
  if (a.node_rank > 0 && !addr_given)
    return invalid("--node-rank " + std::to_string(a.node_rank) + " needs --master-addr: the address of node 0");
  if (!port_given) a.master_port = 0;
  return {};
}

// Rebuilds a run from its log, which holds everything its host acknowledged,
// ending what the log leaves open as `o.unended` says; `what` names, for an
// error, what happened to the run.
void end_from_wal(const std::string& dir, RecoverOptions o, const std::string& what) {
  o.backup = false;
  if (const Result<std::string> report = recover_run(dir, o); !report)
    std::fprintf(stderr, "chorus launch: %s %s, and cannot be rebuilt from its WAL: %s (run chorus recover on it)\n",
                 dir.c_str(), what.c_str(), report.error().message().c_str());
}

// A run whose host a stop signal ended before the run did (its run.json
// still says running) is marked killed: the user stopped it, it did not
// crash. So are its ranks that the host saw die after the signal, also in a
// run whose host lived on to end it.
void mark_killed(const std::string& dir, const StopSignal& stop) {
  const RunInfo info = read_run(dir);
  if (!info.readable() || (info.state != "running" && info.crashed_ranks() == 0)) return;
  const char* name = ::strsignal(stop.signal);
  RecoverOptions o;
  o.unended = RunState::killed;
  o.unended_reason = stop.reason.empty() ? "stopped by signal " + std::to_string(stop.signal) + " (" +
                                               (name ? name : "unknown") + ") that chorus launch passed on"
                                         : stop.reason;
  o.stopped_at_us = stop.at_us;
  end_from_wal(dir, o, "was stopped by signal " + std::to_string(stop.signal));
}

// A run whose host process ended without ending the run (an uncaught
// exception, an abort, the OOM killer) is marked crashed, with its ranks'
// last steps: nobody has to run chorus recover.
void finish_unended(const std::string& dir, int worst) {
  const RunInfo info = read_run(dir);
  if (!info.readable() || info.state != "running") return;
  RecoverOptions o;
  o.unended = RunState::crashed;
  o.unended_reason = "the run host's process ended (worst exit code " + std::to_string(worst) +
                     ") before it ended the run; chorus launch rebuilt the run from its WAL";
  end_from_wal(dir, o, "lost its host before the run ended");
}

} // namespace

std::vector<std::string> rank_environment(const LaunchArgs& a, int local_rank) {
  const int rank = a.node_rank * a.nproc + local_rank;
  const int world = a.nnodes * a.nproc;
  const std::pair<std::string_view, std::string> ours[] = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(a.nproc)},
      {"GROUP_RANK", std::to_string(a.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(a.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", a.master_addr},
      {"MASTER_PORT", std::to_string(a.master_port)},
      {"TORCHELASTIC_RUN_ID", a.run_id},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_MAX_RESTARTS", "0"},
      {"CHORUS_LAUNCH_RUNS", a.runs_file},
      {"CHORUS_LAUNCH_EXITS", a.exits_file},
      {"CHORUS_JOB_SECRET", a.job_secret},
  };
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry = *e;
    const std::string_view name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : ours) replaced = replaced || k == name;
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [k, v] : ours)
    if (!v.empty()) env.push_back(std::string(k) + "=" + v);
  return env;
}

Error record_exit_codes(const std::string& dir, const LaunchArgs& a, const std::vector<int>& codes,
                        std::optional<int> only_rank) {
  const std::string path = dir + "/run.json";
  Result<store::RunRecord> run = store::RunRecord::read(path);
  if (!run) return run.error();
  // Written back, a damaged field would be lost rather than reported.
  if (!run->damage.empty()) return file_problem(run->damage + " (left as it was; chorus recover " + dir + " rebuilds it)");
  store::ExitCodes recorded;
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const int rank = a.node_rank * a.nproc + static_cast<int>(i);
    if (!only_rank || rank == *only_rank) recorded.emplace_back(rank, codes[i]);
  }
  // A rank that failed after its finish fails the run: a finished run had
  // every rank succeed. A finished run carries no error of its own.
  if (std::string failure = store::failure_of_exit_codes(recorded);
      !failure.empty() && run->state == "finished" && !run->error) {
    run->state = "failed";
    run->error = std::move(failure);
  }
  run->exit_codes = std::move(recorded);
  return run->write(path);
}

int launch_main(std::span<char* const> words) {
  LaunchArgs a;
  if (std::optional<int> done = parse_words(launch_command, words, a, &parse)) return *done;
  if (Error e = cannot_start(a.program[0])) return failure("launch", e.message());
  if (a.master_port == 0) {
    if (a.nnodes > 1) {
      a.master_port = default_master_port;
    } else if (auto p = free_port_pair()) {
      a.master_port = *p;
    } else {
      a.master_port = default_master_port;
      std::fprintf(stderr, "chorus launch: found no free port pair; using MASTER_PORT=%d (set --master-port to choose)\n",
                   default_master_port);
    }
  }
  if (a.run_id.empty()) {
    if (a.nnodes > 1 && std::getenv("CHORUS_RUN_ID") == nullptr && std::getenv("CHORUS_GROUP") == nullptr)
      std::fputs("chorus launch: --nnodes > 1 without --run-id: each node makes up its own TORCHELASTIC_RUN_ID, "
                 "so the nodes' ranks cannot tell that they belong to one job. Pass the same --run-id on every "
                 "node (e.g. \"$SLURM_JOB_ID\")\n",
                 stderr);
    a.run_id = made_up_job_id();
  }
  // A job of one node gets a secret of its own, known only to its ranks'
  // environments; the nodes of a larger one would each make another (TLS
  // credentials, or the caller's CHORUS_JOB_SECRET, serve them).
  if (const char* given = std::getenv("CHORUS_JOB_SECRET"); given != nullptr && *given != '\0') {
    a.job_secret = given;
  } else if (a.nnodes == 1) {
    if (Result<std::string> made = platform::random_hex(32, "the job's secret")) a.job_secret = std::move(*made);
  }
  // Run hosts among the ranks note their run directories here; afterwards
  // each of those runs gets the ranks' exit codes.
  // Ranks that exited are noted in another, for ranks still dialing their host.
  for (std::string* file : {&a.runs_file, &a.exits_file}) {
    std::string path = (std::filesystem::temp_directory_path() / "chorus-launch-XXXXXX").string();
    if (const int fd = ::mkstemp(path.data()); fd >= 0) {
      ::close(fd);
      *file = path;
    }
  }
  if (a.on_stall == OnStall::kill && a.runs_file.empty())
    std::fputs("chorus launch: --on-stall=kill cannot learn where the runs are (no temporary file for their "
               "directories: check TMPDIR): stalls will not stop the job\n",
               stderr);
  std::vector<int> codes;
  StopSignal stop;
  const int worst = run_ranks(a, &codes, &stop);
  if (!a.exits_file.empty()) std::remove(a.exits_file.c_str());
  if (!a.runs_file.empty()) {
    std::map<std::string, std::vector<std::string>> groups; // group directory -> its runs launch knows
    // Each line is "RANK<TAB>DIR" (a per-rank run: that rank's code) or "*<TAB>DIR" (every rank's).
    std::ifstream in(a.runs_file);
    std::set<std::string> seen;
    for (std::string line; std::getline(in, line);) {
      const auto tab = line.find('\t');
      if (tab == std::string::npos || !seen.insert(line).second) continue;
      const std::string who = line.substr(0, tab), dir = line.substr(tab + 1);
      std::optional<int> only;
      if (who != "*") {
        const auto rank = parse_int(who, 0, std::numeric_limits<int>::max());
        if (!rank) continue;
        only = static_cast<int>(*rank);
      }
      if (stop.signal != 0)
        mark_killed(dir, stop);
      else
        finish_unended(dir, worst);
      if (Error e = record_exit_codes(dir, a, codes, only))
        std::fprintf(stderr, "chorus launch: the exit codes are not in %s/run.json: %s\n", dir.c_str(),
                     e.message().c_str());
      groups[std::filesystem::path(dir).parent_path().string()].push_back(dir);
    }
    std::remove(a.runs_file.c_str());
    // A job of several runs has a group.json beside them (where this node
    // shares a filesystem with global rank 0): every rank launch started gets
    // its exit code there, and the runs their states as their run.json has them.
    std::map<std::int64_t, std::int64_t> by_rank;
    for (std::size_t i = 0; i < codes.size(); ++i) by_rank[a.node_rank * a.nproc + static_cast<std::int64_t>(i)] = codes[i];
    for (const auto& [group_dir, runs] : groups)
      if (Error e = record_group_exit_codes(group_dir, by_rank, runs))
        std::fprintf(stderr, "chorus launch: the exit codes are not in %s/group.json: %s\n", group_dir.c_str(),
                     e.message().c_str());
  }
  return worst;
}

} // namespace chorus::cli
