// The run host's lease (io/store/lease.hpp): its file, and how a reader
// turns it (or, on the host's own machine, the WAL lock and the pid) into a
// run's state.
#define BOOST_TEST_MODULE io_lease
#include <boost/test/unit_test.hpp>

#include "io/platform/posix.hpp"
#include "io/store/lease.hpp"
#include "tests/io/files.hpp"
#include "tests/temp_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <string>

using namespace chorus;
using namespace chorus::platform;
using namespace chorus::store;
using chorus::test::files::mode_of;
using chorus::test::files::spit;
using chorus::test::TempDir;

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::store::HostLife)

namespace {

constexpr std::int64_t second = 1'000'000;
constexpr std::int64_t now = 1'764'294'000'123'456; // a fixed "now": no test depends on the clock
constexpr std::int64_t expiry = std::chrono::duration_cast<std::chrono::microseconds>(lease_expiry).count();

// run.json of a live run of two ranks, hosted as `host` says (pid 4242).
RunRecord running_on(const std::string& host, std::int64_t pid = 4242) {
  RunRecord r;
  r.id = "r1";
  r.host = host;
  r.pid = pid;
  r.state = "running";
  r.start_us = now - 600 * second;
  r.segments = {{r.start_us, std::nullopt, "running", std::nullopt}};
  r.ranks = {{0, "running", -1, host, ""}, {1, "running", 3, host, ""}};
  return r;
}

Lease lease_of(const std::string& host, std::int64_t renewed_us, std::int64_t pid = 4242) {
  return {host, pid, renewed_us, renewed_us + expiry};
}

// A pid no process has: past the kernel's largest.
constexpr std::int64_t dead_pid = 2'147'483'000;

} // namespace

BOOST_AUTO_TEST_CASE(a_lease_round_trips_privately_and_ends) {
  TempDir dir;
  BOOST_TEST(!read_lease(dir.str()).value().has_value()); // none yet
  const Lease l = lease_now(now);
  BOOST_TEST(l.host == chorus::platform::this_host());
  BOOST_TEST(l.pid == static_cast<std::int64_t>(::getpid()));
  BOOST_TEST(l.expires_us - l.renewed_us == expiry);
  BOOST_REQUIRE(!renew_lease(dir.str(), l));
  BOOST_TEST(mode_of(dir / "lease.json") == 0600u);
  const Result<std::optional<Lease>> back = read_lease(dir.str());
  BOOST_REQUIRE(back.has_value());
  BOOST_REQUIRE(back->has_value());
  BOOST_TEST((**back == l));
  const std::string text = chorus::test::slurp(dir / "lease.json");
  BOOST_TEST(text.find("\"interval\":5") != std::string::npos);
  BOOST_TEST(text.find("\"renewed\":1764294000.123456") != std::string::npos);

  // Renewed: replaced, and no temporary file is left beside it.
  const Lease later = lease_now(now + 5 * second);
  BOOST_REQUIRE(!renew_lease(dir.str(), later));
  BOOST_TEST((read_lease(dir.str()).value() == later));
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path)) ++files;
  BOOST_TEST(files == 1u);

  end_lease(dir.str());
  BOOST_TEST(!read_lease(dir.str()).value().has_value());
  end_lease(dir.str()); // twice: nothing to do
}

BOOST_AUTO_TEST_CASE(a_damaged_lease_is_an_error_naming_the_file) {
  TempDir dir;
  for (const char* text : {R"({"host":"n","pid":1,"renewed":1764294000.5,"exp)", // cut short
                           "", "[1,2]", R"({"host":"n","pid":1,"renewed":1764294000.5})",
                           R"({"host":"n","pid":"x","renewed":1,"expires":2})", R"({"pid":1,"renewed":1,"expires":2})"}) {
    spit(dir / "lease.json", text);
    const Result<std::optional<Lease>> read = read_lease(dir.str());
    BOOST_REQUIRE_MESSAGE(!read.has_value(), "taken: " << text);
    BOOST_TEST(read.error().message().find(dir / "lease.json") != std::string::npos);
    BOOST_TEST(read.error().message().find("damaged") != std::string::npos);
    // A reader on another machine cannot tell; it says why and leaves the run as it is.
    RunRecord r = running_on("another-host-of-the-test");
    const Liveness l = apply_liveness(r, dir.str(), now);
    BOOST_TEST(l.life == HostLife::unknown);
    BOOST_TEST(l.why.find("lease.json") != std::string::npos);
    BOOST_TEST(r.state == "running");
  }
}

