// `chorus serve`'s index of a history or system file (cli/serve/lines_index.hpp):
// reading the file in pieces on several threads gives the very index one
// plain read gives, damaged lines, a line being written, keys that come and
// go and the 65,536-point limit included; the index follows the file as it
// grows, and starts over where it is replaced or cut. A long history is
// shown by an overview while its index is built in the background: ranges
// are answered from the file as the index answers them, and the index, once
// built, is the one a plain read gives; a long system.jsonl takes the same
// path. A chart's answer keeps its range's first and last point however it
// is downsampled, and says where a key was NaN or infinite. `_count/min`
// leaves out the keys declared `first`; an index being built counts towards
// the bound on the indexes' memory.
#define BOOST_TEST_MODULE cli_serve_index
#include <boost/test/unit_test.hpp>

#include "cli/serve/api.hpp"
#include "cli/serve/lines_index.hpp"
#include "io/store/history_blocks.hpp"
#include "io/store/metric_specs.hpp"
#include "io/store/run_writer.hpp"
#include "runtime/core/history.hpp"
#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"
#include "tests/cli/serve_index_rows.hpp"

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <simdjson.h>
#include <thread>

using namespace chorus::test;
using chorus::cli::serve::FileKind;
using chorus::cli::serve::LinesIndex;
using chorus::cli::serve::SeriesRequest;
using chorus::cli::serve::XAxis;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();

std::string system_rows(int first, int last) {
  std::string h;
  for (int t = first; t < last; ++t)
    for (int r = 0; r < 2; ++r)
      h += R"({"_timestamp":)" + std::to_string(1'700'000'000 + t + r * 0.01) + R"(,"_runtime":)" +
           std::to_string(t) + R"(,"_node":0,"_rank":)" + std::to_string(r) + R"(,"system.cpu.percent/node-0":)" +
           std::to_string(t % 100) + R"(,"system.proc.rss/rank-)" + std::to_string(r) + "\":" + std::to_string(t * 2 + r) + "}\n";
  return h;
}

/// What must come out the same whichever way the file was read: the state,
/// the keys, and every series but those drawn from the index's blocks (a
/// key of more points than it keeps, over a range of many points a pixel).
/// Their blocks end where the pieces did, so the points picked to stand for a
/// pixel, and the count of points at the range's edges, may differ a little.
struct Answers {
  std::string exact;
  std::vector<long> counts; // of the answers from blocks

  void blocks(const std::string& json) {
    for (std::size_t at = 0; (at = json.find("\"n\":", at)) != std::string::npos; ++at)
      counts.push_back(std::stol(json.substr(at + 4)));
  }
  bool operator==(const Answers& o) const {
    if (exact != o.exact || counts.size() != o.counts.size()) return false;
    for (std::size_t i = 0; i < counts.size(); ++i)
      if (std::abs(counts[i] - o.counts[i]) > 2 * long(LinesIndex::block_points)) return false;
    return true;
  }
};

Answers everything(const LinesIndex& index, const std::vector<std::string>& keys, std::size_t kept_whole) {
  const chorus::cli::serve::IndexState s = index.state();
  Answers a;
  std::string& out = a.exact;
  out = std::to_string(s.rows) + " " + std::to_string(s.skipped) + " " + s.first_skipped + " " +
        std::to_string(s.bytes) + " " + std::to_string(s.last_step) + " " + std::to_string(s.unfinished) + " " +
        std::to_string(s.keys) + (s.problem ? " " + s.problem.message() : "") + "\n";
  index.keys_json(out);
  out += "\n";
  const std::vector<std::string> whole(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(kept_whole));
  for (const XAxis x : {XAxis::step, XAxis::wall, XAxis::rel}) {
    // 3,000 pixels: few enough points a pixel to read them all back from the file.
    index.series_json({keys, x, std::nullopt, std::nullopt, 3000}, out);
    out += "\n";
    index.series_json({whole, x, std::nullopt, std::nullopt, 40}, out);
    out += "\n";
    std::string blocks;
    index.series_json({keys, x, std::nullopt, std::nullopt, 40}, blocks);
    a.blocks(blocks);
  }
  // Zoomed in: read back from the file, across the pieces' seams.
  for (const auto& [from, to] : {std::pair{30'000.0, 30'900.0}, std::pair{49'990.0, 50'020.0}}) {
    index.series_json({keys, XAxis::step, from, to, 1000}, out);
    out += "\n";
  }
  std::string wide;
  index.series_json({keys, XAxis::step, 100.0, 60'000.0, 1000}, wide);
  a.blocks(wide);
  return a;
}

/// `keys`: those of at most 65,536 points first, `kept_whole` of them.
void compare_ways(const fs::path& file, FileKind kind, const std::vector<std::string>& keys, std::size_t kept_whole,
                  const std::function<void()>& grow) {
  LinesIndex plain(file.string(), kind, never);
  std::vector<std::unique_ptr<LinesIndex>> pieces;
  for (const unsigned n : {2u, 3u, 4u}) pieces.push_back(std::make_unique<LinesIndex>(file.string(), kind, 1, n));
  BOOST_TEST(plain.refresh());
  const Answers want = everything(plain, keys, kept_whole);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    BOOST_TEST(pieces[i]->refresh());
    BOOST_TEST((everything(*pieces[i], keys, kept_whole) == want), "in " << i + 2 << " pieces");
  }
  // The file grows: each reads the new lines only, and they agree again.
  grow();
  BOOST_TEST(plain.refresh());
  const Answers grown = everything(plain, keys, kept_whole);
  BOOST_TEST(!(grown == want));
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    BOOST_TEST(pieces[i]->refresh());
    BOOST_TEST((everything(*pieces[i], keys, kept_whole) == grown), "grown, in " << i + 2 << " pieces");
  }
  BOOST_TEST(!plain.refresh(), "nothing new, nothing changed");
}

