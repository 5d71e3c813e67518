// Sockets for tests: a port of this machine held (and listened on), and its number.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

namespace chorus::test {

/// Binds `fd` to `a` and listens where `backlog` > 0; closes it and returns
/// -1 (errno kept) on failure.
template <class Address>
inline int bind_listen(int fd, const Address& a, int backlog) {
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || (backlog > 0 && ::listen(fd, backlog) != 0)) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

/// A TCP socket (SO_REUSEADDR) bound to `port` on loopback, or on every
/// address where `any`, and listening where `backlog` > 0; port 0 takes one
/// the kernel picks from its ephemeral range. -1 if the port cannot be had,
/// with errno saying why.
inline int bound_socket(std::uint16_t port, int backlog, bool any = false) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(any ? INADDR_ANY : INADDR_LOOPBACK);
  return bind_listen(fd, a, backlog);
}

/// The kernel's ephemeral range (net.ipv4.ip_local_port_range), from which
/// outgoing connections take their local ports: {low, high}, inclusive;
/// Linux's default where it cannot be read.
inline std::pair<int, int> ephemeral_range() {
  int low = 32768, high = 60999;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); !(range >> low >> high)) return {32768, 60999};
  return {low, high};
}

/// A Unix stream socket bound to `path`, listening where `backlog` > 0
/// (an unlistened one is what a process that died leaves behind); -1 with
/// errno on failure.
inline int unix_socket(const std::string& path, int backlog) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  return fd < 0 ? -1 : bind_listen(fd, a, backlog);
}

/// The local port of a bound socket.
inline std::uint16_t port_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

/// A TCP port on loopback that was free a moment ago (the kernel's choice
/// from its ephemeral range); -1 with errno where none could be had.
inline int free_port() {
  const int fd = bound_socket(0, 0);
  if (fd < 0) return -1;
  const int port = port_of(fd);
  ::close(fd);
  return port;
}

} // namespace chorus::test
