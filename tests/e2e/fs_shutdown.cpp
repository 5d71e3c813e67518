// Shuts down the ext4 file system mounted at a directory, as a failing disk
// would (EXT4_IOC_SHUTDOWN, without flushing the journal): every later read
// and write there fails with EIO, and what was not synced is gone.
//
//   chorus_fs_shutdown MOUNT_DIR
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const int fd = ::open(argv[1], O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    std::printf("open %s: %s\n", argv[1], std::strerror(errno));
    return 1;
  }
  std::uint32_t flags = 2; // EXT4_GOING_FLAGS_NOLOGFLUSH
  if (::ioctl(fd, _IOR('X', 125, std::uint32_t), &flags) != 0) {
    std::printf("shutdown %s: %s\n", argv[1], std::strerror(errno));
    return 1;
  }
  std::printf("SHUTDOWN\n");
  return 0;
}
