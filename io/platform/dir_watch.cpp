#include "io/platform/dir_watch.hpp"

#include "io/platform/posix.hpp"

#include <sys/inotify.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace chorus::platform {

namespace {

// What changes a directory's time (an entry created, removed or renamed in
// it), its identity (it moved or was removed), or what a reader shows of it:
// an entry's content written in place, the attributes of it or of an entry
// (who may read them). Writes to one file come as one event until read.
constexpr std::uint32_t watched_events = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_MODIFY |
                                         IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW;

} // namespace

bool changes_all_seen_here(const std::string& path) {
  struct statfs fs {};
  int r;
  do {
    r = ::statfs(path.c_str(), &fs);
  } while (r != 0 && errno == EINTR);
  if (r != 0) return false;
  // f_type's magic numbers (statfs(2), linux/magic.h); the kernel's headers
  // lack some of them (ZFS, bcachefs), so they are written out.
  switch (static_cast<std::uint64_t>(fs.f_type)) {
  case 0xEF53:     // ext2, ext3, ext4
  case 0x58465342: // XFS
  case 0x9123683E: // Btrfs
  case 0x01021994: // tmpfs
  case 0x858458F6: // ramfs
  case 0x794C7630: // overlayfs (a container's root)
  case 0x2FC12FC1: // ZFS
  case 0xF2F52010: // F2FS
  case 0xCA451A4E: // bcachefs
    return true;
  default:
    return false;
  }
}

DirWatch::DirWatch() { restart(); }

DirWatch::~DirWatch() {
  if (fd_ >= 0) close_fd(fd_);
}

void DirWatch::restart() {
  // A fresh instance drops every watch and every queued event at once.
  if (fd_ >= 0) close_fd(fd_);
  fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  complete_ = fd_ >= 0;
}

bool DirWatch::add(const std::string& dir) {
  if (!complete_) return false;
  // Checked first: a watch on a network filesystem would be armed, and silent.
  if (changes_all_seen_here(dir) && ::inotify_add_watch(fd_, dir.c_str(), watched_events) >= 0) return true;
  // An incomplete watch answers nothing: its watches go at once, back to
  // the user's limit (fs.inotify.max_user_watches), which others share.
  close_fd(fd_);
  fd_ = -1;
  complete_ = false;
  return false;
}

bool DirWatch::changed() {
  if (!complete_) return true;
  alignas(inotify_event) char buf[4096];
  bool any = false;
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    // Any event at all is a change, IN_Q_OVERFLOW (events lost) and
    // IN_IGNORED (a watch gone with its directory) included.
    if (n > 0) {
      any = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) complete_ = false; // the watch can no longer answer
    return any || !complete_;
  }
}

} // namespace chorus::platform