std::string series(const LinesIndex& index, const std::string& key) {
  std::string out;
  index.series_json({{key}, XAxis::step, std::nullopt, std::nullopt, 10000}, out);
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_history_read_in_pieces_is_indexed_as_in_one_read) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  // 70,000 rows: past the points a key keeps (65,536), with a last line being written.
  write_text(file, history_rows(0, 70'000) + R"({"_step":70000,"dense":)");
  compare_ways(file, FileKind::history,
               {"sparse", "c/rank-2", "_progress/rank-2", "nosuch", "dense", "c/rank-0", "_count/min", "_step"}, 4, [&] {
                 std::ofstream f(file, std::ios::app);
                 f << "1.5}\n" << history_rows(70'001, 71'000);
               });
  LinesIndex index(file.string(), FileKind::history, 1, 3);
  BOOST_TEST(index.refresh());
  const chorus::cli::serve::IndexState s = index.state();
  BOOST_TEST(s.rows == 71'000u);
  BOOST_TEST(s.skipped == 14u);
  BOOST_TEST(s.first_skipped == "line 2501: The JSON document has an improper structure: missing or superfluous commas, braces, missing keys, etc.");
  BOOST_TEST(s.last_step == 70'999);
  BOOST_TEST(!s.unfinished);
}

BOOST_AUTO_TEST_CASE(system_samples_read_in_pieces_are_indexed_as_in_one_read) {
  TempDir dir;
  const fs::path file = dir.path / "system.jsonl";
  write_text(file, system_rows(0, 20'000));
  compare_ways(file, FileKind::system, {"system.proc.rss/rank-1", "system.cpu.percent/node-0"}, 1, [&] {
    std::ofstream f(file, std::ios::app);
    f << system_rows(20'000, 20'500);
  });
}

BOOST_AUTO_TEST_CASE(a_file_replaced_or_cut_is_read_afresh) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  LinesIndex index(file.string(), FileKind::history);
  BOOST_TEST(!index.refresh());
  BOOST_TEST(index.state().missing);
  write_text(file, history_rows(0, 100));
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().rows == 100u);
  // Replaced by a shorter file (chorus recover rewrites it): the rows now there only.
  write_text(dir.path / "new.jsonl", history_rows(0, 40));
  fs::rename(dir.path / "new.jsonl", file);
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().rows == 40u);
  BOOST_TEST(series(index, "dense").find("\"n\":38") != std::string::npos, series(index, "dense")); // a NaN, an infinity
  // Cut in place.
  fs::resize_file(file, history_rows(0, 10).size());
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().rows == 10u);
  fs::remove(file);
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().missing);
  BOOST_TEST(index.state().rows == 0u);
}

BOOST_AUTO_TEST_CASE(a_line_being_written_is_taken_once_it_is_whole) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  write_text(file, history_rows(0, 10) + R"({"_step":10,"_timestamp":1700000010,"dense":4)");
  LinesIndex index(file.string(), FileKind::history);
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().rows == 10u);
  BOOST_TEST(index.state().unfinished);
  {
    std::ofstream f(file, std::ios::app);
    f << "2}\n";
  }
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().rows == 11u);
  BOOST_TEST(!index.state().unfinished);
  BOOST_TEST(series(index, "dense").find(",42]") != std::string::npos, series(index, "dense"));
}


