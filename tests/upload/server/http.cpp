// The tracking server's transport (http.hpp): parsing requests, writing
// answers, the accept and connection threads, TLS, and the faults.
#include "tests/upload/server/http.hpp"
#include "tests/socket.hpp"
#include "tests/upload/server/text.hpp"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <stdexcept>

namespace chorus::test::server {

namespace {

constexpr std::size_t max_head_bytes = 64 * 1024;
constexpr std::size_t max_body_bytes = std::size_t{256} << 20; // past this: 413 and the connection closed

std::string reason_phrase(int status) {
  switch (status) {
  case 100: return "Continue";
  case 200: return "OK";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 413: return "Payload Too Large";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  default: return "Status";
  }
}

// Query arguments; the first of a repeated name wins (as Flask's args.get).
std::map<std::string, std::string> parse_query(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    const std::size_t amp = q.find('&');
    const std::string_view pair = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    out.emplace(percent_decode(pair.substr(0, eq), true),
                eq == std::string_view::npos ? std::string{} : percent_decode(pair.substr(eq + 1), true));
  }
  return out;
}

std::string render(const Answer& a, bool keep_alive) {
  std::string out = "HTTP/1.1 " + std::to_string(a.status) + " " + reason_phrase(a.status) + "\r\n";
  out += "Content-Type: " + a.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(a.body.size()) + "\r\n";
  for (const auto& h : a.headers) out += h + "\r\n";
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  out += a.body;
  return out;
}

Answer injected(const InjectedAnswer& a) {
  Answer out{a.status, a.body, "application/json", {}};
  if (out.body.empty())
    out.body = R"({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "injected )" + std::to_string(a.status) + "\"}";
  if (!a.retry_after.empty()) out.headers.push_back("Retry-After: " + a.retry_after);
  return out;
}

void block_sigpipe() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int open_listener(std::uint16_t port, std::string& error) {
  const int fd = chorus::test::bound_socket(port, 128);
  if (fd < 0) error = "bind/listen on 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno);
  return fd;
}

} // namespace

Answer plain(int status, std::string text) { return {status, std::move(text), "text/plain; charset=utf-8", {}}; }

Answer json(std::string body) { return {200, std::move(body), "application/json", {}}; }

// ------------------------------------------------------------ a connection

