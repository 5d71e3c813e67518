// `chorus recover` on write-ahead logs built frame by frame, and on a run a
// full disk failed (a job on a small tmpfs); what stops it before it changes
// anything: a directory where a file belongs, a permission it lacks.
#define BOOST_TEST_MODULE cli_recover
#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"

#include "io/store/history_blocks.hpp"
#include "io/store/wal.hpp"
#include "runtime/core/wire.hpp"

#include <simdjson.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sys/mount.h>

using namespace chorus;
using namespace chorus::test;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t t0 = 1'700'000'000'000'000; // unix microseconds
constexpr int steps = 10;

std::string identity(const fs::path& dir) {
  return R"({"id":"rec1","name":"rec1","project":"p","group":"g","mode":"shared","scope":"global","host":"h1",)"
         R"("pid":4242,"dir":")" + dir.string() + R"(","start_time":1700000000})";
}

// Rank `rank` logs loss (declared mean) = step + rank and acc = 0.5 + rank/5
// at steps [from, to), ids 1 and 2 interned in the first batch.
std::vector<char> batch(std::uint32_t rank, int from, int to, std::uint64_t& seq, bool first, bool finish) {
  std::vector<char> out;
  core::wire::BatchWriter b(out, rank);
  if (first) {
    b.key(1, "loss");
    b.key(2, "acc");
    b.define(++seq, 1, Reduce::mean);
    if (rank == 0) b.config(++seq, R"({"lr":0.125,"optimizer":"sgd"})");
  }
  for (int s = from; s < to; ++s) {
    b.values(++seq, s, t0 + 1'000 * s + rank, 2);
    b.value(1, s + static_cast<double>(rank));
    b.value(2, 0.5 + rank / 5.0);
  }
  if (finish) b.finish(++seq);
  return out;
}

struct Wal {
  fs::path path;
  std::unique_ptr<store::WalWriter> writer;
  std::vector<std::uint64_t> offsets; // where each frame starts

  explicit Wal(fs::path p) : path(std::move(p)) {
    fs::create_directories(path.parent_path());
    auto opened = store::WalWriter::open(path.string());
    BOOST_REQUIRE_MESSAGE(opened, opened.error().message());
    writer = std::move(*opened);
  }
  void add(const std::vector<char>& frame) {
    offsets.push_back(writer->size());
    const Error e = writer->append(frame);
    BOOST_REQUIRE_MESSAGE(!e, e.message());
  }
  void close() { writer.reset(); }
};

// A two-rank shared run: rank 0 finishes, rank 1 is still at step 9 when the host dies.
void write_run(Wal& w, const fs::path& dir, bool with_end) {
  std::uint64_t seq0 = 0, seq1 = 0;
  w.add(core::wire::run_start(t0, 2, identity(dir)));
  w.add(core::wire::rank_joined(0, t0 + 1, 100, "h1"));
  w.add(core::wire::rank_joined(1, t0 + 2'400, 101, "h2"));
  w.add(batch(0, 0, 5, seq0, true, false));
  w.add(batch(1, 0, 5, seq1, true, false));
  w.add(batch(0, 5, steps, seq0, false, true));
  w.add(batch(1, 5, steps, seq1, false, false));
  if (with_end) {
    w.add(core::wire::rank_dead(1, t0 + 50'000, "heartbeat lost"));
    w.add(core::wire::run_end(RunState::finished, t0 + 60'000));
  }
}

void append_torn_tail(const fs::path& wal) {
  std::string tail(12 + 7, '\0');
  const std::uint32_t magic = store::wal_magic, len = 500;
  std::memcpy(tail.data(), &magic, 4);
  std::memcpy(tail.data() + 4, &len, 4);
  std::ofstream(wal, std::ios::binary | std::ios::app) << tail;
}

// ROOT/p/g/rec1 as a crashed host left it: a log without the run's end, with a torn tail.
fs::path crashed_run(const TempDir& root) {
  const fs::path dir = root.path / "p" / "g" / "rec1";
  Wal w(dir / "wal");
  write_run(w, dir, false);
  w.close();
  append_torn_tail(dir / "wal");
  return dir;
}

struct Row {
  std::int64_t step;
  double loss, acc0, acc1;
};

std::vector<Row> history_rows(const fs::path& file) {
  std::vector<Row> rows;
  simdjson::dom::parser parser;
  for (const std::string& line : lines_of(read_text(file))) {
    simdjson::dom::object o;
    BOOST_REQUIRE_MESSAGE(parser.parse(line).get(o) == simdjson::SUCCESS, "not JSON: " << line);
    Row r{};
    BOOST_REQUIRE(o["_step"].get(r.step) == simdjson::SUCCESS);
    BOOST_REQUIRE(o["loss"].get(r.loss) == simdjson::SUCCESS);
    BOOST_REQUIRE(o["acc/rank-0"].get(r.acc0) == simdjson::SUCCESS);
    BOOST_REQUIRE(o["acc/rank-1"].get(r.acc1) == simdjson::SUCCESS);
    rows.push_back(r);
  }
  return rows;
}

void check_rows(const fs::path& dir) {
  const std::vector<Row> rows = history_rows(dir / "history.jsonl");
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    const Row& r = rows[static_cast<std::size_t>(s)];
    BOOST_TEST(r.step == s);
    BOOST_TEST(r.loss == s + 0.5); // the mean of rank 0's s and rank 1's s + 1
    BOOST_TEST(r.acc0 == 0.5);
    BOOST_TEST(r.acc1 == 0.7);
  }
}

std::string run_state(const fs::path& dir, int rank = -1) {
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  BOOST_REQUIRE(parser.load((dir / "run.json").string()).get(o) == simdjson::SUCCESS);
  std::string_view s;
  if (rank < 0) {
    BOOST_REQUIRE(o["state"].get(s) == simdjson::SUCCESS);
  } else {
    simdjson::dom::array ranks;
    BOOST_REQUIRE(o["ranks"].get(ranks) == simdjson::SUCCESS);
    for (simdjson::dom::object r : ranks) {
      std::int64_t k = -1;
      if (r["rank"].get(k) == simdjson::SUCCESS && k == rank) BOOST_REQUIRE(r["state"].get(s) == simdjson::SUCCESS);
    }
  }
  return std::string(s);
}

} // namespace

BOOST_AUTO_TEST_CASE(recover_rebuilds_a_crashed_run_and_cuts_its_torn_tail) {
  TempDir root;
  const fs::path dir = root.path / "p" / "g" / "rec1";
  Wal w(dir / "wal");
  write_run(w, dir, false);
  const std::uint64_t good = w.writer->size();
  w.close();
  append_torn_tail(dir / "wal");
  // What the crashed host left: a stale run.json and a short history.
  write_text(dir / "run.json", R"({"id":"rec1","state":"running"})");
  write_text(dir / "history.jsonl", "{\"_step\":0,\"loss\":0.5}\n");
  // ... and a damaged rejected.jsonl, though the log holds no refusal.
  write_text(dir / "rejected.jsonl", "{\"rank\":0,\"se");
  // ... and a block summary of that history, which a reader would take.
  write_text(dir / store::history_blocks_file, R"({"rows":[0,1],"bytes":[0,23],"steps":[0,0],)"
                                               R"("keys":{"loss":[1,0.5,0,0.5,0,0,0.5,0,0.5]},"nonfinite":{}})"
                                               "\n");
  BOOST_TEST(store::read_history_blocks(dir.string(), 23)->blocks.size() == 1u);

  const Output o = run_chorus({"recover", dir.string()});
  BOOST_TEST_INFO("stdout: " << o.out << "\nstderr: " << o.err);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "7 frames read"));
  BOOST_TEST(contains(o.out, "0 damaged regions"));
  BOOST_TEST(contains(o.out, "torn tail  19 bytes at offset " + std::to_string(good) + " cut"));
  BOOST_TEST(contains(o.out, "rebuilt    10 rows"));
  BOOST_TEST(contains(o.out, "state      crashed"));
  BOOST_TEST(contains(o.out, "1 rank marked crashed"));
  BOOST_TEST(fs::file_size(dir / "wal") == good);

  check_rows(dir);
  BOOST_TEST(run_state(dir) == "crashed");
  BOOST_TEST(run_state(dir, 0) == "finished");
  BOOST_TEST(run_state(dir, 1) == "crashed");
  // When each rank joined, from the log's join events.
  BOOST_TEST(contains(read_text(dir / "run.json"), R"("host":"h1","message":"","joined":1700000000})"));
  BOOST_TEST(contains(read_text(dir / "run.json"), R"(,"joined":1700000000.002})"));
  BOOST_TEST(contains(read_text(dir / "config.json"), "\"optimizer\":\"sgd\""));
  BOOST_TEST(read_text(dir / "history.jsonl.bak") == "{\"_step\":0,\"loss\":0.5}\n");
  BOOST_TEST(contains(read_text(dir / "run.json.bak"), "running"));
  // A file the rebuild has no line for: the run's is replaced by an empty one
  // (the old one kept); one the run never had is not made.
  BOOST_TEST(fs::exists(dir / "rejected.jsonl"));
  BOOST_TEST(read_text(dir / "rejected.jsonl").empty());
  BOOST_TEST(read_text(dir / "rejected.jsonl.bak") == "{\"rank\":0,\"se");
  BOOST_TEST(!fs::exists(dir / "histograms.jsonl"));
  BOOST_TEST(!fs::exists(dir / "media.jsonl"));
  // The old history's summary is gone with it (10 rows make no block).
  BOOST_TEST(!fs::exists(dir / store::history_blocks_file));
  for (const auto& e : fs::directory_iterator(dir)) BOOST_TEST(!e.path().filename().string().starts_with(".recover"));

  // Again: the same rows, and no tail left to cut.
  const Output again = run_chorus({"recover", dir.string()});
  BOOST_TEST(again.code == 0);
  BOOST_TEST(contains(again.out, "torn tail  none"));
  check_rows(dir);

  // What show says now.
  const Output show = run_chorus({"show", dir.string(), "--no-history"});
  BOOST_TEST(show.code == 0);
  BOOST_TEST(contains(show.out, "crashed"));
  BOOST_TEST(!contains(show.out, "CRASHED")); // no longer a running run with a dead host
}

BOOST_AUTO_TEST_CASE(a_log_with_the_runs_end_keeps_its_states) {
  TempDir root;
  const fs::path dir = root.path / "p" / "g" / "rec1";
  Wal w(dir / "wal");
  write_run(w, dir, true);
  w.close();
  const Output o = run_chorus({"recover", "--no-backup", dir.string()});
  BOOST_TEST_INFO("stdout: " << o.out << "\nstderr: " << o.err);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "state      finished, as the log records"));
  check_rows(dir);
  BOOST_TEST(run_state(dir) == "finished");
  BOOST_TEST(run_state(dir, 1) == "crashed");
  BOOST_TEST(!fs::exists(dir / "run.json.bak"));
}

// The run host answers finish once the log holds every rank's end, synced;
// the end's own frame after it may be lost with the machine (here it is
// torn). The run's end follows from how the ranks ended: recover finds it
// there, a failure as well, and marks no rank.
BOOST_AUTO_TEST_CASE(a_log_with_every_ranks_end_but_not_the_runs_ends_as_its_ranks_did) {
  for (const bool failed : {false, true}) {
    BOOST_TEST_CONTEXT("rank 1 " << (failed ? "failed" : "finished")) {
      TempDir root;
      const fs::path dir = root.path / "p" / "g" / "rec1";
      Wal w(dir / "wal");
      write_run(w, dir, false);
      std::vector<char> last;
      core::wire::BatchWriter b(last, 1);
      b.finish(12, failed ? 3 : 0); // rank 1's calls so far: its definition and 10 rows
      w.add(last);
      const std::uint64_t good = w.writer->size();
      w.close();
      append_torn_tail(dir / "wal"); // the end's own frame, cut short
      const Output o = run_chorus({"recover", "--no-backup", dir.string()});
      BOOST_TEST_INFO("stdout: " << o.out << "\nstderr: " << o.err);
      BOOST_TEST(o.code == 0);
      BOOST_TEST(contains(o.out, "torn tail  19 bytes at offset " + std::to_string(good) + " cut"));
      const std::string state = failed ? "failed" : "finished";
      BOOST_TEST(contains(o.out, "state      " + state + ", as every rank's end in the log makes it"));
      BOOST_TEST(!contains(o.out, "marked"));
      check_rows(dir);
      BOOST_TEST(run_state(dir) == state);
      BOOST_TEST(run_state(dir, 0) == "finished");
      BOOST_TEST(run_state(dir, 1) == state);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_damaged_frame_is_skipped_and_reported) {
  TempDir root;
  const fs::path dir = root.path / "p" / "g" / "rec1";
  Wal w(dir / "wal");
  write_run(w, dir, true);
  const std::uint64_t at = w.offsets[6] + store::wal_header_size + 9; // inside rank 1's last batch
  w.close();
  {
    std::fstream f(dir / "wal", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put('\x5a');
  }
  const Output o = run_chorus({"recover", dir.string()});
  BOOST_TEST_INFO("stdout: " << o.out << "\nstderr: " << o.err);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "1 damaged region skipped"));
  BOOST_TEST(contains(o.out, "8 frames read"));
}

BOOST_AUTO_TEST_CASE(dry_run_changes_nothing) {
  TempDir root;
  const fs::path dir = crashed_run(root);
  const auto size = fs::file_size(dir / "wal");
  const Output o = run_chorus({"recover", "--dry-run", dir.string()});
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "(would be cut)"));
  BOOST_TEST(contains(o.out, "rebuilt    10 rows"));
  BOOST_TEST(fs::file_size(dir / "wal") == size);
  BOOST_TEST(!fs::exists(dir / "history.jsonl"));
}

