// The files `chorus serve` hands to the browser: its page (cli/serve/assets/)
// and dygraphs, built into the binary by cmake/embed_files.cmake.
#pragma once

#include <span>
#include <string_view>

namespace chorus::cli::serve {

struct Asset {
  std::string_view path; // where it is served: "/", "/app.js", "/dygraph.min.js"
  std::string_view type; // its Content-Type
  std::string_view body;
};

/// Every file; defined in the generated serve_assets.cpp.
std::span<const Asset> assets();

/// The file served at `path`, or null.
inline const Asset* find_asset(std::string_view path) {
  for (const Asset& a : assets())
    if (a.path == path) return &a;
  return nullptr;
}

} // namespace chorus::cli::serve
