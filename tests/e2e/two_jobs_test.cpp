// Two jobs on one node whose launchers name no port for chorus (mpirun,
// srun and mpiexec set no MASTER_PORT): each job's run host takes a port
// derived from the job's own id, so neither job meets the other, and each
// run holds exactly its own ranks' values. Real processes, launched as the
// launchers launch them: Open MPI's mpirun, torchrun's variables by hand, and
// MPICH Hydra's variables under a process named as Hydra's proxy.
#define BOOST_TEST_MODULE e2e_two_jobs
#include "harness.hpp"

#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

using namespace e2e;
namespace utf = boost::unit_test;

namespace {

/// One job: the command of each of its processes, in the order they start.
struct Job {
  std::string name;
  int world = 2;
  int steps = 0; // the jobs log different numbers of steps: a stray rank shows in the other's history
  std::vector<std::string> processes;
};

/// The worker's command for `job`: every step acknowledged (ACKED S, seen
/// once its run host listens), and the last held until `go` exists, so that
/// its run host still listens while the other job starts.
std::string worker(const Job& job, const fs::path& go) {
  return bin("chorus_e2e_worker") + " --steps " + std::to_string(job.steps) + " --ack-each 1 --hold-until " +
         go.string();
}

/// torchrun's variables for `rank` of `job`, without MASTER_PORT (the
/// launcher names no port), with the run id `run_id`.
std::string torchrun_rank(const Job& job, int rank, const std::string& run_id) {
  const std::string r = std::to_string(rank), world = std::to_string(job.world);
  return "RANK=" + r + " LOCAL_RANK=" + r + " WORLD_SIZE=" + world + " LOCAL_WORLD_SIZE=" + world +
         " MASTER_ADDR=127.0.0.1 TORCHELASTIC_RUN_ID=" + run_id + " ";
}

/// What both jobs share on one node: the run directory and the socket
/// directory (one user's), and nothing that names a port.
struct Node {
  TempDir dir;
  fs::path sockets = own_socket_dir(dir);
  fs::path go = dir.path / "go";

  std::string env() const {
    return "env -u CHORUS_PORT -u MASTER_PORT CHORUS_DIR=" + dir.path.string() + " CHORUS_SOCKET_DIR=" +
           sockets.string() + " CHORUS_INIT_TIMEOUT=20 ";
  }
  fs::path log(const Job& job, std::size_t process) const {
    return dir.path / (job.name + std::to_string(process) + ".log");
  }
  std::string output(const Job& job, std::size_t process) const { return slurp(log(job, process)); }
  std::string output(const Job& job) const {
    std::string text;
    for (std::size_t i = 0; i < job.processes.size(); ++i) text += output(job, i);
    return text;
  }

