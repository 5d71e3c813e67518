#include "cli/serve/index_store.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "runtime/core/fnv.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace chorus::cli::serve {
namespace {

constexpr std::string_view suffix = ".index";

} // namespace

std::uint64_t word_hash(std::string_view s) noexcept {
  // Four lanes of 8 bytes each, mixed apart (no lane waits for another), then together.
  std::uint64_t lane[4] = {core::fnv1a64_basis ^ s.size(), 0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full,
                           0x165667b19e3779f9ull};
  std::size_t i = 0;
  for (; i + 32 <= s.size(); i += 32)
    for (int k = 0; k < 4; ++k) {
      std::uint64_t w = 0;
      std::memcpy(&w, s.data() + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * 0x9e3779b97f4a7c15ull;
      lane[k] ^= lane[k] >> 29;
    }
  std::uint64_t h = lane[0];
  for (int k = 1; k < 4; ++k) h = (h ^ lane[k]) * core::fnv1a64_prime;
  for (; i < s.size(); ++i) h = core::fnv1a64_step(h, static_cast<unsigned char>(s[i]));
  return h ^ (h >> 32);
}

IndexStore::IndexStore(std::string dir, std::uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  struct stat st {};
  if (dir_.empty() || dir_[0] != '/') {
    why_ = "no directory to keep indexes in: give --index-dir an absolute path, or --no-index-dir";
  } else if (Error e = platform::make_dirs(dir_, "give --index-dir another directory, or --no-index-dir")) {
    why_ = e.message();
  } else if (::lstat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    why_ = dir_ + " is not a directory: give --index-dir a directory, or --no-index-dir";
  } else if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    // Another user could put an index there that the server would take as this run's.
    why_ = dir_ + " must be this user's own and closed to others: chmod 700 " + dir_ + ", or give --index-dir another";
  }
  if (usable()) writer_ = std::thread([this] {
    // Signals are the program's to take (chorus serve's Ctrl-C and SIGTERM), never this thread's.
    sigset_t all;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, nullptr);
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return; // stopped, with everything written
      auto [file, bytes] = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      // Whole or not at all (a full disk leaves the kept file as it was);
      // no fsync: after a crash of the machine an empty or old file is
      // refused, and the index made again.
      (void)platform::write_file_atomic(file, bytes, false);
      evict();
      lock.lock();
      writing_ = false;
      done_.notify_all();
    }
  });
}

IndexStore::~IndexStore() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string IndexStore::default_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/') return std::string(x) + "/chorus/serve-index";
  if (const char* h = std::getenv("HOME"); h != nullptr && h[0] == '/') return std::string(h) + "/.cache/chorus/serve-index";
  return {};
}

std::string IndexStore::file_for(std::string_view data, FileKind kind) const {
  const std::uint64_t h = core::fnv1a64(data, core::fnv1a64(kind == FileKind::history ? "history" : "system"));
  char name[17];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
  std::string out = dir_;
  out += '/';
  out += name;
  out += suffix;
  return out;
}

IndexStore::Mapped::~Mapped() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

IndexStore::Mapped IndexStore::read(const std::string& file) const {
  if (!usable()) return {};
  // No link, FIFO or device taken for a kept file.
  const Result<int> opened = platform::open_regular(file, O_RDONLY, true);
  if (!opened || *opened < 0) return {};
  const int fd = *opened;
  const char* data = nullptr;
  std::size_t size = 0;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 022) == 0 &&
      st.st_size > 0) {
    // Files are replaced by rename, never written in place: the mapping stays as it was read.
    void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p != MAP_FAILED) data = static_cast<const char*>(p), size = static_cast<std::size_t>(st.st_size);
    ::futimens(fd, nullptr); // used now
  }
  platform::close_fd(fd);
  return Mapped(data, size);
}

void IndexStore::put(std::string file, std::string bytes) {
  if (!usable()) return;
  {
    std::lock_guard lock(mutex_);
    // A newer index of the same file replaces one still waiting.
    for (auto& [f, b] : queue_)
      if (f == file) {
        b = std::move(bytes);
        return;
      }
    queue_.emplace_back(std::move(file), std::move(bytes));
  }
  wake_.notify_all();
}

void IndexStore::flush() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return queue_.empty() && !writing_; });
}

void IndexStore::evict() {
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return;
  struct Kept {
    std::string path;
    std::uint64_t bytes;
    timespec used;
  };
  std::vector<Kept> kept;
  std::uint64_t total = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.ends_with(suffix)) continue;
    std::string path = dir_ + "/" + std::string(name);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    total += static_cast<std::uint64_t>(st.st_size);
    kept.push_back({std::move(path), static_cast<std::uint64_t>(st.st_size), st.st_mtim});
  }
  ::closedir(d);
  if (total <= max_bytes_) return;
  std::sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) {
    return a.used.tv_sec != b.used.tv_sec ? a.used.tv_sec < b.used.tv_sec : a.used.tv_nsec < b.used.tv_nsec;
  });
  for (const Kept& k : kept) {
    if (total <= max_bytes_) break;
    if (::unlink(k.path.c_str()) == 0) total -= k.bytes;
  }
}

} // namespace chorus::cli::serve
