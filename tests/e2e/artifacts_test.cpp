// run.log_artifact: files copied into the run directory on a chorus thread,
// hashed, listed in artifacts.jsonl; in one process and in a shared run of
// real processes under `chorus launch`.
#define BOOST_TEST_MODULE e2e_artifacts
#include "local_run.hpp"
#include "tests/io/artifact_manifest.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

using namespace e2e;
using chorus::test::files::has_temp_files;
using chorus::test::files::ManifestEntry;
using chorus::test::files::mode_of;
using chorus::test::files::random_bytes;
using chorus::test::files::read_manifest;
using chorus::test::files::spit;

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)

namespace {

chorus::Options local_options(const TempDir& dir) { return e2e::local_options(dir, "artifacts"); }

/// SHA-256 as coreutils computes it: a check independent of chorus's digest.
std::string sha256sum(const fs::path& p) {
  const Output out = run("sha256sum '" + p.string() + "'");
  BOOST_REQUIRE_MESSAGE(out.status == 0, out.text);
  return out.text.substr(0, 64);
}

/// The usual pattern: train, reach a barrier, save a checkpoint and log it.
chorus::task<chorus::Error> train_and_checkpoint(chorus::Run& run, std::string checkpoint) {
  for (int s = 0; s < 5; ++s) run.log({{"loss", 1.0 / (s + 1)}});
  chorus::Error e = co_await run.barrier("epoch-0");
  if (e) co_return e;
  co_return co_await run.log_artifact("ckpt/epoch-0/model.pt", checkpoint, "model");
}

} // namespace

BOOST_AUTO_TEST_CASE(an_artifact_is_copied_exactly_hashed_and_listed) {
  TempDir dir;
  const fs::path big = dir.path / "model.pt";
  const fs::path small = dir.path / "notes.txt";
  // 20 MiB and a bit: more than the copy's 1 MiB chunk, and a partial last one.
  spit(big, random_bytes((20u << 20) + 4321, 11));
  spit(small, "lr=1e-3\n");
  chorus::Run run = chorus::init(local_options(dir));
  const auto me = std::this_thread::get_id();
  chorus::Error e = chorus::sync_wait(train_and_checkpoint(run, big.string()));
  BOOST_TEST(!e, e.message());
  BOOST_TEST((std::this_thread::get_id() == me));
  e = run.log_artifact("notes.txt", small.string()).wait();
  BOOST_TEST(!e, e.message());
  const fs::path rd(run.dir());
  const chorus::FinishResult r = run.finish().wait();
  BOOST_TEST(!r.error, r.error.message());

  const fs::path copied = rd / "artifacts/ckpt/epoch-0/model.pt";
  BOOST_TEST((slurp(copied) == slurp(big)));
  BOOST_TEST(slurp(rd / "artifacts/notes.txt") == "lr=1e-3\n");
  const auto entries = read_manifest(rd);
  BOOST_REQUIRE_EQUAL(entries.size(), 2u);
  BOOST_TEST(entries[0].name == "ckpt/epoch-0/model.pt");
  BOOST_TEST(entries[0].type == "model");
  BOOST_TEST(entries[0].size == fs::file_size(big));
  BOOST_TEST(entries[0].sha256 == sha256sum(big));
  BOOST_TEST(entries[0].sha256 == sha256sum(copied));
  BOOST_TEST(entries[0].rank == 0);
  BOOST_TEST(entries[0].step == 4); // five automatic steps: 0..4
  const double now = static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  BOOST_TEST(std::abs(entries[0].timestamp - now) < 600.0);
  BOOST_TEST(entries[1].name == "notes.txt");
  BOOST_TEST(entries[1].type == "file"); // the default type
  BOOST_TEST(entries[1].sha256 == sha256sum(small));

  BOOST_TEST(mode_of(rd / "artifacts") == 0700u);
  BOOST_TEST(mode_of(rd / "artifacts/ckpt") == 0700u);
  BOOST_TEST(mode_of(rd / "artifacts/ckpt/epoch-0") == 0700u);
  BOOST_TEST(mode_of(copied) == 0600u);
  BOOST_TEST(mode_of(rd / "artifacts.jsonl") == 0600u);
  BOOST_TEST(!has_temp_files(rd));
}

