#define BOOST_TEST_MODULE io_run_dir
#include <boost/test/unit_test.hpp>

#include "io/platform/files.hpp"
#include "io/store/history_blocks.hpp"
#include "io/store/metric_specs.hpp"
#include "io/store/run_writer.hpp"
#include "runtime/core/wire.hpp"
#include "tests/io/files.hpp"
#include "tests/temp_dir.hpp"

#include <simdjson.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace chorus;
using namespace chorus::platform;
using namespace chorus::store;

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)
using chorus::core::Row;
using chorus::core::RowValue;
using chorus::test::files::lines_of;
using chorus::test::files::mode_of;
using chorus::test::files::slurp;
using chorus::test::TempDir;

namespace {

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Each parsed document keeps its own parser, so elements stay valid.
struct Doc {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  explicit Doc(const std::string& json) {
    const auto err = parser.parse(json).get(root);
    BOOST_TEST_REQUIRE(!err, "invalid JSON (" << simdjson::error_message(err) << "): " << json);
  }
  [[nodiscard]] double num(std::string_view key) {
    double d = 0;
    BOOST_TEST_REQUIRE(!root[key].get_double().get(d), "no number at " << key);
    return d;
  }
  [[nodiscard]] std::int64_t integer(std::string_view key) {
    std::int64_t i = 0;
    BOOST_TEST_REQUIRE(!root[key].get_int64().get(i), "no integer at " << key);
    return i;
  }
  [[nodiscard]] std::string str(std::string_view key) {
    std::string_view s;
    BOOST_TEST_REQUIRE(!root[key].get_string().get(s), "no string at " << key);
    return std::string(s);
  }
  [[nodiscard]] bool has(std::string_view key) { return !root[key].error(); }
  [[nodiscard]] std::size_t size() {
    simdjson::dom::object o;
    BOOST_TEST_REQUIRE(!root.get(o));
    return o.size();
  }
};

struct UmaskGuard {
  mode_t old;
  explicit UmaskGuard(mode_t m) : old(::umask(m)) {}
  ~UmaskGuard() { ::umask(old); }
};

const std::vector<std::string> key_names = {"loss", "acc", "lr", "we\"ird"};
std::string_view name_of(std::uint32_t k) { return key_names.at(k); }

constexpr std::int64_t t0 = 1'700'000'000'250'000; // unix µs

} // namespace

BOOST_AUTO_TEST_CASE(dirs_0700_files_0600_whatever_the_umask) {
  for (const mode_t mask : {mode_t{0}, mode_t{0022}, mode_t{0777}}) {
    BOOST_TEST_CONTEXT("umask " << std::oct << mask) {
      TempDir tmp;
      UmaskGuard g(mask);
      const std::string deep = tmp / "a/b/c";
      BOOST_REQUIRE(!make_dirs(deep + "/"));
      BOOST_TEST(mode_of(tmp / "a") == 0700u);
      BOOST_TEST(mode_of(tmp / "a/b") == 0700u);
      BOOST_TEST(mode_of(deep) == 0700u);
      BOOST_TEST(!make_dirs(deep)); // exists already: fine

      BOOST_REQUIRE(!write_file_atomic(deep + "/f.json", "{}"));
      BOOST_TEST(mode_of(deep + "/f.json") == 0600u);

      auto f = AppendFile::open(deep + "/h.jsonl");
      BOOST_REQUIRE_MESSAGE(f, f.error().message());
      BOOST_TEST(mode_of(deep + "/h.jsonl") == 0600u);
    }
  }
}

BOOST_AUTO_TEST_CASE(make_dirs_leaves_existing_dirs_and_refuses_files) {
  TempDir tmp;
  UmaskGuard g(0);
  BOOST_REQUIRE(::chmod(tmp.str().c_str(), 0755) == 0);
  BOOST_REQUIRE(!make_dirs(tmp / "x"));
  BOOST_TEST(mode_of(tmp.str()) == 0755u);
  BOOST_REQUIRE(!write_file_atomic(tmp / "file", "x"));
  const Error e = make_dirs(tmp / "file/sub");
  BOOST_TEST(e.code() == Errc::io_error);
  BOOST_TEST(e.message().find(tmp / "file") != std::string::npos);
  BOOST_TEST(make_dirs("").code() == Errc::invalid_argument);
}

