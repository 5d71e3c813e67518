// SystemSampler: labelled keys, node figures on local rank 0 only, and the
// path without NVML.
#define BOOST_TEST_MODULE io_system_metrics
#include "io/sampling/system_metrics.hpp"
#include "tests/temp_dir.hpp"

#include <boost/test/unit_test.hpp>

#include <simdjson.h>

#include <filesystem>
#include <set>
#include <string>

using chorus::sampling::SystemLabels;
using chorus::sampling::SystemSampler;

namespace {

constexpr const char* no_nvml = "libchorus-test-no-such-nvml.so.1";

/// The keys of one sampled line (after checking it is one JSON object).
std::set<std::string> keys_of(SystemSampler& s, std::string& line) {
  chorus::Error e = s.sample_line(line, 1'700'000'000'000'000, 1.5);
  BOOST_TEST(!e, e.message());
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  BOOST_REQUIRE_MESSAGE(!parser.parse(line).get(doc), line);
  std::set<std::string> keys;
  for (auto [k, v] : doc.get_object()) {
    BOOST_TEST(v.is_number(), std::string(k));
    keys.emplace(k);
  }
  BOOST_TEST(double(doc["_timestamp"].get_double()) == 1.7e9);
  BOOST_TEST(double(doc["_runtime"].get_double()) == 1.5);
  return keys;
}

} // namespace

BOOST_AUTO_TEST_CASE(node_figures_come_from_local_rank_zero_only) {
  chorus::test::TempDir dir;
  SystemSampler node0({.node = 2, .rank = 16, .local_rank = 0, .node_figures = true}, dir.str(), no_nvml, nullptr);
  SystemSampler other({.node = 2, .rank = 17, .local_rank = 1, .node_figures = false}, dir.str(), no_nvml, nullptr);
  std::string line;
  auto a = keys_of(node0, line);
  BOOST_TEST(a.count("system.cpu.percent/node-2") == 1u);
  BOOST_TEST(a.count("system.memory.percent/node-2") == 1u);
  BOOST_TEST(a.count("system.disk.percent/node-2") == 1u);
  BOOST_TEST(a.count("system.proc.cpu.percent/rank-16") == 1u);
  BOOST_TEST(a.count("system.proc.memory.rss_bytes/rank-16") == 1u);
  BOOST_TEST(line.find("\"_node\":2") != std::string::npos);
  BOOST_TEST(line.find("\"_rank\":16") != std::string::npos);
  auto b = keys_of(other, line);
  for (const auto& k : b) BOOST_TEST((k.starts_with("_") || k.ends_with("/rank-17")), k);
  BOOST_TEST(b.count("system.proc.threads/rank-17") == 1u);
}

BOOST_AUTO_TEST_CASE(sixty_four_ranks_on_eight_nodes_never_collide) {
  chorus::test::TempDir dir;
  std::set<std::string> all;
  std::size_t total = 0;
  std::string line;
  for (int r = 0; r < 64; ++r) {
    SystemSampler s({.node = r / 8, .rank = r, .local_rank = static_cast<unsigned>(r % 8), .node_figures = r % 8 == 0},
                    dir.str(), no_nvml, nullptr);
    for (const auto& k : keys_of(s, line)) {
      if (k.starts_with("_")) continue;
      all.insert(k);
      ++total;
    }
  }
  BOOST_TEST(all.size() == total); // no key appears in two ranks' lines
  BOOST_TEST(all.count("system.cpu.percent/node-7") == 1u);
  BOOST_TEST(all.count("system.proc.cpu.percent/rank-63") == 1u);
}

BOOST_AUTO_TEST_CASE(without_nvml_one_note_and_no_gpu_keys) {
  chorus::test::TempDir dir;
  SystemSampler s({.node = 0, .rank = 0, .local_rank = 0, .node_figures = true}, dir.str(), no_nvml, "0");
  BOOST_TEST(s.notes().find("no GPU metrics") != std::string::npos, s.notes());
  BOOST_TEST(s.notes().find(no_nvml) != std::string::npos, s.notes());
  BOOST_TEST(s.notes().find('\n') == std::string::npos);
  BOOST_TEST(s.gpu_name().empty());
  std::string line;
  for (const auto& k : keys_of(s, line)) BOOST_TEST(k.find("gpu") == std::string::npos, k);
}

BOOST_AUTO_TEST_CASE(without_nvml_where_no_gpu_is_expected_no_note) {
  // CUDA_VISIBLE_DEVICES unset and no /dev/nvidia*: a CPU-only machine hears nothing of NVML.
  if (std::filesystem::exists("/dev/nvidia0")) return;
  chorus::test::TempDir dir;
  for (const char* visible : {static_cast<const char*>(nullptr), "", "-1"}) {
    SystemSampler s({.node = 0, .rank = 0, .local_rank = 0, .node_figures = true}, dir.str(), no_nvml, visible);
    BOOST_TEST(s.notes().find("NVML") == std::string::npos, s.notes());
  }
}

BOOST_AUTO_TEST_CASE(no_gpu_figures_asked_for_no_note) {
  chorus::test::TempDir dir;
  SystemSampler s({.node = 0, .rank = 3, .local_rank = 3, .node_figures = false}, dir.str(), nullptr, nullptr);
  BOOST_TEST(s.notes().empty(), s.notes());
}

BOOST_AUTO_TEST_CASE(a_broken_proc_is_an_error_naming_the_file_and_the_line_keeps_the_rest) {
  chorus::test::TempDir dir;
  SystemSampler s({.node = 0, .rank = 0, .local_rank = 0, .node_figures = true}, dir.str(), nullptr, nullptr,
                  dir.str() + "/no-proc-here");
  std::string line;
  chorus::Error e = s.sample_line(line, 1'700'000'000'000'000, 0);
  BOOST_TEST(static_cast<bool>(e));
  BOOST_TEST(e.message().find("no-proc-here") != std::string::npos, e.message());
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  BOOST_TEST(!parser.parse(line).get(doc), line); // still one JSON object
}