BOOST_AUTO_TEST_CASE(an_expired_lease_on_another_host_reads_crashed_at_the_last_committed_step) {
  TempDir dir;
  const std::string other = "another-host-of-the-test";
  BOOST_REQUIRE(other != chorus::platform::this_host());
  BOOST_REQUIRE(!renew_lease(dir.str(), lease_of(other, now - 100 * second)));
  spit(dir / "summary.json", R"({"loss":0.5,"_step":41,"_runtime":12.5})");

  RunRecord r = running_on(other);
  const Liveness l = apply_liveness(r, dir.str(), now);
  BOOST_TEST(l.life == HostLife::gone);
  BOOST_TEST(r.state == "crashed");
  BOOST_TEST(r.segments.back().state == "crashed");
  BOOST_TEST((r.end_us == std::optional<std::int64_t>(now - 100 * second))); // its last renewal
  for (const RunRecord::Rank& k : r.ranks) {
    BOOST_TEST(k.state == "crashed");
    BOOST_TEST(k.last_step == 41);
    BOOST_TEST(k.message.find("pid 4242 on " + other) != std::string::npos);
  }
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST(r.error->find("stopped renewing its lease at 2025-11-28 01:38:20 UTC, 100 s ago") != std::string::npos,
             *r.error);
  BOOST_TEST(r.error->find("last committed step 41") != std::string::npos);
  BOOST_TEST(r.error->find("`chorus recover " + dir.str() + "`") != std::string::npos);

  // Just past the expiry it is gone; at it, not yet.
  RunRecord edge = running_on(other);
  BOOST_TEST(host_liveness(edge, dir.str(), now - 100 * second + expiry).life == HostLife::alive);
  BOOST_TEST(host_liveness(edge, dir.str(), now - 100 * second + expiry + 1).life == HostLife::gone);

  // An error run.json has already is kept.
  RunRecord failed_to_write = running_on(other);
  failed_to_write.error = "history.jsonl could not be written";
  apply_liveness(failed_to_write, dir.str(), now);
  BOOST_TEST(failed_to_write.state == "crashed");
  BOOST_TEST(*failed_to_write.error == "history.jsonl could not be written");
}

BOOST_AUTO_TEST_CASE(a_fresh_lease_or_none_leaves_a_running_run_as_it_is) {
  TempDir dir;
  const std::string other = "another-host-of-the-test";
  spit(dir / "summary.json", R"({"_step":41})");
  const RunRecord before = running_on(other);

  RunRecord none = before; // no lease: a run of an earlier version, from elsewhere
  BOOST_TEST(apply_liveness(none, dir.str(), now).life == HostLife::unknown);
  BOOST_TEST((none == before));

  BOOST_REQUIRE(!renew_lease(dir.str(), lease_of(other, now - 10 * second)));
  RunRecord fresh = before;
  BOOST_TEST(apply_liveness(fresh, dir.str(), now).life == HostLife::alive);
  BOOST_TEST((fresh == before));

  // An expired lease of another process is an earlier attempt's: a resumed
  // run's new host may not have renewed yet.
  BOOST_REQUIRE(!renew_lease(dir.str(), lease_of(other, now - 100 * second, 17)));
  RunRecord resumed = before;
  BOOST_TEST(apply_liveness(resumed, dir.str(), now).life == HostLife::unknown);
  BOOST_TEST((resumed == before));
}

BOOST_AUTO_TEST_CASE(on_its_own_machine_the_wal_lock_decides) {
  TempDir dir;
  const std::string here = chorus::platform::this_host();
  spit(dir / "summary.json", R"({"_step":7})");
  spit(dir / "wal", "");
  // A fresh lease does not keep alive a host that no longer holds its WAL.
  BOOST_REQUIRE(!renew_lease(dir.str(), lease_of(here, now, dead_pid)));
  RunRecord dead = running_on(here, dead_pid);
  const Liveness l = apply_liveness(dead, dir.str(), now);
  BOOST_TEST(l.life == HostLife::gone);
  BOOST_TEST(l.why.find("write-ahead log") != std::string::npos);
  BOOST_TEST(dead.state == "crashed");
  BOOST_TEST(dead.ranks[0].state == "crashed");
  BOOST_TEST(dead.ranks[0].last_step == 7);
  BOOST_TEST(dead.error->find("last committed step 7") != std::string::npos);

  // Held, as WalWriter holds it: alive, even with the lease long expired.
  BOOST_REQUIRE(!renew_lease(dir.str(), lease_of(here, now - 1000 * second, dead_pid)));
  const int fd = ::open((dir / "wal").c_str(), O_RDWR | O_CLOEXEC);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  RunRecord held = running_on(here, dead_pid);
  BOOST_TEST(apply_liveness(held, dir.str(), now).life == HostLife::alive);
  BOOST_TEST(held.state == "running");
  ::close(fd);

  // No WAL to go by: the pid. This process lives; the dead pid does not.
  std::filesystem::remove(dir / "wal");
  end_lease(dir.str());
  RunRecord mine = running_on(here, ::getpid());
  BOOST_TEST(apply_liveness(mine, dir.str(), now).life == HostLife::alive);
  RunRecord gone = running_on(here, dead_pid);
  const Liveness by_pid = apply_liveness(gone, dir.str(), now);
  BOOST_TEST(by_pid.life == HostLife::gone);
  BOOST_TEST(by_pid.why.find("no longer running") != std::string::npos);
  BOOST_TEST(gone.state == "crashed");
}

