// `chorus launch`, run for real: the ranks are `sh -c` scripts.
#define BOOST_TEST_MODULE cli_launch
#include <boost/test/unit_test.hpp>

#include "io/platform/posix.hpp"
#include "io/store/event_log.hpp"
#include "io/store/run_record.hpp"
#include "tests/cli/process.hpp"

#include <fstream>
#include <map>
#include <cctype>
#include <set>
#include <thread>

using namespace chorus::test;
using namespace std::chrono_literals;

namespace {

Output launch(const std::vector<std::string>& opts, const std::string& script, const std::vector<std::string>& env = {}) {
  std::vector<std::string> args{"launch"};
  args.insert(args.end(), opts.begin(), opts.end());
  args.insert(args.end(), {"--", "sh", "-c", script});
  return run_chorus(args, env);
}

// Starts a launch whose ranks print "ready" once their traps are set.
std::unique_ptr<Child> start(const std::vector<std::string>& opts, const std::string& script, int ranks) {
  std::vector<std::string> args{"launch"};
  args.insert(args.end(), opts.begin(), opts.end());
  args.insert(args.end(), {"--", "sh", "-c", script});
  auto c = std::make_unique<Child>(args);
  const bool ready = c->wait_for([&](const std::string& out, const std::string&) {
    return count_of(out, "ready") == static_cast<std::size_t>(ranks);
  });
  BOOST_REQUIRE_MESSAGE(ready, "the ranks did not all report ready");
  return c;
}

const std::string env_script =
    R"(echo "R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK GW=$GROUP_WORLD_SIZE )"
    R"(RR=$ROLE_RANK RW=$ROLE_WORLD_SIZE A=$MASTER_ADDR P=$MASTER_PORT ID=$TORCHELASTIC_RUN_ID X=$CLI_TEST_EXTRA")";

} // namespace

BOOST_AUTO_TEST_CASE(each_rank_gets_torchruns_environment) {
  const Output o = launch({"-n", "3"}, env_script, {"CLI_TEST_EXTRA=kept", "RANK=99"});
  BOOST_TEST(o.code == 0);
  std::set<std::string> seen, ports, ids;
  for (const std::string& l : lines_of(o.out)) {
    // "[rank R] R=.. L=.. ...": the prefix, then NAME=VALUE words.
    BOOST_REQUIRE_MESSAGE(l.starts_with("[rank ") && l.find("] ") != std::string::npos, "unexpected line: " << l);
    const std::string rank = l.substr(6, l.find("] ") - 6);
    std::map<std::string, std::string> v;
    std::istringstream words(l.substr(l.find("] ") + 2));
    for (std::string w; words >> w;) v[w.substr(0, w.find('='))] = w.substr(w.find('=') + 1);
    BOOST_TEST(v["R"] == rank);
    BOOST_TEST(v["L"] == rank);
    BOOST_TEST(v["RR"] == rank);
    BOOST_TEST(v["W"] == "3");
    BOOST_TEST(v["LW"] == "3");
    BOOST_TEST(v["G"] == "0");
    BOOST_TEST(v["GW"] == "1");
    BOOST_TEST(v["RW"] == "3");
    BOOST_TEST(v["A"] == "127.0.0.1");
    BOOST_TEST(v["X"] == "kept");
    BOOST_TEST(!v["ID"].empty());
    BOOST_TEST(std::stoi(v["P"]) > 0);
    seen.insert(rank);
    ports.insert(v["P"]);
    ids.insert(v["ID"]);
  }
  BOOST_TEST((seen == std::set<std::string>{"0", "1", "2"}));
  BOOST_TEST(ports.size() == 1u); // one rendezvous port for all
  BOOST_REQUIRE(ids.size() == 1u); // one job id for all
  // Made up as the launch's date and time and a random part, so that the
  // group named after it (torchrun-<id>) says when the job ran.
  const std::string& id = *ids.begin();
  // YYYYMMDD-HHMMSS-xxxxxx (std::regex is avoided: GCC 12 warns inside it under ASan).
  const std::string shape = "20dddddd-dddddd-hhhhhh";
  bool fits = id.size() == shape.size();
  for (std::size_t i = 0; fits && i < id.size(); ++i)
    fits = shape[i] == 'd' ? std::isdigit(static_cast<unsigned char>(id[i])) != 0
         : shape[i] == 'h' ? std::isxdigit(static_cast<unsigned char>(id[i])) != 0 && !std::isupper(static_cast<unsigned char>(id[i]))
                           : id[i] == shape[i];
  BOOST_TEST(fits, id);
}

