#include "io/store/line_reader.hpp"

#include "io/platform/posix.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unistd.h>

namespace chorus::io {

static_assert(LineReader::padding >= simdjson::SIMDJSON_PADDING);

LineReader::LineReader(int fd, std::string path, Cursor from, Limits limits)
    : fd_(fd), path_(std::move(path)), limits_(limits), cursor_(from), pos_(from.bytes) {
  cap_ = std::max<std::size_t>(limits_.chunk, 1);
  if (limits_.max_line != 0) cap_ = std::min(cap_, limits_.max_line);
  buf_.resize(cap_ + padding);
}

LineReader::~LineReader() { detail::close_fd(fd_); }

bool LineReader::holds_line() const noexcept {
  const std::size_t from = std::max(start_, scanned_);
  return std::memchr(buf_.data() + from, '\n', have_ - from) != nullptr;
}

LineReader::Next LineReader::next(std::string_view& line) {
  for (;;) {
    const std::size_t from = std::max(start_, scanned_);
    if (const auto* nl = static_cast<const char*>(std::memchr(buf_.data() + from, '\n', have_ - from))) {
      const auto end = static_cast<std::size_t>(nl - buf_.data());
      line = std::string_view(buf_.data() + start_, end - start_);
      cursor_.bytes += end - start_ + 1;
      cursor_.lines += 1;
      start_ = scanned_ = end + 1;
      return Next::line;
    }
    scanned_ = have_;
    if (at_end_) return Next::end;
    // What is left is the start of a line: to the front, and read on after it.
    std::memmove(buf_.data(), buf_.data() + start_, have_ - start_);
    have_ -= start_;
    scanned_ -= start_;
    start_ = 0;
    if (have_ == cap_) { // one line longer than the buffer
      if (limits_.max_line != 0 && cap_ >= limits_.max_line) return Next::too_long;
      cap_ = limits_.max_line != 0 ? std::min(cap_ * 2, limits_.max_line) : cap_ * 2;
      buf_.resize(cap_ + padding);
    }
    const auto want = static_cast<std::size_t>(
        std::min<std::uint64_t>(std::min(std::max<std::size_t>(limits_.chunk, 1), cap_ - have_),
                                limits_.end - std::min(limits_.end, pos_)));
    if (want == 0) {
      at_end_ = true;
      continue;
    }
    const ssize_t got = ::pread(fd_, buf_.data() + have_, want, static_cast<off_t>(pos_));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 || (got == 0 && limits_.end != std::numeric_limits<std::uint64_t>::max())) {
      // A file shorter than the length its caller saw was cut under it.
      error_ = detail::os_error("cannot read", path_, got < 0 ? errno : EIO);
      return Next::failed;
    }
    if (got == 0) at_end_ = true;
    have_ += static_cast<std::size_t>(got);
    pos_ += static_cast<std::uint64_t>(got);
  }
}

} // namespace chorus::io
