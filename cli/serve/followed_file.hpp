// An append-only JSON-lines file of a run as an index of `chorus serve`
// follows it (histograms.jsonl; history.jsonl's LinesIndex reads its own the
// same way): each look finds whether the file is there, was replaced
// (`chorus recover` rewrites it) or cut, and how much was appended; the
// complete lines appended are then read once, each handed over with its byte
// offset, and a line refused is counted, the first named with its number.
#pragma once

#include "cli/serve/lines_index.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace chorus::cli::serve {

class FollowedFile {
public:
  explicit FollowedFile(std::string path) : path_(std::move(path)) {}

  /// What a look found.
  struct Look {
    int fd = -1;            // open where there is more to read: read() takes it
    std::uint64_t size = 0; // the file's length
    bool afresh = false;    // new, replaced or cut: what was taken from it is to be forgotten
    bool changed = false;   // the state changed: a problem, the file gone or new, a last line finished
  };
  /// Looks at the file; where it is gone, replaced or cut, starts over (state() empty).
  [[nodiscard]] Look look();

  /// Reads the complete lines of `look.fd` (which it closes) from where the
  /// reading stands up to `end` (`look.size` at the most): each line, its
  /// trailing blanks cut, to `take(line, offset)`, which returns why it
  /// refuses it ("": taken; the caller counts what it takes in
  /// state().rows). Lines past `end` are left for the next call.
  void read(const Look& look, std::uint64_t end,
            const std::function<std::string(std::string_view line, std::uint64_t offset)>& take);

  /// One look and one read, as an index follows its file: `forget()` where
  /// the file is new, replaced or cut, then the complete lines appended, at
  /// most `budget` bytes of them, to `take` as read() hands them. Returns
  /// whether anything changed (lines read, the state, a problem).
  bool follow(std::uint64_t budget, const std::function<void()>& forget,
              const std::function<std::string(std::string_view line, std::uint64_t offset)>& take);

  /// Where the reading stands, the first refusal with its line number.
  [[nodiscard]] IndexState state() const;
  /// The same to change: rows, keys, last_step are the caller's.
  [[nodiscard]] IndexState& counts() noexcept { return state_; }

private:
  void reset();

  const std::string path_;
  IndexState state_;
  std::uint64_t dev_ = 0, ino_ = 0;
  std::uint64_t lines_ = 0; // complete lines read, taken or not
  std::uint64_t first_skipped_line_ = 0;
  std::uint64_t stuck_size_ = 0; // the size at which a line too long stopped the reading
};

} // namespace chorus::cli::serve