BOOST_AUTO_TEST_CASE(a_second_node_numbers_its_ranks_after_the_first) {
  const Output o = launch({"-n", "2", "--nnodes", "3", "--node-rank", "1", "--master-addr", "10.1.2.3",
                           "--master-port", "4321", "--run-id", "job-7"},
                          env_script);
  BOOST_TEST(o.code == 0);
  const std::string out = o.out;
  BOOST_TEST(contains(out, "[rank 2] R=2 L=0 W=6 LW=2 G=1 GW=3 RR=2 RW=6 A=10.1.2.3 P=4321 ID=job-7"));
  BOOST_TEST(contains(out, "[rank 3] R=3 L=1 W=6 LW=2 G=1 GW=3 RR=3 RW=6 A=10.1.2.3 P=4321 ID=job-7"));
}

BOOST_AUTO_TEST_CASE(output_is_prefixed_per_stream_and_a_last_partial_line_kept) {
  const Output o = launch({"-n", "2"}, "echo out-$RANK; echo err-$RANK >&2; printf tail-$RANK");
  BOOST_TEST(o.code == 0);
  for (int r = 0; r < 2; ++r) {
    const std::string R = std::to_string(r);
    BOOST_TEST(contains(o.out, "[rank " + R + "] out-" + R + "\n"));
    BOOST_TEST(contains(o.out, "[rank " + R + "] tail-" + R + "\n"));
    BOOST_TEST(contains(o.err, "[rank " + R + "] err-" + R + "\n"));
    BOOST_TEST(!contains(o.out, "err-" + R));
  }
}

BOOST_AUTO_TEST_CASE(a_child_left_behind_does_not_hold_launch) {
  // The background sleep keeps the rank's pipes open after the rank exits.
  const auto t0 = std::chrono::steady_clock::now();
  const Output o = launch({"-n", "2"}, "(sleep 5; echo late) & printf main-$RANK");
  const bool quick = std::chrono::steady_clock::now() - t0 < 4s;
  BOOST_TEST(quick);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "[rank 0] main-0\n"));
  BOOST_TEST(contains(o.out, "[rank 1] main-1\n"));
}

BOOST_AUTO_TEST_CASE(no_prefix_passes_output_through) {
  const Output o = launch({"-n", "2", "--no-prefix"}, "echo plain-$RANK");
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "plain-0\n"));
  BOOST_TEST(contains(o.out, "plain-1\n"));
  BOOST_TEST(!contains(o.out, "[rank"));
}

BOOST_AUTO_TEST_CASE(lines_of_busy_ranks_never_mix) {
  // `yes | head` writes in buffer-sized pieces that end mid-line, and the
  // long lines are bigger than an atomic pipe write.
  const Output o = launch({"-n", "4"},
                          R"sh(yes "short-$RANK-$(printf '%0100d' 0)" | head -n 20000; )sh"
                          R"sh(yes "long-$RANK-$(printf '%09000d' 0)" | head -n 300)sh");
  BOOST_TEST(o.code == 0);
  const std::string zeros100(100, '0'), zeros9000(9000, '0');
  std::map<std::string, int> counts;
  bool all_whole = true;
  for (const std::string& l : lines_of(o.out)) {
    bool whole = false;
    for (int r = 0; r < 4 && !whole; ++r) {
      const std::string p = "[rank " + std::to_string(r) + "] ";
      if (l == p + "short-" + std::to_string(r) + "-" + zeros100) {
        ++counts["short" + std::to_string(r)];
        whole = true;
      } else if (l == p + "long-" + std::to_string(r) + "-" + zeros9000) {
        ++counts["long" + std::to_string(r)];
        whole = true;
      }
    }
    all_whole = all_whole && whole;
  }
  BOOST_TEST(all_whole);
  for (int r = 0; r < 4; ++r) {
    BOOST_TEST(counts["short" + std::to_string(r)] == 20000);
    BOOST_TEST(counts["long" + std::to_string(r)] == 300);
  }
}

