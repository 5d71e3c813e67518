// `chorus serve`'s index of a run's media.jsonl (cli/serve/media_index.hpp):
// per key its kind, ranks and steps, per step and rank the file its line
// names; lines appended are taken, a line being written once it is whole; a
// damaged line, a path out of media/, a format that does not go with its kind
// and a key of another kind are skipped with their reason; a file replaced or
// cut is read afresh.
#define BOOST_TEST_MODULE cli_serve_media_index
#include <boost/test/unit_test.hpp>

#include "cli/serve/media_index.hpp"
#include "tests/cli/serve_media_run.hpp"

#include <simdjson.h>

using namespace chorus::test;
using chorus::cli::serve::IndexState;
using chorus::cli::serve::MediaFile;
using chorus::cli::serve::MediaIndex;
using chorus::core::MediaKind;
namespace fs = std::filesystem;

namespace {

/// What the index writes, parsed: keys_json's array, or key_json's object.
struct Written {
  std::string text;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  void parse() { BOOST_REQUIRE_MESSAGE(parser.parse(text).get(doc) == simdjson::SUCCESS, "not JSON: " << text); }
};

void keys_of(const MediaIndex& index, Written& out) {
  chorus::core::JsonWriter w(out.text);
  index.keys_json(w);
  out.parse();
}

/// key_json's answer for `key` at `step`; false where the index has no such key.
bool key_of(const MediaIndex& index, const std::string& key, std::optional<std::int64_t> step, Written& out) {
  chorus::core::JsonWriter w(out.text);
  w.begin_object();
  if (!index.key_json(key, step, "proj/grp/r 1", w)) return false;
  w.end_object();
  out.parse();
  return true;
}

std::vector<std::int64_t> ints(simdjson::dom::element e) {
  std::vector<std::int64_t> out;
  for (simdjson::dom::element x : simdjson::dom::array(e)) out.push_back(std::int64_t(x));
  return out;
}

/// samples: an image of ranks 0 and 1 at steps 0, 10 and 20; notes: text of
/// rank 0 at steps 0 and 20; preds: a table of rank 1 at step 10.
std::string three_keys() {
  std::string lines;
  for (std::int64_t step : {0, 10, 20}) {
    for (int rank : {0, 1})
      lines += media_line({.key = "samples", .rank = rank, .step = step, .data = std::string(50 + rank, 'p'),
                           .caption = "step " + std::to_string(step), .width = 8, .height = 4});
    if (step != 10) lines += media_line({.key = "notes", .step = step, .kind = MediaKind::text, .format = "md", .data = "# hi"});
    else lines += media_line({.key = "preds", .rank = 1, .step = step, .kind = MediaKind::table, .format = "json", .data = "{}"});
  }
  return lines;
}

} // namespace

