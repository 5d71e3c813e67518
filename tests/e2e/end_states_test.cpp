// Every way a job ends is recorded truthfully by the ranks themselves, with
// real processes killed for real: a SIGTERM to one rank, an exception that
// nothing catches (std::terminate), exit(3) without a finish, a Run unwound
// by an exception, a run host SIGKILLed without a word (no launcher to
// rebuild the run: every reader reports it crashed), and values refused with
// their tickets dropped (rejected.jsonl, the count, one warning a key), and
// ranks that exit with their runs held while the others' links close.
#define BOOST_TEST_MODULE e2e_end_states
#include "harness.hpp"

#include <boost/test/unit_test.hpp>

#include <csignal>
#include <map>
#include <string>

using namespace e2e;

namespace {

bool has(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

/// Every value rank `r` saw acknowledged (through `last`) is in the history.
void check_acked(const fs::path& run_dir, int r, long last) {
  const auto rows = read_history(run_dir);
  std::map<std::int64_t, const Row*> at;
  for (const Row& row : rows) at[row.step()] = &row;
  for (long s = 0; s <= last; ++s)
    BOOST_TEST_CONTEXT("rank " << r << " step " << s) {
      BOOST_REQUIRE(at.count(s) == 1u);
      BOOST_TEST(at[s]->num.at("per_rank/rank-" + std::to_string(r)) == r * 1000 + static_cast<double>(s));
    }
}

/// A shell line that waits (at most 60 s) until `log` has `line` (a grep pattern).
std::string wait_for(const fs::path& log, const std::string& line) {
  return "i=0; until grep -qs '" + line + "' " + log.string() + " || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; ";
}

} // namespace

BOOST_AUTO_TEST_CASE(sigterm_to_one_rank_records_it_killed_and_it_ends_with_143) {
  // Rank 1 gets SIGTERM mid-run (as a scheduler or a person sends it); rank
  // 0 goes on and finishes. Rank 1 commits what it logged, records itself
  // killed naming the signal, and ends as SIGTERM ends a process.
  TempDir dir;
  const fs::path log = dir.path / "launch.out";
  const std::string job = launch_worker(dir.path, 2, test_port(81), "--steps 600 --step-us 5000 --ack-each 1 --print-pid 1");
  const Output o = run(job + " > " + log.string() + " 2>&1 & lp=$!; " + wait_for(log, "^\\[rank 1\\] ACKED 40$") +
                       "pid=$(sed -n 's/^\\[rank 1\\] PID 1 \\([0-9]*\\)$/\\1/p' " + log.string() +
                       " | head -n 1); kill -TERM $pid; wait $lp; echo \"STATUS $?\"");
  const std::string text = slurp(log);
  BOOST_TEST_INFO(o.text + text);
  BOOST_TEST(has(o.text, "STATUS 143")); // launch exits with the worst rank's status: SIGTERM's
  Ended run(dir);
  BOOST_TEST(run.text("state") == "killed");
  BOOST_TEST(run.rank_field(1, "state") == "killed");
  BOOST_TEST(has(run.rank_field(1, "message"), "stopped by SIGTERM"), run.rank_field(1, "message"));
  BOOST_TEST(run.rank_field(0, "state") == "finished");
  BOOST_TEST(has(run.text("error"), "rank 1 killed (stopped by SIGTERM)"), run.text("error"));
  BOOST_TEST(std::int64_t(run.json["exit_codes"]["1"]) == 143);
  const auto acked = acked_steps(text);
  BOOST_REQUIRE(acked.count(1) == 1u);
  check_acked(run.dir, 1, acked.at(1));
  check_acked(run.dir, 0, 599);
}

BOOST_AUTO_TEST_CASE(sigterm_to_the_run_host_ends_the_run_killed_once_the_others_finished) {
  // The run host alone gets SIGTERM at step 120: it commits what it logged
  // and ends its rank killed, waits (within finish_timeout) for the other
  // ranks, which finish their steps, and ends the run, then the process.
  TempDir dir;
  const Output o = run(launch_worker(dir.path, 3, test_port(87),
                                     "--steps 400 --barrier-every 50 --die-rank 0 --die-step 120 --die-signal 15"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 128 + SIGTERM);
  Ended run(dir);
  BOOST_TEST(run.text("state") == "killed");
  BOOST_TEST(run.rank_field(0, "state") == "killed");
  BOOST_TEST(has(run.rank_field(0, "message"), "stopped by SIGTERM"));
  BOOST_TEST(run.rank_field(1, "state") == "finished");
  BOOST_TEST(run.rank_field(2, "state") == "finished");
  // The host's values up to the signal (and those its trainer logged before
  // the finish the signal started took effect), none after, and every value
  // of the others.
  const auto rows = read_history(run.dir);
  BOOST_REQUIRE_EQUAL(rows.size(), 400u);
  std::int64_t last = -1;
  for (const Row& row : rows)
    if (row.num.count("per_rank/rank-0") == 1u) last = row.step();
  BOOST_TEST(last >= 119);
  BOOST_TEST(std::int64_t(run.json["ranks"].at(0)["last_step"]) == last);
  for (const Row& row : rows) {
    const auto s = row.step();
    BOOST_TEST_CONTEXT("step " << s) {
      BOOST_TEST(row.num.count("per_rank/rank-0") == (s <= last ? 1u : 0u));
      BOOST_TEST(row.num.at("per_rank/rank-2") == 2000 + static_cast<double>(s));
    }
  }
}

BOOST_AUTO_TEST_CASE(sigterm_right_after_init_of_a_run_of_one_process_ends_it_killed) {
  // A run of one process starts its actors behind init (actors/system.cpp),
  // but not the thread that serves stop signals: a SIGTERM the moment init
  // returns, while the trainer goes on stepping, ends the run killed, with
  // what it logged, and the process with 143, at once (a start that waited
  // for a lock the signal's finish held hung until `timeout` killed it).
  TempDir dir;
  const std::string worker = "--steps 200 --step-us 2000 --die-rank 0 --die-step 0 --die-signal 15";
  const Output o = run("timeout 60 env " + launch_worker(dir.path, 1, test_port(90), worker) + "; echo \"STATUS $?\"");
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(has(o.text, "STATUS 143"));
  Ended run(dir);
  BOOST_TEST(run.text("state") == "killed");
  BOOST_TEST(run.rank_field(0, "state") == "killed");
  BOOST_TEST(has(run.rank_field(0, "message"), "stopped by SIGTERM"), run.rank_field(0, "message"));
  // What it logged before the signal (its config), and not all its steps.
  BOOST_TEST(has(slurp(run.dir / "config.json"), "sgd"), slurp(run.dir / "config.json"));
  BOOST_TEST(read_history(run.dir).size() < 200u);
}

BOOST_AUTO_TEST_CASE(an_exception_nothing_catches_fails_the_rank_with_its_text) {
  // std::terminate on rank 1 (an exception escaping a thread): the rank is
  // recorded failed with the exception's type and text, and exit code 134,
  // the status abort() then gives it; the run fails.
  TempDir dir;
  const Output o = run(launch_worker(dir.path, 2, test_port(82), "--steps 60 --throw-rank 1 --throw-step 20"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 128 + SIGABRT);
  Ended run(dir);
  BOOST_TEST(run.text("state") == "failed");
  BOOST_TEST(run.rank_field(1, "state") == "failed");
  const std::string why = run.rank_field(1, "message");
  BOOST_TEST(has(why, "exit code 134: terminate called after throwing std::runtime_error: boom at step 20"), why);
  BOOST_TEST(run.rank_field(0, "state") == "finished");
  BOOST_TEST(has(run.text("error"), "rank 1 failed ("), run.text("error"));
  // `chorus show` prints the rank's message.
  const Output show = e2e::run(bin("chorus") + " show " + run.dir.string());
  BOOST_TEST(has(show.text, "boom at step 20"), show.text);
  check_acked(run.dir, 1, 19);
}

BOOST_AUTO_TEST_CASE(exit_with_a_status_before_finish_fails_the_rank_with_it) {
  TempDir dir;
  const Output o = run(launch_worker(dir.path, 2, test_port(83), "--steps 60 --exit-rank 1 --exit-step 20 --exit-now 3"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 3);
  Ended run(dir);
  BOOST_TEST(run.text("state") == "failed");
  BOOST_TEST(run.rank_field(1, "state") == "failed");
  BOOST_TEST(has(run.rank_field(1, "message"), "exit code 3: the process exited with status 3"),
             run.rank_field(1, "message"));
  BOOST_TEST(run.rank_field(0, "state") == "finished");
  check_acked(run.dir, 1, 19);
}

BOOST_AUTO_TEST_CASE(ranks_that_exit_holding_their_run_while_the_links_close_all_end_cleanly) {
  // Every rank finishes, then exits through exit() with its Run still held
  // (as a Python interpreter does); rank 0's exit is slowed by another
  // library's exit handler (a GPU library's, say) while the other ranks'
  // links close. The threads that close them must not reach what the
  // static destructors freed: memory freed at exit is overwritten at once
  // (glibc's perturb, no thread cache), so that a read of it crashes.
  TempDir dir;
  const Output o = run("GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.perturb=165 " +
                       launch_worker(dir.path, 4, test_port(89), "--steps 50 --slow-exit-ms 500"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 0);
  BOOST_TEST(!has(o.text, "signal"));
  BOOST_TEST(!has(o.text, "AddressSanitizer"));
  Ended run(dir);
  BOOST_TEST(run.text("state") == "finished");
  for (int r = 0; r < 4; ++r) BOOST_TEST(run.rank_field(r, "state") == "finished", "rank " << r);
  // The run's end freed the room it held for it, though no handle was freed.
  BOOST_TEST(!fs::exists(run.dir / ".reserve"));
}

BOOST_AUTO_TEST_CASE(an_exception_that_unwinds_the_run_fails_the_rank) {
  TempDir dir;
  const Output o = run(launch_worker(dir.path, 2, test_port(84), "--steps 60 --unwind-rank 1 --unwind-step 20"));
  BOOST_TEST_INFO(o.text);
  BOOST_TEST(o.status == 5);
  BOOST_TEST(has(o.text, "CAUGHT unwound at step 20"));
  Ended run(dir);
  BOOST_TEST(run.text("state") == "failed");
  BOOST_TEST(run.rank_field(1, "state") == "failed");
  BOOST_TEST(has(run.rank_field(1, "message"), "an exception left the scope of the chorus::Run"),
             run.rank_field(1, "message"));
}

BOOST_AUTO_TEST_CASE(a_host_killed_without_a_word_reads_crashed_everywhere_without_recover) {
  // No launcher to rebuild the run: rank 0 (the run host) is SIGKILLed. The
  // other rank's finish says the host was lost; run.json still says running,
  // and every reader reports the run crashed, with its last committed step.
  TempDir dir;
  // Each rank writes a file of its own: lines from two processes appended
  // through buffers to one file can be cut into each other.
  auto out = [&](int r) { return dir.path / ("rank" + std::to_string(r) + ".out"); };
  const int port = test_port(85);
  auto rank = [&](int r) {
    return "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
           " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
           " CHORUS_DIR=" + dir.path.string() + " CHORUS_CONNECTION_TIMEOUT=3 " + bin("chorus_e2e_worker") +
           " --steps 3000 --step-us 2000 --ack-each 1 --print-pid 1 > " + out(r).string() + " 2>&1";
  };
  const Output o = run(rank(0) + " & " + rank(1) + " & r1=$!; " + wait_for(out(0), "^PID 0 [0-9]*$") +
                       wait_for(out(1), "^ACKED 40$") + "pid=$(sed -n 's/^PID 0 \\([0-9]*\\)$/\\1/p' " +
                       out(0).string() + " | head -n 1); kill -KILL $pid; wait $r1; echo DONE");
  const std::string text = "[rank 0]\n" + slurp(out(0)) + "[rank 1]\n" + slurp(out(1));
  BOOST_TEST_INFO(o.text + text);
  BOOST_TEST(has(text, "rank 1 finish:"));
  BOOST_TEST((has(text, "went away") || has(text, "was not heard from")), text);
  Ended run(dir);
  BOOST_TEST(run.text("state") == "running"); // the file as the host left it: nobody rebuilt it
  const Output show = e2e::run(bin("chorus") + " show " + run.dir.string());
  BOOST_TEST_INFO(show.text);
  BOOST_TEST(has(show.text, "crashed"));
  BOOST_TEST(!has(show.text, "crashed?"));
  const Output ls = e2e::run(bin("chorus") + " ls " + dir.path.string());
  BOOST_TEST(has(ls.text, "crashed"), ls.text);
  const Output csv = e2e::run(bin("chorus") + " export " + run.dir.string() + " --csv " + (dir.path / "h.csv").string());
  BOOST_TEST(csv.status == 0, csv.text);
}

BOOST_AUTO_TEST_CASE(refused_values_leave_a_trace_whether_or_not_their_tickets_are_waited_on) {
  // Each step every rank logs "good" beside three bad keys, and one value at
  // the step before (backwards), tickets dropped: every refused value is in
  // rejected.jsonl with its reason and counted; each rank warns once a key.
  TempDir dir;
  const Output o = run(launch_worker(dir.path, 2, test_port(86), "--steps 20 --bad-keys 1"));
  BOOST_TEST_INFO(o.text);
  BOOST_REQUIRE(o.status == 0);
  Ended run(dir);
  BOOST_TEST(run.text("state") == "finished");
  // 3 bad keys a step and rank, and 19 backwards values a rank.
  BOOST_TEST(std::int64_t(run.json["rejected"]) == 2 * (3 * 20 + 19));
  std::ifstream in(run.dir / "rejected.jsonl");
  std::map<std::string, int> by_error;
  long values = 0;
  simdjson::dom::parser p;
  for (std::string line; std::getline(in, line);) {
    simdjson::dom::element e;
    BOOST_REQUIRE(p.parse(line).get(e) == simdjson::SUCCESS);
    ++by_error[std::string(std::string_view(e["error"].get_string()))];
    std::int64_t count = 1;
    if (e["count"].get(count) != simdjson::SUCCESS) count = static_cast<std::int64_t>(e["values"].get_object().size());
    values += count;
    const std::string message(std::string_view(e["message"].get_string()));
    BOOST_TEST(!message.empty());
  }
  BOOST_TEST(values == 2 * (3 * 20 + 19));
  BOOST_TEST(by_error["invalid_key"] == 2 * 3 * 20);
  BOOST_TEST(by_error["backwards_step"] == 2 * 19);
  // "good" was logged every step, on both ranks.
  const auto rows = read_history(run.dir);
  BOOST_REQUIRE_EQUAL(rows.size(), 20u);
  for (const Row& row : rows) BOOST_TEST(row.num.count("good/rank-1") == 1u);
  // One warning a key and rank: "", "_x", the long key and "late".
  for (int r = 0; r < 2; ++r) {
    std::istringstream lines(o.text);
    int warnings = 0;
    for (std::string line; std::getline(lines, line);)
      if (line.starts_with("[rank " + std::to_string(r) + "]") && has(line, "a value was refused")) ++warnings;
    BOOST_TEST(warnings == 4, "rank " << r << ": " << warnings << " warnings");
  }
}

BOOST_AUTO_TEST_CASE(under_torchrun_a_rank_that_throws_fails_and_the_ranks_it_stops_read_killed) {
  // The most common bad end of a multi-GPU job: one rank dies of an
  // exception, and torchrun stops the others with SIGTERM. Debian's torchrun
  // (python3-torch) starts the C++ ranks itself (--no_python).
  if (run("/usr/bin/python3 -c 'import torch.distributed.run'").status != 0) {
    BOOST_TEST_MESSAGE("skipped: torchrun (python3-torch) is not installed; ./build.sh installs it");
    return;
  }
  TempDir dir;
  // Debian 12's torch 1.13 on Python 3.11 needs --redirects/--tee given (it cannot parse its own defaults).
  const Output o = run("cd " + dir.path.string() + " && CHORUS_DIR=" + dir.path.string() +
                       " /usr/bin/python3 -m torch.distributed.run --redirects 1 --tee 1 --nproc_per_node 3 "
                       "--master_port " + std::to_string(test_port(88)) + " --no_python " + bin("chorus_e2e_worker") +
                       " --steps 20000 --step-us 5000 --ack-each 1 --throw-rank 1 --throw-step 100");
  BOOST_TEST_INFO(o.text.substr(o.text.size() > 6000 ? o.text.size() - 6000 : 0));
  BOOST_TEST(o.status != 0);
  Ended run(dir);
  BOOST_TEST(run.state() == "failed");
  BOOST_TEST(run.rank_field(1, "state") == "failed");
  BOOST_TEST(has(run.rank_field(1, "message"), "terminate called after throwing std::runtime_error: boom at step 100"));
  for (int r : {0, 2}) {
    BOOST_TEST(run.rank_field(r, "state") == "killed", "rank " << r);
    BOOST_TEST(has(run.rank_field(r, "message"), "stopped by SIGTERM"), run.rank_field(r, "message"));
  }
  // The cause comes first in the run's error.
  BOOST_TEST(run.text("error").starts_with("rank 1 failed (ended its run with exit code 134"), run.text("error"));
  // Every value a rank saw acknowledged is in the history (torchrun prefixes "[defaultR]:").
  std::map<int, long> acked;
  std::istringstream lines(o.text);
  for (std::string line; std::getline(lines, line);) {
    int r = -1;
    long s = -1;
    if (std::sscanf(line.c_str(), "[default%d]:ACKED %ld", &r, &s) == 2) acked[r] = std::max(acked[r], s);
  }
  BOOST_REQUIRE_EQUAL(acked.size(), 3u);
  for (const auto& [r, last] : acked) check_acked(run.dir, r, last);
}

BOOST_AUTO_TEST_CASE(sigterm_to_mpirun_ends_every_rank_killed_within_its_grace) {
  // Open MPI's mpirun passes a SIGTERM on to its ranks and SIGKILLs them
  // odls_base_sigkill_timeout seconds later (1 by default; 5 here, so that a
  // loaded machine does not decide the test): the ranks record themselves
  // killed within it, every acknowledged value kept.
  if (run("command -v mpirun").status != 0) {
    BOOST_TEST_MESSAGE("skipped: mpirun (openmpi-bin) is not installed; ./build.sh installs it");
    return;
  }
  TempDir dir;
  const fs::path log = dir.path / "mpirun.out";
  const std::string root = ::geteuid() == 0 ? " --allow-run-as-root" : "";
  const std::string job = "mpirun" + root + " --oversubscribe --tag-output --mca odls_base_sigkill_timeout 5 -np 2 -x CHORUS_DIR=" + dir.path.string() +
                          " " + bin("chorus_e2e_worker") + " --steps 20000 --step-us 5000 --ack-each 1";
  const Output o = run(job + " > " + log.string() + " 2>&1 & mp=$!; " + wait_for(log, "^\\[1,0\\]<stdout>:ACKED 40$") +
                       wait_for(log, "^\\[1,1\\]<stdout>:ACKED 40$") + "kill -TERM $mp; wait $mp; echo \"STATUS $?\"");
  const std::string text = slurp(log);
  BOOST_TEST_INFO(o.text + text.substr(text.size() > 4000 ? text.size() - 4000 : 0));
  Ended run(dir);
  BOOST_TEST(run.state() == "killed");
  for (int r : {0, 1}) {
    BOOST_TEST(run.rank_field(r, "state") == "killed", "rank " << r);
    BOOST_TEST(has(run.rank_field(r, "message"), "stopped by SIGTERM"), run.rank_field(r, "message"));
  }
  std::map<int, long> acked;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    int job_id = -1, r = -1;
    long s = -1;
    if (std::sscanf(line.c_str(), "[%d,%d]<stdout>:ACKED %ld", &job_id, &r, &s) == 3) acked[r] = std::max(acked[r], s);
  }
  BOOST_REQUIRE_EQUAL(acked.size(), 2u);
  for (const auto& [r, last] : acked) check_acked(run.dir, r, last);
}
