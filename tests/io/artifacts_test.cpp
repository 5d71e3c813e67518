#define BOOST_TEST_MODULE io_artifacts
#include <boost/test/unit_test.hpp>

#include "io/platform/posix.hpp"
#include "io/store/artifacts.hpp"
#include "tests/io/artifact_manifest.hpp"
#include "tests/temp_dir.hpp"

#include <openssl/sha.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using namespace chorus;
using namespace chorus::platform;
using namespace chorus::store;
using namespace chorus::test::files;
using namespace std::string_literals;

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)

namespace {

/// SHA-256 of `s` in hex, by OpenSSL's one-shot call: independent of the streamed digest.
std::string sha256_of(const std::string& s) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), md);
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : md) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

/// A run directory as the run host leaves it: run.json naming `host`.
std::string make_run_dir(const TempDir& tmp, const std::string& host) {
  const std::string rd = tmp / "run";
  std::filesystem::create_directories(rd);
  spit(rd + "/run.json", "{\"id\":\"r1\",\"host\":\"" + host + "\"}");
  return rd;
}

ArtifactRecord record(std::string name, std::string type = "file", int rank = 0, std::int64_t step = -1) {
  ArtifactRecord r;
  r.name = std::move(name);
  r.type = std::move(type);
  r.rank = rank;
  r.step = step;
  r.ts_us = platform::unix_now_us();
  return r;
}

} // namespace

BOOST_AUTO_TEST_CASE(valid_names_pass) {
  for (const char* name : {"model.pt", "ckpt/step-100/model.pt", "a b/c_d.e-f", ".hidden", "a.b/.c.d.", "x"})
    BOOST_TEST(!validate_artifact_name(name), name);
  BOOST_TEST(!validate_artifact_name(std::string(250, 'a')));
}

BOOST_AUTO_TEST_CASE(every_invalid_name_is_refused_with_its_rule) {
  struct Case {
    std::string name;
    std::string rule; // a piece of the message that names the rule
  };
  const std::vector<Case> cases = {
      {"", "is empty"},
      {std::string(251, 'a'), "at most 250 bytes"},
      {"/etc/passwd", "starts with '/'"},
      {"a//b", "empty segment"},
      {"a/", "empty segment"},
      {"../secrets", "holds \"..\""},
      {"a/../../b", "holds \"..\""},
      {"..", "holds \"..\""},
      {"model..pt", "holds \"..\""},
      {"./a", "\".\" segment"},
      {"a/./b", "\".\" segment"},
      {".", "\".\" segment"},
      {"a:b", "byte 0x3a"},
      {"a\\b", "byte 0x5c"},
      {"tab\there", "byte 0x09"},
      {"mod\xc3\xa8le.pt", "byte 0xc3"},
      {"a*b", "MLflow"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT("name \"" << c.name << "\"") {
      const Error e = validate_artifact_name(c.name);
      BOOST_TEST((e.code() == Errc::invalid_argument));
      BOOST_TEST(e.message().find("artifact name") != std::string::npos, e.message());
      BOOST_TEST(e.message().find(c.rule) != std::string::npos, e.message());
    }
  }
  // The refusal comes before any copy: store_artifact writes nothing.
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  spit(tmp / "src", "x");
  ArtifactRecord r = record("../escape");
  BOOST_TEST(store_artifact(rd, tmp / "src", r).message().find("holds \"..\"") != std::string::npos);
  BOOST_TEST(!std::filesystem::exists(rd + "/artifacts.jsonl"));
  BOOST_TEST(!std::filesystem::exists(tmp / "escape"));
}

BOOST_AUTO_TEST_CASE(content_and_sha256_are_exact) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  const std::string content = "weights\n\0binary\xff"s;
  spit(tmp / "model.pt", content);
  ArtifactRecord r = record("model.pt", "model", 3, 41);
  BOOST_REQUIRE(!store_artifact(rd, tmp / "model.pt", r));
  BOOST_TEST(slurp(rd + "/artifacts/model.pt") == content);
  BOOST_TEST(r.size == content.size());
  BOOST_TEST(r.sha256 == sha256_of(content));
  BOOST_TEST(r.sha256.size() == 64u);

  const auto lines = lines_of(rd + "/artifacts.jsonl");
  BOOST_REQUIRE_EQUAL(lines.size(), 1u);
  const ManifestEntry m = parse_manifest_line(lines[0]);
  BOOST_TEST(m.name == "model.pt");
  BOOST_TEST(m.type == "model");
  BOOST_TEST(m.size == content.size());
  BOOST_TEST(m.sha256 == sha256_of(content));
  BOOST_TEST(m.rank == 3);
  BOOST_TEST(m.step == 41);
  BOOST_TEST(std::abs(m.timestamp - static_cast<double>(r.ts_us) / 1e6) < 1e-3);
  BOOST_TEST(m.timestamp > 1.6e9); // Unix seconds, not microseconds
}

