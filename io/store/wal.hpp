// The write-ahead log of a run (file `wal` in the run directory): every frame
// the run host applied, in order, each checksummed so that a torn write or a
// flipped bit costs the frames it touches and nothing else.
//
// On disk, all little-endian:
//   u32 wal_magic, u32 payload length, u32 crc32c(length bytes + payload), payload
// The payload is opaque here (a runtime/core/wire.hpp frame for the run host).
#pragma once

#include "runtime/core/result.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace chorus::store {

// Bytes F5 "CHW": 0xF5 never occurs in UTF-8 text, so a resync after damage
// rarely stops on a false start.
inline constexpr std::uint32_t wal_magic = 0x574843F5u;
inline constexpr std::size_t wal_header_size = 12;
/// A longer length field is corruption, not a frame.
inline constexpr std::uint32_t wal_max_payload = 256u << 20;

/// Appends frames to a WAL. One writer per file (an exclusive flock guards it).
class WalWriter {
public:
  /// Opens `path` for appending (mode 0600, created if absent). An existing
  /// file is scanned first and a torn tail is cut, so that new frames follow
  /// the last good one.
  [[nodiscard]] static Result<std::unique_ptr<WalWriter>> open(const std::string& path);

  ~WalWriter();
  WalWriter(const WalWriter&) = delete;
  WalWriter& operator=(const WalWriter&) = delete;

  /// Appends one frame with a single write(2): once this returns, the frame
  /// survives a crash of the process (not of the machine: see sync()).
  [[nodiscard]] Error append(std::span<const char> payload);
  /// Appends several frames with as few writev(2) calls as IOV_MAX allows.
  [[nodiscard]] Error append_many(std::span<const std::span<const char>> payloads);
  /// fdatasync: what was appended survives a crash of the machine.
  [[nodiscard]] Error sync();

  /// Bytes in the file (after the last good frame at open, plus appends).
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The open descriptor, for an fdatasync from a signal handler.
  [[nodiscard]] int fd() const noexcept { return fd_; }

private:
  WalWriter(int fd, std::string path, std::uint64_t size) noexcept : fd_(fd), path_(std::move(path)), size_(size) {}
  Error write_frames(std::span<const std::span<const char>> payloads);

  int fd_ = -1;
  std::string path_;
  std::uint64_t size_ = 0;
};

/// What a scan of a WAL found.
struct WalScan {
  std::uint64_t frames = 0;          // frames delivered
  std::uint64_t good_end = 0;        // offset just after the last good frame
  std::uint64_t skipped_bytes = 0;   // bytes in corrupt regions and in a torn tail
  std::uint32_t corrupt_regions = 0; // damaged stretches followed by a good frame
  bool torn_tail = false;            // bytes after the last good frame (a write cut short)
  std::uint64_t summed_bytes = 0;    // bytes passed through the CRC: linear in the file's size, whatever is in it
  std::vector<std::string> problems; // one line each: the offset and what was wrong
};

using WalFrameFn = std::function<void(std::span<const char> payload, std::uint64_t offset)>;

/// Reads every good frame of `path` in order and passes its payload (and the
/// frame's offset) to `on_frame` (which may be empty). A frame whose length
/// or CRC is wrong is never delivered: the reader scans forward to the next
/// frame that verifies. An error only where the file cannot be read.
[[nodiscard]] Result<WalScan> scan_wal(const std::string& path, const WalFrameFn& on_frame);

/// Cuts `path` at the end of its last good frame if its tail is torn, and
/// returns the scan.
[[nodiscard]] Result<WalScan> truncate_torn_tail(const std::string& path);

} // namespace chorus::store
