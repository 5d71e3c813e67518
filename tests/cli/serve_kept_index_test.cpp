// `chorus serve`'s kept indexes (cli/serve/index_store.hpp, lines_store.cpp):
// the index of a long history, built in the background, is kept on disk; a
// server opening the file again takes it at once, with the very answers of
// the index it kept, and reads only the lines appended since; as the file
// grows by as much again, it is kept again. A kept index that is not the
// file's (damaged, cut, the file replaced, rewritten, grown too much, other
// declarations) is refused and the file indexed afresh, then kept anew. A
// directory others may write keeps nothing; the directory keeps within its bound.
#define BOOST_TEST_MODULE cli_serve_kept_index
#include <boost/test/unit_test.hpp>

#include "cli/serve/index_store.hpp"
#include "cli/serve/lines_index.hpp"
#include "io/store/metric_specs.hpp"
#include "tests/cli/process.hpp"
#include "tests/cli/serve_index_rows.hpp"
#include "tests/temp_dir.hpp"

#include <sys/stat.h>

#include <fstream>

using namespace chorus::test;
using chorus::cli::serve::FileKind;
using chorus::cli::serve::IndexStore;
using chorus::cli::serve::LinesIndex;
using chorus::cli::serve::XAxis;
namespace fs = std::filesystem;

namespace {

/// A history of 30,000 rows (about 4 MiB): an overview from 64 KiB on, its
/// index built in the background on two threads.
struct Run {
  TempDir dir;
  fs::path file = dir.path / "history.jsonl";
  std::shared_ptr<IndexStore> store;

