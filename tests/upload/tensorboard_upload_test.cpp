// The TensorBoard target (CHORUS_UPLOAD=tensorboard:DIR, `chorus sync --to
// tensorboard:DIR`): real jobs under `chorus launch` write event files while
// they train, and every committed row and histogram lands in them exactly
// once, through a killed host, a `chorus recover` and `chorus sync`, and
// lost offsets. Images, text and tables (media.jsonl, written by hand as
// the run host writes it, tests/upload/tfevents_media_files.hpp) land once
// each too, through a restarted Uploader, lost offsets and a directory
// that cannot be written for a while. The files are read back by the
// tests' own reader (tests/upload/tfevents_reader.hpp).
#define BOOST_TEST_MODULE upload_tensorboard
#include "io/upload/upload.hpp"
#include "tests/e2e/harness.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tfevents_media_files.hpp"
#include "tests/upload/tfevents_reader.hpp"

#include <boost/test/unit_test.hpp>

#include <csignal>
#include <fstream>
#include <future>
#include <map>
#include <thread>
#include <tuple>

using namespace e2e;
namespace tb = chorus::test::tfevents;
using namespace std::chrono_literals;

namespace {

/// Every scalar and histogram under DIR/RUN-ID, by (subdirectory, tag,
/// step): its value (a histogram's count) and how many times it was written.
struct Scalars {
  struct Point {
    float value = 0;
    int times = 0;
  };
  struct Histo {
    double num = 0, bucketed = 0; // its count, and the sum of its buckets' counts
    int times = 0;
  };
  std::map<std::tuple<std::string, std::string, std::int64_t>, Point> points;
  std::map<std::tuple<std::string, std::string, std::int64_t>, Histo> histos;
  std::size_t files = 0;
  std::map<std::string, int> texts; // text tag -> events

