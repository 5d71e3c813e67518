// TensorBoard event files read by a reader of the tests' own: a bitwise
// CRC32C, a protobuf wire decoder, and the Event / Summary / Value /
// SummaryMetadata / TensorProto / HistogramProto / Summary.Image fields of
// docs/TENSORBOARD.md. It shares no code with the writer
// (io/upload/tfevents.hpp), so a mistake in one shows against the other.
#pragma once

#include "tests/temp_dir.hpp"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

namespace chorus::test::tfevents {

// ---------------------------------------------------------------------------
// The reader: records.

/// A 32-bit CRC of the reflected polynomial `poly` one bit at a time,
/// straight from the definition: initial value and final XOR all ones.
inline std::uint32_t bitwise_crc32(std::string_view data, std::uint32_t poly) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (const char ch : data) {
    c ^= static_cast<unsigned char>(ch);
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) ? (c >> 1) ^ poly : c >> 1;
  }
  return ~c;
}

/// CRC32C: reflected polynomial 0x82F63B78.
inline std::uint32_t bitwise_crc32c(std::string_view data) { return bitwise_crc32(data, 0x82F63B78u); }

inline std::uint32_t masked(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

inline std::uint64_t little_endian(std::string_view bytes) {
  std::uint64_t v = 0;
  for (std::size_t i = bytes.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

/// The records of an events file, or why reading stopped (`problem`).
struct Records {
  std::vector<std::string> data;
  std::string problem;
};

inline Records read_records(std::string_view file) {
  Records out;
  std::size_t at = 0;
  while (at < file.size()) {
    const std::string where = " (record " + std::to_string(out.data.size()) + " at byte " + std::to_string(at) + ")";
    if (file.size() - at < 12) {
      out.problem = "truncated header" + where;
      return out;
    }
    const std::string_view len_bytes = file.substr(at, 8);
    if (little_endian(file.substr(at + 8, 4)) != masked(bitwise_crc32c(len_bytes))) {
      out.problem = "length CRC mismatch" + where;
      return out;
    }
    const std::uint64_t len = little_endian(len_bytes);
    if (file.size() - at - 12 < len || file.size() - at - 12 - len < 4) {
      out.problem = "truncated data" + where;
      return out;
    }
    const std::string_view data = file.substr(at + 12, len);
    if (little_endian(file.substr(at + 12 + len, 4)) != masked(bitwise_crc32c(data))) {
      out.problem = "data CRC mismatch" + where;
      return out;
    }
    out.data.emplace_back(data);
    at += 12 + len + 4;
  }
  return out;
}

// ---------------------------------------------------------------------------
// The reader: the protobuf wire format.

struct Field {
  std::uint32_t number = 0;
  std::uint32_t wire = 0;   // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  std::uint64_t number_value = 0; // varint, fixed64 or fixed32
  std::string_view bytes;   // length-delimited
};

inline std::uint64_t read_varint(std::string_view msg, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (at >= msg.size()) throw std::runtime_error("varint runs past the message");
    const auto b = static_cast<unsigned char>(msg[at++]);
    v |= std::uint64_t{b & 0x7Fu} << shift;
    if ((b & 0x80u) == 0) return v;
  }
  throw std::runtime_error("varint longer than 10 bytes");
}

inline std::vector<Field> fields_of(std::string_view msg) {
  std::vector<Field> out;
  std::size_t at = 0;
  while (at < msg.size()) {
    const std::uint64_t key = read_varint(msg, at);
    Field f;
    f.number = static_cast<std::uint32_t>(key >> 3);
    f.wire = static_cast<std::uint32_t>(key & 7u);
    if (f.number == 0) throw std::runtime_error("field number 0");
    switch (f.wire) {
    case 0:
      f.number_value = read_varint(msg, at);
      break;
    case 1:
    case 5: {
      const std::size_t n = f.wire == 1 ? 8 : 4;
      if (msg.size() - at < n) throw std::runtime_error("fixed field runs past the message");
      f.number_value = little_endian(msg.substr(at, n));
      at += n;
      break;
    }
    case 2: {
      const std::uint64_t n = read_varint(msg, at);
      if (msg.size() - at < n) throw std::runtime_error("length-delimited field runs past the message");
      f.bytes = msg.substr(at, n);
      at += n;
      break;
    }
    default:
      throw std::runtime_error("wire type " + std::to_string(f.wire));
    }
    out.push_back(f);
  }
  return out;
}

inline void expect_wire(const Field& f, std::uint32_t wire, const char* what) {
  if (f.wire != wire)
    throw std::runtime_error(std::string(what) + ": wire type " + std::to_string(f.wire) + ", expected " +
                             std::to_string(wire));
}

// ---------------------------------------------------------------------------
// The reader: the messages (field numbers of event.proto, summary.proto, tensor.proto).

/// A Summary.Value as read.
struct TbValue {
  std::string tag;
  std::optional<float> simple_value;
  bool has_metadata = false;
  std::string plugin_name;
  std::string plugin_content;
  bool has_tensor = false;
  std::int64_t dtype = 0;
  bool has_shape = false;
  int shape_dims = 0;
  std::vector<std::int64_t> dim_sizes; // TensorShapeProto.dim[].size
  std::vector<std::string> string_val;
  /// Value.histo: HistogramProto{min 1, max 2, num 3, sum 4, sum_squares 5,
  /// bucket_limit 6, bucket 7} (doubles; the repeated ones packed).
  struct Histo {
    double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
    std::vector<double> bucket_limit, bucket;
  };
  std::optional<Histo> histo;
  /// Value.image: Summary.Image{height 1, width 2, colorspace 3, encoded_image_string 4}.
  struct Image {
    std::int64_t height = 0, width = 0, colorspace = 0;
    std::string encoded;
  };
  std::optional<Image> image;
};

/// An Event as read.
struct TbEvent {
  double wall_time = 0;
  std::int64_t step = 0;
  std::optional<std::string> file_version;
  bool has_summary = false;
  std::vector<TbValue> values;
};

inline void decode_tensor(std::string_view msg, TbValue& v) {
  v.has_tensor = true;
  for (const Field& f : fields_of(msg)) {
    if (f.number == 1) {
      expect_wire(f, 0, "TensorProto.dtype");
      v.dtype = static_cast<std::int64_t>(f.number_value);
    } else if (f.number == 2) {
      expect_wire(f, 2, "TensorProto.tensor_shape");
      v.has_shape = true;
      for (const Field& d : fields_of(f.bytes)) {
        if (d.number != 2) throw std::runtime_error("unexpected TensorShapeProto field " + std::to_string(d.number));
        expect_wire(d, 2, "TensorShapeProto.dim");
        ++v.shape_dims;
        std::int64_t size = 0;
        for (const Field& z : fields_of(d.bytes)) {
          if (z.number != 1) throw std::runtime_error("unexpected Dim field " + std::to_string(z.number));
          expect_wire(z, 0, "Dim.size");
          size = static_cast<std::int64_t>(z.number_value);
        }
        v.dim_sizes.push_back(size);
      }
    } else if (f.number == 8) {
      expect_wire(f, 2, "TensorProto.string_val");
      v.string_val.emplace_back(f.bytes);
    } else {
      throw std::runtime_error("unexpected TensorProto field " + std::to_string(f.number));
    }
  }
}

inline double as_double(std::uint64_t bits);

inline TbValue::Histo decode_histo(std::string_view msg) {
  TbValue::Histo h;
  auto packed = [](const Field& f, std::vector<double>& into) {
    expect_wire(f, 2, "HistogramProto packed doubles");
    if (f.bytes.size() % 8 != 0) throw std::runtime_error("packed doubles of " + std::to_string(f.bytes.size()) + " bytes");
    for (std::size_t i = 0; i < f.bytes.size(); i += 8) into.push_back(as_double(little_endian(f.bytes.substr(i, 8))));
  };
  for (const Field& f : fields_of(msg)) {
    if (f.number >= 1 && f.number <= 5) {
      expect_wire(f, 1, "HistogramProto double");
      double* slot[] = {&h.min, &h.max, &h.num, &h.sum, &h.sum_squares};
      *slot[f.number - 1] = as_double(f.number_value);
    } else if (f.number == 6) {
      packed(f, h.bucket_limit);
    } else if (f.number == 7) {
      packed(f, h.bucket);
    } else {
      throw std::runtime_error("unexpected HistogramProto field " + std::to_string(f.number));
    }
  }
  if (h.bucket_limit.size() != h.bucket.size()) throw std::runtime_error("bucket_limit and bucket differ in length");
  return h;
}

inline TbValue::Image decode_image(std::string_view msg) {
  TbValue::Image im;
  for (const Field& f : fields_of(msg)) {
    if (f.number >= 1 && f.number <= 3) {
      expect_wire(f, 0, "Summary.Image int32");
      std::int64_t* slot[] = {&im.height, &im.width, &im.colorspace};
      *slot[f.number - 1] = static_cast<std::int64_t>(f.number_value);
    } else if (f.number == 4) {
      expect_wire(f, 2, "Summary.Image.encoded_image_string");
      im.encoded = f.bytes;
    } else {
      throw std::runtime_error("unexpected Summary.Image field " + std::to_string(f.number));
    }
  }
  return im;
}

inline void decode_metadata(std::string_view msg, TbValue& v) {
  v.has_metadata = true;
  for (const Field& f : fields_of(msg)) {
    if (f.number != 1) throw std::runtime_error("unexpected SummaryMetadata field " + std::to_string(f.number));
    expect_wire(f, 2, "SummaryMetadata.plugin_data");
    for (const Field& p : fields_of(f.bytes)) {
      expect_wire(p, 2, "PluginData field");
      if (p.number == 1)
        v.plugin_name = p.bytes;
      else if (p.number == 2)
        v.plugin_content = p.bytes;
      else
        throw std::runtime_error("unexpected PluginData field " + std::to_string(p.number));
    }
  }
}

inline TbValue decode_value(std::string_view msg) {
  TbValue v;
  for (const Field& f : fields_of(msg)) {
    switch (f.number) {
    case 1:
      expect_wire(f, 2, "Value.tag");
      v.tag = f.bytes;
      break;
    case 2: {
      expect_wire(f, 5, "Value.simple_value");
      const auto bits = static_cast<std::uint32_t>(f.number_value);
      float x;
      std::memcpy(&x, &bits, sizeof x);
      v.simple_value = x;
      break;
    }
    case 4:
      expect_wire(f, 2, "Value.image");
      v.image = decode_image(f.bytes);
      break;
    case 5:
      expect_wire(f, 2, "Value.histo");
      v.histo = decode_histo(f.bytes);
      break;
    case 8:
      expect_wire(f, 2, "Value.tensor");
      decode_tensor(f.bytes, v);
      break;
    case 9:
      expect_wire(f, 2, "Value.metadata");
      decode_metadata(f.bytes, v);
      break;
    default:
      throw std::runtime_error("unexpected Summary.Value field " + std::to_string(f.number));
    }
  }
  return v;
}

inline TbEvent decode_event(std::string_view msg) {
  TbEvent e;
  for (const Field& f : fields_of(msg)) {
    switch (f.number) {
    case 1: {
      expect_wire(f, 1, "Event.wall_time");
      std::memcpy(&e.wall_time, &f.number_value, sizeof e.wall_time);
      break;
    }
    case 2:
      expect_wire(f, 0, "Event.step");
      e.step = static_cast<std::int64_t>(f.number_value);
      break;
    case 3:
      expect_wire(f, 2, "Event.file_version");
      e.file_version = std::string(f.bytes);
      break;
    case 5:
      expect_wire(f, 2, "Event.summary");
      e.has_summary = true;
      for (const Field& s : fields_of(f.bytes)) {
        if (s.number != 1) throw std::runtime_error("unexpected Summary field " + std::to_string(s.number));
        expect_wire(s, 2, "Summary.value");
        e.values.push_back(decode_value(s.bytes));
      }
      break;
    default:
      throw std::runtime_error("unexpected Event field " + std::to_string(f.number));
    }
  }
  return e;
}

/// The HParams plugin's content (tensorboard/plugins/hparams/plugin_data.proto:
/// HParamsPluginData{version = 1, session_start_info = 3}; SessionStartInfo{
/// map<string, google.protobuf.Value> hparams = 1, start_time_secs = 5}; a map
/// entry {key = 1, value = 2}; Value{number_value = 2, string_value = 3,
/// bool_value = 4}), as read.
struct TbHParams {
  std::int64_t version = -1; // -1: absent, which reads as 0
  bool session_start = false;
  std::vector<std::pair<std::string, std::variant<double, bool, std::string>>> values;
  std::optional<double> start_time;
};

inline double as_double(std::uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

inline TbHParams decode_hparams(std::string_view content) {
  TbHParams h;
  for (const Field& f : fields_of(content)) {
    if (f.number == 1) {
      expect_wire(f, 0, "HParamsPluginData.version");
      h.version = static_cast<std::int64_t>(f.number_value);
      continue;
    }
    if (f.number != 3) throw std::runtime_error("unexpected HParamsPluginData field " + std::to_string(f.number));
    expect_wire(f, 2, "HParamsPluginData.session_start_info");
    h.session_start = true;
    for (const Field& i : fields_of(f.bytes)) {
      if (i.number == 5) {
        expect_wire(i, 1, "SessionStartInfo.start_time_secs");
        h.start_time = as_double(i.number_value);
        continue;
      }
      if (i.number != 1) throw std::runtime_error("unexpected SessionStartInfo field " + std::to_string(i.number));
      expect_wire(i, 2, "SessionStartInfo.hparams");
      std::string key;
      std::optional<std::variant<double, bool, std::string>> value;
      for (const Field& e : fields_of(i.bytes)) {
        expect_wire(e, 2, "map entry field");
        if (e.number == 1) {
          key = e.bytes;
        } else if (e.number == 2) {
          for (const Field& v : fields_of(e.bytes)) {
            if (value) throw std::runtime_error("a Value with two kinds");
            if (v.number == 2) expect_wire(v, 1, "Value.number_value"), value = as_double(v.number_value);
            else if (v.number == 3) expect_wire(v, 2, "Value.string_value"), value = std::string(v.bytes);
            else if (v.number == 4) expect_wire(v, 0, "Value.bool_value"), value = v.number_value != 0;
            else throw std::runtime_error("unexpected Value field " + std::to_string(v.number));
          }
        } else {
          throw std::runtime_error("unexpected map entry field " + std::to_string(e.number));
        }
      }
      if (!value) throw std::runtime_error("hparam " + key + " without a value");
      h.values.emplace_back(key, *value);
    }
  }
  return h;
}

/// Every event of the file at `path`; throws where a record is damaged.
inline std::vector<TbEvent> read_events(const std::string& path) {
  const std::string bytes = chorus::test::slurp(path);
  const Records r = read_records(bytes);
  if (!r.problem.empty()) throw std::runtime_error(path + ": " + r.problem);
  std::vector<TbEvent> out;
  for (const std::string& d : r.data) out.push_back(decode_event(d));
  return out;
}

/// Where a value of a TensorBoard run directory sits: its subdirectory
/// ("" for the directory's own files), its tag and its event's step.
using TagStep = std::tuple<std::string, std::string, std::int64_t>;

/// Every value of every events file in `dir` and its subdirectories (none
/// where `dir` is missing), by where it sits, each with its event.
inline std::map<TagStep, std::vector<std::pair<TbEvent, TbValue>>> values_under(const std::filesystem::path& dir) {
  std::map<TagStep, std::vector<std::pair<TbEvent, TbValue>>> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file() || !f.path().filename().string().starts_with("events.out.tfevents.")) continue;
    const std::string sub = f.path().parent_path() == dir ? "" : f.path().parent_path().filename().string();
    for (const TbEvent& e : read_events(f.path().string()))
      for (const TbValue& v : e.values) out[{sub, v.tag, e.step}].emplace_back(e, v);
  }
  return out;
}

} // namespace chorus::test::tfevents
