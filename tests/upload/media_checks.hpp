// What the media upload tests write and check: media/ files and
// media.jsonl lines as the run host writes them, and, the run directory
// being the truth, each image, text and table on the server once, in the
// forms of docs/UPLOADS.md ("Images, text and tables"), byte for byte.
#pragma once

#include "io/store/media_log.hpp"
#include "runtime/core/media.hpp"
#include "tests/io/files.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tfevents_media_files.hpp"
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/uploading.hpp"

#include <boost/test/unit_test.hpp>

#include <openssl/evp.h>
#include <simdjson.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace chorus::test {

struct LoggedMedia {
  std::int64_t step = 0;
  double timestamp = 0;
  std::string key, kind, format, path, caption;
  int rank = 0;
  std::uint32_t width = 0, height = 0;
  std::string bytes; // the file under media/

  /// Its column in a run of `world_size` ranks: the key, or key/rank-N.
  [[nodiscard]] std::string column(std::int64_t world_size) const {
    return world_size > 1 ? key + "/rank-" + std::to_string(rank) : key;
  }
};

/// media.jsonl of `run_dir`, each line read through store::read_media_line, with its file.
inline std::vector<LoggedMedia> read_media(const std::string& run_dir) {
  std::vector<LoggedMedia> out;
  simdjson::dom::parser parser;
  std::istringstream in(test::files::slurp(run_dir + "/media.jsonl"));
  for (std::string line; std::getline(in, line);) {
    simdjson::dom::element e;
    BOOST_REQUIRE(parser.parse(line).get(e) == simdjson::SUCCESS);
    const Result<store::MediaLine> m = store::read_media_line(e);
    BOOST_REQUIRE_MESSAGE(m.has_value(), (m ? "" : m.error().message()));
    out.push_back({m->step, m->timestamp, std::string(m->key), std::string(m->kind), std::string(m->format),
                   std::string(m->path), std::string(m->caption), m->rank, m->width, m->height,
                   test::files::slurp(run_dir + "/" + std::string(m->path))});
  }
  return out;
}

/// SHA-256 of `bytes`, in hex.
inline std::string sha256_hex(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  BOOST_REQUIRE(EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) == 1);
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    static constexpr char hex[] = "0123456789abcdef";
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

/// The media of steps [first, first + n), in the run host's order (a step's
/// by key, then rank): at even steps "samples", a PNG of each of `ranks`
/// ranks (of its own size), captioned; at steps divisible by 3 "preds", rank 0's table; at
/// steps divisible by 5 "notes", the last rank's markdown (quotes, a
/// newline, a non-ASCII character); at step 7 "photo", rank 0's JPEG.
inline void media(RunFixture& run, std::int64_t first, std::int64_t n, int ranks) {
  using chorus::core::MediaKind;
  using media_files::add_media;
  for (std::int64_t s = first; s < first + n; ++s) {
    if (s % 5 == 0)
      add_media(run.dir(), s, "notes", ranks - 1, MediaKind::text, "md",
                "## step " + std::to_string(s) + "\n\"loss\" **down** \u2713 \\ done");
    if (s == 7) add_media(run.dir(), s, "photo", 0, MediaKind::image, "jpeg", media_files::jpeg_file(3), "", 8, 8);
    if (s % 3 == 0)
      add_media(run.dir(), s, "preds", 0, MediaKind::table, "json",
                media_files::table_json(R"(["id","label","ok"])", "[[" + std::to_string(s) + R"(,"cat",true],[2,"d\"og",null]])"));
    if (s % 2 == 0) {
      for (int r = 0; r < ranks; ++r) {
        const auto width = 4 + static_cast<std::uint32_t>(r), height = 3 + static_cast<std::uint32_t>(s % 7);
        add_media(run.dir(), s, "samples", r, MediaKind::image, "png", media_files::png_file(width, height, 2),
                  "step " + std::to_string(s), width, height);
      }
    }
  }
}

