// A run resumed under the same run id (CHORUS_RESUME), as a preempted or
// requeued job is: real processes under `chorus launch`, the first job
// killed for real (SIGKILL to every process, its run host included).
#define BOOST_TEST_MODULE e2e_resume
#include "harness.hpp"

#include "io/store/wal.hpp"
#include "runtime/core/wire.hpp"

#include <boost/test/unit_test.hpp>

#include <variant>

using namespace e2e;

namespace {

constexpr int ranks = 4, steps = 1000, pause_at = 500, checkpoint = 400;

/// `ranks` workers of the job "job-7" (a requeued Slurm job keeps its id,
/// hence its group) logging into the run "r1", with `env` before them.
std::string job(const TempDir& dir, int n, const std::string& env, const std::string& worker_args) {
  const int port = test_port(1);
  return "CHORUS_PORT=" + std::to_string(port) + " CHORUS_RUN_ID=r1 " + env + " " +
         launch_worker(dir.path, n, port + 1, worker_args, "--run-id job-7");
}

fs::path run_dir(const TempDir& dir) { return dir.path / "e2e" / "torchrun-job-7" / "r1"; }

/// Starts the job in its own session, waits until its ranks are parked at
/// step `pause_at` with every earlier row committed, and kills every
/// process of it at once (SIGKILL to its session: launch, and the run host
/// and the ranks, which launch starts in process groups of their own). All
/// are stopped first, and seen stopped, and the ranks die before launch: a
/// rank that outlived launch by a moment would take the SIGTERM launch's
/// death sends it (PR_SET_PDEATHSIG) and end `killed`.
void start_and_kill(const TempDir& dir) {
  const fs::path log = dir.path / "first.out";
  // One rank past the barrier means every rank reached it: the rows before it are committed.
  run("setsid sh -c '" + job(dir, ranks, "", "--steps " + std::to_string(steps) + " --pause-step " +
                                                 std::to_string(pause_at)) +
      " > " + log.string() + " 2>&1' & pid=$!; i=0; until grep -q 'PAUSED " + std::to_string(pause_at) + "$' " +
      log.string() + " 2>/dev/null || [ $i -ge 1200 ]; do sleep 0.1; i=$((i+1)); done; pkill -STOP -s $pid; "
      // Stopped for certain before any dies: a signal is taken when its process next runs, and under load a
      // rank not yet stopped when launch dies would take its SIGTERM (a lower number) before its SIGSTOP.
      "i=0; while ps -o stat= -s $pid | grep -qv '^T' && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
      // The ranks die first: once launch is gone their process groups are orphaned, and the kernel wakes an
      // orphaned group's stopped processes (SIGHUP, SIGCONT), which would then take launch's SIGTERM.
      "pkill -KILL -s $pid -f '^[^ ]*/chorus_e2e_worker '; pkill -KILL -s $pid; wait $pid");
  BOOST_TEST_INFO(slurp(log));
  BOOST_REQUIRE(slurp(log).find("PAUSED " + std::to_string(pause_at)) != std::string::npos);
  BOOST_REQUIRE(fs::exists(run_dir(dir) / "wal"));
  // Killed for real: no process of the job was left to end the run.
  simdjson::dom::parser parser;
  BOOST_TEST(std::string_view(read_run_json(parser, run_dir(dir))["state"].get_string()) == "running");
}

} // namespace

