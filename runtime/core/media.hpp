// Images, text and tables (Run::log_image, log_text, log_table) as they
// travel from a rank to its run host and land in the WAL: one encoding for
// the RankProxy, the Run actor and `chorus recover`.
//
// Encoding, little-endian, no padding:
//   u8 MediaKind, u32 width, u32 height, u8 channels, u32 len, format bytes,
//   u32 len, caption bytes, u32 len, data bytes
// A PNG or JPEG image's data is the file; text's is UTF-8 markdown; a
// table's is JSON, {"columns": [...], "data": [[...], ...]} (W&B's Table).
#pragma once

#include <chorus/chorus.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::core {

enum class MediaKind : std::uint8_t { image = 1, text = 2, table = 3 };
std::string_view to_string(MediaKind k) noexcept;

/// The most bytes of one image, text or table, and pixels on a side.
inline constexpr std::size_t max_media_bytes = std::size_t{64} << 20;
inline constexpr int max_image_side = 16384;
inline constexpr std::size_t max_caption_bytes = 4096;

struct Media {
  MediaKind kind = MediaKind::image;
  std::string format; // "png", "jpeg", "md", "json"
  std::string caption;
  std::uint32_t width = 0, height = 0; // images
  std::uint8_t channels = 0;           // images from pixels; 0 where the file says
  std::vector<char> data;

  /// The file name extension of its data.
  [[nodiscard]] std::string_view extension() const noexcept;
};

namespace media {

void encode(const Media& m, std::vector<char>& out);
[[nodiscard]] std::size_t encoded_size(const Media& m) noexcept;
/// Decodes exactly `body`; false where it is not what encode() writes (a
/// kind or format that does not go together, a size past the limits).
[[nodiscard]] bool decode(std::span<const char> body, Media& out);
[[nodiscard]] bool valid(std::span<const char> body);

/// An image file's format and size from its header: "png" or "jpeg", or an
/// Error naming what is wrong (neither, truncated, a side of 0 or past
/// max_image_side).
struct ImageHeader {
  std::string format;
  std::uint32_t width = 0, height = 0;
};
[[nodiscard]] Error image_header(std::span<const char> file, ImageHeader& out);

} // namespace media
} // namespace chorus::core
