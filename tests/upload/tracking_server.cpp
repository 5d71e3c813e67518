// The loopback tracking server (tracking_server.hpp). One file because it is
// one component seen from outside: an HTTP/1.1 layer over POSIX sockets and
// OpenSSL, then MLflow's calls, then W&B's, then the test certificates.
#include "tests/upload/tracking_server.hpp"
#include "tests/socket.hpp"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <simdjson.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <list>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <tuple>

namespace chorus::test {

namespace {

using Clock = std::chrono::steady_clock;
using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr std::size_t max_head_bytes = 64 * 1024;
constexpr std::size_t max_body_bytes = std::size_t{256} << 20; // past this: 413 and the connection closed

// ------------------------------------------------------------ text

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2])));
      i += 2;
    } else if (s[i] == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
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

constexpr std::string_view b64_alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const unsigned v = static_cast<unsigned char>(in[i]) << 16 | static_cast<unsigned char>(in[i + 1]) << 8 |
                       static_cast<unsigned char>(in[i + 2]);
    for (int k = 3; k >= 0; --k) out.push_back(b64_alphabet[(v >> (6 * k)) & 63]);
  }
  if (i < in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out.push_back(b64_alphabet[(v >> 18) & 63]);
    out.push_back(b64_alphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < in.size() ? b64_alphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view in) {
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  for (char c : in) {
    const std::size_t v = b64_alphabet.find(c);
    if (v == std::string_view::npos) return std::nullopt;
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// A JSON string literal for `s` (UTF-8 passes through; control characters are escaped).
void put_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (const char c : s) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        out += buf;
      } else {
        out.push_back(c);
      }
    }
  }
  out.push_back('"');
}

std::string json_quoted(std::string_view s) {
  std::string out;
  put_string(out, s);
  return out;
}

// A double as protobuf's JSON writes it: the shortest round-trip form, NaN
// and the infinities as strings.
void put_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "\"NaN\"";
  } else if (std::isinf(v)) {
    out += v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  } else {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
  }
}

// Characters as Python counts them (code points of UTF-8).
std::size_t code_points(std::string_view s) {
  return static_cast<std::size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xc0) != 0x80; }));
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

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

// ------------------------------------------------------------ HTTP

struct Request {
  std::string method, target, path, version;
  std::map<std::string, std::string> query;
  std::vector<std::pair<std::string, std::string>> headers; // names lower-cased
  std::string body;
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

Answer plain(int status, std::string text) { return {status, std::move(text), "text/plain; charset=utf-8", {}}; }

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

// One accepted connection, plain or TLS, with blocking I/O. The descriptor
// is closed by its owner (see Impl::serve_connection), after it is no longer
// listed where the destructor or an outage could shut it down.
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

enum class Read { ok, closed, bad, too_large, unsupported };

Read read_head(Stream& s, std::string& buf, Request& req) {
  std::size_t end = 0;
  while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (buf.size() > max_head_bytes) return Read::bad;
    if (!s.read_more(buf)) return buf.empty() ? Read::closed : Read::bad;
  }
  std::string_view head(buf.data(), end);
  while (starts_with(head, "\r\n")) head.remove_prefix(2); // stray empty lines before a request
  const std::size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol);
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return Read::bad;
  req.method = line.substr(0, sp1);
  req.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  req.version = line.substr(sp2 + 1);
  if (!starts_with(req.version, "HTTP/1.") || req.target.empty() || req.target[0] != '/') return Read::bad;
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
      if (!ends_with(lower(value), "chunked")) return Read::unsupported;
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

// What a request is, for ServerStats::by_kind.
std::string kind_of(std::string_view path) {
  if (starts_with(path, "/api/2.0/mlflow/")) return "mlflow/" + std::string(path.substr(16));
  if (starts_with(path, "/api/2.0/mlflow-artifacts/")) return "mlflow-artifacts";
  if (path == "/graphql") return "wandb/graphql";
  if (starts_with(path, "/files/") && ends_with(path, "/file_stream")) return "wandb/file_stream";
  return "other";
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

// ------------------------------------------------------------ refusals

// A request the server refuses. Validation unwinds to the protocol's entry
// point, which renders it in that protocol's error shape.
struct Refusal {
  int status = 400;
  std::string code = "INVALID_PARAMETER_VALUE";
  std::string message;
};

[[noreturn]] void refuse(int status, std::string code, std::string message) {
  throw Refusal{status, std::move(code), std::move(message)};
}
[[noreturn]] void invalid(std::string message) { refuse(400, "INVALID_PARAMETER_VALUE", std::move(message)); }

constexpr std::string_view see_docs = " See the API docs for more information about request parameters.";

[[noreturn]] void missing(std::string_view param) {
  invalid("Missing value for required parameter '" + std::string(param) + "'." + std::string(see_docs));
}
[[noreturn]] void invalid_param(std::string_view param) {
  invalid("Invalid value for parameter '" + std::string(param) + "' supplied." + std::string(see_docs));
}

// ------------------------------------------------------------ JSON reading

struct Parsers {
  simdjson::dom::parser doc;   // the request body
  simdjson::dom::parser inner; // JSON held in its strings (config, history lines, page tokens)
};

// A member, or nothing when it is absent or null.
std::optional<element> member(simdjson::dom::object o, std::string_view key) {
  element e;
  if (o.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
  return e;
}

std::optional<std::string> optional_string(simdjson::dom::object o, std::string_view key) {
  const auto e = member(o, key);
  if (!e) return std::nullopt;
  std::string_view s;
  if (e->get_string().get(s) != simdjson::SUCCESS) invalid_param(key);
  return std::string(s);
}

// A required string: absent, null or "" is missing (as protobuf's empty default reads).
std::string required_string(simdjson::dom::object o, std::string_view key, std::string_view path = {}) {
  auto s = optional_string(o, key);
  if (!s || s->empty()) missing(path.empty() ? key : path);
  return *s;
}

// The value of a simdjson result whose type was checked already.
template <class T>
T checked(simdjson::simdjson_result<T> r) {
  T v{};
  if (std::move(r).get(v) != simdjson::SUCCESS) return T{};
  return v;
}

// A 64-bit integer as protobuf's JSON reads one: a number with no fraction,
// or a string holding one.
std::optional<std::int64_t> as_int64(element e) {
  switch (e.type()) {
  case element_type::INT64: return checked(e.get_int64());
  case element_type::UINT64: {
    const std::uint64_t v = checked(e.get_uint64());
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(v);
  }
  case element_type::DOUBLE: {
    const double d = checked(e.get_double());
    if (d != std::floor(d) || d < -9.2e18 || d > 9.2e18) return std::nullopt;
    return static_cast<std::int64_t>(d);
  }
  case element_type::STRING: {
    const std::string_view s = checked(e.get_string());
    std::int64_t v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc{} || r.ptr != s.data() + s.size() || s.empty()) return std::nullopt;
    return v;
  }
  default: return std::nullopt;
  }
}

std::optional<std::int64_t> optional_int(simdjson::dom::object o, std::string_view key) {
  const auto e = member(o, key);
  if (!e) return std::nullopt;
  const auto v = as_int64(*e);
  if (!v) invalid_param(key);
  return v;
}

std::optional<std::int64_t> parse_int(std::string_view s) {
  std::int64_t v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc{} || r.ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// A metric value: a JSON number, or a string that Python's float() reads
// ("NaN", "Infinity", "-Infinity", "1.5").
std::optional<double> as_metric_value(element e) {
  switch (e.type()) {
  case element_type::INT64: return static_cast<double>(checked(e.get_int64()));
  case element_type::UINT64: return static_cast<double>(checked(e.get_uint64()));
  case element_type::DOUBLE: return checked(e.get_double());
  case element_type::STRING: {
    std::string_view s = checked(e.get_string());
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    s = trim(s);
    if (starts_with(s, "+")) s.remove_prefix(1);
    double v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc{} || r.ptr != s.data() + s.size() || s.empty()) return std::nullopt;
    return v;
  }
  default: return std::nullopt;
  }
}

// A JSON array member: absent or null reads as empty.
std::optional<simdjson::dom::array> optional_array(simdjson::dom::object o, std::string_view key) {
  const auto e = member(o, key);
  if (!e) return std::nullopt;
  simdjson::dom::array a;
  if (e->get_array().get(a) != simdjson::SUCCESS) invalid_param(key);
  return a;
}

// ------------------------------------------------------------ MLflow names

// Python's posixpath.normpath.
std::string normpath(std::string_view p) {
  if (p.empty()) return ".";
  int slashes = starts_with(p, "/") ? 1 : 0;
  if (starts_with(p, "//") && !starts_with(p, "///")) slashes = 2;
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (start <= p.size()) {
    const std::size_t slash = p.find('/', start);
    const std::string_view c = p.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    start = slash == std::string_view::npos ? p.size() + 1 : slash + 1;
    if (c.empty() || c == ".") continue;
    if (c != ".." || (slashes == 0 && parts.empty()) || (!parts.empty() && parts.back() == ".."))
      parts.push_back(c);
    else if (!parts.empty())
      parts.pop_back();
  }
  std::string out(static_cast<std::size_t>(slashes), '/');
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.push_back('/');
    out += parts[i];
  }
  return out.empty() ? "." : out;
}

