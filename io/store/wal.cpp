#include "io/store/wal.hpp"

#include "io/platform/crc32c.hpp"
#include "io/platform/posix.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

namespace chorus::store {
namespace {

using platform::os_error;

constexpr std::size_t read_chunk = 1u << 20;
constexpr std::size_t max_problems = 64; // a wrecked file should not flood the report

std::uint32_t load_u32(const char* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::uint32_t frame_crc(const char* len_bytes, const char* payload, std::size_t n) noexcept {
  return platform::crc32c(payload, n, platform::crc32c(len_bytes, 4));
}

Error shrank(const std::string& path) {
  return Error{Errc::io_error, "read on " + path +
                                   ": the file shrank while it was being read. Do not truncate a WAL that is in use."};
}

// A forward-moving window over the file, read with pread: memory stays at
// one chunk or one frame, and a file truncated under us is an error, not SIGBUS.
// The first read that fails is kept (failed()); the scan stops at it.
class Window {
public:
  Window(int fd, std::uint64_t size, const std::string& path) : fd_(fd), size_(size), path_(path) {}

  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }

  // Pointer to bytes [p, p + n); p + n must not exceed size(). nullptr
  // where the read failed.
  const char* at(std::uint64_t p, std::size_t n) {
    if (p >= off_ && p + n <= off_ + len_) return buf_.data() + (p - off_);
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(std::max(n, read_chunk), size_ - p));
    // Sized afresh, not resized: the old bytes are about to be replaced, and
    // a buffer grown for one huge frame is given back once it is behind us.
    if (buf_.size() < want || (buf_.size() > 4 * read_chunk && want <= read_chunk)) buf_ = std::vector<char>(want);
    std::size_t got = 0;
    while (got < want) {
      const ssize_t r = ::pread(fd_, buf_.data() + got, want - got, static_cast<off_t>(p + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        return fail(os_error("read", path_, errno));
      }
      if (r == 0) return fail(shrank(path_));
      got += static_cast<std::size_t>(r);
    }
    off_ = p;
    len_ = want;
    return buf_.data();
  }

  // The first read that failed; empty while every read succeeded.
  [[nodiscard]] const Error& failed() const noexcept { return failed_; }
  std::nullptr_t fail(Error e) {
    if (!failed_) failed_ = std::move(e);
    return nullptr;
  }

  // Bytes resident from p on, without reading (0 if p is outside the window).
  [[nodiscard]] std::size_t resident_from(std::uint64_t p) const noexcept {
    return p >= off_ && p < off_ + len_ ? static_cast<std::size_t>(off_ + len_ - p) : 0;
  }

private:
  int fd_;
  std::uint64_t size_;
  const std::string& path_;
  std::vector<char> buf_;
  std::uint64_t off_ = 0;
  std::size_t len_ = 0;
  Error failed_;
};

// Running CRCs of a stretch of the file, kept every `step` bytes, so that
// the CRC of any frame inside the stretch costs at most 2 * step bytes and a
// multiplication, whatever length the frame claims. Checking each candidate
// met while hunting for the next frame by reading its whole claimed payload
// made a file planted with headers quadratic to scan; with the checkpoints,
// each byte is summed once per scan, plus a bounded amount per candidate.
//
// running(q) is crc32c(bytes [origin, q), seed). For any a <= b in the
// stretch, crc32c(bytes [a, b)) == running(b) ^ shift(running(a), b - a),
// which is what crc32c_combine computes.
class Checkpoints {
public:
  static constexpr std::size_t step = 256;

  Checkpoints(int fd, const std::string& path, std::uint64_t& summed) : fd_(fd), path_(path), summed_(summed) {}

  [[nodiscard]] bool covers(std::uint64_t a, std::uint64_t b) const noexcept {
    return !marks_.empty() && origin_ + first_ * step <= a && a <= b && b <= end_;
  }
  [[nodiscard]] std::uint64_t end() const noexcept { return end_; }
  [[nodiscard]] std::uint32_t running() const noexcept { return running_; }

  void restart(std::uint64_t origin, std::uint32_t seed) {
    origin_ = end_ = origin;
    running_ = seed;
    first_ = 0;
    marks_.assign(1, seed);
  }

