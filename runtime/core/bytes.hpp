// Little-endian fields appended to a byte buffer: the one way chorus's
// binary encodings (wire frames, histograms, media) write a field.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace chorus::core::bytes {

template <class T>
inline void put(std::vector<char>& out, T v) {
  const auto n = out.size();
  out.resize(n + sizeof(T));
  std::memcpy(out.data() + n, &v, sizeof(T));
}
/// A u32 length, then the bytes.
inline void put_bytes(std::vector<char>& out, std::string_view s) {
  put<std::uint32_t>(out, static_cast<std::uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

} // namespace chorus::core::bytes