BOOST_AUTO_TEST_CASE(recover_refuses_a_live_host_and_a_missing_log) {
  TempDir root;
  const fs::path dir = root.path / "p" / "g" / "rec1";
  Wal w(dir / "wal"); // held open: this test is the live host
  write_run(w, dir, false);
  const Output live = run_chorus({"recover", dir.string()});
  BOOST_TEST(live.code == 1);
  BOOST_TEST(contains(live.err, "alive"));
  BOOST_TEST(!fs::exists(dir / "history.jsonl"));
  w.close();

  const fs::path empty = root.path / "p" / "g" / "empty";
  fs::create_directories(empty);
  const Output none = run_chorus({"recover", empty.string()});
  BOOST_TEST(none.code == 1);
  BOOST_TEST(contains(none.err, "no write-ahead log"));

  const fs::path nostart = root.path / "p" / "g" / "nostart";
  {
    Wal n(nostart / "wal");
    n.add(core::wire::rank_joined(0, t0, 1, "h"));
  }
  const Output no_start = run_chorus({"recover", nostart.string()});
  BOOST_TEST(no_start.code == 1);
  BOOST_TEST(contains(no_start.err, "no run start"));

  BOOST_TEST(run_chorus({"recover"}).code == 2);
  BOOST_TEST(run_chorus({"recover", "--help"}).code == 0);
}

