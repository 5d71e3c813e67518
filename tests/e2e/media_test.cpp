// Images, text and tables through a live run (README, "Images, text and
// tables"): files under media/ byte-exact (or a PNG of the pixels logged),
// media.jsonl naming them, bad input refused on the ticket with nothing
// kept, a key that holds one kind, and `chorus recover` rebuilding both.
#define BOOST_TEST_MODULE e2e_media
#include "io/store/media_log.hpp"
#include "local_run.hpp"
#include "runtime/core/media.hpp"

#include <boost/test/unit_test.hpp>

#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace e2e;

namespace {

struct Line {
  std::int64_t step;
  std::string key, kind, format, path, caption;
  int rank;
  std::uint32_t width, height;
  std::uint64_t size;
};

std::vector<Line> read_media(const fs::path& run_dir) {
  std::vector<Line> out;
  simdjson::dom::parser parser;
  std::ifstream in(run_dir / "media.jsonl");
  for (std::string line; std::getline(in, line);) {
    simdjson::dom::element e;
    BOOST_REQUIRE(parser.parse(line).get(e) == simdjson::SUCCESS);
    chorus::Result<chorus::store::MediaLine> m = chorus::store::read_media_line(e);
    BOOST_TEST_REQUIRE(m.has_value(), (m ? "" : m.error().message()));
    out.push_back({m->step, std::string(m->key), std::string(m->kind), std::string(m->format), std::string(m->path),
                   std::string(m->caption), m->rank, m->width, m->height, m->size});
  }
  return out;
}

/// A 1 x 1 PNG and the start of a 2 x 3 JPEG (its SOF0 frame header), made here byte by byte.
std::vector<char> tiny_png() {
  const unsigned char b[] = {0x89, 'P',  'N',  'G',  '\r', '\n', 0x1a, '\n', 0,    0,    0,    13,   'I',  'H',  'D',
                             'R',  0,    0,    0,    1,    0,    0,    0,    1,    8,    0,    0,    0,    0,    0x3a,
                             0x7e, 0x9b, 0x55, 0,    0,    0,    10,   'I',  'D',  'A',  'T',  0x78, 0x9c, 0x63, 0x60,
                             0,    0,    0,    2,    0,    1,    0x48, 0xaf, 0xa4, 0x71, 0,    0,    0,    0,    'I',
                             'E',  'N',  'D',  0xae, 0x42, 0x60, 0x82};
  return {reinterpret_cast<const char*>(b), reinterpret_cast<const char*>(b) + sizeof b};
}
std::vector<char> tiny_jpeg() {
  const unsigned char b[] = {0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0x00, 0x00, 0xFF, 0xC0, 0x00, 0x0B,
                             0x08, 0x00, 0x02, 0x00, 0x03, 0x01, 0x01, 0x11, 0x00, 0xFF, 0xD9};
  return {reinterpret_cast<const char*>(b), reinterpret_cast<const char*>(b) + sizeof b};
}

} // namespace

