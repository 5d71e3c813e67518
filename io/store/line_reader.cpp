#include "io/store/line_reader.hpp"

#include "io/platform/posix.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/stat.h>
#include <unistd.h>

namespace chorus::store {

static_assert(LineReader::padding >= simdjson::SIMDJSON_PADDING);

namespace {

/// The JSON-lines files that `chorus recover` rebuilds from the write-ahead log (cli/recover.cpp).
constexpr std::string_view rebuilt_from_wal[] = {"history.jsonl", "histograms.jsonl", "media.jsonl", "rejected.jsonl"};

std::string size_text(std::size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " bytes";
}

} // namespace

Error line_too_long(const std::string& path, std::uint64_t line, std::size_t bound) {
  const std::size_t slash = path.rfind('/');
  const std::string_view name = std::string_view(path).substr(slash == std::string::npos ? 0 : slash + 1);
  std::string m = path + ": line " + std::to_string(line) + " runs past " + size_text(bound) +
                  " without a newline, far longer than a line chorus writes: the file is damaged there. That line "
                  "and every line after it are not read. ";
  // recover helps only where the run's log is there, and holds this file.
  struct stat st {};
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const bool has_wal = ::lstat((dir + "/wal").c_str(), &st) == 0 && S_ISREG(st.st_mode);
  const bool in_wal =
      std::find(std::begin(rebuilt_from_wal), std::end(rebuilt_from_wal), name) != std::end(rebuilt_from_wal);
  if (has_wal && in_wal) {
    m += "`chorus recover " + dir + "` rebuilds " + std::string(name) +
         " from the run's write-ahead log (the damaged file kept as " + std::string(name) + ".bak)";
  } else {
    m += std::string(name) + (in_wal ? " cannot be rebuilt: the run has no write-ahead log here (" + dir + "/wal)"
                                     : " is not one of the files `chorus recover` rebuilds");
    m += ": ";
    m += line > 1 ? "keep its first " + std::to_string(line - 1) + (line == 2 ? " line" : " lines") + " (head -n " +
                        std::to_string(line - 1) + "), or move it aside"
                  : "move it aside";
  }
  return Error(Errc::io_error, std::move(m));
}

LineReader::LineReader(int fd, std::string path, Cursor from, Limits limits)
    : fd_(fd), path_(std::move(path)), limits_(limits), cursor_(from), pos_(from.bytes) {
  cap_ = std::max<std::size_t>(limits_.chunk, 1);
  if (limits_.max_line != 0) cap_ = std::min(cap_, limits_.max_line);
  buf_.resize(cap_ + padding);
}

LineReader::~LineReader() { platform::close_fd(fd_); }

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
      if (limits_.max_line != 0 && cap_ >= limits_.max_line) {
        error_ = line_too_long(path_, cursor_.lines + 1, limits_.max_line);
        return Next::too_long;
      }
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
      error_ = platform::os_error("cannot read", path_, got < 0 ? errno : EIO);
      return Next::failed;
    }
    if (got == 0) at_end_ = true;
    have_ += static_cast<std::size_t>(got);
    pos_ += static_cast<std::uint64_t>(got);
  }
}

} // namespace chorus::store
