// A run whose host dies without a word (SIGKILL) keeps run.json saying
// "running"; every command reads it as crashed, with its last committed
// step, without `chorus recover` (io/store/lease.hpp): here a real job's host
// killed on this machine, and a run of another machine whose lease expired.
#define BOOST_TEST_MODULE cli_lost_host
#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"
#include "tests/upload/tfevents_reader.hpp"

#include <simdjson.h>

#include <csignal>
#include <set>
#include <thread>

using namespace chorus::test;
namespace tfevents = chorus::test::tfevents;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

std::string bin(const std::string& name) { return std::string(CHORUS_BINARY_DIR) + "/bin/" + name; }

// The run directory under `root` that holds a run.json; empty while there is none.
fs::path run_under(const fs::path& root) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() == "run.json") return it->path().parent_path();
  return {};
}

// A run of the e2e worker (one rank, its own host) that commits steps 0-39,
// meets a barrier at step 40 and waits there; then its host is killed with
// SIGKILL, so that nothing ends the run. Returns the run's directory.
fs::path killed_run(const fs::path& runs) {
  // Killed by `timeout` where the test stops before it kills it.
  const std::string cmd = "CHORUS_DIR=" + runs.string() + " CHORUS_SYSTEM_INTERVAL=0 timeout -s KILL 120 " +
                          bin("chorus_e2e_worker") + " --steps 100 --pause-step 40 >/dev/null 2>&1 &";
  BOOST_REQUIRE(std::system(cmd.c_str()) == 0);
  // Until the run has flushed step 39 (summary.json holds the last committed row's _step).
  fs::path dir;
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < until) {
    if (dir.empty()) dir = run_under(runs);
    if (!dir.empty() && contains(slurp(dir / "summary.json"), "\"_step\":39,")) break;
    std::this_thread::sleep_for(50ms);
  }
  BOOST_REQUIRE(!dir.empty());
  BOOST_REQUIRE(contains(slurp(dir / "summary.json"), "\"_step\":39,"));
  // Its host's pid, from run.json: the process this test started.
  simdjson::dom::parser parser;
  const std::int64_t pid = parser.parse(slurp(dir / "run.json"))["pid"].get_int64().value();
  BOOST_REQUIRE(pid > 0);
  BOOST_REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  // Its WAL lock goes with it: until then it may still read running.
  const auto gone_by = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < gone_by && !contains(run_chorus({"ls", runs.string()}).out, "crashed"))
    std::this_thread::sleep_for(50ms);
  BOOST_REQUIRE(contains(slurp(dir / "run.json"), "\"state\":\"running\"")); // the file still says so
  return dir;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_host_killed_without_a_word_reads_crashed_in_every_command) {
  TempDir tmp;
  const fs::path dir = killed_run(tmp.path / "runs");
  const std::string id = dir.filename().string();

  const Output ls = run_chorus({"ls", (tmp.path / "runs").string()});
  BOOST_TEST_INFO(ls.out);
  BOOST_TEST(ls.code == 0);
  BOOST_TEST(contains(ls.out, id + "  crashed  "));
  BOOST_TEST(contains(ls.out, "  " + id + ": its host (pid "));

  const Output show = run_chorus({"show", dir.string(), "--no-history", "--no-system"});
  BOOST_TEST_INFO(show.out);
  BOOST_TEST(show.code == 0);
  BOOST_TEST(contains(show.out, "crashed (run.json says running, but its host was lost)"));
  BOOST_TEST(contains(show.out, "last committed step 39"));
  BOOST_TEST(contains(show.out, "`chorus recover " + dir.string() + "`"));
  // Its ranks as run.json last listed them: none still running.
  BOOST_TEST(!contains(show.out, "  0     running"));

  const Output csv = run_chorus({"export", dir.string(), "--csv", "-"});
  BOOST_TEST_INFO(csv.out << csv.err);
  BOOST_TEST(csv.code == 0);
  BOOST_TEST(contains(csv.err, "chorus export: " + id + " crashed: "));
  BOOST_TEST(contains(csv.err, "last committed step 39"));
  BOOST_TEST(lines_of(csv.out).back().starts_with("39,"));

  // Reading left the files as they were: `chorus recover` rebuilds them.
  BOOST_TEST(contains(slurp(dir / "run.json"), "\"state\":\"running\""));

  // The host died before it wrote its last rows to history.jsonl (it flushes
  // about once a second): only the WAL holds steps 30-39 now.
  const std::vector<std::string> rows = lines_of(slurp(dir / "history.jsonl"));
  BOOST_REQUIRE_EQUAL(rows.size(), 40u);
  std::string first30;
  for (std::size_t i = 0; i < 30; ++i) first30 += rows[i] + "\n";
  write_text(dir / "history.jsonl", first30);

  // sync rebuilds the files from the WAL first, then uploads every committed row and the end state: crashed.
  const fs::path tb = tmp.path / "tb";
  const Output sync = run_chorus({"sync", dir.string(), "--to", "tensorboard:" + tb.string(), "--timeout", "60"});
  BOOST_TEST_INFO(sync.out << sync.err);
  BOOST_TEST(sync.code == 0);
  BOOST_TEST(contains(sync.err, "chorus sync: " + id + " crashed: "));
  BOOST_TEST(contains(sync.err, "rebuilding its files from its write-ahead log"));
  BOOST_TEST(!contains(sync.err, "no end state"));
  const Output status = run_chorus({"sync", "--status", dir.string()});
  BOOST_TEST(contains(status.out, "done (crashed)"), status.out);
  BOOST_TEST(lines_of(slurp(dir / "history.jsonl")).size() == 40u);
  BOOST_TEST(contains(slurp(dir / "run.json"), "\"state\":\"crashed\""));
  BOOST_TEST(fs::exists(dir / "history.jsonl.bak"));
  std::set<std::int64_t> steps;
  for (const auto& e : fs::directory_iterator(tb / id))
    if (e.path().filename().string().starts_with("events.out.tfevents."))
      for (const tfevents::TbEvent& ev : tfevents::read_events(e.path().string()))
        for (const tfevents::TbValue& v : ev.values)
          if (v.tag == "loss" && v.simple_value) steps.insert(ev.step);
  BOOST_TEST(steps.size() == 40u);
  BOOST_TEST((!steps.empty() && *steps.begin() == 0 && *steps.rbegin() == 39));

  // Synced again: nothing is rebuilt (run.json records the end now), nothing is sent twice.
  const Output again = run_chorus({"sync", dir.string(), "--to", "tensorboard:" + tb.string(), "--timeout", "60"});
  BOOST_TEST(again.code == 0, again.err);
  BOOST_TEST(!contains(again.err, "rebuilding"), again.err);
}