BOOST_AUTO_TEST_CASE(images_text_and_tables_land_as_files_named_by_media_jsonl) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir, "media"));
  std::vector<std::uint8_t> rgb(4 * 5 * 3);
  for (std::size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<std::uint8_t>(i * 7);
  std::vector<float> grey(3 * 2, 0.5f);
  grey[0] = 2.0f; // clamped
  const std::vector<char> png = tiny_png(), jpeg = tiny_jpeg();
  BOOST_TEST(!run.log_image("samples", chorus::Image::from_pixels(rgb, 4, 5, 3, "rgb"), {.step = 0}).wait());
  BOOST_TEST(!run.log_image("grey", chorus::Image::from_pixels(grey, 3, 2, 1), {.step = 0}).wait());
  BOOST_TEST(!run.log_image("file", chorus::Image::from_file_bytes(png, "png bytes"), {.step = 1}).wait());
  BOOST_TEST(!run.log_text("notes", "# step 1\nall **well**", {.step = 1}).wait());
  BOOST_TEST(!run.log_image("file", chorus::Image::from_file_bytes(jpeg), {.step = 2}).wait());
  const std::vector<std::string> cols = {"id", "pred", "ok"};
  const std::vector<std::vector<chorus::Value>> rows = {{1, 0.5, true}, {2, "cat", false}, {3, chorus::Value(), true}};
  BOOST_TEST(!run.log_table("preds", cols, rows, {.step = 2}).wait());
  BOOST_TEST(!run.log({{"loss", 1.0}}, {.step = 2}).wait());

  // Refused on the ticket, nothing kept: each names its cause.
  auto refused = [](const chorus::Error& e, const std::string& words) {
    BOOST_TEST((e.code() == chorus::Errc::invalid_argument));
    BOOST_TEST(e.message().find(words) != std::string::npos, e.message());
  };
  refused(run.log_image("bad", chorus::Image::from_pixels(rgb, 4, 4, 3)).wait(), "needs 48");
  refused(run.log_image("bad", chorus::Image::from_pixels(rgb, 4, 5, 2)).wait(), "1 (grey), 3 (RGB) or 4 (RGBA)");
  refused(run.log_image("bad", chorus::Image::from_pixels(std::span<const std::uint8_t>(), 0, 0, 3)).wait(), "empty");
  refused(run.log_image("bad", chorus::Image::from_file_bytes(std::span<const char>("GIF89a", 6))).wait(),
          "neither PNG nor JPEG");
  std::vector<char> huge = png;
  huge[16] = 0x7f; // a width of 2^31 and more
  refused(run.log_image("bad", chorus::Image::from_file_bytes(huge)).wait(), "over the 16384 a side");
  refused(run.log_table("bad", cols, {{{1, 2}}}).wait(), "row 0 of the table has 2 cells");
  refused(run.log_text("bad", std::string_view("\xff\xfe", 2)).wait(), "not valid UTF-8");
  refused(run.log_image("loss", chorus::Image::from_file_bytes(png)).wait(), "which holds scalars");
  refused(run.log_text("samples", "x").wait(), "which holds images");
  const chorus::FinishResult r = run.finish().wait();
  BOOST_REQUIRE(!r.error);
  { chorus::Run done = std::move(run); } // lets go of the WAL, for recover below
  const fs::path rd = r.run_dir;

  const std::vector<Line> lines = read_media(rd);
  BOOST_REQUIRE_EQUAL(lines.size(), 6u);
  std::map<std::string, const Line*> by;
  for (const Line& l : lines) by[l.key + "@" + std::to_string(l.step)] = &l;
  for (const Line& l : lines) {
    BOOST_TEST_CONTEXT(l.path) {
      BOOST_TEST(fs::exists(rd / l.path)); // never a line without its file
      BOOST_TEST(fs::file_size(rd / l.path) == l.size);
      BOOST_TEST(l.rank == 0);
    }
  }
  // Bytes given are kept byte-exact.
  BOOST_TEST(slurp(rd / by.at("file@1")->path) == std::string(png.begin(), png.end()));
  BOOST_TEST(slurp(rd / by.at("file@2")->path) == std::string(jpeg.begin(), jpeg.end()));
  BOOST_TEST(by.at("file@1")->caption == "png bytes");
  BOOST_TEST(by.at("file@2")->format == "jpeg");
  BOOST_TEST((by.at("file@2")->width == 3 && by.at("file@2")->height == 2));
  // Pixels are a PNG of their size.
  for (const char* k : {"samples@0", "grey@0"}) {
    const Line& l = *by.at(k);
    const std::string bytes = slurp(rd / l.path);
    chorus::core::media::ImageHeader h;
    BOOST_TEST(!chorus::core::media::image_header(std::span<const char>(bytes.data(), bytes.size()), h));
    BOOST_TEST(h.format == "png");
    BOOST_TEST(h.width == l.width);
    BOOST_TEST(h.height == l.height);
  }
  BOOST_TEST((by.at("samples@0")->width == 5 && by.at("samples@0")->height == 4));
  BOOST_TEST(slurp(rd / by.at("notes@1")->path) == "# step 1\nall **well**");
  BOOST_TEST(slurp(rd / by.at("preds@2")->path) ==
             R"({"columns":["id","pred","ok"],"data":[[1,0.5,true],[2,"cat",false],[3,null,true]]})");
  BOOST_TEST(by.at("preds@2")->kind == "table");

  // Every refusal is in rejected.jsonl.
  std::ifstream rej(rd / "rejected.jsonl");
  std::size_t refusals = 0;
  for (std::string line; std::getline(rej, line);) ++refusals;
  BOOST_TEST(refusals == 9u);

  // recover rebuilds media/ and media.jsonl from the WAL, to the same bytes.
  const std::string index = slurp(rd / "media.jsonl");
  const std::string first = slurp(rd / lines[0].path);
  fs::remove_all(rd / "media");
  fs::remove(rd / "media.jsonl");
  Output rec = e2e::run(bin("chorus") + " recover " + rd.string());
  BOOST_TEST_INFO(rec.text);
  BOOST_REQUIRE_EQUAL(rec.status, 0);
  BOOST_TEST(slurp(rd / "media.jsonl") == index);
  BOOST_TEST(slurp(rd / lines[0].path) == first);
}
