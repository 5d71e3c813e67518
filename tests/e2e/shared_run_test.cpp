// Real processes under `chorus launch`, logging into one shared run.
#define BOOST_TEST_MODULE e2e_shared_run
#include "harness.hpp"

#include <boost/test/unit_test.hpp>

#include <map>
#include <set>

using namespace e2e;

namespace {

/// The run host on `port`, the launcher's rendezvous on the next one.
std::string launch(const TempDir& dir, int ranks, int port, const std::string& worker_args) {
  return "CHORUS_PORT=" + std::to_string(port) + " " + launch_worker(dir.path, ranks, port + 1, worker_args);
}

} // namespace

BOOST_AUTO_TEST_CASE(eight_ranks_every_value_exactly_once_in_step_order) {
  TempDir dir;
  const int R = 8, S = 200;
  Output out = run(launch(dir, R, test_port(1), "--steps " + std::to_string(S) + " --barrier-every 50 --uneven 1"));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  const fs::path rd = run_dir_of(out.text);
  BOOST_REQUIRE(!rd.empty());

  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(S));
  std::int64_t prev = -1;
  for (const Row& row : rows) {
    const std::int64_t s = row.step();
    BOOST_TEST_CONTEXT("step " << s) {
      BOOST_TEST(s > prev); // strictly increasing
      prev = s;
      const double st = static_cast<double>(s);
      // Reductions over all 8 ranks, exact.
      BOOST_TEST(row.num.at("loss") == 3.5 + st * 0.5);
      BOOST_TEST(row.count.at("loss") == R);
      BOOST_TEST(row.num.at("tokens") == 100.0 * R + 28.0);
      BOOST_TEST(row.num.at("lo") == st - (R - 1));
      BOOST_TEST(row.num.at("hi") == st + (R - 1));
      // Unreduced, logged by every rank: one column per rank.
      for (int r = 0; r < R; ++r) BOOST_TEST(row.num.at("per_rank/rank-" + std::to_string(r)) == r * 1000 + st);
      BOOST_TEST(row.num.count("per_rank") == 0u);
      // Logged by rank 0 alone and declared first: its plain key.
      BOOST_TEST(row.num.at("only0") == st);
      BOOST_TEST(row.count.at("only0") == 1);
      // Unreduced, logged by rank 0 at every step and by the others at even
      // steps: a column per rank at every step, never the plain key.
      const bool even = s % 2 == 0;
      for (int r = 0; r < R; ++r)
        BOOST_TEST(row.num.count("uneven/rank-" + std::to_string(r)) == (r == 0 || even ? 1u : 0u), "rank " << r);
      BOOST_TEST(row.num.at("uneven/rank-0") == st);
      BOOST_TEST(row.num.count("uneven") == 0u);
      // Nothing else: _step, _timestamp, _runtime, loss, tokens, lo, hi, only0, 8 per-rank columns, and uneven's.
      BOOST_TEST(row.num.size() == static_cast<std::size_t>(8 + R + (even ? R : 1)));
    }
  }

  simdjson::dom::parser parser;
  auto info = read_run_json(parser, rd);
  BOOST_TEST(std::string_view(info["state"].get_string()) == "finished");
  BOOST_TEST(int64_t(info["world_size"].get_int64()) == R);
  int finished = 0;
  for (auto rank : info["ranks"].get_array())
    if (std::string_view(rank["state"].get_string()) == "finished") ++finished;
  BOOST_TEST(finished == R);
  auto summary = slurp(rd / "summary.json");
  BOOST_TEST(summary.find("\"done\":true") != std::string::npos);
  // The last value of each column: rank 0's at the last step, rank 1's at the last even one.
  BOOST_TEST(summary.find("\"uneven/rank-0\":" + std::to_string(S - 1)) != std::string::npos, summary);
  BOOST_TEST(summary.find("\"uneven/rank-1\":" + std::to_string(1000 + S - 2)) != std::string::npos, summary);
  BOOST_TEST(summary.find("\"uneven\":") == std::string::npos, summary);
  auto config = slurp(rd / "config.json");
  BOOST_TEST(config.find("\"optimizer\":\"sgd\"") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(sigkill_of_one_rank_leaves_the_others_whole) {
  TempDir dir;
  const int R = 4, S = 300, dead = 2, die_at = 150;
  Output out = run(launch(dir, R, test_port(2),
                          "--steps " + std::to_string(S) + " --die-rank " + std::to_string(dead) + " --die-step " +
                              std::to_string(die_at)));
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.status == 128 + 9); // launch reports the worst rank: killed by SIGKILL
  const fs::path rd = run_dir_of(out.text);
  BOOST_REQUIRE(!rd.empty());

  simdjson::dom::parser parser;
  auto info = read_run_json(parser, rd);
  // chorus launch added each rank's exit code: the killed one's is 128 + SIGKILL.
  for (int r = 0; r < R; ++r)
    BOOST_TEST(int64_t(info["exit_codes"][std::to_string(r)].get_int64()) == (r == dead ? 128 + 9 : 0));
  for (auto rank : info["ranks"].get_array()) {
    const auto r = int64_t(rank["rank"].get_int64());
    const std::string_view state = rank["state"].get_string();
    BOOST_TEST_CONTEXT("rank " << r) {
      if (r == dead) {
        BOOST_TEST(state == "crashed");
        BOOST_TEST(int64_t(rank["last_step"].get_int64()) == die_at - 1);
      } else {
        BOOST_TEST(state == "finished");
      }
    }
  }

  Output shown = run(bin("chorus") + " show --charts 0 " + rd.string());
  BOOST_TEST_INFO(shown.text);
  BOOST_TEST(shown.text.find("exit codes (chorus launch, by global rank): 0=0 1=0 2=137 (signal 9) 3=0") !=
             std::string::npos);

  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(S));
  for (const Row& row : rows) {
    const std::int64_t s = row.step();
    BOOST_TEST_CONTEXT("step " << s) {
      for (int r = 0; r < R; ++r) {
        const bool expect = r != dead || s < die_at;
        BOOST_TEST(row.num.count("per_rank/rank-" + std::to_string(r)) == (expect ? 1u : 0u));
      }
      BOOST_TEST(row.count.at("loss") == (s < die_at ? R : R - 1));
    }
  }
}