BOOST_AUTO_TEST_CASE(atomic_rewrite_leaves_no_temp_files) {
  TempDir tmp;
  for (int i = 0; i < 20; ++i) BOOST_REQUIRE(!write_file_atomic(tmp / "summary.json", std::to_string(i)));
  BOOST_TEST(slurp(tmp / "summary.json") == "19");
  BOOST_TEST(names_in(tmp.str()) == std::vector<std::string>{"summary.json"}, boost::test_tools::per_element());

  const Error e = write_file_atomic(tmp / "missing/x.json", "{}");
  BOOST_TEST(e.code() == Errc::io_error);
  BOOST_TEST(e.message().find("No such file") != std::string::npos);
  BOOST_TEST(names_in(tmp.str()) == std::vector<std::string>{"summary.json"}, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(staged_files_change_nothing_until_committed) {
  TempDir tmp;
  BOOST_REQUIRE(!write_file_atomic(tmp / "run.json", "old"));
  {
    // Staged, never committed: the old file stands, and no temporary file is left.
    Result<StagedFile> f = StagedFile::replace(tmp / "run.json", "new");
    BOOST_REQUIRE(f);
    BOOST_TEST(f->staged());
    BOOST_TEST(slurp(tmp / "run.json") == "old");
  }
  BOOST_TEST(names_in(tmp.str()) == std::vector<std::string>{"run.json"}, boost::test_tools::per_element());
  // Two staged together: each is in place once committed, and only then.
  Result<StagedFile> a = StagedFile::replace(tmp / "run.json", "new");
  Result<StagedFile> b = StagedFile::replace(tmp / "summary.json", "{}");
  BOOST_REQUIRE(a);
  BOOST_REQUIRE(b);
  BOOST_TEST(!std::filesystem::exists(tmp / "summary.json"));
  BOOST_TEST(!b->commit());
  BOOST_TEST(slurp(tmp / "summary.json") == "{}");
  BOOST_TEST(slurp(tmp / "run.json") == "old");
  BOOST_TEST(!a->commit());
  BOOST_TEST(!a->commit()); // once only: nothing more
  BOOST_TEST(slurp(tmp / "run.json") == "new");
  BOOST_TEST(names_in(tmp.str()) == (std::vector<std::string>{"run.json", "summary.json"}),
             boost::test_tools::per_element());
  // A file as it stands is synced where it is; a missing one has nothing to commit.
  Result<StagedFile> kept = StagedFile::existing(tmp / "run.json");
  BOOST_REQUIRE(kept);
  BOOST_TEST(kept->staged());
  BOOST_TEST(!kept->commit());
  BOOST_TEST(slurp(tmp / "run.json") == "new");
  Result<StagedFile> none = StagedFile::existing(tmp / "config.json");
  BOOST_REQUIRE(none);
  BOOST_TEST(!none->staged());
  BOOST_TEST(!none->commit());
  BOOST_TEST(names_in(tmp.str()) == (std::vector<std::string>{"run.json", "summary.json"}),
             boost::test_tools::per_element());
  // Where the temporary file cannot be made, the error names it.
  const Result<StagedFile> nowhere = StagedFile::replace(tmp / "missing/x.json", "{}");
  BOOST_REQUIRE(!nowhere);
  BOOST_TEST(nowhere.error().message().find("missing/.x.json.tmp") != std::string::npos, nowhere.error().message());
}

BOOST_AUTO_TEST_CASE(append_file_buffers_until_flush) {
  TempDir tmp;
  const std::string path = tmp / "h.jsonl";
  {
    auto opened = AppendFile::open(path);
    BOOST_REQUIRE(opened);
    auto& f = *opened;
    BOOST_REQUIRE(!f->write("one\n"));
    BOOST_TEST(slurp(path).empty());
    BOOST_TEST(f->buffered() == 4u);
    BOOST_REQUIRE(!f->flush());
    BOOST_TEST(slurp(path) == "one\n");
    // Past the buffer limit the data goes out without waiting for flush().
    const std::string big(AppendFile::buffer_limit + 10, 'x');
    BOOST_REQUIRE(!f->write("two\n"));
    BOOST_REQUIRE(!f->write(big));
    BOOST_TEST(slurp(path).size() == 8 + big.size());
    BOOST_REQUIRE(!f->write("three\n"));
  } // the destructor flushes
  BOOST_TEST(slurp(path).size() == 14 + AppendFile::buffer_limit + 10);
  {
    auto f = AppendFile::open(path);
    BOOST_REQUIRE(f);
    BOOST_REQUIRE(!(*f)->write("more\n"));
  }
  BOOST_TEST(slurp(path).ends_with("three\nmore\n"));
  {
    auto f = AppendFile::open(path, /*truncate=*/true);
    BOOST_REQUIRE(f);
    BOOST_REQUIRE(!(*f)->sync());
  }
  BOOST_TEST(slurp(path).empty());
}

// A file's lines past its first buffer (AppendFile::first_buffer) stay
// buffered, in order, until the limit: the buffer grows once, to the limit,
// and what it held moves with it.
BOOST_AUTO_TEST_CASE(append_file_keeps_every_line_past_its_first_buffer) {
  TempDir tmp;
  const std::string path = tmp / "h.jsonl";
  std::string expected;
  {
    auto opened = AppendFile::open(path);
    BOOST_REQUIRE(opened);
    auto& f = *opened;
    std::size_t i = 0;
    while (expected.size() < AppendFile::first_buffer * 3) {
      ++i;
      std::string line = std::to_string(i) + ":" + std::string(1000 + i % 37, static_cast<char>('a' + i % 26)) + "\n";
      BOOST_REQUIRE(!f->write(line));
      expected += line;
    }
    BOOST_TEST(f->buffered() == expected.size());
    BOOST_TEST(slurp(path).empty()); // still under buffer_limit: nothing written yet
    // Up to the limit exactly, then one byte more: out in one piece, in order.
    const std::string fill(AppendFile::buffer_limit - expected.size(), 'f');
    BOOST_REQUIRE(!f->write(fill));
    expected += fill;
    BOOST_TEST(slurp(path).empty());
    BOOST_REQUIRE(!f->write("z"));
    expected += "z";
    BOOST_TEST(slurp(path).size() == AppendFile::buffer_limit);
    BOOST_TEST(f->buffered() == 1u);
  }
  BOOST_TEST((slurp(path) == expected));
}

BOOST_AUTO_TEST_CASE(run_writer_writes_every_file) {
  TempDir tmp;
  UmaskGuard g(0);
  const std::string dir = tmp / "proj/group/run-1";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  {
    RunWriter w(dir, name_of);
    w.run_start(R"({"id":"run-1","project":"proj","mode":"shared","state":"bogus","world_size":99,"host":"h0"})", t0, 2);
    w.rank_state(0, RunState::running, -1, "h0", "");
    w.rank_state(1, RunState::running, -1, "h1", "");
    w.config(0, R"({"lr":0.001,"opt":{"name":"adam"},"tags":["a","b"]})");
    w.config(1, R"({"lr":0.002,"bs":32})");

    Row r0;
    r0.step = 0;
    r0.ts_us = t0 + 1'000'000;
    r0.runtime_us = 1'000'000;
    r0.values = {RowValue{1, 0, 0.9, 0}, RowValue{1, 1, nan, 0}, RowValue{0, -1, 0.5, 2}, RowValue{2, -1, inf, 0}};
    w.row(r0);
    Row r1;
    r1.step = 5;
    r1.ts_us = t0 + 2'000'001;
    r1.runtime_us = 2'000'001;
    r1.values = {RowValue{2, -1, -inf, 0}, RowValue{3, -1, 7.0, 0}};
    w.row(r1);

    w.summary(0, R"({"best":0.95,"loss":1.5})");
    const std::pair<std::string_view, double> vals[] = {{"loss", 1.0}, {"acc", nan}};
    w.rejected(1, 7, 3, vals, Error{Errc::backwards_step, "step 3 is below the rank's last step 5"});
    w.rejected(1, 8, core::wire::auto_step, std::span(vals, 1), Error{Errc::step_committed, "already committed"});
    w.rank_state(1, RunState::crashed, 5, "h1", "no heartbeat for 10 s");
    w.flush();
    BOOST_TEST(!w.error(), w.error().message());
    BOOST_TEST(w.rows() == 2u);
    BOOST_TEST(w.rejected_values() == 3u);

    // Mid-run: run.json says running with the crash, end_time null.
    Doc run(slurp(dir + "/run.json"));
    BOOST_TEST(run.str("state") == to_string(RunState::running));
    BOOST_TEST(run.root["end_time"].is_null());
    simdjson::dom::array ranks;
    BOOST_REQUIRE(!run.root["ranks"].get(ranks));
    BOOST_TEST(ranks.size() == 2u);
    std::string_view s;
    BOOST_REQUIRE(!ranks.at(1)["state"].get(s));
    BOOST_TEST(s == to_string(RunState::crashed));
    BOOST_REQUIRE(!ranks.at(1)["message"].get(s));
    BOOST_TEST(s == "no heartbeat for 10 s");
    std::int64_t last = 0;
    BOOST_REQUIRE(!ranks.at(1)["last_step"].get(last));
    BOOST_TEST(last == 5);

    w.run_end(RunState::finished, t0 + 3'000'000);
    BOOST_TEST(!w.error(), w.error().message());
  }

  BOOST_TEST(mode_of(dir) == 0700u);
  // No histogram, media or event was written: none of their files was made.
  const std::vector<std::string> files = {"config.json", "history.jsonl", "rejected.jsonl", "run.json", "summary.json"};
  BOOST_TEST(names_in(dir) == files, boost::test_tools::per_element());
  for (const auto& f : files) BOOST_TEST(mode_of(dir + "/" + f) == 0600u, f);

  // history.jsonl
  const auto hist = lines_of(dir + "/history.jsonl");
  BOOST_REQUIRE(hist.size() == 2u);
  BOOST_TEST(hist[0] == R"({"_step":0,"_timestamp":1700000001.25,"_runtime":1,"acc/rank-0":0.9,"acc/rank-1":"NaN",)"
                        R"("loss":0.5,"lr":"Infinity","_count":{"loss":2}})");
  {
    Doc h(hist[0]);
    BOOST_TEST(h.integer("_step") == 0);
    BOOST_TEST(h.num("_timestamp") == 1700000001.25);
    BOOST_TEST(h.num("_runtime") == 1.0);
    BOOST_TEST(h.num("acc/rank-0") == 0.9);
    BOOST_TEST(h.str("acc/rank-1") == "NaN");
    BOOST_TEST(h.num("loss") == 0.5);
    BOOST_TEST(h.str("lr") == "Infinity");
    std::int64_t count = 0;
    BOOST_REQUIRE(!h.root["_count"]["loss"].get(count));
    BOOST_TEST(count == 2);
  }
  {
    Doc h(hist[1]);
    BOOST_TEST(h.integer("_step") == 5);
    BOOST_TEST(h.num("_timestamp") == 1700000002.250001);
    BOOST_TEST(h.num("_runtime") == 2.000001);
    BOOST_TEST(h.str("lr") == "-Infinity");
    BOOST_TEST(h.num("we\"ird") == 7.0);
    BOOST_TEST(!h.has("_count"));
    BOOST_TEST(h.size() == 5u);
  }

  // config.json: merged, the later value of lr wins, first-seen order kept.
  BOOST_TEST(slurp(dir + "/config.json") == "{\"lr\":0.002,\"opt\":{\"name\":\"adam\"},\"tags\":[\"a\",\"b\"],\"bs\":32}\n");

  // summary.json: last values overlaid with the explicit keys.
  {
    Doc sm(slurp(dir + "/summary.json"));
    BOOST_TEST(sm.integer("_step") == 5);
    BOOST_TEST(sm.num("_runtime") == 2.000001);
    BOOST_TEST(sm.num("acc/rank-0") == 0.9);
    BOOST_TEST(sm.str("acc/rank-1") == "NaN");
    BOOST_TEST(sm.num("loss") == 1.5); // explicit beats the last logged 0.5
    BOOST_TEST(sm.str("lr") == "-Infinity");
    BOOST_TEST(sm.num("we\"ird") == 7.0);
    BOOST_TEST(sm.num("best") == 0.95);
    BOOST_TEST(sm.size() == 9u); // _step _runtime _timestamp acc/rank-0 acc/rank-1 lr we"ird loss best
  }

  // rejected.jsonl
  const auto rej = lines_of(dir + "/rejected.jsonl");
  BOOST_REQUIRE(rej.size() == 2u);
  {
    Doc r(rej[0]);
    BOOST_TEST(r.integer("rank") == 1);
    BOOST_TEST(r.integer("seq") == 7);
    BOOST_TEST(r.integer("step") == 3);
    BOOST_TEST(r.str("error") == to_string(Errc::backwards_step));
    BOOST_TEST(r.str("message") == "step 3 is below the rank's last step 5");
    double v = 0;
    BOOST_REQUIRE(!r.root["values"]["loss"].get(v));
    BOOST_TEST(v == 1.0);
    std::string_view s;
    BOOST_REQUIRE(!r.root["values"]["acc"].get(s));
    BOOST_TEST(s == "NaN");
  }
  {
    Doc r(rej[1]);
    BOOST_TEST(r.root["step"].is_null());
    BOOST_TEST(r.str("error") == to_string(Errc::step_committed));
  }

  // run.json: the identity kept, the run's own fields rewritten.
  {
    Doc run(slurp(dir + "/run.json"));
    BOOST_TEST(run.str("id") == "run-1");
    BOOST_TEST(run.str("project") == "proj");
    BOOST_TEST(run.str("mode") == "shared");
    BOOST_TEST(run.str("host") == "h0");
    BOOST_TEST(run.str("state") == to_string(RunState::finished));
    BOOST_TEST(run.num("start_time") == 1700000000.25);
    BOOST_TEST(run.num("end_time") == 1700000003.25);
    BOOST_TEST(run.integer("world_size") == 2);
    BOOST_TEST(run.integer("rows") == 2);
    BOOST_TEST(run.integer("rejected") == 3);
    simdjson::dom::array ranks;
    BOOST_REQUIRE(!run.root["ranks"].get(ranks));
    BOOST_REQUIRE(ranks.size() == 2u);
    std::int64_t rank = -1;
    std::string_view s;
    BOOST_REQUIRE(!ranks.at(0)["rank"].get(rank));
    BOOST_TEST(rank == 0);
    BOOST_REQUIRE(!ranks.at(0)["host"].get(s));
    BOOST_TEST(s == "h0");
    BOOST_REQUIRE(!ranks.at(1)["state"].get(s));
    BOOST_TEST(s == to_string(RunState::crashed));
    simdjson::dom::array segments;
    BOOST_REQUIRE(!run.root["segments"].get(segments));
    BOOST_TEST(segments.size() == 1u); // one attempt
    // The length of each file the WAL backs, as the end left it: what a
    // reader holds them to (store::apply_liveness).
    simdjson::dom::object lengths;
    BOOST_REQUIRE(!run.root["lengths"].get(lengths));
    std::vector<std::string> named;
    for (auto [name, n] : lengths) {
      std::uint64_t bytes = 0;
      BOOST_REQUIRE(!n.get(bytes));
      named.emplace_back(name);
      BOOST_TEST(bytes == std::filesystem::file_size(dir + "/" + std::string(name)), name);
    }
    const std::vector<std::string> expected = {"history.jsonl", "rejected.jsonl", "summary.json", "config.json"};
    BOOST_TEST(named == expected, boost::test_tools::per_element());
    BOOST_TEST(run.size() == 13u); // id project mode host + 9 of the run's own
  }
}

BOOST_AUTO_TEST_CASE(run_writer_starts_files_afresh_and_survives_bad_input) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  for (int pass = 0; pass < 2; ++pass) {
    RunWriter w(dir, name_of);
    w.run_start(R"({"id":"r"})", t0, 1);
    Row r;
    r.step = 1;
    r.values = {RowValue{0, -1, 1.0, 0}};
    w.row(r);
    w.config(0, "not json");
    w.config(0, "[1,2]");
    w.summary(0, R"({"ok":true})");
    w.flush();
    BOOST_TEST(w.error().code() == Errc::invalid_argument);
    BOOST_TEST(w.error().message().find("config") != std::string::npos);
  }
  // A second writer (a replay) rewrites history instead of appending to it.
  BOOST_TEST(lines_of(dir + "/history.jsonl").size() == 1u);
  BOOST_TEST(slurp(dir + "/config.json") == "{}\n");
  Doc sm(slurp(dir + "/summary.json"));
  BOOST_TEST(sm.num("loss") == 1.0);
  BOOST_TEST(!sm.root["ok"].get_bool().error());
  for (const auto& n : names_in(dir)) BOOST_TEST(n.front() != '.', "temp file left: " << n);
}

BOOST_AUTO_TEST_CASE(line_files_are_made_by_their_first_line_and_an_earlier_writers_emptied) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  const std::vector<std::string> made_later = {"events.jsonl", "histograms.jsonl", "media.jsonl", "rejected.jsonl"};
  const auto inode_of = [&](const char* name) {
    struct stat st {};
    BOOST_TEST_REQUIRE(::stat((dir + "/" + name).c_str(), &st) == 0, name);
    return st.st_ino;
  };
  ino_t config_at_start = 0;
  {
    RunWriter w(dir, name_of);
    w.run_start(R"({"id":"r"})", t0, 1);
    config_at_start = inode_of("config.json");
    Row r;
    r.step = 1;
    r.values = {RowValue{0, -1, 1.0, 0}};
    w.row(r);
    w.run_end(RunState::finished, t0 + 1);
    BOOST_TEST(!w.error(), w.error().message());
  }
  // A run with no such line has no such file, and no artifacts/ either.
  for (const auto& n : names_in(dir))
    BOOST_TEST(!std::count(made_later.begin(), made_later.end(), n), n << " was made empty");
  BOOST_TEST(lines_of(dir + "/history.jsonl").size() == 1u);
  // config.json, unchanged since the start wrote it, was synced in place (no new file).
  BOOST_TEST(inode_of("config.json") == config_at_start);
  BOOST_TEST(slurp(dir + "/config.json") == "{}\n");

  // An earlier writer's (a resume, recover) are emptied at once: the log writes every line again.
  for (const auto& n : made_later) BOOST_REQUIRE(!write_file_atomic(dir + "/" + n, "{\"stale\":1}\n"));
  {
    RunWriter w(dir, name_of);
    for (const auto& n : made_later) BOOST_TEST(slurp(dir + "/" + n).empty(), n << " kept an earlier line");
    w.run_start(R"({"id":"r"})", t0, 1);
    config_at_start = inode_of("config.json");
    w.config(0, R"({"lr":0.5})");
    w.refused(0, 3, 2, Error{Errc::invalid_key, "metric key \"\" is empty: name it"}, R"({"":1.5})", 1);
    w.run_end(RunState::finished, t0 + 2);
    BOOST_TEST(!w.error(), w.error().message());
  }
  BOOST_TEST(lines_of(dir + "/rejected.jsonl").size() == 1u); // made again by its first line
  BOOST_TEST(lines_of(dir + "/events.jsonl").empty());
  // Changed since the start: written anew (its file made while the start's still stood).
  BOOST_TEST(inode_of("config.json") != config_at_start);
  Doc cfg(slurp(dir + "/config.json"));
  BOOST_TEST(cfg.num("lr") == 0.5);
}

