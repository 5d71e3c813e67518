// `chorus watch`, run for real over run directories written here as a run
// host leaves them: run.json (store::RunRecord), its lease (io/store/lease.hpp)
// so that the run reads live, events.jsonl (store::event_line), group.json
// (io/store/group_file.hpp). Lines are appended while the watch runs. The
// last cases watch real jobs under `chorus launch`, whose run host tells
// the events itself.
#define BOOST_TEST_MODULE cli_watch
#include <boost/test/unit_test.hpp>

#include "io/platform/posix.hpp"
#include "io/store/event_log.hpp"
#include "io/store/group_file.hpp"
#include "io/store/lease.hpp"
#include "io/store/run_record.hpp"
#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"
#include "tests/e2e/harness.hpp"

#include <fstream>
#include <future>
#include <thread>

using namespace chorus;
using namespace chorus::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t host_pid = 2147483000; // no process of this machine

std::int64_t now_us() { return platform::unix_now_us(); }

/// run.json of a run hosted on `host`, in `state`.
void write_run(const fs::path& dir, const std::string& state, const std::string& host = other_host,
               std::optional<std::int64_t> group_index = std::nullopt) {
  fs::create_directories(dir);
  store::RunRecord r;
  r.id = dir.filename().string();
  r.name = dir.parent_path().filename().string() + "-" + r.id;
  r.project = "proj";
  r.group = dir.parent_path().filename().string();
  r.mode = "shared";
  r.scope = "global";
  r.host = host;
  r.pid = host_pid;
  r.dir = dir.string();
  r.state = state;
  r.start_us = now_us() - 60'000'000;
  if (state != "running") r.end_us = now_us();
  r.segments.push_back({r.start_us, r.end_us, state, std::nullopt});
  r.world_size = 4;
  r.rows = 0;
  r.rejected = 0;
  if (group_index) {
    r.group_index = *group_index;
    r.rank = *group_index;
    r.node = 0;
  }
  for (int k = 0; k < 4; ++k) r.ranks.push_back({k, state, 11, host, "", std::nullopt});
  BOOST_REQUIRE(!r.write((dir / "run.json").string()));
}

/// The host's lease, renewed `age_s` seconds ago (it holds for 30 s).
void write_lease(const fs::path& dir, double age_s, const std::string& host = other_host) {
  const std::int64_t renewed = now_us() - static_cast<std::int64_t>(age_s * 1e6);
  BOOST_REQUIRE(!store::renew_lease(dir.string(), {host, host_pid, renewed, renewed + 30'000'000}));
}

/// A live run: running, its host's lease just renewed.
fs::path live_run(const fs::path& dir, std::optional<std::int64_t> group_index = std::nullopt) {
  write_run(dir, "running", other_host, group_index);
  write_lease(dir, 0);
  return dir;
}

core::EventDraft draft(EventKind kind, int rank, std::int64_t step, std::string message) {
  core::EventDraft d;
  d.kind = kind;
  d.ts_us = now_us();
  d.rank = rank;
  d.step = step;
  d.message = std::move(message);
  return d;
}

core::EventDraft stalled(int rank, std::int64_t step) {
  core::EventDraft d = draft(EventKind::stalled, rank, step,
                               "rank " + std::to_string(rank) + " (process 4242 on node-a) has not moved past step " +
                                   std::to_string(step) + " for 301 s while the others reached 40");
  d.host = "node-a";
  d.pid = 4242;
  d.others_step = 40;
  d.seconds_us = 301'500'000;
  return d;
}

core::EventDraft finished(RunState state) {
  core::EventDraft d = draft(EventKind::run_finished, -1, 11, "the run ended " + std::string(to_string(state)));
  d.state = state;
  return d;
}

/// Appends the drafts' lines to DIR/events.jsonl, numbered from `seq`, in one write.
std::string append(const fs::path& dir, std::uint64_t seq, const std::vector<core::EventDraft>& drafts) {
  std::string text;
  for (const core::EventDraft& d : drafts) text += store::event_line(d, seq++) + "\n";
  std::ofstream f(dir / store::events_file, std::ios::binary | std::ios::app);
  f << text;
  f.flush();
  return text;
}

std::unique_ptr<Child> watch(const std::vector<std::string>& args) {
  std::vector<std::string> words{"watch"};
  words.insert(words.end(), args.begin(), args.end());
  return std::make_unique<Child>(words);
}

