// The Group actor with real processes: jobs of several runs (a run per rank,
// a run per node) under `chorus launch`, two nodes as two launches on this
// machine, leave one group.json with every member, its states, its ranks'
// exit codes, start and end; a member that dies, never starts or is stopped
// is recorded as such and the group still finishes; `chorus ls` and
// `chorus show GROUP` show it.
#define BOOST_TEST_MODULE e2e_group
#include "harness.hpp"

#include <boost/test/unit_test.hpp>

#include <future>
#include <map>
#include <set>

using namespace e2e;

namespace {

constexpr int steps = 40;

/// A job of `nodes` launches of `per_node` ranks each, all at once; the
/// status of each launch, and their output. Node 0's workers also take
/// `node0_args` (later flags win).
struct Job {
  std::vector<int> status;
  std::string text;
};

Job run_job(const TempDir& dir, int salt, const std::string& env, int nodes, int per_node,
            const std::string& worker_args, int launched = -1, const std::string& node0_args = {}) {
  const int port = test_port(salt);
  const std::string id = "group" + std::to_string(salt);
  auto node = [&](int k) {
    const fs::path out = dir.path / ("node" + std::to_string(k) + ".out");
    Output o = run(env + " " +
                   launch_worker(dir.path, per_node, port, k == 0 ? worker_args + " " + node0_args : worker_args,
                                 "--nnodes " + std::to_string(nodes) + " --node-rank " + std::to_string(k) +
                                     " --master-addr 127.0.0.1 --run-id " + id) +
                   " > " + out.string() + " 2>&1");
    return o.status;
  };
  if (launched < 0) launched = nodes;
  std::vector<std::future<int>> others;
  for (int k = 1; k < launched; ++k) others.push_back(std::async(std::launch::async, node, k));
  Job job;
  job.status.push_back(node(0));
  for (auto& f : others) job.status.push_back(f.get());
  for (int k = 0; k < launched; ++k) job.text += slurp(dir.path / ("node" + std::to_string(k) + ".out"));
  return job;
}

/// The one group directory of project e2e.
fs::path group_dir(const TempDir& dir) {
  std::vector<fs::path> groups;
  for (auto& p : fs::directory_iterator(dir.path / "e2e"))
    if (p.is_directory()) groups.push_back(p.path());
  BOOST_REQUIRE_EQUAL(groups.size(), 1u);
  return groups[0];
}

struct Rank {
  std::int64_t rank;
  std::string state;
  std::int64_t last_step;
};

struct Member {
  std::int64_t index = -1, node = -1;
  std::string id, name, dir, state, message;
  std::optional<double> start, end;
  std::int64_t rows = 0;
  std::vector<Rank> ranks;
  std::map<std::string, std::int64_t> exit_codes;
  std::string summary;
};

struct Group {
  std::string group, project, mode, scope, state;
  std::int64_t size = 0;
  std::optional<double> start, end;
  std::vector<Member> members;
  std::map<std::string, std::int64_t> exit_codes;
};

std::optional<double> time_of(simdjson::dom::element e) {
  double v = 0;
  if (e.get(v) != simdjson::SUCCESS) return std::nullopt;
  return v;
}

/// group.json as a reader of the file sees it (read here with simdjson, not chorus's reader).
Group read_group_json(const fs::path& dir) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  const auto err = parser.load((dir / "group.json").string()).get(doc);
  BOOST_REQUIRE_MESSAGE(!err, (dir / "group.json").string() << ": " << simdjson::error_message(err));
  Group g;
  g.group = std::string(std::string_view(doc["group"].get_string()));
  g.project = std::string(std::string_view(doc["project"].get_string()));
  g.mode = std::string(std::string_view(doc["mode"].get_string()));
  g.scope = std::string(std::string_view(doc["scope"].get_string()));
  g.state = std::string(std::string_view(doc["state"].get_string()));
  g.size = doc["size"].get_int64();
  g.start = time_of(doc["start_time"]);
  g.end = time_of(doc["end_time"]);
  for (auto [k, v] : doc["exit_codes"].get_object()) g.exit_codes[std::string(k)] = v.get_int64();
  for (auto m : doc["members"].get_array()) {
    Member x;
    x.index = m["index"].get_int64();
    x.node = m["node"].get_int64();
    for (auto [key, out] : {std::pair{"id", &x.id}, std::pair{"name", &x.name}, std::pair{"dir", &x.dir},
                            std::pair{"state", &x.state}, std::pair{"message", &x.message}})
      *out = std::string(std::string_view(m[key].get_string()));
    x.start = time_of(m["start_time"]);
    x.end = time_of(m["end_time"]);
    x.rows = m["rows"].get_int64();
    for (auto r : m["ranks"].get_array())
      x.ranks.push_back({r["rank"].get_int64(), std::string(std::string_view(r["state"].get_string())),
                         r["last_step"].get_int64()});
    for (auto [k, v] : m["exit_codes"].get_object()) x.exit_codes[std::string(k)] = v.get_int64();
    x.summary = simdjson::minify(m["summary"]);
    g.members.push_back(std::move(x));
  }
  return g;
}