  /// Starts the jobs' processes interleaved (the first of each job, then the
  /// second of each, ...); once every process has had a value acknowledged
  /// or has exited, lets them finish. Prints "PID <job> <index> <pid>" as
  /// each starts and "STATUS <job> <index> <code>" as each ends; what each
  /// process wrote is in log(job, index).
  Output run_both(const Job& a, const Job& b) const {
    std::string script = "(", settled = "true", waits;
    for (std::size_t i = 0; i < std::max(a.processes.size(), b.processes.size()); ++i) {
      for (const Job* job : {&a, &b}) {
        if (i >= job->processes.size()) continue;
        const std::string pid = "p" + job->name + std::to_string(i), which = job->name + " " + std::to_string(i);
        script += env() + job->processes[i] + " > " + log(*job, i).string() + " 2>&1 & " + pid + "=$!; echo \"PID " +
                  which + " $" + pid + "\"; ";
        settled += " && { grep -q 'ACKED 5$' " + log(*job, i).string() + " || ! kill -0 $" + pid + " 2>/dev/null; }";
        waits += "wait $" + pid + "; echo \"STATUS " + which + " $?\"; ";
      }
    }
    script += "i=0; until " + settled + " || [ $i -ge 1200 ]; do sleep 0.05; i=$((i+1)); done; touch " +
              go.string() + "; " + waits + ")";
    return run(script);
  }
};

/// The run of `job`, found by the run directory its host printed: finished,
/// with the job's ranks and no other, each finished at the job's last step,
/// and the history of exactly those ranks. Returns run.json's job_id.
std::string check_run(const Node& node, const Job& job, const std::string& launcher) {
  const std::string text = node.output(job);
  BOOST_TEST_INFO(job.name << ": " << text);
  BOOST_TEST(text.find("refused") == std::string::npos);
  const fs::path rd = run_dir_of(text);
  BOOST_REQUIRE(!rd.empty());
  simdjson::dom::parser parser;
  auto info = read_run_json(parser, rd);
  BOOST_TEST(std::string_view(info["state"].get_string()) == "finished");
  BOOST_TEST(std::string_view(info["launcher"].get_string()) == launcher);
  std::vector<int> ranks;
  for (auto r : info["ranks"].get_array()) {
    ranks.push_back(static_cast<int>(r["rank"].get_int64()));
    BOOST_TEST(std::string_view(r["state"].get_string()) == "finished");
    BOOST_TEST(int64_t(r["last_step"].get_int64()) == job.steps - 1);
  }
  std::vector<int> expected(static_cast<std::size_t>(job.world));
  for (int r = 0; r < job.world; ++r) expected[static_cast<std::size_t>(r)] = r;
  BOOST_TEST(ranks == expected);
  check_worker_history(rd, expected, job.steps);
  return std::string(std::string_view(info["job_id"].get_string()));
}

/// Every process of both jobs exited with 0.
void check_statuses(const Output& out, const std::vector<const Job*>& jobs) {
  BOOST_TEST_INFO(out.text);
  for (const Job* job : jobs)
    for (std::size_t i = 0; i < job->processes.size(); ++i)
      BOOST_TEST(out.text.find("STATUS " + job->name + " " + std::to_string(i) + " 0\n") != std::string::npos,
                 job->name << " process " << i);
}

/// The number a line "<key> <job> <index> N" of run_both's gives process
/// `index` of `job`.
std::string reported(const Output& out, const std::string& key, const Job& job, std::size_t index) {
  const std::string head = key + " " + job.name + " " + std::to_string(index) + " ";
  const std::size_t at = out.text.find(head);
  if (at == std::string::npos) return {};
  return out.text.substr(at + head.size(), out.text.find('\n', at) - at - head.size());
}

/// One Hydra job as mpiexec starts it on one node: its proxy (a shell here,
/// named hydra_pmi_proxy, the command name Hydra's proxy has) starts every
/// rank with PMI_RANK, PMI_SIZE, PMI_FD and MPI_LOCAL*, and no job id; rank
/// 1 first, through a shell of its own as `mpiexec sh -c ./train` does (a
/// shell that stays: it execs no command it has more to do after).
/// Exits with the first rank's failure, else 0.
std::string hydra_job(const Node& node, const Job& job) {
  const fs::path proxy = node.dir.path / "hydra_pmi_proxy";
  if (!fs::exists(proxy)) fs::create_symlink("/bin/sh", proxy);
  std::string ranks, waits = "s=0; ";
  for (int rank = job.world - 1; rank >= 0; --rank) {
    const std::string r = std::to_string(rank), world = std::to_string(job.world);
    ranks += "PMI_RANK=" + r + " PMI_SIZE=" + world + " PMI_FD=9 MPI_LOCALRANKID=" + r + " MPI_LOCALNRANKS=" + world +
             (rank == 1 ? " sh -c \"" + worker(job, node.go) + " && true\"" : " " + worker(job, node.go)) + " & p" + r +
             "=$!; ";
    waits += "wait $p" + r + " || s=$?; ";
  }
  return "env -u PMI_JOBID -u PMIX_NAMESPACE " + proxy.string() + " -c '" + ranks +
         waits + "exit $s'";
}

std::string mpirun_path() {
  const Output which = run("command -v mpirun");
  return which.status == 0 ? which.text.substr(0, which.text.find('\n')) : std::string();
}

/// Whether the Open MPI case can run; where not, says so on stderr too,
/// which Boost.Test shows only at a higher log level.
boost::test_tools::assertion_result mpirun_found(utf::test_unit_id) {
  boost::test_tools::assertion_result found(!mpirun_path().empty());
  if (!found) {
    const char* why = "mpirun is not installed (Debian: apt-get install openmpi-bin): the Open MPI case is skipped";
    std::fprintf(stderr, "SKIPPED: %s\n", why);
    found.message() << why;
  }
  return found;
}

} // namespace