BOOST_AUTO_TEST_CASE(exit_code_is_the_worst_ranks) {
  const Output code3 = launch({"-n", "3"}, "[ $RANK = 1 ] && exit 3; exit 0");
  BOOST_TEST(code3.code == 3);
  BOOST_TEST(contains(code3.err, "rank 1 exited with code 3"));

  const Output killed = launch({"-n", "3"}, "[ $RANK = 1 ] && exit 3; [ $RANK = 2 ] && kill -9 $$; exit 0");
  BOOST_TEST(killed.code == 128 + 9);
  BOOST_TEST(contains(killed.err, "rank 1 exited with code 3"));
  BOOST_TEST(contains(killed.err, "rank 2 exited with signal 9 (Killed)"));
  BOOST_TEST(!contains(killed.err, "rank 0 exited"));

  const Output ok = launch({"-n", "2"}, "exit 0");
  BOOST_TEST(ok.code == 0);
  BOOST_TEST(!contains(ok.err, "exited"));
}

BOOST_AUTO_TEST_CASE(a_failed_rank_lets_the_others_finish_by_default) {
  const Output o = launch({"-n", "3"}, "[ $RANK = 0 ] && exit 4; sleep 0.5; echo finished-$RANK");
  BOOST_TEST(o.code == 4);
  BOOST_TEST(contains(o.out, "[rank 1] finished-1"));
  BOOST_TEST(contains(o.out, "[rank 2] finished-2"));
}

BOOST_AUTO_TEST_CASE(sigterm_reaches_every_rank) {
  auto c = start({"-n", "4"}, R"(trap 'echo "got-term-$RANK"; exit 0' TERM; echo ready; while :; do sleep 0.1; done)", 4);
  c->signal(SIGTERM);
  const Output o = c->finish(60s);
  for (int r = 0; r < 4; ++r) BOOST_TEST(contains(o.out, "got-term-" + std::to_string(r)));
  // Every rank exited 0, but the job was stopped: not a success.
  BOOST_TEST(o.code == 128 + SIGTERM);
}

BOOST_AUTO_TEST_CASE(ranks_that_ignore_sigterm_are_killed_after_the_grace) {
  auto c = start({"-n", "2", "--grace", "0.5"}, "trap '' TERM; echo ready; while :; do sleep 0.1; done", 2);
  const auto t0 = std::chrono::steady_clock::now();
  c->signal(SIGTERM);
  const Output o = c->finish(60s);
  BOOST_TEST(o.code == 128 + SIGKILL);
  BOOST_TEST(contains(o.err, "grace period"));
  BOOST_TEST(contains(o.err, "rank 0 exited with signal 9"));
  const bool quick = std::chrono::steady_clock::now() - t0 < 30s;
  BOOST_TEST(quick);
}

BOOST_AUTO_TEST_CASE(a_second_sigint_kills_at_once) {
  auto c = start({"-n", "2", "--grace", "600"}, "trap 'echo got-int-$RANK' INT; echo ready; while :; do sleep 0.1; done", 2);
  c->signal(SIGINT);
  BOOST_REQUIRE(c->wait_for([](const std::string& out, const std::string&) { return count_of(out, "got-int-") == 2; }));
  c->signal(SIGINT);
  const Output o = c->finish(60s); // far below the 600 s grace
  BOOST_TEST(o.code == 128 + SIGKILL);
  BOOST_TEST(contains(o.err, "second interrupt"));
}

BOOST_AUTO_TEST_CASE(fail_fast_stops_the_others) {
  const Output o = launch({"-n", "3", "--fail-fast", "--grace", "20"},
                          R"(trap 'echo "stopped-$RANK"; exit 0' TERM; )"
                          R"([ $RANK = 0 ] && { sleep 0.3; exit 5; }; while :; do sleep 0.1; done)");
  BOOST_TEST(o.code == 5);
  BOOST_TEST(contains(o.out, "stopped-1"));
  BOOST_TEST(contains(o.out, "stopped-2"));
  BOOST_TEST(contains(o.err, "--fail-fast"));
  BOOST_TEST(contains(o.err, "rank 0 exited with code 5"));
}

BOOST_AUTO_TEST_CASE(fail_fast_exits_with_the_failures_code_not_the_stopped_ranks) {
  // The others die of the SIGTERM (143), which must not hide rank 1's 6.
  const Output o = launch({"-n", "3", "--fail-fast"}, "[ $RANK = 1 ] && { sleep 0.3; exit 6; }; exec sleep 60");
  BOOST_TEST(o.code == 6);
  BOOST_TEST(contains(o.err, "rank 0 exited with signal 15 (Terminated), stopped by --fail-fast"));
}

