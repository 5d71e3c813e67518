#include "io/platform/files.hpp"

#include "io/platform/posix.hpp"

#include <atomic>
#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

namespace chorus::platform {

using platform::os_error;

Error make_dirs(const std::string& path, std::string_view elsewhere) {
  if (path.empty())
    return Error{Errc::invalid_argument, "make_dirs: the directory path is empty. Set CHORUS_DIR or Options::dir."};
  // mkdir's mode passes through the umask; the run dir promises 0700.
  const auto made = [&](const std::string& dir) {
    return ::chmod(dir.c_str(), 0700) == 0 ? Error{} : os_error("chmod 0700", dir, errno, elsewhere);
  };
  const auto is_dir = [](const std::string& dir) {
    struct stat st {};
    return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  };
  // From the deepest directory up, as far as they are missing; the walk
  // below then makes them down from the deepest that is there. A directory
  // that is there costs one call (and a stat), one whose parent is there
  // two, where a walk from the root costs two a part. Anything else (a part
  // that is no directory, no permission) walks from the root, which names
  // the part at fault.
  std::size_t pos = 0; // where the walk starts: after the deepest directory that is there
  for (std::string p = path;;) {
    if (::mkdir(p.c_str(), 0700) == 0) {
      if (Error e = made(p)) return e;
    } else if (const int e = errno; !(e == EEXIST && is_dir(p))) {
      const std::size_t end = p.find_last_not_of('/');
      const std::size_t slash = end == std::string::npos ? std::string::npos : p.rfind('/', end);
      if (e == ENOENT && slash != std::string::npos && slash != 0) {
        p.resize(slash);
        continue;
      }
      break; // from the root
    }
    if (p.size() == path.size()) return {}; // the directory itself
    pos = p.size();
    break;
  }
  // Each prefix that ends a component, shortest first.
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string part = path.substr(0, pos);
    if (part.empty() || part.back() == '/') continue; // "//" or the root
    if (::mkdir(part.c_str(), 0700) == 0) {
      if (Error e = made(part)) return e;
      continue;
    }
    const int e = errno;
    if (e != EEXIST) return os_error("mkdir", part, e, elsewhere);
    struct stat st {};
    if (::stat(part.c_str(), &st) != 0) return os_error("stat", part, errno, elsewhere);
    if (!S_ISDIR(st.st_mode)) return os_error("mkdir", part, ENOTDIR, elsewhere);
  }
  return {};
}

namespace {

// `content` in a new temporary file beside `path`: its descriptor, or why not (nothing left behind).
Result<int> write_temporary(const std::string& path, std::string_view content, std::string& tmp) {
  static std::atomic<std::uint64_t> counter{0};
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  // Hidden and unique per process and call, so concurrent writers and
  // readers listing the directory never trip over it.
  tmp = dir + "." + base + ".tmp." + std::to_string(::getpid()) + "." +
        std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
  const Result<int> opened = open_private(tmp, O_RDWR | O_CREAT | O_EXCL | O_TRUNC);
  if (!opened) return opened.error();
  if (Error err = write_all(*opened, content, tmp)) {
    close_fd(*opened);
    ::unlink(tmp.c_str());
    return err;
  }
  return *opened;
}

// Closes `fd`, the temporary file `tmp` (fsync'ed first where `durable`), and
// renames it over `path`; where that fails, nothing is left behind.
Error install_temporary(int fd, const std::string& tmp, const std::string& path, bool durable) {
  Error err = durable ? sync_file(fd, tmp) : Error{};
  close_fd(fd);
  if (!err && ::rename(tmp.c_str(), path.c_str()) != 0) err = os_error("rename to " + path, tmp, errno);
  if (err) ::unlink(tmp.c_str());
  return err;
}

} // namespace

Error write_file_atomic(const std::string& path, std::string_view content, bool durable) {
  std::string tmp;
  const Result<int> fd = write_temporary(path, content, tmp);
  if (!fd) return fd.error();
  return install_temporary(*fd, tmp, path, durable);
}

Result<StagedFile> StagedFile::replace(const std::string& path, std::string_view content) {
  StagedFile f;
  const Result<int> fd = write_temporary(path, content, f.tmp_);
  if (!fd) return fd.error();
  f.fd_ = *fd;
  f.path_ = path;
  start_writeback(f.fd_);
  return f;
}

