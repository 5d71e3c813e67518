// HTTP for the upload backends (libcurl): one keep-alive connection per
// client, bounded timeouts, TLS verification always on, and the delivery
// rules of README's "Uploading to MLflow and W&B" (what to retry, how long to wait).
#pragma once

#include <chorus/chorus.hpp>

#include <atomic>
#include <memory>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::upload {

struct HttpRequest {
  std::string method = "GET"; // GET, POST, PUT
  std::string url;
  std::vector<std::string> headers; // "Name: value"
  std::string body;
  /// PUT the contents of this file, streamed (never read whole into memory).
  std::string upload_file;
  /// HTTP Basic credentials; kept in memory only, never printed.
  std::string user, password;
  std::chrono::milliseconds timeout{30'000};
  /// libcurl sends a request again by itself when a kept-alive connection
  /// turns out closed after the request went out. For a request that is not
  /// idempotent (MLflow's log-batch stores its points twice) that is turned
  /// off: the request fails instead, and the caller finds out what the server kept.
  bool idempotent = true;
};

struct HttpResponse {
  long status = 0;            // 0: no HTTP answer (see transport_error)
  std::string body;
  std::string transport_error; // libcurl's description when no answer came
  /// No answer, and none will come by trying again: the certificate does not
  /// verify, the URL is malformed, the protocol is not supported.
  bool permanent = false;
  /// From Retry-After (seconds or an HTTP date), or RateLimit-Reset.
  std::optional<std::chrono::milliseconds> retry_after;

  [[nodiscard]] bool ok() const noexcept { return status >= 200 && status < 300; }
};

/// What to do with an answer.
enum class Delivery {
  ok,      // 2xx
  retry,   // no answer, 408, 425, 429, 5xx except 501: back off and send again
  refused, // a 4xx (or 501), or a certificate that does not verify: sending again cannot succeed
};
[[nodiscard]] Delivery classify(const HttpResponse& r) noexcept;

/// "HTTP 400 INVALID_PARAMETER_VALUE: <message>" or "no answer: <why>": the
/// server's own words, shortened, for an error that names the cause.
[[nodiscard]] std::string describe(const HttpResponse& r);

/// Exponential backoff with jitter: base·2^attempt capped at `max`, each wait
/// drawn from [75 %, 100 %] of that (25 % jitter), and a server's
/// Retry-After taken when it asks for longer.
class Backoff {
public:
  Backoff(std::chrono::milliseconds base, std::chrono::milliseconds max, std::uint64_t seed = std::random_device{}());

  /// The wait before the next attempt; counts the attempt.
  std::chrono::milliseconds next(std::optional<std::chrono::milliseconds> retry_after = std::nullopt);
  void reset() noexcept { attempt_ = 0; }
  [[nodiscard]] int attempts() const noexcept { return attempt_; }

private:
  std::chrono::milliseconds base_, max_;
  int attempt_ = 0;
  std::mt19937_64 rng_;
};

/// libcurl easy handles reused for every request, so that connections to a
/// server stay open between requests: `parallel` of them, each on a
/// connection of its own, for requests sent at once (perform_all). Every
/// request runs within its own timeout (HttpRequest::timeout), never within
/// a caller's time slice. Not thread-safe, except cut_at and limit_silence. CA bundle:
/// $CURL_CA_BUNDLE or $SSL_CERT_FILE if set, else the system's.
class HttpClient {
public:
  explicit HttpClient(std::size_t parallel = 1);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  [[nodiscard]] HttpResponse perform(const HttpRequest& request);
  /// Sends the requests at once (at most parallel() of them), each on its
  /// own connection and within its own timeout; the answers in the same order.
  [[nodiscard]] std::vector<HttpResponse> perform_all(std::span<const HttpRequest> requests);
  [[nodiscard]] std::size_t parallel() const noexcept { return handles_.size(); }

  /// A sliding window: sends `request` on a free connection and returns at
  /// once with its ticket (answered by next_answer), or nullopt when
  /// parallel() requests are in flight. `request` must live until answered.
  [[nodiscard]] std::optional<std::size_t> start(const HttpRequest& request);
  /// Waits for the first answer of a started request to come: its ticket and
  /// answer. Nothing in flight: nullopt at once.
  [[nodiscard]] std::optional<std::pair<std::size_t, HttpResponse>> next_answer();
  [[nodiscard]] std::size_t in_flight() const noexcept { return in_flight_; }

  /// No request runs past `at`: one in flight then is cut, a later one is not
  /// sent ("no answer"). For a caller that must end by a time (the drain at
  /// a run's finish, `chorus sync --timeout`). May be called from any thread.
  void cut_at(std::chrono::steady_clock::time_point at) noexcept;

  /// From now on a request to a server that has not answered since its last
  /// failure (or never has) is cut once it has waited `grace` for an answer,
  /// one in flight included; a server that answers is given each request's
  /// own timeout. For the drain at a run's finish, so that a server that does
  /// not answer cannot hold it (0 turns it off). May be called from any thread.
  void limit_silence(std::chrono::milliseconds grace) noexcept;

  /// The server did not answer the last two requests (the connection was
  /// refused or reset, or no answer came in time), or the last one when it
  /// never answered any: sending more is unlikely to get through now.
  [[nodiscard]] bool unreachable() const noexcept;

  /// Connections opened so far (keep-alive reuses them).
  [[nodiscard]] std::uint64_t connections() const noexcept { return connections_; }

private:
  struct Flight; // a started request's transfer state and answer (http.cpp)

  void* multi_ = nullptr;
  std::vector<void*> handles_;
  std::vector<std::unique_ptr<Flight>> flights_; // per handle: set while its request is in flight or unread
  std::size_t in_flight_ = 0;
  std::uint64_t answers_ = 0;

  /// Runs the transfers until one or more end (or 100 ms pass), marking theirs done.
  void run_transfers();
  /// The answer of a done request; frees its connection.
  HttpResponse take(std::size_t ticket);
  std::atomic<std::int64_t> cut_ns_;
  std::atomic<std::int64_t> silence_ns_{0};
  std::uint64_t connections_ = 0;
  int unanswered_ = 0;       // requests in a row that got no answer
  bool ever_answered_ = false;
};

/// Percent-encodes `s` for a URL's query or path segment.
[[nodiscard]] std::string url_encode(std::string_view s);

} // namespace chorus::upload
