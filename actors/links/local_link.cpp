#include "actors/links/local_link.hpp"
#include "actors/links/link_doorman.hpp"
#include "actors/links/link_stream.hpp"
#include "io/platform/posix.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace chorus::actors {
namespace {

using caf::io::network::default_multiplexer;
using caf::io::network::native_socket;

/// A Unix stream socket (with `flags`) and the address of `path`; -1 with errno set.
int unix_socket(const std::string& path, int flags, sockaddr_un& addr) {
  addr = {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
}

/// Closes `fd` and returns -1, errno kept.
int close_failed(int fd) {
  const int e = errno;
  ::close(fd);
  errno = e;
  return -1;
}

/// A connected Unix socket to `path`, or -1 with errno set.
int connect_to(const std::string& path) {
  sockaddr_un addr;
  const int fd = unix_socket(path, SOCK_NONBLOCK, addr);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) return close_failed(fd);
  return fd;
}

/// Listens on `path`. A socket file left by a process that is gone (nobody
/// accepts on it) is replaced; one that a live process listens on is EADDRINUSE.
int listen_on(const std::string& path) {
  sockaddr_un addr;
  const int fd = unix_socket(path, 0, addr);
  if (fd < 0) return -1;
  auto fail = [fd] { return close_failed(fd); };
  for (int attempt = 0;; ++attempt) {
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) break;
    if (errno != EADDRINUSE || attempt > 0) return fail();
    if (const int probe = connect_to(path); probe >= 0) {
      ::close(probe);
      errno = EADDRINUSE;
      return fail();
    }
    if (errno != ECONNREFUSED) return fail();
    struct stat st {};
    // Only a stale socket is removed, never another kind of file.
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) || ::unlink(path.c_str()) != 0) {
      errno = EADDRINUSE;
      return fail();
    }
  }
  if (::chmod(path.c_str(), 0600) != 0 || ::listen(fd, 128) != 0) return fail();
  return fd;
}

/// A Unix listener whose connections are admitted only from this user's
/// processes, and which tells the BASP broker the port it stands for.
class LocalDoorman final : public LinkDoorman {
public:
  LocalDoorman(default_multiplexer& mx, native_socket fd, std::uint16_t port, std::string path,
               std::shared_ptr<LinkShared> shared)
      : LinkDoorman(mx, fd, std::move(shared)), port_(port), path_(std::move(path)) {}
  // The socket file goes with its listener, as a TCP port does.
  ~LocalDoorman() override { ::unlink(path_.c_str()); }

  std::uint16_t port() const override { return port_; }
  std::string addr() const override { return "local"; }

protected:
  bool admit(native_socket fd, std::unique_ptr<TlsSession>&) override {
    ucred peer{};
    socklen_t len = sizeof peer;
    // Not ours: CAF never sees a byte of it.
    return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.uid == ::geteuid();
  }

private:
  std::uint16_t port_;
  std::string path_;
};

class LocalLinks final : public caf::io::middleman_actor_impl {
public:
  LocalLinks(caf::actor_config& cfg, caf::actor broker, std::string dir, std::chrono::milliseconds deadline)
      : middleman_actor_impl(cfg, std::move(broker)), dir_(std::move(dir)), deadline_(deadline) {}

  const char* name() const override { return "chorus.local_links"; }

protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string&, std::uint16_t port) override {
    const std::string path = local_socket_path(dir_, port);
    const int fd = connect_to(path);
    if (fd < 0)
      return caf::make_error(caf::sec::cannot_connect_to_node, path + ": " + std::strerror(errno));
    // A link this process dialled needs no handshake deadline here: the dial has its own.
    return make_link_scribe(multiplexer(), fd, nullptr, false, shared());
  }

  caf::expected<caf::io::doorman_ptr> open(std::uint16_t port, const char*, bool) override {
    const std::string path = local_socket_path(dir_, port);
    const int fd = listen_on(path);
    if (fd < 0) return caf::make_error(caf::sec::cannot_open_port, path + ": " + std::strerror(errno));
    return caf::make_counted<LocalDoorman>(multiplexer(), fd, port, path, shared());
  }

private:
  /// What this actor's links share; made with the first link.
  const std::shared_ptr<LinkShared>& shared() {
    if (!shared_) shared_ = std::make_shared<LinkShared>(system(), deadline_);
    return shared_;
  }

  default_multiplexer& multiplexer() {
    return static_cast<default_multiplexer&>(system().middleman().backend());
  }

  std::string dir_;
  std::chrono::milliseconds deadline_;
  std::shared_ptr<LinkShared> shared_;
};

/// The fix every refusal of a socket directory names.
constexpr const char* fix = "set CHORUS_SOCKET_DIR to a directory of your own on every rank";

/// What lstat finds at a socket directory's path.
enum class Found { ours, missing, other };