/// The group's start is its first member's, its end its last member's, and
/// every member ran within them.
void check_times(const Group& g) {
  BOOST_REQUIRE(g.start);
  BOOST_REQUIRE(g.end);
  BOOST_TEST(*g.start <= *g.end);
  for (const Member& m : g.members) {
    if (m.state == "missing") continue;
    BOOST_TEST_CONTEXT("member " << m.index) {
      BOOST_REQUIRE(m.start);
      BOOST_REQUIRE(m.end);
      BOOST_TEST(*g.start <= *m.start);
      BOOST_TEST(*m.start <= *m.end);
      BOOST_TEST(*m.end <= *g.end);
    }
  }
}

/// A member's run directory holds the run it names.
void check_run_dir(const Member& m) {
  simdjson::dom::parser parser;
  auto info = read_run_json(parser, m.dir);
  BOOST_TEST(std::string_view(info["id"].get_string()) == m.id);
  BOOST_TEST(std::string_view(info["name"].get_string()) == m.name);
}

/// Member `rank` of a per-rank group on `node`: the worker's run of `steps`
/// steps, finished, with its exit code and summary, in the group directory.
void check_rank_member(const Group& g, const fs::path& gd, int rank, int node, int steps) {
  BOOST_REQUIRE_GT(g.members.size(), static_cast<std::size_t>(rank));
  const Member& m = g.members[static_cast<std::size_t>(rank)];
  BOOST_TEST_CONTEXT("rank " << rank) {
    BOOST_TEST(m.index == rank);
    BOOST_TEST(m.node == node);
    BOOST_TEST(m.state == "finished");
    BOOST_TEST(m.name == g.group + "-rank-" + std::to_string(rank));
    BOOST_TEST(m.rows == steps);
    BOOST_REQUIRE_EQUAL(m.ranks.size(), 1u);
    BOOST_TEST(m.ranks[0].rank == rank);
    BOOST_TEST(m.ranks[0].state == "finished");
    BOOST_TEST(m.ranks[0].last_step == steps - 1);
    BOOST_TEST((m.exit_codes == std::map<std::string, std::int64_t>{{std::to_string(rank), 0}}));
    BOOST_TEST(m.summary.find(R"("done":true)") != std::string::npos, m.summary);
    BOOST_TEST(fs::path(m.dir).parent_path() == gd);
    check_run_dir(m);
  }
}

/// The cells of the lines of `out` that start (after the indent) with `first`;
/// cells are two or more spaces apart.
std::vector<std::string> row_of(const std::string& out, const std::string& first) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("  " + first + "  ")) continue;
    std::vector<std::string> cells;
    for (std::size_t at = 2; at < line.size();) {
      const std::size_t gap = line.find("  ", at);
      cells.push_back(line.substr(at, gap - at));
      at = gap == std::string::npos ? line.size() : line.find_first_not_of(' ', gap);
    }
    return cells;
  }
  return {};
}

using Cells = std::vector<std::string>;

} // namespace