/// Waits until stdout holds `n` lines.
void wait_lines(Child& c, std::size_t n) {
  const bool there = c.wait_for([&](const std::string& out, const std::string&) { return count_of(out, "\n") >= n; });
  BOOST_REQUIRE_MESSAGE(there, "chorus watch did not print " << n << " lines");
}

} // namespace

BOOST_AUTO_TEST_CASE(prints_the_events_there_are_then_new_ones_until_run_finished) {
  TempDir tmp;
  const fs::path dir = live_run(tmp.path / "proj" / "grp" / "run1");
  append(dir, 0, {stalled(3, 12)});
  auto c = watch({dir.string()});
  wait_lines(*c, 1);
  append(dir, 1, {draft(EventKind::resumed, 3, 13, "rank 3 moved again, to step 13, after 320 s")});
  wait_lines(*c, 2);
  append(dir, 2, {draft(EventKind::nonfinite, -1, 14, "loss is NaN at step 14"), finished(RunState::finished)});
  const Output o = c->finish(60s);
  BOOST_TEST_INFO_SCOPE(o.out << "\n---\n" << o.err);
  BOOST_TEST(o.code == 0); // run.json still says running: run_finished ended the watch
  const std::vector<std::string> lines = lines_of(o.out);
  BOOST_REQUIRE(lines.size() == 4u);
  BOOST_TEST(contains(lines[0], "  stalled          rank 3    step 12     rank 3 (process 4242 on node-a) has not moved"));
  BOOST_TEST(contains(lines[1], "  resumed          rank 3    step 13     rank 3 moved again"));
  BOOST_TEST(contains(lines[2], "  nonfinite        -         step 14     loss is NaN at step 14"));
  BOOST_TEST(contains(lines[3], "  run_finished     -         step 11     the run ended finished"));
  // Local time first, and no colour into a pipe.
  BOOST_TEST(lines[0].substr(0, 2) == "20");
  BOOST_TEST(!contains(o.out, "\x1b["));
  BOOST_TEST(o.err.empty());
}

BOOST_AUTO_TEST_CASE(the_exit_code_says_how_the_run_ended) {
  TempDir tmp;
  const std::pair<RunState, int> ends[] = {
      {RunState::finished, 0}, {RunState::failed, 3}, {RunState::killed, 4}, {RunState::crashed, 5}};
  for (const auto& [state, code] : ends) {
    BOOST_TEST_CONTEXT(to_string(state)) {
      const fs::path dir = live_run(tmp.path / "proj" / "grp" / std::string(to_string(state)));
      append(dir, 0, {stalled(1, 5), finished(state)});
      const Output o = run_chorus({"watch", dir.string()});
      BOOST_TEST(o.code == code, o.err);
      BOOST_TEST(count_of(o.out, "\n") == 2u);
    }
  }
  // A run.json that ended without a run_finished (a run from before events) ends it too, as it says.
  const fs::path quiet = tmp.path / "proj" / "grp" / "quiet";
  write_run(quiet, "failed");
  const Output o = run_chorus({"watch", quiet.string()});
  BOOST_TEST(o.code == 3);
  BOOST_TEST(o.out.empty());
  BOOST_TEST(contains(o.err, "quiet ended failed without a run_finished event"), o.err);
}

BOOST_AUTO_TEST_CASE(a_run_whose_host_is_gone_ends_the_watch_as_crashed) {
  TempDir tmp;
  // Its lease expired two minutes ago: crashed from the start.
  const fs::path expired = tmp.path / "proj" / "grp" / "expired";
  write_run(expired, "running");
  write_lease(expired, 120);
  append(expired, 0, {stalled(2, 7)});
  const Output o = run_chorus({"watch", expired.string()});
  BOOST_TEST(o.code == 5, o.err);
  BOOST_TEST(count_of(o.out, "\n") == 1u);
  BOOST_TEST(contains(o.err, "expired ended crashed without a run_finished event"), o.err);
  BOOST_TEST(contains(o.err, "stopped renewing its lease"), o.err);

  // Live when the watch starts; its host stops renewing while it follows.
  const fs::path dying = live_run(tmp.path / "proj" / "grp" / "dying");
  append(dying, 0, {stalled(2, 7)});
  auto c = watch({dying.string()});
  wait_lines(*c, 1);
  write_lease(dying, 120);
  const Output later = c->finish(60s);
  BOOST_TEST(later.code == 5, later.err);
  BOOST_TEST(contains(later.err, "stopped renewing its lease"), later.err);

  // Hosted on this machine by a process that is gone: no lease needed.
  const fs::path here = tmp.path / "proj" / "grp" / "here";
  write_run(here, "running", hostname());
  const Output mine = run_chorus({"watch", here.string()});
  BOOST_TEST(mine.code == 5, mine.err);
  BOOST_TEST(contains(mine.err, "is no longer running"), mine.err);
}

