#include "actors/job_secret.hpp"
#include "io/platform/posix.hpp"
#include "io/platform/random.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace chorus::actors {
namespace {

constexpr std::size_t secret_bytes = 32;            // 64 hex digits in the file
constexpr std::size_t env_min = 16, env_max = 4096; // CHORUS_JOB_SECRET's bounds
constexpr std::time_t stale_after_s = 30 * 24 * 3600;

/// FNV-1a of the job's identity: the file's name, not a secret.
std::string identity_hash(const std::string& identity) {
  std::uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : identity) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

Error bad_file(const std::string& path, const std::string& what) {
  return {Errc::bad_environment, path + " " + what +
                                     ": it should hold the job's secret, made by chorus (mode 0600, 64 hex digits, "
                                     "owned by this user); remove it, and start the job again"};
}

/// The secret in `path`; an error naming the file where it is not one; ENOENT as errno 0 and "".
Result<std::string> read_secret(const std::string& path, bool& missing) {
  missing = false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) {
      missing = true;
      return std::string();
    }
    if (errno == ELOOP) return bad_file(path, "is a symbolic link");
    return platform::os_error("cannot read the job's secret", path, errno);
  }
  struct stat st {};
  std::string out(2 * secret_bytes, '\0');
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const ssize_t n = stat_ok && S_ISREG(st.st_mode) ? ::read(fd, out.data(), out.size()) : -1;
  ::close(fd);
  if (!stat_ok || !S_ISREG(st.st_mode)) return bad_file(path, "is not a regular file");
  if (st.st_uid != ::geteuid()) return bad_file(path, "is owned by user " + std::to_string(st.st_uid));
  if ((st.st_mode & 077) != 0) return bad_file(path, "can be read by others than its owner");
  if (n != static_cast<ssize_t>(out.size()) || st.st_size != static_cast<off_t>(out.size()) ||
      out.find_first_not_of("0123456789abcdef") != std::string::npos)
    return bad_file(path, "does not hold a secret of 64 hex digits");
  return out;
}

/// Removes the secrets of jobs long gone from `dir` (files not touched for stale_after_s).
void sweep(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const std::time_t now = std::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!name.starts_with("job-") || !name.ends_with(".secret")) continue;
    struct stat st {};
    const std::string path = dir + "/" + name;
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
        now - st.st_mtime > stale_after_s)
      ::unlink(path.c_str());
  }
  ::closedir(d);
}

/// The node's secret for the job `identity`: read, or made by the first process of the job to look.
Result<std::string> node_secret(const std::string& dir, const std::string& identity) {
  const std::string path = dir + "/job-" + identity_hash(identity) + ".secret";
  for (int attempt = 0; attempt < 3; ++attempt) {
    bool missing = false;
    Result<std::string> have = read_secret(path, missing);
    if (!have || !missing) return have;
    Result<std::string> made = platform::random_hex(secret_bytes, "the job's secret");
    if (!made) return made;
    // Written whole under another name, then linked into place: a process
    // of the job never reads half a secret, and only one secret wins.
    const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + made->substr(0, 8);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return platform::os_error("cannot make the job's secret", tmp, errno);
    Error written = platform::write_all(fd, *made, tmp);
    if (!written && ::fchmod(fd, 0600) != 0) written = platform::os_error("cannot make the job's secret private", tmp, errno);
    ::close(fd);
    if (written) {
      ::unlink(tmp.c_str());
      return written;
    }
    const int linked = ::link(tmp.c_str(), path.c_str());
    const int link_errno = errno;
    ::unlink(tmp.c_str());
    if (linked == 0) {
      sweep(dir);
      return made;
    }
    if (link_errno != EEXIST) return platform::os_error("cannot make the job's secret", path, link_errno);
    // Another process of the job made it first: read theirs.
  }
  return bad_file(path, "keeps changing");
}

} // namespace

Result<std::string> job_secret(const core::Settings& s, Link link, const std::string& socket_dir) {
  if (const char* env = s.opts.read_env ? std::getenv("CHORUS_JOB_SECRET") : nullptr; env != nullptr && *env != '\0') {
    const std::size_t n = std::strlen(env);
    if (n < env_min || n > env_max)
      return Error(Errc::bad_environment,
                   "CHORUS_JOB_SECRET has " + std::to_string(n) + " bytes: it takes " + std::to_string(env_min) +
                       " to " + std::to_string(env_max) +
                       ", the same on every process of the job (`head -c 32 /dev/urandom | xxd -p -c 64` makes one)");
    return std::string(env);
  }
  if (link != Link::local || socket_dir.empty()) return std::string();
  return node_secret(socket_dir, core::job_identity(s));
}

bool same_secret(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

} // namespace chorus::actors
