// artifacts.jsonl as the tests read it: every line a JSON object with
// exactly the seven fields that the uploader reads.
#pragma once

#include "tests/io/files.hpp"

#include <boost/test/unit_test.hpp>
#include <simdjson.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::test::files {

struct ManifestEntry {
  std::string name, type, sha256;
  std::uint64_t size = 0;
  std::int64_t rank = -2, step = -2;
  double timestamp = 0;
};

inline ManifestEntry parse_manifest_line(const std::string& line) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  BOOST_REQUIRE_MESSAGE(parser.parse(line).get(doc) == simdjson::SUCCESS, "not JSON: " << line);
  simdjson::dom::object obj;
  BOOST_REQUIRE(doc.get(obj) == simdjson::SUCCESS);
  BOOST_TEST(obj.size() == 7u, line);
  ManifestEntry m;
  std::string_view sv;
  BOOST_REQUIRE(doc["name"].get(sv) == simdjson::SUCCESS);
  m.name = sv;
  BOOST_REQUIRE(doc["type"].get(sv) == simdjson::SUCCESS);
  m.type = sv;
  BOOST_REQUIRE(doc["sha256"].get(sv) == simdjson::SUCCESS);
  m.sha256 = sv;
  BOOST_REQUIRE(doc["size"].get(m.size) == simdjson::SUCCESS);
  BOOST_REQUIRE(doc["rank"].get(m.rank) == simdjson::SUCCESS);
  BOOST_REQUIRE(doc["step"].get(m.step) == simdjson::SUCCESS);
  BOOST_REQUIRE(doc["timestamp"].get(m.timestamp) == simdjson::SUCCESS);
  return m;
}

/// Every line of <run_dir>/artifacts.jsonl (none if it is missing).
inline std::vector<ManifestEntry> read_manifest(const std::string& run_dir) {
  std::vector<ManifestEntry> out;
  for (const std::string& line : lines_of(run_dir + "/artifacts.jsonl")) out.push_back(parse_manifest_line(line));
  return out;
}

/// Whether a copy left its temporary file anywhere under `dir`.
inline bool has_temp_files(const std::string& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

} // namespace chorus::test::files