  Run() {
    write_text(file, history_rows(0, 30'000));
    fs::create_directory(dir.path / "kept", dir.path);
    fs::permissions(dir.path / "kept", fs::perms::owner_all);
    store = std::make_shared<IndexStore>((dir.path / "kept").string(), 1ull << 30);
    BOOST_TEST_REQUIRE(store->usable(), store->why());
  }

  /// An index of the file as a server opening it makes one; `hold`: its
  /// background indexing, where it starts one, held back.
  std::unique_ptr<LinesIndex> open(bool hold) const {
    auto index = std::make_unique<LinesIndex>(file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
    index->keep_in(store);
    index->hold_indexing(hold);
    index->refresh();
    return index;
  }

  /// Opens the file, lets its index be built, and waits until it is kept.
  std::unique_ptr<LinesIndex> built() const {
    auto index = open(false);
    wait_indexed(*index);
    store->flush();
    return index;
  }

  [[nodiscard]] fs::path kept() const {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(dir.path / "kept")) found.push_back(e.path());
    BOOST_TEST_REQUIRE(found.size() == 1u);
    return found[0];
  }

  void append(int first, int last) const {
    std::ofstream f(file, std::ios::app);
    f << history_rows(first, last);
  }
};

/// Every answer of `index`, as they are: its state, its keys, and series of
/// every kind of key against each x, whole (from blocks and from points) and zoomed.
std::string answers(const LinesIndex& index) {
  const chorus::cli::serve::IndexState s = index.state();
  std::string out = std::to_string(s.rows) + " " + std::to_string(s.skipped) + " " + s.first_skipped + " " +
                    std::to_string(s.bytes) + " " + std::to_string(s.last_step) + " " + std::to_string(s.keys) + " " +
                    std::to_string(s.indexing) + (s.problem ? " " + s.problem.message() : "") + "\n";
  index.keys_json(out);
  const std::vector<std::string> keys = {"dense", "sparse", "c/rank-2", "_progress/rank-2", "_count/min", "_step"};
  for (const XAxis x : {XAxis::step, XAxis::wall, XAxis::rel})
    for (const std::size_t width : {40u, 700u, 5000u}) {
      out += "\n";
      index.series_json({keys, x, std::nullopt, std::nullopt, width}, out);
    }
  for (const auto& [from, to] : {std::pair{100.0, 25'000.0}, std::pair{12'000.0, 12'400.0}}) {
    out += "\n";
    index.series_json({keys, XAxis::step, from, to, 600}, out);
  }
  out += "\n";
  index.series_json({{"dense"}, XAxis::step, std::nullopt, std::nullopt, 300, "sparse"}, out);
  return out;
}

/// Whether a server opening the file now takes a kept index (else it starts an overview).
bool taken(const Run& run) { return !run.open(true)->state().indexing; }

} // namespace

BOOST_AUTO_TEST_CASE(a_long_history_opened_again_takes_its_kept_index) {
  const Run run;
  const auto first = run.built();
  BOOST_TEST(!first->state().indexing);
  BOOST_TEST(fs::file_size(run.kept()) > 1000u);
  BOOST_TEST(((fs::status(run.kept()).permissions() & (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none));

  // Opened again: whole at once, every answer the one of the index it kept.
  const auto again = run.open(true);
  BOOST_TEST(!again->state().indexing);
  BOOST_TEST(again->state().rows == 30'000u);
  BOOST_TEST(answers(*again) == answers(*first));

  // Lines appended since: read on from where the kept index ends, the same as the one that saw them come.
  run.append(30'000, 30'500);
  BOOST_TEST(first->refresh());
  BOOST_TEST(again->refresh());
  BOOST_TEST(again->state().rows == 30'500u);
  BOOST_TEST(answers(*again) == answers(*first));
  const auto third = run.open(true);
  BOOST_TEST(!third->state().indexing);
  BOOST_TEST(answers(*third) == answers(*first));
}

BOOST_AUTO_TEST_CASE(a_kept_index_is_kept_again_as_the_file_grows_by_as_much) {
  const Run run;
  const auto index = run.built();
  const auto size = fs::file_size(run.kept());
  // 100 KiB more (a long file is 64 KiB here): too much to read on from the kept index...
  run.append(30'000, 31'000);
  BOOST_TEST(!taken(run));
  // ...until the index that followed the file keeps itself again.
  BOOST_TEST(index->refresh());
  run.store->flush();
  BOOST_TEST(fs::file_size(run.kept()) > size);
  const auto again = run.open(true);
  BOOST_TEST(!again->state().indexing);
  BOOST_TEST(answers(*again) == answers(*index));
}

BOOST_AUTO_TEST_CASE(a_kept_index_that_is_not_the_files_is_refused_and_made_anew) {
  const Run run;
  const auto first = run.built();
  const std::string want = answers(*first);
  const std::string good = read_text(run.kept());
  BOOST_TEST_REQUIRE(taken(run));

  // Damaged (a byte changed, cut short, empty, another kind of file): refused, the file indexed afresh.
  for (int how = 0; how < 4; ++how) {
    std::string bad = good;
    if (how == 0) bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x20);
    if (how == 1) bad.resize(bad.size() - 100);
    if (how == 2) bad.clear();
    if (how == 3) bad = history_rows(0, 10);
    write_text(run.kept(), bad);
    BOOST_TEST(!taken(run), "damaged " << how);
  }
  // Indexed afresh, then kept anew: taken again, with the same answers.
  const auto rebuilt = run.built();
  BOOST_TEST(answers(*rebuilt) == want);
  BOOST_TEST(read_text(run.kept()) != std::string());
  BOOST_TEST(taken(run));
  BOOST_TEST(answers(*run.open(true)) == want);

  // A kept file others may write is not trusted.
  fs::permissions(run.kept(), fs::perms::group_write, fs::perm_options::add);
  BOOST_TEST(!taken(run));
  fs::permissions(run.kept(), fs::perms::group_write, fs::perm_options::remove);
  BOOST_TEST(taken(run));

  // Declarations that change what the index holds (`dense` declared `first`: left out of `_count/min`).
  {
    auto index = std::make_unique<LinesIndex>(run.file.string(), FileKind::history, 1u << 20, 2, 1u << 16);
    index->keep_in(run.store);
    chorus::store::MetricSpecs specs;
    chorus::store::MetricSpec first;
    first.reduce = chorus::Reduce::first;
    specs.specs.emplace_back("dense", first);
    index->count_ranks(chorus::Result<chorus::store::MetricSpecs>(specs));
    index->hold_indexing(true);
    index->refresh();
    BOOST_TEST(index->state().indexing);
  }

  // The file rewritten in place, its length the same: its last line differs.
  {
    std::string text = read_text(run.file);
    const std::size_t at = text.rfind("\"_runtime\":") + 11;
    text[at] = text[at] == '1' ? '2' : '1';
    std::fstream f(run.file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(text[at]);
  }
  BOOST_TEST(!taken(run));

  // The file replaced by another (chorus recover rewrites it), however alike.
  const auto rekept = run.built();
  BOOST_TEST(taken(run));
  fs::copy_file(run.file, run.dir.path / "copy.jsonl");
  fs::rename(run.dir.path / "copy.jsonl", run.file);
  BOOST_TEST(!taken(run));
}

BOOST_AUTO_TEST_CASE(a_directory_others_may_write_keeps_nothing) {
  TempDir dir;
  fs::create_directory(dir.path / "kept");
  fs::permissions(dir.path / "kept", fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                         fs::perms::others_read | fs::perms::others_exec);
  const IndexStore open_to_others((dir.path / "kept").string(), 1u << 30);
  BOOST_TEST(!open_to_others.usable());
  BOOST_TEST(open_to_others.why().find("chmod 700") != std::string::npos, open_to_others.why());
  const IndexStore relative("kept", 1u << 30);
  BOOST_TEST(!relative.usable());
  BOOST_TEST(relative.why().find("absolute") != std::string::npos, relative.why());

  // Made where missing, closed to others.
  const IndexStore made((dir.path / "a" / "b").string(), 1u << 30);
  BOOST_TEST(made.usable(), made.why());
  BOOST_TEST(((fs::status(dir.path / "a" / "b").permissions() & fs::perms::mask) == fs::perms::owner_all));

  // An index with a store that cannot be used is built, and answers, as without one.
  write_text(dir.path / "history.jsonl", history_rows(0, 20'000));
  auto store = std::make_shared<IndexStore>((dir.path / "kept").string(), 1u << 30);
  LinesIndex index((dir.path / "history.jsonl").string(), FileKind::history, 1u << 20, 2, 1u << 16);
  index.keep_in(store);
  BOOST_TEST(index.refresh());
  wait_indexed(index);
  LinesIndex plain((dir.path / "history.jsonl").string(), FileKind::history, 1u << 20, 2, 1u << 16);
  BOOST_TEST(plain.refresh());
  wait_indexed(plain);
  BOOST_TEST(answers(index) == answers(plain));
  BOOST_TEST(fs::is_empty(dir.path / "kept"));
}

BOOST_AUTO_TEST_CASE(the_directory_keeps_within_its_bound_the_least_recently_used_going_first) {
  TempDir dir;
  IndexStore store((dir.path / "kept").string(), 2500);
  const std::string a = store.file_for("/runs/a/history.jsonl", FileKind::history);
  const std::string b = store.file_for("/runs/b/history.jsonl", FileKind::history);
  const std::string c = store.file_for("/runs/a/history.jsonl", FileKind::system);
  BOOST_TEST(a != b);
  BOOST_TEST(a != c);
  store.put(a, std::string(1000, 'a'));
  store.flush();
  store.put(b, std::string(1000, 'b'));
  store.flush();
  // `a` read since: `b` is the least recently used.
  BOOST_TEST(store.read(a).bytes() == std::string(1000, 'a'));
  store.put(c, std::string(1000, 'c'));
  store.flush();
  BOOST_TEST(fs::exists(a));
  BOOST_TEST(!fs::exists(b));
  BOOST_TEST(fs::exists(c));
  BOOST_TEST(store.read(b).bytes().empty());
  // Written whole: no temporary file is left.
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path / "kept")) ++files;
  BOOST_TEST(files == 2u);
}