  // Sums `n` bytes that follow end().
  void feed(const char* p, std::size_t n) {
    summed_ += n;
    while (n > 0) {
      const std::size_t to_mark = step - static_cast<std::size_t>((end_ - origin_) % step);
      const std::size_t k = std::min(n, to_mark);
      running_ = platform::crc32c(p, k, running_);
      end_ += k;
      p += k;
      n -= k;
      if (k == to_mark) marks_.push_back(running_);
    }
  }

  // Forgets the marks before `p` (nothing before it is asked for again).
  void drop_before(std::uint64_t p) {
    while (marks_.size() - first_ > 1 && origin_ + (first_ + 1) * step <= p) ++first_;
    if (first_ > 4096 && first_ * 2 > marks_.size()) {
      marks_.erase(marks_.begin(), marks_.begin() + static_cast<std::ptrdiff_t>(first_));
      origin_ += first_ * step;
      first_ = 0;
    }
  }

  // running(q), for q inside the stretch; the few bytes since the last mark
  // come from the window if it holds them. A failed read is kept in `w`.
  std::uint32_t at(std::uint64_t q, Window& w) {
    const std::uint64_t i = (q - origin_) / step;
    const std::uint64_t from = origin_ + i * step;
    const auto n = static_cast<std::size_t>(q - from);
    summed_ += n;
    const std::uint32_t mark = marks_[static_cast<std::size_t>(i)];
    if (n == 0) return mark;
    if (w.resident_from(from) >= n) return platform::crc32c(w.at(from, n), n, mark);
    std::array<char, step> buf;
    for (std::size_t got = 0; got < n;) {
      const ssize_t r = ::pread(fd_, buf.data() + got, n - got, static_cast<off_t>(from + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        w.fail(r < 0 ? os_error("read", path_, errno) : shrank(path_));
        return 0;
      }
      got += static_cast<std::size_t>(r);
    }
    return platform::crc32c(buf.data(), n, mark);
  }

private:
  int fd_;
  const std::string& path_;
  std::uint64_t& summed_;
  std::uint64_t origin_ = 0, end_ = 0;
  std::uint32_t running_ = 0;
  std::size_t first_ = 0;             // marks_[first_] is the first still wanted
  std::vector<std::uint32_t> marks_;  // marks_[i] = running(origin_ + i * step)
};

struct Check {
  bool good = false;
  std::uint32_t len = 0;
  std::uint32_t stored = 0;  // the CRC the header holds
  std::uint32_t len_crc = 0; // the CRC of its length field, where the frame's CRC starts
  std::string why;           // filled only when asked for
  [[nodiscard]] std::uint64_t body(std::uint64_t p) const noexcept { return p + wal_header_size; }
  [[nodiscard]] std::uint64_t end(std::uint64_t p) const noexcept { return p + wal_header_size + len; }
};

// The header checks of the frame at p: its magic, and a length that fits the
// file. `explain` fills `why` on failure (skipped while hunting for the next
// frame, where most candidates fail).
bool check_header(Window& w, std::uint64_t p, bool explain, Check& c) {
  const std::uint64_t left = w.size() - p;
  if (left < wal_header_size) {
    if (explain) c.why = "incomplete frame header (" + std::to_string(left) + " bytes)";
    return false;
  }
  const char* h = w.at(p, wal_header_size);
  if (h == nullptr) return false;
  if (load_u32(h) != wal_magic) {
    if (explain) c.why = "no frame magic";
    return false;
  }
  c.len = load_u32(h + 4);
  if (c.len > wal_max_payload) {
    if (explain) c.why = "frame length " + std::to_string(c.len) + " exceeds the maximum";
    return false;
  }
  if (wal_header_size + c.len > left) {
    if (explain)
      c.why = "frame of " + std::to_string(c.len) + " bytes runs " + std::to_string(wal_header_size + c.len - left) +
              " bytes past the end of the file";
    return false;
  }
  c.stored = load_u32(h + 8);
  c.len_crc = platform::crc32c(h + 4, 4);
  return true;
}

// Whether the frame at `p` verifies, from checkpoints that cover its payload.
bool verifies_from(Checkpoints& ck, Window& w, std::uint64_t p, const Check& c) {
  ck.drop_before(c.body(p));
  const std::uint32_t a = ck.at(c.body(p), w);
  const std::uint32_t b = ck.at(c.end(p), w);
  return !w.failed() && platform::crc32c_combine(c.len_crc ^ a, b, c.len) == c.stored;
}

// Verifies the frame at p. Its payload is summed into `ck`, which starts
// afresh at it, or, after a hunt that summed part of it, is extended over it
// (so that no byte is summed twice).
Check check_frame(Window& w, Checkpoints& ck, std::uint64_t p, bool explain) {
  Check c;
  if (!check_header(w, p, explain, c)) return c;
  bool fresh = false;
  if (!ck.covers(c.body(p), c.end(p))) {
    const char* f = w.at(p, wal_header_size + c.len);
    if (f == nullptr) return c;
    if (!ck.covers(c.body(p), c.body(p))) {
      ck.restart(c.body(p), c.len_crc);
      fresh = true;
    }
    ck.feed(f + (ck.end() - p), static_cast<std::size_t>(c.end(p) - ck.end()));
  }
  c.good = fresh ? ck.running() == c.stored : verifies_from(ck, w, p, c);
  if (!c.good && !w.failed() && explain) c.why = "CRC mismatch in a frame of " + std::to_string(c.len) + " bytes";
  return c;
}

// Whether the candidate at `cand`, met while hunting, verifies. The
// checkpoints are extended to its end in whole chunks, so that however the
// candidates' claimed ends fall, each byte is summed once.
bool candidate_verifies(Window& w, Checkpoints& ck, std::uint64_t cand) {
  Check c;
  if (!check_header(w, cand, false, c)) return false;
  if (!ck.covers(c.body(cand), c.body(cand))) ck.restart(c.body(cand), 0);
  while (ck.end() < c.end(cand)) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(read_chunk, w.size() - ck.end()));
    const char* bytes = w.at(ck.end(), n);
    if (bytes == nullptr) return false;
    ck.feed(bytes, n);
  }
  return verifies_from(ck, w, cand, c);
}

// The offset of the next frame that verifies at or after `from`, or the file
// size if there is none.
std::uint64_t find_next_frame(Window& w, Checkpoints& ck, std::uint64_t from) {
  const auto first = static_cast<char>(wal_magic & 0xFFu);
  std::uint64_t p = from;
  while (p + wal_header_size <= w.size()) {
    std::size_t n = w.resident_from(p);
    if (n == 0) {
      n = static_cast<std::size_t>(std::min<std::uint64_t>(read_chunk, w.size() - p));
      if (w.at(p, n) == nullptr) return w.size();
    }
    const char* base = w.at(p, n);
    const auto* hit = static_cast<const char*>(std::memchr(base, first, n));
    if (hit == nullptr) {
      p += n;
      continue;
    }
    const std::uint64_t cand = p + static_cast<std::uint64_t>(hit - base);
    if (candidate_verifies(w, ck, cand)) return cand;
    if (w.failed()) return w.size();
    p = cand + 1;
  }
  return w.size();
}

std::string at_offset(std::uint64_t off, std::string_view what) {
  std::string s = "offset " + std::to_string(off) + ": ";
  s.append(what);
  return s;
}

void note(WalScan& s, std::string line) {
  if (s.problems.size() < max_problems)
    s.problems.push_back(std::move(line));
  else if (s.problems.size() == max_problems)
    s.problems.emplace_back("... further problems not listed");
}

Result<WalScan> scan_fd(int fd, const std::string& path, const WalFrameFn& on_frame) {
  WalScan s;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return os_error("fstat", path, errno);
  Window w(fd, static_cast<std::uint64_t>(st.st_size), path);
  Checkpoints ck(fd, path, s.summed_bytes);
  std::uint64_t p = 0;
  while (p < w.size()) {
    Check c = check_frame(w, ck, p, true);
    if (w.failed()) return w.failed();
    if (c.good) {
      if (on_frame) {
        const char* f = w.at(p, wal_header_size + c.len);
        if (f == nullptr) return w.failed();
        on_frame(std::span<const char>(f + wal_header_size, c.len), p);
      }
      ++s.frames;
      p += wal_header_size + c.len;
      s.good_end = p;
      continue;
    }
    const std::uint64_t next = find_next_frame(w, ck, p + 1);
    if (w.failed()) return w.failed();
    s.skipped_bytes += next - p;
    if (next < w.size()) {
      ++s.corrupt_regions;
      note(s, at_offset(p, c.why + "; skipped " + std::to_string(next - p) + " bytes to the next good frame"));
    } else {
      s.torn_tail = true;
      note(s, at_offset(p, c.why + "; the last " + std::to_string(next - p) + " bytes are a torn tail"));
    }
    p = next;
  }
  return s;
}

// Takes the single-writer lock; a second run host on the same run is refused.
Error lock_wal(int fd, const std::string& path) {
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK)
      return Error{Errc::io_error, "lock on " + path +
                                       ": another process is writing this WAL. Stop the other run host, or use a different run id."};
    return os_error("flock", path, errno);
  }
  return {};
}