BOOST_AUTO_TEST_CASE(a_run_per_rank_across_two_nodes_makes_one_group_of_every_rank) {
  TempDir dir;
  const Job job = run_job(dir, 31, "CHORUS_INSECURE=1 CHORUS_MODE=new", 2, 2, "--steps 40 --barrier-every 10");
  BOOST_TEST_INFO(job.text);
  BOOST_REQUIRE((job.status == std::vector{0, 0}));
  // Every member reached the group (else group.json holds only what launch read from run.json).
  BOOST_TEST(job.text.find("the job's group") == std::string::npos, job.text);

  const fs::path gd = group_dir(dir);
  const Group g = read_group_json(gd);
  BOOST_TEST(g.group == gd.filename().string());
  BOOST_TEST(g.project == "e2e");
  BOOST_TEST(g.mode == "new");
  BOOST_TEST(g.scope == "global");
  BOOST_TEST(g.size == 4);
  BOOST_TEST(g.state == "finished");
  check_times(g);
  BOOST_REQUIRE_EQUAL(g.members.size(), 4u);
  for (int r = 0; r < 4; ++r) check_rank_member(g, gd, r, r / 2, steps);
  BOOST_TEST((g.exit_codes == std::map<std::string, std::int64_t>{{"0", 0}, {"1", 0}, {"2", 0}, {"3", 0}}));

  // chorus ls: the group's line, then its runs with the rank each holds.
  const Output ls = run(bin("chorus") + " ls " + dir.path.string());
  BOOST_TEST_INFO(ls.text);
  BOOST_TEST(ls.status == 0);
  BOOST_TEST(ls.text.find("e2e / " + g.group + "  (group: 4 runs, new global, finished") != std::string::npos);
  BOOST_TEST(ls.text.find("exit codes: 0)") != std::string::npos);
  for (const Member& m : g.members) {
    const Cells row = row_of(ls.text, m.id);
    BOOST_REQUIRE_EQUAL(row.size(), 8u);
    BOOST_TEST(row[1] == "finished");
    BOOST_TEST(row[2] == "1 (rank " + std::to_string(m.index) + ")");
    BOOST_TEST(row[3] == std::to_string(steps));
    BOOST_TEST(row[6] == "0");
  }

  // chorus show GROUP, by name: the members side by side.
  const Output show = run(bin("chorus") + " show --width 200 --dir " + dir.path.string() + " " + g.group);
  BOOST_TEST_INFO(show.text);
  BOOST_TEST(show.status == 0);
  BOOST_TEST(show.text.starts_with("group " + g.group + "\n"));
  BOOST_TEST(show.text.find("members (4)") != std::string::npos);
  BOOST_TEST((row_of(show.text, "runs") == Cells{"runs", "4: 4 finished"}));
  BOOST_TEST((row_of(show.text, "state") == Cells{"state", "finished"}));
  for (const Member& m : g.members) {
    const std::string r = std::to_string(m.index);
    BOOST_TEST_CONTEXT("rank " << r) {
      const Cells row = row_of(show.text, "rank-" + r);
      BOOST_REQUIRE_EQUAL(row.size(), 10u);
      BOOST_TEST(row[1] == m.id);
      BOOST_TEST(row[2] == "finished");
      BOOST_TEST(row[4] == std::to_string(m.index / 2)); // its node
      BOOST_TEST(row[5] == r);                           // its global rank
      BOOST_TEST(row[6] == std::to_string(steps - 1));
      BOOST_TEST(row[7] == std::to_string(steps));
      BOOST_TEST(row[8] == "0");
    }
  }
  BOOST_TEST(show.text.find("the same on every member: optimizer=sgd, steps=40") != std::string::npos);
  // Final values, a column per member: the worker's loss is rank + step / 2, tokens 100 + rank.
  BOOST_TEST((row_of(show.text, "KEY") == Cells{"KEY", "rank-0", "rank-1", "rank-2", "rank-3"}));
  BOOST_TEST((row_of(show.text, "loss") == Cells{"loss", "19.5", "20.5", "21.5", "22.5"}));
  BOOST_TEST((row_of(show.text, "tokens") == Cells{"tokens", "100", "101", "102", "103"}));
  BOOST_TEST((row_of(show.text, "_step") == Cells{"_step", "39", "39", "39", "39"}));
  BOOST_TEST((row_of(show.text, "done") == Cells{"done", "true", "true", "true", "true"}));
  BOOST_TEST((row_of(show.text, "only0") == Cells{"only0", "39", "-", "-", "-"}));

  // By its directory too; and a run of it is still shown as a run.
  const Output by_dir = run(bin("chorus") + " show --no-history " + gd.string());
  BOOST_TEST(by_dir.status == 0);
  BOOST_TEST(by_dir.text.starts_with("group " + g.group + "\n"));
  const Output one = run(bin("chorus") + " show --no-history --no-system " + g.members[2].dir);
  BOOST_TEST(one.status == 0);
  BOOST_TEST(one.text.starts_with("run " + g.members[2].id + "\n"), one.text);
}