BOOST_AUTO_TEST_CASE(a_program_that_cannot_start_is_named_with_the_reason) {
  // A path is taken as it is: the fix is never to prefix it again.
  const Output path = run_chorus({"launch", "-n", "1", "--", "./nonexistent"});
  BOOST_TEST(path.code == 1);
  BOOST_TEST(contains(path.err, "cannot start './nonexistent': No such file or directory (in "), path.err);
  BOOST_TEST(!contains(path.err, "././"), path.err);
  TempDir dir;
  write_text(dir.path / "train.py", "print('hi')\n");
  const std::string script = (dir.path / "train.py").string();
  const Output plain = run_chorus({"launch", "-n", "1", "--", script});
  BOOST_TEST(plain.code == 1);
  BOOST_TEST(contains(plain.err, "it is not executable"), plain.err);
  BOOST_TEST(contains(plain.err, "chmod +x " + script), plain.err);
  const Output directory = run_chorus({"launch", "-n", "1", "--", dir.str()});
  BOOST_TEST(directory.code == 1);
  BOOST_TEST(contains(directory.err, "it is a directory"), directory.err);
}

BOOST_AUTO_TEST_CASE(a_wrong_command_line_is_exit_2_and_says_why) {
  const Output no_n = run_chorus({"launch", "--", "true"});
  BOOST_TEST(no_n.code == 2);
  BOOST_TEST(contains(no_n.err, "-n"));
  const Output bad_n = run_chorus({"launch", "-n", "zero", "--", "true"});
  BOOST_TEST(bad_n.code == 2);
  BOOST_TEST(contains(bad_n.err, "'zero'"));
  const Output unknown = run_chorus({"launch", "-n", "1", "--bogus", "--", "true"});
  BOOST_TEST(unknown.code == 2);
  BOOST_TEST(contains(unknown.err, "--bogus"));
  const Output node = run_chorus({"launch", "-n", "1", "--nnodes", "2", "--node-rank", "2", "--", "true"});
  BOOST_TEST(node.code == 2);
  const Output addr = run_chorus({"launch", "-n", "1", "--nnodes", "2", "--node-rank", "1", "--", "true"});
  BOOST_TEST(addr.code == 2);
  BOOST_TEST(contains(addr.err, "--master-addr"));
  const Output missing = run_chorus({"launch", "-n", "1", "--", "no-such-program-here"});
  BOOST_TEST(missing.code == 1);
  BOOST_TEST(contains(missing.err, "cannot find 'no-such-program-here' in PATH: give its path (./no-such-program-here"),
             missing.err);
  const Output help = run_chorus({"launch", "--help"});
  BOOST_TEST(help.code == 0);
  BOOST_TEST(contains(help.out, "usage: chorus launch"));
  BOOST_TEST(run_chorus({"frobnicate"}).code == 2);
  BOOST_TEST(run_chorus({"--help"}).code == 0);
}

namespace {

/// A run directory as a run host under launch leaves it: run.json saying
/// `state`, hosted by rank 0.
void write_run(const std::filesystem::path& dir, const std::string& state, const std::string& file = "run.json") {
  std::filesystem::create_directories(dir);
  chorus::store::RunRecord r;
  r.id = dir.filename().string();
  r.name = r.id;
  r.host = "node-a";
  r.pid = 4242;
  r.dir = dir.string();
  r.state = state;
  r.start_us = chorus::platform::unix_now_us();
  r.segments.push_back({r.start_us, std::nullopt, state, std::nullopt});
  r.world_size = 3;
  for (int k = 0; k < 3; ++k) r.ranks.push_back({k, state, 12, "node-a", "", std::nullopt});
  BOOST_REQUIRE(!r.write((dir / file).string()));
}

/// An events.jsonl line the run host tells, `ago_s` seconds ago.
std::string event(chorus::EventKind kind, int rank, std::uint64_t seq, double ago_s = 0) {
  chorus::core::EventDraft d;
  d.kind = kind;
  d.ts_us = chorus::platform::unix_now_us() - static_cast<std::int64_t>(ago_s * 1e6);
  d.rank = rank;
  d.step = 12;
  d.message = "rank " + std::to_string(rank) + " " + std::string(to_string(kind));
  d.host = "node-a";
  d.pid = 4242;
  if (kind == chorus::EventKind::stalled) {
    d.others_step = 40;
    d.seconds_us = 300'000'000;
  }
  return chorus::store::event_line(d, seq) + "\n";
}

void append(const std::filesystem::path& dir, const std::string& lines) {
  std::ofstream f(dir / "events.jsonl", std::ios::binary | std::ios::app);
  f << lines;
}

// Ranks that wait for DIR/go; rank 0 notes DIR as its run's directory, as a
// run host does, and on SIGTERM ends the run killed, as a run host would.
const std::string stall_script =
    R"(trap 'echo "got-term-$RANK"; [ $RANK = 0 ] && mv "$D/killed.json" "$D/run.json"; exit 0' TERM; )"
    R"([ $RANK = 0 ] && printf '*\t%s\n' "$D" >> "$CHORUS_LAUNCH_RUNS"; echo ready; )"
    R"(while [ ! -e "$D/go" ]; do sleep 0.1; done)";

std::unique_ptr<Child> start_stall_job(const std::vector<std::string>& opts, const std::filesystem::path& dir) {
  std::vector<std::string> args{"launch", "-n", "3"};
  args.insert(args.end(), opts.begin(), opts.end());
  args.insert(args.end(), {"--", "sh", "-c", stall_script});
  auto c = std::make_unique<Child>(args, std::vector<std::string>{"D=" + dir.string()});
  const bool ready = c->wait_for([&](const std::string& out, const std::string&) { return count_of(out, "ready") == 3; });
  BOOST_REQUIRE_MESSAGE(ready, "the ranks did not all report ready");
  return c;
}

} // namespace

