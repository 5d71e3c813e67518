// histograms.jsonl read back through its one reader (store::read_histogram_line),
// for the end-to-end tests of histograms.
#pragma once

#include "io/store/histogram_log.hpp"

#include <boost/test/unit_test.hpp>
#include <simdjson.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace e2e {

struct HistogramLineRead {
  std::int64_t step;
  std::string column;
  std::uint32_t ranks;
  chorus::Histogram value;
};

inline std::vector<HistogramLineRead> read_histograms(const std::filesystem::path& run_dir) {
  std::vector<HistogramLineRead> out;
  simdjson::dom::parser parser;
  std::ifstream in(run_dir / "histograms.jsonl");
  for (std::string line; std::getline(in, line);) {
    simdjson::dom::element e;
    BOOST_REQUIRE(parser.parse(line).get(e) == simdjson::SUCCESS);
    chorus::Result<chorus::store::HistogramLine> h = chorus::store::read_histogram_line(e);
    BOOST_TEST_REQUIRE(h.has_value(), (h ? "" : h.error().message()));
    out.push_back({h->step, h->column(), h->ranks, h->value});
  }
  return out;
}

} // namespace e2e