BOOST_AUTO_TEST_CASE(a_backup_in_the_way_is_reported_with_what_to_do) {
  TempDir root;
  const fs::path dir = crashed_run(root);
  write_text(dir / "history.jsonl", "{\"_step\":0,\"loss\":0.5}\n");
  // A directory with something in it cannot be removed to make room for the backup.
  write_text(dir / "history.jsonl.bak" / "keep", "x");
  const Output o = run_chorus({"recover", dir.string()});
  BOOST_TEST(o.code == 1);
  BOOST_TEST(contains(o.err, (dir / "history.jsonl.bak").string() + " is a directory, not a file"), o.err);
  BOOST_TEST(contains(o.err, "Move it aside"), o.err);
  BOOST_TEST(contains(o.err, "--no-backup"), o.err);
  BOOST_TEST(read_text(dir / "history.jsonl") == "{\"_step\":0,\"loss\":0.5}\n");
}

BOOST_AUTO_TEST_CASE(a_read_only_run_directory_is_reported_before_anything_changes) {
  TempDir root;
  const fs::path dir = crashed_run(root);
  const auto size = fs::file_size(dir / "wal");
  // Root writes anywhere: the directory is given to an ordinary user, who runs recover.
  const bool root_user = ::geteuid() == 0;
  const int user = root_user ? 65534 : -1;
  if (root_user)
    for (fs::path p = dir / "wal"; p != root.path.parent_path(); p = p.parent_path())
      BOOST_REQUIRE(::chown(p.c_str(), 65534, 65534) == 0);
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  Child c({"recover", dir.string()}, {}, user);
  const Output o = c.finish();
  fs::permissions(dir, fs::perms::owner_all);
  BOOST_TEST(o.code == 1);
  BOOST_TEST(contains(o.err, "is not writable"), o.err);
  BOOST_TEST(contains(o.err, "chmod u+w"), o.err);
  BOOST_TEST(fs::file_size(dir / "wal") == size); // the torn tail is still there
}

