// `chorus serve`'s images, text and tables over HTTP, against a real server
// (tests/cli/serve_client.hpp): the keys of media.jsonl, a key's steps and
// a step's entries, each file with its Content-Type (text sent as every
// answer made per request is, images as they are), behind the token; only files that a line
// names are served (no path from the request, no link out of media/), a
// damaged line is reported on the run; lines appended reach the event stream.
#define BOOST_TEST_MODULE cli_serve_media
#include <boost/test/unit_test.hpp>

#include "tests/cli/run_files.hpp"
#include "tests/cli/serve_client.hpp"
#include "tests/cli/serve_media_run.hpp"

using namespace chorus::test;
using chorus::core::MediaKind;
namespace fs = std::filesystem;

namespace {

/// Bytes that start as a PNG file does: the server hands them out as they are.
std::string png_bytes(int seed) {
  std::string b = "\x89PNG\r\n\x1a\n";
  for (int i = 0; i < 300; ++i) b.push_back(static_cast<char>((i * 7 + seed * 31) & 0xff));
  return b;
}

const std::string notes_md = "# notes\n\nloss **down** at step 20, and <script>alert(1)</script> stays text\n" +
                             std::string(2000, 'x') + "\n";
const std::string preds_json = R"({"columns":["id","label","ok"],"data":[[1,"cat",true],[2,"dog",false]]})";

/// proj/grp/r1: samples, images of ranks 0 and 1 at steps 0, 10, 20; notes,
/// text of rank 0 at step 20; preds, a table of rank 0 at step 20.
fs::path media_run(const fs::path& root) {
  const fs::path dir = make_run(root, "proj", "grp", {.id = "r1", .world = 2});
  std::string lines;
  for (std::int64_t step : {0, 10, 20})
    for (int rank : {0, 1})
      lines += write_media(dir, {.key = "samples", .rank = rank, .step = step, .data = png_bytes(int(step) + rank),
                                 .caption = "rank " + std::to_string(rank) + " at " + std::to_string(step), .width = 4, .height = 3});
  lines += write_media(dir, {.key = "notes", .step = 20, .kind = MediaKind::text, .format = "md", .data = notes_md});
  lines += write_media(dir, {.key = "preds", .step = 20, .kind = MediaKind::table, .format = "json", .data = preds_json});
  write_text(dir / "media.jsonl", lines);
  return dir;
}

std::string file_path(const std::string& key, int step, int rank, const std::string& run = "proj/grp/r1") {
  return "/api/media/file?run=" + encode(run) + "&key=" + encode(key) + "&step=" + std::to_string(step) +
         "&rank=" + std::to_string(rank);
}

} // namespace

