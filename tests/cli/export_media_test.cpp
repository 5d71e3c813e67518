// `chorus export --tensorboard`: a run's images, texts and tables
// (media.jsonl and its files under media/, written as the run host writes
// them, tests/upload/tfevents_media_files.hpp) in TensorBoard's event files,
// each rank's in rank-N/ under its key, read back by the tests' own reader
// (tests/upload/tfevents_reader.hpp) and, where it is at hand, by
// TensorBoard's own (tests/upload/tfevents_peer.hpp).
#define BOOST_TEST_MODULE cli_export_media
#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"
#include "tests/upload/tfevents_media_files.hpp"
#include "tests/upload/tfevents_peer.hpp"
#include "tests/upload/tfevents_reader.hpp"

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

using namespace chorus::test;
namespace fs = std::filesystem;
namespace tb = chorus::test::tfevents;

namespace {

namespace mf = chorus::test::media_files;
using chorus::core::MediaKind;

/// What a media's event should hold: an image's bytes and sides, or a
/// string tensor's shape and cells.
struct MediaWant {
  std::string image;
  std::int64_t width = 0, height = 0, colorspace = 0;
  std::vector<std::int64_t> dims;
  std::vector<std::string> cells;
};

/// (subdirectory, tag, step) -> what its one event should hold.
using MediaWants = std::map<tb::TagStep, MediaWant>;

/// A run (of 4 ranks, `world` 1: of one) whose media.jsonl holds, at steps
/// 0..2, rank 0's PNG "samples" (with a caption), rank 1's grey JPEG
/// "samples" and markdown "notes", and at step 2 rank 0's table "preds".
fs::path media_run(const fs::path& root, MediaWants& want, const std::string& id = "media", int world = 4) {
  const fs::path dir = make_run(root, "proj", "grp", {.id = id, .world = world});
  write_text(dir / "history.jsonl", history(3));
  const auto sub = [world](int rank) { return world == 1 ? std::string() : "rank-" + std::to_string(rank); };
  for (int step = 0; step < 3; ++step) {
    const std::string png = mf::png_file(5, 2 + static_cast<std::uint32_t>(step), 2), jpeg = mf::jpeg_file(1);
    mf::add_media(dir, step, "samples", 0, MediaKind::image, "png", png, "step " + std::to_string(step), 5,
                  2 + static_cast<std::uint32_t>(step));
    want[{sub(0), "samples", step}] = {.image = png, .width = 5, .height = 2 + step, .colorspace = 3};
    if (world == 1) continue;
    mf::add_media(dir, step, "samples", 1, MediaKind::image, "jpeg", jpeg, "", 8, 8);
    want[{sub(1), "samples", step}] = {.image = jpeg, .width = 8, .height = 8, .colorspace = 1};
    const std::string md = "## step " + std::to_string(step) + "\n| a | b |\n|---|---|\n| **ü** | ✓ |";
    mf::add_media(dir, step, "notes", 1, MediaKind::text, "md", md);
    want[{sub(1), "notes", step}] = {.cells = {md}};
  }
  mf::add_media(dir, 2, "preds", 0, MediaKind::table, "json",
                mf::table_json(R"(["id","label","p","ok"])", R"([[1,"cat",0.25,true],[2,"dög",1e-07,false]])"));
  want[{sub(0), "preds", 2}] = {.dims = {3, 4}, .cells = {"id", "label", "p", "ok", "1", "cat", "0.25", "true", "2",
                                                          "dög", "1e-07", "false"}};
  return dir;
}

/// (subdirectory, tag, step) -> the images and string tensors under `dir`
/// and its subdirectories (the config and summary texts left out).
std::map<tb::TagStep, std::vector<tb::TbValue>> media_in(const fs::path& dir) {
  std::map<tb::TagStep, std::vector<tb::TbValue>> out;
  for (const auto& [at, values] : tb::values_under(dir))
    for (const auto& [e, v] : values)
      if (v.image || (v.plugin_name == "text" && v.tag != "config" && v.tag != "summary")) out[at].push_back(v);
  return out;
}

void check_media(const fs::path& dir, const MediaWants& want) {
  auto got = media_in(dir);
  BOOST_TEST(got.size() == want.size());
  for (const auto& [at, w] : want) {
    BOOST_TEST_CONTEXT("'" << std::get<0>(at) << "' " << std::get<1>(at) << " at " << std::get<2>(at)) {
      BOOST_TEST_REQUIRE(got[at].size() == 1u);
      const tb::TbValue& v = got[at].front();
      if (!w.image.empty()) {
        BOOST_TEST_REQUIRE(v.image.has_value());
        BOOST_TEST((v.image->encoded == w.image)); // byte for byte
        BOOST_TEST(v.image->width == w.width);
        BOOST_TEST(v.image->height == w.height);
        BOOST_TEST(v.image->colorspace == w.colorspace);
        BOOST_TEST(!v.has_metadata); // the caption is not written: TensorBoard shows none per image
      } else {
        BOOST_TEST(v.plugin_name == "text");
        BOOST_TEST(v.dtype == 7);
        BOOST_TEST(v.dim_sizes == w.dims, boost::test_tools::per_element());
        BOOST_TEST(v.string_val == w.cells, boost::test_tools::per_element());
      }
    }
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(tensorboard_gets_each_ranks_images_text_and_tables_byte_for_byte) {
  TempDir root;
  MediaWants want;
  const fs::path dir = media_run(root.path, want);
  const fs::path out = root.path / "tb";
  const Output o = run_chorus({"export", dir.string(), "--tensorboard", out.string()});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(contains(o.out, "and 10 images, texts and tables into"));
  check_media(out / "media", want);

  // A run of one rank: its media beside its scalars, under their keys.
  MediaWants one;
  const fs::path single = media_run(root.path, one, "single", 1);
  BOOST_REQUIRE_EQUAL(run_chorus({"export", single.string(), "--tensorboard", out.string()}).code, 0);
  check_media(out / "single", one); // all of them in its own files

  // --metric picks a media column as it picks a key's; --csv holds none.
  const fs::path picked = root.path / "picked";
  const Output p = run_chorus({"export", dir.string(), "--tensorboard", picked.string(), "--metric", "notes"});
  BOOST_REQUIRE_EQUAL(p.code, 0);
  const auto notes = media_in(picked / "media");
  BOOST_TEST(notes.size() == 3u);
  for (const auto& [at, values] : notes) BOOST_TEST((std::get<0>(at) == "rank-1" && std::get<1>(at) == "notes"));
  const Output csv = run_chorus({"export", dir.string(), "--csv", "-"});
  BOOST_REQUIRE_EQUAL(csv.code, 0);
  BOOST_TEST(lines_of(csv.out).front() == "_step,_timestamp,_runtime,loss,lr,acc/rank-0,acc/rank-1");
}

BOOST_AUTO_TEST_CASE(a_media_file_that_cannot_be_read_is_named_and_the_rest_exported) {
  TempDir root;
  MediaWants want;
  const fs::path dir = media_run(root.path, want);
  const std::string gone = chorus::store::media_path("notes", 1, 1, "md");
  fs::remove(dir / gone);
  want.erase({"rank-1", "notes", 1});
  const Output o = run_chorus({"export", dir.string(), "--tensorboard", (root.path / "tb").string()});
  BOOST_TEST_INFO_SCOPE(o.out << o.err);
  BOOST_REQUIRE_EQUAL(o.code, 0);
  BOOST_TEST(contains(o.err, "1 media file(s) left out, the first: the text " + (dir / gone).string() + " is missing"));
  BOOST_TEST(contains(o.err, "chorus recover RUN"));
  BOOST_TEST(contains(o.out, "and 9 images, texts and tables into"));
  check_media(root.path / "tb" / "media", want);
}


BOOST_AUTO_TEST_CASE(tensorboards_own_reader_shows_the_images_and_texts_as_exported) {
  const std::optional<fs::path> peer = tb::tensorboard_peer();
  if (!peer) return; // skipped, and said so
  TempDir root;
  MediaWants want;
  const fs::path dir = media_run(root.path, want);
  const fs::path out = root.path / "tb";
  BOOST_REQUIRE_EQUAL(run_chorus({"export", dir.string(), "--tensorboard", out.string()}).code, 0);
  // EventAccumulator: each image's bytes (hex) and sides, each tensor's
  // shape and cells (JSON). The plugin accumulator, what TensorBoard's
  // server reads through, turns an image into the images plugin's tensor
  // [width, height, bytes]: its three cells too.
  write_text(root.path / "read.py", R"(import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.util import tensor_util
for sub in sys.argv[2:]:
    path = sys.argv[1] + "/" + sub
    acc = ea.EventAccumulator(path, size_guidance={ea.IMAGES: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in sorted(tags["images"]):
        for e in acc.Images(tag):
            print("image", sub, tag, e.step, e.width, e.height, e.encoded_image_string.hex())
    for tag in sorted(tags["tensors"]):
        for e in acc.Tensors(tag):
            a = tensor_util.make_ndarray(e.tensor_proto)
            cells = [c.decode("utf-8") for c in a.reshape(-1)]
            print("tensor", sub, tag, e.step, list(a.shape), json.dumps(cells, ensure_ascii=False))
    p = pea.EventAccumulator(path, size_guidance={pea.TENSORS: 0})
    p.Reload()
    for plugin in ("images", "text"):
        for tag in sorted(p.PluginTagToContent(plugin) if plugin in p.ActivePlugins() else {}):
            for e in p.Tensors(tag):
                a = tensor_util.make_ndarray(e.tensor_proto).reshape(-1)
                image = plugin == "images"
                print("plugin", plugin, sub, tag, e.step, len(a), a[-1].hex() if image else "", a[0].decode() if image else "")
)");
  const std::string said =
      tb::run_with_tensorboard(*peer, root.path / "read.py", (out / "media").string() + " rank-0 rank-1");
  BOOST_TEST_INFO_SCOPE(said);
  const auto hex = [](const std::string& bytes) {
    std::string h;
    char b[3];
    for (const unsigned char c : bytes) std::snprintf(b, sizeof b, "%02x", c), h += b;
    return h;
  };
  const auto json_cells = [](const std::vector<std::string>& cells) {
    std::string j = "[";
    for (const std::string& c : cells) j += (j.size() > 1 ? ", \"" : "\"") + c + "\""; // newlines escaped by the caller
    return j + "]";
  };
  for (const auto& [at, w] : want) {
    const auto& [sub, tag, step] = at;
    const std::string where = sub + " " + tag + " " + std::to_string(step) + " ";
    if (!w.image.empty()) {
      BOOST_TEST(contains(said, "image " + where + std::to_string(w.width) + " " + std::to_string(w.height) + " " +
                                    hex(w.image) + "\n"), where);
      BOOST_TEST(contains(said, "plugin images " + where + "3 " + hex(w.image) + " " + std::to_string(w.width) + "\n"),
                 where);
      continue;
    }
    std::string shape = "[";
    for (const std::int64_t d : w.dims) shape += (shape.size() > 1 ? ", " : "") + std::to_string(d);
    std::vector<std::string> cells = w.cells;
    for (std::string& c : cells)
      for (std::size_t i; (i = c.find('\n')) != std::string::npos;) c.replace(i, 1, "\\n");
    BOOST_TEST(contains(said, "tensor " + where + shape + "] " + json_cells(cells) + "\n"), where);
    BOOST_TEST(contains(said, "plugin text " + where + std::to_string(w.cells.size()) + "  \n"), where);
  }
}
