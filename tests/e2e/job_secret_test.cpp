// A process of the same user that is not of the job cannot take a rank's
// place in its run (actors/job_secret.hpp): real processes on one node, the
// job's ranks with one CHORUS_JOB_SECRET, an impostor that claims rank 1
// before the real rank 1 starts, with another secret or none. The impostor
// is refused, naming the cause; the real rank 1 joins, and the run holds
// both real ranks' values and nothing of the impostor's.
#define BOOST_TEST_MODULE e2e_job_secret
#include "harness.hpp"

#include <boost/test/unit_test.hpp>

#include <string>

using namespace e2e;

namespace {

struct Job {
  TempDir dir;
  fs::path sockets = own_socket_dir(dir);
  fs::path go = dir.path / "go";
  int port = test_port(41);

  /// One process of the job, as torchrun starts it, with `secret` ("": none set).
  std::string rank(int r, const std::string& secret, const std::string& args) const {
    return "env -u CHORUS_JOB_SECRET RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " TORCHELASTIC_RUN_ID=secret-job CHORUS_DIR=" + dir.path.string() + " CHORUS_SOCKET_DIR=" +
           sockets.string() + " CHORUS_INIT_TIMEOUT=" + std::to_string(30 * sanitizer_slowdown) +
           (secret.empty() ? std::string() : " CHORUS_JOB_SECRET=" + secret) + " " + bin("chorus_e2e_worker") + " " +
           args;
  }
};

/// The host (rank 0) holding its last step until `go`, an impostor as rank
/// 1, then the real rank 1: the impostor's output, then the job's.
std::pair<Output, Output> impostor_first(const Job& job, const std::string& secret, const std::string& impostor) {
  const fs::path host_log = job.dir.path / "host.log";
  const std::string host = job.rank(0, secret, "--steps 20 --hold-until " + job.go.string());
  // The impostor starts once the host listens (its socket is there).
  const std::string socket = (job.sockets / (std::to_string(job.port + 1) + ".sock")).string();
  Output out = run("(" + host + " > " + host_log.string() + " 2>&1 & echo $! > " + (job.dir.path / "host.pid").string() +
                   "); for i in $(seq 300); do [ -S " + socket + " ] && break; sleep 0.05; done; " +
                   job.rank(1, impostor, "--steps 5"));
  Output real = run(job.rank(1, secret, "--steps 20") + "; touch " + job.go.string() + "; while kill -0 $(cat " +
                    (job.dir.path / "host.pid").string() + ") 2>/dev/null; do sleep 0.1; done; cat " +
                    host_log.string());
  return {out, real};
}

void check_refused(const Output& impostor) {
  BOOST_TEST(impostor.status != 0, impostor.text);
  BOOST_TEST(impostor.text.find("claims rank 1 without this job's secret") != std::string::npos, impostor.text);
}

void check_run_of_the_job(const Job& job, const Output& real) {
  BOOST_TEST(real.text.find("FINISH_STATE 0 finished") != std::string::npos, real.text);
  BOOST_TEST(real.text.find("FINISH_STATE 1 finished") != std::string::npos, real.text);
  Ended run(job.dir);
  BOOST_TEST(run.state() == "finished");
  BOOST_TEST(run.rank_field(1, "state") == "finished");
  check_worker_history(run.dir, {0, 1}, 20);
}

} // namespace

BOOST_AUTO_TEST_CASE(an_impostor_with_another_secret_is_refused_and_the_rank_keeps_its_place) {
  Job job;
  auto [impostor, real] = impostor_first(job, "the-secret-of-this-job-0123456789", "a-guess-at-the-secret-0123456789");
  check_refused(impostor);
  check_run_of_the_job(job, real);
}

BOOST_AUTO_TEST_CASE(ranks_without_a_set_secret_share_the_nodes_and_an_impostor_with_its_own_is_refused) {
  // The job's ranks set none: they share the secret the first made in the
  // socket directory (mode 0600). The impostor brings one of its own.
  Job job;
  auto [impostor, real] = impostor_first(job, "", "a-guess-at-the-secret-0123456789");
  check_refused(impostor);
  check_run_of_the_job(job, real);
  int files = 0;
  for (const auto& e : fs::directory_iterator(job.sockets)) {
    if (e.path().extension() != ".secret") continue;
    ++files;
    BOOST_TEST(((fs::status(e.path()).permissions() & fs::perms::all) == (fs::perms::owner_read | fs::perms::owner_write)));
  }
  BOOST_TEST(files == 1);
}

BOOST_AUTO_TEST_CASE(a_secret_too_short_is_refused_with_the_fix) {
  Job job;
  const Output out = run(job.rank(0, "short", "--steps 1"));
  BOOST_TEST(out.status != 0, out.text);
  BOOST_TEST(out.text.find("CHORUS_JOB_SECRET has 5 bytes: it takes 16 to 4096") != std::string::npos, out.text);
}