BOOST_AUTO_TEST_CASE(no_follow_prints_what_is_there_and_the_state_so_far) {
  TempDir tmp;
  const fs::path dir = live_run(tmp.path / "proj" / "grp" / "run1");
  append(dir, 0, {stalled(3, 12), draft(EventKind::resumed, 3, 13, "moved again")});
  const Output running = run_chorus({"watch", dir.string(), "--no-follow"});
  BOOST_TEST(running.code == 6, running.err);
  BOOST_TEST(count_of(running.out, "\n") == 2u);
  append(dir, 2, {finished(RunState::killed)});
  const Output ended = run_chorus({"watch", "--no-follow", dir.string()});
  BOOST_TEST(ended.code == 4, ended.err);
  BOOST_TEST(count_of(ended.out, "\n") == 3u);
  // No events yet, still running.
  const fs::path empty = live_run(tmp.path / "proj" / "grp" / "run2");
  const Output none = run_chorus({"watch", empty.string(), "--no-follow"});
  BOOST_TEST(none.code == 6);
  BOOST_TEST(none.out.empty());
}

BOOST_AUTO_TEST_CASE(json_prints_the_lines_as_they_are) {
  TempDir tmp;
  const fs::path dir = live_run(tmp.path / "proj" / "grp" / "run1");
  std::string written = append(dir, 0, {stalled(3, 12)});
  auto c = watch({"--json", dir.string()});
  wait_lines(*c, 1);
  written += append(dir, 1, {draft(EventKind::barrier_timeout, -1, 20, "barrier 'epoch' timed out"), finished(RunState::failed)});
  const Output o = c->finish(60s);
  BOOST_TEST(o.code == 3, o.err);
  BOOST_TEST(o.out == written);
  // Each is an event line as chorus reads them.
  for (const std::string& l : lines_of(o.out)) BOOST_TEST(bool(store::parse_event_line(l)), l);
}

BOOST_AUTO_TEST_CASE(kinds_picks_the_events_printed) {
  TempDir tmp;
  const fs::path dir = live_run(tmp.path / "proj" / "grp" / "run1");
  append(dir, 0,
         {stalled(3, 12), draft(EventKind::resumed, 3, 13, "moved again"), draft(EventKind::nonfinite, -1, 14, "NaN"),
          draft(EventKind::rank_lost, 2, 15, "rank 2 lost")});
  auto c = watch({"--kinds=stalled,nonfinite", dir.string()});
  wait_lines(*c, 2);
  append(dir, 4, {stalled(1, 30), finished(RunState::failed)});
  const Output o = c->finish(60s);
  BOOST_TEST_INFO_SCOPE(o.out);
  BOOST_TEST(o.code == 3); // run_finished is not printed, but ends the watch
  const std::vector<std::string> lines = lines_of(o.out);
  BOOST_REQUIRE(lines.size() == 3u);
  BOOST_TEST(contains(lines[0], " stalled "));
  BOOST_TEST(contains(lines[1], " nonfinite "));
  BOOST_TEST(contains(lines[2], " stalled "));
  BOOST_TEST(contains(lines[2], "rank 1"));
  const Output two = run_chorus({"watch", "--kinds", "rank_lost", "--no-follow", "--json", dir.string()});
  BOOST_TEST(two.code == 3);
  BOOST_TEST(count_of(two.out, "\n") == 1u);
  BOOST_TEST(contains(two.out, R"("kind":"rank_lost")"));
}