namespace {

/// run.json's `error`, or "" where it has none.
std::string run_error(const fs::path& dir) {
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  BOOST_REQUIRE(parser.load((dir / "run.json").string()).get(o) == simdjson::SUCCESS);
  std::string_view e;
  return o["error"].get(e) == simdjson::SUCCESS ? std::string(e) : std::string();
}

/// The run.json a host whose WAL failed under a full disk leaves: the run
/// ended failed, with the WAL's error, its ranks as they last stood.
std::string disk_failed_run_json(const fs::path& dir, const std::string& error) {
  return R"({"id":"rec1","name":"rec1","project":"p","group":"g","mode":"shared","scope":"global","host":"h1",)"
         R"("pid":4242,"dir":")" + dir.string() + R"(","state":"failed","start_time":1700000000,)"
         R"("end_time":1700000000.2,"segments":[{"start_time":1700000000,"end_time":1700000000.2,)"
         R"("state":"failed"}],"world_size":2,"rows":10,"rejected":0,"error":")" + error +
         R"(","ranks":[{"rank":0,"state":"finished","last_step":9,"host":"h1","message":""},)"
         R"({"rank":1,"state":"running","last_step":-1,"host":"h2","message":""}]})"
         "\n";
}

bool root_or_skip(const char* what) {
  if (::geteuid() == 0) return true;
  BOOST_TEST_MESSAGE("skipped: " << what << " needs root");
  return false;
}