BOOST_AUTO_TEST_CASE(media_keys_a_steps_entries_and_their_files_are_served_with_their_types) {
  TempDir root;
  const fs::path dir = media_run(root.path);
  Serve s(root.path);

  const auto [ls, lbody] = s.get("/api/media?run=proj/grp/r1");
  BOOST_REQUIRE_EQUAL(ls, 200);
  const Json list(lbody);
  BOOST_TEST(std::int64_t(list["rows"]) == 8);
  BOOST_TEST(std::int64_t(list["skipped"]) == 0);
  const simdjson::dom::array keys = arr(list["keys"]);
  BOOST_REQUIRE_EQUAL(keys.size(), 3u);
  std::vector<std::string> names;
  for (simdjson::dom::element k : keys) names.push_back(std::string(k["key"]) + ":" + std::string(k["kind"]));
  BOOST_TEST(names == (std::vector<std::string>{"notes:text", "preds:table", "samples:image"}), boost::test_tools::per_element());
  // The run's page has them too.
  BOOST_TEST(std::int64_t(Json(s.get("/api/run?run=proj/grp/r1").second)["media"]["keys"].at(2)["steps"]) == 3);

  // A key: its steps, and one step's entries, a rank each.
  const auto [ks, kbody] = s.get("/api/media?run=proj/grp/r1&key=samples&step=10");
  BOOST_REQUIRE_EQUAL(ks, 200);
  const Json key(kbody);
  BOOST_TEST(numbers(key["steps"]) == (std::vector<double>{0, 10, 20}), boost::test_tools::per_element());
  BOOST_TEST(std::int64_t(key["at"]) == 10);
  const simdjson::dom::array entries = arr(key["entries"]);
  BOOST_REQUIRE_EQUAL(entries.size(), 2u);
  for (int rank : {0, 1}) {
    const simdjson::dom::element e = entries.at(static_cast<std::size_t>(rank));
    BOOST_TEST(std::int64_t(e["rank"]) == rank);
    BOOST_TEST(std::string_view(e["caption"]) == "rank " + std::to_string(rank) + " at 10");
    BOOST_TEST(std::int64_t(e["width"]) == 4);
    BOOST_TEST(std::int64_t(e["height"]) == 3);
    BOOST_TEST(std::int64_t(e["size"]) == std::int64_t(png_bytes(0).size()));
    // Its url is the file, byte for byte, as a PNG, never compressed, never kept.
    httplib::Client c = s.client();
    c.set_decompress(false);
    const httplib::Result r = c.Get(std::string(e["url"]), {{"Accept-Encoding", "gzip, deflate, br"}});
    BOOST_REQUIRE(r);
    BOOST_TEST(r->status == 200);
    BOOST_TEST(r->body == png_bytes(10 + rank));
    BOOST_TEST(r->get_header_value("Content-Type") == "image/png");
    BOOST_TEST(!r->has_header("Content-Encoding"));
    BOOST_TEST(r->get_header_value("Cache-Control") == "no-store");
    BOOST_TEST(r->get_header_value("X-Content-Type-Options") == "nosniff");
  }
  // The last step where none is asked for.
  BOOST_TEST(std::int64_t(Json(s.get("/api/media?run=proj/grp/r1&key=samples").second)["at"]) == 20);

  // Text and tables: their own types, as every answer made per request: as
  // they are to this machine (to another, compressed: serve_transfer_test).
  for (const auto& [key, type, body] : {std::tuple{"notes", "text/markdown; charset=utf-8", notes_md},
                                        std::tuple{"preds", "application/json", preds_json}}) {
    const auto [status, plain] = s.get(file_path(key, 20, 0));
    BOOST_TEST(status == 200);
    BOOST_TEST(plain == body);
    httplib::Client c = s.client();
    c.set_decompress(false);
    const httplib::Result r = c.Get(file_path(key, 20, 0), {{"Accept-Encoding", "gzip"}});
    BOOST_REQUIRE(r);
    BOOST_TEST(r->get_header_value("Content-Type") == type);
    BOOST_TEST(r->get_header_value("Content-Encoding") == "", key);
    BOOST_TEST(r->body == body);
  }
  // HEAD answers the headers only.
  httplib::Client c = s.client();
  const httplib::Result head = c.Head(file_path("samples", 0, 1));
  BOOST_REQUIRE(head);
  BOOST_TEST(head->status == 200);
  BOOST_TEST(head->get_header_value("Content-Type") == "image/png");
}

