// File primitives for everything chorus writes: directories 0700 and files
// 0600 whatever the umask, files rewritten atomically, and append-only files
// written in large pieces.
#pragma once

#include "runtime/core/result.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace chorus::platform {

/// mkdir -p: creates `path` and its missing parents with mode 0700 (what
/// exists already is left as it is). `elsewhere`: how the fix of an error
/// says to write somewhere else.
[[nodiscard]] Error make_dirs(const std::string& path,
                              std::string_view elsewhere = "point CHORUS_DIR at another filesystem");

/// Replaces `path` with `content` (mode 0600) so that a reader, or a crash,
/// sees the old file or the new one and never a mix: a temporary file in the
/// same directory, fsync, rename. Without `durable` the fsync is left out: a
/// reader still sees one whole file, but a crash of the machine may leave
/// the old one or an empty one (for a file that is rewritten often and
/// means nothing after such a crash, as a run host's lease).
[[nodiscard]] Error write_file_atomic(const std::string& path, std::string_view content, bool durable = true);

/// A file made durable in two steps, so that several files are made durable
/// together: each one's writes start when it is staged, and commit() waits
/// for them (fsync) and, for a replacement, renames it into place. One never
/// committed leaves the old file as it was.
class StagedFile {
public:
  /// write_file_atomic's first half: `content` in a temporary file beside
  /// `path`, its writes started.
  [[nodiscard]] static Result<StagedFile> replace(const std::string& path, std::string_view content);
  /// The file at `path` as it stands, its writes started; where there is
  /// none, a StagedFile with nothing to commit.
  [[nodiscard]] static Result<StagedFile> existing(const std::string& path);

  StagedFile(StagedFile&& o) noexcept;
  StagedFile& operator=(StagedFile&&) = delete;
  ~StagedFile();
  /// Waits for the file's writes (fsync), then renames a replacement into
  /// place. Once only; nothing after the first call. `durable` false: the
  /// rename alone, for a file whose content something else makes durable
  /// (the run's end, which the WAL holds).
  [[nodiscard]] Error commit(bool durable = true);
  /// Whether there is anything to commit.
  [[nodiscard]] bool staged() const noexcept { return fd_ >= 0; }

private:
  StagedFile() = default;
  int fd_ = -1;
  std::string path_;
  std::string tmp_; // a replacement's temporary file; empty for an existing file
};

/// An append-only file (mode 0600, O_APPEND) written in large pieces: writes
/// gather in memory up to `buffer_limit` and go out in one write(2).
class AppendFile {
public:
  static constexpr std::size_t buffer_limit = 1u << 20;
  static constexpr std::size_t first_buffer = 64u << 10; // a file's buffer until it outgrows it

  /// Opens or creates `path`; `truncate` starts it empty.
  [[nodiscard]] static Result<std::unique_ptr<AppendFile>> open(const std::string& path, bool truncate = false);
  /// Opens `path` as open() does where it exists; null (no error) where it does not.
  [[nodiscard]] static Result<std::unique_ptr<AppendFile>> open_existing(const std::string& path, bool truncate);

  /// Flushes (an error there is lost: call flush() first to see it).
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  /// Buffers `data`; writes out first if the buffer would pass buffer_limit.
  [[nodiscard]] Error write(std::string_view data);
  /// Writes the buffer with one write(2).
  [[nodiscard]] Error flush();
  /// flush(), then fdatasync; nothing where nothing was written since the
  /// file was opened empty or last synced.
  [[nodiscard]] Error sync();
  /// flush(), and the writes of what sync() would sync started
  /// (start_writeback): for several files synced together.
  [[nodiscard]] Error start_sync();

  [[nodiscard]] std::size_t buffered() const noexcept { return buf_.size(); }
  /// The bytes in the file, as far as this writer knows: what it held at
  /// open, and every write out since (not what is still buffered).
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
  static Result<std::unique_ptr<AppendFile>> open_with(const std::string& path, bool truncate, bool create);
  AppendFile(int fd, std::string path, bool unsynced, std::uint64_t size)
      : fd_(fd), path_(std::move(path)), unsynced_(unsynced), size_(size) {}
  Error write_out(std::string_view data);

  int fd_ = -1;
  std::string path_;
  std::string buf_;
  bool unsynced_; // written (or found with content) since the last sync
  std::uint64_t size_ = 0;
};

} // namespace chorus::platform
