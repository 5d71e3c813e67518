#include "cli/serve/followed_file.hpp"

#include "io/platform/posix.hpp"
#include "io/store/json_lines.hpp"
#include "io/store/line_reader.hpp"

#include <algorithm>
#include <fcntl.h>
#include <sys/stat.h>

namespace chorus::cli::serve {
namespace {

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\r' || c == '\t'; });
}

} // namespace

void FollowedFile::reset() {
  state_ = {};
  dev_ = ino_ = 0;
  lines_ = 0;
  first_skipped_line_ = 0;
  stuck_size_ = 0;
}

FollowedFile::Look FollowedFile::look() {
  Look out;
  const Result<int> fd = platform::open_regular(path_, O_RDONLY, true);
  if (!fd) {
    out.changed = state_.problem.message() != fd.error().message();
    state_.problem = fd.error();
    return out;
  }
  if (*fd < 0) {
    if (state_.missing && !state_.problem) return out;
    reset();
    out.afresh = out.changed = true;
    return out;
  }
  struct stat st {};
  if (::fstat(*fd, &st) != 0) {
    platform::close_fd(*fd);
    return out;
  }
  out.size = static_cast<std::uint64_t>(st.st_size);
  if (state_.missing || st.st_dev != dev_ || st.st_ino != ino_ || out.size < state_.bytes) {
    // A new file, or one replaced (chorus recover rewrites it) or cut: read it afresh.
    reset();
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    state_.missing = false;
    out.afresh = out.changed = true;
  }
  if (out.size == state_.bytes || (stuck_size_ != 0 && out.size == stuck_size_)) {
    platform::close_fd(*fd);
    if (state_.unfinished && out.size == state_.bytes) {
      state_.unfinished = false;
      out.changed = true;
    }
    return out;
  }
  state_.problem = {};
  out.fd = *fd;
  return out;
}

void FollowedFile::read(const Look& look, std::uint64_t end,
                        const std::function<std::string(std::string_view, std::uint64_t)>& take) {
  end = std::min(end, look.size);
  store::LineReader lines(look.fd, path_, {lines_, state_.bytes}, {.chunk = 4u << 20, .max_line = store::max_line_bytes, .end = end});
  for (std::string_view line;;) {
    const store::LineReader::Next next = lines.next(line);
    if (next == store::LineReader::Next::end) {
      // Where the reading stopped short of the file's end, the rest is for the next call.
      state_.indexing = end < look.size;
      state_.unfinished = !state_.indexing && !blank(lines.rest());
      break;
    }
    if (next == store::LineReader::Next::too_long) {
      stuck_size_ = look.size;
      state_.indexing = false;
      state_.problem = lines.error(); // store::line_too_long: the lines after it are not read
      break;
    }
    if (next == store::LineReader::Next::failed) {
      state_.problem = lines.error();
      break;
    }
    const std::uint64_t start = lines.cursor().bytes - line.size() - 1;
    line = trim_line_end(line);
    if (line.empty()) continue;
    std::string why = take(line, start);
    if (!why.empty() && state_.skipped++ == 0) {
      first_skipped_line_ = lines.cursor().lines;
      state_.first_skipped = std::move(why);
    }
  }
  state_.bytes = lines.cursor().bytes;
  lines_ = lines.cursor().lines;
}

bool FollowedFile::follow(std::uint64_t budget, const std::function<void()>& forget,
                          const std::function<std::string(std::string_view, std::uint64_t)>& take) {
  const Look now = look();
  if (now.afresh) forget();
  if (now.fd < 0) return now.changed;
  const std::uint64_t lines_before = state_.rows + state_.skipped;
  const bool was_indexing = state_.indexing;
  read(now, state_.bytes + budget, take);
  return now.changed || state_.rows + state_.skipped != lines_before || state_.indexing != was_indexing ||
         state_.problem;
}

IndexState FollowedFile::state() const {
  IndexState s = state_;
  if (s.skipped > 0) s.first_skipped = "line " + std::to_string(first_skipped_line_) + ": " + s.first_skipped;
  return s;
}

} // namespace chorus::cli::serve