/// Gives `dir` (the run), its files and the directories up to `top` to `uid`.
void give_run(const fs::path& dir, const fs::path& top, int uid) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    BOOST_REQUIRE(::lchown(e.path().c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid)) == 0);
  for (fs::path p = dir; p != top.parent_path(); p = p.parent_path())
    BOOST_REQUIRE(::chown(p.c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid)) == 0);
}

} // namespace

// A full disk failed the WAL: the host ended the run failed in run.json (in
// room it held for that), with the disk's error, but could not log that end.
// Recover keeps the state and the error rather than take the run for one
// whose host died.
BOOST_AUTO_TEST_CASE(a_run_the_disk_failed_keeps_its_state_and_error) {
  TempDir root;
  const fs::path dir = crashed_run(root);
  const std::string error = "the run's write-ahead log could not be written (write on " + (dir / "wal").string() +
                            ": No space left on device. Free disk space, or point CHORUS_DIR at another filesystem.)";
  write_text(dir / "run.json", disk_failed_run_json(dir, error));
  const Output o = run_chorus({"recover", dir.string()});
  BOOST_TEST_INFO("stdout: " << o.out << "\nstderr: " << o.err);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "state      failed, as run.json records"));
  BOOST_TEST(contains(o.out, "No space left on device"));
  check_rows(dir);
  BOOST_TEST(run_state(dir) == "failed");
  BOOST_TEST(run_error(dir) == error);
  BOOST_TEST(run_state(dir, 0) == "finished");
  BOOST_TEST(run_state(dir, 1) == "failed"); // running when the log stopped
  // Again: the same.
  BOOST_TEST(run_chorus({"recover", dir.string()}).code == 0);
  BOOST_TEST(run_state(dir) == "failed");
  BOOST_TEST(run_error(dir) == error);
}

