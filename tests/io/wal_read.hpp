// A WAL read back whole in tests: the scan, and each frame's payload and offset.
#pragma once

#include "io/store/wal.hpp"

#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

namespace chorus::test::files {

struct Read {
  store::WalScan scan;
  std::vector<std::string> payloads;
  std::vector<std::uint64_t> offsets;
};

inline Read read_all(const std::string& path) {
  Read r;
  Result<store::WalScan> scan = store::scan_wal(path, [&](std::span<const char> p, std::uint64_t off) {
    r.payloads.emplace_back(p.data(), p.size());
    r.offsets.push_back(off);
  });
  BOOST_REQUIRE_MESSAGE(scan, scan.error().message());
  r.scan = std::move(*scan);
  return r;
}

} // namespace chorus::test::files