BOOST_AUTO_TEST_CASE(run_writer_reports_an_unwritable_dir) {
  TempDir tmp;
  BOOST_REQUIRE(!write_file_atomic(tmp / "file", "x"));
  RunWriter w(tmp / "file/run", name_of);
  w.run_start("{}", t0, 1);
  Row r;
  r.values = {RowValue{0, -1, 1.0, 0}};
  w.row(r);
  w.flush();
  w.run_end(RunState::failed, t0);
  BOOST_TEST(w.error().code() == Errc::io_error);
  BOOST_TEST(w.error().message().find(tmp / "file") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(run_json_records_the_runs_error_and_the_reserve_goes_at_the_end) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  RunWriter w(dir, name_of);
  w.run_start("{}", t0, 1);
  BOOST_TEST(std::filesystem::exists(dir + "/.reserve")); // room held for the last words
  w.note_error(Error(Errc::io_error, "the run's write-ahead log could not be written (test)"));
  w.run_end(RunState::failed, t0 + 1);
  Doc run(slurp(dir + "/run.json"));
  BOOST_TEST(run.str("state") == "failed");
  BOOST_TEST(run.str("error").find("could not be written (test)") != std::string::npos);
  BOOST_TEST(!std::filesystem::exists(dir + "/.reserve"));
}

BOOST_AUTO_TEST_CASE(on_a_disk_with_room_the_reserve_outlives_the_end_and_goes_with_the_writer) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  {
    RunWriter w(dir, name_of);
    w.run_start("{}", t0, 1);
    w.run_end(RunState::finished, t0 + 1);
    BOOST_TEST(w.error().code() == Errc::ok, w.error().message());
    BOOST_TEST(Doc(slurp(dir + "/run.json")).str("state") == "finished");
    // Freed after the end's writes, not before them: the end is answered without waiting for it.
    BOOST_TEST(std::filesystem::exists(dir + "/.reserve"));
  }
  BOOST_TEST(!std::filesystem::exists(dir + "/.reserve"));
}

