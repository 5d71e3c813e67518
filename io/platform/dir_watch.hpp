// Telling whether any of a set of directories changed, without looking at
// them: inotify(7) on the filesystems where its events are complete.
#pragma once

#include <string>

namespace chorus::platform {

/// Watches directories for any change of them or their entries: an entry
/// added, removed, renamed or written to, its or an entry's attributes, the
/// directory moved or removed. It answers only where it can answer for every directory
/// it was given: a filesystem whose changes may come from another host (NFS,
/// CIFS, FUSE, Lustre, ...) tells inotify only of this host's, and the
/// per-user limit on watches (fs.inotify.max_user_watches) may run out; there
/// `complete()` is false and the caller looks at the directories itself.
/// Not thread-safe: one owner.
class DirWatch {
public:
  DirWatch();
  ~DirWatch();
  DirWatch(const DirWatch&) = delete;
  DirWatch& operator=(const DirWatch&) = delete;

  /// Forgets every directory: what is watched from here on is what add() is
  /// given. Events of before are dropped.
  void restart();
  /// Watches `dir` from now on. Call it before reading the directory, so
  /// that a change made after it was read is told. False (and complete()
  /// false until restart()) where it cannot be watched completely.
  bool add(const std::string& dir);
  /// Whether every directory given since restart() is watched completely.
  [[nodiscard]] bool complete() const noexcept { return complete_; }
  /// Whether anything changed in a watched directory since the last call
  /// (or since restart()); true also where events were lost (the kernel's
  /// queue overflowed) or the watch is not complete. Never blocks.
  bool changed();

private:
  int fd_ = -1;
  bool complete_ = false;
};

/// Whether inotify sees every change on the filesystem holding `path`: a
/// local filesystem (ext4, XFS, Btrfs, tmpfs, overlayfs, ZFS, F2FS,
/// bcachefs, ramfs). False for network and user-space filesystems, and for
/// any it does not know.
[[nodiscard]] bool changes_all_seen_here(const std::string& path);

} // namespace chorus::platform
