// TfEventsWriter's images, texts and tables (io/upload/tfevents.hpp;
// docs/TENSORBOARD.md, "Images, text and tables").
#include "io/upload/tfevents.hpp"
#include "io/upload/tfevents_proto.hpp"

#include <cstring>

namespace chorus::upload {

using namespace proto;

namespace {

std::uint32_t be32(const unsigned char* b) {
  return std::uint32_t{b[0]} << 24 | std::uint32_t{b[1]} << 16 | std::uint32_t{b[2]} << 8 | b[3];
}

/// A PNG's colour type (its IHDR's, the first chunk) as channels, with one
/// more for the alpha of a tRNS chunk before the image data.
int png_colorspace(const unsigned char* b, std::size_t n) {
  if (n < 26) return 3;
  int channels = 0;
  switch (b[25]) {
  case 0: channels = 1; break;  // grey
  case 4: channels = 2; break;  // grey and alpha
  case 6: channels = 4; break;  // RGBA
  default: channels = 3; break; // RGB, or a palette of RGB
  }
  for (std::size_t at = 8; at + 8 <= n && channels != 2 && channels != 4;) {
    const std::uint32_t len = be32(b + at);
    if (std::memcmp(b + at + 4, "tRNS", 4) == 0) return channels + 1;
    if (std::memcmp(b + at + 4, "IDAT", 4) == 0 || len > n - at - 8) break;
    at += 12 + std::size_t{len};
  }
  return channels;
}

/// A JPEG's frame header components: 1 grey, any other count read as RGB.
int jpeg_colorspace(const unsigned char* b, std::size_t n) {
  std::size_t at = 2;
  while (at + 4 <= n && b[at] == 0xFF) {
    const unsigned char marker = b[at + 1];
    if (marker == 0xFF) { // fill
      ++at;
      continue;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) { // no length follows
      at += 2;
      continue;
    }
    // Start of frame: SOF0..SOF15 but DHT (C4), JPG (C8) and DAC (CC).
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC)
      return at + 9 < n && b[at + 9] == 1 ? 1 : 3;
    at += 2 + (std::size_t{b[at + 2]} << 8 | b[at + 3]);
  }
  return 3;
}

} // namespace

int image_colorspace(std::string_view file) noexcept {
  const auto* b = reinterpret_cast<const unsigned char*>(file.data());
  static constexpr unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (file.size() >= 8 && std::memcmp(b, png, 8) == 0) return png_colorspace(b, file.size());
  if (file.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return jpeg_colorspace(b, file.size());
  return 3;
}

void StringTensor::add(std::string_view cell) {
  put_bytes(encoded_, tensor::string_val, cell);
  ++cells_;
}

void TfEventsWriter::string_tensor(std::string_view tag, std::int64_t step, double wall_time_s,
                                   std::initializer_list<std::uint64_t> dims, std::string_view cells,
                                   std::string_view more_cells) {
  // SummaryMetadata{plugin_data{plugin_name "text"}}: the text plugin's
  // content is TextPluginData{version 0}, which serializes to no bytes.
  std::string plugin;
  put_bytes(plugin, plugin_data::plugin_name, "text");
  std::string meta;
  put_bytes(meta, metadata::plugin_data, plugin);
  std::string shape, one;
  for (std::uint64_t size : dims) {
    one.clear();
    put_uint(one, dim::size, size);
    put_bytes(shape, tensor_shape::dim, one);
  }
  // TensorProto{dtype DT_STRING, tensor_shape, string_val...}: its cells
  // come last, so that they are written from where they are.
  std::string head;
  put_uint(head, tensor::dtype, dt_string);
  put_bytes(head, tensor::tensor_shape, shape);
  std::string val;
  put_bytes(val, value::tag, tag);
  put_bytes(val, value::metadata, meta);
  put_length(val, value::tensor, head.size() + cells.size() + more_cells.size());
  val += head;
  add_summary(tag, {val, cells, more_cells}, step, wall_time_s);
}

void TfEventsWriter::text(std::string_view tag, std::int64_t step, double wall_time_s, std::string_view text) {
  if (!take(tag, step)) return;
  std::string cell; // the one string_val's key and length; the text follows from where it is
  put_length(cell, tensor::string_val, text.size());
  string_tensor(tag, step, wall_time_s, {}, cell, text);
}

void TfEventsWriter::table(std::string_view tag, std::int64_t step, double wall_time_s, std::uint64_t rows,
                           std::uint64_t columns, const StringTensor& cells) {
  const bool whole = columns == 0 ? cells.size() == 0 : cells.size() % columns == 0 && cells.size() / columns == rows;
  if (!whole || !take(tag, step)) return;
  string_tensor(tag, step, wall_time_s, {rows, columns}, cells.encoded_);
}

void TfEventsWriter::image(std::string_view tag, std::int64_t step, double wall_time_s, std::string_view file,
                           std::uint32_t width, std::uint32_t height, int colorspace) {
  if (!take(tag, step)) return;
  // Summary.Image{height, width, colorspace, encoded_image_string}: the
  // file's bytes come last, written from where they are.
  std::string head;
  put_uint(head, image::height, height);
  put_uint(head, image::width, width);
  put_uint(head, image::colorspace, static_cast<std::uint64_t>(colorspace));
  put_length(head, image::encoded_image_string, file.size());
  std::string val;
  put_bytes(val, value::tag, tag);
  put_length(val, value::image, head.size() + file.size());
  val += head;
  add_summary(tag, {val, file}, step, wall_time_s);
}

} // namespace chorus::upload