// MLflow's `^[/\w.\- ]*$` (Python's `$` also matches before one final
// newline; non-ASCII counts as a word character, as most of it does in
// Python's Unicode \w).
bool good_key_chars(std::string_view k) {
  if (ends_with(k, "\n")) k.remove_suffix(1);
  return std::all_of(k.begin(), k.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x80 || std::isalnum(u) || c == '_' || c == '/' || c == '.' || c == '-' || c == ' ';
  });
}

// MLflow's _validate_{metric,param,tag}_name and the key's length limit.
// `what` is "metric"/"parameter"/"tag", `length_what` "Metric name"/"Param key"/"Tag key".
void check_key(std::string_view what, std::string_view length_what, const std::string& key) {
  const std::string head = "Invalid " + std::string(what) + " name: '" + key + "'. ";
  if (!good_key_chars(key))
    invalid(head + "Names may only contain alphanumerics, underscores (_), dashes (-), periods (.), spaces ( ), "
                   "and slashes (/).");
  const std::string norm = normpath(key);
  if (norm != key || norm == "." || starts_with(norm, "..") || starts_with(norm, "/"))
    invalid(head + "Names may be treated as files in certain cases, and must not resolve to other names when "
                   "treated as such. This name would resolve to '" + norm + "'");
  if (const std::size_t n = code_points(key); n > 250)
    invalid(std::string(length_what) + " '" + key.substr(0, 250) + "' had length " + std::to_string(n) +
            ", which exceeded length limit of 250");
}

void check_value_length(std::string_view what, const std::string& value, std::size_t limit) {
  if (const std::size_t n = code_points(value); n > limit)
    invalid(std::string(what) + " '" + value.substr(0, 250) + "' had length " + std::to_string(n) +
            ", which exceeded length limit of " + std::to_string(limit));
}

// Artifact paths may not climb out of their root.
void check_artifact_path(const std::string& path) {
  if (starts_with(path, "/") || path.find('\\') != std::string::npos || normpath(path) != path || starts_with(path, ".."))
    invalid("Invalid path");
}

bool known_status(std::string_view s) {
  return s == "RUNNING" || s == "SCHEDULED" || s == "FINISHED" || s == "FAILED" || s == "KILLED";
}

bool good_run_id(std::string_view id) {
  if (id.empty() || id.size() > 256 || !std::isalnum(static_cast<unsigned char>(id[0]))) return false;
  return std::all_of(id.begin(), id.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
}

struct MetricIn {
  std::string key;
  double value = 0;
  std::int64_t timestamp = 0, step = 0;
};
struct KeyValue {
  std::string key, value;
};

} // namespace

// ================================================================ the server

struct TrackingServer::Impl {
  struct FailRule {
    int left;
    InjectedAnswer answer;
  };
  struct ResetRule {
    int left;
    ResetPoint at;
    std::string path_contains;
  };
  struct Fault {
    std::optional<ResetPoint> reset;
    std::optional<InjectedAnswer> answer;
    std::chrono::milliseconds delay{0};
  };
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  struct MlRun {
    MlflowRun run;
    std::string user_id;
    // Points stored per key, for Options::mlflow_dedup_metrics: (timestamp, step, value bits).
    std::map<std::string, std::set<std::tuple<std::int64_t, std::int64_t, std::uint64_t>>> seen;
  };
  struct WbRun {
    WandbRun run;
    std::deque<Clock::time_point> recent; // accepted file_stream requests in the last second
  };
  using WbKey = std::tuple<std::string, std::string, std::string>; // entity, project, name

  Options opt;
  SSL_CTX* ssl_ctx = nullptr;
  std::uint16_t port = 0;
  int listen_fd = -1; // the acceptor's alone
  int wake_read = -1, wake_write = -1;
  std::thread acceptor;
  std::list<Connection> connections; // the acceptor's alone (and the destructor's after it)

  mutable std::mutex mu; // everything below
  std::condition_variable cv;
  bool stopping = false;
  std::set<int> open_fds;
  std::optional<Clock::time_point> outage_until;
  bool listener_down = false;

  std::deque<FailRule> fail_rules;
  std::deque<ResetRule> reset_rules;
  std::chrono::milliseconds delay{0};
  std::string delay_path;
  std::set<std::string> refused_keys;
  unsigned rate_limit = 0;

  ServerStats stats;
  std::vector<std::string> authorizations;
  std::vector<RecordedRequest> recorded;
  std::mt19937_64 rng{std::random_device{}()};

  std::vector<MlflowExperiment> experiments; // index = id
  std::vector<std::int64_t> experiment_times;
  std::map<std::string, MlRun> ml_runs;
  std::map<std::string, std::string> artifact_files; // "<exp>/<run>/artifacts/<path>" -> bytes
  std::map<WbKey, WbRun> wb_runs;

