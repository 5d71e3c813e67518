// The protobuf wire format as TfEventsWriter writes it (io/upload/tfevents.cpp,
// tfevents_media.cpp), and the field numbers of the messages it writes
// (docs/TENSORBOARD.md, "The messages", names each message's source).
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

namespace chorus::upload::proto {

// The protobuf wire format (protobuf.dev/programming-guides/encoding): a key
// is (field number << 3) | wire type, then the value.
enum Wire : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

// tensorflow.DataType (types.proto).
inline constexpr std::uint64_t dt_float = 1, dt_string = 7;

inline void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

/// The bytes put_varint writes for `v`.
[[nodiscard]] constexpr std::size_t varint_size(std::uint64_t v) noexcept {
  std::size_t n = 1;
  for (; v >= 0x80; v >>= 7) ++n;
  return n;
}

inline void put_key(std::string& out, std::uint32_t field, Wire wire) {
  put_varint(out, (std::uint64_t{field} << 3) | wire);
}

inline void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

inline void put_double(std::string& out, std::uint32_t field, double v) {
  put_key(out, field, fixed64);
  put_le(out, std::bit_cast<std::uint64_t>(v), 8);
}

inline void put_float(std::string& out, std::uint32_t field, float v) {
  put_key(out, field, fixed32);
  put_le(out, std::bit_cast<std::uint32_t>(v), 4);
}

inline void put_uint(std::string& out, std::uint32_t field, std::uint64_t v) {
  put_key(out, field, varint);
  put_varint(out, v);
}

/// The key and length of a length-delimited field whose `size` bytes follow.
inline void put_length(std::string& out, std::uint32_t field, std::uint64_t size) {
  put_key(out, field, length_delimited);
  put_varint(out, size);
}

inline void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_length(out, field, bytes.size());
  out.append(bytes);
}

// Field numbers: event.proto, summary.proto, tensor.proto, tensor_shape.proto.
namespace event {
inline constexpr std::uint32_t wall_time = 1, step = 2, file_version = 3, summary = 5;
}
namespace summary {
inline constexpr std::uint32_t value = 1;
}
namespace value {
inline constexpr std::uint32_t tag = 1, simple_value = 2, image = 4, histo = 5, tensor = 8, metadata = 9;
}
namespace image { // Summary.Image
inline constexpr std::uint32_t height = 1, width = 2, colorspace = 3, encoded_image_string = 4;
}
namespace histogram_proto {
inline constexpr std::uint32_t min = 1, max = 2, num = 3, sum = 4, bucket_limit = 6, bucket = 7;
}
namespace metadata {
inline constexpr std::uint32_t plugin_data = 1;
}
namespace plugin_data {
inline constexpr std::uint32_t plugin_name = 1, content = 2;
}
namespace tensor {
inline constexpr std::uint32_t dtype = 1, tensor_shape = 2, string_val = 8;
}
namespace tensor_shape {
inline constexpr std::uint32_t dim = 2;
}
namespace dim {
inline constexpr std::uint32_t size = 1;
}
// The HParams plugin: plugin_data.proto, and google.protobuf.Value from struct.proto.
namespace hparams_plugin_data {
inline constexpr std::uint32_t session_start_info = 3; // version = 1 is 0, so left out
}
namespace session_start_info {
inline constexpr std::uint32_t hparams = 1, start_time_secs = 5;
}
namespace map_entry {
inline constexpr std::uint32_t key = 1, value = 2;
}
namespace proto_value {
inline constexpr std::uint32_t number_value = 2, string_value = 3, bool_value = 4;
}

} // namespace chorus::upload::proto
