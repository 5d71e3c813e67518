// Images, texts and tables in TensorBoard's event files: TfEventsWriter's
// Summary.Image and 2-D string tensors, and a run's media.jsonl laid out by
// TensorBoardRun (each rank's under rank-N/, nothing written twice), read
// back by the tests' own reader (tests/upload/tfevents_reader.hpp) against
// files made byte by byte (tests/upload/tfevents_media_files.hpp).
#define BOOST_TEST_MODULE upload_tfevents_media
#include <boost/test/unit_test.hpp>

#include "io/upload/tensorboard_run.hpp"
#include "io/upload/tfevents.hpp"
#include "tests/temp_dir.hpp"
#include "tests/upload/tfevents_media_files.hpp"
#include "tests/upload/tfevents_reader.hpp"

#include <simdjson.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace chorus;
using chorus::test::slurp;
using chorus::test::TempDir;
using namespace chorus::test::tfevents;
using namespace chorus::test::media_files;
using chorus::core::MediaKind;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<upload::TfEventsWriter> make_writer(const std::string& dir) {
  auto w = upload::TfEventsWriter::create(dir, 1700000000.25);
  BOOST_TEST_REQUIRE(w.has_value(), w.error().message());
  return std::move(w).value();
}

/// Hands each line of the run's media.jsonl, read by store::read_media_line, to `tb`.
std::vector<Error> feed_media(upload::TensorBoardRun& tb, const fs::path& run_dir, const upload::KeyPicker& wanted = nullptr) {
  std::vector<Error> problems;
  simdjson::dom::parser parser;
  std::ifstream in(run_dir / "media.jsonl");
  for (std::string text; std::getline(in, text);) {
    simdjson::dom::element e;
    BOOST_TEST_REQUIRE(!parser.parse(text).get(e));
    const Result<store::MediaLine> line = store::read_media_line(e);
    BOOST_TEST_REQUIRE(line.has_value(), text);
    if (Error err = tb.media(*line, run_dir.string(), wanted)) problems.push_back(err);
  }
  return problems;
}

std::vector<std::string> cells_of(const upload::StringTensor& t, std::uint64_t rows, std::uint64_t columns) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  w->table("t", 0, 0, rows, columns, t);
  BOOST_TEST_REQUIRE(!w->close());
  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == 2u);
  return events[1].values.at(0).string_val;
}

} // namespace

// An image is Value.image: the file's bytes as they are, its sides, and the
// colorspace its header says, as TensorFlow's image summaries carry it.
BOOST_AUTO_TEST_CASE(images_round_trip_byte_exact_with_their_colorspace) {
  struct Case {
    std::string name, file;
    int colorspace;
  };
  const Case cases[] = {
      {"png grey", png_file(3, 2, 0), 1},
      {"png rgb", png_file(5, 4, 2), 3},
      {"png palette", png_file(4, 4, 3), 3},
      {"png grey+alpha", png_file(2, 7, 4), 2},
      {"png rgba", png_file(6, 1, 6), 4},
      {"png grey, tRNS", png_file(3, 3, 0, true), 2},
      {"png rgb, tRNS", png_file(3, 3, 2, true), 4},
      {"png palette, tRNS", png_file(3, 3, 3, true), 4},
      {"png over a MiB", png_file(1024, 512, 2), 3},
      {"jpeg grey", jpeg_file(1), 1},
      {"jpeg colour", jpeg_file(3), 3},
      {"neither", std::string("GIF89a\0\0", 8), 3},
  };
  TempDir tmp;
  auto w = make_writer(tmp.str());
  std::int64_t step = 0;
  for (const Case& c : cases) {
    BOOST_TEST(upload::image_colorspace(c.file) == c.colorspace, c.name);
    const auto side = static_cast<std::uint32_t>(step);
    w->image("samples/" + c.name, step, 1700000300.5 + static_cast<double>(step), c.file, 10 + side, 20 + side,
             upload::image_colorspace(c.file));
    ++step;
  }
  BOOST_TEST(!w->close());
  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == std::size(cases) + 1);
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    BOOST_TEST_CONTEXT(cases[i].name) {
      const TbEvent& e = events[i + 1];
      BOOST_TEST(e.step == static_cast<std::int64_t>(i));
      BOOST_TEST(e.wall_time == 1700000300.5 + static_cast<double>(i));
      BOOST_TEST_REQUIRE(e.values.size() == 1u);
      const TbValue& v = e.values[0];
      BOOST_TEST(v.tag == "samples/" + cases[i].name);
      BOOST_TEST(!v.has_metadata); // no caption: TensorBoard keeps a tag's first description only
      BOOST_TEST(!v.has_tensor);
      BOOST_TEST_REQUIRE(v.image.has_value());
      BOOST_TEST(v.image->width == static_cast<std::int64_t>(10 + i));
      BOOST_TEST(v.image->height == static_cast<std::int64_t>(20 + i));
      BOOST_TEST(v.image->colorspace == cases[i].colorspace);
      BOOST_TEST(v.image->encoded.size() == cases[i].file.size());
      BOOST_TEST((v.image->encoded == cases[i].file));
    }
  }
}

