// Build-time tool: writes the C++ source holding the page of `chorus serve`
// and dygraphs (cli/serve/assets.hpp's table), so that the page needs no
// network and costs the server nothing to compress:
//   chorus_embed_assets OUT.cpp /=index.html /app.js=format.js+app.js ...
// (FILE+FILE...: served as one file of them all, in that order.)
// Each file but the page is also served under a name carrying a hash of its
// content ("/app.0123456789ab.js"), and the page (the one at "/") names the
// others by those names: a browser may keep them for good, and a changed file
// is a new name. Each is stored as it is, and compressed with Brotli (quality
// 11) and gzip (level 9) where that is smaller.
#include "cli/serve/encoding.hpp"
#include "runtime/core/fnv.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using chorus::cli::serve::Coding;

struct File {
  std::string path, source, type, body, hashed, etag, gzip, br;
};

std::string read_whole(const std::string& name) {
  std::ifstream in(name, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + name);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// FNV-1a, 64 bits, as 12 hex digits: a name that changes with the content
/// (not a defence against anyone: the files are the build's own).
std::string content_hash(std::string_view s) {
  const std::uint64_t h = chorus::core::fnv1a64(s);
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return std::string(out, 12);
}

std::string type_of(const std::string& source) {
  const auto ends = [&](std::string_view ext) { return source.ends_with(ext); };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

/// "/app.js" -> "/app.HASH.js"; "/dygraph.min.js" -> "/dygraph.min.HASH.js".
std::string hashed_name(const std::string& path, const std::string& hash) {
  const std::size_t dot = path.rfind('.');
  if (dot == std::string::npos || dot < path.rfind('/')) return path + "." + hash;
  return path.substr(0, dot) + "." + hash + path.substr(dot);
}

/// Every quoted reference to `from` in the page ("app.js" or "/app.js") made one to `to`.
void rename_in(std::string& page, const std::string& from, const std::string& to) {
  for (const std::string& name : {from, from.substr(1)}) {
    const std::string quoted = "\"" + name + "\"";
    const std::string by = "\"" + (name.starts_with('/') ? to : to.substr(1)) + "\"";
    for (std::size_t at = page.find(quoted); at != std::string::npos; at = page.find(quoted, at + by.size()))
      page.replace(at, quoted.size(), by);
  }
}

void put_array(std::ostream& out, const std::string& name, const std::string& bytes) {
  out << "const unsigned char " << name << "[] = {";
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i % 40 == 0) out << "\n";
    out << static_cast<unsigned>(static_cast<unsigned char>(bytes[i])) << ",";
  }
  out << "0};\n";
}

std::string view_of(const std::string& name, const std::string& bytes) {
  if (bytes.empty()) return "{}";
  return "{reinterpret_cast<const char*>(" + name + "), " + std::to_string(bytes.size()) + "}";
}

std::string literal(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: chorus_embed_assets OUT.cpp URL=FILE[+FILE...]...\n";
    return 2;
  }
  try {
    std::vector<File> files;
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      const std::size_t eq = arg.find('=');
      if (eq == std::string::npos || arg.front() != '/')
        throw std::runtime_error("'" + arg + "' is not URL=FILE (a URL starting with /)");
      File f;
      f.path = arg.substr(0, eq);
      f.source = arg.substr(eq + 1);
      f.type = type_of(f.source.substr(0, f.source.find('+')));
      // FILE+FILE...: one file of them all, in that order.
      for (std::size_t at = 0; at <= f.source.size();) {
        const std::size_t end = std::min(f.source.find('+', at), f.source.size());
        if (!f.body.empty()) f.body += '\n';
        f.body += read_whole(f.source.substr(at, end - at));
        at = end + 1;
      }
      files.push_back(std::move(f));
    }
    // The files first, then the page, which names them by their hashed names.
    for (File& f : files)
      if (f.path != "/") f.hashed = hashed_name(f.path, content_hash(f.body));
    for (File& page : files) {
      if (page.path != "/") continue;
      for (const File& f : files)
        if (f.path != "/") rename_in(page.body, f.path, f.hashed);
    }
    for (File& f : files) {
      f.etag = "\"";
      f.etag += content_hash(f.body);
      f.etag += '"';
      f.gzip = chorus::cli::serve::compress(f.body, Coding::gzip, 9);
      f.br = chorus::cli::serve::compress(f.body, Coding::br, 11);
      if (f.gzip.size() >= f.body.size()) f.gzip.clear();
      if (f.br.size() >= f.body.size()) f.br.clear();
    }

    std::ostringstream out;
    out << "// Generated by chorus_embed_assets (cli/serve/embed_assets.cpp): do not edit.\n"
        << "#include \"cli/serve/assets.hpp\"\n\nnamespace chorus::cli::serve {\nnamespace {\n";
    for (std::size_t i = 0; i < files.size(); ++i) {
      out << "// " << files[i].source << "\n";
      put_array(out, "body" + std::to_string(i), files[i].body);
      put_array(out, "gzip" + std::to_string(i), files[i].gzip);
      put_array(out, "br" + std::to_string(i), files[i].br);
    }
    out << "} // namespace\n\nstd::span<const Asset> assets() {\n  static const Asset table[] = {\n";
    for (std::size_t i = 0; i < files.size(); ++i) {
      const File& f = files[i];
      const std::string n = std::to_string(i);
      out << "      {" << literal(f.path) << ", " << literal(f.hashed) << ", " << literal(f.type) << ", "
          << literal(f.etag) << ",\n       " << view_of("body" + n, f.body) << ", " << view_of("gzip" + n, f.gzip)
          << ", " << view_of("br" + n, f.br) << "},\n";
    }
    out << "  };\n  return table;\n}\n\n} // namespace chorus::cli::serve\n";

    // Rewritten only when it changes, so that an unchanged page compiles nothing.
    const std::string text = out.str();
    const std::string target = argv[1];
    std::ifstream old(target, std::ios::binary);
    if (old && std::string(std::istreambuf_iterator<char>(old), std::istreambuf_iterator<char>()) == text) return 0;
    std::ofstream write(target, std::ios::binary | std::ios::trunc);
    write << text;
    if (!write.flush()) throw std::runtime_error("cannot write " + target);
  } catch (const std::exception& e) {
    std::cerr << "chorus_embed_assets: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