BOOST_AUTO_TEST_CASE(an_empty_file_has_the_empty_digest) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  spit(tmp / "empty", "");
  ArtifactRecord r = record("empty");
  BOOST_REQUIRE(!store_artifact(rd, tmp / "empty", r));
  BOOST_TEST(r.size == 0u);
  BOOST_TEST(r.sha256 == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  BOOST_TEST(slurp(rd + "/artifacts/empty").empty());
}

BOOST_AUTO_TEST_CASE(a_file_larger_than_the_chunk_is_copied_exactly) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  // 20 MiB and a bit: many chunks and a partial last one.
  const std::string content = random_bytes(20 * artifact_chunk + 12345, 7);
  spit(tmp / "big.bin", content);
  ArtifactRecord r = record("ckpt/big.bin", "checkpoint");
  BOOST_REQUIRE(!store_artifact(rd, tmp / "big.bin", r));
  BOOST_TEST(r.size == content.size());
  BOOST_TEST(r.sha256 == sha256_of(content));
  BOOST_TEST((slurp(rd + "/artifacts/ckpt/big.bin") == content));
  BOOST_TEST(!has_temp_files(rd));
}

BOOST_AUTO_TEST_CASE(nested_names_make_private_directories) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  ::umask(022); // what a trainer usually has: chorus must not rely on it
  spit(tmp / "src", "abc");
  ArtifactRecord r = record("ckpt/step-100/rank 0/model.pt");
  BOOST_REQUIRE(!store_artifact(rd, tmp / "src", r));
  BOOST_TEST(slurp(rd + "/artifacts/ckpt/step-100/rank 0/model.pt") == "abc");
  BOOST_TEST(mode_of(rd + "/artifacts") == 0700u);
  BOOST_TEST(mode_of(rd + "/artifacts/ckpt") == 0700u);
  BOOST_TEST(mode_of(rd + "/artifacts/ckpt/step-100") == 0700u);
  BOOST_TEST(mode_of(rd + "/artifacts/ckpt/step-100/rank 0") == 0700u);
  BOOST_TEST(mode_of(rd + "/artifacts/ckpt/step-100/rank 0/model.pt") == 0600u);
  BOOST_TEST(mode_of(rd + "/artifacts.jsonl") == 0600u);
}

BOOST_AUTO_TEST_CASE(relogging_a_name_replaces_the_file_and_appends_a_line) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  spit(tmp / "v1", "first version");
  spit(tmp / "v2", "second, longer version");
  ArtifactRecord a = record("model.pt", "model", 0, 10);
  ArtifactRecord b = record("model.pt", "model", 0, 20);
  BOOST_REQUIRE(!store_artifact(rd, tmp / "v1", a));
  BOOST_REQUIRE(!store_artifact(rd, tmp / "v2", b));
  BOOST_TEST(slurp(rd + "/artifacts/model.pt") == "second, longer version");
  const auto lines = lines_of(rd + "/artifacts.jsonl");
  BOOST_REQUIRE_EQUAL(lines.size(), 2u);
  BOOST_TEST(parse_manifest_line(lines[0]).sha256 == sha256_of("first version"));
  const ManifestEntry last = parse_manifest_line(lines[1]);
  BOOST_TEST(last.sha256 == sha256_of("second, longer version"));
  BOOST_TEST(last.step == 20);
  BOOST_TEST(!has_temp_files(rd));
}

BOOST_AUTO_TEST_CASE(a_missing_source_a_directory_and_a_fifo_are_refused) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  ArtifactRecord r = record("x");
  Error e = store_artifact(rd, tmp / "nope.pt", r);
  BOOST_TEST((e.code() == Errc::invalid_argument));
  BOOST_TEST(e.message().find(tmp / "nope.pt") != std::string::npos, e.message());
  BOOST_TEST(e.message().find("No such file") != std::string::npos, e.message());

  e = store_artifact(rd, tmp.str(), r);
  BOOST_TEST((e.code() == Errc::invalid_argument));
  BOOST_TEST(e.message().find("is a directory") != std::string::npos, e.message());

  BOOST_REQUIRE(::mkfifo((tmp / "fifo").c_str(), 0600) == 0);
  e = store_artifact(rd, tmp / "fifo", r); // must not wait for a writer
  BOOST_TEST(e.message().find("not a regular file") != std::string::npos, e.message());

  BOOST_TEST(!std::filesystem::exists(rd + "/artifacts.jsonl"));
  BOOST_TEST(!std::filesystem::exists(rd + "/artifacts/x"));
}