/// Whether `path` is a directory of this user's of mode 0700 exactly
/// (lstat: a link is not); where it is not, `why` says what it is instead.
Result<Found> look(const std::string& path, std::string& why) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Found::missing;
    return platform::os_error("cannot read the socket directory", path, errno, fix);
  }
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (S_ISLNK(st.st_mode))
    why = "a symbolic link";
  else if (!S_ISDIR(st.st_mode))
    why = "not a directory";
  else if (st.st_uid != ::geteuid())
    why = "owned by user " + std::to_string(st.st_uid);
  else if ((st.st_mode & 07777) != 0700)
    why = std::string("of mode ") + mode + ", not 0700";
  else
    return Found::ours;
  return Found::other;
}

/// Makes the directory `path` with mode 0700: false where it exists already.
/// A umask that took a bit of 0700 away is undone on what this made, through
/// a descriptor of the directory itself (no link is followed).
Result<bool> make_private(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0) {
    if (errno == EEXIST) return false;
    return platform::os_error("cannot make the socket directory", path, errno, fix);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 07777) != 0700) (void)::fchmod(fd, 0700);
    ::close(fd);
  }
  return true;
}

/// The first of base/name, base/name-1, base/name-2, ... that is a directory
/// of this user's of mode 0700, or that this process makes so.
Result<std::string> private_dir(const std::string& base, const std::string& name, const std::string& named) {
  constexpr int tries = 16;
  std::string first_why;
  for (int i = 0; i < tries; ++i) {
    const std::string path = base + "/" + name + (i == 0 ? std::string() : "-" + std::to_string(i));
    std::string why;
    Result<Found> found = look(path, why);
    if (!found) return found.error();
    if (*found == Found::missing) {
      Result<bool> made = make_private(path);
      if (!made) return made.error();
      // Made here or by a process that raced this one: what counts is what it is now.
      found = look(path, why);
      if (!found) return found.error();
    }
    if (*found == Found::ours) return path;
    if (first_why.empty()) first_why = path + " is " + why;
  }
  return Error{Errc::bad_environment,
               "no socket directory of this user's in " + base + named + ": " + first_why + ", and none of " + name +
                   "-1 to " + name + "-" + std::to_string(tries - 1) +
                   " is a directory of this user's of mode 0700 either (the sockets that link a job's processes live "
                   "in a directory only their user can enter); remove those, or " + fix};
}

/// The socket directory that CHORUS_SOCKET_DIR names (`dir`).
Result<std::string> chosen_dir(const std::string& dir) {
  const std::string named = " (CHORUS_SOCKET_DIR)";
  std::string why;
  Result<Found> found = look(dir, why);
  if (!found) return found.error();
  if (*found == Found::missing) {
    Result<bool> made = make_private(dir);
    if (!made) return made.error();
    found = look(dir, why);
    if (!found) return found.error();
  }
  if (*found == Found::ours) return dir;
  // Not this user's private directory: left as it is, a subdirectory of ours in it.
  if (why == "a symbolic link" || why == "not a directory")
    return Error{Errc::bad_environment,
                 dir + named + " is not a directory" + (why == "a symbolic link" ? " (a symbolic link)" : "") +
                     ": the sockets that link a job's processes live in a directory only their user can enter; " + fix};
  return private_dir(dir, "chorus-" + std::to_string(::geteuid()), " (CHORUS_SOCKET_DIR)");
}

} // namespace

Result<std::string> local_socket_dir(bool read_env) {
  const char* env = read_env ? std::getenv("CHORUS_SOCKET_DIR") : nullptr;
  Result<std::string> out = std::string();
  if (env != nullptr && *env != '\0') {
    out = chosen_dir(env);
  } else {
    const char* xdg = std::getenv("XDG_RUNTIME_DIR");
    std::string why;
    Result<Found> runtime = xdg != nullptr && *xdg == '/' ? look(xdg, why) : Result<Found>(Found::missing);
    if (runtime && *runtime == Found::ours) {
      out = private_dir(xdg, "chorus", " (XDG_RUNTIME_DIR)");
    } else {
      const char* tmp = std::getenv("TMPDIR");
      out = private_dir(tmp != nullptr && *tmp == '/' ? tmp : "/tmp", "chorus-" + std::to_string(::geteuid()),
                        tmp != nullptr && *tmp == '/' ? " (TMPDIR)" : "");
    }
  }
  if (!out) return out;
  if (local_socket_path(*out, 65535).size() >= sizeof(sockaddr_un{}.sun_path))
    return Error{Errc::bad_environment, *out + " is too long a path for a Unix socket (at most " +
                                            std::to_string(sizeof(sockaddr_un{}.sun_path) - 12) + " characters): " +
                                            "set CHORUS_SOCKET_DIR to a shorter one on every rank"};
  return out;
}

std::string local_socket_path(const std::string& dir, std::uint16_t port) {
  return dir + "/" + std::to_string(port) + ".sock";
}

caf::io::middleman_actor spawn_local_links(caf::actor_system& sys, std::string dir,
                                           std::chrono::milliseconds handshake_deadline) {
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  return sys.spawn<LocalLinks, caf::hidden>(std::move(broker), std::move(dir), handshake_deadline);
}

} // namespace chorus::actors