BOOST_AUTO_TEST_CASE(only_files_that_media_lines_name_are_served) {
  TempDir root, outside;
  const fs::path dir = media_run(root.path);
  write_text(outside.path / "secret.png", "secret-bytes");
  // A line whose path climbs out of media/; one whose file is a link out of the
  // run; one whose directory is; a damaged line.
  std::string climbing = media_line({.key = "climb", .step = 0, .width = 1, .height = 1});
  climbing.replace(climbing.find("\"media/") + 1, 6, "media/../../../../");
  const MediaSpec linked{.key = "linked", .step = 0, .width = 1, .height = 1};
  fs::create_directories((dir / media_file_path(linked)).parent_path());
  fs::create_symlink(outside.path / "secret.png", dir / media_file_path(linked));
  const MediaSpec in_linked_dir{.key = "linkdir", .step = 0, .width = 1, .height = 1};
  fs::create_symlink(outside.path, dir / fs::path(media_file_path(in_linked_dir)).parent_path());
  fs::copy_file(outside.path / "secret.png", outside.path / fs::path(media_file_path(in_linked_dir)).filename());
  append_text(dir / "media.jsonl", climbing + media_line(linked) + media_line(in_linked_dir) + "{not json\n");
  Serve s(root.path);
  for (const auto& [path, want] : std::vector<std::pair<std::string, int>>{
           {file_path("samples", 0, 0), 200},
           {file_path("samples", 0, 2), 404},           // no such rank
           {file_path("samples", 5, 0), 404},           // no such step: never the nearest
           {file_path("climb", 0, 0), 404},             // its line was refused
           {file_path("../../run.json", 0, 0), 404},    // a key is a name, never a path
           {file_path("linked", 0, 0), 403},
           {file_path("linkdir", 0, 0), 403},
           {file_path("samples", 0, 0, "proj/grp/../../x"), 400},
           {file_path("samples", 0, 0, "proj/grp/nosuch"), 404},
           {"/api/media/file?run=proj/grp/r1&path=media/../run.json", 400},
           {"/api/media/file?run=proj/grp/r1&key=samples&step=-1&rank=0", 400},
           {"/api/media/file?run=proj/grp/r1&key=samples&step=0", 400},
           {"/api/media/file?run=proj/grp/r1&key=samples&step=x&rank=0", 400},
           {"/api/media?run=proj/grp/r1&key=nosuch", 404},
           {"/api/media?run=proj/grp/r1&key=samples&step=abc", 400},
           {"/api/media?run=../etc", 400},
       }) {
    const auto [status, body] = s.get(path);
    BOOST_TEST(status == want, path << " answered " << status << ": " << body.substr(0, 200));
    BOOST_TEST(!contains(body, "secret-bytes"), path << " leaked: " << body);
    BOOST_TEST(!contains(body, outside.str()), path << " leaked: " << body);
  }
  // The refused lines are counted, the first named with its reason, on the run's page too.
  const Json list(s.get("/api/media?run=proj/grp/r1").second);
  BOOST_TEST(std::int64_t(list["skipped"]) == 2);
  BOOST_TEST_INFO(list.text);
  BOOST_TEST(contains(std::string(list["first_skipped"]), "line 9: "));
  BOOST_TEST(contains(std::string(list["first_skipped"]), "has no path under media/"));
  const Json run(s.get("/api/run?run=proj/grp/r1").second);
  BOOST_TEST(contains(run.text, "media.jsonl: 2 damaged line(s) skipped"), run.text);
}

BOOST_AUTO_TEST_CASE(media_files_ask_for_the_token) {
  TempDir root;
  media_run(root.path);
  Serve s(root.path); // on loopback, which every user of the machine reaches
  s.with_token = false;
  BOOST_TEST(s.get(file_path("samples", 0, 0)).first == 401);
  BOOST_TEST(s.get("/api/media?run=proj/grp/r1").first == 401);
  const auto [status, body] = s.get(file_path("samples", 0, 0) + "&token=" + s.token);
  BOOST_TEST(status == 200);
  BOOST_TEST(body == png_bytes(0));
}

BOOST_AUTO_TEST_CASE(media_lines_appended_reach_the_event_stream) {
  TempDir root;
  const fs::path dir = media_run(root.path);
  Serve s(root.path);
  const std::string seen = s.events("proj/grp/r1", "event: media", [&] {
    // Step 30 of both ranks, and a line being written: its complete lines only.
    std::string more;
    for (int rank : {0, 1})
      more += write_media(dir, {.key = "samples", .rank = rank, .step = 30, .data = png_bytes(30 + rank), .width = 4, .height = 3});
    append_text(dir / "media.jsonl", more + R"({"_step":40,"key")");
  }, R"("rows":10,)");
  BOOST_TEST_INFO(seen);
  BOOST_TEST(contains(seen, R"("rows":8,)"));
  BOOST_TEST(contains(seen, R"("rows":10,)"));
  BOOST_TEST(contains(seen, R"("unfinished":true)"));
  const Json key(s.get("/api/media?run=proj/grp/r1&key=samples").second);
  BOOST_TEST(std::int64_t(key["at"]) == 30);
  BOOST_TEST(s.get(file_path("samples", 30, 1)).second == png_bytes(31));
}
