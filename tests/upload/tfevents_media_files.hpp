// Images, texts and tables in a run directory as the run host leaves them
// (a file under media/, then its media.jsonl line), for the TensorBoard
// tests. The images are real files made here byte by byte, with no code of
// chorus's: a PNG of any colour type (zlib's stored blocks) and a baseline
// JPEG of 8 x 8 mid-grey pixels, 1 or 3 components, that a JPEG decoder reads.
#pragma once

#include "io/store/media_log.hpp"
#include "runtime/core/media.hpp"
#include "tests/upload/tfevents_reader.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::test::media_files {

inline void put_be32(std::string& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xFF));
}

/// A PNG chunk: length, type, data, and the CRC-32 (ISO-HDLC: reflected
/// polynomial 0xEDB88320) of type and data.
inline void png_chunk(std::string& out, std::string_view type, std::string_view data) {
  put_be32(out, static_cast<std::uint32_t>(data.size()));
  const std::string body = std::string(type) + std::string(data);
  out += body;
  put_be32(out, tfevents::bitwise_crc32(body, 0xEDB88320u));
}

/// The samples a pixel of `colour_type` holds (3: a palette index).
inline int png_samples(int colour_type) {
  switch (colour_type) {
  case 0: return 1;
  case 2: return 3;
  case 3: return 1;
  case 4: return 2;
  default: return 4;
  }
}

/// A PNG of `width` x `height` 8-bit pixels of `colour_type` (0 grey, 2 RGB,
/// 3 a palette of 4 colours, 4 grey and alpha, 6 RGBA), with a tRNS chunk
/// where `transparent`; the samples a pattern of their place.
inline std::string png_file(std::uint32_t width, std::uint32_t height, int colour_type, bool transparent = false) {
  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_be32(ihdr, width);
  put_be32(ihdr, height);
  ihdr += {8, static_cast<char>(colour_type), 0, 0, 0};
  png_chunk(out, "IHDR", ihdr);
  if (colour_type == 3) png_chunk(out, "PLTE", std::string("\xff\x00\x00\x00\xff\x00\x00\x00\xff\x80\x80\x80", 12));
  if (transparent) // a palette's alpha per entry; grey's or RGB's one transparent colour
    png_chunk(out, "tRNS", colour_type == 3 ? std::string("\x00\xff", 2) : std::string(colour_type == 2 ? 6 : 2, '\0'));
  // The rows, each after its filter byte (0, none), in zlib's stored blocks
  // of at most 65535 bytes, and their Adler-32.
  std::string raw;
  const int samples = png_samples(colour_type);
  for (std::uint32_t y = 0; y < height; ++y) {
    raw.push_back('\0');
    for (std::uint32_t x = 0; x < width; ++x)
      for (int c = 0; c < samples; ++c)
        raw.push_back(static_cast<char>(colour_type == 3 ? (x + y) % 4
                                                         : (x * 31 + y * 17 + static_cast<std::uint32_t>(c) * 7) & 0xFF));
  }
  std::string z("\x78\x01", 2);
  std::size_t at = 0;
  do {
    const std::size_t n = std::min<std::size_t>(raw.size() - at, 65535);
    z.push_back(at + n == raw.size() ? '\x01' : '\x00'); // BFINAL on the last, BTYPE 00: stored
    z += {static_cast<char>(n & 0xFF), static_cast<char>(n >> 8), static_cast<char>(~n & 0xFF),
          static_cast<char>((~n >> 8) & 0xFF)};
    z.append(raw, at, n);
    at += n;
  } while (at < raw.size());
  std::uint32_t a = 1, b = 0;
  for (const char ch : raw) {
    a = (a + static_cast<unsigned char>(ch)) % 65521;
    b = (b + a) % 65521;
  }
  put_be32(z, b << 16 | a);
  png_chunk(out, "IDAT", z);
  png_chunk(out, "IEND", "");
  return out;
}

/// A baseline JPEG of 8 x 8 pixels and `components` (1 grey, 3 YCbCr),
/// every pixel mid-grey: one quantisation table, one DC and one AC Huffman
/// table of a single 1-bit code each (DC difference 0, end of block), and
/// per component a block of those two codes.
inline std::string jpeg_file(int components) {
  std::string out("\xFF\xD8", 2);
  auto segment = [&out](unsigned char marker, const std::string& body) {
    out += {'\xFF', static_cast<char>(marker), static_cast<char>((body.size() + 2) >> 8),
            static_cast<char>((body.size() + 2) & 0xFF)};
    out += body;
  };
  segment(0xDB, std::string(1, '\0') + std::string(64, '\x01')); // DQT: table 0, all ones
  std::string sof{8, 0, 8, 0, 8, static_cast<char>(components)};  // precision, height, width
  for (int c = 1; c <= components; ++c) sof += {static_cast<char>(c), '\x11', '\0'};
  segment(0xC0, sof);
  std::string bits(16, '\0');
  bits[0] = 1; // one code of length 1
  segment(0xC4, std::string(1, '\x00') + bits + std::string(1, '\x00')); // DC table 0: category 0
  segment(0xC4, std::string(1, '\x10') + bits + std::string(1, '\x00')); // AC table 0: end of block
  std::string sos(1, static_cast<char>(components));
  for (int c = 1; c <= components; ++c) sos += {static_cast<char>(c), '\0'};
  sos += {'\0', '\x3F', '\0'};
  segment(0xDA, sos);
  // Two 0 bits a block, padded with 1 bits to the byte.
  out.push_back(static_cast<char>(0xFF >> (2 * components)));
  out += "\xFF\xD9";
  return out;
}

/// Writes `bytes` as the run's media of `key` from `rank` at `step` (its
/// file under media/, then its media.jsonl line, as the run host does);
/// returns the line's path.
inline std::string add_media(const std::filesystem::path& run_dir, std::int64_t step, std::string_view key, int rank,
                             chorus::core::MediaKind kind, std::string_view format, const std::string& bytes,
                             std::string_view caption = {}, std::uint32_t width = 0, std::uint32_t height = 0) {
  chorus::core::Media m;
  m.kind = kind;
  m.format = format;
  m.caption = caption;
  m.width = width;
  m.height = height;
  m.data.assign(bytes.begin(), bytes.end());
  const std::string path = store::media_path(key, rank, step, m.extension());
  std::filesystem::create_directories((run_dir / path).parent_path());
  std::ofstream(run_dir / path, std::ios::binary | std::ios::trunc) << bytes;
  std::string line;
  const std::int64_t ts_us = 1'700'000'000'000'000 + step * 250'000 + rank * 1000;
  store::append_media_line(line, step, ts_us, step * 250'000, key, rank, m, path);
  std::ofstream(run_dir / "media.jsonl", std::ios::binary | std::ios::app) << line;
  return path;
}

/// A table file as the run host writes it: {"columns": [...], "data": [[...], ...]}.
inline std::string table_json(const std::string& columns, const std::string& rows) {
  return R"({"columns":)" + columns + R"(,"data":)" + rows + "}";
}

} // namespace chorus::test::media_files