/// A run of `ranks` ranks that has ended with history rows for steps
/// [0, 40) and media for steps [0, 45): steps 40, 42, 44 and 45 have media
/// only (41 and 43 have none).
inline void ended_media_run(RunFixture& run, int ranks) {
  run.world_size = ranks;
  run.history(0, 40);
  media(run, 0, 46, ranks);
  run.write_run_json("finished", 1'700'000'100.0);
}

/// The parts of an image's name in MLflow's images/ folder, as MLflow's UI
/// reads them: <key>+step+<step>+timestamp+<ms>+<id>[+compressed].<png|webp>.
struct MlflowImageName {
  std::string key, id;
  std::int64_t step = -1, timestamp = -1;
  bool compressed = false;
  std::string extension;
};

inline std::optional<MlflowImageName> parse_image_name(std::string name) {
  MlflowImageName out;
  const std::size_t dot = name.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  out.extension = name.substr(dot + 1);
  name.resize(dot);
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    const std::size_t plus = name.find('+', at);
    parts.push_back(name.substr(at, plus == std::string::npos ? std::string::npos : plus - at));
    if (plus == std::string::npos) break;
    at = plus + 1;
  }
  if (parts.size() < 6 || parts.size() > 7 || parts[1] != "step" || parts[3] != "timestamp") return std::nullopt;
  out.key = parts[0];
  out.step = std::stoll(parts[2]);
  out.timestamp = std::stoll(parts[4]);
  out.id = parts[5];
  out.compressed = parts.size() == 7 && parts[6] == "compressed";
  return out;
}

/// MLflow: each image as images/<column, '/' as '.'>+step+<step>+timestamp+<ms>+<id>.png
/// and +compressed.webp, both its file's bytes; each table as
/// tables/<column>/step_<step>.json and each text as text/<column>/step_<step>.md,
/// byte for byte; nothing else in those folders; the tags mlflow.loggedImages
/// and mlflow.loggedArtifacts (each table listed once) as MLflow's client sets them.
/// `artifacts`: the run's, path -> contents; `tags`: its tags.
inline void check_mlflow_media(const std::map<std::string, std::string>& artifacts,
                               const std::map<std::string, std::string>& tags, const std::string& run_dir,
                               std::int64_t world_size) {
  const std::vector<LoggedMedia> logged = read_media(run_dir);
  BOOST_REQUIRE(!logged.empty());
  std::map<std::string, const LoggedMedia*> images; // "<flat column>+<step>" -> logged
  std::set<std::string> expected, tables;
  for (const LoggedMedia& m : logged) {
    const std::string column = m.column(world_size), step = std::to_string(m.step);
    if (m.kind == "image") {
      std::string flat = column;
      for (char& c : flat) c = c == '/' ? '.' : c;
      images[flat + "+" + step] = &m;
      continue;
    }
    const std::string path = m.kind == "table" ? "tables/" + column + "/step_" + step + ".json"
                                               : "text/" + column + "/step_" + step + ".md";
    expected.insert(path);
    if (m.kind == "table") tables.insert(path);
    const auto a = artifacts.find(path);
    BOOST_REQUIRE_MESSAGE(a != artifacts.end(), path);
    BOOST_TEST(a->second == m.bytes, path);
  }
  std::map<std::string, int> seen; // per image: its .png and +compressed.webp
  for (const auto& [path, content] : artifacts) {
    if (path.starts_with("images/")) {
      const std::optional<MlflowImageName> name = parse_image_name(path.substr(7));
      BOOST_REQUIRE_MESSAGE(name, path);
      BOOST_TEST((name->extension == (name->compressed ? "webp" : "png")), path);
      BOOST_TEST(name->id.size() == 36u, path);
      BOOST_TEST((name->id[0] >= 'g' && name->id[0] <= 'z'), path); // no %-escape can start it
      const auto m = images.find(name->key + "+" + std::to_string(name->step));
      BOOST_REQUIRE_MESSAGE(m != images.end(), path);
      BOOST_TEST(name->timestamp == std::llround(m->second->timestamp * 1000), path);
      BOOST_TEST(content == m->second->bytes, path); // byte for byte, the thumbnail too (docs/UPLOADS.md)
      ++seen[path.substr(0, path.find(name->id)) + name->id];
    } else if (path.starts_with("tables/") || path.starts_with("text/")) {
      BOOST_TEST(expected.count(path) == 1u, path);
    }
  }
  BOOST_TEST(seen.size() == images.size()); // one name (id) an image
  for (const auto& [stem, n] : seen) BOOST_TEST(n == 2, stem);
  if (!images.empty()) BOOST_TEST(tags.at("mlflow.loggedImages") == "True");
  simdjson::dom::parser parser;
  simdjson::dom::array got;
  BOOST_REQUIRE(parser.parse(tags.at("mlflow.loggedArtifacts")).get(got) == simdjson::SUCCESS);
  std::set<std::string> got_tables;
  std::size_t entries = 0;
  for (auto e : got) {
    ++entries;
    BOOST_TEST(std::string(e["type"].get_string().value()) == "table");
    got_tables.insert(std::string(e["path"].get_string().value()));
  }
  BOOST_TEST(entries == got_tables.size()); // each once
  BOOST_TEST((got_tables == tables));
  BOOST_TEST(tags.at("mlflow.loggedArtifacts").find("{\"path\": \"tables/") != std::string::npos);
}