BOOST_AUTO_TEST_CASE(a_killed_job_resumed_from_its_checkpoint_has_one_history_without_duplicates_or_gaps) {
  TempDir dir;
  start_and_kill(dir);
  // Restarted from a checkpoint behind the last committed step (499):
  // steps 400..499 are refused, 500..999 continue the run.
  const Output out = run(job(dir, ranks, "CHORUS_RESUME=allow",
                             "--steps " + std::to_string(steps) + " --start-step " + std::to_string(checkpoint)));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  BOOST_REQUIRE_EQUAL(run_dir_of(out.text), run_dir(dir));
  check_worker_history(run_dir(dir), {0, 1, 2, 3}, steps);

  simdjson::dom::parser parser;
  const auto doc = read_run_json(parser, run_dir(dir));
  BOOST_TEST(std::string_view(doc["state"].get_string()) == "finished");
  const simdjson::dom::array segments = doc["segments"].get_array();
  BOOST_REQUIRE_EQUAL(segments.size(), 2u);
  BOOST_TEST(std::string_view(segments.at(0)["state"].get_string()) == "crashed");
  BOOST_TEST(std::string_view(segments.at(1)["state"].get_string()) == "finished");
  const double start0 = segments.at(0)["start_time"].get_double(), end0 = segments.at(0)["end_time"].get_double();
  const double start1 = segments.at(1)["start_time"].get_double(), end1 = segments.at(1)["end_time"].get_double();
  BOOST_TEST(start0 <= end0);
  BOOST_TEST(end0 <= start1);
  BOOST_TEST(start1 <= end1);
  BOOST_TEST(double(doc["start_time"].get_double()) == start0);
  BOOST_TEST(std::uint64_t(doc["rows"].get_uint64()) == static_cast<std::uint64_t>(steps));
  // The second attempt's exit codes are launch's, at the top level.
  BOOST_TEST(simdjson::dom::object(doc["exit_codes"].get_object()).size() == static_cast<std::size_t>(ranks));

  // Each refused call once: a log per rank and step, and rank 0's only0.
  std::ifstream rejected(run_dir(dir) / "rejected.jsonl");
  std::size_t lines = 0;
  for (std::string line; std::getline(rejected, line); ++lines) {
    const simdjson::dom::element r = parser.parse(line);
    BOOST_TEST(std::string_view(r["error"].get_string()) == "step_committed");
    const std::int64_t step = std::int64_t(r["step"].get_int64());
    BOOST_TEST((step >= checkpoint && step < pause_at), step);
  }
  BOOST_TEST(lines == static_cast<std::size_t>((ranks + 1) * (pause_at - checkpoint)));

  // chorus show lists both attempts.
  const Output show = run(bin("chorus") + " show " + run_dir(dir).string());
  BOOST_TEST_INFO(show.text);
  BOOST_TEST(show.status == 0);
  BOOST_TEST(show.text.find("attempt 1") != std::string::npos);
  BOOST_TEST(show.text.find("attempt 2") != std::string::npos);
}

// The run host answers finish once the log holds every rank's end, synced,
// before its own record of the run's end is on disk. A machine that crashed
// then leaves a log that ends with the ranks' ends (here: cut where the end's
// record starts) and a run.json that says running. Resumed, that attempt
// ends as its ranks did, finished, and not crashed.
BOOST_AUTO_TEST_CASE(an_attempt_whose_log_lost_its_end_after_every_ranks_end_resumes_as_finished) {
  TempDir dir;
  Output out = run(job(dir, 2, "", "--steps 10"));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  const fs::path wal = run_dir(dir) / "wal";
  std::uint64_t end_at = 0;
  bool found = false;
  const auto scanned = chorus::store::scan_wal(wal.string(), [&](std::span<const char> payload, std::uint64_t at) {
    chorus::core::wire::Frame f;
    if (!found && chorus::core::wire::decode(payload, f) && f.type == chorus::core::wire::FrameType::host_event &&
        std::holds_alternative<chorus::core::wire::RunEnd>(f.host)) {
      end_at = at;
      found = true;
    }
  });
  BOOST_REQUIRE(scanned.has_value());
  BOOST_REQUIRE_MESSAGE(found, "the log has no run end");
  fs::resize_file(wal, end_at);
  std::string json = slurp(run_dir(dir) / "run.json");
  const std::string finished = "\"state\":\"finished\"";
  const std::size_t state = json.find(finished);
  BOOST_REQUIRE(state != std::string::npos);
  json.replace(state, finished.size(), "\"state\":\"running\"");
  std::ofstream(run_dir(dir) / "run.json", std::ios::trunc) << json;

  out = run(job(dir, 2, "CHORUS_RESUME=must", "--steps 20 --start-step 10"));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  simdjson::dom::parser parser;
  const auto doc = read_run_json(parser, run_dir(dir));
  const simdjson::dom::array segments = doc["segments"].get_array();
  BOOST_REQUIRE_EQUAL(segments.size(), 2u);
  BOOST_TEST(std::string_view(segments.at(0)["state"].get_string()) == "finished");
  BOOST_TEST(std::string_view(segments.at(1)["state"].get_string()) == "finished");
  check_worker_history(run_dir(dir), {0, 1}, 20);
}