  explicit Impl(Options o) : opt(std::move(o)) {
    experiments.push_back({"0", "Default", "mlflow-artifacts:/0"});
    experiment_times.push_back(now_ms());
    if (opt.tls) setup_tls();
    std::string error;
    listen_fd = open_listener(opt.port, error);
    if (listen_fd < 0) {
      if (ssl_ctx != nullptr) SSL_CTX_free(ssl_ctx);
      throw std::runtime_error(error);
    }
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      ::close(listen_fd);
      if (ssl_ctx != nullptr) SSL_CTX_free(ssl_ctx);
      throw std::runtime_error("pipe2 failed");
    }
    wake_read = fds[0];
    wake_write = fds[1];
    acceptor = std::thread([this] { accept_loop(); });
  }

  ~Impl() {
    {
      std::lock_guard lk(mu);
      stopping = true;
      for (const int fd : open_fds) ::shutdown(fd, SHUT_RDWR);
    }
    cv.notify_all();
    wake();
    acceptor.join();
    {
      std::lock_guard lk(mu); // connections accepted while stopping was being set
      for (const int fd : open_fds) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& c : connections) c.thread.join();
    if (listen_fd >= 0) ::close(listen_fd);
    ::close(wake_read);
    ::close(wake_write);
    if (ssl_ctx != nullptr) SSL_CTX_free(ssl_ctx);
  }

  void setup_tls() {
    const TlsFiles& f = *opt.tls;
    ssl_ctx = SSL_CTX_new(TLS_server_method());
    bool ok = ssl_ctx != nullptr && SSL_CTX_set_min_proto_version(ssl_ctx, TLS1_2_VERSION) == 1 &&
              SSL_CTX_use_certificate_chain_file(ssl_ctx, f.cert.c_str()) == 1 &&
              SSL_CTX_use_PrivateKey_file(ssl_ctx, f.key.c_str(), SSL_FILETYPE_PEM) == 1 &&
              SSL_CTX_check_private_key(ssl_ctx) == 1;
    if (ok && !f.ca.empty()) { // the issuer goes along with the certificate
      BIO* bio = BIO_new_file(f.ca.c_str(), "r");
      X509* ca = bio != nullptr ? PEM_read_bio_X509(bio, nullptr, nullptr, nullptr) : nullptr;
      ok = ca != nullptr && SSL_CTX_add1_chain_cert(ssl_ctx, ca) == 1;
      X509_free(ca);
      BIO_free(bio);
    }
    if (!ok) {
      const unsigned long e = ERR_get_error();
      char buf[256] = "unknown error";
      if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
      ERR_clear_error();
      if (ssl_ctx != nullptr) SSL_CTX_free(ssl_ctx);
      ssl_ctx = nullptr;
      throw std::runtime_error("TLS files " + f.cert + ", " + f.key + ": " + buf);
    }
  }

  void wake() const {
    const char c = 1;
    [[maybe_unused]] const auto n = ::write(wake_write, &c, 1);
  }

  // ---------------------------------------------------------- threads

  void accept_loop() {
    block_sigpipe();
    for (;;) {
      {
        std::unique_lock lk(mu);
        if (stopping) return;
        if (outage_until) {
          go_down(lk);
          if (stopping) return;
          continue;
        }
      }
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_read, POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) continue;
      if ((fds[1].revents & POLLIN) != 0) {
        char drain[64];
        while (::read(wake_read, drain, sizeof drain) > 0) {
        }
      }
      if ((fds[0].revents & POLLIN) != 0) {
        const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) start_connection(fd);
      }
      connections.remove_if([](Connection& c) {
        if (!c.done.load()) return false;
        c.thread.join();
        return true;
      });
    }
  }

  // The outage: the listener closed (connections refused), open ones shut
  // down, until the time is up; then the same port again.
  void go_down(std::unique_lock<std::mutex>& lk) {
    ::close(listen_fd);
    listen_fd = -1;
    for (const int fd : open_fds) ::shutdown(fd, SHUT_RDWR);
    listener_down = true;
    cv.notify_all();
    while (!stopping && Clock::now() < *outage_until) cv.wait_until(lk, *outage_until);
    while (!stopping) {
      std::string error;
      listen_fd = open_listener(port, error);
      if (listen_fd >= 0) break;
      cv.wait_for(lk, std::chrono::milliseconds(10)); // the port is briefly busy: try again
    }
    outage_until.reset();
    listener_down = false;
    cv.notify_all();
  }

  void start_connection(int fd) {
    {
      std::lock_guard lk(mu);
      if (stopping) {
        ::close(fd);
        return;
      }
      open_fds.insert(fd);
      ++stats.connections;
    }
    Connection& c = connections.emplace_back();
    c.thread = std::thread([this, fd, &c] {
      serve_connection(fd);
      c.done.store(true);
    });
  }

  void serve_connection(int fd) {
    block_sigpipe();
    SSL* ssl = ssl_ctx != nullptr ? SSL_new(ssl_ctx) : nullptr;
    Stream stream(fd, ssl);
    if ((ssl_ctx == nullptr || ssl != nullptr) && stream.handshake()) serve(stream);
    {
      std::lock_guard lk(mu);
      open_fds.erase(fd);
    }
    stream.close();
  }

  // Requests on one connection until it closes, is cut, or asks to close.
  void serve(Stream& s) {
    Parsers parsers;
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
      if (fault.reset == ResetPoint::after_headers) return s.cut();
      const bool has_body = req.chunked || req.content_length.value_or(0) > 0;
      if (req.expect_continue && has_body && !s.write_all("HTTP/1.1 100 Continue\r\n\r\n")) return;
      switch (read_body(s, buf, req)) {
      case Read::ok: break;
      case Read::too_large: s.write_all(render(plain(413, "request body too large"), false)); return;
      case Read::closed: return;
      default: s.write_all(render(plain(400, "malformed chunked body"), false)); return;
      }
      if (opt.record_requests) {
        std::lock_guard lk(mu);
        recorded.push_back({req.method, req.target, req.headers, req.body});
      }
      if (fault.reset == ResetPoint::after_body) return s.cut();
      if (fault.delay.count() > 0) {
        std::unique_lock lk(mu);
        if (cv.wait_for(lk, fault.delay, [&] { return stopping; })) return;
      }
      const Answer answer = fault.answer ? injected(*fault.answer) : dispatch(req, parsers);
      if (fault.reset == ResetPoint::after_handling) return s.cut();
      if (!s.write_all(render(answer, req.keep_alive)) || !req.keep_alive) return;
    }
  }

  // Counts the request and takes the faults it meets.
  Fault take_fault(const Request& req) {
    std::lock_guard lk(mu);
    ++stats.requests;
    ++stats.by_kind[kind_of(req.path)];
    if (const std::string* auth = req.header("authorization")) authorizations.push_back(*auth);
    Fault f;
    const auto matches = [&](const std::string& part) { return req.target.find(part) != std::string::npos; };
    for (auto it = reset_rules.begin(); it != reset_rules.end(); ++it) {
      if (!matches(it->path_contains)) continue;
      f.reset = it->at;
      if (--it->left <= 0) reset_rules.erase(it);
      break;
    }
    if (!f.reset) {
      for (auto it = fail_rules.begin(); it != fail_rules.end(); ++it) {
        if (!matches(it->answer.path_contains)) continue;
        f.answer = it->answer;
        if (--it->left <= 0) fail_rules.erase(it);
        break;
      }
    }
    if (delay.count() > 0 && matches(delay_path)) f.delay = delay;
    return f;
  }

  static Answer injected(const InjectedAnswer& a) {
    Answer out{a.status, a.body, "application/json", {}};
    if (out.body.empty())
      out.body = R"({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "injected )" + std::to_string(a.status) + "\"}";
    if (!a.retry_after.empty()) out.headers.push_back("Retry-After: " + a.retry_after);
    return out;
  }

  Answer dispatch(const Request& req, Parsers& p) {
    std::lock_guard lk(mu);
    const std::string_view path = req.path;
    if (starts_with(path, "/api/2.0/mlflow/")) return mlflow(req, p, path.substr(16));
    if (starts_with(path, "/api/2.0/mlflow-artifacts/artifacts/")) return artifact(req, path.substr(36));
    if (path == "/graphql") return graphql(req, p);
    if (starts_with(path, "/files/") && ends_with(path, "/file_stream")) return file_stream(req, p);
    return plain(404, "Not Found");
  }

  // ---------------------------------------------------------- MLflow

  static Answer mlflow_error(const Refusal& r) {
    std::string body = R"({"error_code": )";
    put_string(body, r.code);
    body += R"(, "message": )";
    put_string(body, r.message);
    body += "}";
    return {r.status, std::move(body), "application/json", {}};
  }

  Answer mlflow(const Request& req, Parsers& p, std::string_view call) {
    using Get = Answer (Impl::*)(const std::map<std::string, std::string>&);
    using Post = Answer (Impl::*)(simdjson::dom::object, Parsers&);
    struct Route {
      std::string_view call;
      Get get;
      Post post;
    };
    static const Route routes[] = {
        {"experiments/get-by-name", &Impl::experiment_by_name, nullptr},
        {"experiments/get", &Impl::experiment_by_id, nullptr},
        {"experiments/create", nullptr, &Impl::create_experiment},
        {"runs/create", nullptr, &Impl::create_run},
        {"runs/update", nullptr, &Impl::update_run},
        {"runs/get", &Impl::get_run, nullptr},
        {"runs/search", nullptr, &Impl::search_runs},
        {"runs/log-batch", nullptr, &Impl::log_batch},
        {"runs/log-metric", nullptr, &Impl::log_metric},
        {"runs/log-parameter", nullptr, &Impl::log_parameter},
        {"runs/set-tag", nullptr, &Impl::set_tag},
        {"metrics/get-history", &Impl::metric_history_call, nullptr},
        {"artifacts/list", &Impl::list_artifacts, nullptr},
    };
    const auto route =
        std::find_if(std::begin(routes), std::end(routes), [&](const Route& r) { return r.call == call; });
    if (route == std::end(routes)) return plain(404, "Not Found");
    try {
      if (route->get != nullptr) {
        if (req.method != "GET") return plain(405, "Method Not Allowed");
        return (this->*route->get)(req.query);
      }
      if (req.method != "POST") return plain(405, "Method Not Allowed");
      const std::string* type = req.header("content-type");
      if (type == nullptr) invalid("Bad Request. Content-Type header is missing.");
      if (lower(trim(std::string_view(*type).substr(0, type->find(';')))) != "application/json")
        invalid("Bad Request. Content-Type must be one of ['application/json'].");
      // As Flask's get_json(silent=True): a body that is no JSON object reads as {}.
      simdjson::dom::object o;
      if (p.doc.parse(req.body).get_object().get(o) != simdjson::SUCCESS)
        if (p.doc.parse("{}", 2).get_object().get(o) != simdjson::SUCCESS) return plain(500, "simdjson");
      return (this->*route->post)(o, p);
    } catch (const Refusal& r) {
      return mlflow_error(r);
    }
  }

  static Answer json(std::string body) { return {200, std::move(body), "application/json", {}}; }

  void put_experiment(std::string& o, const MlflowExperiment& e) const {
    const std::string t = std::to_string(experiment_times[std::stoul(e.id)]);
    o += R"({"experiment_id": )" + json_quoted(e.id) + R"(, "name": )" + json_quoted(e.name) + R"(, "artifact_location": )" +
         json_quoted(e.artifact_location) + R"(, "lifecycle_stage": "active", "last_update_time": )" + t +
         R"(, "creation_time": )" + t + "}";
  }

  Answer experiment_by_name(const std::map<std::string, std::string>& q) {
    const auto it = q.find("experiment_name");
    if (it == q.end() || it->second.empty()) missing("experiment_name");
    for (const auto& e : experiments) {
      if (e.name != it->second) continue;
      std::string o = R"({"experiment": )";
      put_experiment(o, e);
      return json(o + "}");
    }
    refuse(404, "RESOURCE_DOES_NOT_EXIST", "Could not find experiment with name '" + it->second + "'");
  }

  const MlflowExperiment& find_experiment(const std::string& id) const {
    std::size_t index = 0;
    const auto r = std::from_chars(id.data(), id.data() + id.size(), index);
    if (r.ec != std::errc{} || r.ptr != id.data() + id.size() || index >= experiments.size())
      refuse(404, "RESOURCE_DOES_NOT_EXIST", "No Experiment with id=" + id + " exists");
    return experiments[index];
  }

  Answer experiment_by_id(const std::map<std::string, std::string>& q) {
    const auto it = q.find("experiment_id");
    if (it == q.end() || it->second.empty()) missing("experiment_id");
    std::string o = R"({"experiment": )";
    put_experiment(o, find_experiment(it->second));
    return json(o + "}");
  }

  Answer create_experiment(simdjson::dom::object o, Parsers&) {
    const std::string name = required_string(o, "name");
    const auto location = optional_string(o, "artifact_location");
    (void)optional_array(o, "tags");
    if (code_points(name) > 500) invalid("Experiment name exceeds the maximum length of 500 characters");
    for (const auto& e : experiments)
      if (e.name == name) refuse(400, "RESOURCE_ALREADY_EXISTS", "Experiment '" + name + "' already exists.");
    const std::string id = std::to_string(experiments.size());
    experiments.push_back({id, name, location && !location->empty() ? *location : "mlflow-artifacts:/" + id});
    experiment_times.push_back(now_ms());
    return json(R"({"experiment_id": )" + json_quoted(id) + "}");
  }

  MlRun& find_run(const std::string& id) {
    if (!good_run_id(id)) invalid("Invalid run ID: '" + id + "'");
    const auto it = ml_runs.find(id);
    if (it == ml_runs.end()) refuse(404, "RESOURCE_DOES_NOT_EXIST", "Run '" + id + "' not found");
    return it->second;
  }

  static void put_run_info(std::string& o, const MlRun& r) {
    const MlflowRun& run = r.run;
    o += R"({"run_id": )" + json_quoted(run.id) + R"(, "run_uuid": )" + json_quoted(run.id) + R"(, "run_name": )" +
         json_quoted(run.name) + R"(, "experiment_id": )" + json_quoted(run.experiment_id) + R"(, "user_id": )" +
         json_quoted(r.user_id) + R"(, "status": )" + json_quoted(run.status) +
         R"(, "start_time": )" + std::to_string(run.start_time);
    if (run.end_time) o += R"(, "end_time": )" + std::to_string(*run.end_time);
    o += R"(, "artifact_uri": )" + json_quoted(run.artifact_uri) + R"(, "lifecycle_stage": "active"})";
  }

  static void put_metric(std::string& o, const std::string& key, const MetricPoint& m) {
    o += R"({"key": )" + json_quoted(key) + R"(, "value": )";
    put_double(o, m.value);
    o += R"(, "timestamp": )" + std::to_string(m.timestamp) + R"(, "step": )" + std::to_string(m.step) + "}";
  }

  // A key-value list, left out when empty (as protobuf's JSON leaves out empty repeated fields).
  static void put_pairs(std::string& o, std::string_view name, const std::map<std::string, std::string>& kv,
                        bool& first) {
    if (kv.empty()) return;
    o += first ? "" : ", ";
    first = false;
    o += json_quoted(name) + ": [";
    bool f = true;
    for (const auto& [k, v] : kv) {
      o += f ? "" : ", ";
      f = false;
      o += R"({"key": )" + json_quoted(k) + R"(, "value": )" + json_quoted(v) + "}";
    }
    o += "]";
  }

  // The latest point of a key as the stores pick it: the greatest (step, timestamp, value).
  static const MetricPoint& latest(const std::vector<MetricPoint>& points) {
    const MetricPoint* best = &points.front();
    for (const MetricPoint& m : points) {
      if (m.step != best->step ? m.step > best->step
                               : m.timestamp != best->timestamp ? m.timestamp > best->timestamp
                                                                : m.value > best->value)
        best = &m;
    }
    return *best;
  }

  static void put_run(std::string& o, const MlRun& r) {
    o += R"({"info": )";
    put_run_info(o, r);
    o += R"(, "data": {)";
    bool first = true;
    if (!r.run.metrics.empty()) {
      first = false;
      o += R"("metrics": [)";
      bool f = true;
      for (const auto& [key, points] : r.run.metrics) {
        o += f ? "" : ", ";
        f = false;
        put_metric(o, key, latest(points));
      }
      o += "]";
    }
    put_pairs(o, "params", r.run.params, first);
    put_pairs(o, "tags", r.run.tags, first);
    o += R"(}, "inputs": {}})";
  }

  std::string new_run_id() {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                  static_cast<unsigned long long>(rng()));
    return buf;
  }

  std::vector<KeyValue> read_pairs(simdjson::dom::object o, std::string_view list) {
    std::vector<KeyValue> out;
    const auto a = optional_array(o, list);
    if (!a) return out;
    std::size_t i = 0;
    for (const element e : *a) {
      const std::string path = std::string(list) + "[" + std::to_string(i++) + "]";
      simdjson::dom::object kv;
      if (e.get_object().get(kv) != simdjson::SUCCESS) invalid_param(list);
      out.push_back({required_string(kv, "key", path + ".key"), optional_string(kv, "value").value_or("")});
    }
    return out;
  }

  Answer create_run(simdjson::dom::object o, Parsers&) {
    const std::string experiment_id = optional_string(o, "experiment_id").value_or("0");
    const auto run_name = optional_string(o, "run_name");
    const std::int64_t start_time = optional_int(o, "start_time").value_or(0);
    const std::string user_id = optional_string(o, "user_id").value_or("");
    const std::vector<KeyValue> tags = read_pairs(o, "tags");
    for (const auto& t : tags) {
      check_key("tag", "Tag key", t.key);
      check_value_length("Tag value", t.value, 5000);
    }
    const MlflowExperiment& exp = find_experiment(experiment_id.empty() ? "0" : experiment_id);
    MlRun r;
    r.run.id = new_run_id();
    r.run.experiment_id = exp.id;
    r.run.status = "RUNNING";
    r.run.start_time = start_time;
    r.run.artifact_uri = exp.artifact_location + "/" + r.run.id + "/artifacts";
    r.user_id = user_id;
    for (const auto& t : tags) r.run.tags[t.key] = t.value;
    if (run_name && !run_name->empty())
      r.run.name = *run_name;
    else if (const auto it = r.run.tags.find("mlflow.runName"); it != r.run.tags.end())
      r.run.name = it->second;
    else
      r.run.name = "run-" + std::to_string(ml_runs.size() + 1);
    r.run.tags["mlflow.runName"] = r.run.name;
    std::string out = R"({"run": )";
    put_run(out, r);
    ml_runs.emplace(r.run.id, std::move(r));
    return json(out + "}");
  }

  Answer update_run(simdjson::dom::object o, Parsers&) {
    const std::string run_id = optional_string(o, "run_id").value_or(optional_string(o, "run_uuid").value_or(""));
    if (run_id.empty()) missing("run_id");
    const auto status = optional_string(o, "status");
    const auto end_time = optional_int(o, "end_time");
    const auto run_name = optional_string(o, "run_name");
    if (status && !known_status(*status)) invalid_param("status");
    MlRun& r = find_run(run_id);
    if (status) r.run.status = *status;
    if (end_time) r.run.end_time = *end_time;
    if (run_name && !run_name->empty()) {
      r.run.name = *run_name;
      r.run.tags["mlflow.runName"] = *run_name;
    }
    std::string out = R"({"run_info": )";
    put_run_info(out, r);
    return json(out + "}");
  }

  Answer get_run(const std::map<std::string, std::string>& q) {
    auto it = q.find("run_id");
    if (it == q.end() || it->second.empty()) it = q.find("run_uuid");
    if (it == q.end() || it->second.empty()) missing("run_id");
    std::string out = R"({"run": )";
    put_run(out, find_run(it->second));
    return json(out + "}");
  }

  // runs/search as MLflow 2.10 answers it, for the filters its clients send:
  // clauses `tags.<key> = '<value>'` (the key bare, "quoted" or `quoted`)
  // and `attributes.status = '<status>'`, joined by AND. Newest run first;
  // {"runs": [...], "next_page_token"?}, {} when nothing matches.
  Answer search_runs(simdjson::dom::object o, Parsers&) {
    std::set<std::string> experiment_ids;
    if (const auto ids = member(o, "experiment_ids")) {
      simdjson::dom::array a;
      if (ids->get_array().get(a) != simdjson::SUCCESS) invalid_param("experiment_ids");
      for (auto e : a) experiment_ids.insert(std::string(checked(e.get_string())));
    }
    const std::int64_t max_results = optional_int(o, "max_results").value_or(1000);
    if (max_results <= 0 || max_results > 50000)
      invalid("Invalid value " + std::to_string(max_results) +
              " for parameter 'max_results' supplied. It must be at most 50000, but got value " +
              std::to_string(max_results));
    const std::string page_token = optional_string(o, "page_token").value_or("");
    std::size_t offset = 0;
    if (!page_token.empty()) {
      auto [end, ec] = std::from_chars(page_token.data(), page_token.data() + page_token.size(), offset);
      if (ec != std::errc() || end != page_token.data() + page_token.size()) invalid("Invalid page token, could not base64-decode");
    }
    const auto clauses = parse_filter(optional_string(o, "filter").value_or(""));
    std::vector<const MlRun*> found;
    for (const auto& [id, r] : ml_runs) {
      if (experiment_ids.count(r.run.experiment_id) == 0) continue;
      const bool match = std::all_of(clauses.begin(), clauses.end(), [&](const auto& c) {
        if (c.tag) {
          const auto it = r.run.tags.find(c.key);
          return it != r.run.tags.end() && it->second == c.value;
        }
        return r.run.status == c.value;
      });
      if (match) found.push_back(&r);
    }
    std::sort(found.begin(), found.end(), [](const MlRun* a, const MlRun* b) {
      return a->run.start_time != b->run.start_time ? a->run.start_time > b->run.start_time : a->run.id < b->run.id;
    });
    std::string out = "{";
    const std::size_t end = std::min(found.size(), offset + static_cast<std::size_t>(max_results));
    if (offset < end) {
      out += R"("runs": [)";
      for (std::size_t i = offset; i < end; ++i) {
        if (i > offset) out += ", ";
        put_run(out, *found[i]);
      }
      out += "]";
      if (end < found.size()) out += R"(, "next_page_token": )" + json_quoted(std::to_string(end));
    }
    return json(out + "}");
  }

  struct Clause {
    bool tag = true; // else attributes.status
    std::string key, value;
  };

  static std::vector<Clause> parse_filter(std::string_view f) {
    std::vector<Clause> out;
    const auto bad = [&] { invalid("Invalid filter '" + std::string(f) + "'"); };
    std::string_view rest = trim(f);
    while (!rest.empty()) {
      Clause c;
      std::string_view ident;
      if (starts_with(rest, "tags.")) {
        rest.remove_prefix(5);
      } else if (starts_with(rest, "attributes.status") || starts_with(rest, "attribute.status")) {
        c.tag = false;
        rest.remove_prefix(rest.find('.') + 7);
      } else {
        bad();
      }
      if (c.tag) {
        if (!rest.empty() && (rest.front() == '"' || rest.front() == '`')) {
          const std::size_t close = rest.find(rest.front(), 1);
          if (close == std::string_view::npos) bad();
          c.key = std::string(rest.substr(1, close - 1));
          rest.remove_prefix(close + 1);
        } else {
          std::size_t n = 0;
          while (n < rest.size() && (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_' || rest[n] == '.')) ++n;
          if (n == 0) bad();
          c.key = std::string(rest.substr(0, n));
          rest.remove_prefix(n);
        }
      }
      rest = trim(rest);
      if (!starts_with(rest, "=") || starts_with(rest, "==")) bad();
      rest = trim(rest.substr(1));
      if (rest.empty() || (rest.front() != '\'' && rest.front() != '"')) bad();
      const std::size_t close = rest.find(rest.front(), 1);
      if (close == std::string_view::npos) bad();
      c.value = std::string(rest.substr(1, close - 1));
      rest = trim(rest.substr(close + 1));
      out.push_back(std::move(c));
      if (rest.empty()) break;
      if (rest.size() < 4 || lower(rest.substr(0, 4)) != "and ") bad();
      rest = trim(rest.substr(4));
    }
    return out;
  }

  MetricIn read_metric(simdjson::dom::object m, const std::string& path) {
    MetricIn out;
    out.key = required_string(m, "key", path + ".key");
    const auto value = member(m, "value");
    if (!value || (value->is_string() && checked(value->get_string()).empty())) missing(path + ".value");
    const auto ts = member(m, "timestamp");
    if (!ts || (ts->is_string() && checked(ts->get_string()).empty())) missing(path + ".timestamp");
    const auto v = as_metric_value(*value);
    if (!v)
      invalid("Got invalid value " + std::string(simdjson::minify(*value)) + " for metric '" + out.key +
              "'. Please specify value as a valid double (64-bit floating point)");
    out.value = *v;
    const auto t = as_int64(*ts);
    if (!t || *t < 0)
      invalid("Got invalid timestamp " + std::string(simdjson::minify(*ts)) + " for metric '" + out.key +
              "'. Timestamp must be a nonnegative long (64-bit integer) ");
    out.timestamp = *t;
    if (const auto step = member(m, "step")) {
      const auto s = as_int64(*step);
      if (!s)
        invalid("Got invalid step " + std::string(simdjson::minify(*step)) + " for metric '" + out.key +
                "'. Step must be a valid long (64-bit integer).");
      out.step = *s;
    }
    return out;
  }

  // The stores' log_batch: every check over the whole batch first, then all of it applied.
  void log(const std::string& run_id, const std::vector<MetricIn>& metrics, const std::vector<KeyValue>& params,
           const std::vector<KeyValue>& tags) {
    if (!good_run_id(run_id)) invalid("Invalid run ID: '" + run_id + "'");
    for (const auto& m : metrics) check_key("metric", "Metric name", m.key);
    for (const auto& p : params) {
      check_key("parameter", "Param key", p.key);
      check_value_length("Param value", p.value, 6000);
    }
    for (const auto& t : tags) {
      check_key("tag", "Tag key", t.key);
      check_value_length("Tag value", t.value, 5000);
    }
    const auto refused = [&](const std::string& key) {
      if (refused_keys.count(key) != 0) invalid("Invalid key '" + key + "': refused by this server");
    };
    for (const auto& m : metrics) refused(m.key);
    for (const auto& p : params) refused(p.key);
    for (const auto& t : tags) refused(t.key);
    const auto limit = [](std::string_view what, std::size_t limit, std::size_t n) {
      if (n > limit)
        invalid("A batch logging request can contain at most " + std::to_string(limit) + " " + std::string(what) +
                ". Got " + std::to_string(n) + " " + std::string(what) + ". Please split up " + std::string(what) +
                " across multiple requests and try again.");
    };
    limit("metrics", 1000, metrics.size());
    limit("params", 100, params.size());
    limit("tags", 100, tags.size());
    limit("metrics, params, and tags", 1000, metrics.size() + params.size() + tags.size());
    std::set<std::string> param_keys;
    for (const auto& p : params)
      if (!param_keys.insert(p.key).second)
        invalid("Duplicate parameter keys have been submitted: ['" + p.key +
                "']. Please ensure the request contains only one param value per param key.");
    MlRun& r = find_run(run_id);
    for (const auto& p : params) {
      const auto it = r.run.params.find(p.key);
      if (it != r.run.params.end() && it->second != p.value)
        invalid("Changing param values is not allowed. Param with key='" + p.key + "' was already logged with value='" +
                it->second + "' for run ID='" + run_id + "'. Attempted logging new value '" + p.value + "'.");
    }
    for (const auto& p : params) r.run.params[p.key] = p.value;
    for (const auto& m : metrics) {
      const double max = std::numeric_limits<double>::max();
      const double v = std::isinf(m.value) ? std::copysign(max, m.value) : m.value;
      if (opt.mlflow_dedup_metrics) {
        const double canonical = std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : v;
        std::uint64_t bits = 0;
        std::memcpy(&bits, &canonical, sizeof bits);
        if (!r.seen[m.key].emplace(m.timestamp, m.step, bits).second) continue;
      }
      r.run.metrics[m.key].push_back({v, m.timestamp, m.step});
    }
    for (const auto& t : tags) {
      r.run.tags[t.key] = t.value;
      if (t.key == "mlflow.runName") r.run.name = t.value;
    }
  }

  Answer log_batch(simdjson::dom::object o, Parsers&) {
    const std::string run_id = required_string(o, "run_id");
    std::vector<MetricIn> metrics;
    if (const auto a = optional_array(o, "metrics")) {
      std::size_t i = 0;
      for (const element e : *a) {
        simdjson::dom::object m;
        if (e.get_object().get(m) != simdjson::SUCCESS) invalid_param("metrics");
        metrics.push_back(read_metric(m, "metrics[" + std::to_string(i++) + "]"));
      }
    }
    log(run_id, metrics, read_pairs(o, "params"), read_pairs(o, "tags"));
    return json("{}");
  }

  Answer log_metric(simdjson::dom::object o, Parsers&) {
    const std::string run_id = required_string(o, "run_id");
    log(run_id, {read_metric(o, "metric")}, {}, {});
    return json("{}");
  }

  Answer log_parameter(simdjson::dom::object o, Parsers&) {
    const std::string run_id = required_string(o, "run_id");
    log(run_id, {}, {{required_string(o, "key"), optional_string(o, "value").value_or("")}}, {});
    return json("{}");
  }

  Answer set_tag(simdjson::dom::object o, Parsers&) {
    const std::string run_id = required_string(o, "run_id");
    log(run_id, {}, {}, {{required_string(o, "key"), optional_string(o, "value").value_or("")}});
    return json("{}");
  }

  // page_token: base64 of {"offset": N}, as MLflow's search tokens are.
  Answer metric_history_call(const std::map<std::string, std::string>& q) {
    auto it = q.find("run_id");
    if (it == q.end() || it->second.empty()) it = q.find("run_uuid");
    if (it == q.end() || it->second.empty()) missing("run_id");
    const auto key = q.find("metric_key");
    if (key == q.end() || key->second.empty()) missing("metric_key");
    std::size_t max_results = 0; // 0: all
    if (const auto m = q.find("max_results"); m != q.end() && !m->second.empty()) {
      const auto v = parse_int(m->second);
      if (!v || *v < 0) invalid_param("max_results");
      max_results = static_cast<std::size_t>(*v);
    }
    std::size_t offset = 0;
    if (const auto t = q.find("page_token"); t != q.end() && !t->second.empty()) {
      const auto decoded = base64_decode(t->second);
      std::size_t n = 0;
      const bool ok = decoded && std::sscanf(decoded->c_str(), "{\"offset\": %zu}", &n) == 1 &&
                      *decoded == "{\"offset\": " + std::to_string(n) + "}";
      if (!ok) invalid("Invalid page token, could not base64-decode");
      offset = n;
    }
    const MlRun& r = find_run(it->second);
    const auto points_it = r.run.metrics.find(key->second);
    static const std::vector<MetricPoint> none;
    const std::vector<MetricPoint>& points = points_it == r.run.metrics.end() ? none : points_it->second;
    const std::size_t begin = std::min(offset, points.size());
    const std::size_t end = max_results == 0 ? points.size() : std::min(points.size(), begin + max_results);
    std::string out = "{";
    if (end > begin) {
      out += R"("metrics": [)";
      for (std::size_t i = begin; i < end; ++i) {
        if (i > begin) out += ", ";
        put_metric(out, key->second, points[i]);
      }
      out += "]";
    }
    if (end < points.size()) {
      out += end > begin ? ", " : "";
      out += R"("next_page_token": )" + json_quoted(base64_encode("{\"offset\": " + std::to_string(end) + "}"));
    }
    return json(out + "}");
  }

  static std::string artifact_root(const MlflowRun& run) { return run.experiment_id + "/" + run.id + "/artifacts"; }

  Answer list_artifacts(const std::map<std::string, std::string>& q) {
    auto it = q.find("run_id");
    if (it == q.end() || it->second.empty()) it = q.find("run_uuid");
    if (it == q.end() || it->second.empty()) missing("run_id");
    const auto p = q.find("path");
    const std::string path = p == q.end() ? "" : p->second;
    if (!path.empty()) check_artifact_path(path);
    const MlRun& r = find_run(it->second);
    const std::string base = artifact_root(r.run) + "/" + (path.empty() ? "" : path + "/");
    std::map<std::string, std::optional<std::size_t>> entries; // child -> size (nullopt: a directory)
    for (auto f = artifact_files.lower_bound(base); f != artifact_files.end() && starts_with(f->first, base); ++f) {
      const std::string_view rest = std::string_view(f->first).substr(base.size());
      const std::size_t slash = rest.find('/');
      if (slash == std::string_view::npos)
        entries[std::string(rest)] = f->second.size();
      else
        entries.emplace(std::string(rest.substr(0, slash)), std::nullopt);
    }
    std::string out = R"({"root_uri": )" + json_quoted(r.run.artifact_uri);
    if (!entries.empty()) {
      out += R"(, "files": [)";
      bool first = true;
      for (const auto& [name, size] : entries) {
        out += first ? "" : ", ";
        first = false;
        out += R"({"path": )" + json_quoted(path.empty() ? name : path + "/" + name);
        out += size ? R"(, "is_dir": false, "file_size": )" + std::to_string(*size) + "}" : R"(, "is_dir": true})";
      }
      out += "]";
    }
    return json(out + "}");
  }

  Answer artifact(const Request& req, std::string_view raw) {
    try {
      const std::string path = percent_decode(raw, false);
      check_artifact_path(path);
      if (req.method == "PUT") {
        artifact_files[path] = req.body;
        return json("{}");
      }
      if (req.method != "GET") return plain(405, "Method Not Allowed");
      const auto it = artifact_files.find(path);
      if (it == artifact_files.end()) refuse(404, "RESOURCE_DOES_NOT_EXIST", "No such file: '" + path + "'");
      return {200, it->second, "application/octet-stream", {}};
    } catch (const Refusal& r) {
      return mlflow_error(r);
    }
  }

  // ---------------------------------------------------------- W&B

  bool authorized(const Request& req) const {
    const std::string* h = req.header("authorization");
    if (h == nullptr || lower(std::string_view(*h).substr(0, 6)) != "basic ") return false;
    const auto decoded = base64_decode(trim(std::string_view(*h).substr(6)));
    return decoded && *decoded == "api:" + opt.wandb_api_key;
  }

  static Answer graphql_error(int status, std::string_view message) {
    return {status, R"({"errors": [{"message": )" + json_quoted(message) + "}]}", "application/json", {}};
  }

  WbRun* find_wandb(const std::string& entity, const std::string& project, const std::string& name) {
    const auto it = wb_runs.find({entity, project, name});
    return it == wb_runs.end() ? nullptr : &it->second;
  }

  // A GraphQL variable of string type: absent or null reads as unset.
  static std::optional<std::string> variable(simdjson::dom::object vars, std::string_view name) {
    const auto e = member(vars, name);
    if (!e) return std::nullopt;
    std::string_view s;
    if (e->get_string().get(s) != simdjson::SUCCESS)
      refuse(200, "", "Variable \"$" + std::string(name) + "\" got invalid value; expected type String");
    return std::string(s);
  }

  // config must be a JSON object string of {"key": {"value": v}}; summaryMetrics a JSON object string.
  static void check_json_object(Parsers& p, std::string_view name, const std::string& text, bool config) {
    simdjson::dom::object o;
    if (p.inner.parse(text).get_object().get(o) != simdjson::SUCCESS)
      refuse(200, "", "Variable \"$" + std::string(name) + "\": not a JSON object string");
    if (!config) return;
    for (const auto field : o) {
      simdjson::dom::object wrapped;
      element v;
      if (field.value.get_object().get(wrapped) != simdjson::SUCCESS || wrapped.at_key("value").get(v) != simdjson::SUCCESS)
        refuse(200, "", "config key '" + std::string(field.key) + "' is not shaped {\"value\": ...}");
    }
  }

  std::string new_wandb_name() {
    static constexpr std::string_view chars = "abcdefghijklmnopqrstuvwxyz0123456789";
    std::string s;
    for (int i = 0; i < 8; ++i) s.push_back(chars[rng() % chars.size()]);
    return s;
  }

  Answer graphql(const Request& req, Parsers& p) {
    if (req.method != "POST") return plain(405, "Method Not Allowed");
    if (req.body.size() > opt.wandb_max_body) return graphql_error(413, "request body too large");
    if (!authorized(req)) return graphql_error(401, "user is not logged in");
    simdjson::dom::object root;
    std::string_view query;
    if (p.doc.parse(req.body).get_object().get(root) != simdjson::SUCCESS ||
        root.at_key("query").get_string().get(query) != simdjson::SUCCESS)
      return graphql_error(400, "Must provide query string.");
    if (query.find("upsertBucket") == std::string_view::npos)
      return graphql_error(200, "this server answers only the upsertBucket mutation");
    simdjson::dom::object vars;
    if (const auto v = member(root, "variables"); v && v->get_object().get(vars) != simdjson::SUCCESS)
      return graphql_error(200, "variables must be an object");
    if (!member(root, "variables") && p.inner.parse("{}", 2).get_object().get(vars) != simdjson::SUCCESS)
      return plain(500, "simdjson");
    try {
      return upsert(vars, p);
    } catch (const Refusal& r) {
      return graphql_error(r.status, r.message);
    }
  }

  Answer upsert(simdjson::dom::object vars, Parsers& p) {
    // Every variable is read (and checked) before anything changes.
    const auto id = variable(vars, "id");
    const auto name_v = variable(vars, "name");
    const auto project_v = variable(vars, "project");
    const auto entity_v = variable(vars, "entity");
    const auto group = variable(vars, "groupName");
    const auto display = variable(vars, "displayName");
    const auto notes = variable(vars, "notes");
    const auto config = variable(vars, "config");
    const auto job_type = variable(vars, "jobType");
    const auto state = variable(vars, "state");
    const auto host = variable(vars, "host");
    const auto summary = variable(vars, "summaryMetrics");
    std::optional<std::vector<std::string>> tags;
    if (const auto t = member(vars, "tags")) {
      simdjson::dom::array a;
      if (t->get_array().get(a) != simdjson::SUCCESS)
        refuse(200, "", "Variable \"$tags\" got invalid value; expected type [String]");
      tags.emplace();
      for (const element e : a) {
        std::string_view s;
        if (e.get_string().get(s) != simdjson::SUCCESS)
          refuse(200, "", "Variable \"$tags\" got invalid value; expected type [String]");
        tags->emplace_back(s);
      }
    }
    // `vars` may live in the inner parser (no variables sent), which these checks reuse: they come last.
    const std::string config_text = config.value_or(""), summary_text = summary.value_or("");
    if (config) check_json_object(p, "config", config_text, true);
    if (summary) check_json_object(p, "summaryMetrics", summary_text, false);

    WbRun* run = nullptr;
    if (id)
      for (auto& [k, r] : wb_runs)
        if (r.run.id == *id) run = &r;
    if (run == nullptr) {
      const std::string entity = entity_v && !entity_v->empty() ? *entity_v : opt.wandb_entity;
      const std::string project = project_v && !project_v->empty() ? *project_v : "uncategorized";
      const std::string name = name_v && !name_v->empty() ? *name_v : new_wandb_name();
      run = find_wandb(entity, project, name);
      if (run == nullptr) {
        run = &wb_runs[{entity, project, name}];
        run->run.entity = entity;
        run->run.project = project;
        run->run.name = name;
        run->run.display_name = name;
        run->run.state = "running";
        run->run.id = base64_encode("Run:v1:" + name + ":" + project + ":" + entity);
      }
    }
    WandbRun& r = run->run;
    const bool created = r.upserts == 0;
    ++r.upserts;
    const auto set = [](std::string& field, const std::optional<std::string>& v) {
      if (v) field = *v;
    };
    set(r.group, group);
    set(r.display_name, display);
    set(r.notes, notes);
    set(r.config, config);
    set(r.job_type, job_type);
    set(r.state, state);
    set(r.host, host);
    set(r.summary_metrics, summary);
    if (tags) r.tags = *tags;
    std::string out = R"({"data": {"upsertBucket": {"bucket": {"id": )" + json_quoted(r.id) + R"(, "name": )" +
                      json_quoted(r.name) + R"(, "displayName": )" + json_quoted(r.display_name) +
                      R"(, "project": {"name": )" + json_quoted(r.project) + R"(, "entity": {"name": )" + json_quoted(r.entity) +
                      R"(}}, "historyLineCount": )" + std::to_string(r.history.size()) +
                      R"(, "eventsLineCount": )" + std::to_string(r.events.size()) + R"(, "logLineCount": )" +
                      std::to_string(r.output.size()) + R"(}, "inserted": )" + (created ? "true" : "false") + "}}}";
    return json(out);
  }

  static Answer stream_error(int status, std::string_view message) {
    return {status, R"({"error": )" + json_quoted(message) + "}", "application/json", {}};
  }

  Answer file_stream(const Request& req, Parsers& p) {
    // /files/<entity>/<project>/<run>/file_stream
    const std::string_view middle = std::string_view(req.path).substr(7, req.path.size() - 7 - 12);
    std::vector<std::string> parts;
    for (std::size_t start = 0; start <= middle.size();) {
      const std::size_t slash = middle.find('/', start);
      const std::size_t stop = slash == std::string_view::npos ? middle.size() : slash;
      parts.push_back(percent_decode(middle.substr(start, stop - start), false));
      start = stop + 1;
    }
    if (parts.size() != 3 || std::any_of(parts.begin(), parts.end(), [](auto& s) { return s.empty(); }))
      return plain(404, "Not Found");
    if (req.method != "POST") return plain(405, "Method Not Allowed");
    if (req.body.size() > opt.wandb_max_body) return stream_error(413, "request body too large");
    if (!authorized(req)) return stream_error(401, "user is not logged in");
    WbRun* run = find_wandb(parts[0], parts[1], parts[2]);
    if (run == nullptr) return stream_error(404, "run " + parts[0] + "/" + parts[1] + "/" + parts[2] + " not found");
    const Clock::time_point now = Clock::now();
    while (!run->recent.empty() && now - run->recent.front() >= std::chrono::seconds(1)) run->recent.pop_front();
    if (rate_limit > 0 && run->recent.size() >= rate_limit) {
      Answer a = stream_error(429, "rate limit exceeded");
      a.headers = {"Retry-After: 1", "RateLimit-Limit: " + std::to_string(rate_limit), "RateLimit-Remaining: 0",
                   "RateLimit-Reset: 1"};
      return a;
    }
    try {
      stream_into(run->run, req.body, p);
    } catch (const Refusal& r) {
      return stream_error(r.status, r.message);
    }
    run->recent.push_back(now);
    ++run->run.file_stream_requests;
    std::string out = R"({"exitcode": null, "limits": {})";
    if (run->run.stopped) out += R"(, "stopped": true)";
    return json(out + "}");
  }

  static std::vector<std::string>* line_file(WandbRun& r, const std::string& name) {
    if (name == "wandb-history.jsonl") return &r.history;
    if (name == "wandb-events.jsonl") return &r.events;
    if (name == "output.log") return &r.output;
    return &r.other_files[name];
  }

  // Checks the whole request, then applies it: lines go at `offset`
  // (replacing what is there, so a resend is idempotent); an offset past
  // the end is refused; the summary's last line replaces it.
  void stream_into(WandbRun& r, const std::string& body, Parsers& p) {
    simdjson::dom::object root;
    if (p.doc.parse(body).get_object().get(root) != simdjson::SUCCESS) invalid("body is not a JSON object");
    struct Update {
      std::string file;
      std::size_t offset = 0;
      std::vector<std::string> lines;
    };
    std::vector<Update> updates;
    if (const auto files = member(root, "files")) {
      simdjson::dom::object fo;
      if (files->get_object().get(fo) != simdjson::SUCCESS) invalid("files is not an object");
      for (const auto f : fo) {
        Update u{std::string(f.key), 0, {}};
        simdjson::dom::object spec;
        if (f.value.get_object().get(spec) != simdjson::SUCCESS) invalid(u.file + " is not an object");
        if (const auto off = member(spec, "offset")) {
          const auto v = as_int64(*off);
          if (!v || *v < 0 || off->is_string()) invalid(u.file + ": offset is not a non-negative integer");
          u.offset = static_cast<std::size_t>(*v);
        }
        if (const auto content = optional_array(spec, "content")) {
          for (const element line : *content) {
            std::string_view s;
            if (line.get_string().get(s) != simdjson::SUCCESS) invalid(u.file + ": content is not an array of strings");
            u.lines.emplace_back(s);
          }
        }
        const bool objects = u.file == "wandb-history.jsonl" || u.file == "wandb-events.jsonl" ||
                             u.file == "wandb-summary.json";
        for (const auto& line : u.lines) {
          simdjson::dom::object o;
          if (objects && p.inner.parse(line).get_object().get(o) != simdjson::SUCCESS)
            invalid(u.file + ": line is not a JSON object: " + line.substr(0, 200));
        }
        if (u.file != "wandb-summary.json") {
          const std::vector<std::string>* lines = line_file(r, u.file);
          if (u.offset > lines->size())
            invalid(u.file + ": offset " + std::to_string(u.offset) + " is past its end (" +
                    std::to_string(lines->size()) + " lines)");
        }
        updates.push_back(std::move(u));
      }
    }
    std::optional<bool> complete;
    if (const auto c = member(root, "complete")) {
      bool b = false;
      if (c->get_bool().get(b) != simdjson::SUCCESS) invalid("complete is not a boolean");
      complete = b;
    }
    std::optional<int> exitcode;
    if (const auto e = member(root, "exitcode")) {
      std::int64_t v = 0;
      if (e->get_int64().get(v) != simdjson::SUCCESS || v < INT32_MIN || v > INT32_MAX)
        invalid("exitcode is not an integer");
      exitcode = static_cast<int>(v);
    }
    for (auto& u : updates) {
      if (u.file == "wandb-summary.json") {
        if (!u.lines.empty()) r.summary = u.lines.back();
        continue;
      }
      std::vector<std::string>& lines = *line_file(r, u.file);
      lines.resize(u.offset);
      for (auto& l : u.lines) lines.push_back(std::move(l));
    }
    if (exitcode) r.exitcode = exitcode;
    if (complete && *complete) {
      r.complete = true;
      r.state = r.exitcode.value_or(0) == 0 ? "finished" : "failed";
    }
  }
};

// ================================================================ the public face

TrackingServer::TrackingServer() : TrackingServer(Options{}) {}
TrackingServer::TrackingServer(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
TrackingServer::~TrackingServer() = default;

std::uint16_t TrackingServer::port() const noexcept { return impl_->port; }

std::string TrackingServer::base_url() const {
  return std::string(impl_->opt.tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(impl_->port);
}

void TrackingServer::fail_next(int n, InjectedAnswer answer) {
  if (n <= 0) return;
  std::lock_guard lk(impl_->mu);
  impl_->fail_rules.push_back({n, std::move(answer)});
}

void TrackingServer::reset_next(int n, ResetPoint at, std::string path_contains) {
  if (n <= 0) return;
  std::lock_guard lk(impl_->mu);
  impl_->reset_rules.push_back({n, at, std::move(path_contains)});
}

void TrackingServer::set_delay(std::chrono::milliseconds delay, std::string path_contains) {
  std::lock_guard lk(impl_->mu);
  impl_->delay = delay;
  impl_->delay_path = std::move(path_contains);
}

void TrackingServer::outage(std::chrono::milliseconds duration) {
  std::unique_lock lk(impl_->mu);
  const Clock::time_point until = Clock::now() + duration;
  if (impl_->outage_until && *impl_->outage_until >= until) return;
  impl_->outage_until = until;
  impl_->cv.notify_all();
  impl_->wake();
  impl_->cv.wait(lk, [&] { return impl_->listener_down || impl_->stopping || !impl_->outage_until; });
}

bool TrackingServer::in_outage() const {
  std::lock_guard lk(impl_->mu);
  return impl_->listener_down;
}

void TrackingServer::refuse_key(std::string key) {
  std::lock_guard lk(impl_->mu);
  impl_->refused_keys.insert(std::move(key));
}

void TrackingServer::set_wandb_rate_limit(unsigned requests_per_second) {
  std::lock_guard lk(impl_->mu);
  impl_->rate_limit = requests_per_second;
}

bool TrackingServer::stop_wandb_run(const std::string& entity, const std::string& project, const std::string& name) {
  std::lock_guard lk(impl_->mu);
  Impl::WbRun* run = impl_->find_wandb(entity, project, name);
  if (run == nullptr) return false;
  run->run.stopped = true;
  return true;
}

void TrackingServer::clear_faults() {
  std::lock_guard lk(impl_->mu);
  impl_->fail_rules.clear();
  impl_->reset_rules.clear();
  impl_->delay = std::chrono::milliseconds(0);
  impl_->delay_path.clear();
  impl_->refused_keys.clear();
}

std::vector<MlflowExperiment> TrackingServer::experiments() const {
  std::lock_guard lk(impl_->mu);
  return impl_->experiments;
}

std::vector<MlflowRun> TrackingServer::mlflow_runs() const {
  std::lock_guard lk(impl_->mu);
  std::vector<MlflowRun> out;
  for (const auto& [id, r] : impl_->ml_runs) out.push_back(r.run);
  return out;
}

std::optional<MlflowRun> TrackingServer::mlflow_run(const std::string& run_id) const {
  std::lock_guard lk(impl_->mu);
  const auto it = impl_->ml_runs.find(run_id);
  if (it == impl_->ml_runs.end()) return std::nullopt;
  return it->second.run;
}

std::vector<MetricPoint> TrackingServer::metric_history(const std::string& run_id, const std::string& key) const {
  std::lock_guard lk(impl_->mu);
  const auto it = impl_->ml_runs.find(run_id);
  if (it == impl_->ml_runs.end()) return {};
  const auto m = it->second.run.metrics.find(key);
  return m == it->second.run.metrics.end() ? std::vector<MetricPoint>{} : m->second;
}

std::map<std::string, std::string> TrackingServer::artifacts(const std::string& run_id) const {
  std::lock_guard lk(impl_->mu);
  std::map<std::string, std::string> out;
  const auto it = impl_->ml_runs.find(run_id);
  if (it == impl_->ml_runs.end()) return out;
  const std::string base = Impl::artifact_root(it->second.run) + "/";
  for (auto f = impl_->artifact_files.lower_bound(base); f != impl_->artifact_files.end() && starts_with(f->first, base);
       ++f)
    out.emplace(f->first.substr(base.size()), f->second);
  return out;
}

std::vector<WandbRun> TrackingServer::wandb_runs() const {
  std::lock_guard lk(impl_->mu);
  std::vector<WandbRun> out;
  for (const auto& [k, r] : impl_->wb_runs) out.push_back(r.run);
  return out;
}

std::optional<WandbRun> TrackingServer::wandb_run(const std::string& entity, const std::string& project,
                                                  const std::string& name) const {
  std::lock_guard lk(impl_->mu);
  const Impl::WbRun* run = impl_->find_wandb(entity, project, name);
  if (run == nullptr) return std::nullopt;
  return run->run;
}

ServerStats TrackingServer::stats() const {
  std::lock_guard lk(impl_->mu);
  return impl_->stats;
}

std::vector<std::string> TrackingServer::authorization_headers() const {
  std::lock_guard lk(impl_->mu);
  return impl_->authorizations;
}

std::vector<RecordedRequest> TrackingServer::requests() const {
  std::lock_guard lk(impl_->mu);
  return impl_->recorded;
}

// ================================================================ certificates

namespace {

template <class T, void (*Free)(T*)>
struct Freer {
  void operator()(T* p) const noexcept { Free(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Freer<EVP_PKEY, EVP_PKEY_free>>;
using CertPtr = std::unique_ptr<X509, Freer<X509, X509_free>>;
using BioPtr = std::unique_ptr<BIO, Freer<BIO, BIO_free_all>>;

[[noreturn]] void openssl_failed(const std::string& what) {
  const unsigned long e = ERR_get_error();
  char reason[256] = "no OpenSSL error recorded";
  if (e != 0) ERR_error_string_n(e, reason, sizeof reason);
  ERR_clear_error();
  throw std::runtime_error(what + ": " + reason);
}

void add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) openssl_failed(std::string("extension ") + value);
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) openssl_failed(std::string("adding extension ") + value);
}

// A certificate for `key`, signed by `issuer_key` (self-signed when `issuer` is null).
CertPtr issue(EVP_PKEY* key, const std::string& common_name, X509* issuer, EVP_PKEY* issuer_key, bool ca) {
  CertPtr cert(X509_new());
  std::uint64_t serial = 0;
  if (!cert || RAND_bytes(reinterpret_cast<unsigned char*>(&serial), sizeof serial) != 1 ||
      ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), serial >> 1) != 1 || X509_set_version(cert.get(), 2) != 1)
    openssl_failed("new certificate");
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 7L * 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("chorus tests"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                             -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1 || X509_set_pubkey(cert.get(), key) != 1)
    openssl_failed("certificate names");
  add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (ca) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth");
    add_extension(cert.get(), signer, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
    add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) openssl_failed("signing " + common_name);
  return cert;
}

void write_pem(const std::string& path, const std::function<int(BIO*)>& write, mode_t mode) {
  BioPtr bio(BIO_new_file(path.c_str(), "w"));
  if (!bio || write(bio.get()) != 1) openssl_failed("writing " + path);
  bio.reset();
  ::chmod(path.c_str(), mode);
}

} // namespace

TlsFiles write_test_certificates(const std::string& dir) {
  KeyPtr ca_key(EVP_EC_gen("P-256"));
  KeyPtr server_key(EVP_EC_gen("P-256"));
  if (!ca_key || !server_key) openssl_failed("EC P-256 key");
  std::uint32_t tag = 0;
  RAND_bytes(reinterpret_cast<unsigned char*>(&tag), sizeof tag);
  char ca_name[64];
  std::snprintf(ca_name, sizeof ca_name, "chorus test CA %08x", tag); // each CA its own name
  const CertPtr ca = issue(ca_key.get(), ca_name, nullptr, ca_key.get(), true);
  const CertPtr server = issue(server_key.get(), "127.0.0.1", ca.get(), ca_key.get(), false);
  TlsFiles files{dir + "/server.pem", dir + "/server.key", dir + "/ca.pem"};
  write_pem(files.ca, [&](BIO* b) { return PEM_write_bio_X509(b, ca.get()); }, 0644);
  write_pem(files.cert, [&](BIO* b) { return PEM_write_bio_X509(b, server.get()); }, 0644);
  write_pem(
      files.key,
      [&](BIO* b) { return PEM_write_bio_PrivateKey(b, server_key.get(), nullptr, nullptr, 0, nullptr, nullptr); },
      0600);
  return files;
}

} // namespace chorus::test
