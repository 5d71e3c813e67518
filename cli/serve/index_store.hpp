// Where `chorus serve` keeps the indexes of long files between its runs
// (docs/DASHBOARD.md, "Kept indexes"): a directory of the user's own
// (default $XDG_CACHE_HOME/chorus/serve-index, else ~/.cache/chorus/serve-index),
// one file per history.jsonl or system.jsonl that was indexed in the
// background, written whole (a temporary file renamed) by a thread of its
// own, the least recently used removed past a bound. A server opening such
// a file again takes its kept index, checked against the file (its device,
// inode, and the bytes at both ends of what was indexed), and reads only
// what was appended since, instead of indexing it afresh. The format of a
// kept index is cli/serve/lines_store.cpp's.
#pragma once

#include "cli/serve/lines_index.hpp"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace chorus::cli::serve {

class IndexStore {
public:
  /// Keeps indexes in `dir` (made, mode 0700, where missing), at most
  /// `max_bytes` of them together.
  IndexStore(std::string dir, std::uint64_t max_bytes);
  /// Writes what is queued, then stops.
  ~IndexStore();
  IndexStore(const IndexStore&) = delete;
  IndexStore& operator=(const IndexStore&) = delete;

  /// $XDG_CACHE_HOME/chorus/serve-index, else $HOME/.cache/chorus/serve-index
  /// ("" where neither is set).
  [[nodiscard]] static std::string default_dir();

  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }
  /// Whether the directory can be used: made, ours, and not open to others;
  /// where not, `why()` says so and nothing is read or written.
  [[nodiscard]] bool usable() const noexcept { return why_.empty(); }
  [[nodiscard]] const std::string& why() const noexcept { return why_; }

  /// The kept file of the index of `data` (a real path) of `kind`.
  [[nodiscard]] std::string file_for(std::string_view data, FileKind kind) const;
  /// A kept file, mapped into memory as long as it lives.
  class Mapped {
  public:
    Mapped() = default;
    Mapped(const char* data, std::size_t size) : data_(data), size_(size) {}
    Mapped(Mapped&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    Mapped& operator=(Mapped&&) = delete;
    ~Mapped();
    [[nodiscard]] std::string_view bytes() const noexcept { return {data_, size_}; }

  private:
    const char* data_ = nullptr;
    std::size_t size_ = 0;
  };
  /// The bytes of kept file `file`; none where there is none, or it is not
  /// to be trusted (not a regular file of this user's, or writable by
  /// others). Its time is set to now: the least recently used go first.
  [[nodiscard]] Mapped read(const std::string& file) const;
  /// Queues `bytes` to be written as `file`; then the oldest files go
  /// while the directory holds more than its bound.
  void put(std::string file, std::string bytes);
  /// Returns once everything queued so far is written.
  void flush();

private:
  void evict();

  std::string dir_;
  std::uint64_t max_bytes_;
  std::string why_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<std::pair<std::string, std::string>> queue_;
  bool writing_ = false, stop_ = false;
  std::thread writer_;
};

/// A 64-bit hash of `s`, 8 bytes a step: a kept index's check of its own bytes.
[[nodiscard]] std::uint64_t word_hash(std::string_view s) noexcept;

} // namespace chorus::cli::serve
