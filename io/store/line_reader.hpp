// Complete lines of an append-only file (history.jsonl, system.jsonl,
// events.jsonl, artifacts.jsonl, ...), read a chunk at a time: the one reader
// under `chorus show`'s sections (io/store/json_lines.cpp), `chorus serve`'s
// indexes (cli/serve/), the Uploader's slices (io/upload/slices.cpp) and the
// Python reader. A last line without its newline is being written, or its
// writer stopped mid-line: it is never handed out, only shown by rest().
//
// Every one of them bounds a line at max_line_bytes, and stops the same way
// at a longer one: the lines before it are taken, that line and every line
// after it are not read, and error() names the file, the line and the bound
// (line_too_long).
#pragma once

#include <chorus/chorus.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::store {

/// The longest line read from a run's JSON-lines files: chorus writes lines
/// of a few KiB, so a longer one is damage (or a file that never ends),
/// reported rather than buffered without bound.
inline constexpr std::size_t max_line_bytes = 16u << 20;

/// Why the reading of `path` stops at its line `line` (counted from 1): it
/// runs past `bound` bytes without a newline. Says that the lines after it
/// are not read either, and how the file can be mended: `chorus recover`
/// where the run's write-ahead log rebuilds it, else moving it aside.
[[nodiscard]] Error line_too_long(const std::string& path, std::uint64_t line, std::size_t bound = max_line_bytes);

/// A position in an append-only JSON-lines file: complete lines and bytes before it.
struct Cursor {
  std::uint64_t lines = 0;
  std::uint64_t bytes = 0;
  bool operator==(const Cursor&) const = default;
};

class LineReader {
public:
  struct Limits {
    /// The most one read asks for (the buffer's first size).
    std::size_t chunk = 4u << 20;
    /// A line this long without its newline stops the reading (Next::too_long);
    /// 0: no bound but the file's length.
    std::size_t max_line = max_line_bytes;
    /// Where the reading stops: the file's length as the caller saw it (one
    /// found shorter fails); the largest value reads to the file's end.
    std::uint64_t end = std::numeric_limits<std::uint64_t>::max();
  };
  enum class Next {
    line,     // `line` is the next one
    end,      // no complete line is left (rest() holds what follows the last)
    too_long, // the next line runs past Limits::max_line without a newline: error() says
              // so (line_too_long); nothing more is read
    failed,   // a read failed: error() says why
  };

  /// Each line is followed in memory by at least this many readable bytes, so
  /// that simdjson may parse it in place (its SIMDJSON_PADDING).
  static constexpr std::size_t padding = 64;

  /// Reads the regular file `fd` (which it closes; `path` names it in
  /// errors) from `from`, a position where a line starts.
  LineReader(int fd, std::string path, Cursor from, Limits limits);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  /// The next complete line, without its '\n': valid until the next call.
  /// Reads more of the file only where no complete line is left in memory.
  [[nodiscard]] Next next(std::string_view& line);

  /// Just past the last line handed out.
  [[nodiscard]] Cursor cursor() const noexcept { return cursor_; }
  /// How far into the file it has read.
  [[nodiscard]] std::uint64_t read_to() const noexcept { return pos_; }
  /// Whether a complete line is in memory, not handed out yet.
  [[nodiscard]] bool holds_line() const noexcept;
  /// After Next::end: what follows the last complete line.
  [[nodiscard]] std::string_view rest() const noexcept {
    return {buf_.data() + start_, have_ - start_};
  }
  [[nodiscard]] const Error& error() const noexcept { return error_; }

private:
  int fd_;
  std::string path_;
  Limits limits_;
  Cursor cursor_;
  std::uint64_t pos_;       // the file offset of buf_[have_]
  std::vector<char> buf_;   // cap_ bytes of room, then the padding
  std::size_t cap_ = 0;
  std::size_t start_ = 0;   // the first byte not handed out
  std::size_t scanned_ = 0; // buf_[start_, scanned_) holds no newline
  std::size_t have_ = 0;    // bytes read into buf_
  bool at_end_ = false;
  Error error_;
};

} // namespace chorus::store