  [[nodiscard]] int duplicates() const {
    int n = 0;
    for (const auto& [k, p] : points) n += p.times > 1 ? 1 : 0;
    return n;
  }
};

/// The events of an events file. A host killed mid-write leaves a torn last
/// record (the kernel ends a write at a fatal signal): the whole records
/// before it count, as TensorBoard and the target's own resume read them,
/// and the target writes on in a new file. A damaged record fails.
std::vector<tb::TbEvent> whole_events(const std::string& path) {
  const tb::Records r = tb::read_records(chorus::test::slurp(path));
  if (!r.problem.empty() && !r.problem.starts_with("truncated")) throw std::runtime_error(path + ": " + r.problem);
  std::vector<tb::TbEvent> out;
  for (const std::string& d : r.data) out.push_back(tb::decode_event(d));
  return out;
}

Scalars read_tensorboard(const fs::path& run_dir) {
  Scalars out;
  if (!fs::exists(run_dir)) return out;
  for (const auto& entry : fs::recursive_directory_iterator(run_dir)) {
    if (!entry.is_regular_file() || !entry.path().filename().string().starts_with("events.out.tfevents.")) continue;
    ++out.files;
    const std::string sub = entry.path().parent_path() == run_dir ? "" : entry.path().parent_path().filename().string();
    for (const tb::TbEvent& e : whole_events(entry.path().string()))
      for (const tb::TbValue& v : e.values) {
        if (v.plugin_name == "text") {
          ++out.texts[v.tag];
          continue;
        }
        if (v.histo) {
          Scalars::Histo& h = out.histos[{sub, v.tag, e.step}];
          h.num = v.histo->num;
          h.bucketed = 0;
          for (double n : v.histo->bucket) h.bucketed += n;
          ++h.times;
          continue;
        }
        if (!v.simple_value) continue;
        Scalars::Point& p = out.points[{sub, v.tag, e.step}];
        p.value = *v.simple_value;
        ++p.times;
      }
  }
  return out;
}

/// Each numeric key of each committed row is in the files once, with its
/// value: plain keys as tags of the run, per-rank columns in rank-N/.
void check_every_row_once(const fs::path& run_dir, const fs::path& tb_dir) {
  const std::vector<Row> rows = read_history(run_dir);
  BOOST_REQUIRE(!rows.empty());
  const Scalars got = read_tensorboard(tb_dir / run_dir.filename());
  BOOST_TEST(got.duplicates() == 0);
  std::size_t expected = 0;
  for (const Row& r : rows) {
    for (const auto& [key, value] : r.num) {
      if (key.starts_with("_")) continue;
      ++expected;
      std::string sub, tag = key;
      if (const std::size_t slash = key.rfind('/'); slash != std::string::npos && key.substr(slash + 1).starts_with("rank-"))
        sub = key.substr(slash + 1), tag = key.substr(0, slash);
      const auto it = got.points.find({sub, tag, r.step()});
      BOOST_TEST_REQUIRE((it != got.points.end()), key << " at step " << r.step() << " is missing");
      BOOST_TEST(it->second.value == static_cast<float>(value), key << " at step " << r.step());
    }
  }
  // Nothing beyond the history: the history's points, plus system samples.
  std::size_t history_points = 0;
  for (const auto& [k, p] : got.points)
    if (!std::get<1>(k).starts_with("system.")) ++history_points;
  BOOST_TEST(history_points == expected);
}

/// Each line of histograms.jsonl is in the files once, as a histogram of
/// its count (NaN left out): a merged key's as a tag of the run, a rank's
/// own column as its key in rank-N/. Nothing else is.
void check_every_histogram_once(const fs::path& run_dir, const fs::path& tb_dir) {
  const Scalars got = read_tensorboard(tb_dir / run_dir.filename());
  simdjson::dom::parser parser;
  std::ifstream in(run_dir / "histograms.jsonl");
  std::size_t lines = 0;
  for (std::string text; std::getline(in, text);) {
    const simdjson::dom::object line = parser.parse(text);
    ++lines;
    const std::string tag = std::string(std::string_view(line["key"]));
    const std::string sub = line["rank"].is_null() ? "" : "rank-" + std::to_string(std::int64_t(line["rank"]));
    const std::int64_t step = line["_step"];
    const auto it = got.histos.find({sub, tag, step});
    BOOST_TEST_REQUIRE((it != got.histos.end()), tag << " of '" << sub << "' at step " << step << " is missing");
    BOOST_TEST(it->second.times == 1, tag << " of '" << sub << "' at step " << step);
    const double count = double(std::uint64_t(line["count"]) - std::uint64_t(line["nan"]));
    BOOST_TEST(it->second.num == count, tag << " at step " << step);
    BOOST_TEST(it->second.bucketed == count, tag << " at step " << step);
  }
  BOOST_TEST(lines > 0u);
  BOOST_TEST(got.histos.size() == lines);
}

/// The run directory under `root` once it exists, and its host's pid once run.json names it.
std::pair<fs::path, long> started_run(const fs::path& root) {
  const auto until = std::chrono::steady_clock::now() + 60s * sanitizer_slowdown;
  while (std::chrono::steady_clock::now() < until) {
    std::error_code ec;
    for (const fs::path& d : fs::is_directory(root, ec) ? find_runs(root) : std::vector<fs::path>{}) {
      simdjson::dom::parser parser;
      try {
        const std::int64_t pid = read_run_json(parser, d)["pid"].get_int64();
        if (pid > 0) return {d, static_cast<long>(pid)};
      } catch (const std::exception&) {
        // run.json is being written
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  return {};
}

} // namespace

BOOST_AUTO_TEST_CASE(a_live_job_writes_every_row_once_per_rank_and_node) {
  chorus::test::TempDir dir;
  const fs::path tb_dir = dir.path / "tb";
  const Output o = run("CHORUS_SYSTEM_INTERVAL=0.2 CHORUS_UPLOAD=tensorboard:" + tb_dir.string() + " " +
                       launch_worker(dir.path / "runs", 2, test_port(71), "--steps 200 --step-us 2000 --histograms 1"));
  BOOST_TEST_INFO_SCOPE(o.text);
  BOOST_REQUIRE_EQUAL(o.status, 0);
  const std::vector<fs::path> runs = find_runs(dir.path / "runs");
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  check_every_row_once(runs.front(), tb_dir);
  check_every_histogram_once(runs.front(), tb_dir);
  Scalars got = read_tensorboard(tb_dir / runs.front().filename());
  BOOST_TEST(got.texts["config"] == 1);
  BOOST_TEST(got.texts["summary"] == 1);
  // Each rank's per-rank column, and the system metrics of its node.
  for (const char* sub : {"rank-0", "rank-1", "node-0"}) BOOST_TEST(fs::is_directory(tb_dir / runs.front().filename() / sub), sub);
  bool node_samples = false;
  for (const auto& [k, p] : got.points) node_samples |= std::get<0>(k) == "node-0" && std::get<1>(k).starts_with("system.cpu");
  BOOST_TEST(node_samples);
  // The offsets say done; a second sync finds nothing to send and writes nothing.
  const Output again = run(bin("chorus") + " sync " + runs.front().string() + " --to tensorboard:" + tb_dir.string());
  BOOST_TEST_INFO_SCOPE(again.text);
  BOOST_TEST(again.status == 0);
  BOOST_TEST(read_tensorboard(tb_dir / runs.front().filename()).points.size() == got.points.size());
  BOOST_TEST(read_tensorboard(tb_dir / runs.front().filename()).histos.size() == got.histos.size());
}

BOOST_AUTO_TEST_CASE(a_killed_host_then_recover_and_sync_every_row_once) {
  chorus::test::TempDir dir;
  const fs::path tb_dir = dir.path / "tb";
  auto job = std::async(std::launch::async, [&] {
    return run("CHORUS_SYSTEM_INTERVAL=0 CHORUS_UPLOAD=tensorboard:" + tb_dir.string() + " " +
               launch_worker(dir.path / "runs", 2, test_port(72), "--steps 20000 --step-us 1000 --histograms 1",
                             "--fail-fast")); // rank 1 stopped when its host is killed, not left to log its 20 s
  });
  const auto [run_dir, pid] = started_run(dir.path / "runs");
  BOOST_REQUIRE(pid > 0);
  // Some rows and histograms are in the event files; the run goes on.
  const auto until = std::chrono::steady_clock::now() + 60s * sanitizer_slowdown;
  const auto written = [&] {
    const Scalars got = read_tensorboard(tb_dir / run_dir.filename());
    return got.points.size() >= 200 && got.histos.size() >= 30;
  };
  while (!written() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(50ms);
  // The job is long (20 s at the least) so that the host is still running
  // here even where the upload trails it far (a loaded machine, a sanitizer).
  BOOST_REQUIRE_MESSAGE(job.wait_for(0s) != std::future_status::ready,
                        "the job ended before the upload had written 200 rows and 30 histograms: nothing was killed");
  BOOST_REQUIRE_EQUAL(::kill(static_cast<pid_t>(pid), SIGKILL), 0);
  const Output o = job.get();
  BOOST_TEST_INFO_SCOPE(o.text);
  BOOST_TEST(o.status != 0);

  const Output rec = run(bin("chorus") + " recover " + run_dir.string());
  BOOST_TEST_INFO_SCOPE(rec.text);
  BOOST_REQUIRE_EQUAL(rec.status, 0);
  const Output sync = run(bin("chorus") + " sync " + run_dir.string() + " --to tensorboard:" + tb_dir.string());
  BOOST_TEST_INFO_SCOPE(sync.text);
  BOOST_REQUIRE_EQUAL(sync.status, 0);
  check_every_row_once(run_dir, tb_dir);
  check_every_histogram_once(run_dir, tb_dir);
}

BOOST_AUTO_TEST_CASE(lost_offsets_write_nothing_twice) {
  // The offsets file is gone (as if the uploader was killed after writing
  // events and before saving how far it got): a sync reads the history from
  // its start again, and the event files say what is written already.
  chorus::test::TempDir dir;
  const fs::path tb_dir = dir.path / "tb";
  const Output o =
      run("CHORUS_SYSTEM_INTERVAL=0 " + launch_worker(dir.path / "runs", 2, test_port(73), "--steps 300 --histograms 1"));
  BOOST_REQUIRE_EQUAL(o.status, 0);
  const fs::path run_dir = find_runs(dir.path / "runs").front();
  const std::string sync = bin("chorus") + " sync " + run_dir.string() + " --to tensorboard:" + tb_dir.string();
  BOOST_REQUIRE_EQUAL(run(sync).status, 0);
  const std::size_t first = read_tensorboard(tb_dir / run_dir.filename()).points.size();
  BOOST_TEST(first > 0u);
  check_every_histogram_once(run_dir, tb_dir);
  for (const auto& e : fs::directory_iterator(run_dir / "upload"))
    if (e.path().filename().string().starts_with("tensorboard-")) fs::remove(e.path());
  const Output again = run(sync);
  BOOST_TEST_INFO_SCOPE(again.text);
  BOOST_REQUIRE_EQUAL(again.status, 0);
  check_every_row_once(run_dir, tb_dir);
  check_every_histogram_once(run_dir, tb_dir);
  BOOST_TEST(read_tensorboard(tb_dir / run_dir.filename()).points.size() == first);
}

BOOST_AUTO_TEST_CASE(a_directory_that_cannot_be_written_loses_nothing_and_sync_delivers_later) {
  chorus::test::TempDir dir;
  const fs::path blocker = dir.path / "file";
  { std::ofstream(blocker) << "x"; }
  // The finish drains the upload for CHORUS_UPLOAD_TIMEOUT (30 s unless set)
  // and then names what it left: 2 s is enough to see the directory refused.
  const Output o = run("CHORUS_SYSTEM_INTERVAL=0 CHORUS_UPLOAD_TIMEOUT=2 CHORUS_UPLOAD=tensorboard:" +
                       (blocker / "tb").string() + " " +
                       launch_worker(dir.path / "runs", 2, test_port(74), "--steps 100"));
  BOOST_TEST_INFO_SCOPE(o.text);
  BOOST_TEST(o.text.find(blocker.string()) != std::string::npos); // the finish names where it could not write
  const fs::path run_dir = find_runs(dir.path / "runs").front();
  BOOST_TEST(read_history(run_dir).size() == 100u); // the run itself is whole
  const fs::path tb_dir = dir.path / "tb";
  const Output sync = run(bin("chorus") + " sync " + run_dir.string() + " --to tensorboard:" + tb_dir.string());
  BOOST_TEST_INFO_SCOPE(sync.text);
  BOOST_REQUIRE_EQUAL(sync.status, 0);
  check_every_row_once(run_dir, tb_dir);
}

// ---------------------------------------------------------------------------
// Images, text and tables, through an Uploader of this process.

namespace {

namespace mf = chorus::test::media_files;
using chorus::core::MediaKind;

/// (subdirectory, tag, step) -> the bytes each media of the run should be in the event files.
using MediaBytes = std::map<tb::TagStep, std::string>;

/// At `step`: rank 0's PNG and rank 1's JPEG of "samples", rank 1's text "notes".
void add_step_media(chorus::test::RunFixture& fixture, std::int64_t step, MediaBytes& want) {
  const fs::path dir = fixture.dir();
  const std::string png = mf::png_file(3, 2 + static_cast<std::uint32_t>(step), 6), jpeg = mf::jpeg_file(3);
  const std::string md = "step **" + std::to_string(step) + "**";
  mf::add_media(dir, step, "samples", 0, MediaKind::image, "png", png, "", 3, 2 + static_cast<std::uint32_t>(step));
  mf::add_media(dir, step, "samples", 1, MediaKind::image, "jpeg", jpeg, "", 8, 8);
  mf::add_media(dir, step, "notes", 1, MediaKind::text, "md", md);
  want[{"rank-0", "samples", step}] = png;
  want[{"rank-1", "samples", step}] = jpeg;
  want[{"rank-1", "notes", step}] = md;
}

/// Each media of `want` is in the event files under `tb_run` once, byte for
/// byte (an image's file, a text's string, a table's cells joined by '|'),
/// and nothing else is.
void check_media_once(const fs::path& tb_run, const MediaBytes& want) {
  auto got = tb::values_under(tb_run);
  std::size_t media = 0;
  for (const auto& [at, values] : got)
    for (const auto& [e, v] : values)
      media += v.image || (v.plugin_name == "text" && std::get<1>(at) != "summary") ? 1 : 0;
  BOOST_TEST(media == want.size());
  for (const auto& [at, bytes] : want) {
    BOOST_TEST_CONTEXT(std::get<0>(at) << " " << std::get<1>(at) << " at " << std::get<2>(at)) {
      BOOST_TEST_REQUIRE(got[at].size() == 1u);
      const tb::TbValue& v = got[at].front().second;
      std::string held;
      if (v.image) held = v.image->encoded;
      for (const std::string& cell : v.string_val) held += (held.empty() ? "" : "|") + cell;
      BOOST_TEST((held == bytes));
    }
  }
}

/// Pumps until nothing is left now; what the last pump said.
chorus::upload::Uploader::Progress pump_all(chorus::upload::Uploader& up) {
  chorus::upload::Uploader::Progress p;
  for (int i = 0; i < 100 && !p.caught_up && !p.stopped; ++i) {
    p = up.pump(std::chrono::steady_clock::now() + 10s);
    if (p.wait_until) std::this_thread::sleep_until(*p.wait_until);
  }
  return p;
}

chorus::upload::UploadTarget tensorboard_target(const fs::path& dir) {
  const auto t = chorus::upload::UploadTarget::parse("tensorboard:" + dir.string());
  BOOST_TEST_REQUIRE(t.has_value(), t.error().message());
  return *t;
}

const chorus::upload::UploadSettings quick{.backoff_base = 10ms, .backoff_max = 50ms};

/// A run of two ranks that trains, where its TensorBoard target writes it,
/// and what its media should be there.
struct TwoRankRun {
  TwoRankRun() {
    fixture.world_size = 2;
    fixture.write_run_json("running");
  }
  chorus::test::RunFixture fixture{"media"};
  fs::path tb_dir = fs::path(fixture.root()) / "tb", tb_run = tb_dir / "media";
  MediaBytes want;
};

} // namespace

BOOST_FIXTURE_TEST_CASE(media_go_once_each_as_they_come_through_a_restart_and_lost_offsets, TwoRankRun) {
  fixture.history(0, 3);
  for (std::int64_t step = 0; step < 3; ++step) add_step_media(fixture, step, want);
  mf::add_media(fixture.dir(), 2, "preds", 0, MediaKind::table, "json",
                mf::table_json(R"(["id","p"])", R"([[1,0.5],[2,null]])"));
  want[{"rank-0", "preds", 2}] = "id|p|1|0.5|2|";
  // A media whose file is gone is left out; the rest goes on.
  fs::remove(fs::path(fixture.dir()) / mf::add_media(fixture.dir(), 2, "gone", 0, MediaKind::text, "md", "x"));
  {
    chorus::upload::Uploader up(fixture.dir(), tensorboard_target(tb_dir), quick);
    BOOST_REQUIRE(!up.open());
    auto p = pump_all(up);
    BOOST_REQUIRE_MESSAGE(p.caught_up, p.error);
    check_media_once(tb_run, want);
    const std::string offsets = up.state_path(); // upload/<id>.json; what was left out: upload/<id>.refused.jsonl
    const std::string refused = chorus::test::slurp(offsets.substr(0, offsets.size() - 5) + ".refused.jsonl");
    BOOST_TEST(refused.find(R"("part":"media","step":2,"path":"media/gone-)") != std::string::npos, refused);
    BOOST_TEST(refused.find("is missing") != std::string::npos, refused);
    // More while the run trains: they follow, in new events of the same files.
    fixture.history(3, 2);
    for (std::int64_t step = 3; step < 5; ++step) add_step_media(fixture, step, want);
    p = pump_all(up);
    BOOST_REQUIRE_MESSAGE(p.caught_up, p.error);
    check_media_once(tb_run, want);
  }
  // A restarted Uploader goes on from its offsets; one that lost them reads
  // media.jsonl from its start and finds every step written already.
  add_step_media(fixture, 5, want);
  for (int restart = 0; restart < 2; ++restart) {
    if (restart == 1)
      for (const auto& e : fs::directory_iterator(fs::path(fixture.dir()) / "upload"))
        if (e.path().filename().string().starts_with("tensorboard-") && e.path().extension() == ".json")
          fs::remove(e.path());
    chorus::upload::Uploader up(fixture.dir(), tensorboard_target(tb_dir), quick);
    BOOST_REQUIRE(!up.open());
    const auto p = pump_all(up);
    BOOST_REQUIRE_MESSAGE(p.caught_up, p.error);
    check_media_once(tb_run, want);
  }
  // Files of many MiB go a few a call, and the run's end after the last of them.
  for (int i = 0; i < 3; ++i) {
    std::string big(17u << 20, static_cast<char>('a' + i));
    mf::add_media(fixture.dir(), 6, "big" + std::to_string(i), 0, MediaKind::text, "md", big);
    want[{"rank-0", "big" + std::to_string(i), 6}] = std::move(big);
  }
  fixture.write_run_json("finished", fixture.start + 10);
  chorus::upload::Uploader up(fixture.dir(), tensorboard_target(tb_dir), quick);
  BOOST_REQUIRE(!up.open());
  const auto p = pump_all(up);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  BOOST_TEST(up.state().media.lines == 3u * 6 + 1 + 1 + 3); // every line of media.jsonl, the one left out too
  check_media_once(tb_run, want);
}

BOOST_FIXTURE_TEST_CASE(a_directory_that_cannot_be_made_for_a_while_loses_no_media, TwoRankRun) {
  fixture.history(0, 1);
  mf::add_media(fixture.dir(), 0, "first", 0, MediaKind::text, "md", "rank 0's");
  want[{"rank-0", "first", 0}] = "rank 0's";
  chorus::upload::Uploader up(fixture.dir(), tensorboard_target(tb_dir), quick);
  BOOST_REQUIRE(!up.open());
  auto p = pump_all(up);
  BOOST_REQUIRE_MESSAGE(p.caught_up, p.error);
  // rank-1/ cannot be made: the call fails, nothing counts as delivered, and
  // what was written beside it is not written again once it can be.
  { std::ofstream(tb_run / "rank-1") << "in the way"; }
  add_step_media(fixture, 1, want);
  p = up.pump(std::chrono::steady_clock::now() + 10s);
  BOOST_TEST(p.wait_until.has_value());
  BOOST_TEST(p.error.find((tb_run / "rank-1").string()) != std::string::npos, p.error);
  BOOST_TEST(up.state().media.lines == 1u);
  fs::remove(tb_run / "rank-1");
  up.retry_now();
  p = pump_all(up);
  BOOST_REQUIRE_MESSAGE(p.caught_up, p.error);
  BOOST_TEST(up.state().media.lines == 4u);
  check_media_once(tb_run, want);
}
