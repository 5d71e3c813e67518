// The run's disk fails under a running job: full, or shut down like a dying
// device. Nothing a rank was told is committed may be missing from the WAL
// afterwards, every rank learns of the failure (no ticket waits for ever),
// and finish says what happened. Needs root (mount); skipped without it.
#define BOOST_TEST_MODULE e2e_disk_fault
#include "harness.hpp"

#include "io/store/wal.hpp"
#include "runtime/core/wire.hpp"

#include <boost/test/unit_test.hpp>

#include <sys/mount.h>

#include <map>
#include <set>
#include <sstream>

using namespace e2e;

namespace {

bool can_mount() {
  if (::geteuid() != 0) {
    std::printf("skipped: mounting a file system needs root\n");
    return false;
  }
  return true;
}

/// A file system mounted on a fresh directory for the test's life.
struct Mount {
  TempDir dir;
  fs::path at = dir.path / "mnt";
  fs::path image = dir.path / "disk.img";
  bool ok = false;

  explicit Mount(const std::string& tmpfs_size) {
    fs::create_directory(at);
    ok = ::mount("tmpfs", at.c_str(), "tmpfs", 0, ("size=" + tmpfs_size).c_str()) == 0;
  }
  Mount() { // a 64 MiB ext4 image on a loop device
    fs::create_directory(at);
    ok = run("truncate -s 64M " + image.string() + " && mkfs.ext4 -q -F " + image.string() + " && mount -o loop " +
             image.string() + " " + at.string()).status == 0;
  }
  /// Mounts the image afresh, as after a reboot: its journal replayed, none
  /// of the shut-down file system's state kept. The ranks' processes may
  /// still be closing their files (umount is retried while the mount is
  /// busy), and mount would take up a loop device still attached to the
  /// image, with the shut-down file system's state: every one is detached.
  bool remount() {
    const std::string cmd = "for i in $(seq 50); do umount " + at.string() +
                            " && break; sleep 0.1; done; losetup -j " + image.string() +
                            " | cut -d: -f1 | xargs -r -n1 losetup -d; mount -o loop " + image.string() + " " +
                            at.string();
    return run(cmd).status == 0;
  }
  ~Mount() {
    if (ok) ::umount2(at.c_str(), MNT_DETACH);
  }
};

/// A rank of the job, its output lines prefixed "[r] ". sed -u writes each
/// line whole as it comes: the two ranks share one pipe, and a block cut
/// mid-line would splice one rank's line into the other's.
std::string rank_cmd(const fs::path& dir, int port, int r, const std::string& args) {
  return "CHORUS_DIR=" + dir.string() + " CHORUS_PORT=" + std::to_string(port) + " CHORUS_SYSTEM_INTERVAL=0 RANK=" +
         std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
         " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port + 1) +
         " " + bin("chorus_e2e_worker") + " " + args + " 2>&1 | sed -u 's/^/[" + std::to_string(r) + "] /'";
}

/// Two ranks running `args` into a run on `m`; `meanwhile` runs in the
/// shell while they do. "STATUS done" ends the output once both are back.
Output run_job(const Mount& m, int port, const std::string& args, const std::string& meanwhile = {}) {
  return run("(" + rank_cmd(m.at, port, 0, args) + " & p0=$!; " + rank_cmd(m.at, port, 1, args) + " & p1=$!; " +
             meanwhile + "wait $p0; wait $p1; echo STATUS done)");
}

/// Both ranks came back (nothing waited for ever), and the WAL's failure
/// reached them and the host's finish.
void check_the_failure_was_told(const Output& out) {
  BOOST_TEST(out.text.find("STATUS done") != std::string::npos);
  BOOST_TEST(out.text.find("the run's write-ahead log could not be written") != std::string::npos);
  BOOST_TEST(out.text.find("[0] rank 0 finish:") != std::string::npos); // finish reports it
}

/// The steps each rank was told were committed ("[r] ACKED s").
std::map<int, std::set<long>> acked(const std::string& text) {
  std::map<int, std::set<long>> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    int r, end = 0;
    long s;
    if (std::sscanf(line.c_str(), "[%d] ACKED %ld%n", &r, &s, &end) == 2 && static_cast<std::size_t>(end) == line.size())
      out[r].insert(s);
  }
  return out;
}

/// The WAL's last frames, "rank:step,step ..." each, for a failed check.
std::string wal_tail;