// A table is the text plugin's 2-D string tensor: shape [rows, columns],
// its cells row by row.
BOOST_AUTO_TEST_CASE(tables_round_trip_as_the_text_plugins_2d_string_tensors) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  upload::StringTensor cells;
  const std::vector<std::string> want = {"id", "label", "1", "cat", "2", std::string("d\0g|*x*", 7)};
  for (const std::string& c : want) cells.add(c);
  w->table("preds", 4, 1700000400.0, 3, 2, cells);
  w->table("bad", 5, 1700000400.0, 2, 2, cells); // 6 cells are not 2 x 2: nothing written
  w->table("wide", 6, 1700000400.0, 1, 6, cells);
  BOOST_TEST(!w->close());
  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == 3u);
  const TbValue& v = events[1].values.at(0);
  BOOST_TEST(events[1].step == 4);
  BOOST_TEST(v.tag == "preds");
  BOOST_TEST(v.plugin_name == "text");
  BOOST_TEST(v.plugin_content.empty());
  BOOST_TEST(v.dtype == 7);
  BOOST_TEST(v.dim_sizes == (std::vector<std::int64_t>{3, 2}), boost::test_tools::per_element());
  BOOST_TEST(v.string_val == want, boost::test_tools::per_element());
  BOOST_TEST(events[2].values.at(0).tag == "wide");
  BOOST_TEST(events[2].values.at(0).dim_sizes == (std::vector<std::int64_t>{1, 6}), boost::test_tools::per_element());
  BOOST_TEST(cells_of(upload::StringTensor(), 1, 0).empty()); // no columns: shape [1, 0]
}

BOOST_AUTO_TEST_CASE(table_cells_are_the_columns_then_each_row_each_cell_as_json_writes_it) {
  simdjson::dom::parser parser;
  simdjson::dom::element table;
  BOOST_TEST_REQUIRE(!parser.parse(std::string_view(table_json(
                                       R"(["id","label","p","ok","none","extra"])",
                                       R"([[1,"cat",0.1,true,null,[1,{"a":"b"}]],)"
                                       R"([-9223372036854775808,"dög ✓",1e+300,false,null,{}],)"
                                       R"([18446744073709551615,"",-0.0,true,null,"NaN"]])")))
                          .get(table));
  upload::StringTensor cells;
  std::uint64_t rows = 0, columns = 0;
  BOOST_TEST_REQUIRE(!upload::table_cells(table, cells, rows, columns));
  BOOST_TEST(rows == 4u);
  BOOST_TEST(columns == 6u);
  const std::vector<std::string> want = {
      "id", "label", "p", "ok", "none", "extra",                          //
      "1", "cat", "0.1", "true", "", R"([1,{"a":"b"}])",                 //
      "-9223372036854775808", "dög ✓", "1e+300", "false", "", "{}",     //
      "18446744073709551615", "", "-0.0", "true", "", "NaN"};
  BOOST_TEST(cells_of(cells, rows, columns) == want, boost::test_tools::per_element());

  for (const char* bad : {R"({"columns":["a"]})", R"({"columns":["a","b"],"data":[[1,2],[3]]})",
                          R"({"columns":["a"],"data":[5]})", R"([1,2])"}) {
    BOOST_TEST_REQUIRE(!parser.parse(std::string_view(bad)).get(table));
    upload::StringTensor none;
    BOOST_TEST((upload::table_cells(table, none, rows, columns).code() == Errc::invalid_argument), bad);
  }
}

