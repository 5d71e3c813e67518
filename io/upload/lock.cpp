// The upload lock (io/upload/lock.hpp).
#include "io/upload/lock.hpp"

#include "io/platform/posix.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace chorus::io::detail {

int take_upload_lock(const std::string& path, const std::string& what, Error& error) {
  const int fd = open_private(path, O_RDWR | O_CREAT, error);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    (void)read_text(path, holder, true);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    close_fd(fd);
    error = Error(Errc::invalid_argument, "another process" + (holder.empty() ? std::string() : " (pid " + holder + ")") +
                                              " is uploading " + what + ": wait for it to end, or stop it");
    return -1;
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) (void)write_all(fd, pid, path);
  return fd;
}

} // namespace chorus::io::detail
