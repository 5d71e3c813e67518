// The TLS handshakes of the connections a process accepts from other nodes,
// made on threads of their own rather than on the multiplexer's one thread.
//
// A run host makes a handshake for every rank of another node (1.2 to
// 1.8 ms of CPU each on a 2-core VM), and its multiplexer thread also
// carries every link's messages in arrival order: made there, 10,000 ranks'
// handshakes would hold it for 12 to 18 s while the first ranks wait at
// their first barrier (BENCHMARKS.md, "Joins across nodes"). Here each
// thread waits on its connections' sockets (epoll) and moves their
// handshakes on; a connection whose handshake is over is handed back, to
// become a link on the multiplexer; one that fails is closed, saying why
// once a reason; one still in its handshake at its deadline is closed.
//
// CAF-free: the caller hands a connection over (link_stream.cpp's doorman).
#pragma once

#include "actors/links/tls_session.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace chorus::actors {

class TlsHandshakes {
public:
  using clock = std::chrono::steady_clock;
  /// Called on a handshake thread with a connection whose handshake is over
  /// (the callee owns `fd` from then on, and closes it where it cannot use it).
  using Done = std::function<void(int fd, std::unique_ptr<TlsSession> session)>;

  /// `threads` (at least 1) threads, started now.
  explicit TlsHandshakes(unsigned threads);
  /// Stops the threads, closing the connections still in their handshake.
  ~TlsHandshakes();
  TlsHandshakes(const TlsHandshakes&) = delete;
  TlsHandshakes& operator=(const TlsHandshakes&) = delete;

  /// Makes the handshake of `session` on the non-blocking socket `fd` (from
  /// `peer`, for a line) until `deadline`. `fd` is this object's until
  /// `done` is called with it; it is closed where the handshake fails or
  /// the deadline passes first.
  void start(int fd, std::unique_ptr<TlsSession> session, std::string peer, clock::time_point deadline, Done done);

  /// The threads a process gets: one a core besides the multiplexer's, 1 to 8.
  [[nodiscard]] static unsigned default_threads();

private:
  class Worker;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<unsigned> next_{0};
};

} // namespace chorus::actors