namespace {
/// The run.json temporary files left in `dir`.
std::size_t temporaries_in(const std::string& dir) {
  std::size_t n = 0;
  for (const std::string& name : names_in(dir)) n += name.find(".run.json.tmp.") != std::string::npos ? 1 : 0;
  return n;
}
} // namespace

BOOST_AUTO_TEST_CASE(the_ends_run_json_staged_beside_the_wal_sync_lands_only_where_it_still_says_the_end) {
  TempDir tmp;
  // Staged while the WAL's sync runs, renamed into place by run_end: until
  // then run.json says running, and the staged file is a hidden temporary.
  const std::string dir = tmp / "run";
  RunWriter w(dir, name_of);
  w.run_start("{}", t0, 1);
  Row r;
  r.step = 0;
  r.ts_us = t0 + 10;
  r.values = {RowValue{0, -1, 0.5, 0}};
  w.row(r);
  w.end_backed_by_wal(true);
  w.end_files();
  w.stage_run_end(RunState::finished, t0 + 20);
  BOOST_TEST(Doc(slurp(dir + "/run.json")).str("state") == "running");
  BOOST_TEST(temporaries_in(dir) == 1u);
  w.run_end(RunState::finished, t0 + 20);
  BOOST_TEST(w.error().code() == Errc::ok, w.error().message());
  const std::string staged_end = slurp(dir + "/run.json");
  BOOST_TEST(Doc(staged_end).str("state") == "finished");
  BOOST_TEST(temporaries_in(dir) == 0u);

  // The same end written without staging: the very same file.
  const std::string plain_dir = tmp / "plain";
  {
    RunWriter p(plain_dir, name_of);
    p.run_start("{}", t0, 1);
    p.row(r);
    p.end_backed_by_wal(true);
    p.run_end(RunState::finished, t0 + 20);
  }
  std::string plain_end = slurp(plain_dir + "/run.json");
  BOOST_TEST(plain_end.size() == staged_end.size());
  // Only the directory differs where run.json names it: none is named here ("{}" identity).
  BOOST_TEST(plain_end == staged_end);

  // Staged, then the end changes (a signal stopped the run meanwhile): the
  // staged text is dropped, and run.json says the end as it is.
  const std::string changed = tmp / "changed";
  RunWriter c(changed, name_of);
  c.run_start("{}", t0, 1);
  c.end_backed_by_wal(true);
  c.end_files();
  c.stage_run_end(RunState::finished, t0 + 20);
  c.run_end(RunState::killed, t0 + 30);
  BOOST_TEST(Doc(slurp(changed + "/run.json")).str("state") == "killed");
  BOOST_TEST(temporaries_in(changed) == 0u);
}