// A run's media: an image, a text and a table of its ranks, each in rank-N/
// under its key at its step and time, byte for byte; a TensorBoardRun that
// resumes writes what the files hold no second time.
BOOST_AUTO_TEST_CASE(a_runs_media_go_to_their_ranks_once_each) {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  std::map<TagStep, std::string> files; // what each event should hold
  for (int step = 0; step < 3; ++step) {
    const std::string png = png_file(4, 3 + static_cast<std::uint32_t>(step), 6), jpeg = jpeg_file(1);
    add_media(run, step, "samples", 0, MediaKind::image, "png", png, "a cat", 4, 3 + static_cast<std::uint32_t>(step));
    add_media(run, step, "samples", 1, MediaKind::image, "jpeg", jpeg, "", 8, 8);
    const std::string md = "## step " + std::to_string(step) + "\nloss **down** ✓";
    add_media(run, step, "notes", 1, MediaKind::text, "md", md);
    files[{"rank-0", "samples", step}] = png;
    files[{"rank-1", "samples", step}] = jpeg;
    files[{"rank-1", "notes", step}] = md;
  }
  add_media(run, 2, "preds", 0, MediaKind::table, "json", table_json(R"(["id","ok"])", R"([[1,true],[2,false]])"));

  const fs::path out = tmp.path / "tb";
  {
    upload::TensorBoardRun tb(out.string());
    tb.world_size(4);
    BOOST_TEST(feed_media(tb, run).empty());
    BOOST_TEST(!tb.close());
    BOOST_TEST(tb.media_files() == 10u);
  }
  auto got = values_under(out);
  BOOST_TEST(got.size() == 10u);
  for (const auto& [at, bytes] : files) {
    BOOST_TEST_CONTEXT(std::get<0>(at) << " " << std::get<1>(at) << " at " << std::get<2>(at)) {
      BOOST_TEST_REQUIRE(got[at].size() == 1u);
      const auto& [e, v] = got[at].front();
      BOOST_TEST(e.wall_time == 1'700'000'000.0 + 0.25 * static_cast<double>(std::get<2>(at)) +
                                    (std::get<0>(at) == "rank-1" ? 0.001 : 0.0),
                 boost::test_tools::tolerance(1e-9));
      if (std::get<1>(at) == "samples") {
        BOOST_TEST_REQUIRE(v.image.has_value());
        BOOST_TEST((v.image->encoded == bytes));
        BOOST_TEST(v.image->width == (std::get<0>(at) == "rank-0" ? 4 : 8));
        BOOST_TEST(v.image->height == (std::get<0>(at) == "rank-0" ? 3 + std::get<2>(at) : 8));
        BOOST_TEST(v.image->colorspace == (std::get<0>(at) == "rank-0" ? 4 : 1));
      } else {
        BOOST_TEST(v.plugin_name == "text");
        BOOST_TEST(v.shape_dims == 0);
        BOOST_TEST(v.string_val == std::vector<std::string>{bytes}, boost::test_tools::per_element());
      }
    }
  }
  const TbValue& table = got[{"rank-0", "preds", 2}].at(0).second;
  BOOST_TEST(table.dim_sizes == (std::vector<std::int64_t>{3, 2}), boost::test_tools::per_element());
  BOOST_TEST(table.string_val == (std::vector<std::string>{"id", "ok", "1", "true", "2", "false"}),
             boost::test_tools::per_element());

  // Written again from the start (lost offsets), with a step more: only that step is new.
  add_media(run, 3, "notes", 1, MediaKind::text, "md", "later");
  {
    upload::TensorBoardRun tb(out.string());
    tb.world_size(4);
    BOOST_TEST_REQUIRE(!tb.resume());
    BOOST_TEST(feed_media(tb, run).empty());
    BOOST_TEST(!tb.close());
    BOOST_TEST(tb.media_files() == 1u);
  }
  got = values_under(out);
  BOOST_TEST(got.size() == 11u);
  for (const auto& [at, events] : got) BOOST_TEST(events.size() == 1u, std::get<1>(at) << " at " << std::get<2>(at));
  const TagStep later{"rank-1", "notes", 3};
  BOOST_TEST(got[later].at(0).second.string_val.at(0) == "later");
}

