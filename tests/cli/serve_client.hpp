// `chorus serve` from a test: a real server process on a port the kernel
// picked, asked over HTTP with cpp-httplib's client, and its JSON answers
// read with simdjson (tests/cli/serve_test.cpp, serve_media_test.cpp).
#pragma once

#include "tests/cli/process.hpp"

#include <boost/test/unit_test.hpp>
#include <httplib.h>
#include <simdjson.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::test {

inline std::string encode(std::string_view s) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out += static_cast<char>(c);
    else out.append({'%', hex[c >> 4], hex[c & 15]});
  }
  return out;
}

/// A `chorus serve` on a port the kernel picked, stopped with the test. Its
/// requests carry the token it printed (as the cookie a page keeps), unless
/// `with_token` is cleared; `as_user` >= 0 runs it as that user (the test must be root).
class Serve {
public:
  explicit Serve(const std::filesystem::path& root, std::vector<std::string> extra = {}, int as_user = -1) {
    std::vector<std::string> args{"serve", root.string(), "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    child_ = std::make_unique<Child>(args, std::vector<std::string>{}, as_user);
    // "  http://HOST:PORT/" or ".../?token=TOKEN", then "Ctrl-C stops it."
    std::string line;
    const bool up = child_->wait_for([&](const std::string& out, const std::string&) {
      const std::size_t at = out.find("http://");
      if (at == std::string::npos || out.find("Ctrl-C") == std::string::npos) return false;
      line = out.substr(at, out.find('\n', at) - at);
      return true;
    });
    BOOST_TEST_REQUIRE(up, "chorus serve printed no address");
    const std::size_t slash = line.find('/', 7), colon = line.rfind(':', slash);
    BOOST_TEST_REQUIRE((colon != std::string::npos && slash != std::string::npos), line);
    port = std::stoi(line.substr(colon + 1, slash - colon - 1));
    if (const std::size_t t = line.find("?token="); t != std::string::npos) token = line.substr(t + 7);
  }
  ~Serve() {
    if (child_) child_->signal(SIGTERM);
  }

  /// The cookie a page opened at the printed address keeps (none where no token is asked).
  [[nodiscard]] httplib::Headers auth() const {
    if (!with_token || token.empty()) return {};
    return {{"Cookie", "chorus_token_" + std::to_string(port) + "=" + token}};
  }
  /// A client whose requests carry auth() (a Cookie header given to a request replaces it).
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    c.set_connection_timeout(10, 0);
    c.set_default_headers(auth());
    return c;
  }
  /// GET `path`; the status and the body (at most 10 s of it: an event
  /// stream answered where a refusal was due never ends by itself).
  std::pair<int, std::string> get(const std::string& path, const httplib::Headers& headers = {}) const {
    httplib::Client c = client();
    int status = -1;
    std::string body;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    const httplib::Result r = c.Get(
        path, headers,
        [&](const httplib::Response& res) {
          status = res.status;
          return true;
        },
        [&](const char* data, std::size_t n) {
          body.append(data, n);
          return std::chrono::steady_clock::now() < until;
        });
    if (!r && status < 0) return {-1, "no answer: " + httplib::to_string(r.error())};
    return {status, body};
  }
  /// The event stream of `run`, read until `last` is in it (or 60 s have
  /// passed); `then` is done once, when `first` is in it.
  std::string events(const std::string& run, const std::string& first, const std::function<void()>& then,
                     const std::string& last) const {
    httplib::Client c = client();
    std::string seen;
    bool done = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    c.Get("/api/events?run=" + run, [&](const char* data, std::size_t n) {
      seen.append(data, n);
      if (!done && contains(seen, first)) {
        done = true;
        then();
      }
      return !contains(seen, last) && std::chrono::steady_clock::now() < until;
    });
    return seen;
  }
  Output stop() {
    child_->signal(SIGTERM);
    Output o = child_->finish(std::chrono::seconds(30));
    child_.reset();
    return o;
  }

  int port = 0;
  std::string token;
  bool with_token = true;

private:
  std::unique_ptr<Child> child_;
};

/// The body parsed, as an object; a failed test where it is not JSON.
struct Json {
  explicit Json(const std::string& body) : text(body) {
    if (parser.parse(text).get(doc) != simdjson::SUCCESS) BOOST_FAIL("not JSON: " << text.substr(0, 300));
  }
  simdjson::dom::element operator[](std::string_view key) const {
    simdjson::dom::element e;
    if (doc[key].get(e) != simdjson::SUCCESS) BOOST_FAIL("no \"" << key << "\" in " << text.substr(0, 300));
    return e;
  }
  [[nodiscard]] bool has(std::string_view key) const { return doc[key].error() == simdjson::SUCCESS; }
  std::string text;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
};

inline simdjson::dom::array arr(simdjson::dom::element e) {
  simdjson::dom::array a;
  if (e.get(a) != simdjson::SUCCESS) BOOST_FAIL("not an array: " << simdjson::minify(e));
  return a;
}

inline std::vector<double> numbers(simdjson::dom::element array) {
  std::vector<double> out;
  simdjson::dom::array a;
  if (array.get(a) != simdjson::SUCCESS) BOOST_FAIL("not an array: " << simdjson::minify(array));
  for (simdjson::dom::element e : a) out.push_back(double(e));
  return out;
}

} // namespace chorus::test
