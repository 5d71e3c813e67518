// The run talks back (README, "When something goes wrong"), with real
// processes under `chorus launch`: a rank that stops logging is reported
// stalled (and resumed), a NaN names its rank, a rank stopped by SIGTERM is
// rank_killed, a rule fires, and a healthy run raises no alarm. Each event
// reaches rank 0's Run::on_event on its own executor's thread, lands in
// events.jsonl, and `chorus watch` prints it.
#define BOOST_TEST_MODULE e2e_events
#include "harness.hpp"

#include "io/store/event_log.hpp"

#include <boost/test/unit_test.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace chorus {
inline std::ostream& operator<<(std::ostream& out, EventKind k) { return out << to_string(k); }
inline std::ostream& operator<<(std::ostream& out, RunState s) { return out << to_string(s); }
} // namespace chorus

using namespace e2e;

namespace {

std::string launch_events(const TempDir& dir, int ranks, int port, const std::string& args,
                          const std::string& env = {}, const std::string& launch_options = {}) {
  return env + " CHORUS_DIR=" + dir.path.string() + " " + bin("chorus") + " launch -n " + std::to_string(ranks) +
         " --master-port " + std::to_string(port) + " " + launch_options + " -- " + bin("chorus_e2e_events_worker") +
         " " + args;
}

std::vector<chorus::store::EventLine> read_events(const fs::path& run_dir) {
  std::vector<chorus::store::EventLine> out;
  std::ifstream in(run_dir / chorus::store::events_file);
  std::string line;
  while (std::getline(in, line)) {
    auto e = chorus::store::parse_event_line(line);
    BOOST_TEST_REQUIRE(e.has_value(), line);
    out.push_back(std::move(*e));
  }
  return out;
}

std::size_t count(const std::vector<chorus::store::EventLine>& events, chorus::EventKind kind, int rank = -2) {
  std::size_t n = 0;
  for (const auto& e : events)
    if (e.event.kind == kind && (rank == -2 || e.event.rank == rank)) ++n;
  return n;
}

const chorus::store::EventLine* first(const std::vector<chorus::store::EventLine>& events, chorus::EventKind kind) {
  for (const auto& e : events)
    if (e.event.kind == kind) return &e;
  return nullptr;
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// stall_after in these tests (seconds): longer under a sanitizer, whose
/// slower ranks must not read as stalled.
constexpr int stall_s = 2 * sanitizer_slowdown;
const std::string stall_env = "CHORUS_STALL_AFTER=" + std::to_string(stall_s);

} // namespace

BOOST_AUTO_TEST_CASE(a_rank_that_stops_logging_is_stalled_then_resumed) {
  TempDir dir;
  // Rank 1 stops for 6 s at step 5 while ranks 0 and 2 go on; stall_after is 2 s.
  const Output o = run(launch_events(dir, 3, test_port(131),
                                     "--steps 60 --step-ms 20 --stall-rank 1 --stall-step 5 --stall-ms " +
                                         std::to_string(3000 * stall_s) + " --wait-for resumed",
                                     stall_env));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 0);
  BOOST_TEST(has(o.text, "EVENT stalled rank=1 step=4"));
  BOOST_TEST(has(o.text, "EVENT resumed rank=1"));
  BOOST_TEST(!has(o.text, "thread=chorus"));
  BOOST_TEST(!has(o.text, "NO EVENT"));
  BOOST_TEST(has(o.text, "EVENT run_finished rank=-1 step=-1 key= ranks= state=finished thread=own"));
  Ended ended(dir);
  const auto events = read_events(ended.dir);
  BOOST_TEST(count(events, chorus::EventKind::stalled) == 1u);
  BOOST_TEST(count(events, chorus::EventKind::stalled, 1) == 1u);
  BOOST_TEST(count(events, chorus::EventKind::resumed, 1) == 1u);
  BOOST_TEST(count(events, chorus::EventKind::straggler) == 0u);
  const auto* stalled = first(events, chorus::EventKind::stalled);
  BOOST_TEST_REQUIRE(stalled != nullptr);
  BOOST_TEST(stalled->pid > 0);
  BOOST_TEST(!stalled->host.empty());
  BOOST_TEST(stalled->others_step > 4);
  BOOST_TEST_REQUIRE(stalled->seconds.has_value());
  BOOST_TEST(*stalled->seconds >= stall_s);
  BOOST_TEST_MESSAGE("stalled told after " << *stalled->seconds << " s (stall_after " << stall_s << " s)");
  BOOST_TEST(has(stalled->event.message, "rank 1"), stalled->event.message);
  BOOST_TEST(events.back().event.kind == chorus::EventKind::run_finished);
  // The seq numbers the events from 0.
  for (std::size_t i = 0; i < events.size(); ++i) BOOST_TEST(events[i].seq == i);
  // chorus watch prints them, and exits 0 for a finished run.
  const Output watch = run(bin("chorus") + " watch " + ended.dir.string() + " --no-follow");
  BOOST_TEST_INFO(watch.text);
  BOOST_TEST(watch.status == 0);
  BOOST_TEST(has(watch.text, "stalled"));
  BOOST_TEST(has(watch.text, "resumed"));
  // A rebuild from the WAL writes the same events, with the file gone.
  const fs::path events_path = ended.dir / chorus::store::events_file;
  const std::string before = slurp(events_path);
  fs::rename(events_path, ended.dir / "events.before");
  const Output recover = run(bin("chorus") + " recover " + ended.dir.string());
  BOOST_TEST(recover.status == 0, recover.text);
  BOOST_TEST(has(recover.text, " " + std::to_string(events.size()) + " events"), recover.text);
  BOOST_TEST(slurp(events_path) == before);
  // An event told after the log stopped (a WAL that failed) is in events.jsonl
  // only: a rebuild keeps it, after the log's own.
  std::string later = before.substr(before.rfind('\n', before.size() - 2) + 1);
  const std::string seq = "\"seq\":" + std::to_string(events.size() - 1);
  BOOST_TEST_REQUIRE(later.find(seq) != std::string::npos, later);
  later.replace(later.find(seq), seq.size(), "\"seq\":" + std::to_string(events.size()));
  {
    std::ofstream append(events_path, std::ios::app);
    append << later;
  }
  const Output again = run(bin("chorus") + " recover " + ended.dir.string());
  BOOST_TEST(again.status == 0, again.text);
  BOOST_TEST(has(again.text, "1 told after the log stopped"), again.text);
  BOOST_TEST(slurp(events_path) == before + later);
}