// A run of one rank keeps its media beside its scalars, under their keys;
// --metric's picker takes a media column as it takes a key's.
BOOST_AUTO_TEST_CASE(a_run_of_one_rank_keeps_its_media_in_its_own_files_and_wanted_picks_columns) {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  add_media(run, 0, "samples", 0, MediaKind::image, "png", png_file(2, 2, 0), "", 2, 2);
  add_media(run, 0, "notes", 0, MediaKind::text, "md", "hi");
  upload::TensorBoardRun one((tmp.path / "one").string());
  BOOST_TEST(feed_media(one, run).empty());
  BOOST_TEST(!one.close());
  const auto got = values_under(tmp.path / "one");
  BOOST_TEST(got.size() == 2u);
  BOOST_TEST(got.count({"", "samples", 0}) == 1u);
  BOOST_TEST(got.count({"", "notes", 0}) == 1u);

  upload::TensorBoardRun picked((tmp.path / "picked").string());
  picked.world_size(2);
  BOOST_TEST(feed_media(picked, run, [](std::string_view column) { return column == "notes/rank-0"; }).empty());
  BOOST_TEST(!picked.close());
  const auto only = values_under(tmp.path / "picked");
  BOOST_TEST(only.size() == 1u);
  BOOST_TEST(only.count({"rank-0", "notes", 0}) == 1u);
}

// A file that is missing, of another size than its line says, or not what
// its kind is, is an error naming it; nothing of it is written, and the
// media after it are.
BOOST_AUTO_TEST_CASE(a_media_file_unlike_its_line_is_an_error_naming_it) {
  TempDir tmp;
  const fs::path run = tmp.path / "run";
  const std::string gone = add_media(run, 0, "gone", 0, MediaKind::text, "md", "x");
  fs::remove(run / gone);
  const std::string cut = add_media(run, 0, "cut", 0, MediaKind::image, "png", png_file(2, 2, 2), "", 2, 2);
  fs::resize_file(run / cut, 20);
  const std::string noise = add_media(run, 0, "noise", 0, MediaKind::image, "png", "not an image at all", "", 2, 2);
  const std::string table =
      add_media(run, 0, "table", 0, MediaKind::table, "json", R"({"columns":["a"],"data":[[1,2]]})");
  add_media(run, 0, "fine", 0, MediaKind::text, "md", "still here");
  upload::TensorBoardRun tb((tmp.path / "tb").string());
  const std::vector<Error> problems = feed_media(tb, run);
  BOOST_TEST(!tb.close());
  BOOST_TEST_REQUIRE(problems.size() == 4u);
  BOOST_TEST(problems[0].message().find("the text " + (run / gone).string() + " is missing: it is left out") !=
                 std::string::npos, problems[0].message());
  BOOST_TEST(problems[1].message().find((run / cut).string() + " is 20 bytes, but media.jsonl says") !=
                 std::string::npos, problems[1].message());
  BOOST_TEST(problems[2].message().find((run / noise).string() + " is no image") != std::string::npos,
             problems[2].message());
  BOOST_TEST(problems[3].message().find("row 0 that is not an array of 1 cells") != std::string::npos,
             problems[3].message());
  for (const Error& e : problems) BOOST_TEST(e.message().find("chorus recover") != std::string::npos, e.message());
  const auto got = values_under(tmp.path / "tb");
  BOOST_TEST(got.size() == 1u);
  BOOST_TEST(got.count({"", "fine", 0}) == 1u);
  BOOST_TEST(tb.media_files() == 1u);
}
