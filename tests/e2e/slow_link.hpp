// A slow network link on loopback: a TCP relay that listens on one port and
// passes every byte on to another port, each way, `delay` after it arrived,
// as a link between distant nodes does. End of stream is passed on once what
// came before it has been delivered.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace e2e {

class SlowLink {
public:
  using clock = std::chrono::steady_clock;

  SlowLink(int listen_port, int target_port, std::chrono::milliseconds delay)
      : target_port_(target_port), delay_(delay) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = loopback(listen_port);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener_, 64) != 0)
      throw std::runtime_error("slow link: cannot listen on port " + std::to_string(listen_port));
    thread_ = std::thread([this] { loop(); });
  }
  SlowLink(const SlowLink&) = delete;
  SlowLink& operator=(const SlowLink&) = delete;
  ~SlowLink() {
    stop_ = true;
    thread_.join();
    for (auto& p : pipes_) ::close(p->from);
    ::close(listener_);
  }

private:
  struct Chunk {
    clock::time_point due;
    std::string bytes; // empty: end of stream
  };
  /// One direction of one connection: `from` is read, `to` written.
  struct Pipe {
    int from = -1, to = -1;
    std::deque<Chunk> queue;
    bool eof = false, dead = false;
  };

  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void accept_one() {
    const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) return;
    const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = loopback(target_port_);
    if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(server);
      ::close(client); // nothing listens there yet: refused, as the target would
      return;
    }
    pipes_.push_back(std::make_unique<Pipe>(Pipe{client, server, {}, false, false}));
    pipes_.push_back(std::make_unique<Pipe>(Pipe{server, client, {}, false, false}));
  }

  void deliver(Pipe& p, clock::time_point now) {
    while (!p.dead && !p.queue.empty() && p.queue.front().due <= now) {
      Chunk& c = p.queue.front();
      if (c.bytes.empty()) {
        ::shutdown(p.to, SHUT_WR);
      } else {
        std::size_t off = 0;
        while (off < c.bytes.size()) {
          const ssize_t n = ::send(p.to, c.bytes.data() + off, c.bytes.size() - off, MSG_NOSIGNAL);
          if (n <= 0) {
            p.dead = true;
            break;
          }
          off += static_cast<std::size_t>(n);
        }
      }
      p.queue.pop_front();
    }
  }

  void loop() {
    char buf[65536];
    while (!stop_) {
      const auto now = clock::now();
      int timeout_ms = 20;
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (auto& p : pipes_) {
        deliver(*p, now);
        if (!p->queue.empty())
          timeout_ms = std::min<int>(
              timeout_ms, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(p->queue.front().due - now).count()) + 1);
        fds.push_back({p->eof || p->dead ? -1 : p->from, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), std::max(timeout_ms, 0)) < 0) continue;
      if (fds[0].revents & POLLIN) accept_one();
      const auto arrived = clock::now();
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Pipe& p = *pipes_[i - 1];
        const ssize_t n = ::recv(p.from, buf, sizeof buf, 0);
        if (n > 0) {
          p.queue.push_back({arrived + delay_, std::string(buf, static_cast<std::size_t>(n))});
        } else {
          p.eof = true;
          p.queue.push_back({arrived + delay_, {}});
        }
      }
    }
  }

  int listener_ = -1;
  int target_port_;
  std::chrono::milliseconds delay_;
  std::vector<std::unique_ptr<Pipe>> pipes_; // each connection's two directions, side by side
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

} // namespace e2e