BOOST_AUTO_TEST_CASE(on_stall_kill_stops_every_rank_when_one_stalls) {
  TempDir tmp;
  const std::filesystem::path dir = tmp.path / "proj" / "grp" / "run1";
  write_run(dir, "running");
  write_run(dir, "killed", "killed.json");
  // A stall told before this launch (an earlier attempt of the run) does not count.
  append(dir, event(chorus::EventKind::stalled, 0, 0, 3600));
  auto c = start_stall_job({"--on-stall=kill", "--grace", "30"}, dir);
  // A stall that is over by the time launch reads it does not count either.
  append(dir, event(chorus::EventKind::stalled, 1, 1) + event(chorus::EventKind::resumed, 1, 2));
  std::this_thread::sleep_for(1s); // launch reads the events five times a second
  BOOST_TEST(!contains(read_text(dir / "run.json"), R"("state":"killed")"));
  append(dir, event(chorus::EventKind::stalled, 2, 3));
  const Output o = c->finish(60s);
  BOOST_TEST_INFO_SCOPE(o.out << "\n---\n" << o.err);
  BOOST_TEST(o.code == 124); // whatever the ranks' codes (0 here)
  for (int r = 0; r < 3; ++r) BOOST_TEST(contains(o.out, "got-term-" + std::to_string(r)));
  BOOST_TEST(contains(o.err, "chorus launch: rank 2 (process 4242 on node-a) stalled at step 12 for 300 s; stopping the "
                             "job (--on-stall=kill)\n"));
  BOOST_TEST(count_of(o.err, "stalled at step") == 1u);
  // The run ended killed, and launch added the ranks' exit codes.
  const std::string run = read_text(dir / "run.json");
  BOOST_TEST(contains(run, R"("state":"killed")"), run);
  BOOST_TEST(contains(run, R"("exit_codes":{"0":0,"1":0,"2":0})"), run);
}

BOOST_AUTO_TEST_CASE(on_stall_wait_lets_the_job_go_on) {
  for (const std::vector<std::string>& opts : {std::vector<std::string>{"--on-stall", "wait"}, std::vector<std::string>{}}) {
    TempDir tmp;
    const std::filesystem::path dir = tmp.path / "run1";
    write_run(dir, "finished");
    auto c = start_stall_job(opts, dir);
    append(dir, event(chorus::EventKind::stalled, 2, 0));
    std::this_thread::sleep_for(1s); // as long as --on-stall=kill takes to see it
    write_text(dir / "go", "");
    const Output o = c->finish(60s);
    BOOST_TEST_INFO_SCOPE(o.out << "\n---\n" << o.err);
    BOOST_TEST(o.code == 0);
    BOOST_TEST(!contains(o.out, "got-term"));
    BOOST_TEST(!contains(o.err, "stalled"));
  }
}

BOOST_AUTO_TEST_CASE(a_wrong_on_stall_names_the_values_it_takes) {
  const Output o = run_chorus({"launch", "-n", "1", "--on-stall=maybe", "--", "true"});
  BOOST_TEST(o.code == 2);
  BOOST_TEST(contains(o.err, "--on-stall takes wait (the job goes on) or kill (stop every rank when one stalls), not "
                             "'maybe'"),
             o.err);
  const Output none = run_chorus({"launch", "-n", "1", "--on-stall"});
  BOOST_TEST(none.code == 2);
  BOOST_TEST(contains(none.err, "--on-stall needs a value"), none.err);
}