BOOST_AUTO_TEST_CASE(relogging_a_name_replaces_the_file_and_the_last_line_wins) {
  TempDir dir;
  const fs::path src = dir.path / "ckpt.bin";
  chorus::Run run = chorus::init(local_options(dir));
  spit(src, "epoch 1");
  run.log({{"loss", 1.0}}, {.step = 10});
  BOOST_TEST(!run.log_artifact("best.bin", src.string(), "checkpoint").wait());
  spit(src, "epoch 2, better"); // the ticket completed: the source may change
  run.log({{"loss", 0.5}}, {.step = 20});
  BOOST_TEST(!run.log_artifact("best.bin", src.string(), "checkpoint").wait());
  const fs::path rd(run.dir());
  BOOST_TEST(!run.finish().wait().error);
  BOOST_TEST(slurp(rd / "artifacts/best.bin") == "epoch 2, better");
  const auto entries = read_manifest(rd);
  BOOST_REQUIRE_EQUAL(entries.size(), 2u);
  BOOST_TEST(entries[0].step == 10);
  BOOST_TEST(entries[1].step == 20);
  BOOST_TEST(entries[1].size == 15u);
  BOOST_TEST(entries[1].sha256 == sha256sum(rd / "artifacts/best.bin"));
}

BOOST_AUTO_TEST_CASE(bad_calls_are_errors_that_name_the_cause) {
  TempDir dir;
  const fs::path src = dir.path / "m.pt";
  spit(src, "x");
  chorus::Run run = chorus::init(local_options(dir));
  struct Case {
    const char* name;
    const char* rule;
  };
  for (const Case& c : {Case{"", "is empty"}, Case{"/abs/m.pt", "starts with '/'"}, Case{"a/../m.pt", "holds \"..\""},
                        Case{"a//m.pt", "empty segment"}, Case{"m?.pt", "byte 0x3f"}, Case{"./m.pt", "\".\" segment"}}) {
    const chorus::Pending p = run.log_artifact(c.name, src.string());
    BOOST_TEST(p.ready()); // refused at once
    const chorus::Error e = p.wait();
    BOOST_TEST((e.code() == chorus::Errc::invalid_argument));
    BOOST_TEST(e.message().find(c.rule) != std::string::npos, e.message());
  }
  BOOST_TEST(run.log_artifact(std::string(251, 'a'), src.string()).wait().message().find("at most 250 bytes") !=
             std::string::npos);

  chorus::Error e = run.log_artifact("gone.pt", (dir.path / "gone.pt").string()).wait();
  BOOST_TEST((e.code() == chorus::Errc::invalid_argument));
  BOOST_TEST(e.message().find("gone.pt") != std::string::npos, e.message());
  BOOST_TEST(e.message().find("No such file") != std::string::npos, e.message());
  e = run.log_artifact("dir", dir.path.string()).wait();
  BOOST_TEST(e.message().find("is a directory") != std::string::npos, e.message());
  e = run.log_artifact("m.pt", src.string(), "").wait();
  BOOST_TEST(e.message().find("artifact type") != std::string::npos, e.message());
  e = run.log_artifact("m.pt", "").wait();
  BOOST_TEST(e.message().find("source path") != std::string::npos, e.message());

  // A relative path is taken from the directory current at the call.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path);
  const chorus::Pending relative = run.log_artifact("rel.pt", "m.pt");
  fs::current_path(cwd);
  BOOST_TEST(!relative.wait(), relative.wait().message());

  const fs::path rd(run.dir());
  BOOST_TEST(!run.finish().wait().error);
  e = run.log_artifact("late.pt", src.string()).wait();
  BOOST_TEST((e.code() == chorus::Errc::finished));
  BOOST_TEST(e.message().find("before calling finish()") != std::string::npos, e.message());
  // Only the good calls left a trace.
  const auto entries = read_manifest(rd);
  BOOST_REQUIRE_EQUAL(entries.size(), 1u);
  BOOST_TEST(entries[0].name == "rel.pt");
  BOOST_TEST(!fs::exists(rd / "artifacts/late.pt"));

  chorus::Run inactive;
  BOOST_TEST(!inactive.log_artifact("m.pt", "/nonexistent").wait()); // a no-op, ok
}