BOOST_AUTO_TEST_CASE(media_lines_are_indexed_per_key_step_and_rank) {
  TempDir dir;
  write_text(dir.path / "media.jsonl", three_keys());
  MediaIndex index((dir.path / "media.jsonl").string());
  BOOST_TEST(index.refresh());
  const IndexState s = index.state();
  BOOST_TEST(s.rows == 9u);
  BOOST_TEST(s.skipped == 0u);
  BOOST_TEST(s.keys == 3u);
  BOOST_TEST(s.last_step == 20);
  BOOST_TEST(!s.missing);

  Written keys;
  keys_of(index, keys);
  BOOST_TEST_INFO(keys.text);
  const simdjson::dom::array list = keys.doc;
  BOOST_REQUIRE_EQUAL(list.size(), 3u);
  // Sorted by key: notes, preds, samples.
  BOOST_TEST(std::string_view(list.at(0)["key"]) == "notes");
  BOOST_TEST(std::string_view(list.at(0)["kind"]) == "text");
  BOOST_TEST(ints(list.at(0)["ranks"]) == std::vector<std::int64_t>{0}, boost::test_tools::per_element());
  BOOST_TEST(std::string_view(list.at(1)["kind"]) == "table");
  BOOST_TEST(ints(list.at(1)["ranks"]) == std::vector<std::int64_t>{1}, boost::test_tools::per_element());
  BOOST_TEST(std::string_view(list.at(2)["kind"]) == "image");
  BOOST_TEST(ints(list.at(2)["ranks"]) == (std::vector<std::int64_t>{0, 1}), boost::test_tools::per_element());
  BOOST_TEST(std::int64_t(list.at(2)["steps"]) == 3);
  BOOST_TEST(std::int64_t(list.at(2)["entries"]) == 6);
  BOOST_TEST(std::int64_t(list.at(2)["last_step"]) == 20);

  // The last step by default: an entry per rank, with the address of its file.
  Written last;
  BOOST_REQUIRE(key_of(index, "samples", std::nullopt, last));
  BOOST_TEST_INFO(last.text);
  BOOST_TEST(ints(last.doc["steps"]) == (std::vector<std::int64_t>{0, 10, 20}), boost::test_tools::per_element());
  BOOST_TEST(std::int64_t(last.doc["at"]) == 20);
  const simdjson::dom::array entries = last.doc["entries"];
  BOOST_REQUIRE_EQUAL(entries.size(), 2u);
  for (int rank : {0, 1}) {
    const simdjson::dom::element e = entries.at(static_cast<std::size_t>(rank));
    BOOST_TEST(std::int64_t(e["rank"]) == rank);
    BOOST_TEST(std::int64_t(e["step"]) == 20);
    BOOST_TEST(std::string_view(e["caption"]) == "step 20");
    BOOST_TEST(std::int64_t(e["width"]) == 8);
    BOOST_TEST(std::int64_t(e["height"]) == 4);
    BOOST_TEST(std::int64_t(e["size"]) == 50 + rank);
    BOOST_TEST(std::string_view(e["url"]) ==
               "/api/media/file?run=proj%2Fgrp%2Fr%201&key=samples&step=20&rank=" + std::to_string(rank));
  }
  // A step between two: the last at or before it; before the first: the first.
  for (const auto& [asked, at] : std::vector<std::pair<std::int64_t, std::int64_t>>{{10, 10}, {15, 10}, {99, 20}, {0, 0}}) {
    Written w;
    BOOST_REQUIRE(key_of(index, "samples", asked, w));
    BOOST_TEST(std::int64_t(w.doc["at"]) == at, "step " << asked);
  }
  Written notes;
  BOOST_REQUIRE(key_of(index, "notes", 5, notes));
  BOOST_TEST(std::int64_t(notes.doc["at"]) == 0);
  BOOST_TEST(simdjson::dom::array(notes.doc["entries"]).size() == 1u);
  BOOST_TEST(notes.doc["entries"].at(0)["width"].error() == simdjson::NO_SUCH_FIELD); // an image's only
  Written none;
  BOOST_TEST(!key_of(index, "nosuch", std::nullopt, none));
  BOOST_TEST(none.text == "{"); // nothing but the object it was asked into

  // The file of a step of a rank: only one that a line names.
  const std::optional<MediaFile> f = index.file("samples", 10, 1);
  BOOST_REQUIRE(f);
  BOOST_TEST(f->path == media_file_path({.key = "samples", .rank = 1, .step = 10}));
  BOOST_TEST(f->type == "image/png");
  BOOST_TEST(f->size == 51u);
  BOOST_TEST(index.file("notes", 20, 0)->type == "text/markdown; charset=utf-8");
  BOOST_TEST(index.file("preds", 10, 1)->type == "application/json");
  BOOST_TEST(!index.file("samples", 10, 2));
  BOOST_TEST(!index.file("samples", 11, 0));
  BOOST_TEST(!index.file("notes", 10, 0));
  BOOST_TEST(!index.file("../run.json", 0, 0));
  BOOST_TEST(index.memory() > 0u);
}