BOOST_AUTO_TEST_CASE(node_runs_report_to_the_group_over_the_jobs_credentials) {
  TempDir dir;
  Output certs = run(bin("chorus") + " certs " + (dir.path / "creds").string());
  BOOST_REQUIRE_MESSAGE(certs.status == 0, certs.text);
  // No CHORUS_INSECURE: the node runs stay on their nodes, their hosts reach
  // global rank 0's group over mutual TLS.
  const Job job = run_job(dir, 32, "CHORUS_TLS_DIR=" + (dir.path / "creds").string() + " CHORUS_MODE=shared CHORUS_SCOPE=worker",
                          2, 2, "--steps 40 --barrier-every 10");
  BOOST_TEST_INFO(job.text);
  BOOST_REQUIRE((job.status == std::vector{0, 0}));
  BOOST_TEST(job.text.find("WARNING") == std::string::npos);
  BOOST_TEST(job.text.find("the job's group") == std::string::npos, job.text);

  const Group g = read_group_json(group_dir(dir));
  BOOST_TEST(g.mode == "shared");
  BOOST_TEST(g.scope == "worker");
  BOOST_TEST(g.size == 2);
  BOOST_TEST(g.state == "finished");
  check_times(g);
  BOOST_REQUIRE_EQUAL(g.members.size(), 2u);
  for (int n = 0; n < 2; ++n) {
    const Member& m = g.members[static_cast<std::size_t>(n)];
    BOOST_TEST_CONTEXT("node " << n) {
      BOOST_TEST(m.index == n);
      BOOST_TEST(m.state == "finished");
      BOOST_TEST(m.name == g.group + "-node-" + std::to_string(n));
      BOOST_REQUIRE_EQUAL(m.ranks.size(), 2u);
      for (int local = 0; local < 2; ++local) {
        const Rank& r = m.ranks[static_cast<std::size_t>(local)];
        BOOST_TEST(r.rank == n * 2 + local);
        BOOST_TEST(r.state == "finished");
        BOOST_TEST(r.last_step == steps - 1);
      }
      const std::string a = std::to_string(n * 2), b = std::to_string(n * 2 + 1);
      BOOST_TEST((m.exit_codes == std::map<std::string, std::int64_t>{{a, 0}, {b, 0}}));
      check_run_dir(m);
      check_worker_history(m.dir, {n * 2, n * 2 + 1}, steps);
    }
  }
  BOOST_TEST(g.exit_codes.size() == 4u);

  const Output show = run(bin("chorus") + " show --width 200 " + group_dir(dir).string());
  BOOST_TEST_INFO(show.text);
  BOOST_TEST((row_of(show.text, "node-1").at(5) == "2-3"));
  BOOST_TEST((row_of(show.text, "loss") == Cells{"loss", "20", "22"})); // the mean over each node's ranks
}