BOOST_AUTO_TEST_CASE(finish_waits_for_a_copy_in_flight) {
  TempDir dir;
  const fs::path src = dir.path / "big.bin";
  spit(src, random_bytes(96u << 20, 5));
  chorus::Run run = chorus::init(local_options(dir));
  const chorus::Pending copy = run.log_artifact("big.bin", src.string(), "checkpoint");
  BOOST_WARN(!copy.ready()); // 96 MiB are not copied in a few microseconds
  const fs::path rd(run.dir());
  const chorus::FinishResult r = run.finish().wait();
  BOOST_TEST(!r.error, r.error.message());
  BOOST_TEST(copy.ready()); // before finish completed
  BOOST_TEST(!copy.wait(), copy.wait().message());
  BOOST_TEST(fs::file_size(rd / "artifacts/big.bin") == fs::file_size(src));
  const auto entries = read_manifest(rd);
  BOOST_REQUIRE_EQUAL(entries.size(), 1u);
  BOOST_TEST(entries[0].sha256 == sha256sum(src));
}

BOOST_AUTO_TEST_CASE(a_copy_past_finish_timeout_is_abandoned_and_leaves_nothing) {
  TempDir dir;
  // A sparse 2 GiB file: quick to read, far too long to write in 50 ms.
  const fs::path src = dir.path / "huge.bin";
  {
    const int fd = ::open(src.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    BOOST_REQUIRE(fd >= 0);
    BOOST_REQUIRE(::ftruncate(fd, off_t{2} << 30) == 0);
    ::close(fd);
  }
  auto opt = local_options(dir);
  opt.finish_timeout = std::chrono::milliseconds(50);
  chorus::Run run = chorus::init(opt);
  const chorus::Pending copy = run.log_artifact("huge.bin", src.string());
  const chorus::Pending queued = run.log_artifact("queued.bin", src.string());
  const fs::path rd(run.dir());
  const auto start = std::chrono::steady_clock::now();
  const chorus::FinishResult r = run.finish().wait();
  const auto took = std::chrono::steady_clock::now() - start;
  BOOST_TEST(!r.error, r.error.message());
  BOOST_TEST(took < std::chrono::seconds(30));
  for (const chorus::Pending& p : {copy, queued}) {
    const chorus::Error e = p.wait();
    BOOST_TEST((e.code() == chorus::Errc::timeout), e.message());
    BOOST_TEST(e.message().find("CHORUS_FINISH_TIMEOUT") != std::string::npos, e.message());
  }
  BOOST_TEST(!fs::exists(rd / "artifacts/huge.bin"));
  BOOST_TEST(!fs::exists(rd / "artifacts/queued.bin"));
  BOOST_TEST(!fs::exists(rd / "artifacts.jsonl"));
  run = chorus::Run(); // joins the copier: the temporary file is gone
  BOOST_TEST(!has_temp_files(rd));
}

// Two ranks of one shared run on one machine: rank 0 logs its checkpoint
// after a barrier, and rank 1, whose run directory is on this machine too,
// logs one as well.
BOOST_AUTO_TEST_CASE(ranks_of_a_shared_run_on_one_machine_log_artifacts) {
  TempDir dir;
  const fs::path src = dir.path / "weights.bin";
  spit(src, random_bytes((3u << 20) + 17, 9));
  const int port = test_port(41);
  const Output out = run("CHORUS_PORT=" + std::to_string(port) + " " +
                         launch_worker(dir.path, 2, port + 1, "--steps 30 --artifact " + src.string()));
  BOOST_TEST_INFO(out.text);
  BOOST_REQUIRE_EQUAL(out.status, 0);
  BOOST_TEST(out.text.find("ARTIFACT 0 ok") != std::string::npos);
  BOOST_TEST(out.text.find("ARTIFACT 1 ok") != std::string::npos);
  const fs::path rd = run_dir_of(out.text);
  BOOST_REQUIRE(!rd.empty());
  const std::string sha = sha256sum(src);
  auto entries = read_manifest(rd);
  BOOST_REQUIRE_EQUAL(entries.size(), 2u);
  std::sort(entries.begin(), entries.end(), [](const ManifestEntry& a, const ManifestEntry& b) { return a.rank < b.rank; });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST_CONTEXT("rank " << r) {
      const ManifestEntry& e = entries[static_cast<std::size_t>(r)];
      BOOST_TEST(e.rank == r);
      BOOST_TEST(e.name == "rank-" + std::to_string(r) + "/weights.bin");
      BOOST_TEST(e.type == "model");
      BOOST_TEST(e.step == 29);
      BOOST_TEST(e.sha256 == sha);
      BOOST_TEST(sha256sum(rd / "artifacts" / e.name) == sha);
    }
  }
  check_worker_history(rd, {0, 1}, 30);
}
