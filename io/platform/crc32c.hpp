// CRC32C (Castagnoli), the checksum of the WAL's frames and of TensorBoard
// event records. Hardware (SSE4.2) when the CPU has it, else slicing-by-8.
#pragma once

#include <cstddef>
#include <cstdint>

namespace chorus::platform {

/// CRC32C of `n` bytes. Extendable: crc32c(b, nb, crc32c(a, na)) equals the
/// CRC of a followed by b. crc32c("123456789", 9) == 0xE3069283.
[[nodiscard]] std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept;

/// The CRC of a followed by b from crc32c(a), crc32c(b) and b's length, in
/// O(log len_b) without b's bytes (zlib's crc32_combine).
[[nodiscard]] std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) noexcept;

/// The masking TensorBoard applies to the CRCs in its event files, so that a
/// CRC stored inside checksummed data does not checksum to a fixed value.
[[nodiscard]] constexpr std::uint32_t mask_crc32c(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/// masked CRC32C of `n` bytes, as in a TensorBoard record.
[[nodiscard]] inline std::uint32_t masked_crc32c(const void* data, std::size_t n) noexcept {
  return mask_crc32c(crc32c(data, n));
}

namespace detail {
/// The portable path, always available.
[[nodiscard]] std::uint32_t crc32c_software(const void* data, std::size_t n, std::uint32_t crc) noexcept;
/// True when this CPU can run crc32c_hardware.
[[nodiscard]] bool crc32c_hardware_available() noexcept;
/// The SSE4.2 path; call only when crc32c_hardware_available().
[[nodiscard]] std::uint32_t crc32c_hardware(const void* data, std::size_t n, std::uint32_t crc) noexcept;
} // namespace detail

} // namespace chorus::platform