BOOST_AUTO_TEST_CASE(a_reused_run_id_is_refused_unless_resume_allows_it_and_each_refusal_names_the_fix) {
  TempDir dir;
  // must, with no such run.
  Output out = run(job(dir, 2, "CHORUS_RESUME=must", "--steps 10"));
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.status != 0);
  BOOST_TEST(out.text.find("CHORUS_RESUME=must, but there is no run r1 to resume") != std::string::npos);
  BOOST_TEST(!fs::exists(run_dir(dir)));

  out = run(job(dir, 2, "", "--steps 10"));
  BOOST_REQUIRE_EQUAL(out.status, 0);
  // never (the default), with the run there.
  out = run(job(dir, 2, "", "--steps 10"));
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.status != 0);
  BOOST_TEST(out.text.find("already exists") != std::string::npos);
  BOOST_TEST(out.text.find("CHORUS_RESUME=allow") != std::string::npos);
  // A shared run whose world size changed.
  out = run(job(dir, 3, "CHORUS_RESUME=must", "--steps 10"));
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.status != 0);
  BOOST_TEST(out.text.find("it has 2 ranks and this job 3") != std::string::npos, out.text);
  // A malformed value names the variable and its values.
  out = run(job(dir, 2, "CHORUS_RESUME=yes", "--steps 10"));
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.status != 0);
  BOOST_TEST(out.text.find("CHORUS_RESUME takes never, allow or must") != std::string::npos);
  // The refusals left the run as it was: one attempt, finished.
  simdjson::dom::parser parser;
  const auto doc = read_run_json(parser, run_dir(dir));
  BOOST_TEST(simdjson::dom::array(doc["segments"].get_array()).size() == 1u);
  BOOST_TEST(std::string_view(doc["state"].get_string()) == "finished");
  check_worker_history(run_dir(dir), {0, 1}, 10);
}

BOOST_AUTO_TEST_CASE(a_job_restarted_under_another_job_id_finds_its_run_by_its_id_alone) {
  // A requeued job whose launcher gave it a new job id (torchrun without a
  // fixed --rdzv_id) derives another group: its run id still finds its run.
  TempDir dir;
  const int port = test_port(2);
  auto under = [&](const std::string& job_id, const std::string& env, const std::string& args) {
    return "CHORUS_PORT=" + std::to_string(port) + " CHORUS_RUN_ID=r2 " + env + " " +
           launch_worker(dir.path, 2, port + 1, args, "--run-id " + job_id);
  };
  const fs::path first = dir.path / "e2e" / "torchrun-job-8" / "r2";
  Output out = run(under("job-8", "", "--steps 10"));
  BOOST_REQUIRE_EQUAL(out.status, 0);
  BOOST_REQUIRE(fs::exists(first / "run.json"));
  // Under never (the default), the id is taken, whatever group holds it.
  out = run(under("job-9", "", "--steps 10"));
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.status != 0);
  BOOST_TEST(out.text.find("run id r2 is taken in project e2e by " + first.string()) != std::string::npos);
  BOOST_TEST(!fs::exists(dir.path / "e2e" / "torchrun-job-9" / "r2"));
  // Under allow, the run goes on where it is: no second run of that id.
  out = run(under("job-9", "CHORUS_RESUME=allow", "--steps 20 --start-step 10"));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  BOOST_TEST(run_dir_of(out.text) == first);
  BOOST_TEST(!fs::exists(dir.path / "e2e" / "torchrun-job-9" / "r2"));
  check_worker_history(first, {0, 1}, 20);
  simdjson::dom::parser parser;
  const auto doc = read_run_json(parser, first);
  BOOST_TEST(simdjson::dom::array(doc["segments"].get_array()).size() == 2u);
  BOOST_TEST(std::string_view(doc["group"].get_string()) == "torchrun-job-8");
  // An id that two groups hold is refused, naming both.
  fs::create_directories(dir.path / "e2e" / "torchrun-job-10" / "r2");
  out = run(under("job-11", "CHORUS_RESUME=allow", "--steps 30 --start-step 20"));
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.status != 0);
  BOOST_TEST(out.text.find("run id r2 names 2 runs in project e2e") != std::string::npos);
  BOOST_TEST(out.text.find("CHORUS_GROUP") != std::string::npos);
}