BOOST_AUTO_TEST_CASE(lines_appended_are_taken_and_a_line_being_written_once_it_is_whole) {
  TempDir dir;
  const fs::path file = dir.path / "media.jsonl";
  MediaIndex index(file.string());
  BOOST_TEST(!index.refresh()); // no media.jsonl yet
  BOOST_TEST(index.state().missing);
  write_text(file, media_line({.key = "img", .step = 0, .width = 2, .height = 2}));
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().rows == 1u);
  BOOST_TEST(!index.refresh()); // nothing new

  // A line being written: not taken until its newline is there.
  const std::string next = media_line({.key = "img", .step = 1, .width = 2, .height = 2});
  append_text(file, next.substr(0, next.size() / 2));
  index.refresh();
  BOOST_TEST(index.state().rows == 1u);
  BOOST_TEST(index.state().unfinished);
  BOOST_TEST(index.state().skipped == 0u);
  BOOST_TEST(!index.file("img", 1, 0));
  append_text(file, next.substr(next.size() / 2));
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().rows == 2u);
  BOOST_TEST(!index.state().unfinished);
  BOOST_TEST(index.state().last_step == 1);
  BOOST_TEST(index.file("img", 1, 0).has_value());

  // A new key and a new rank, appended.
  append_text(file, media_line({.key = "img", .rank = 3, .step = 1, .width = 2, .height = 2}) +
                        media_line({.key = "log", .step = 2, .kind = MediaKind::text, .format = "md", .data = "x"}));
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().keys == 2u);
  Written w;
  BOOST_REQUIRE(key_of(index, "img", std::nullopt, w));
  BOOST_TEST(ints(w.doc["ranks"]) == (std::vector<std::int64_t>{0, 3}), boost::test_tools::per_element());
  BOOST_TEST(simdjson::dom::array(w.doc["entries"]).size() == 2u);

  // A step of a rank named again (a run recovered) takes the later line's file.
  append_text(file, media_line({.key = "img", .step = 1, .data = "longer", .caption = "again", .width = 2, .height = 2}));
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.file("img", 1, 0)->size == 6u);
  Written again;
  BOOST_REQUIRE(key_of(index, "img", 1, again));
  BOOST_TEST(simdjson::dom::array(again.doc["entries"]).size() == 2u);
  BOOST_TEST(std::string_view(again.doc["entries"].at(0)["caption"]) == "again");
}

BOOST_AUTO_TEST_CASE(bad_lines_are_skipped_with_their_reason) {
  TempDir dir;
  const fs::path file = dir.path / "media.jsonl";
  const std::string good = media_line({.key = "img", .step = 0, .width = 2, .height = 2});
  std::string traversal = media_line({.key = "evil", .step = 0, .width = 2, .height = 2});
  traversal.replace(traversal.find("media/"), std::string("media/").size(), "media/../../");
  std::string html = media_line({.key = "page", .step = 0, .kind = MediaKind::text, .format = "md"});
  html.replace(html.find("\"md\""), 4, "\"html\"");
  write_text(file, good + "{\"_step\": oops}\n" + traversal + html +
                       media_line({.key = "img", .step = 1, .kind = MediaKind::text, .format = "md"}) + good);
  MediaIndex index(file.string());
  index.refresh();
  const IndexState s = index.state();
  BOOST_TEST(s.rows == 2u);
  BOOST_TEST(s.skipped == 4u);
  BOOST_TEST_INFO(s.first_skipped);
  BOOST_TEST(s.first_skipped.starts_with("line 2: "));
  // Each reason, the first line alone at a time.
  for (const auto& [line, why] : std::vector<std::pair<std::string, std::string>>{
           {traversal, "has no path under media/"},
           {html, "format 'html'"},
           {good + media_line({.key = "img", .step = 1, .kind = MediaKind::text, .format = "md"}), "holds image, this line text"}}) {
    TempDir one;
    write_text(one.path / "media.jsonl", line);
    MediaIndex i((one.path / "media.jsonl").string());
    i.refresh();
    BOOST_TEST(i.state().skipped == 1u);
    BOOST_TEST(contains(i.state().first_skipped, why), i.state().first_skipped);
  }
  BOOST_TEST(!index.file("evil", 0, 0));
  BOOST_TEST(!index.file("page", 0, 0));
  BOOST_TEST(index.file("img", 0, 0).has_value());
  BOOST_TEST(!index.file("img", 1, 0));
}

BOOST_AUTO_TEST_CASE(a_file_replaced_or_cut_is_read_afresh) {
  TempDir dir;
  const fs::path file = dir.path / "media.jsonl";
  write_text(file, three_keys());
  MediaIndex index(file.string());
  index.refresh();
  BOOST_TEST(index.state().keys == 3u);
  // Cut to its first line: what was taken is forgotten.
  write_text(file, media_line({.key = "samples", .step = 0, .width = 8, .height = 4}));
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().rows == 1u);
  BOOST_TEST(index.state().keys == 1u);
  BOOST_TEST(!index.file("notes", 0, 0));
  // Gone: nothing.
  fs::remove(file);
  BOOST_TEST(index.refresh());
  BOOST_TEST(index.state().missing);
  BOOST_TEST(index.state().keys == 0u);
  BOOST_TEST(!index.file("samples", 0, 0));
}