BOOST_AUTO_TEST_CASE(on_a_nearly_full_disk_the_reserve_is_freed_before_the_end_is_written) {
  if (::geteuid() != 0) {
    BOOST_TEST_MESSAGE("skipped: mounting a small file system needs root");
    return;
  }
  TempDir tmp;
  const std::string at = tmp / "mnt";
  std::filesystem::create_directory(at);
  if (::mount("tmpfs", at.c_str(), "tmpfs", 0, "size=2m") != 0) {
    BOOST_TEST_MESSAGE("skipped: no tmpfs could be mounted here");
    return;
  }
  struct Unmount {
    std::string at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{at};
  const std::string dir = at + "/run";
  RunWriter w(dir, name_of);
  w.run_start("{}", t0, 1);
  BOOST_REQUIRE(std::filesystem::exists(dir + "/.reserve"));
  w.run_end(RunState::finished, t0 + 1);
  BOOST_TEST(w.error().code() == Errc::ok, w.error().message());
  BOOST_TEST(!std::filesystem::exists(dir + "/.reserve")); // 2 MiB is not room to spare
  BOOST_TEST(Doc(slurp(dir + "/run.json")).str("state") == "finished");
}

BOOST_AUTO_TEST_CASE(many_rows_reach_the_file_in_order) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  {
    RunWriter w(dir, name_of);
    w.run_start("{}", t0, 4);
    Row r;
    for (std::int64_t step = 0; step < 20000; ++step) {
      r.step = step;
      r.ts_us = t0 + step;
      r.runtime_us = step;
      r.values.clear();
      for (std::int32_t rank = 0; rank < 4; ++rank) r.values.push_back(RowValue{1, rank, double(step) / 3, 0});
      r.values.push_back(RowValue{0, -1, double(step), 4});
      w.row(r);
    }
    w.run_end(RunState::finished, t0 + 20000);
    BOOST_TEST(!w.error(), w.error().message());
  }
  const auto hist = lines_of(dir + "/history.jsonl");
  BOOST_REQUIRE(hist.size() == 20000u);
  simdjson::dom::parser p;
  for (std::size_t i = 0; i < hist.size(); i += 997) {
    simdjson::dom::element e;
    BOOST_REQUIRE(!p.parse(hist[i]).get(e));
    std::int64_t step = -1;
    BOOST_REQUIRE(!e["_step"].get(step));
    BOOST_TEST(step == static_cast<std::int64_t>(i));
    double v = 0;
    BOOST_REQUIRE(!e["acc/rank-3"].get(v));
    BOOST_TEST(v == double(i) / 3);
  }
}