BOOST_AUTO_TEST_CASE(a_group_is_watched_until_every_run_has_ended) {
  TempDir tmp;
  const fs::path group = tmp.path / "proj" / "job-7";
  const fs::path a = live_run(group / "aaaa", 0);
  const auto member = [](const fs::path& dir, std::int64_t index) {
    store::GroupMember m;
    m.index = index;
    m.id = dir.filename().string();
    m.name = "job-7-rank-" + std::to_string(index);
    m.dir = dir.string();
    m.host = other_host;
    m.pid = host_pid;
    m.ranks.push_back({index, "running", -1});
    return m;
  };
  store::GroupManifest g;
  g.group = "job-7";
  g.project = "proj";
  g.size = 2;
  g.members.push_back(member(a, 0));
  write_text(group / "group.json", store::group_json(g) + "\n");
  append(a, 0, {stalled(0, 3)});

  auto c = watch({group.string()});
  wait_lines(*c, 1);
  // The second run joins later.
  const fs::path b = live_run(group / "bbbb", 1);
  g.members.push_back(member(b, 1));
  write_text(group / "group.json", store::group_json(g) + "\n");
  append(b, 0, {draft(EventKind::nonfinite, -1, 4, "loss is NaN at step 4")});
  wait_lines(*c, 2);
  append(a, 1, {finished(RunState::finished)});
  wait_lines(*c, 3);
  // One run ended, the other goes on: so does the watch.
  append(b, 1, {finished(RunState::killed)});
  const Output o = c->finish(60s);
  BOOST_TEST_INFO_SCOPE(o.out << "\n---\n" << o.err);
  BOOST_TEST(o.code == 4); // the worse of finished and killed
  const std::vector<std::string> lines = lines_of(o.out);
  BOOST_REQUIRE(lines.size() == 4u);
  // Each line names its run (its name, short of the group's).
  BOOST_TEST(contains(lines[0], "  rank-0  stalled "));
  BOOST_TEST(contains(lines[1], "  rank-1  nonfinite "));
  BOOST_TEST(contains(lines[2], "  rank-0  run_finished "));
  BOOST_TEST(contains(lines[3], "  rank-1  run_finished "));

  // --json names the run of each line; a failed run is the worst.
  append(a, 2, {stalled(0, 50), finished(RunState::failed)});
  const Output json = run_chorus({"watch", group.string(), "--json", "--kinds", "stalled"});
  BOOST_TEST(json.code == 3, json.err);
  BOOST_TEST(count_of(json.out, R"({"run":"aaaa","seq":)") == 2u, json.out);
  BOOST_TEST(count_of(json.out, "\n") == 2u, json.out);
}

BOOST_AUTO_TEST_CASE(a_group_with_a_run_still_going_is_running_for_no_follow) {
  TempDir tmp;
  const fs::path group = tmp.path / "proj" / "job-8";
  const fs::path a = live_run(group / "aaaa", 0);
  const fs::path b = live_run(group / "bbbb", 1);
  append(a, 0, {finished(RunState::finished)});
  append(b, 0, {stalled(1, 2)});
  const Output o = run_chorus({"watch", group.string(), "--no-follow"});
  BOOST_TEST(o.code == 6, o.err);
  BOOST_TEST(count_of(o.out, "\n") == 2u);
  // Its host gone, the other run reads crashed: the group ends so.
  write_lease(b, 120);
  const Output gone = run_chorus({"watch", group.string()});
  BOOST_TEST(gone.code == 5, gone.err);
}