Error cut(int fd, const std::string& path, std::uint64_t at) {
  while (::ftruncate(fd, static_cast<off_t>(at)) != 0) {
    if (errno != EINTR) return os_error("truncate", path, errno);
  }
  return {};
}

// Takes the writer lock on the open WAL `fd`, scans it and cuts a torn
// tail: what a writer does before it appends, and what recover does alone.
Result<WalScan> lock_and_cut(int fd, const std::string& path) {
  if (Error e = lock_wal(fd, path)) return e;
  Result<WalScan> s = scan_fd(fd, path, {});
  if (s && s->torn_tail)
    if (Error e = cut(fd, path, s->good_end)) return e;
  return s;
}

} // namespace

Result<std::unique_ptr<WalWriter>> WalWriter::open(const std::string& path) {
  const Result<int> opened = platform::open_private(path, O_RDWR | O_CREAT | O_APPEND);
  if (!opened) return opened.error();
  const Result<WalScan> s = lock_and_cut(*opened, path);
  if (!s) {
    platform::close_fd(*opened);
    return s.error();
  }
  return std::unique_ptr<WalWriter>(new WalWriter(*opened, path, s->good_end));
}

WalWriter::~WalWriter() { platform::close_fd(fd_); }

Error WalWriter::append(std::span<const char> payload) { return write_frames(std::span(&payload, 1)); }