// A host that never starts: lifecycle_test, without_a_host_every_rank_fails_init_within_init_timeout_naming_the_address.

BOOST_AUTO_TEST_CASE(ranks_that_skip_finish_are_finished_by_the_destructor) {
  TempDir dir;
  Output out = run(launch(dir, 3, test_port(4), "--steps 50 --no-finish 1"));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  // No RUN_DIR line (finish was not awaited): find the run on disk.
  const std::vector<fs::path> runs = find_runs(dir.path);
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  simdjson::dom::parser parser;
  auto info = read_run_json(parser, runs[0]);
  BOOST_TEST(std::string_view(info["state"].get_string()) == "finished");
  BOOST_TEST(read_history(runs[0]).size() == 50u);
}

BOOST_AUTO_TEST_CASE(a_host_killed_without_a_word_leaves_a_recoverable_log_and_frees_the_others) {
  TempDir dir;
  // A queue of 1024 values fills soon after the host is gone: later calls are
  // refused at once, naming why, instead of waiting on a queue nobody drains.
  // (A SIGTERM instead ends the host's run killed: end_states_test.cpp.)
  const int R = 3, S = 400, die_at = 120;
  Output out = run(launch(dir, R, test_port(5),
                          "--steps " + std::to_string(S) + " --barrier-every 50 --die-rank 0 --die-step " +
                              std::to_string(die_at) + " --die-signal 9 --queue 1024"));
  BOOST_TEST_INFO(out.text);
  // The other ranks learn that their host is gone instead of hanging.
  BOOST_TEST(out.text.find("exited with signal 9") != std::string::npos);
  BOOST_TEST(out.text.find("went away") != std::string::npos);
  BOOST_TEST(out.text.find("queue is full: the call was refused at once") != std::string::npos);
  BOOST_TEST(out.status != 0);

  const std::vector<fs::path> runs = find_runs(dir.path, "wal");
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  Output rec = run(bin("chorus") + " recover " + runs[0].string());
  BOOST_TEST_INFO(rec.text);
  BOOST_REQUIRE_EQUAL(rec.status, 0);
  // The host's values of steps [0, die_at) were acknowledged, so in its WAL;
  // every rank passed the barrier after step 99, so all of theirs up to it are too.
  auto rows = read_history(runs[0]);
  BOOST_REQUIRE_GE(rows.size(), static_cast<std::size_t>(die_at));
  for (std::size_t s = 0; s < static_cast<std::size_t>(die_at); ++s) {
    BOOST_TEST_CONTEXT("step " << s) {
      BOOST_TEST(rows[s].step() == static_cast<std::int64_t>(s));
      BOOST_TEST(rows[s].num.at("only0") == static_cast<double>(s));
      if (s < 100) BOOST_TEST(rows[s].count.at("loss") == R);
    }
  }
  simdjson::dom::parser parser;
  auto info = read_run_json(parser, runs[0]);
  BOOST_TEST(std::string_view(info["state"].get_string()) != "running");
}