BOOST_AUTO_TEST_CASE(a_run_that_ended_is_never_touched) {
  TempDir dir;
  const std::string other = "another-host-of-the-test";
  BOOST_REQUIRE(!renew_lease(dir.str(), lease_of(other, now - 1000 * second)));
  spit(dir / "summary.json", R"({"_step":41})");
  for (const char* state : {"finished", "failed", "killed", "crashed"}) {
    RunRecord r = running_on(other);
    r.state = state;
    const RunRecord before = r;
    apply_liveness(r, dir.str(), now);
    BOOST_TEST((r == before), state);
  }
}

BOOST_AUTO_TEST_CASE(an_ended_run_whose_files_a_crash_cut_short_says_which_and_names_recover) {
  TempDir dir;
  spit(dir / "history.jsonl", std::string(100, 'h'));
  spit(dir / "events.jsonl", std::string(40, 'e'));
  spit(dir / "summary.json", R"({"_step":41})");
  RunRecord ended = running_on("another-host-of-the-test");
  ended.state = "finished";
  ended.lengths = {{"history.jsonl", 100}, {"events.jsonl", 30}, {"summary.json", 12}};
  // As the end left them (a line file may have grown since): nothing to say.
  RunRecord r = ended;
  BOOST_TEST(apply_liveness(r, dir.str(), now).cut.empty());
  BOOST_TEST((r == ended));

  // A line file shorter, a file replaced whole of another length, one gone.
  spit(dir / "history.jsonl", std::string(60, 'h'));
  spit(dir / "summary.json", R"({})");
  ended.lengths.emplace_back("config.json", 2);
  r = ended;
  const Liveness l = apply_liveness(r, dir.str(), now);
  BOOST_TEST(r.state == "finished"); // the run did finish: its files are what is wrong
  BOOST_TEST(l.cut.find("history.jsonl holds 60 bytes, not the 100 the run's end wrote") != std::string::npos, l.cut);
  BOOST_TEST(l.cut.find("summary.json holds 2 bytes, not the 12") != std::string::npos, l.cut);
  BOOST_TEST(l.cut.find("config.json is missing") != std::string::npos, l.cut);
  BOOST_TEST(l.cut.find("events.jsonl") == std::string::npos, l.cut);
  BOOST_TEST(l.cut.find("`chorus recover " + dir.str() + "`") != std::string::npos, l.cut);
  BOOST_REQUIRE(r.error.has_value());
  BOOST_TEST(*r.error == l.cut);

  // An error the run already had comes first; a name that is no file of
  // the run's end is never looked at.
  r = ended;
  r.error = "rank 1 failed";
  r.lengths = {{"history.jsonl", 61}, {"../../etc/passwd", 1u << 30}, {"run.json", 1}};
  const Liveness both = apply_liveness(r, dir.str(), now);
  BOOST_TEST(*r.error == "rank 1 failed; " + both.cut);
  BOOST_TEST(both.cut.find("passwd") == std::string::npos, both.cut);
  BOOST_TEST(both.cut.find("run.json") == std::string::npos, both.cut);
}

BOOST_AUTO_TEST_CASE(read_run_record_reads_run_json_as_readers_report_it) {
  TempDir dir;
  const std::string other = "another-host-of-the-test";
  RunRecord r = running_on(other);
  r.dir = dir.str();
  BOOST_REQUIRE(!r.write(dir / "run.json"));
  spit(dir / "summary.json", R"({"_step":12})");
  // The lease's times are its host's clock: one renewed an hour ago has expired by any reader's.
  BOOST_REQUIRE(!renew_lease(dir.str(), lease_of(other, chorus::platform::unix_now_us() - 3600 * second)));
  const Result<RunRecord> read = read_run_record(dir.str());
  BOOST_REQUIRE(read.has_value());
  BOOST_TEST(read->state == "crashed");
  BOOST_TEST(read->ranks[1].last_step == 12);
  // The file says what it said: only the reading changed.
  BOOST_TEST(RunRecord::read(dir / "run.json").value().state == "running");
  BOOST_TEST(!read_run_record(dir / "nowhere").has_value());
}