BOOST_AUTO_TEST_CASE(a_member_killed_with_sigkill_is_crashed_and_the_group_finishes) {
  TempDir dir;
  // A run per rank on one node; rank 2 dies at step 10 without a word.
  const Job job = run_job(dir, 33, "CHORUS_MODE=new", 1, 3, "--steps 40 --die-rank 2 --die-step 10");
  BOOST_TEST_INFO(job.text);
  BOOST_REQUIRE_EQUAL(job.status.size(), 1u);
  BOOST_TEST(job.status[0] == 128 + 9);

  const Group g = read_group_json(group_dir(dir));
  BOOST_TEST(g.state == "crashed");
  check_times(g);
  BOOST_REQUIRE_EQUAL(g.members.size(), 3u);
  for (int r : {0, 1}) {
    BOOST_TEST(g.members[static_cast<std::size_t>(r)].state == "finished");
    BOOST_TEST(g.members[static_cast<std::size_t>(r)].ranks.at(0).state == "finished");
  }
  const Member& dead = g.members[2];
  BOOST_TEST(dead.state == "crashed");
  BOOST_TEST(dead.message.find("connection was lost") != std::string::npos, dead.message);
  BOOST_TEST(dead.ranks.at(0).state == "crashed");
  BOOST_TEST((g.exit_codes == std::map<std::string, std::int64_t>{{"0", 0}, {"1", 0}, {"2", 137}}));

  const Output ls = run(bin("chorus") + " ls " + dir.path.string());
  BOOST_TEST_INFO(ls.text);
  BOOST_TEST(ls.text.find("(group: 3 runs, new global, crashed") != std::string::npos);
  BOOST_TEST(ls.text.find("exit codes: 0=0 1=0 2=137)") != std::string::npos);
  const Cells row = row_of(ls.text, dead.id);
  BOOST_REQUIRE_EQUAL(row.size(), 8u);
  BOOST_TEST(row[1] == "crashed");
  BOOST_TEST(row[6] == "137");
}

BOOST_AUTO_TEST_CASE(a_node_run_that_lost_a_rank_is_crashed_in_the_group) {
  TempDir dir;
  // Node 1's second rank (global rank 3) dies at step 10; its node's run goes on.
  const Job job = run_job(dir, 34, "CHORUS_INSECURE=1 CHORUS_MODE=shared CHORUS_SCOPE=worker", 2, 2,
                          "--steps 40 --die-rank 3 --die-step 10");
  BOOST_TEST_INFO(job.text);
  BOOST_REQUIRE((job.status == std::vector{0, 128 + 9}));
  const Group g = read_group_json(group_dir(dir));
  // A rank gone without a word names its run's end, and so the group's: crashed.
  BOOST_TEST(g.state == "crashed");
  BOOST_REQUIRE_EQUAL(g.members.size(), 2u);
  BOOST_TEST(g.members[0].state == "finished");
  const Member& node1 = g.members[1];
  BOOST_TEST(node1.state == "crashed");
  BOOST_REQUIRE_EQUAL(node1.ranks.size(), 2u);
  BOOST_TEST(node1.ranks[0].state == "finished");
  BOOST_TEST(node1.ranks[1].state == "crashed");
  BOOST_TEST(node1.ranks[1].last_step < steps - 1);
  BOOST_TEST((node1.exit_codes == std::map<std::string, std::int64_t>{{"2", 0}, {"3", 137}}));
  check_times(g);
}

BOOST_AUTO_TEST_CASE(a_place_whose_run_never_starts_is_missing_and_the_group_finishes) {
  TempDir dir;
  // A job of two nodes of which only node 0 is ever launched: global rank 0
  // waits for node 1's runs until the registration window (init_timeout) closes.
  const Job job = run_job(dir, 35, "CHORUS_INSECURE=1 CHORUS_MODE=new CHORUS_INIT_TIMEOUT=2", 2, 2, "--steps 20", 1);
  BOOST_TEST_INFO(job.text);
  BOOST_REQUIRE((job.status == std::vector{0}));
  const Group g = read_group_json(group_dir(dir));
  BOOST_TEST(g.size == 4);
  BOOST_TEST(g.state == "crashed"); // the runs that never came are lost
  BOOST_REQUIRE_EQUAL(g.members.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const Member& m = g.members[static_cast<std::size_t>(r)];
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(m.state == (r < 2 ? "finished" : "missing"));
      BOOST_REQUIRE_EQUAL(m.ranks.size(), 1u);
      BOOST_TEST(m.ranks[0].rank == r);
    }
  }
  BOOST_TEST(g.members[3].message.find("never registered") != std::string::npos);
  BOOST_TEST(g.exit_codes.size() == 2u); // node 0's ranks only
  BOOST_REQUIRE(g.end);

  const Output ls = run(bin("chorus") + " ls " + dir.path.string());
  BOOST_TEST(ls.text.find("place 3: never registered") != std::string::npos, ls.text);
}