inline void check_mlflow_media(const TrackingServer& server, const std::string& run_id, const std::string& run_dir,
                               std::int64_t world_size) {
  const auto run = server.mlflow_run(run_id);
  BOOST_REQUIRE(run);
  check_mlflow_media(server.artifacts(run_id), run->tags, run_dir, world_size);
}

/// W&B: each media in the history row of its step (one row a step), under
/// its column, in W&B's own form; the file it names on the server byte for
/// byte (a text as a table of one cell holding it), its sha256 and size
/// that file's, and said uploaded.
inline void check_wandb_media(const WandbRun& remote, const std::string& run_dir, std::int64_t world_size) {
  simdjson::dom::parser parser, table_parser;
  std::map<std::int64_t, std::string> rows = rows_by_step(remote);
  const std::set<std::string> uploaded(remote.uploaded.begin(), remote.uploaded.end());
  std::size_t values = 0;
  for (const auto& [step, row] : rows) {
    const simdjson::dom::object o = parser.parse(row).get_object().value();
    for (auto f : o) {
      std::string_view type;
      values += f.value.is_object() && f.value["_type"].get(type) == simdjson::SUCCESS &&
                (type == "image-file" || type == "table-file");
    }
  }
  const std::vector<LoggedMedia> logged = read_media(run_dir);
  BOOST_TEST(values == logged.size()); // each once, nothing else
  BOOST_TEST(remote.files.size() == logged.size());
  for (const LoggedMedia& m : logged) {
    const std::string column = m.column(world_size);
    BOOST_TEST_CONTEXT(column << " at step " << m.step) {
      BOOST_REQUIRE(rows.count(m.step));
      simdjson::dom::element doc, v;
      BOOST_REQUIRE(parser.parse(rows[m.step]).get(doc) == simdjson::SUCCESS);
      BOOST_REQUIRE(doc[column].get(v) == simdjson::SUCCESS);
      const std::string type(v["_type"].get_string().value()), path(v["path"].get_string().value());
      BOOST_TEST_REQUIRE(remote.files.count(path) == 1u, path);
      const std::string& stored = remote.files.at(path);
      BOOST_TEST(uploaded.count(path) == 1u, path);
      BOOST_TEST(std::string(v["sha256"].get_string().value()) == sha256_hex(stored));
      BOOST_TEST(v["size"].get_uint64().value() == stored.size());
      const std::string hash = sha256_hex(stored).substr(0, 20);
      if (m.kind == "image") {
        const std::string ext = m.format == "jpeg" ? "jpg" : "png";
        BOOST_TEST(type == "image-file");
        BOOST_TEST(path == "media/images/" + column + "_" + std::to_string(m.step) + "_" + hash + "." + ext);
        BOOST_TEST(stored == m.bytes);
        BOOST_TEST(std::string(v["format"].get_string().value()) == ext);
        BOOST_TEST(v["width"].get_uint64().value() == m.width);
        BOOST_TEST(v["height"].get_uint64().value() == m.height);
        std::string_view caption;
        if (!m.caption.empty()) BOOST_TEST((v["caption"].get(caption) == simdjson::SUCCESS && caption == m.caption));
        continue;
      }
      BOOST_TEST(type == "table-file");
      BOOST_TEST(path == "media/table/" + column + "_" + std::to_string(m.step) + "_" + hash + ".table.json");
      simdjson::dom::element table;
      BOOST_REQUIRE(table_parser.parse(stored).get(table) == simdjson::SUCCESS);
      const simdjson::dom::array columns = table["columns"].get_array().value(), data = table["data"].get_array().value();
      BOOST_TEST(v["ncols"].get_uint64().value() == columns.size());
      BOOST_TEST(v["nrows"].get_uint64().value() == data.size());
      if (m.kind == "table") {
        BOOST_TEST(stored == m.bytes);
      } else {
        BOOST_TEST(stored.starts_with("{\"columns\": [\"text\"], \"data\": [[\""), stored);
        BOOST_TEST(std::string(data.at(0).at(0).get_string().value()) == m.bytes); // the text, exactly
      }
    }
  }
}

} // namespace chorus::test