/// The steps of each rank's values that the WAL holds.
std::map<int, std::set<long>> in_wal(const fs::path& wal) {
  std::map<int, std::set<long>> out;
  std::vector<std::string> frames;
  const chorus::Result<chorus::store::WalScan> scan = chorus::store::scan_wal(
      wal.string(),
      [&](std::span<const char> payload, std::uint64_t) {
        chorus::core::wire::Frame f;
        if (!chorus::core::wire::decode(payload, f)) return;
        std::string line = std::to_string(f.rank) + ":";
        chorus::core::wire::for_each_event(f, [&](const chorus::core::wire::RankEvent& ev) {
          if (const auto* v = std::get_if<chorus::core::wire::Values>(&ev); v && v->n > 0) {
            out[static_cast<int>(f.rank)].insert(static_cast<long>(v->step));
            line += std::to_string(v->step) + ",";
          }
        });
        frames.push_back(std::move(line));
      });
  wal_tail.clear();
  for (std::size_t i = frames.size() > 8 ? frames.size() - 8 : 0; i < frames.size(); ++i) wal_tail += frames[i] + " ";
  BOOST_TEST(scan.has_value(), scan.error().message());
  return out;
}

/// The start and the end of a long output, for a failed check.
std::string ends_of(const std::string& text) {
  if (text.size() <= 8000) return text;
  return text.substr(0, 4000) + "\n...\n" + text.substr(text.size() - 4000);
}

void check_nothing_acknowledged_is_lost(const std::string& text, const fs::path& wal) {
  const auto told = acked(text);
  const auto kept = in_wal(wal);
  std::size_t n = 0, missing = 0;
  std::string first;
  for (const auto& [rank, steps] : told)
    for (long s : steps) {
      ++n;
      const auto it = kept.find(rank);
      if (it != kept.end() && it->second.contains(s)) continue;
      if (missing++ == 0) first = "rank " + std::to_string(rank) + " step " + std::to_string(s);
    }
  std::string extent; // per rank: the last step told, the last one kept
  for (const auto& [rank, steps] : told) {
    const auto it = kept.find(rank);
    extent += " rank " + std::to_string(rank) + " told up to " + std::to_string(*steps.rbegin()) + ", WAL holds " +
              (it == kept.end() ? std::string("none") : std::to_string(*it->second.rbegin())) + ";";
  }
  BOOST_TEST(n > 0u, "no step was acknowledged before the disk failed");
  BOOST_TEST(missing == 0u, missing << " of " << n << " acknowledged steps are not in the WAL, the first: " << first
                                    << " (" << extent << " the WAL's last frames: " << wal_tail << ")\n" << ends_of(text));
}

} // namespace

BOOST_AUTO_TEST_CASE(a_full_disk_fails_the_run_and_loses_nothing_acknowledged) {
  if (!can_mount()) return;
  Mount m("2m");
  BOOST_REQUIRE(m.ok);
  const int port = test_port(51);
  const std::string args = "--steps 8000 --ack-each 1";
  const Output out = run_job(m, port, args);
  BOOST_TEST_INFO(ends_of(out.text));
  check_the_failure_was_told(out);
  BOOST_TEST(out.text.find("No space left on device") != std::string::npos);
  BOOST_TEST(out.text.find("Free disk space") != std::string::npos);
  const auto runs = find_runs(m.at);
  BOOST_REQUIRE(runs.size() == 1);
  check_nothing_acknowledged_is_lost(out.text, runs[0] / "wal");
  // The room the run held lets run.json tell the end and the reason.
  const std::string run_json = slurp(runs[0] / "run.json");
  BOOST_TEST(run_json.find("\"state\":\"failed\"") != std::string::npos, run_json);
  BOOST_TEST(run_json.find("write-ahead log could not be written") != std::string::npos, run_json);
}

BOOST_AUTO_TEST_CASE(a_disk_shut_down_under_the_run_loses_nothing_acknowledged) {
  if (!can_mount()) return;
  Mount m;
  if (!m.ok) {
    std::printf("skipped: no loop-mounted ext4 here (mkfs.ext4 or a loop device missing)\n");
    return;
  }
  const int port = test_port(52);
  const std::string args = "--steps 3000 --ack-each 1 --step-us 500";
  const Output out = run_job(m, port, args, "sleep 1; " + bin("chorus_fs_shutdown") + " " + m.at.string() + "; ");
  BOOST_TEST_INFO(ends_of(out.text));
  BOOST_TEST(out.text.find("SHUTDOWN") != std::string::npos);
  check_the_failure_was_told(out);
  // What the kernel had not put on the disk is gone after the shutdown: what
  // the ranks were told is committed must not be.
  BOOST_REQUIRE(m.remount());
  const auto runs = find_runs(m.at, "wal");
  BOOST_REQUIRE(runs.size() == 1);
  check_nothing_acknowledged_is_lost(out.text, runs[0] / "wal");
}