BOOST_AUTO_TEST_CASE(a_wrong_command_line_or_no_run_says_why) {
  TempDir tmp;
  const fs::path dir = live_run(tmp.path / "proj" / "grp" / "run1");
  const Output none = run_chorus({"watch"});
  BOOST_TEST(none.code == 2);
  BOOST_TEST(contains(none.err, "missing RUN|GROUP"), none.err);
  const Output kinds = run_chorus({"watch", dir.string(), "--kinds=stalled,bogus"});
  BOOST_TEST(kinds.code == 2);
  BOOST_TEST(contains(kinds.err, "--kinds takes event kinds separated by commas"), kinds.err);
  BOOST_TEST(contains(kinds.err, "straggler"), kinds.err);
  BOOST_TEST(contains(kinds.err, "not 'bogus'"), kinds.err);
  const Output empty_kind = run_chorus({"watch", dir.string(), "--kinds="});
  BOOST_TEST(empty_kind.code == 2);
  const Output option = run_chorus({"watch", dir.string(), "--follow-not"});
  BOOST_TEST(option.code == 2);
  BOOST_TEST(contains(option.err, "unknown option '--follow-not'"), option.err);
  const Output two = run_chorus({"watch", dir.string(), dir.string()});
  BOOST_TEST(two.code == 2);
  const Output missing = run_chorus({"watch", "no-such-run", "--dir", tmp.str()});
  BOOST_TEST(missing.code == 1);
  BOOST_TEST(contains(missing.err, "no run 'no-such-run'"), missing.err);
  const Output help = run_chorus({"watch", "--help"});
  BOOST_TEST(help.code == 0);
  BOOST_TEST(contains(help.out, "exit codes"));
  // A run found by its id under --dir.
  append(dir, 0, {finished(RunState::finished)});
  const Output by_id = run_chorus({"watch", "run1", "--dir", tmp.str()});
  BOOST_TEST(by_id.code == 0, by_id.err);
}

BOOST_AUTO_TEST_CASE(a_line_that_is_no_event_is_named_and_passed_over) {
  TempDir tmp;
  const fs::path dir = live_run(tmp.path / "proj" / "grp" / "run1");
  append(dir, 0, {stalled(3, 12)});
  {
    std::ofstream f(dir / store::events_file, std::ios::app);
    f << "{not json\n";
  }
  append(dir, 1, {finished(RunState::finished)});
  const Output o = run_chorus({"watch", dir.string()});
  BOOST_TEST(o.code == 0, o.err);
  BOOST_TEST(count_of(o.out, "\n") == 2u);
  BOOST_TEST(contains(o.err, "line 2"), o.err);
  BOOST_TEST(contains(o.err, "chorus recover"), o.err);
}

namespace {

/// Starts a job of two chorus_e2e_worker ranks with `worker_args`, and
/// watches its run from the moment its run.json is there.
std::pair<e2e::Output, e2e::Output> watch_a_job(const TempDir& tmp, int port_salt, const std::string& worker_args) {
  const fs::path runs = tmp.path / "runs";
  auto job = std::async(std::launch::async, [&] {
    return e2e::run("CHORUS_SYSTEM_INTERVAL=0 " + e2e::launch_worker(runs, 2, e2e::test_port(port_salt), worker_args));
  });
  fs::path run_dir;
  const auto until = std::chrono::steady_clock::now() + 60s * e2e::sanitizer_slowdown;
  while (run_dir.empty() && std::chrono::steady_clock::now() < until) {
    std::error_code ec;
    if (fs::is_directory(runs, ec))
      for (const fs::path& d : e2e::find_runs(runs)) run_dir = d;
    std::this_thread::sleep_for(20ms);
  }
  if (run_dir.empty()) return {{}, job.get()};
  e2e::Output watched = e2e::run(e2e::bin("chorus") + " watch " + run_dir.string());
  return {watched, job.get()};
}

} // namespace

BOOST_AUTO_TEST_CASE(a_real_job_is_watched_until_it_finishes) {
  TempDir tmp;
  const auto [watched, trained] = watch_a_job(tmp, 91, "--steps 30 --step-us 50000");
  BOOST_TEST_INFO_SCOPE(watched.text << "\n---\n" << trained.text);
  BOOST_TEST(trained.status == 0);
  BOOST_TEST(watched.status == 0);
  BOOST_TEST(count_of(watched.text, " run_finished ") == 1u);
  BOOST_TEST(contains(lines_of(watched.text).back(), " run_finished "));
}

BOOST_AUTO_TEST_CASE(a_real_job_whose_rank_dies_is_watched_to_its_crash) {
  TempDir tmp;
  const auto [watched, trained] =
      watch_a_job(tmp, 92, "--steps 40 --step-us 50000 --die-rank 1 --die-step 10 --die-signal 9");
  BOOST_TEST_INFO_SCOPE(watched.text << "\n---\n" << trained.text);
  BOOST_TEST(trained.status == 128 + 9);
  BOOST_TEST(watched.status == 5); // crashed: a rank gone without a word
  BOOST_TEST(contains(watched.text, " rank_lost        rank 1 "));
  BOOST_TEST(contains(lines_of(watched.text).back(), " run_finished "));
}