BOOST_AUTO_TEST_CASE(a_node_run_whose_group_never_answers_still_takes_its_own_ranks) {
  // Only node 1 of a two-node job is launched: its run host dials the
  // group on global rank 0 for all of init_timeout, in vain. The run it
  // hosts still takes both its ranks, its own included (whose join comes
  // after that dial), and ends finished; only the group misses it.
  TempDir dir;
  const std::string env = "CHORUS_INSECURE=1 CHORUS_MODE=shared CHORUS_SCOPE=worker CHORUS_INIT_TIMEOUT=2 ";
  const Output o = run(env + launch_worker(dir.path, 2, test_port(38), "--steps 20",
                                           "--nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --run-id group38"));
  BOOST_TEST_INFO(o.text);
  BOOST_REQUIRE_EQUAL(o.status, 0);
  BOOST_TEST(o.text.find("could not reach the job's group") != std::string::npos);
  const std::vector<fs::path> runs = find_runs(dir.path);
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  check_worker_history(runs[0], {2, 3}, 20);
}

BOOST_AUTO_TEST_CASE(a_run_whose_reports_cannot_reach_the_group_is_filled_in_from_its_run_json) {
  // Without credentials, node 1's run cannot report to global rank 0's group
  // (rank 0 says so, and the group records it missing when the registration
  // window closes). Node 1's chorus launch, seeing the group directory, fills
  // its member in from the run's own files when it ends, while rank 0 still
  // runs; the group's later writes keep that.
  TempDir dir;
  const Job job = run_job(dir, 37, "CHORUS_MODE=new CHORUS_INIT_TIMEOUT=2", 2, 1, "--steps 30 --step-us 100000", -1,
                          "--steps 80");
  BOOST_TEST_INFO(job.text);
  BOOST_REQUIRE((job.status == std::vector{0, 0}));
  BOOST_TEST(job.text.find("cannot report to the job's group without the job's credentials") != std::string::npos);
  const fs::path gd = group_dir(dir);
  const Group g = read_group_json(gd);
  BOOST_TEST(g.state == "finished");
  check_times(g);
  BOOST_TEST((g.exit_codes == std::map<std::string, std::int64_t>{{"0", 0}, {"1", 0}}));
  BOOST_REQUIRE_EQUAL(g.members.size(), 2u);
  check_rank_member(g, gd, 0, 0, 80);
  check_rank_member(g, gd, 1, 1, 30);
  BOOST_TEST(g.members[0].message.empty(), g.members[0].message);
  BOOST_TEST(g.members[1].message.find("no report of this run reached the group") != std::string::npos,
             g.members[1].message);
}

BOOST_AUTO_TEST_CASE(sigterm_to_launch_leaves_the_groups_runs_killed) {
  TempDir dir;
  const fs::path log = dir.path / "launch.out";
  const int port = test_port(36);
  const std::string launch =
      "CHORUS_MODE=new " + launch_worker(dir.path, 2, port, "--steps 1000000 --step-us 2000 --ack-each 1", "--grace 30");
  Output out = run(launch + " > " + log.string() + " 2>&1 & pid=$!; i=0; until grep -q '\\[rank 1\\] ACKED 20$' " +
                   log.string() + " && grep -q '\\[rank 0\\] ACKED 20$' " + log.string() +
                   " || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; kill -TERM $pid; wait $pid; echo \"STATUS $?\"");
  BOOST_TEST_INFO(out.text << slurp(log));
  BOOST_TEST(out.text.find("STATUS 143") != std::string::npos);
  const Group g = read_group_json(group_dir(dir));
  BOOST_TEST(g.state == "killed");
  BOOST_REQUIRE_EQUAL(g.members.size(), 2u);
  for (const Member& m : g.members) {
    BOOST_TEST_CONTEXT("member " << m.index) {
      BOOST_TEST(m.state == "killed");
      BOOST_TEST(m.ranks.at(0).state == "killed");
      BOOST_TEST(m.ranks.at(0).last_step >= 20);
      simdjson::dom::parser parser;
      auto info = read_run_json(parser, m.dir);
      BOOST_TEST(std::string_view(info["state"].get_string()) == "killed");
      BOOST_TEST(std::string_view(info["ranks"].at(0)["state"].get_string()) == "killed");
    }
  }
  BOOST_TEST((g.exit_codes == std::map<std::string, std::int64_t>{{"0", 143}, {"1", 143}}));
  check_times(g);
}