BOOST_AUTO_TEST_CASE(history_blocks_summarize_each_block_of_rows_as_far_as_the_history_holds_them) {
  // 1,000 rows at every other step: "loss" on every row (NaN, +Inf and -Inf
  // on some), "acc" per rank on every third row, "we\"ird" once in a block.
  TempDir tmp;
  const std::string dir = tmp / "run";
  constexpr std::int64_t rows = 1000;
  const auto loss = [](std::int64_t i) {
    if (i % 97 == 5) return std::numeric_limits<double>::quiet_NaN();
    if (i % 211 == 7) return i % 2 ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    return std::sin(double(i) / 7) * 100 + double(i % 13);
  };
  std::map<std::string, std::vector<std::pair<std::int64_t, double>>> fed; // per column: (step, value) by row
  std::vector<std::int64_t> row_step;
  {
    RunWriter w(dir, name_of);
    w.run_start("{}", t0, 2);
    Row r;
    for (std::int64_t i = 0; i < rows; ++i) {
      r.step = 2 * i;
      r.ts_us = t0 + i;
      r.runtime_us = i;
      r.values.clear();
      if (i % 3 == 0)
        for (std::int32_t rank = 0; rank < 2; ++rank) r.values.push_back(RowValue{1, rank, double(i % 17) - rank, 0});
      r.values.push_back(RowValue{0, -1, loss(i), 2});
      if (i % 256 == 100) r.values.push_back(RowValue{3, -1, -double(i), 0});
      for (const RowValue& v : r.values)
        fed[key_names[v.key] + (v.rank >= 0 ? "/rank-" + std::to_string(v.rank) : "")].emplace_back(r.step, v.value);
      row_step.push_back(r.step);
      w.row(r);
    }
    w.run_end(RunState::finished, t0 + rows);
    BOOST_TEST(!w.error(), w.error().message());
  }
  // Where each row's line starts in history.jsonl.
  const auto hist = lines_of(dir + "/history.jsonl");
  BOOST_REQUIRE(hist.size() == std::size_t(rows));
  std::vector<std::uint64_t> at{0};
  for (const std::string& l : hist) at.push_back(at.back() + l.size() + 1);
  Result<HistoryBlocks> read = read_history_blocks(dir, at.back());
  BOOST_TEST_REQUIRE(bool(read), read.error().message());
  const HistoryBlocks& b = *read;
  BOOST_REQUIRE(b.blocks.size() == std::size_t(rows / HistoryBlockWriter::rows_per_block)); // the last 232 rows: no block
  for (std::size_t i = 0; i < b.blocks.size(); ++i) {
    const std::uint64_t first = i * HistoryBlockWriter::rows_per_block, end = first + HistoryBlockWriter::rows_per_block;
    BOOST_TEST(b.blocks[i].first_row == first);
    BOOST_TEST(b.blocks[i].rows == HistoryBlockWriter::rows_per_block);
    BOOST_TEST(b.blocks[i].start == at[first]);
    BOOST_TEST(b.blocks[i].end == at[end]);
    BOOST_TEST(b.blocks[i].first_step == row_step[first]);
    BOOST_TEST(b.blocks[i].last_step == row_step[end - 1]);
  }
  // Each column's stats per block, against the values fed.
  BOOST_TEST(b.stats.size() == fed.size());
  for (const auto& [name, values] : fed) {
    BOOST_REQUIRE(b.stats.contains(name));
    // Worked out here from the values themselves: per block, the finite
    // values' count, extremes (the first step of each), first and last, and
    // each kind of non-finite value's count and first and last step.
    std::vector<std::vector<std::pair<std::int64_t, double>>> in(b.blocks.size());
    for (const auto& [step, v] : values)
      if (const std::size_t block = std::size_t(step / 2) / HistoryBlockWriter::rows_per_block; block < in.size())
        in[block].emplace_back(step, v);
    std::vector<BlockStat> want(b.blocks.size());
    std::vector<bool> any(b.blocks.size(), false);
    for (std::size_t block = 0; block < in.size(); ++block) {
      BlockStat& w = want[block];
      any[block] = !in[block].empty();
      std::vector<std::pair<std::int64_t, double>> finite;
      for (const auto& [step, v] : in[block]) {
        if (std::isfinite(v)) {
          finite.emplace_back(step, v);
          continue;
        }
        BlockStat::Nonfinite& k = w.nonfinite[std::isnan(v) ? 0 : v > 0 ? 1 : 2];
        if (k.n++ == 0) k.first_step = step;
        k.last_step = step;
      }
      w.n = finite.size();
      if (finite.empty()) continue;
      const auto lo = std::min_element(finite.begin(), finite.end(), [](auto& a, auto& c) { return a.second < c.second; });
      const auto hi = std::max_element(finite.begin(), finite.end(), [](auto& a, auto& c) { return a.second < c.second; });
      w.min = lo->second, w.min_step = lo->first, w.max = hi->second, w.max_step = hi->first;
      w.first = finite.front().second, w.first_step = finite.front().first;
      w.last = finite.back().second, w.last_step = finite.back().first;
    }
    std::size_t k = 0;
    for (std::size_t block = 0; block < want.size(); ++block) {
      if (!any[block]) continue;
      BOOST_REQUIRE(k < b.stats.at(name).size());
      BOOST_TEST(b.stats.at(name)[k].block == block);
      const BlockStat& got = b.stats.at(name)[k++].stat;
      const BlockStat& w = want[block];
      BOOST_TEST(got.n == w.n, name << " block " << block);
      if (w.n > 0) {
        BOOST_TEST(got.min == w.min);
        BOOST_TEST(got.min_step == w.min_step);
        BOOST_TEST(got.max == w.max);
        BOOST_TEST(got.max_step == w.max_step);
        BOOST_TEST(got.first == w.first);
        BOOST_TEST(got.first_step == w.first_step);
        BOOST_TEST(got.last == w.last);
        BOOST_TEST(got.last_step == w.last_step);
      }
      for (std::size_t nf = 0; nf < 3; ++nf) {
        BOOST_TEST(got.nonfinite[nf].n == w.nonfinite[nf].n, name << " block " << block << " kind " << nf);
        BOOST_TEST(got.nonfinite[nf].first_step == w.nonfinite[nf].first_step);
        BOOST_TEST(got.nonfinite[nf].last_step == w.nonfinite[nf].last_step);
      }
    }
    BOOST_TEST(k == b.stats.at(name).size());
  }
  // The NaN and infinities were among them.
  BOOST_TEST(b.stats.at("loss")[0].stat.nonfinite[0].n == 3u);
  // A reader that sees less of the history takes the blocks it holds whole.
  BOOST_TEST(read_history_blocks(dir, at[512] + 7)->blocks.size() == 2u);
  BOOST_TEST(read_history_blocks(dir, at[512] - 1)->blocks.size() == 1u);
  // A history cut by a crash: the blocks past its end are not taken.
  std::filesystem::resize_file(dir + "/history.jsonl", at[600]);
  BOOST_TEST(read_history_blocks(dir, at[1000])->blocks.size() == 2u);
  // A history that is not the summary's (its first row of another step): none taken.
  {
    std::string text = slurp(dir + "/history.jsonl");
    BOOST_REQUIRE(text.starts_with("{\"_step\":0,"));
    text[9] = '9';
    std::ofstream(dir + "/history.jsonl", std::ios::trunc) << text;
    BOOST_TEST(read_history_blocks(dir, at[600])->blocks.empty());
    text[9] = '0';
    std::ofstream(dir + "/history.jsonl", std::ios::trunc) << text;
    BOOST_TEST(read_history_blocks(dir, at[600])->blocks.size() == 2u);
  }
  // A damaged line ends the blocks read; lines that do not follow are not taken.
  std::filesystem::resize_file(dir + "/history.jsonl", at[1000] - 1); // history.jsonl's last newline gone
  {
    const auto blocks = lines_of(dir + "/" + history_blocks_file);
    BOOST_REQUIRE(blocks.size() == 3u);
    std::ofstream out(dir + "/" + history_blocks_file, std::ios::trunc);
    out << blocks[0] << "\n" << blocks[2] << "\n"; // the second left out: the third does not follow
  }
  BOOST_TEST(read_history_blocks(dir, at[1000])->blocks.size() == 1u);
  {
    std::ofstream out(dir + "/" + history_blocks_file, std::ios::trunc);
    out << hist[0] << "\n";
  }
  BOOST_TEST(read_history_blocks(dir, at[1000])->blocks.empty());
  std::filesystem::remove(dir + "/" + history_blocks_file);
  BOOST_TEST(read_history_blocks(dir, at[1000])->blocks.empty()); // none: nothing, and no error
}

