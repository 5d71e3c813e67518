#include "io/platform/posix.hpp"

#include <pwd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace chorus::platform {

std::string user_named(unsigned uid) {
  passwd pw{}, *found = nullptr;
  char buf[4096];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr)
    return std::string(found->pw_name) + " (uid " + std::to_string(uid) + ")";
  return "uid " + std::to_string(uid);
}
namespace {

/// Whether `fd`, just connected, is connected to itself (see tcp_connect).
bool connected_to_itself(int fd) {
  sockaddr_storage mine{}, peer{};
  socklen_t mine_len = sizeof mine, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
    return false;
  return mine_len == peer_len && std::memcmp(&mine, &peer, mine_len) == 0;
}

// The fix for errnum; `elsewhere` is how to write somewhere else instead.
std::string fix_for(int errnum, std::string_view elsewhere) {
  std::string fix;
  auto or_elsewhere = [&](std::string_view first) {
    fix.append(first).append(", or ").append(elsewhere).append(".");
  };
  switch (errnum) {
  case ENOSPC:
  case EDQUOT: or_elsewhere("Free disk space"); break;
  case EFBIG:
    or_elsewhere("The file passed the largest size this process may write (ulimit -f) or the filesystem allows: "
                 "raise the limit");
    break;
  case EACCES:
  case EPERM: or_elsewhere("Check the owner and permissions of the directory"); break;
  case EROFS: fix.append("The filesystem is read-only: ").append(elsewhere).append("."); break;
  case ENOENT:
  case ENOTDIR:
  case EEXIST:
    or_elsewhere("Check that each part of the path is a directory (or missing, to be created)");
    break;
  case EMFILE:
  case ENFILE: fix = "Too many open files: raise the limit (ulimit -n) or close files."; break;
  case EIO: fix = "The device reported an I/O error: check the disk and the kernel log."; break;
  default: or_elsewhere("Check that the directory is on a healthy, writable local filesystem");
  }
  return fix;
}

// Why open_regular met ELOOP: the last part of `path` is a link (one that
// loops, or not), or a loop lies in a directory part of it.
Error link_error(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode))
    return Error{Errc::io_error, "cannot open " + path + ": a directory in its path is a symbolic link loop (" +
                                     std::strerror(ELOOP) + "). Replace the looping link with a real directory"};
  const bool loops = ::stat(path.c_str(), &st) != 0 && errno == ELOOP;
  return Error{Errc::io_error, path + (loops ? " is a symbolic link loop (it leads back to itself)"
                                             : " is a symbolic link") +
                                   ": chorus reads and writes only regular files inside a run directory and follows "
                                   "no link there. Replace the link with the file it should be, or remove it"};
}

// Closes `fd` and says why unless it is a regular file; clears the
// O_NONBLOCK it was opened with, with its other `flags` (regular files never
// block, and reads and writes should behave as usual). `st`: the file's stat.
Result<int> keep_if_regular(int fd, const std::string& path, int flags, struct stat& st) {
  st = {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool stat_failed = st.st_mode == 0;
    const int e = errno;
    close_fd(fd);
    if (stat_failed) return os_error("fstat", path, e);
    return Error{Errc::io_error, std::string(path) + " is not a regular file (" +
                                     (S_ISFIFO(st.st_mode)   ? "a FIFO"
                                      : S_ISDIR(st.st_mode)  ? "a directory"
                                      : S_ISSOCK(st.st_mode) ? "a socket"
                                                             : "a device") +
                                     "): a run directory holds regular files only; remove it, or "
                                     "point chorus at the real run directory"};
  }
  // F_SETFL sets only the status flags (O_APPEND, O_NONBLOCK...) and
  // ignores the rest of `flags`: no F_GETFL is needed first.
  (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

} // namespace

Error os_error(std::string_view what, std::string_view path, int errnum, std::string_view elsewhere) {
  std::string m;
  m.reserve(what.size() + path.size() + 128);
  m.append(what).append(" on ").append(path).append(": ").append(std::strerror(errnum)).append(". ");
  m.append(fix_for(errnum, elsewhere));
  return Error{Errc::io_error, std::move(m)};
}

Result<int> open_private(const std::string& path, int flags, struct stat* st) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno == ELOOP ? link_error(path) : os_error("open", path, errno);
  struct stat seen {};
  Result<int> kept = keep_if_regular(fd, path, flags, seen);
  if (!kept) return kept;
  if (st != nullptr) *st = seen;
  // The umask may have taken bits away from 0600 (or the file pre-existed
  // with looser ones): set the mode the run directory promises.
  if ((seen.st_mode & 07777) != 0600 && ::fchmod(fd, 0600) != 0) {
    const Error err = os_error("fchmod 0600", path, errno);
    close_fd(fd);
    return err;
  }
  return fd;
}

Result<int> open_regular(const std::string& path, int flags, bool missing_ok) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT && missing_ok) return -1;
    return e == ELOOP ? link_error(path) : os_error("cannot open", path, e);
  }
  struct stat st {};
  return keep_if_regular(fd, path, flags, st);
}