// The same through a real full disk: a job on a 2 MiB tmpfs fills it, then
// the disk is given room and recover runs.
BOOST_AUTO_TEST_CASE(a_run_a_full_disk_failed_keeps_failed_and_the_disk_error_after_recover) {
  if (!root_or_skip("mounting a file system")) return;
  TempDir tmp;
  const fs::path disk = tmp.path / "disk";
  fs::create_directory(disk);
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=2m") != 0) {
    BOOST_TEST_MESSAGE("skipped: no tmpfs mount here (" << std::strerror(errno) << ")");
    return;
  }
  struct Unmount {
    fs::path at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{disk};
  const std::string worker = std::string(CHORUS_BINARY_DIR) + "/bin/chorus_e2e_worker";
  const std::string cmd = "CHORUS_DIR=" + disk.string() + " CHORUS_SYSTEM_INTERVAL=0 timeout -s KILL 60 " + worker +
                          " --steps 8000 --ack-each 1 >" + (tmp.path / "job.out").string() + " 2>&1";
  (void)std::system(cmd.c_str()); // fails: the disk fills
  fs::path dir;
  for (const auto& e : fs::recursive_directory_iterator(disk))
    if (e.path().filename() == "wal") dir = e.path().parent_path();
  BOOST_REQUIRE_MESSAGE(!dir.empty(), read_text(tmp.path / "job.out").substr(0, 2000));
  BOOST_REQUIRE_MESSAGE(run_state(dir) == "failed", read_text(dir / "run.json"));
  const std::string error = run_error(dir);
  BOOST_REQUIRE(contains(error, "No space left on device"));
  // The disk fixed (room again), recover rebuilds the files.
  BOOST_REQUIRE(::mount("tmpfs", disk.c_str(), "tmpfs", MS_REMOUNT, "size=64m") == 0);
  const Output o = run_chorus({"recover", dir.string()});
  BOOST_TEST_INFO("stdout: " << o.out << "\nstderr: " << o.err);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(contains(o.out, "state      failed, as run.json records"));
  BOOST_TEST(run_state(dir) == "failed");
  BOOST_TEST(run_error(dir) == error);
  BOOST_TEST(run_state(dir, 0) == "failed");
  BOOST_TEST(!contains(read_text(dir / "run.json"), "crashed"));
}