BOOST_AUTO_TEST_CASE(two_open_mpi_jobs_on_one_node_each_hold_only_their_own_ranks,
                     *utf::precondition(mpirun_found)) {
  Node node;
  Job a{"a", 2, 30, {}}, b{"b", 2, 45, {}};
  // Under root (as in CI containers), mpirun starts nothing without
  // --allow-run-as-root. Each mpirun keeps its session files apart: two
  // started at one instant race to make the same directory in /tmp, and the
  // loser gives up (Open MPI 4).
  for (Job* job : {&a, &b})
    job->processes = {mpirun_path() + " --oversubscribe --allow-run-as-root --mca orte_tmpdir_base " +
                      (node.dir.path / job->name).string() + " -n " + std::to_string(job->world) + " " +
                      worker(*job, node.go)};
  const Output out = node.run_both(a, b);
  check_statuses(out, {&a, &b});
  const std::string id_a = check_run(node, a, "openmpi"), id_b = check_run(node, b, "openmpi");
  BOOST_TEST(!id_a.empty());
  BOOST_TEST(id_a != id_b);
}

BOOST_AUTO_TEST_CASE(two_torchrun_jobs_without_master_port_each_hold_only_their_own_ranks) {
  // Rank 1 of each job starts first, dialling a host that is not there
  // yet; then each job's rank 0.
  Node node;
  Job a{"a", 2, 30, {}}, b{"b", 2, 45, {}};
  for (Job* job : {&a, &b})
    for (int rank : {1, 0}) job->processes.push_back(torchrun_rank(*job, rank, "job-" + job->name) + worker(*job, node.go));
  const Output out = node.run_both(a, b);
  check_statuses(out, {&a, &b});
  BOOST_TEST(check_run(node, a, "torchrun") == "job-a");
  BOOST_TEST(check_run(node, b, "torchrun") == "job-b");
}

BOOST_AUTO_TEST_CASE(two_jobs_that_share_an_id_are_told_where_their_port_came_from_and_the_fix) {
  // Two jobs alike (one run id, given twice by mistake) derive one port:
  // the second host cannot listen, and of the two processes that claim
  // rank 1 of the run that went on, the later is refused. Each message
  // names the port, that it came from the job id, and CHORUS_PORT.
  Node node;
  Job a{"a", 2, 30, {}}, b{"b", 2, 30, {}};
  for (Job* job : {&a, &b})
    for (int rank : {1, 0}) job->processes.push_back(torchrun_rank(*job, rank, "job-same") + worker(*job, node.go));
  const Output out = node.run_both(a, b);
  BOOST_TEST_INFO(out.text << node.output(a) << node.output(b));
  const std::string derived = ", derived from the torchrun job job-same)";
  // Process 1 of each job is its rank 0, the would-be host.
  int hosts_refused = 0, ranks_refused = 0;
  for (const Job* job : {&a, &b}) {
    const Job& other = job == &a ? b : a;
    const std::string host = node.output(*job, 1), rank1 = node.output(*job, 0);
    if (host.find("the run host cannot listen on ") != std::string::npos) {
      ++hosts_refused;
      BOOST_TEST(host.find(derived + ": ") != std::string::npos);
      BOOST_TEST(host.find("set CHORUS_PORT to a free port on every rank") != std::string::npos);
    }
    if (rank1.find("refused rank 1") != std::string::npos) {
      ++ranks_refused;
      // The process that holds rank 1 of the run is the other job's, and this one's is named too.
      BOOST_TEST(rank1.find("rank 1 already joined this run from process " + reported(out, "PID", other, 0) + " on ") !=
                 std::string::npos);
      BOOST_TEST(rank1.find(", and process " + reported(out, "PID", *job, 0) + " on ") != std::string::npos);
      BOOST_TEST(rank1.find(derived + ": give each job its own CHORUS_PORT") != std::string::npos);
      BOOST_TEST(reported(out, "STATUS", *job, 0) == "3"); // the worker's code for a failed init
    }
  }
  BOOST_TEST(hosts_refused == 1);
  BOOST_TEST(ranks_refused == 1);
}

BOOST_AUTO_TEST_CASE(two_hydra_jobs_on_one_node_each_hold_only_their_own_ranks) {
  // Hydra names no job id: each job is told apart by the proxy its ranks
  // descend from. Jobs of one size, no port named: without that, both would
  // derive one port and one identity, and the second job's ranks would join
  // the first's run.
  Node node;
  Job a{"a", 2, 30, {}}, b{"b", 2, 45, {}};
  for (Job* job : {&a, &b}) job->processes = {hydra_job(node, *job)};
  const Output out = node.run_both(a, b);
  check_statuses(out, {&a, &b});
  const std::string id_a = check_run(node, a, "mpich"), id_b = check_run(node, b, "mpich");
  BOOST_TEST(id_a.rfind("hydra-" + reported(out, "PID", a, 0) + "-", 0) == 0u, id_a);
  BOOST_TEST(id_b.rfind("hydra-" + reported(out, "PID", b, 0) + "-", 0) == 0u, id_b);
}