BOOST_AUTO_TEST_CASE(a_rows_columns_may_differ_from_the_last_rows) {
  // Columns come and go, change places and ranks from one row to the next:
  // each row holds its own values under its own names, counts included.
  TempDir tmp;
  const std::string dir = tmp / "run";
  const std::vector<std::vector<RowValue>> rows = {
      {{0, -1, 1.5, 2}, {1, 0, 2.5, 0}, {1, 1, 3.5, 0}},
      {{0, -1, 4.5, 2}, {1, 0, 5.5, 0}, {1, 1, 6.5, 0}},
      {{0, -1, 7.5, 1}, {1, 1, 8.5, 0}},                 // rank 0's column left out
      {{1, 0, 9.5, 0}, {2, -1, 10.5, 3}, {3, 1, 11.5, 0}}, // other columns in the same places
      {{0, -1, 12.5, 2}, {1, 0, 13.5, 0}, {1, 1, 14.5, 0}},
      {},
      {{3, 1, 15.5, 0}, {3, 0, 16.5, 0}},
  };
  {
    RunWriter w(dir, name_of);
    w.run_start("{}", t0, 2);
    Row r;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      r.step = static_cast<std::int64_t>(i);
      r.ts_us = t0 + r.step;
      r.values = rows[i];
      if (r.values.empty()) continue; // a row of nothing is never committed
      w.row(r);
    }
    BOOST_TEST(!w.error(), w.error().message());
  }
  const auto hist = lines_of(dir + "/history.jsonl");
  BOOST_REQUIRE(hist.size() == rows.size() - 1);
  simdjson::dom::parser p;
  std::size_t line = 0;
  for (const auto& want : rows) {
    if (want.empty()) continue;
    simdjson::dom::object o;
    BOOST_REQUIRE(!p.parse(hist[line++]).get(o));
    std::map<std::string, double> got, counts;
    for (auto [k, v] : o) {
      if (k == "_count") {
        for (auto [ck, cv] : simdjson::dom::object(v)) counts[std::string(ck)] = double(std::int64_t(cv));
      } else if (!k.starts_with("_")) {
        got[std::string(k)] = double(v);
      }
    }
    std::map<std::string, double> expect, expect_counts;
    for (const RowValue& v : want) {
      const std::string name = std::string(key_names[v.key]) + (v.rank >= 0 ? "/rank-" + std::to_string(v.rank) : "");
      expect[name] = v.value;
      if (v.count != 0) expect_counts[name] = v.count;
    }
    BOOST_TEST((got == expect), hist[line - 1]);
    BOOST_TEST((counts == expect_counts), hist[line - 1]);
  }
}

namespace {

constexpr std::int64_t t1 = t0 + 100'000'000; // the requeued job's start

void loss_row(RunWriter& w, std::int64_t step, std::int64_t ts_us, double loss) {
  Row r;
  r.step = step;
  r.ts_us = ts_us;
  r.values = {RowValue{0, -1, loss, 0}};
  w.row(r);
}

/// The first attempt of a resumed run as its WAL holds it: two ranks, one
/// row, and the closing frames a resumed host adds for a host that died.
void first_attempt(RunWriter& w) {
  w.run_start(R"({"id":"r"})", t0, 2);
  w.rank_state(0, RunState::running, -1, "h0", "");
  w.rank_state(1, RunState::running, -1, "h1", "");
  loss_row(w, 0, t0 + 1'000'000, 1.0);
  for (int rank : {0, 1}) w.rank_state(rank, RunState::crashed, 0, "h" + std::to_string(rank), "the run host died");
  w.run_end(RunState::crashed, t0 + 3'000'000);
}

/// The second attempt: one rank rejoins from another host, a row.
void second_attempt(RunWriter& w) {
  w.run_start(R"({"id":"r"})", t1, 2);
  w.rank_state(1, RunState::running, -1, "h2", "");
  loss_row(w, 1, t1 + 1'000'000, 2.0);
}

void end_second_attempt(RunWriter& w) {
  w.rank_state(1, RunState::finished, 1, "h2", "");
  w.run_end(RunState::finished, t1 + 5'000'000);
}

/// What `chorus launch` does once the ranks of an attempt exited.
void launch_records_exit_codes(const std::string& dir, std::string_view codes) {
  std::string text = slurp(dir + "/run.json");
  text.insert(text.find_last_of('}'), ",\"exit_codes\":" + std::string(codes));
  BOOST_REQUIRE(!write_file_atomic(dir + "/run.json", text));
}

std::string minified(Doc& d, std::string_view key) {
  simdjson::dom::element e;
  BOOST_TEST_REQUIRE(!d.root[key].get(e), "no " << key);
  return simdjson::minify(e);
}

} // namespace

// Options::resume as run.json sees it: the requeued job's host replays the
// first attempt into a fresh RunWriter, carrying over the exit codes launch
// added, then starts the second; a later rebuild of both (`chorus recover`)
// gives each attempt its times, state and exit codes again.
BOOST_AUTO_TEST_CASE(run_json_keeps_each_attempt_as_a_segment_with_its_exit_codes) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  {
    RunWriter w(dir, name_of);
    first_attempt(w);
  }
  launch_records_exit_codes(dir, R"({"0":137,"1":137})");
  {
    RunWriter w(dir, name_of); // the resumed host
    BOOST_TEST((w.carry_over(dir + "/run.json") == RunState::crashed));
    first_attempt(w);
    second_attempt(w);
    w.flush();
    Doc run(slurp(dir + "/run.json"));
    BOOST_TEST(run.str("state") == "running");
    BOOST_TEST(run.num("start_time") == 1700000000.25); // the run's first start
    BOOST_TEST(run.root["end_time"].is_null());
    BOOST_TEST(!run.has("exit_codes")); // the first attempt's codes are its segment's, not this one's
    BOOST_TEST(minified(run, "segments") ==
               R"([{"start_time":1700000000.25,"end_time":1700000003.25,"state":"crashed","exit_codes":{"0":137,"1":137}},)"
               R"({"start_time":1700000100.25,"end_time":null,"state":"running"}])");
    BOOST_TEST(minified(run, "ranks") == R"([{"rank":1,"state":"running","last_step":-1,"host":"h2","message":""}])");
    BOOST_TEST(run.integer("rows") == 2);
    end_second_attempt(w);
  }
  launch_records_exit_codes(dir, R"({"0":0,"1":0})");
  Doc live(slurp(dir + "/run.json"));
  BOOST_TEST(live.str("state") == "finished");
  BOOST_TEST(live.num("end_time") == 1700000105.25);
  {
    RunWriter w(dir, name_of); // chorus recover, from the log of both attempts
    BOOST_TEST((w.carry_over(dir + "/run.json") == RunState::finished));
    first_attempt(w);
    second_attempt(w);
    end_second_attempt(w);
  }
  Doc rebuilt(slurp(dir + "/run.json"));
  for (std::string_view key : {"state", "start_time", "end_time", "segments", "exit_codes", "rows", "ranks"})
    BOOST_TEST(minified(rebuilt, key) == minified(live, key), key);
  BOOST_TEST(minified(rebuilt, "exit_codes") == R"({"0":0,"1":0})"); // the last attempt's, where launch put them
}

