// The files `chorus serve` hands to the browser: its page (cli/serve/assets/)
// and dygraphs, built into the binary by cli/serve/embed_assets.cpp, each
// already compressed with Brotli and gzip at their highest levels and named
// by its content, so that a browser keeps it until the page changes.
#pragma once

#include <span>
#include <string_view>

namespace chorus::cli::serve {

struct Asset {
  std::string_view path;   // where it is served by its name: "/", "/app.js", "/dygraph.min.js"
  std::string_view hashed; // where it is served by its content: "/app.0123456789ab.js" ("" for the page itself)
  std::string_view type;   // its Content-Type
  std::string_view etag;   // its ETag, quoted: the hash of its content
  std::string_view body;   // as it is
  std::string_view gzip;   // gzip-compressed, or "" where that is no smaller
  std::string_view br;     // Brotli-compressed, or "" where that is no smaller
};

/// Every file; defined in the generated serve_assets.cpp.
std::span<const Asset> assets();

/// A file found by an address: by its content's name (`immutable`: it
/// never changes under that name) or by its own.
struct AssetMatch {
  const Asset* asset = nullptr;
  bool immutable = false;
  explicit operator bool() const { return asset != nullptr; }
};

/// The file served at `path`, if any.
inline AssetMatch find_asset(std::string_view path) {
  for (const Asset& a : assets()) {
    if (a.path == path) return {&a, false};
    if (!a.hashed.empty() && a.hashed == path) return {&a, true};
  }
  return {};
}

} // namespace chorus::cli::serve