Error write_all(int fd, iovec* iov, int n, std::string_view path) {
  while (n > 0) {
    const ssize_t w = ::writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return os_error("write", path, errno);
    }
    auto left = static_cast<std::size_t>(w);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return {};
}

Error write_all(int fd, std::string_view data, std::string_view path) {
  iovec v{const_cast<char*>(data.data()), data.size()};
  return write_all(fd, &v, 1, path);
}

Error sync_file(int fd, std::string_view path, bool data_only) {
  while ((data_only ? ::fdatasync(fd) : ::fsync(fd)) != 0)
    if (errno != EINTR) return os_error(data_only ? "fdatasync" : "fsync", path, errno);
  char byte;
  while (::pread(fd, &byte, 1, 0) < 0) {
    if (errno == EBADF) return {}; // opened for writing only: nothing to read back
    if (errno != EINTR) return os_error("sync (the file system failed under it)", path, errno);
  }
  return {};
}

void start_writeback(int fd) noexcept { (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); }

bool populate_for_write(void* at, std::size_t bytes) noexcept {
  static const std::uintptr_t page = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::uintptr_t>(p) : std::uintptr_t{4096};
  }();
  const auto begin = reinterpret_cast<std::uintptr_t>(at);
  const std::uintptr_t first = (begin + page - 1) / page * page;
  const std::uintptr_t last = (begin + bytes) / page * page;
  if (last <= first) return true; // no whole page: nothing worth a call
  return ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) == 0;
}

Result<std::string> read_text(const std::string& path, bool missing_ok, std::size_t max_bytes) {
  const Result<int> opened = open_regular(path, O_RDONLY, missing_ok);
  if (!opened) return opened.error();
  std::string out;
  const int fd = *opened;
  if (fd < 0) return out; // missing, and that is fine
  auto too_big = [&] {
    close_fd(fd);
    return Error{Errc::io_error, path + " is larger than " + std::to_string(max_bytes >> 20) +
                                     " MiB, far more than chorus writes there: it is damaged or not a run file. "
                                     "Move it aside, or restore it (chorus recover rebuilds a run's files from its WAL)"};
  };
  struct stat st {};
  if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) > max_bytes) return too_big();
  char buf[1 << 16];
  for (;;) {
    // A file growing under the reader is held to the bound as well.
    if (out.size() > max_bytes) return too_big();
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close_fd(fd);
      return os_error("cannot read", path, e);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  close_fd(fd);
  return out;
}

void close_fd(int fd) noexcept {
  if (fd >= 0) ::close(fd);
}

std::int64_t unix_now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string this_host() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return {};
  return buf;
}

Error tcp_connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds limit, int& out) {
  out = -1;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return {Errc::connect_failed, std::string("cannot resolve ") + host + ": " + ::gai_strerror(rc)};
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::string why;
  for (addrinfo* ai = res; ai && out < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    bool ok = false;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int polled = 0;
      do {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        polled = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
      } while (polled < 0 && errno == EINTR);
      if (polled == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        ok = err == 0;
        if (!ok) why = std::strerror(err);
      } else {
        why = "no answer within " + std::to_string(limit.count()) + " ms";
      }
    } else {
      why = std::strerror(errno);
    }
    if (ok && connected_to_itself(fd)) {
      ok = false;
      why = std::strerror(ECONNREFUSED);
      const linger reset{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    }
    if (ok)
      out = fd;
    else
      ::close(fd);
  }
  ::freeaddrinfo(res);
  if (out >= 0) return {};
  return {Errc::connect_failed, why.empty() ? "no socket could be made for " + host : why};
}

std::string ephemeral_port_note(std::uint16_t port) {
  int low = 0, high = -1;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); !(range >> low >> high)) return {};
  if (port < low || port > high) return {};
  return " Port " + std::to_string(port) + " lies in this machine's ephemeral range (" + std::to_string(low) + "-" +
         std::to_string(high) + "), from which outgoing connections take their ports: a port below " +
         std::to_string(low) + " is not taken that way.";
}

Error raise_open_files(std::uint64_t want) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return {};
  const auto enough = [want](rlim_t n) { return n == RLIM_INFINITY || n >= want; };
  if (!enough(r.rlim_cur)) {
    rlimit up = r;
    up.rlim_cur = enough(r.rlim_max) ? static_cast<rlim_t>(want) : r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &up) == 0) r = up;
  }
  if (enough(r.rlim_cur)) return {};
  return {Errc::bad_environment,
          "this process may have at most " + std::to_string(r.rlim_cur) + " files open (ulimit -n; its hard limit is " +
              (r.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(r.rlim_max)) +
              ") and needs about " + std::to_string(want) + ": raise the limit (`ulimit -n " + std::to_string(want) +
              "` in the job's script, LimitNOFILE= for a service) before the job starts"};
}

} // namespace chorus::platform