// A real job's run, finished, whose files a crash of the machine cut short
// after the end (the end syncs only the WAL): every reader says which file
// and names recover; sync rebuilds the files from the WAL before it uploads
// (and, without the WAL, uploads nothing); recover rebuilds them to the same
// bytes.
BOOST_AUTO_TEST_CASE(files_a_crash_cut_short_after_the_end_are_named_and_rebuilt_to_the_same_bytes) {
  TempDir tmp;
  const std::string worker = std::string(CHORUS_BINARY_DIR) + "/bin/chorus_e2e_worker";
  const std::string cmd = "CHORUS_DIR=" + (tmp.path / "runs").string() + " CHORUS_SYSTEM_INTERVAL=0 timeout -s KILL 60 " +
                          worker + " --steps 300 >" + (tmp.path / "job.out").string() + " 2>&1";
  BOOST_REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, read_text(tmp.path / "job.out").substr(0, 2000));
  fs::path dir;
  for (const auto& e : fs::recursive_directory_iterator(tmp.path / "runs"))
    if (e.path().filename() == "wal") dir = e.path().parent_path();
  BOOST_REQUIRE(!dir.empty());
  BOOST_REQUIRE_MESSAGE(run_state(dir) == "finished", read_text(dir / "run.json"));
  const std::string history = read_text(dir / "history.jsonl"), summary = read_text(dir / "summary.json");
  BOOST_REQUIRE(history.size() > 1000);
  BOOST_TEST(!contains(run_chorus({"show", dir.string()}).out, "chorus recover"));

  // As a crash of the machine may leave them: the rows' last blocks never
  // reached the disk, and summary.json is the start's.
  const auto cut_files = [&] {
    fs::resize_file(dir / "history.jsonl", history.size() / 2);
    write_text(dir / "summary.json", "{}\n");
  };
  cut_files();
  const std::string cut = "history.jsonl holds " + std::to_string(history.size() / 2) + " bytes, not the " +
                          std::to_string(history.size()) + " the run's end wrote";
  for (const std::vector<std::string>& args : {std::vector<std::string>{"show", dir.string()},
                                               std::vector<std::string>{"ls", (tmp.path / "runs").string()}}) {
    const Output o = run_chorus(args);
    BOOST_TEST_INFO(args[0] << ": stdout: " << o.out << "\nstderr: " << o.err);
    BOOST_TEST(contains(o.out + o.err, cut));
    BOOST_TEST(contains(o.out + o.err, "summary.json holds 3 bytes"));
    BOOST_TEST(contains(o.out + o.err, "chorus recover"));
  }

  // Without its WAL, sync sends nothing; with it, sync rebuilds the files first.
  const std::string board = "tensorboard:" + (tmp.path / "board").string();
  fs::rename(dir / "wal", tmp.path / "wal");
  const Output refused = run_chorus({"sync", dir.string(), "--to", board});
  BOOST_TEST_INFO("sync without the WAL: stdout: " << refused.out << "\nstderr: " << refused.err);
  BOOST_TEST(refused.code != 0);
  BOOST_TEST(contains(refused.err, cut));
  BOOST_TEST(contains(refused.err, "nothing was uploaded"));
  BOOST_TEST(!fs::exists(tmp.path / "board"));
  fs::rename(tmp.path / "wal", dir / "wal");
  const Output synced = run_chorus({"sync", dir.string(), "--to", board});
  BOOST_TEST_INFO("sync: stdout: " << synced.out << "\nstderr: " << synced.err);
  BOOST_TEST(synced.code == 0);
  BOOST_TEST(contains(synced.err, "rebuilding its files from its write-ahead log"));
  BOOST_TEST(read_text(dir / "history.jsonl") == history);
  BOOST_TEST(read_text(dir / "summary.json") == summary);

  // recover alone does the same.
  cut_files();
  const Output o = run_chorus({"recover", dir.string()});
  BOOST_TEST_INFO("recover: stdout: " << o.out << "\nstderr: " << o.err);
  BOOST_TEST(o.code == 0);
  BOOST_TEST(read_text(dir / "history.jsonl") == history);
  BOOST_TEST(read_text(dir / "summary.json") == summary);
  BOOST_TEST(run_state(dir) == "finished");
  BOOST_TEST(!contains(run_chorus({"show", dir.string()}).out, "chorus recover"));
}