BOOST_AUTO_TEST_CASE(a_frozen_rank_is_declared_crashed_by_heartbeat_and_the_others_finish) {
  // Rank 1 freezes (SIGSTOP): its process lives and its socket stays open, so
  // only the missing heartbeats tell. Ranks are started by hand so that the
  // test can kill the frozen one at the end.
  TempDir dir;
  const int port = test_port(6), S = 200, freeze_at = 60;
  const std::string env = "CHORUS_DIR=" + dir.path.string() + " CHORUS_PORT=" + std::to_string(port) +
                          " WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(port + 1);
  const std::string args = " --steps " + std::to_string(S) + " --die-rank 1 --die-step " +
                           std::to_string(freeze_at) + " --die-signal 19 --heartbeat-ms 200 --connection-timeout-ms 6000";
  auto rank = [&](int r) {
    return env + " RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) + " " + bin("chorus_e2e_worker") + args;
  };
  const std::string pidfile = (dir.path / "rank1.pid").string();
  Output out = run("(" + rank(1) + " & echo $! > " + pidfile + "); " + rank(2) + " & p2=$!; " + rank(0) +
                   "; s0=$?; wait $p2; s2=$?; kill -9 $(cat " + pidfile + "); echo \"STATUS $s0 $s2\"");
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.text.find("STATUS 0 0") != std::string::npos);
  const fs::path rd = run_dir_of(out.text);
  BOOST_REQUIRE(!rd.empty());

  simdjson::dom::parser parser;
  auto info = read_run_json(parser, rd);
  for (auto r : info["ranks"].get_array()) {
    const auto id = int64_t(r["rank"].get_int64());
    BOOST_TEST_CONTEXT("rank " << id) {
      BOOST_TEST(std::string_view(r["state"].get_string()) == (id == 1 ? "crashed" : "finished"));
      if (id == 1) BOOST_TEST(int64_t(r["last_step"].get_int64()) == freeze_at - 1);
    }
  }
  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(S));
  for (const Row& row : rows) BOOST_TEST(row.count.at("loss") == (row.step() < freeze_at ? 3 : 2));
}

BOOST_AUTO_TEST_CASE(every_rank_samples_its_process_and_the_node_into_system_jsonl) {
  TempDir dir;
  const int R = 4;
  // 0.1 s samples over a run of about a second.
  Output out = run("CHORUS_SYSTEM_INTERVAL=0.1 " + launch(dir, R, test_port(7), "--steps 100 --step-us 10000"));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  const fs::path rd = run_dir_of(out.text);
  BOOST_REQUIRE(!rd.empty());

  std::ifstream in(rd / "system.jsonl");
  std::string line;
  simdjson::dom::parser parser;
  std::map<int, int> lines_of;
  int node_lines = 0;
  while (std::getline(in, line)) {
    simdjson::dom::element doc;
    BOOST_REQUIRE_MESSAGE(!parser.parse(line).get(doc), "system line is JSON: " << line);
    const auto rank = static_cast<int>(doc["_rank"].get_int64());
    BOOST_TEST(int64_t(doc["_node"].get_int64()) == 0);
    ++lines_of[rank];
    const std::string mine = "/rank-" + std::to_string(rank);
    bool has_node = false;
    for (auto [k, v] : doc.get_object()) {
      const std::string key(k);
      if (key.starts_with("_")) continue;
      BOOST_TEST_CONTEXT(key) {
        BOOST_TEST(key.starts_with("system."));
        // Every key carries its label: this rank's, or (local rank 0 only) the node's.
        if (key.ends_with("/node-0")) {
          has_node = true;
          BOOST_TEST(rank == 0);
        } else {
          BOOST_TEST(key.ends_with(mine));
        }
        BOOST_TEST(v.is_number());
      }
    }
    BOOST_TEST(double(doc["system.proc.memory.rss_bytes" + mine].get_double()) > 1e6);
    const double cpu = doc["system.proc.cpu.percent" + mine].get_double();
    BOOST_TEST((cpu >= 0 && cpu < 100.0 * 64));
    if (has_node) {
      ++node_lines;
      const double total = doc["system.memory.total_bytes/node-0"].get_double();
      const double used = doc["system.memory.used_bytes/node-0"].get_double();
      BOOST_TEST((used > 0 && used < total));
      const double node_cpu = doc["system.cpu.percent/node-0"].get_double();
      BOOST_TEST((node_cpu >= 0 && node_cpu <= 100));
    }
  }
  BOOST_TEST(lines_of.size() == static_cast<std::size_t>(R));
  for (auto [rank, n] : lines_of) BOOST_TEST(n >= 2, "rank " << rank << " sampled " << n << " times");
  BOOST_TEST(node_lines >= 2);
}