Error WalWriter::append_many(std::span<const std::span<const char>> payloads) { return write_frames(payloads); }

Error WalWriter::write_frames(std::span<const std::span<const char>> payloads) {
  for (const auto& p : payloads)
    if (p.size() > wal_max_payload)
      return Error{Errc::invalid_argument, "append on " + path_ + ": a frame of " + std::to_string(p.size()) +
                                               " bytes exceeds the WAL's 256 MiB limit. Split the batch."};
  constexpr std::size_t frames_per_call = IOV_MAX / 2;
  std::array<std::array<char, wal_header_size>, frames_per_call> headers;
  std::array<iovec, IOV_MAX> iov;
  for (std::size_t i = 0; i < payloads.size(); i += frames_per_call) {
    const std::size_t k = std::min(frames_per_call, payloads.size() - i);
    int n = 0;
    std::uint64_t bytes = 0;
    for (std::size_t j = 0; j < k; ++j) {
      const auto& p = payloads[i + j];
      auto& h = headers[j];
      const auto len = static_cast<std::uint32_t>(p.size());
      std::memcpy(h.data(), &wal_magic, 4);
      std::memcpy(h.data() + 4, &len, 4);
      const std::uint32_t crc = frame_crc(h.data() + 4, p.data(), p.size());
      std::memcpy(h.data() + 8, &crc, 4);
      iov[static_cast<std::size_t>(n++)] = {h.data(), wal_header_size};
      if (!p.empty()) iov[static_cast<std::size_t>(n++)] = {const_cast<char*>(p.data()), p.size()};
      bytes += wal_header_size + p.size();
    }
    if (Error e = platform::write_all(fd_, iov.data(), n, path_)) {
      // Best effort: take back a partial frame so the next append starts clean.
      (void)cut(fd_, path_, size_);
      return e;
    }
    size_ += bytes;
  }
  return {};
}

Error WalWriter::sync() { return platform::sync_file(fd_, path_, true); }

Result<WalScan> scan_wal(const std::string& path, const WalFrameFn& on_frame) {
  const Result<int> fd = platform::open_regular(path, O_RDONLY);
  if (!fd) return fd.error();
  Result<WalScan> s = scan_fd(*fd, path, on_frame);
  platform::close_fd(*fd);
  return s;
}

Result<WalScan> truncate_torn_tail(const std::string& path) {
  const Result<int> opened = platform::open_regular(path, O_RDWR);
  if (!opened) return opened.error();
  Result<WalScan> s = lock_and_cut(*opened, path);
  platform::close_fd(*opened);
  return s;
}

} // namespace chorus::store