Result<StagedFile> StagedFile::existing(const std::string& path) {
  StagedFile f;
  const Result<int> fd = open_regular(path, O_RDONLY, /*missing_ok=*/true);
  if (!fd) return fd.error();
  if (*fd < 0) return f; // nothing there: nothing to commit
  f.fd_ = *fd;
  f.path_ = path;
  start_writeback(f.fd_);
  return f;
}

StagedFile::StagedFile(StagedFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), tmp_(std::move(o.tmp_)) {}

StagedFile::~StagedFile() {
  if (fd_ < 0) return;
  close_fd(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str()); // never committed: the old file stays
}

Error StagedFile::commit(bool durable) {
  if (fd_ < 0) return {};
  const int fd = std::exchange(fd_, -1);
  if (!tmp_.empty()) return install_temporary(fd, std::exchange(tmp_, std::string()), path_, durable);
  Error err = durable ? sync_file(fd, path_) : Error{};
  close_fd(fd);
  return err;
}

Result<std::unique_ptr<AppendFile>> AppendFile::open_with(const std::string& path, bool truncate, bool create) {
  // A file that held something (or was emptied by this open) is synced at
  // the first sync() all the same: its content may not be on the disk yet.
  struct stat st {};
  const bool exists = ::lstat(path.c_str(), &st) == 0;
  if (!exists && !create) return std::unique_ptr<AppendFile>();
  const bool had_content = exists && st.st_size > 0;
  struct stat now {};
  const Result<int> fd = open_private(path, O_RDWR | O_CREAT | O_APPEND | (truncate ? O_TRUNC : 0), &now);
  if (!fd) return fd.error();
  const auto size = static_cast<std::uint64_t>(now.st_size);
  return std::unique_ptr<AppendFile>(new AppendFile(*fd, path, had_content, size));
}

Result<std::unique_ptr<AppendFile>> AppendFile::open(const std::string& path, bool truncate) {
  return open_with(path, truncate, /*create=*/true);
}

Result<std::unique_ptr<AppendFile>> AppendFile::open_existing(const std::string& path, bool truncate) {
  return open_with(path, truncate, /*create=*/false);
}

// Writes `data` out; the size follows what reached the file, even part of it.
Error AppendFile::write_out(std::string_view data) {
  unsynced_ = true;
  Error e = write_all(fd_, data, path_);
  if (!e) {
    size_ += data.size();
  } else if (struct stat now {}; ::fstat(fd_, &now) == 0) {
    size_ = static_cast<std::uint64_t>(now.st_size);
  }
  return e;
}

AppendFile::~AppendFile() {
  (void)flush();
  close_fd(fd_);
}

Error AppendFile::write(std::string_view data) {
  if (buf_.size() + data.size() > buffer_limit) {
    if (Error e = flush()) return e;
    // Bigger than the whole buffer: straight out, no copy.
    if (data.size() >= buffer_limit) return write_out(data);
  }
  // 64 KiB first; a file that outgrows it takes the whole buffer at once,
  // whose pages are touched only as bytes come, never again by a doubling's
  // copy (a page fault costs several µs on a VM, and a finish writes a
  // burst's lines). Untouched pages cost no memory.
  if (const std::size_t need = buf_.size() + data.size(); need > buf_.capacity())
    buf_.reserve(need <= first_buffer ? first_buffer : buffer_limit);
  buf_.append(data);
  return {};
}

Error AppendFile::flush() {
  if (buf_.empty()) return {};
  Error e = write_out(buf_);
  // Dropped even on error: keeping it would grow memory without bound on a
  // full disk, and the WAL still holds the data.
  buf_.clear();
  return e;
}

Error AppendFile::start_sync() {
  if (Error e = flush()) return e;
  if (unsynced_) start_writeback(fd_);
  return {};
}

Error AppendFile::sync() {
  if (Error e = flush()) return e;
  if (!unsynced_) return {};
  Error e = sync_file(fd_, path_, true);
  if (!e) unsynced_ = false;
  return e;
}

} // namespace chorus::platform
