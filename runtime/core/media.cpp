#include "runtime/core/media.hpp"
#include "runtime/core/bytes.hpp"

#include <cstring>

namespace chorus::core {

std::string_view to_string(MediaKind k) noexcept {
  switch (k) {
    case MediaKind::image: return "image";
    case MediaKind::text: return "text";
    case MediaKind::table: return "table";
  }
  return "unknown";
}

std::string_view Media::extension() const noexcept {
  if (format == "jpeg") return "jpg";
  return format; // png, md, json
}

namespace media {
namespace {

using bytes::put;
using bytes::put_bytes;

class Reader {
public:
  explicit Reader(std::span<const char> b) : p_(b.data()), end_(b.data() + b.size()) {}
  template <class T>
  bool get(T& v) {
    if (static_cast<std::size_t>(end_ - p_) < sizeof(T)) return false;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  bool bytes(std::string_view& s, std::size_t limit) {
    std::uint32_t n;
    if (!get(n) || n > limit || static_cast<std::size_t>(end_ - p_) < n) return false;
    s = std::string_view(p_, n);
    p_ += n;
    return true;
  }
  [[nodiscard]] bool done() const { return p_ == end_; }

private:
  const char* p_;
  const char* end_;
};

bool kind_takes(MediaKind k, std::string_view format) {
  switch (k) {
    case MediaKind::image: return format == "png" || format == "jpeg";
    case MediaKind::text: return format == "md";
    case MediaKind::table: return format == "json";
  }
  return false;
}

bool read(std::span<const char> body, Media* out) {
  Reader in(body);
  std::uint8_t kind = 0, channels = 0;
  std::uint32_t width = 0, height = 0;
  std::string_view format, caption, data;
  if (!in.get(kind) || !in.get(width) || !in.get(height) || !in.get(channels) || !in.bytes(format, 8) ||
      !in.bytes(caption, max_caption_bytes) || !in.bytes(data, max_media_bytes) || !in.done())
    return false;
  const auto k = static_cast<MediaKind>(kind);
  if (kind < 1 || kind > 3 || !kind_takes(k, format)) return false;
  if (k == MediaKind::image &&
      (width == 0 || height == 0 || width > max_image_side || height > max_image_side || channels > 4))
    return false;
  if (out != nullptr) {
    out->kind = k;
    out->format = format;
    out->caption = caption;
    out->width = width;
    out->height = height;
    out->channels = channels;
    out->data.assign(data.begin(), data.end());
  }
  return true;
}

std::uint32_t be32(const unsigned char* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | p[3];
}

} // namespace

std::size_t encoded_size(const Media& m) noexcept {
  return 1 + 4 + 4 + 1 + 4 + m.format.size() + 4 + m.caption.size() + 4 + m.data.size();
}

void encode(const Media& m, std::vector<char>& out) {
  out.reserve(out.size() + encoded_size(m));
  put(out, static_cast<std::uint8_t>(m.kind));
  put(out, m.width);
  put(out, m.height);
  put(out, m.channels);
  put_bytes(out, m.format);
  put_bytes(out, m.caption);
  put_bytes(out, std::string_view(m.data.data(), m.data.size()));
}

bool decode(std::span<const char> body, Media& out) { return read(body, &out); }
bool valid(std::span<const char> body) { return read(body, nullptr); }

Error image_header(std::span<const char> file, ImageHeader& out) {
  const auto* b = reinterpret_cast<const unsigned char*>(file.data());
  const std::size_t n = file.size();
  static constexpr unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto sides = [&](std::uint32_t w, std::uint32_t h) -> Error {
    if (w == 0 || h == 0) return {Errc::invalid_argument, "the image is empty (" + std::to_string(w) + " x " +
                                                              std::to_string(h) + " pixels): log an image with pixels"};
    if (w > max_image_side || h > max_image_side)
      return {Errc::invalid_argument, "the image is " + std::to_string(w) + " x " + std::to_string(h) +
                                          " pixels, over the 16384 a side chorus takes: scale it down"};
    out.width = w;
    out.height = h;
    return {};
  };
  if (n >= 8 && std::memcmp(b, png_sig, 8) == 0) {
    // The IHDR chunk comes first: length, "IHDR", width, height (big-endian).
    if (n < 24 || std::memcmp(b + 12, "IHDR", 4) != 0)
      return {Errc::invalid_argument, "the PNG bytes end before its header (IHDR): pass the whole file"};
    out.format = "png";
    return sides(be32(b + 16), be32(b + 20));
  }
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
    // Walk the markers to the first start of frame (SOF0..SOF15 but DHT,
    // JPG and DAC), whose height and width follow its precision byte.
    std::size_t at = 2;
    while (at + 4 <= n) {
      if (b[at] != 0xFF) return {Errc::invalid_argument, "the JPEG bytes are damaged before their frame header"};
      const unsigned char marker = b[at + 1];
      if (marker == 0xFF) {
        ++at;
        continue;
      }
      const std::size_t len = std::size_t{b[at + 2]} << 8 | b[at + 3];
      if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
        if (at + 9 > n) break;
        out.format = "jpeg";
        return sides(std::uint32_t{b[at + 7]} << 8 | b[at + 8], std::uint32_t{b[at + 5]} << 8 | b[at + 6]);
      }
      if (len < 2) return {Errc::invalid_argument, "the JPEG bytes are damaged before their frame header"};
      at += 2 + len;
    }
    return {Errc::invalid_argument, "the JPEG bytes end before its frame header: pass the whole file"};
  }
  return {Errc::invalid_argument,
          "the image bytes are neither PNG nor JPEG (by their first bytes): pass a PNG or JPEG file's bytes, or "
          "pixels with Image::from_pixels"};
}

} // namespace media
} // namespace chorus::core
