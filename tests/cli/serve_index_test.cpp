// `chorus serve`'s index of a history or system file (cli/serve/lines_index.hpp):
// reading the file in pieces on several threads gives the very index one
// plain read gives, damaged lines, a line being written, keys that come and
// go and the 65,536-point limit included; the index follows the file as it
// grows, and starts over where it is replaced or cut. A long history is
// shown by an overview while its index is built in the background: ranges
// are answered from the file as the index answers them, and the index, once
// built, is the one a plain read gives.
#define BOOST_TEST_MODULE cli_serve_index
#include <boost/test/unit_test.hpp>

#include "cli/serve/lines_index.hpp"
#include "tests/cli/process.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

using namespace chorus::test;
using chorus::cli::serve::FileKind;
using chorus::cli::serve::LinesIndex;
using chorus::cli::serve::SeriesRequest;
using chorus::cli::serve::XAxis;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();

/// History rows [first, last): `dense` every row (NaN and infinities now and
/// then), `sparse` every 7th, a per-rank column for 3 ranks (rank 2 only on
/// even steps), `_count`, and a damaged line every 5,000 rows.
std::string history_rows(int first, int last) {
  std::string h;
  for (int s = first; s < last; ++s) {
    if (s % 5000 == 2500) h += s % 10000 == 2500 ? "{\"_step\": oops}\n" : "{\"no_step\": 1}\n";
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s * 0.5) +
         R"(,"_runtime":)" + std::to_string(s * 0.5) + R"(,"dense":)";
    h += s % 997 == 5 ? "\"NaN\"" : s % 1999 == 7 ? "\"-Infinity\"" : std::to_string(std::sin(s * 0.001) + (s % 13) * 0.01);
    if (s % 7 == 0) h += R"(,"sparse":)" + std::to_string(s * 0.25);
    for (int r = 0; r < 3; ++r)
      if (r < 2 || s % 2 == 0) h += ",\"c/rank-" + std::to_string(r) + "\":" + std::to_string(s + r);
    h += R"(,"_count":{"dense":)" + std::string(s % 2 == 0 ? "3" : "2") + "}}\n";
  }
  return h;
}

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

namespace {

/// The answer's points from its "series" on, without each key's counts of
/// NaN and infinities over the whole file (the index's, not the range's).
std::string series_part(const LinesIndex& index, const chorus::cli::serve::SeriesRequest& r) {
  std::string out;
  index.series_json(r, out);
  const auto at = out.find("\"series\"");
  out = at == std::string::npos ? out : out.substr(at);
  for (std::size_t p; (p = out.find(",\"nan\":")) != std::string::npos;) {
    const std::size_t end = out.find('}', p);
    out.erase(p, end - p);
  }
  for (std::size_t p; (p = out.find(",\"missing\":true")) != std::string::npos;) out.erase(p, 15);
  return out;
}

/// Refreshes `index` until its background indexing is over (a minute at most).
void wait_indexed(LinesIndex& index) {
  for (int i = 0; i < 6000 && index.state().indexing; ++i) {
    index.refresh();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  index.refresh();
}

} // namespace

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
