// The upload lock (io/upload/lock.hpp).
#include "io/upload/lock.hpp"

#include "io/platform/posix.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace chorus::upload {

Result<int> take_upload_lock(const std::string& path, const std::string& what) {
  const Result<int> opened = platform::open_private(path, O_RDWR | O_CREAT);
  if (!opened) return opened;
  const int fd = *opened;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::string holder = platform::read_text(path, true).value_or(std::string());
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    platform::close_fd(fd);
    return Error(Errc::invalid_argument, "another process" + (holder.empty() ? std::string() : " (pid " + holder + ")") +
                                             " is uploading " + what + ": wait for it to end, or stop it");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) (void)platform::write_all(fd, pid, path);
  return fd;
}

} // namespace chorus::upload