BOOST_AUTO_TEST_CASE(a_nan_names_its_rank_and_a_rule_fires) {
  TempDir dir;
  const Output o = run(launch_events(dir, 3, test_port(132),
                                     "--steps 30 --step-ms 5 --nan-rank 2 --nan-step 10 --rule-above 0.9 "
                                     "--wait-for nonfinite"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 0);
  BOOST_TEST(has(o.text, "EVENT nonfinite rank=-1 step=10 key=loss ranks=2 "));
  // loss is 1/(s+1): above 0.9 at step 0 only; the rule fires once.
  BOOST_TEST(has(o.text, "EVENT threshold rank=-1 step=0 key=loss"));
  Ended ended(dir);
  const auto events = read_events(ended.dir);
  BOOST_TEST(count(events, chorus::EventKind::nonfinite) == 1u);
  BOOST_TEST(count(events, chorus::EventKind::threshold) == 1u);
  BOOST_TEST(count(events, chorus::EventKind::stalled) == 0u);
}

BOOST_AUTO_TEST_CASE(a_rank_stopped_by_sigterm_is_rank_killed) {
  TempDir dir;
  const Output o = run(launch_events(dir, 2, test_port(133), "--steps 40 --step-ms 10 --term-rank 1 --term-step 8 "
                                                             "--wait-for rank_killed"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(has(o.text, "EVENT rank_killed rank=1"));
  BOOST_TEST(has(o.text, "EVENT run_finished rank=-1 step=-1 key= ranks= state=killed"));
  Ended ended(dir);
  const auto events = read_events(ended.dir);
  BOOST_TEST(count(events, chorus::EventKind::rank_killed, 1) == 1u);
  BOOST_TEST(count(events, chorus::EventKind::rank_lost) == 0u);
  // chorus watch exits with the run's state: killed is not 0.
  const Output watch = run(bin("chorus") + " watch " + ended.dir.string() + " --no-follow");
  BOOST_TEST(watch.status != 0, watch.text);
}

BOOST_AUTO_TEST_CASE(a_healthy_run_raises_no_alarm) {
  // Four ranks in step with a barrier every 10 steps (the demo's shape):
  // nothing but the run's end, even with stall_after at 2 s (4 s under a sanitizer).
  TempDir dir;
  const Output o = run(stall_env + " " + launch_worker(dir.path, 4, test_port(134),
                                                               "--steps 400 --step-us 2000 --barrier-every 10"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 0);
  Ended ended(dir);
  const auto events = read_events(ended.dir);
  BOOST_TEST(count(events, chorus::EventKind::stalled) == 0u);
  BOOST_TEST(count(events, chorus::EventKind::straggler) == 0u);
  BOOST_TEST(count(events, chorus::EventKind::nonfinite) == 0u);
  BOOST_TEST_REQUIRE(events.size() == 1u);
  BOOST_TEST(events.back().event.kind == chorus::EventKind::run_finished);
  BOOST_TEST(events.back().event.state == chorus::RunState::finished);
}

BOOST_AUTO_TEST_CASE(launch_on_stall_kill_ends_a_stalled_job) {
  // Rank 1 hangs for 60 s at step 5; launch ends the job at its stall, not after the hang.
  TempDir dir;
  const Output o = run(launch_events(dir, 2, test_port(135),
                                     "--steps 400 --step-ms 20 --stall-rank 1 --stall-step 5 --stall-ms 60000",
                                     "CHORUS_STALL_AFTER=1", "--on-stall=kill"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 124);
  BOOST_TEST(has(o.text, "chorus launch: rank 1 (process "));
  BOOST_TEST(has(o.text, "stalled at step 4"));
  BOOST_TEST(has(o.text, "stopping the job (--on-stall=kill)"));
  Ended ended(dir);
  BOOST_TEST(ended.state() == "killed");
  const auto events = read_events(ended.dir);
  BOOST_TEST(count(events, chorus::EventKind::stalled, 1) == 1u);
  BOOST_TEST_REQUIRE(!events.empty());
  BOOST_TEST(events.front().event.kind == chorus::EventKind::stalled);
  BOOST_TEST(events.back().event.kind == chorus::EventKind::run_finished);
  BOOST_TEST(events.back().event.state == chorus::RunState::killed);
  // Nothing acknowledged is lost: rank 0's rows up to the stall are in the history.
  BOOST_TEST(read_history(ended.dir).size() >= 4u);
}

BOOST_AUTO_TEST_CASE(the_demo_raises_no_alarm) {
  // The README's main job (samples/ddp_train: 4 ranks, Gloo's allreduce, a
  // barrier an epoch), with stall_after at 2 s (4 under a sanitizer): it tells its end only.
  if (!fs::exists(bin("ddp_train"))) {
    BOOST_TEST_MESSAGE("samples are not built here (CHORUS_BUILD_SAMPLES=OFF): nothing to run");
    return;
  }
  TempDir dir;
  const Output o = run(stall_env + " CHORUS_DIR=" + dir.path.string() + " " + bin("chorus") +
                       " launch -n 4 --master-port " + std::to_string(test_port(136)) + " -- " + bin("ddp_train"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST_REQUIRE(o.status == 0);
  Ended ended(dir);
  const auto events = read_events(ended.dir);
  BOOST_TEST_REQUIRE(events.size() == 1u);
  BOOST_TEST(events.back().event.kind == chorus::EventKind::run_finished);
  BOOST_TEST(events.back().event.state == chorus::RunState::finished);
}

BOOST_AUTO_TEST_CASE(an_exit_status_after_the_end_is_told_as_the_end_it_amends) {
  // Both ranks finish, then rank 1's process exits 3 holding its Run: the
  // run turns failed, and its events say so. Where the status comes after
  // the run's end (the usual order), a first run_finished said finished and
  // a second says failed; where it comes before (a loaded machine), the one
  // run_finished says failed.
  TempDir dir;
  const Output o = run(launch_events(dir, 2, test_port(137), "--steps 20 --step-ms 5 --exit-after-finish 3"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 3);
  Ended ended(dir);
  BOOST_TEST(ended.state() == "failed");
  const auto events = read_events(ended.dir);
  const std::size_t ends = count(events, chorus::EventKind::run_finished);
  BOOST_TEST_MESSAGE("run_finished told " << ends << " time(s)");
  BOOST_TEST((ends == 1u || ends == 2u));
  BOOST_TEST(count(events, chorus::EventKind::rank_failed, 1) == 1u);
  BOOST_TEST_REQUIRE(!events.empty());
  BOOST_TEST(events.back().event.kind == chorus::EventKind::run_finished);
  BOOST_TEST(events.back().event.state == chorus::RunState::failed);
  if (ends == 2u) {
    BOOST_TEST(first(events, chorus::EventKind::run_finished)->event.state == chorus::RunState::finished);
    BOOST_TEST(has(events.back().event.message, "after all"), events.back().event.message);
  }
}
