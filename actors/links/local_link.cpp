#include "actors/links/local_link.hpp"
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
#include <cstdlib>
#include <cstring>
#include <memory>

namespace chorus::detail {
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
  bool admit(native_socket fd, caf::openssl::session_ptr&) override {
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

} // namespace

Result<std::string> local_socket_dir(bool read_env) {
  const char* env = read_env ? std::getenv("CHORUS_SOCKET_DIR") : nullptr;
  const char* tmp = std::getenv("TMPDIR");
  const bool chosen = env != nullptr && *env != '\0';
  const std::string out = chosen ? std::string(env)
               : std::string(tmp != nullptr && *tmp == '/' ? tmp : "/tmp") + "/chorus-" + std::to_string(::geteuid());
  const std::string named = chosen ? " (CHORUS_SOCKET_DIR)" : "";
  if (::mkdir(out.c_str(), 0700) != 0 && errno != EEXIST)
    return io::detail::os_error("cannot make the socket directory" + named, out, errno);
  struct stat st {};
  if (::lstat(out.c_str(), &st) != 0) return io::detail::os_error("cannot read the socket directory" + named, out, errno);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
    return {Errc::bad_environment,
            out + named + " is " + (S_ISDIR(st.st_mode) ? "owned by user " + std::to_string(st.st_uid) : std::string("not a directory")) +
                ": the sockets that link a job's processes live in a directory only their user can enter; remove "
                "it, or set CHORUS_SOCKET_DIR to a directory of your own on every rank"};
  if ((st.st_mode & 077) != 0 && ::chmod(out.c_str(), 0700) != 0)
    return io::detail::os_error("cannot make the socket directory private (mode 0700)" + named, out, errno);
  if (local_socket_path(out, 65535).size() >= sizeof(sockaddr_un{}.sun_path))
    return {Errc::bad_environment, out + named + " is too long a path for a Unix socket (at most " +
                                       std::to_string(sizeof(sockaddr_un{}.sun_path) - 12) +
                                       " characters): set CHORUS_SOCKET_DIR to a shorter one on every rank"};
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

} // namespace chorus::detail
