#include "cli/serve/encoding.hpp"

#include <brotli/encode.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace chorus::cli::serve {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool same_name(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

/// The q-value of one element ("gzip;q=0.5"): 1 where none is given, 0 where
/// it cannot be read (a malformed weight is no consent).
double weight(std::string_view params) {
  while (!params.empty()) {
    const std::size_t semi = params.find(';');
    const std::string_view p = trim(params.substr(0, semi));
    params = semi == std::string_view::npos ? std::string_view() : params.substr(semi + 1);
    if (p.size() < 2 || (p[0] != 'q' && p[0] != 'Q') || p[1] != '=') continue;
    const std::string text(trim(p.substr(2)));
    char* end = nullptr;
    const double q = std::strtod(text.c_str(), &end);
    return end != text.c_str() && *end == '\0' && q >= 0 && q <= 1 ? q : 0;
  }
  return 1;
}

std::string gzip(std::string_view body, int level) {
  z_stream z{};
  // 31: a gzip header and trailer (15 bits of window, +16), as HTTP's gzip is.
  if (deflateInit2(&z, level, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::runtime_error("zlib cannot start a gzip stream");
  std::string out(deflateBound(&z, static_cast<uLong>(body.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data()));
  z.avail_in = static_cast<uInt>(body.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw std::runtime_error("zlib could not compress an answer of " + std::to_string(body.size()) + " bytes");
  return out;
}

std::string brotli(std::string_view body, int quality) {
  std::size_t size = BrotliEncoderMaxCompressedSize(body.size());
  std::string out(size != 0 ? size : body.size() + 1024, '\0');
  size = out.size();
  if (BrotliEncoderCompress(quality, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_TEXT, body.size(),
                            reinterpret_cast<const std::uint8_t*>(body.data()), &size,
                            reinterpret_cast<std::uint8_t*>(out.data())) != BROTLI_TRUE)
    throw std::runtime_error("Brotli could not compress an answer of " + std::to_string(body.size()) + " bytes");
  out.resize(size);
  return out;
}

} // namespace

std::string_view coding_name(Coding c) {
  switch (c) {
  case Coding::gzip: return "gzip";
  case Coding::br: return "br";
  case Coding::identity: break;
  }
  return "";
}

bool accepts(std::string_view header, Coding coding) {
  const std::string_view name = coding == Coding::identity ? "identity" : coding_name(coding);
  double named = -1, any = -1;
  while (!header.empty()) {
    const std::size_t comma = header.find(',');
    const std::string_view element = trim(header.substr(0, comma));
    header = comma == std::string_view::npos ? std::string_view() : header.substr(comma + 1);
    const std::size_t semi = element.find(';');
    const std::string_view token = trim(element.substr(0, semi));
    const double q = semi == std::string_view::npos ? 1 : weight(element.substr(semi + 1));
    if (same_name(token, name) || (coding == Coding::gzip && same_name(token, "x-gzip")))
      named = std::max(named, q);
    else if (token == "*")
      any = q;
  }
  if (coding == Coding::identity) return named != 0 && !(named < 0 && any == 0);
  return named >= 0 ? named > 0 : any > 0;
}

Coding pick_coding(std::string_view header, bool have_br, bool have_gzip) {
  if (have_br && accepts(header, Coding::br)) return Coding::br;
  if (have_gzip && accepts(header, Coding::gzip)) return Coding::gzip;
  return Coding::identity;
}

Coding answer_coding(std::string_view header, bool client_on_this_machine, std::size_t size) {
  if (client_on_this_machine || size < smallest_compressed) return Coding::identity;
  return pick_coding(header);
}

// Brotli's quality 1 and gzip's level 1: for a megabyte of series JSON on a
// 2-core machine, 10 and 21 ms for 34 % and 45 % of the size, against 63 ms
// and 2 s at Brotli's 5 and 11 (docs/DASHBOARD.md, "Compression and caching").
int answer_level(Coding) { return 1; }

std::string compress(std::string_view body, Coding coding, int level) {
  switch (coding) {
  case Coding::gzip: return gzip(body, level);
  case Coding::br: return brotli(body, level);
  case Coding::identity: break;
  }
  return std::string(body);
}

} // namespace chorus::cli::serve