BOOST_AUTO_TEST_CASE(a_long_history_is_shown_by_an_overview_until_its_index_is_built) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  write_text(file, history_rows(0, 70'000) + R"({"_step":70000,"dense":)");
  const std::vector<std::string> keys = {"sparse", "c/rank-2", "_progress/rank-2", "nosuch",
                                         "dense",  "c/rank-0", "_count/min",       "_step"};
  LinesIndex plain(file.string(), FileKind::history, never, 1, never);
  BOOST_TEST(plain.refresh());
  // An overview from 64 KiB on, its index built on two threads, held back for now.
  LinesIndex index(file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
  index.hold_indexing(true);
  BOOST_TEST(index.refresh());
  chorus::cli::serve::IndexState s = index.state();
  BOOST_TEST(s.indexing);
  BOOST_TEST(s.last_step == 69'999);
  BOOST_TEST(s.unfinished);
  BOOST_TEST(s.rows > 60'000u, s.rows); // an estimate from the lines' lengths
  BOOST_TEST(s.rows < 80'000u, s.rows);
  std::string listed;
  index.keys_json(listed);
  for (const char* k : {"\"dense\"", "\"c/rank-2\"", "\"_progress/rank-2\"", "\"_count/min\"", "\"estimated\":true"})
    BOOST_TEST(listed.find(k) != std::string::npos, k << " in " << listed);
  // The whole run: the overview's lines stand for it, and the answer says so.
  const std::string whole = series(index, "dense");
  BOOST_TEST(whole.find("\"overview\":true") != std::string::npos, whole);
  BOOST_TEST(whole.find("\"full\":false") != std::string::npos, whole);
  // A range: every line in it read from the file, the very answer of the index.
  for (const XAxis x : {XAxis::step, XAxis::wall, XAxis::rel}) {
    const double at = x == XAxis::wall ? 1'700'000'000 : 0, per = x == XAxis::step ? 1 : 0.5;
    for (const auto& [from, to] : {std::pair{30'000.0, 30'900.0}, std::pair{49'990.0, 50'020.0},
                                   std::pair{0.0, 100.0}, std::pair{69'500.0, 70'000.0}}) {
      const chorus::cli::serve::SeriesRequest r{keys, x, at + from * per, at + to * per, 1000};
      BOOST_TEST(series_part(index, r) == series_part(plain, r), "steps " << from << " to " << to);
    }
  }
  // Asked `exact`: the whole run read from the file for the keys asked (metric
  // keys alone: each line read for them only; with an added key: every line
  // read whole), the very answer of the plain index over the same range at
  // a width where it too takes every point.
  for (const XAxis x : {XAxis::step, XAxis::wall}) {
    const double at = x == XAxis::wall ? 1'700'000'000 : 0, per = x == XAxis::step ? 1 : 0.5;
    for (const std::vector<std::string>& asked : {std::vector<std::string>{"dense", "c/rank-2", "sparse"}, keys}) {
      chorus::cli::serve::SeriesRequest exact{asked, x, std::nullopt, std::nullopt, 8192};
      exact.exact = true;
      std::string answer;
      index.series_json(exact, answer);
      BOOST_TEST(answer.find("\"overview\":false") != std::string::npos, answer.substr(0, 200));
      const chorus::cli::serve::SeriesRequest same{asked, x, at, at + 69'999 * per, 8192};
      BOOST_TEST(series_part(index, exact) == series_part(plain, same), asked.size() << " keys");
    }
  }
  // Lines appended meanwhile are read once the index is whole.
  {
    std::ofstream f(file, std::ios::app);
    f << "1.5}\n" << history_rows(70'001, 71'000);
  }
  BOOST_TEST(!index.refresh());
  BOOST_TEST(index.state().indexing);
  index.hold_indexing(false);
  wait_indexed(index);
  BOOST_TEST(!index.state().indexing);
  BOOST_TEST(plain.refresh());
  BOOST_TEST((everything(index, keys, 4) == everything(plain, keys, 4)));
  BOOST_TEST(index.state().rows == 71'000u);
  BOOST_TEST(index.state().skipped == 14u);
}

BOOST_AUTO_TEST_CASE(a_whole_run_read_for_its_keys_takes_what_the_index_takes) {
  // Among plain rows, lines that a reading of a few keys could take
  // otherwise than the index: each key's values, and the rows, are the same.
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  const std::vector<std::string> odd = {
      R"({"_step":S,"dense":-0,"c/rank-2":1})",                       // -0 written as an integer is 0
      R"({"_step":S,"dense":18446744073709551615})",                  // a uint64
      R"({"_step":S,"dense":18446744073709551616,"c/rank-2":3})",     // beyond 64 bits: no row
      R"({"_step":S,"d\u0065nse":5,"c\/rank-2":4})",         // keys written with escapes
      R"({"\u005fstep":S,"dense":16})",                        // _step written with an escape
      R"({"_stepx":1,"_step":S,"_timestampz":"a","_count":{"_step":2},"dense":17})", // reserved keys like a row's own
      R"({"_step":S,"_step":0,"dense":6})",                           // the first _step counts
      R"({"_count":{"dense":7},"_step":S,"dense":8})",                // the key inside _count first
      R"({"_step":S,"dense":"NaN","c/rank-2":"Infinity"})",
      R"({"_step":S,"dense":"text","c/rank-2":{"a":1}})",              // no values
      R"({"_step":S,"dense":[1,2],"c/rank-2":true})",
      R"({"_step":S,"dense":tru})",                                   // damaged: no row
      R"({"_step":"5","dense":9})",                                   // no step: no rows
      R"({"_step":5.0,"dense":9})",
      R"({"_step":-1,"dense":9})",
      R"({"_step":S,"_timestamp":"x","dense":10})",
      R"({"_step":S,"_timestamp":1e400,"dense":13})",                // damaged: no row
      R"({"_step":S,"_runtime":fals,"dense":14})",                    // damaged: no row
      R"({"_step":S,"_timestamp":17e8,"_runtime":-0,"dense":15})",
      R"({"_step":S,"dense":11}x)",                                   // trailing bytes: no row
      R"({"_step":S,"dense":1e400})",                                 // beyond the doubles: no row
      R"({"_step":S,"dense":1.5e-3,"c/rank-2":-2.5E+2})"};
  std::string text;
  int step = 0;
  for (int round = 0; round < 60; ++round) {
    text += history_rows(step, step + 50);
    step += 50;
    for (const std::string& line : odd) {
      std::string l = line;
      if (const auto at = l.find(":S,"); at != std::string::npos) l.replace(at + 1, 1, std::to_string(step++));
      text += l + "\n";
    }
  }
  write_text(file, text);
  LinesIndex plain(file.string(), FileKind::history, never, 1, never);
  BOOST_TEST(plain.refresh());
  BOOST_TEST(plain.state().skipped > 0u);
  for (const unsigned pieces : {1u, 2u}) {
    LinesIndex index(file.string(), FileKind::history, 1u << 10, pieces, 1u << 12);
    index.hold_indexing(true);
    BOOST_TEST(index.refresh());
    BOOST_REQUIRE(index.state().indexing);
    for (const std::vector<std::string>& asked :
         {std::vector<std::string>{"dense"}, std::vector<std::string>{"dense", "c/rank-2", "sparse"}}) {
      chorus::cli::serve::SeriesRequest exact{asked, XAxis::step, std::nullopt, std::nullopt, 8192};
      exact.exact = true;
      const chorus::cli::serve::SeriesRequest same{asked, XAxis::step, 0.0, double(step - 1), 8192};
      BOOST_TEST(series_part(index, exact) == series_part(plain, same), pieces << " pieces, " << asked.size() << " keys");
    }
    index.hold_indexing(false);
    wait_indexed(index);
  }
}

BOOST_AUTO_TEST_CASE(a_whole_history_against_the_step_is_drawn_from_the_writers_block_summary) {
  // A history written by chorus's writer, with its block summary beside it
  // (io/store/history_blocks.hpp), at every third step: "loss" on every row
  // (an isolated NaN and +Infinity now and then, one spike), "acc/rank-0" on
  // every third row. Asked `exact` while the index is built, at 4.9 blocks
  // a pixel, the charts come from the blocks and the rows after the last:
  // every point drawn is a row's value at its step; each pixel holds the
  // smallest and largest value of the blocks that lie whole in it, and
  // nothing beyond its own rows' values; the spike, the first and last
  // point and the count are there; every NaN and infinity is marked in its
  // pixel. Without the summary, with a damaged one, or at a width of fewer
  // blocks a pixel, the file is read: the plain index's very answer.
  TempDir dir;
  const fs::path run = dir.path / "run";
  constexpr int rows = 20'037;     // 78 blocks of 256 rows, and 69 rows after them
  constexpr std::size_t width = 16; // 1,252 rows a pixel
  const auto loss = [](int i) {
    if (i % 1000 == 500) return std::numeric_limits<double>::quiet_NaN();
    if (i % 3001 == 17) return std::numeric_limits<double>::infinity();
    if (i == 7777) return 1e6;
    return std::sin(i * 0.01) * 10 + (i % 11) * 0.1;
  };
  std::map<std::string, std::map<std::int64_t, double>> truth;
  {
    const std::vector<std::string> names = {"loss", "acc"};
    chorus::store::RunWriter w(run.string(), [&](std::uint32_t k) { return std::string_view(names.at(k)); });
    w.run_start("{}", 1'700'000'000'000'000, 1);
    chorus::core::Row r;
    for (int i = 0; i < rows; ++i) {
      r.step = 3 * i;
      r.ts_us = 1'700'000'000'000'000 + i;
      r.runtime_us = i;
      r.values.clear();
      if (i % 3 == 0) r.values.push_back({1, 0, double(i % 29), 0});
      r.values.push_back({0, -1, loss(i), 0});
      for (const chorus::core::RowValue& v : r.values) truth[v.key ? "acc/rank-0" : "loss"][r.step] = v.value;
      w.row(r);
    }
    w.run_end(chorus::RunState::finished, 1'700'000'000'000'000 + rows);
    BOOST_TEST_REQUIRE(!w.error(), w.error().message());
  }
  const fs::path file = run / "history.jsonl", blocks = run / chorus::store::history_blocks_file;
  BOOST_TEST_REQUIRE(fs::exists(blocks));
  const std::vector<std::string> asked = {"loss", "acc/rank-0"};
  LinesIndex plain(file.string(), FileKind::history, never, 1, never);
  BOOST_TEST(plain.refresh());
  const double last_step = 3.0 * (rows - 1);
  const auto exact_answer = [&](std::size_t w) {
    LinesIndex index(file.string(), FileKind::history, never, 1, 1u << 16);
    index.hold_indexing(true);
    BOOST_TEST(index.refresh());
    BOOST_TEST_REQUIRE(index.state().indexing);
    SeriesRequest r{asked, XAxis::step, std::nullopt, std::nullopt, w};
    r.exact = true;
    std::string out;
    index.series_json(r, out);
    return std::pair{out, series_part(index, r)};
  };
  const auto plain_answer = [&](std::size_t w) { return series_part(plain, {asked, XAxis::step, 0.0, last_step, w}); };

  const auto [answer, part] = exact_answer(width);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  BOOST_TEST_REQUIRE(!parser.parse(answer).get(doc), answer.substr(0, 300));
  BOOST_TEST(answer.find("\"overview\":false") != std::string::npos);
  const double lo = doc["from"].get_double().value(), hi = doc["to"].get_double().value();
  BOOST_TEST(lo == 0.0);
  BOOST_TEST(hi == last_step);
  // Which of `parts` even parts of [lo, hi] a step falls in (the answer's buckets and marks).
  const auto part_of = [&](double x, std::size_t parts) {
    const double f = (x - lo) / (hi - lo) * double(parts);
    return f <= 0 ? std::size_t{0} : std::min(parts - 1, std::size_t(f));
  };
  const std::size_t buckets = width - 1;
  for (const std::string& key : asked) {
    const std::map<std::int64_t, double>& t = truth.at(key);
    simdjson::dom::element series = doc["series"][key];
    std::vector<double> x, y;
    for (simdjson::dom::element e : series["x"].get_array()) x.push_back(e.get_double().value());
    for (simdjson::dom::element e : series["y"].get_array()) y.push_back(e.get_double().value());
    BOOST_TEST_REQUIRE(x.size() == y.size());
    BOOST_TEST_REQUIRE(!x.empty());
    std::uint64_t finite = 0;
    double lowest = INFINITY, highest = -INFINITY;
    std::int64_t first = -1, last = -1;
    for (const auto& [step, v] : t)
      if (std::isfinite(v)) {
        ++finite, lowest = std::min(lowest, v), highest = std::max(highest, v);
        if (first < 0) first = step;
        last = step;
      }
    BOOST_TEST(series["n"].get_uint64().value() == finite, key);
    // Every point a row's value at its step; the first and last, and the extremes, among them.
    for (std::size_t i = 0; i < x.size(); ++i) {
      const auto it = t.find(std::int64_t(x[i]));
      BOOST_TEST_REQUIRE((it != t.end() && it->second == y[i]), key << " at " << x[i] << ": " << y[i]);
    }
    BOOST_TEST(x.front() == double(first), key);
    BOOST_TEST(y.front() == t.at(first));
    BOOST_TEST(x.back() == double(last), key);
    BOOST_TEST(y.back() == t.at(last));
    BOOST_TEST(*std::min_element(y.begin(), y.end()) == lowest, key);
    BOOST_TEST(*std::max_element(y.begin(), y.end()) == highest, key);
    // Each bucket: its points' range within its rows' values, and reaching
    // the extremes of the blocks that lie whole in it.
    std::vector<double> got_lo(buckets, INFINITY), got_hi(buckets, -INFINITY);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t b = part_of(x[i], buckets);
      got_lo[b] = std::min(got_lo[b], y[i]), got_hi[b] = std::max(got_hi[b], y[i]);
    }
    std::vector<double> whole_lo(buckets, INFINITY), whole_hi(buckets, -INFINITY);
    constexpr int block = int(chorus::store::HistoryBlockWriter::rows_per_block);
    for (int b0 = 0; b0 + block <= rows; b0 += block) {
      const std::size_t from = part_of(3.0 * b0, buckets), to = part_of(3.0 * (b0 + block - 1), buckets);
      if (from != to) continue; // across two buckets
      for (auto it = t.lower_bound(3 * b0); it != t.end() && it->first < 3 * (b0 + block); ++it)
        if (std::isfinite(it->second))
          whole_lo[from] = std::min(whole_lo[from], it->second), whole_hi[from] = std::max(whole_hi[from], it->second);
    }
    for (std::size_t b = 0; b < buckets; ++b) {
      BOOST_TEST(got_lo[b] <= whole_lo[b], key << " bucket " << b);
      BOOST_TEST(got_hi[b] >= whole_hi[b], key << " bucket " << b);
    }
    // Each NaN and infinity marked in its pixel, at its step or before it there.
    if (key == "loss") {
      for (const auto& [kind, nonfinite] : {std::pair{"nan", 0}, std::pair{"inf", 1}}) {
        std::set<std::size_t> want, marked;
        for (const auto& [step, v] : t)
          if (nonfinite == 0 ? std::isnan(v) : std::isinf(v)) want.insert(part_of(double(step), width));
        for (simdjson::dom::element e : series["nonfinite"][kind].get_array()) {
          const double at = e.get_double().value();
          BOOST_TEST(!std::isfinite(t.at(std::int64_t(at))), kind << " at " << at);
          marked.insert(part_of(at, width));
        }
        BOOST_TEST(!want.empty());
        BOOST_TEST((marked == want), kind);
      }
    }
  }
  // The file read instead, the plain index's very answer: at fewer blocks a
  // pixel, with no summary, and with a damaged one.
  BOOST_TEST(exact_answer(64).second == plain_answer(64));
  const std::string kept = slurp(blocks);
  fs::remove(blocks);
  BOOST_TEST(exact_answer(width).second == plain_answer(width));
  write_text(blocks, "{\"rows\":[0,256],\"bytes\":[0,1]}\n" + kept);
  BOOST_TEST(exact_answer(width).second == plain_answer(width));
  // And the summary put back: the blocks again, the same answer as before.
  write_text(blocks, kept);
  BOOST_TEST(exact_answer(width).second == part);
  BOOST_TEST(part != plain_answer(width)); // the blocks' points, not the file's
  // Where the server may not show the summary (serve as root, a file its
  // owner keeps from others), the file is read instead.
  {
    LinesIndex index(file.string(), FileKind::history, never, 1, 1u << 16);
    std::vector<std::string> asked_of;
    index.shown_by([&](const std::string& path) {
      asked_of.push_back(path);
      return false;
    });
    index.hold_indexing(true);
    BOOST_TEST(index.refresh());
    SeriesRequest r{asked, XAxis::step, std::nullopt, std::nullopt, width};
    r.exact = true;
    BOOST_TEST(series_part(index, r) == plain_answer(width));
    BOOST_TEST((asked_of == std::vector<std::string>{blocks.string()}));
  }
}

BOOST_AUTO_TEST_CASE(whoever_asked_is_told_once_when_a_background_index_is_whole) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  write_text(file, history_rows(0, 70'000));
  std::mutex mutex;
  std::condition_variable told;
  int built = 0;
  LinesIndex index(file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
  index.when_built([&] {
    {
      std::lock_guard lock(mutex);
      ++built;
    }
    told.notify_all();
  });
  index.hold_indexing(true);
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().indexing);
  {
    std::lock_guard lock(mutex);
    BOOST_TEST(built == 0); // held back: nothing is whole yet
  }
  index.hold_indexing(false);
  {
    std::unique_lock lock(mutex);
    BOOST_REQUIRE(told.wait_for(lock, std::chrono::minutes(2), [&] { return built > 0; }));
  }
  // Told once the index is whole, not before: the next refresh takes it in place of the overview.
  index.refresh();
  BOOST_TEST(!index.state().indexing);
  BOOST_TEST(index.state().rows == 70'000u);
  std::ofstream(file, std::ios::app) << history_rows(70'000, 70'010);
  BOOST_TEST(index.refresh());
  std::lock_guard lock(mutex);
  BOOST_TEST(built == 1); // lines appended later are read on the spot: no more builds to tell of

  // A file short enough to be read on the spot is never built in the background.
  int short_built = 0;
  write_text(dir.path / "short.jsonl", history_rows(0, 100));
  LinesIndex plain((dir.path / "short.jsonl").string(), FileKind::history, 1u << 20, 2, 1u << 16);
  plain.when_built([&] { ++short_built; });
  BOOST_TEST(plain.refresh());
  BOOST_TEST(!plain.state().indexing);
  BOOST_TEST(short_built == 0);
}

BOOST_AUTO_TEST_CASE(a_history_replaced_while_it_is_indexed_is_read_afresh) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  write_text(file, history_rows(0, 20'000));
  LinesIndex index(file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
  index.hold_indexing(true);
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().indexing);
  // Replaced by a short file (chorus recover rewrites it): the indexing of the old one stops.
  write_text(dir.path / "new.jsonl", history_rows(0, 300));
  fs::rename(dir.path / "new.jsonl", file);
  BOOST_TEST(index.refresh());
  BOOST_TEST(!index.state().indexing);
  BOOST_TEST(index.state().rows == 300u);
  // Cut while indexed: read afresh too.
  write_text(dir.path / "new.jsonl", history_rows(0, 20'000));
  fs::rename(dir.path / "new.jsonl", file);
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().indexing);
  fs::resize_file(file, history_rows(0, 100).size());
  BOOST_TEST(index.refresh());
  BOOST_TEST(!index.state().indexing);
  BOOST_TEST(index.state().rows == 100u);
}

BOOST_AUTO_TEST_CASE(a_series_against_a_key_is_drawn_at_that_keys_value_on_each_row) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  write_text(file, history_rows(0, 70'000));
  // The rows' own _step as the x key: the answers must be those against the
  // step. 70,000 points: kept whole only where it is named to keep_points
  // (in one read, and in pieces), else read back from the file.
  LinesIndex plain(file.string(), FileKind::history, never);
  LinesIndex kept(file.string(), FileKind::history, never);
  LinesIndex kept_pieces(file.string(), FileKind::history, 1, 3);
  kept.keep_points({"_step"});
  kept_pieces.keep_points({"_step"});
  for (LinesIndex* i : {&plain, &kept, &kept_pieces}) BOOST_TEST(i->refresh());
  BOOST_TEST(kept.memory() >= plain.memory() + 70'000 * (sizeof(std::uint32_t) + sizeof(double)));
  const std::vector<std::string> keys = {"sparse", "c/rank-2", "_progress/rank-2", "nosuch", "dense", "_count/min"};
  using Range = std::tuple<std::optional<double>, std::optional<double>, std::size_t>;
  for (const auto& [from, to, width] :
       {Range{std::nullopt, std::nullopt, 3000}, Range{30'000.0, 30'900.0, 1000}, Range{49'990.0, 50'020.0, 1000}}) {
    std::string want;
    plain.series_json({keys, XAxis::step, from, to, width}, want);
    for (const LinesIndex* i : {&plain, &kept, &kept_pieces}) {
      std::string got;
      i->series_json({keys, XAxis::step, from, to, width, "_step"}, got);
      BOOST_TEST(got == want, "from " << from.value_or(-1) << ": " << got.substr(0, 300));
    }
  }
  // Named once the index is built: it is read afresh, and keeps them from then on.
  plain.keep_points({"_step"});
  BOOST_TEST(plain.refresh());
  BOOST_TEST(plain.memory() == kept.memory());

  // Against `sparse` (every 7th row, its step / 4): a point only where a row has both.
  std::string out;
  plain.series_json({{"c/rank-0"}, XAxis::step, 99.0, 102.0, 1000, "sparse"}, out);
  BOOST_TEST(out.find(R"("c/rank-0":{"n":2,"full":true,"x":[99.75,101.5],"y":[399,406])") != std::string::npos, out);
  // A key on every row, past the points it keeps, against one on every 7th:
  // the 10,000 rows that have both, none left out for want of an x.
  out.clear();
  plain.series_json({{"c/rank-0"}, XAxis::step, std::nullopt, std::nullopt, 100, "sparse"}, out);
  BOOST_TEST(out.find(R"("to":17498.25,)") != std::string::npos, out);
  BOOST_TEST(out.find(R"("c/rank-0":{"n":10000,"full":false,)") != std::string::npos, out);
  BOOST_TEST(out.find(",69993],") != std::string::npos, out); // the last row's value, the largest
  out.clear();
  plain.series_json({{"dense"}, XAxis::step, std::nullopt, std::nullopt, 1000, "nosuch"}, out);
  BOOST_TEST(out.find(R"("x_missing":true)") != std::string::npos, out);

  // While the index is built, a range against a key is read from the file: the very answer of the index.
  LinesIndex building(file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
  building.hold_indexing(true);
  BOOST_TEST(building.refresh());
  BOOST_TEST(building.state().indexing);
  for (const auto& [from, to] : {std::pair{7'500.0, 7'725.0}, std::pair{0.0, 25.0}, std::pair{17'400.0, 17'499.0}}) {
    const SeriesRequest r{keys, XAxis::step, from, to, 1000, "sparse"};
    BOOST_TEST(series_part(building, r) == series_part(plain, r), "sparse " << from << " to " << to);
  }
  building.hold_indexing(false);
  wait_indexed(building);
}

namespace {

/// The numbers of the array that follows `what` (such as `"x":[`) after
/// `from` in `json` (none where it is not there).
std::vector<double> numbers_after(const std::string& json, std::string_view what, std::size_t from = 0) {
  std::vector<double> out;
  std::size_t at = json.find(what, from);
  if (at == std::string::npos) return out;
  at += what.size();
  const std::size_t end = json.find(']', at);
  for (std::size_t p = at; p < end;) {
    const std::size_t comma = std::min(json.find(',', p), end);
    if (comma > p) out.push_back(std::stod(json.substr(p, comma - p)));
    p = comma + 1;
  }
  return out;
}

/// Key `key`'s x (or y) in a series answer.
std::vector<double> series_of(const std::string& json, const std::string& key, std::string_view what = "\"x\":[") {
  const std::size_t at = json.find("\"" + key + "\":{\"n\"");
  return at == std::string::npos ? std::vector<double>{} : numbers_after(json, what, at);
}

/// A history of steps [0, rows): `loss` on every row, 1 and -1 in turn, but
/// 0 at the steps `zeros` name: never the smallest or largest of a pixel.
std::string seesaw_history(int rows, const std::vector<int>& zeros) {
  std::string h;
  for (int s = 0; s < rows; ++s) {
    const bool zero = std::find(zeros.begin(), zeros.end(), s) != zeros.end();
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s) +
         R"(,"_runtime":)" + std::to_string(s) + R"(,"loss":)" + (zero ? "0" : s % 2 ? "1" : "-1") + "}\n";
  }
  return h;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_downsampled_series_keeps_the_first_and_last_point_of_its_range) {
  TempDir dir;
  // 3,600 steps: more than two points a pixel at 1,000 pixels, read back from the file.
  const fs::path file = dir.path / "history.jsonl";
  write_text(file, seesaw_history(3600, {0, 3599}));
  LinesIndex index(file.string(), FileKind::history);
  BOOST_TEST(index.refresh());
  for (const XAxis x : {XAxis::step, XAxis::wall, XAxis::rel}) {
    std::string out;
    index.series_json({{"loss"}, x, std::nullopt, std::nullopt, 1000}, out);
    const std::vector<double> xs = series_of(out, "loss");
    BOOST_TEST_REQUIRE(!xs.empty(), out);
    const double at = x == XAxis::wall ? 1'700'000'000 : 0;
    BOOST_TEST(xs.front() == at, out.substr(0, 200));
    BOOST_TEST(xs.back() == at + 3599, out.substr(out.size() - 200));
    BOOST_TEST(xs.size() <= 2 * 1000u);
    BOOST_TEST(out.find("\"full\":false") != std::string::npos);
  }
  // Against a key (the row's own _step): the same.
  {
    std::string out;
    index.series_json({{"loss"}, XAxis::step, std::nullopt, std::nullopt, 1000, "_step"}, out);
    const std::vector<double> xs = series_of(out, "loss");
    BOOST_TEST_REQUIRE(!xs.empty(), out);
    BOOST_TEST(xs.front() == 0);
    BOOST_TEST(xs.back() == 3599);
  }

  // 70,000 steps at 100 pixels: drawn from the index's blocks (more points
  // than a key keeps), the whole run and a range cutting through blocks.
  const fs::path long_file = dir.path / "long.jsonl";
  write_text(long_file, seesaw_history(70'000, {0, 1001, 60'000, 69'999}));
  LinesIndex blocks(long_file.string(), FileKind::history);
  BOOST_TEST(blocks.refresh());
  using Range = std::tuple<std::optional<double>, std::optional<double>, double, double>;
  for (const auto& [from, to, first, last] :
       {Range{std::nullopt, std::nullopt, 0, 69'999}, Range{1000.5, 60'000.5, 1001, 60'000}}) {
    std::string out;
    blocks.series_json({{"loss"}, XAxis::step, from, to, 100}, out);
    const std::vector<double> xs = series_of(out, "loss");
    BOOST_TEST_REQUIRE(!xs.empty(), out);
    BOOST_TEST(xs.front() == first, out.substr(0, 200));
    BOOST_TEST(xs.back() == last, out.substr(out.size() - 200));
    BOOST_TEST(series_of(out, "loss", "\"y\":[").front() == 0);
    BOOST_TEST(series_of(out, "loss", "\"y\":[").back() == 0);
    BOOST_TEST(xs.size() <= 2 * 100u);
    BOOST_TEST(out.find("\"n\":") != std::string::npos);
  }

  // While it is indexed: the overview's first and last line are the run's.
  LinesIndex building(long_file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
  building.hold_indexing(true);
  BOOST_TEST(building.refresh());
  BOOST_TEST(building.state().indexing);
  std::string out;
  building.series_json({{"loss"}, XAxis::step, std::nullopt, std::nullopt, 100}, out);
  BOOST_TEST(out.find("\"overview\":true") != std::string::npos, out.substr(0, 200));
  const std::vector<double> xs = series_of(out, "loss");
  BOOST_TEST_REQUIRE(!xs.empty(), out);
  BOOST_TEST(xs.front() == 0);
  BOOST_TEST(xs.back() == 69'999);
  building.hold_indexing(false);
  wait_indexed(building);
}

namespace {

/// 100 steps of `loss` (NaN at 10 and 11, +Inf at 20, -Inf at 30 and 90)
/// and `diverged` (NaN from step 50 on).
std::string nonfinite_history() {
  std::string h;
  for (int s = 0; s < 100; ++s) {
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s * 0.5) +
         R"(,"_runtime":)" + std::to_string(s * 0.5) + R"(,"loss":)";
    h += s == 10 || s == 11 ? "\"NaN\"" : s == 20 ? "\"Infinity\"" : s == 30 || s == 90 ? "\"-Infinity\"" : std::to_string(s * 0.1);
    h += R"(,"diverged":)" + (s >= 50 ? std::string("\"NaN\"") : std::to_string(s)) + "}\n";
  }
  return h;
}

/// Key `key`'s "nonfinite" member in a series answer ("" where it has none).
std::string nonfinite_of(const std::string& json, const std::string& key) {
  const std::size_t at = json.find("\"" + key + "\":{\"n\"");
  if (at == std::string::npos) return "no key";
  const std::size_t end = json.find('}', at);
  const std::size_t nf = json.find(",\"nonfinite\":", at);
  if (nf == std::string::npos || nf > end) return "";
  return json.substr(nf + 13, json.find('}', nf) + 1 - (nf + 13));
}

std::string answer(const LinesIndex& index, const SeriesRequest& r) {
  std::string out;
  index.series_json(r, out);
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE(nan_and_infinities_are_marked_where_they_are) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  write_text(file, nonfinite_history());
  // In one read, and in pieces.
  LinesIndex plain(file.string(), FileKind::history, never);
  LinesIndex pieces(file.string(), FileKind::history, 1, 3);
  for (LinesIndex* index : {&plain, &pieces}) {
    BOOST_TEST(index->refresh());
    using N = std::optional<double>;
    // Every point there: each NaN and infinity.
    std::string out = answer(*index, {{"loss", "diverged"}, XAxis::step, N{}, N{}, 1000});
    BOOST_TEST(nonfinite_of(out, "loss") == R"({"nan":[10,11],"inf":[20],"-inf":[30,90]})", out);
    std::string diverged = R"({"nan":[)";
    for (int s = 50; s < 100; ++s) diverged += std::to_string(s) + (s < 99 ? "," : "]}");
    BOOST_TEST(nonfinite_of(out, "diverged") == diverged, out);
    // In the answer's x: wall and run time, and a step metric's value.
    out = answer(*index, {{"loss"}, XAxis::wall, N{}, N{}, 1000});
    BOOST_TEST(nonfinite_of(out, "loss") == R"({"nan":[1700000005,1700000005.5],"inf":[1700000010],"-inf":[1700000015,1700000045]})", out);
    out = answer(*index, {{"loss"}, XAxis::rel, N{}, N{}, 1000});
    BOOST_TEST(nonfinite_of(out, "loss") == R"({"nan":[5,5.5],"inf":[10],"-inf":[15,45]})", out);
    out = answer(*index, {{"loss"}, XAxis::step, N{}, N{}, 1000, "_step"});
    BOOST_TEST(nonfinite_of(out, "loss") == R"({"nan":[10,11],"inf":[20],"-inf":[30,90]})", out);
    // Downsampled to 10 pixels of 9.9 steps: one of each kind a pixel, the first.
    out = answer(*index, {{"loss", "diverged"}, XAxis::step, N{}, N{}, 10});
    BOOST_TEST(nonfinite_of(out, "loss") == R"({"nan":[10],"inf":[20],"-inf":[30,90]})", out);
    BOOST_TEST(nonfinite_of(out, "diverged") == R"({"nan":[50,60,70,80,90]})", out);
    // A range: only what lies in it, and nothing where it holds none.
    out = answer(*index, {{"loss"}, XAxis::step, 0.0, 25.0, 1000});
    BOOST_TEST(nonfinite_of(out, "loss") == R"({"nan":[10,11],"inf":[20]})", out);
    out = answer(*index, {{"loss", "diverged"}, XAxis::step, 40.0, 45.0, 1000});
    BOOST_TEST(nonfinite_of(out, "loss") == "", out);
    BOOST_TEST(nonfinite_of(out, "diverged") == "", out);
    // The keys' list counts them (infinities of both signs together).
    std::string keys;
    index->keys_json(keys);
    BOOST_TEST(keys.find(R"({"key":"loss","points":95,"nan":2,"inf":3,)") != std::string::npos, keys);
    BOOST_TEST(keys.find(R"({"key":"diverged","points":50,"nan":50,"inf":0,)") != std::string::npos, keys);
  }

  // A key past the points it keeps, drawn from its blocks: the first NaN and
  // -Inf of each pixel, as the rows say.
  const fs::path long_file = dir.path / "long.jsonl";
  write_text(long_file, history_rows(0, 70'000));
  LinesIndex blocks(long_file.string(), FileKind::history, 1, 2);
  BOOST_TEST(blocks.refresh());
  const std::string out = answer(blocks, {{"dense"}, XAxis::step, std::nullopt, std::nullopt, 100});
  BOOST_TEST(out.find("\"full\":false") != std::string::npos);
  std::vector<double> nans(100, -1), ninfs(100, -1);
  for (int s = 0; s < 70'000; ++s) {
    std::vector<double>& m = s % 997 == 5 ? nans : s % 1999 == 7 ? ninfs : nans;
    if (s % 997 != 5 && s % 1999 != 7) continue;
    const auto px = std::min<std::size_t>(99, static_cast<std::size_t>(s / 69'999.0 * 100));
    if (m[px] < 0) m[px] = s;
  }
  const auto listed = [](const std::vector<double>& m) {
    std::vector<double> v;
    for (const double x : m)
      if (x >= 0) v.push_back(x);
    return v;
  };
  BOOST_TEST(numbers_after(out, "\"nan\":[", out.find("\"nonfinite\"")) == listed(nans), out);
  BOOST_TEST(numbers_after(out, "\"-inf\":[", out.find("\"nonfinite\"")) == listed(ninfs), out);
  BOOST_TEST(nonfinite_of(out, "dense").find("\"inf\":") == std::string::npos, out);

  // While it is indexed: the overview's NaN for the whole run, and a range
  // read from the file marks what the index marks.
  LinesIndex building(long_file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
  building.hold_indexing(true);
  BOOST_TEST(building.refresh());
  BOOST_TEST(building.state().indexing);
  std::string whole = answer(building, {{"dense"}, XAxis::step, std::nullopt, std::nullopt, 100});
  BOOST_TEST(whole.find("\"overview\":true") != std::string::npos);
  for (const auto& [from, to] : {std::pair{0.0, 3'000.0}, std::pair{29'000.0, 33'000.0}}) {
    const SeriesRequest r{{"dense"}, XAxis::step, from, to, 50};
    const std::string got = answer(building, r), want = answer(blocks, r);
    BOOST_TEST(nonfinite_of(got, "dense") == nonfinite_of(want, "dense"), got << " against " << want);
    BOOST_TEST(nonfinite_of(want, "dense").find("\"nan\":[") != std::string::npos, want);
  }
  building.hold_indexing(false);
  wait_indexed(building);
}

namespace {

/// Rows of a run of two ranks as its writer writes them (a real run's lines:
/// `chorus launch -n 2` of the e2e worker): `loss`, `tokens`, `lo` and `hi`
/// reduced over both ranks, `only0` logged by rank 0 alone and declared
/// `first`. At `short_step`, rank 1's `loss` did not come.
std::string two_rank_rows(int rows, int short_step) {
  std::string h;
  for (int s = 0; s < rows; ++s) {
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":1795902603.712982,"_runtime":0.00795,"hi":)" +
         std::to_string(s + 1) + R"(,"lo":)" + std::to_string(s - 1) + R"(,"loss":)" + std::to_string(s + 1) +
         R"(,"only0":)" + std::to_string(s) + R"(,"per_rank/rank-0":)" + std::to_string(s) +
         R"(,"per_rank/rank-1":)" + std::to_string(1000 + s) + R"(,"tokens":201,"_count":{"hi":2,"lo":2,"loss":)" +
         (s == short_step ? "1" : "2") + R"(,"only0":1,"tokens":2}})" + "\n";
  }
  return h;
}

/// metrics.json of that run, as its writer writes it.
const std::string two_rank_metrics =
    R"({"loss":{"reduce":"mean","summary":"last","step_metric":null},"tokens":{"reduce":"sum","summary":"last","step_metric":null},)"
    R"("lo":{"reduce":"min","summary":"last","step_metric":null},"hi":{"reduce":"max","summary":"last","step_metric":null},)"
    R"("only0":{"reduce":"first","summary":"last","step_metric":null}})";

} // namespace

BOOST_AUTO_TEST_CASE(the_fewest_ranks_of_a_row_leave_out_keys_one_rank_logs_by_design) {
  TempDir dir;
  const fs::path root = fs::canonical(dir.path);
  RunSpec spec;
  spec.id = "two";
  spec.world = 2;
  const fs::path run = make_run(root, "proj", "grp", spec);
  write_text(run / "history.jsonl", two_rank_rows(6, 4));
  chorus::cli::serve::Api api(root.string(), 64u << 20);
  const auto fewest = [&] {
    const chorus::cli::serve::Reply r =
        api.series("proj/grp/two", FileKind::history, {{"_count/min"}, XAxis::step, std::nullopt, std::nullopt, 1000});
    BOOST_TEST(r.status == 200, r.body);
    return series_of(r.body, "_count/min", "\"y\":[");
  };
  // Nothing declared yet: `only0`'s count of 1 is the fewest on every row.
  BOOST_TEST(fewest() == std::vector<double>({1, 1, 1, 1, 1, 1}));
  // Declared `first` (metrics.json as the writer leaves it): only the keys of
  // every rank count, and the row where a rank's loss did not come stands out.
  write_text(run / "metrics.json", two_rank_metrics);
  BOOST_TEST(fewest() == std::vector<double>({2, 2, 2, 2, 1, 2}));
  // Rows appended later are counted the same way.
  {
    std::ofstream f(run / "history.jsonl", std::ios::app);
    const std::string more = two_rank_rows(8, -1);
    f << more.substr(two_rank_rows(6, -1).size());
  }
  BOOST_TEST(fewest() == std::vector<double>({2, 2, 2, 2, 1, 2, 2, 2}));
  // An index being built in the background, and its overview, count the same way.
  LinesIndex index((run / "history.jsonl").string(), FileKind::history, 1u << 20, 2, 1024);
  index.count_ranks(chorus::store::MetricSpecs::read(run.string()));
  index.hold_indexing(true);
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().indexing);
  std::string out = answer(index, {{"_count/min"}, XAxis::step, std::nullopt, std::nullopt, 1000});
  BOOST_TEST(series_of(out, "_count/min", "\"y\":[") == std::vector<double>({2, 2, 2, 2, 1, 2, 2, 2}), out);
  index.hold_indexing(false);
  wait_indexed(index);
  BOOST_TEST(!index.state().indexing);
  out = answer(index, {{"_count/min"}, XAxis::step, std::nullopt, std::nullopt, 1000});
  BOOST_TEST(series_of(out, "_count/min", "\"y\":[") == std::vector<double>({2, 2, 2, 2, 1, 2, 2, 2}), out);
}

BOOST_AUTO_TEST_CASE(an_index_being_built_counts_in_its_memory) {
  TempDir dir;
  const fs::path file = dir.path / "history.jsonl";
  write_text(file, history_rows(0, 70'000));
  LinesIndex plain(file.string(), FileKind::history, never, 1, never);
  BOOST_TEST(plain.refresh());
  const std::size_t whole = plain.memory();
  // Built in the background, on two threads: what it holds counts as it
  // grows, before the index takes the overview's place.
  LinesIndex index(file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
  index.hold_indexing(true);
  BOOST_TEST(index.refresh());
  const std::size_t overview = index.memory();
  BOOST_TEST(overview > 0u);
  index.hold_indexing(false);
  for (int i = 0; i < 6000 && index.memory() < overview + whole / 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  BOOST_TEST(index.memory() >= overview + whole / 2, index.memory() << " of " << overview << " + " << whole);
  BOOST_TEST(index.state().indexing); // not taken in yet
  wait_indexed(index);
  // Taken in: counted once.
  BOOST_TEST(index.memory() >= whole / 2);
  BOOST_TEST(index.memory() <= whole * 3 / 2, index.memory() << " of " << whole);
}

BOOST_AUTO_TEST_CASE(the_runs_indexes_stay_within_the_cache_while_one_is_built) {
  TempDir dir;
  const fs::path root = fs::canonical(dir.path);
  // A history of more than 32 MiB is indexed in the background.
  std::string big;
  for (int s = 0; big.size() < (34u << 20); s += 10'000) big += history_rows(s, s + 10'000);
  RunSpec spec;
  for (const char* id : {"small1", "big", "small2"}) {
    spec.id = id;
    const fs::path run = make_run(root, "proj", "grp", spec);
    write_text(run / "history.jsonl", spec.id == "big" ? big : history_rows(0, 100));
  }
  big.clear();
  big.shrink_to_fit();
  constexpr std::size_t cache = 4u << 20;
  chorus::cli::serve::Api api(root.string(), cache);
  const SeriesRequest r{{"dense"}, XAxis::step, std::nullopt, std::nullopt, 100};
  BOOST_TEST(api.series("proj/grp/small1", FileKind::history, r).status == 200);
  const chorus::cli::serve::Reply first = api.series("proj/grp/big", FileKind::history, r);
  BOOST_TEST(first.body.find("\"overview\":true") != std::string::npos, first.body.substr(0, 300));
  // The index being built grows past the cache: counted before it is whole.
  for (int i = 0; i < 12'000 && api.cached_bytes() <= cache; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  BOOST_TEST(api.cached_bytes() > cache);
  // The next look evicts the runs not in use, the least recently used first,
  // until the indexes fit again.
  BOOST_TEST(api.series("proj/grp/small2", FileKind::history, r).status == 200);
  BOOST_TEST(api.cached_bytes() <= cache, api.cached_bytes());
}

BOOST_AUTO_TEST_CASE(a_long_system_file_is_shown_by_an_overview_and_read_on_as_it_grows) {
  TempDir dir;
  const fs::path file = dir.path / "system.jsonl";
  write_text(file, system_rows(0, 20'000));
  const std::vector<std::string> keys = {"system.proc.rss/rank-1", "system.cpu.percent/node-0"};
  LinesIndex plain(file.string(), FileKind::system, never, 1, never);
  BOOST_TEST(plain.refresh());
  // An overview from 64 KiB on, the index built on two threads, held back for now.
  LinesIndex index(file.string(), FileKind::system, 1u << 20, 2, 1u << 16);
  index.hold_indexing(true);
  BOOST_TEST(index.refresh());
  chorus::cli::serve::IndexState s = index.state();
  BOOST_TEST(s.indexing);
  BOOST_TEST(s.rows > 36'000u, s.rows); // 40,000 samples, estimated from the lines' lengths
  BOOST_TEST(s.rows < 44'000u, s.rows);
  BOOST_TEST(s.last_step == static_cast<std::int64_t>(s.rows) - 1);
  std::string listed;
  index.keys_json(listed);
  for (const char* k : {"\"system.proc.rss/rank-1\"", "\"estimated\":true", "\"first_time\":1.7e+09", "\"last_time\":"})
    BOOST_TEST(listed.find(k) != std::string::npos, k << " in " << listed);
  const std::string whole = answer(index, {keys, XAxis::wall, std::nullopt, std::nullopt, 1000});
  BOOST_TEST(whole.find("\"overview\":true") != std::string::npos, whole.substr(0, 300));
  // A range in time: every sample in it read from the file, the very answer of the index.
  for (const XAxis x : {XAxis::wall, XAxis::rel})
    for (const auto& [from, to] : {std::pair{0.0, 100.0}, std::pair{9'990.0, 10'020.0}, std::pair{19'500.0, 20'000.0}}) {
      const double at = x == XAxis::wall ? 1'700'000'000 : 0;
      const SeriesRequest r{keys, x, at + from, at + to, 1000};
      BOOST_TEST(series_part(index, r) == series_part(plain, r), "from " << from);
    }
  // Samples appended meanwhile are read once the index is whole.
  {
    std::ofstream f(file, std::ios::app);
    f << system_rows(20'000, 20'500);
  }
  BOOST_TEST(!index.refresh());
  BOOST_TEST(index.state().indexing);
  index.hold_indexing(false);
  wait_indexed(index);
  BOOST_TEST(!index.state().indexing);
  BOOST_TEST(plain.refresh());
  BOOST_TEST((everything(index, keys, 1) == everything(plain, keys, 1)));
  BOOST_TEST(index.state().rows == 41'000u);
  // And from then on, only what is appended.
  {
    std::ofstream f(file, std::ios::app);
    f << system_rows(20'500, 21'000);
  }
  BOOST_TEST(index.refresh());
  BOOST_TEST(plain.refresh());
  BOOST_TEST(index.state().rows == 42'000u);
  BOOST_TEST(index.state().bytes == fs::file_size(file));
  BOOST_TEST((everything(index, keys, 1) == everything(plain, keys, 1)));
}