BOOST_AUTO_TEST_CASE(run_json_as_a_directory_is_named_with_the_fix) {
  TempDir root;
  const fs::path dir = crashed_run(root);
  const auto size = fs::file_size(dir / "wal");
  fs::create_directory(dir / "run.json");
  for (const bool backup : {true, false}) {
    const Output o = run_chorus(backup ? std::vector<std::string>{"recover", dir.string()}
                                       : std::vector<std::string>{"recover", "--no-backup", dir.string()});
    BOOST_TEST_INFO("backup " << backup << ", stderr: " << o.err);
    BOOST_TEST(o.code == 1);
    BOOST_TEST(contains(o.err, (dir / "run.json").string() + " is a directory, not a file"));
    BOOST_TEST(contains(o.err, "Move it aside (mv "));
    BOOST_TEST(contains(o.err, "run chorus recover again"));
    BOOST_TEST(!contains(o.err, "hard link"));
    BOOST_TEST(fs::file_size(dir / "wal") == size); // nothing changed: the torn tail is there
    BOOST_TEST(!fs::exists(dir / "history.jsonl"));
  }
  // Moved aside as said, recover goes through.
  fs::rename(dir / "run.json", dir / "run.json.aside");
  BOOST_TEST(run_chorus({"recover", dir.string()}).code == 0);
  check_rows(dir);
}

// Root reads and writes anything: each case is run by another user, whose
// permissions the kernel checks. Each stops recover before it changes
// anything, naming the file, the errno's text and the fix.
BOOST_AUTO_TEST_CASE(a_permission_error_names_the_file_and_the_fix) {
  if (!root_or_skip("acting as another user")) return;
  constexpr int nobody = 65534;
  struct Case {
    const char* file;
    fs::perms mode;
    std::string said;
  };
  for (const Case& k : {Case{"wal", fs::perms::none, "cannot read and write the write-ahead log "},
                        Case{"run.json", fs::perms::owner_read | fs::perms::owner_write, "cannot read "},
                        Case{"history.jsonl", fs::perms(0644), "(a hard link to it): Operation not permitted"}}) {
    // Only where the kernel protects hard links (fs.protected_hardlinks), as it does by default.
    if (std::string(k.file) == "history.jsonl" && read_text("/proc/sys/fs/protected_hardlinks") != "1\n") continue;
    TempDir root;
    const fs::path dir = crashed_run(root);
    write_text(dir / "run.json", "{}\n");
    write_text(dir / "history.jsonl", "{\"_step\":0,\"loss\":0.5}\n");
    give_run(dir, root.path, nobody);
    // The one file root keeps, with a mode that shuts nobody out.
    BOOST_REQUIRE(::chown((dir / k.file).c_str(), 0, 0) == 0);
    fs::permissions(dir / k.file, k.mode);
    const auto size = fs::file_size(dir / "wal");
    const Output o = run_chorus({"recover", dir.string()}, {}, nobody);
    BOOST_TEST_INFO(k.file << ": " << o.err);
    BOOST_TEST(o.code == 1);
    BOOST_TEST(contains(o.err, k.said));
    BOOST_TEST(contains(o.err, (dir / k.file).string()));
    BOOST_TEST(contains(o.err, std::string(k.file) == "history.jsonl" ? "Operation not permitted" : "Permission denied"));
    BOOST_TEST(contains(o.err, "it belongs to root (uid 0)"));
    BOOST_TEST(contains(o.err, "chorus recover runs as nobody (uid 65534)"));
    BOOST_TEST(contains(o.err, "Run chorus recover as the run's owner"));
    BOOST_TEST(contains(o.err, "Nothing was changed"));
    BOOST_TEST(!contains(o.err, "filesystem"));
    BOOST_TEST(!contains(o.err, "CHORUS_DIR"));
    BOOST_TEST(fs::file_size(dir / "wal") == size);
    BOOST_TEST(read_text(dir / "history.jsonl") == "{\"_step\":0,\"loss\":0.5}\n");
    if (std::string(k.file) == "history.jsonl") {
      // The way out it names: without the backups, it goes through.
      BOOST_TEST(contains(o.err, "--no-backup"));
      const Output again = run_chorus({"recover", "--no-backup", dir.string()}, {}, nobody);
      BOOST_TEST(again.code == 0, again.err);
      check_rows(dir);
    }
  }
}