// Blocking I/O on one accepted connection. The descriptor is closed by its
// owner (see serve_connection), after it is no longer listed where the
// destructor or an outage could shut it down.
class Stream {
public:
  Stream(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ~Stream() {
    if (ssl_ != nullptr) SSL_free(ssl_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  bool handshake() {
    if (ssl_ == nullptr) return true;
    if (SSL_set_fd(ssl_, fd_) != 1 || SSL_accept(ssl_) != 1) {
      ERR_clear_error();
      return false;
    }
    secured_ = true;
    return true;
  }

  // Appends what arrives to `buf`; false at the end of the stream or on an error.
  bool read_more(std::string& buf) {
    char tmp[16 * 1024];
    long n = 0;
    if (ssl_ != nullptr) {
      const int r = SSL_read(ssl_, tmp, static_cast<int>(sizeof tmp));
      if (r <= 0) ERR_clear_error();
      n = r;
    } else {
      do n = ::recv(fd_, tmp, sizeof tmp, 0);
      while (n < 0 && errno == EINTR);
    }
    if (n <= 0) return false;
    buf.append(tmp, static_cast<std::size_t>(n));
    return true;
  }

  bool write_all(std::string_view data) {
    while (!data.empty()) {
      long n = 0;
      const std::size_t chunk = std::min<std::size_t>(data.size(), 1 << 20);
      if (ssl_ != nullptr) {
        const int r = SSL_write(ssl_, data.data(), static_cast<int>(chunk));
        if (r <= 0) ERR_clear_error();
        n = r;
      } else {
        do n = ::send(fd_, data.data(), chunk, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
      }
      if (n <= 0) return false;
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // The close that follows sends a TCP RST instead of a FIN.
  void cut() {
    const linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    cut_ = true;
  }

  void close() {
    if (secured_ && !cut_) {
      SSL_shutdown(ssl_);
      ERR_clear_error();
    }
    ::close(fd_);
  }

private:
  int fd_;
  SSL* ssl_;
  bool secured_ = false;
  bool cut_ = false;
};

// ------------------------------------------------------------ requests

namespace {

enum class Read { ok, closed, bad, too_large, unsupported };

Read read_head(Stream& s, std::string& buf, Request& req) {
  std::size_t end = 0;
  while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (buf.size() > max_head_bytes) return Read::bad;
    if (!s.read_more(buf)) return buf.empty() ? Read::closed : Read::bad;
  }
  std::string_view head(buf.data(), end);
  while (head.starts_with("\r\n")) head.remove_prefix(2); // stray empty lines before a request
  const std::size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return Read::bad;
  req.method = line.substr(0, sp1);
  req.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  req.version = line.substr(sp2 + 1);
  if (!req.version.starts_with("HTTP/1.") || req.target.empty() || req.target[0] != '/') return Read::bad;
  const std::size_t qmark = req.target.find('?');
  req.path = req.target.substr(0, qmark);
  if (qmark != std::string::npos) req.query = parse_query(std::string_view(req.target).substr(qmark + 1));
  req.keep_alive = req.version != "HTTP/1.0";

  std::string_view rest = eol == std::string_view::npos ? std::string_view{} : head.substr(eol + 2);
  while (!rest.empty()) {
    const std::size_t e = rest.find("\r\n");
    const std::string_view h = rest.substr(0, e);
    rest = e == std::string_view::npos ? std::string_view{} : rest.substr(e + 2);
    const std::size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0) return Read::bad;
    std::string name = lower(h.substr(0, colon));
    std::string value(trim(h.substr(colon + 1)));
    if (name == "content-length") {
      std::size_t n = 0;
      const auto r = std::from_chars(value.data(), value.data() + value.size(), n);
      if (r.ec != std::errc{} || r.ptr != value.data() + value.size()) return Read::bad;
      req.content_length = n;
    } else if (name == "transfer-encoding") {
      if (!lower(value).ends_with("chunked")) return Read::unsupported;
      req.chunked = true;
    } else if (name == "expect") {
      req.expect_continue = lower(value) == "100-continue";
    } else if (name == "connection") {
      const std::string v = lower(value);
      if (v.find("close") != std::string::npos) req.keep_alive = false;
      if (v.find("keep-alive") != std::string::npos) req.keep_alive = true;
    }
    req.headers.emplace_back(std::move(name), std::move(value));
  }
  buf.erase(0, end + 4);
  return Read::ok;
}

Read read_body(Stream& s, std::string& buf, Request& req) {
  if (req.chunked) {
    for (;;) {
      std::size_t eol = 0;
      while ((eol = buf.find("\r\n")) == std::string::npos) {
        if (buf.size() > 4096) return Read::bad;
        if (!s.read_more(buf)) return Read::closed;
      }
      const std::string_view size_line = std::string_view(buf).substr(0, std::min(eol, buf.find(';')));
      std::size_t size = 0;
      const auto r = std::from_chars(size_line.data(), size_line.data() + size_line.size(), size, 16);
      if (r.ec != std::errc{} || size_line.empty()) return Read::bad;
      buf.erase(0, eol + 2);
      if (size == 0) { // trailers, then the empty line
        for (;;) {
          while ((eol = buf.find("\r\n")) == std::string::npos) {
            if (buf.size() > max_head_bytes) return Read::bad;
            if (!s.read_more(buf)) return Read::closed;
          }
          buf.erase(0, eol + 2);
          if (eol == 0) return Read::ok;
        }
      }
      if (req.body.size() + size > max_body_bytes) return Read::too_large;
      while (buf.size() < size + 2)
        if (!s.read_more(buf)) return Read::closed;
      if (buf.compare(size, 2, "\r\n") != 0) return Read::bad;
      req.body.append(buf, 0, size);
      buf.erase(0, size + 2);
    }
  }
  const std::size_t n = req.content_length.value_or(0);
  if (n > max_body_bytes) return Read::too_large;
  while (buf.size() < n)
    if (!s.read_more(buf)) return Read::closed;
  req.body.assign(buf, 0, n);
  buf.erase(0, n);
  return Read::ok;
}

} // namespace

// ------------------------------------------------------------ the server

HttpServer::HttpServer(const std::optional<TlsFiles>& tls, std::uint16_t port, bool record_requests, Service service)
    : record_requests_(record_requests), service_(std::move(service)) {
  if (tls) setup_tls(*tls);
  std::string error;
  listen_fd_ = open_listener(port, error);
  if (listen_fd_ < 0) {
    if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
    throw std::runtime_error(error);
  }
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(listen_fd_);
    if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
    throw std::runtime_error("pipe2 failed");
  }
  wake_read_ = fds[0];
  wake_write_ = fds[1];
  acceptor_ = std::thread([this] { accept_loop(); });
}

HttpServer::~HttpServer() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (const int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  cv_.notify_all();
  wake();
  acceptor_.join();
  {
    std::lock_guard lk(mu_); // connections accepted while stopping_ was being set
    for (const int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& c : connections_) c.thread.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
  if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
}

void HttpServer::setup_tls(const TlsFiles& f) {
  ssl_ctx_ = SSL_CTX_new(TLS_server_method());
  bool ok = ssl_ctx_ != nullptr && SSL_CTX_set_min_proto_version(ssl_ctx_, TLS1_2_VERSION) == 1 &&
            SSL_CTX_use_certificate_chain_file(ssl_ctx_, f.cert.c_str()) == 1 &&
            SSL_CTX_use_PrivateKey_file(ssl_ctx_, f.key.c_str(), SSL_FILETYPE_PEM) == 1 &&
            SSL_CTX_check_private_key(ssl_ctx_) == 1;
  if (ok && !f.ca.empty()) { // the issuer goes along with the certificate
    BIO* bio = BIO_new_file(f.ca.c_str(), "r");
    X509* ca = bio != nullptr ? PEM_read_bio_X509(bio, nullptr, nullptr, nullptr) : nullptr;
    ok = ca != nullptr && SSL_CTX_add1_chain_cert(ssl_ctx_, ca) == 1;
    X509_free(ca);
    BIO_free(bio);
  }
  if (!ok) {
    const unsigned long e = ERR_get_error();
    char buf[256] = "unknown error";
    if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
    ERR_clear_error();
    if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
    ssl_ctx_ = nullptr;
    throw std::runtime_error("TLS files " + f.cert + ", " + f.key + ": " + buf);
  }
}

void HttpServer::wake() const {
  const char c = 1;
  [[maybe_unused]] const auto n = ::write(wake_write_, &c, 1);
}

void HttpServer::accept_loop() {
  block_sigpipe();
  for (;;) {
    {
      std::unique_lock lk(mu_);
      if (stopping_) return;
      if (outage_until_) {
        go_down(lk);
        if (stopping_) return;
        continue;
      }
    }
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if ((fds[1].revents & POLLIN) != 0) {
      char drain[64];
      while (::read(wake_read_, drain, sizeof drain) > 0) {
      }
    }
    if ((fds[0].revents & POLLIN) != 0) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) start_connection(fd);
    }
    connections_.remove_if([](Connection& c) {
      if (!c.done.load()) return false;
      c.thread.join();
      return true;
    });
  }
}

// The outage: the listener closed (connections refused), open ones shut
// down, until the time is up; then the same port again.
void HttpServer::go_down(std::unique_lock<std::mutex>& lk) {
  ::close(listen_fd_);
  listen_fd_ = -1;
  for (const int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  listener_down_ = true;
  cv_.notify_all();
  while (!stopping_ && Clock::now() < *outage_until_) cv_.wait_until(lk, *outage_until_);
  while (!stopping_) {
    std::string error;
    listen_fd_ = open_listener(port_, error);
    if (listen_fd_ >= 0) break;
    cv_.wait_for(lk, std::chrono::milliseconds(10)); // the port is briefly busy: try again
  }
  outage_until_.reset();
  listener_down_ = false;
  cv_.notify_all();
}

void HttpServer::start_connection(int fd) {
  {
    std::lock_guard lk(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    open_fds_.insert(fd);
    ++stats_.connections;
  }
  Connection& c = connections_.emplace_back();
  c.thread = std::thread([this, fd, &c] {
    serve_connection(fd);
    c.done.store(true);
  });
}

void HttpServer::serve_connection(int fd) {
  block_sigpipe();
  SSL* ssl = ssl_ctx_ != nullptr ? SSL_new(ssl_ctx_) : nullptr;
  Stream stream(fd, ssl);
  if ((ssl_ctx_ == nullptr || ssl != nullptr) && stream.handshake()) serve(stream);
  {
    std::lock_guard lk(mu_);
    open_fds_.erase(fd);
  }
  stream.close();
}

// Requests on one connection until it closes, is cut, or asks to close.
void HttpServer::serve(Stream& s) {
  std::string buf;
  for (;;) {
    Request req;
    switch (read_head(s, buf, req)) {
    case Read::ok: break;
    case Read::closed: return;
    case Read::unsupported: s.write_all(render(plain(501, "unsupported transfer coding"), false)); return;
    default: s.write_all(render(plain(400, "malformed request"), false)); return;
    }
    const Fault fault = take_fault(req);
    struct Served { // the request leaves in_service_ however it ends
      HttpServer& server;
      bool left = false;
      void leave() {
        if (left) return;
        left = true;
        std::lock_guard lk(server.mu_);
        --server.in_service_;
      }
      ~Served() { leave(); }
    } served{*this};
    if (fault.reset == ResetPoint::after_headers) return s.cut();
    const bool has_body = req.chunked || req.content_length.value_or(0) > 0;
    if (req.expect_continue && has_body && !s.write_all("HTTP/1.1 100 Continue\r\n\r\n")) return;
    switch (read_body(s, buf, req)) {
    case Read::ok: break;
    case Read::too_large: s.write_all(render(plain(413, "request body too large"), false)); return;
    case Read::closed: return;
    default: s.write_all(render(plain(400, "malformed chunked body"), false)); return;
    }
    if (record_requests_) {
      std::lock_guard lk(mu_);
      recorded_.push_back({req.method, req.target, req.headers, req.body, fault.in_flight});
    }
    if (fault.reset == ResetPoint::after_body) return s.cut();
    if (fault.hold) {
      std::unique_lock lk(mu_);
      Held held{fault.hold->path_contains};
      held_.push_back(&held);
      const bool stopping = cv_.wait_for(lk, fault.hold->longest,
                                         [&] { return stopping_ || held.seen >= fault.hold->release_after; });
      held_.remove(&held);
      stats_.overtaken = std::max<std::uint64_t>(stats_.overtaken, held.seen);
      if (stopping && stopping_) return;
    }
    if (fault.delay.count() > 0) {
      std::unique_lock lk(mu_);
      if (cv_.wait_for(lk, fault.delay, [&] { return stopping_; })) return;
    }
    const Answer answer = fault.answer ? injected(*fault.answer) : service_.answer(req);
    if (fault.reset == ResetPoint::after_handling) return s.cut();
    // Out of service before the answer goes: a client that sends its next
    // request the moment it reads this one's answer (on another connection,
    // to another thread) must not find this one still counted.
    served.leave();
    if (!s.write_all(render(answer, req.keep_alive)) || !req.keep_alive) return;
  }
}

// Counts the request and takes the faults it meets.
HttpServer::Fault HttpServer::take_fault(const Request& req) {
  std::lock_guard lk(mu_);
  ++stats_.requests;
  ++stats_.by_kind[service_.kind(req.path)];
  if (const std::string* auth = req.header("authorization")) authorizations_.push_back(*auth);
  Fault f;
  const auto matches = [&](const std::string& part) { return req.target.find(part) != std::string::npos; };
  for (auto it = reset_rules_.begin(); it != reset_rules_.end(); ++it) {
    if (!matches(it->path_contains)) continue;
    f.reset = it->at;
    if (--it->left <= 0) reset_rules_.erase(it);
    break;
  }
  if (!f.reset) {
    for (auto it = fail_rules_.begin(); it != fail_rules_.end(); ++it) {
      if (!matches(it->answer.path_contains)) continue;
      f.answer = it->answer;
      if (--it->left <= 0) fail_rules_.erase(it);
      break;
    }
  }
  if (delay_.count() > 0 && matches(delay_path_)) f.delay = delay_;
  for (auto it = hold_rules_.begin(); it != hold_rules_.end(); ++it) {
    if (!matches(it->path_contains)) continue;
    f.hold = *it;
    if (--it->left <= 0) hold_rules_.erase(it);
    break;
  }
  bool overtook = false;
  for (Held* h : held_)
    if (matches(h->path_contains)) ++h->seen, overtook = true;
  if (overtook) cv_.notify_all();
  f.in_flight = ++in_service_;
  return f;
}

// ------------------------------------------------------------ faults and counters

void HttpServer::fail_next(int n, InjectedAnswer answer) {
  if (n <= 0) return;
  std::lock_guard lk(mu_);
  fail_rules_.push_back({n, std::move(answer)});
}

void HttpServer::reset_next(int n, ResetPoint at, std::string path_contains) {
  if (n <= 0) return;
  std::lock_guard lk(mu_);
  reset_rules_.push_back({n, at, std::move(path_contains)});
}

void HttpServer::set_delay(std::chrono::milliseconds delay, std::string path_contains) {
  std::lock_guard lk(mu_);
  delay_ = delay;
  delay_path_ = std::move(path_contains);
}

void HttpServer::hold_next(int n, std::chrono::milliseconds longest, unsigned release_after,
                           std::string path_contains) {
  if (n <= 0) return;
  std::lock_guard lk(mu_);
  hold_rules_.push_back({n, longest, release_after, std::move(path_contains)});
}

void HttpServer::outage(std::chrono::milliseconds duration) {
  std::unique_lock lk(mu_);
  const Clock::time_point until = Clock::now() + duration;
  if (outage_until_ && *outage_until_ >= until) return;
  outage_until_ = until;
  cv_.notify_all();
  wake();
  cv_.wait(lk, [&] { return listener_down_ || stopping_ || !outage_until_; });
}

bool HttpServer::in_outage() const {
  std::lock_guard lk(mu_);
  return listener_down_;
}

void HttpServer::clear_faults() {
  std::lock_guard lk(mu_);
  fail_rules_.clear();
  reset_rules_.clear();
  hold_rules_.clear();
  delay_ = std::chrono::milliseconds(0);
  delay_path_.clear();
}

ServerStats HttpServer::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

std::vector<std::string> HttpServer::authorization_headers() const {
  std::lock_guard lk(mu_);
  return authorizations_;
}

std::vector<RecordedRequest> HttpServer::requests() const {
  std::lock_guard lk(mu_);
  return recorded_;
}

} // namespace chorus::test::server