// When each rank joined: its first join of the attempt, to the millisecond;
// a join heard again moves nothing, a rank that never joined has none, and
// a resumed attempt's ranks join afresh.
BOOST_AUTO_TEST_CASE(run_json_records_when_each_rank_joined_once_an_attempt) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  RunWriter w(dir, name_of);
  w.run_start(R"({"id":"r"})", t0, 3);
  w.rank_joined(0, t0 + 12'345);
  w.rank_state(0, RunState::running, -1, "h0", "");
  w.rank_joined(1, t0 + 431'600);
  w.rank_state(1, RunState::running, -1, "h1", "");
  w.rank_joined(1, t0 + 900'000); // again: the first stands
  w.rank_state(2, RunState::crashed, -1, "", "never connected to the run host within init_timeout (30000 ms)");
  w.flush();
  {
    Doc run(slurp(dir + "/run.json"));
    BOOST_TEST(minified(run, "ranks") ==
               R"([{"rank":0,"state":"running","last_step":-1,"host":"h0","message":"","joined":1700000000.262},)"
               R"({"rank":1,"state":"running","last_step":-1,"host":"h1","message":"","joined":1700000000.682},)"
               R"({"rank":2,"state":"crashed","last_step":-1,"host":"",)"
               R"j("message":"never connected to the run host within init_timeout (30000 ms)"}])j");
  }
  // A join heard again after run.json was written moves nothing either.
  w.rank_joined(0, t0 + 2'000'000);
  w.rank_state(0, RunState::finished, 4, "h0", "");
  w.flush();
  {
    Doc run(slurp(dir + "/run.json"));
    BOOST_TEST(minified(run, "ranks").find(R"("last_step":4,"host":"h0","message":"","joined":1700000000.262},)") !=
                   std::string::npos,
               minified(run, "ranks"));
  }
  w.run_end(RunState::crashed, t0 + 3'000'000);

  w.run_start(R"({"id":"r"})", t1, 3);
  w.rank_joined(2, t1 + 1'000);
  w.rank_state(2, RunState::running, -1, "h2", "");
  w.flush();
  Doc resumed(slurp(dir + "/run.json"));
  BOOST_TEST(minified(resumed, "ranks") ==
             R"([{"rank":2,"state":"running","last_step":-1,"host":"h2","message":"","joined":1700000100.251}])");
}

// The run's error can come before its start (its WAL could not take the
// run_start): run.json then says so, with no attempt yet.
BOOST_AUTO_TEST_CASE(run_json_written_before_the_runs_start_has_no_segment) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  RunWriter w(dir, name_of);
  w.note_error(Error(Errc::io_error, "the run's write-ahead log could not be written (test)"));
  w.flush();
  Doc run(slurp(dir + "/run.json"));
  BOOST_TEST(minified(run, "segments") == "[]");
  BOOST_TEST(!run.has("exit_codes"));
  BOOST_TEST(run.str("error").find("(test)") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(declared_summaries_metrics_json_and_refusals_made_on_the_rank) {
  TempDir tmp;
  const std::string dir = tmp / "proj/group/run-2";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  {
    RunWriter w(dir, name_of);
    w.run_start(R"({"id":"run-2","project":"proj"})", t0, 2);
    // loss: min over the run; acc: mean, per rank; lr: the default, its last.
    w.metric(0, Reduce::mean, Summary::min, chorus::core::HistorySink::no_step_key);
    w.metric(1, Reduce::none, Summary::mean, 2);
    const double losses[] = {3.0, 1.0, nan, 2.0};
    for (int s = 0; s < 4; ++s) {
      Row r;
      r.step = s;
      r.ts_us = t0 + s;
      r.values = {RowValue{0, -1, losses[s], 2}, RowValue{1, 0, 0.5 * s, 0}, RowValue{1, 1, 1.0, 0},
                  RowValue{2, -1, 0.1 * (s + 1), 0}};
      w.row(r);
    }
    w.refused(1, 9, core::wire::auto_step, Error{Errc::invalid_key, "metric key \"\" is empty: name it"}, R"({"":1.5})", 1);
    w.refused(0, 4, 7, Error{Errc::invalid_argument, "a value is no number"}, R"({"x": not json)", 3);
    w.rank_state(0, RunState::failed, 3, "h0", "ended its run with exit code 1: ValueError: boom");
    w.rank_state(1, RunState::killed, 3, "h1", "stopped by SIGTERM");
    w.run_end(RunState::failed, t0 + 10);
    BOOST_TEST(!w.error(), w.error().message());
    BOOST_TEST(w.rejected_values() == 4u);
  }
  Doc summary(slurp(dir + "/summary.json"));
  BOOST_TEST(summary.num("loss") == 1.0);                 // min, the NaN left out
  BOOST_TEST(summary.num("acc/rank-0") == (0 + 0.5 + 1 + 1.5) / 4); // mean
  BOOST_TEST(summary.num("acc/rank-1") == 1.0);
  BOOST_TEST(summary.num("lr") == 0.4); // last

  Doc metrics(slurp(dir + "/metrics.json"));
  BOOST_TEST(std::string(std::string_view(metrics.root["loss"]["summary"].get_string())) == "min");
  BOOST_TEST(std::string(std::string_view(metrics.root["loss"]["reduce"].get_string())) == "mean");
  BOOST_TEST(metrics.root["loss"]["step_metric"].is_null());
  BOOST_TEST(std::string(std::string_view(metrics.root["acc"]["step_metric"].get_string())) == "lr");
  const Result<MetricSpecs> read = MetricSpecs::read(dir);
  BOOST_REQUIRE_MESSAGE(read, read.error().message());
  BOOST_REQUIRE(read->find("acc"));
  BOOST_TEST(read->find("acc")->step_metric == "lr");
  BOOST_TEST((read->find("acc")->summary == Summary::mean));

  const auto rejected = lines_of(dir + "/rejected.jsonl");
  BOOST_REQUIRE_EQUAL(rejected.size(), 2u);
  Doc first(rejected[0]);
  BOOST_TEST(first.str("error") == "invalid_key");
  BOOST_TEST(first.root["step"].is_null());
  BOOST_TEST(first.root["values"][""].get_double().value() == 1.5);
  BOOST_TEST(first.integer("count") == 1);
  Doc second(rejected[1]);
  BOOST_TEST(second.str("values") == R"({"x": not json)"); // not an object: kept as its text
  BOOST_TEST(second.integer("count") == 3);

  // The run's error names its ranks and how each ended.
  Doc run(slurp(dir + "/run.json"));
  BOOST_TEST(run.str("state") == "failed");
  BOOST_TEST(run.integer("rejected") == 4);
  BOOST_TEST(run.str("error") ==
             "rank 0 failed (ended its run with exit code 1: ValueError: boom); rank 1 killed (stopped by SIGTERM)");
}

BOOST_AUTO_TEST_CASE(a_damaged_metrics_json_is_named_with_the_fix) {
  TempDir tmp;
  const std::string dir = tmp / "run";
  std::filesystem::create_directories(dir);
  BOOST_TEST(MetricSpecs::read(dir).value().specs.empty()); // none declared
  std::ofstream(dir + "/metrics.json") << R"({"loss":{"reduce":"median"}})";
  const Error bad = MetricSpecs::read(dir).error();
  BOOST_TEST(bad.message().find("\"median\"") != std::string::npos, bad.message());
  BOOST_TEST(bad.message().find("chorus recover") != std::string::npos, bad.message());
  std::ofstream(dir + "/metrics.json") << R"({"loss":{"reduce":"me)";
  BOOST_TEST(MetricSpecs::read(dir).error().message().find("cut short") != std::string::npos);
}