BOOST_AUTO_TEST_CASE(export_and_sync_read_another_hosts_expired_lease_as_crashed) {
  TempDir root;
  RunSpec spec{.state = "running", .host = other_host, .ended = false, .last_step = -1};
  spec.id = "expired";
  const fs::path expired = make_run(root.path, "p", "g", spec);
  write_lease(expired, other_host, 3600);
  write_text(expired / "summary.json", R"({"_step":41})");
  write_text(expired / "history.jsonl", history(42, 2));
  spec.id = "fresh";
  const fs::path fresh = make_run(root.path, "p", "g", spec);
  write_lease(fresh, other_host, 1);

  const Output csv = run_chorus({"export", expired.string(), "--csv", "-"});
  BOOST_TEST(csv.code == 0);
  BOOST_TEST(contains(csv.err, "stopped renewing its lease"), csv.err);
  BOOST_TEST(contains(csv.err, "last committed step 41"), csv.err);
  const Output tb = run_chorus({"export", expired.string(), "--tensorboard", (root.path / "tb").string()});
  BOOST_TEST(tb.code == 0);
  BOOST_TEST(contains(tb.err, "chorus export: expired crashed: "), tb.err);

  const std::string target = "tensorboard:" + (root.path / "synced").string();
  const Output sync = run_chorus({"sync", expired.string(), "--to", target, "--timeout", "60"});
  BOOST_TEST(sync.code == 0, sync.err);
  BOOST_TEST(contains(sync.err, "chorus sync: expired crashed: its host (pid 2147483000 on " + other_host + ")"),
             sync.err);
  BOOST_TEST(contains(sync.err, "no write-ahead log here"), sync.err); // copied without it: the files are all there is
  BOOST_TEST(contains(run_chorus({"sync", "--status", expired.string()}).out, "done (crashed)"));
  // A WAL that cannot be replayed: nothing goes up, since the end state would close the upload without its rows.
  spec.id = "damaged";
  const fs::path damaged = make_run(root.path, "p", "g", spec);
  write_lease(damaged, other_host, 3600);
  write_text(damaged / "history.jsonl", history(42, 2));
  write_text(damaged / "wal", std::string(4096, 'x'));
  const Output refused = run_chorus({"sync", damaged.string(), "--to", target, "--timeout", "60"});
  BOOST_TEST(refused.code == 1, refused.err);
  BOOST_TEST(contains(refused.err, "could not be rebuilt from its write-ahead log"), refused.err);
  BOOST_TEST(contains(refused.err, "Nothing was uploaded"), refused.err);
  BOOST_TEST(contains(run_chorus({"sync", "--status", damaged.string()}).out, "not uploaded"));
  // A host whose lease holds uploads its run itself.
  const Output live = run_chorus({"sync", fresh.string(), "--to", target});
  BOOST_TEST(live.code == 1);
  BOOST_TEST(contains(live.err, "is running, and its host (pid 2147483000 on " + other_host + ") uploads it"), live.err);
}

BOOST_AUTO_TEST_CASE(show_follow_stops_when_the_host_stops_renewing_its_lease) {
  TempDir root;
  const fs::path dir = make_run(root.path, "p", "g",
                                {.id = "followed", .state = "running", .host = other_host, .ended = false, .last_step = -1});
  write_lease(dir, other_host, 1);
  write_text(dir / "summary.json", R"({"_step":41})");
  Child follow({"show", dir.string(), "--follow", "--no-history", "--no-system"});
  BOOST_REQUIRE(follow.wait_for([](const std::string& out, const std::string&) { return contains(out, "following followed"); }));
  // No run file changes: only the lease, which its host no longer renews.
  write_lease(dir, other_host, 3600);
  const Output o = follow.finish(std::chrono::seconds(30));
  BOOST_TEST_INFO(o.out << o.err);
  BOOST_TEST(o.code == 0); // it ended by itself
  const std::string last = o.out.substr(o.out.rfind("run followed\n"));
  BOOST_TEST(contains(last, "crashed (run.json says running, but its host was lost)"));
  BOOST_TEST(contains(last, "last committed step 41"));
  BOOST_TEST(!contains(last, "following"));
}
