// The tracking server's transport: HTTP/1.1 over POSIX sockets, HTTPS with
// OpenSSL, on 127.0.0.1. One thread accepts, one per connection reads its
// requests (keep-alive, chunked bodies, Expect: 100-continue) and writes the
// answers its Service gives. The faults, outages, counters and recorded
// requests of TrackingServer (tracking_server.hpp) are kept here, since they
// act on connections and requests before any API sees them.
#pragma once

#include "tests/upload/tracking_server.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

struct ssl_ctx_st; // OpenSSL's SSL_CTX

namespace chorus::test::server {

struct Request {
  std::string method, target, path, version;
  std::map<std::string, std::string> query; // the first of a repeated name wins (as Flask's args.get)
  std::vector<std::pair<std::string, std::string>> headers; // names lower-cased
  std::string body; // de-chunked
  std::optional<std::size_t> content_length;
  bool chunked = false;
  bool expect_continue = false;
  bool keep_alive = true;

  [[nodiscard]] const std::string* header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return &v;
    return nullptr;
  }
};

struct Answer {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::string> headers; // "Name: value"
};

/// A text answer (the shape of Flask's own errors).
Answer plain(int status, std::string text);
/// 200 with a JSON body.
Answer json(std::string body);

class Stream; // one accepted connection, plain or TLS (http.cpp)

class HttpServer {
public:
  /// What the transport serves.
  struct Service {
    /// ServerStats::by_kind's name for a request's path.
    std::function<std::string(std::string_view path)> kind;
    /// The answer to a request, on its connection's thread (one thread a connection).
    std::function<Answer(const Request&)> answer;
  };

  /// Listens on 127.0.0.1:`port` (0: an ephemeral port) before returning,
  /// HTTPS with `tls`. Throws std::runtime_error when it cannot (or when the
  /// TLS files do not load).
  HttpServer(const std::optional<TlsFiles>& tls, std::uint16_t port, bool record_requests, Service service);
  /// Closes every connection and joins its thread.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

  // As TrackingServer's of the same names; every method is thread-safe.
  void fail_next(int n, InjectedAnswer answer);
  void reset_next(int n, ResetPoint at, std::string path_contains);
  void set_delay(std::chrono::milliseconds delay, std::string path_contains);
  void hold_next(int n, std::chrono::milliseconds longest, unsigned release_after, std::string path_contains);
  void outage(std::chrono::milliseconds duration);
  [[nodiscard]] bool in_outage() const;
  /// Drops pending injected answers, resets and the delay.
  void clear_faults();
  [[nodiscard]] ServerStats stats() const;
  [[nodiscard]] std::vector<std::string> authorization_headers() const;
  [[nodiscard]] std::vector<RecordedRequest> requests() const;

private:
  using Clock = std::chrono::steady_clock;
  struct FailRule {
    int left;
    InjectedAnswer answer;
  };
  struct ResetRule {
    int left;
    ResetPoint at;
    std::string path_contains;
  };
  struct HoldRule {
    int left;
    std::chrono::milliseconds longest;
    unsigned release_after;
    std::string path_contains;
  };
  /// A request held (hold_next), and how many like it came since.
  struct Held {
    std::string path_contains;
    unsigned seen = 0;
  };
  struct Fault {
    std::optional<ResetPoint> reset;
    std::optional<InjectedAnswer> answer;
    std::chrono::milliseconds delay{0};
    std::optional<HoldRule> hold;
    unsigned in_flight = 0; // RecordedRequest::in_flight
  };
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void setup_tls(const TlsFiles& f);
  void wake() const;
  void accept_loop();
  void go_down(std::unique_lock<std::mutex>& lk);
  void start_connection(int fd);
  void serve_connection(int fd);
  void serve(Stream& s);
  Fault take_fault(const Request& req);

  const bool record_requests_;
  const Service service_;
  ssl_ctx_st* ssl_ctx_ = nullptr;
  std::uint16_t port_ = 0;
  int listen_fd_ = -1; // the acceptor's alone
  int wake_read_ = -1, wake_write_ = -1;
  std::thread acceptor_;
  std::list<Connection> connections_; // the acceptor's alone (and the destructor's after it)

  mutable std::mutex mu_; // everything below
  std::condition_variable cv_;
  bool stopping_ = false;
  std::set<int> open_fds_;
  std::optional<Clock::time_point> outage_until_;
  bool listener_down_ = false;

  std::deque<FailRule> fail_rules_;
  std::deque<ResetRule> reset_rules_;
  std::chrono::milliseconds delay_{0};
  std::string delay_path_;
  std::deque<HoldRule> hold_rules_;
  std::list<Held*> held_;
  unsigned in_service_ = 0; // requests read whose answer has not started out (or cut)

  ServerStats stats_;
  std::vector<std::string> authorizations_;
  std::vector<RecordedRequest> recorded_;
};

} // namespace chorus::test::server