BOOST_AUTO_TEST_CASE(a_missing_run_directory_is_not_made_again) {
  TempDir tmp;
  spit(tmp / "src", "x");
  ArtifactRecord r = record("ckpt/m.pt");
  const Error e = store_artifact(tmp / "gone", tmp / "src", r);
  BOOST_TEST((e.code() == Errc::io_error));
  BOOST_TEST(e.message().find("the run directory is missing") != std::string::npos, e.message());
  BOOST_TEST(!std::filesystem::exists(tmp / "gone"));
}

BOOST_AUTO_TEST_CASE(a_write_error_leaves_nothing_behind) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  const std::string content = random_bytes(3 * artifact_chunk, 3);
  spit(tmp / "src", content);
  // A file size limit makes the copy's writes fail as a full disk would (EFBIG).
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &old);
  rlimit saved {};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  rlimit small = saved;
  small.rlim_cur = artifact_chunk;
  BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  ArtifactRecord r = record("big");
  const Error e = store_artifact(rd, tmp / "src", r);
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::sigaction(SIGXFSZ, &old, nullptr);
  BOOST_TEST((e.code() == Errc::io_error));
  BOOST_TEST(e.message().find("artifact \"big\" was not stored") != std::string::npos, e.message());
  BOOST_TEST(e.message().find("write") != std::string::npos, e.message());
  BOOST_TEST(!std::filesystem::exists(rd + "/artifacts/big"));
  BOOST_TEST(!std::filesystem::exists(rd + "/artifacts.jsonl"));
  BOOST_TEST(!has_temp_files(rd));
}

BOOST_AUTO_TEST_CASE(a_stopped_copy_ends_and_keeps_the_old_file) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  spit(tmp / "old", "old");
  spit(tmp / "new", random_bytes(2 * artifact_chunk, 5));
  ArtifactRecord r = record("m");
  BOOST_REQUIRE(!store_artifact(rd, tmp / "old", r));
  const std::atomic<bool> stop{true};
  const Error e = store_artifact(rd, tmp / "new", r, &stop);
  BOOST_TEST((e.code() == Errc::timeout));
  BOOST_TEST(e.message().find("abandoned") != std::string::npos, e.message());
  BOOST_TEST(slurp(rd + "/artifacts/m") == "old");
  BOOST_TEST(lines_of(rd + "/artifacts.jsonl").size() == 1u);
  BOOST_TEST(!has_temp_files(rd));
}

BOOST_AUTO_TEST_CASE(concurrent_appends_keep_whole_lines) {
  TempDir tmp;
  const std::string rd = make_run_dir(tmp, "h");
  spit(tmp / "src", "payload");
  // Boost.Test's checks are not thread-safe: each thread keeps its errors, checked after the join.
  std::vector<std::vector<Error>> errors(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        ArtifactRecord r = record("t" + std::to_string(t) + "/a" + std::to_string(i), "file", t, i);
        if (Error e = store_artifact(rd, tmp / "src", r)) errors[static_cast<std::size_t>(t)].push_back(std::move(e));
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& per_thread : errors)
    for (const Error& e : per_thread) BOOST_TEST(!e, e.message());
  const auto lines = lines_of(rd + "/artifacts.jsonl");
  BOOST_REQUIRE_EQUAL(lines.size(), 40u);
  for (const auto& l : lines) BOOST_TEST(parse_manifest_line(l).sha256 == sha256_of("payload"));
}

BOOST_AUTO_TEST_CASE(the_run_dir_must_be_on_this_machine) {
  TempDir tmp;
  Error e = check_run_dir_is_here(tmp / "absent");
  BOOST_TEST((e.code() == Errc::invalid_argument));
  BOOST_TEST(e.message().find("log_artifact needs the run directory on this machine: call it on the run host's node "
                              "(rank 0 in shared global mode)") == 0u,
             e.message());
  BOOST_TEST(e.message().find("does not exist here") != std::string::npos, e.message());

  const std::string here = platform::this_host();
  {
    const std::string rd = make_run_dir(tmp, "some-other-node-" + here);
    e = check_run_dir_is_here(rd);
    BOOST_TEST(e.message().find("hosted by some-other-node-") != std::string::npos, e.message());
  }
  {
    const std::string rd = make_run_dir(tmp, here);
    BOOST_TEST(!check_run_dir_is_here(rd));
  }
}
