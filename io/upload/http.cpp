#include "io/upload/http.hpp"

#include "io/platform/credentials.hpp"
#include "io/platform/posix.hpp"

#include <curl/curl.h>
#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <limits>
#include <memory>
#include <mutex>

namespace chorus::upload {
namespace {

constexpr std::size_t max_body = 64u << 20; // an answer larger than this is cut (ours are small)

std::chrono::milliseconds parse_retry_after(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r' || v.back() == '\n')) v.remove_suffix(1);
  std::int64_t secs = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), secs);
  if (ec == std::errc() && p == v.data() + v.size()) return std::chrono::seconds(std::max<std::int64_t>(secs, 0));
  // An HTTP date.
  const std::string s(v);
  const time_t when = curl_getdate(s.c_str(), nullptr);
  if (when < 0) return std::chrono::milliseconds(-1);
  return std::chrono::seconds(std::max<std::int64_t>(when - std::time(nullptr), 0));
}

/// One request in flight on one easy handle.
struct Transfer {
  HttpResponse* response = nullptr;
  std::FILE* upload = nullptr;
  std::string_view body; // a non-idempotent request's body, given out by on_read_body
  std::size_t body_at = 0;
  curl_slist* headers = nullptr;
  const std::atomic<std::int64_t>* cut_ns = nullptr;
  bool cut = false; // cut_at's time came while it ran
  // limit_silence: whether it applies (the server had not answered since
  // its last failure when this request started), from when, and whether it
  // cut the request.
  const std::atomic<std::int64_t>* silence_ns = nullptr;
  bool suspect = false;
  std::int64_t started_ns = 0;
  bool answering = false; // a byte of the answer (a header line) came
  bool silent = false;

  ~Transfer() {
    curl_slist_free_all(headers);
    if (upload) std::fclose(upload);
  }
};

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Cuts a transfer once the client's cut_at time has come, or once a
/// suspect server has been silent for limit_silence's grace.
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  const std::int64_t now = now_ns();
  if (now >= t->cut_ns->load(std::memory_order_relaxed)) {
    t->cut = true;
    return 1;
  }
  const std::int64_t grace = t->silence_ns->load(std::memory_order_relaxed);
  if (!t->suspect || t->answering || grace <= 0 || now - t->started_ns < grace) return 0;
  t->silent = true;
  return 1;
}

std::string seconds_text(std::int64_t ms) {
  return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

/// libcurl's words for a failed transfer, made to say what happened to the request.
std::string transport_error(CURLcode rc, const Transfer& t, long timeout_ms) {
  switch (rc) {
    case CURLE_SEND_FAIL_REWIND:
      return "the connection dropped after the request went out; it was not sent again, so that the server cannot "
             "store it twice (what the server kept is checked before going on)";
    case CURLE_ABORTED_BY_CALLBACK:
      if (t.cut) return "the time for uploading ran out while a request was in flight";
      if (t.silent)
        return "none within " + seconds_text(t.silence_ns->load(std::memory_order_relaxed) / 1'000'000) +
               " from a server that had not answered since its last failure, if ever (a finishing run waits no "
               "longer for such a server)";
      break;
    case CURLE_OPERATION_TIMEDOUT:
      if (now_ns() >= t.cut_ns->load(std::memory_order_relaxed) - 5'000'000)
        return "the time for uploading ran out while a request was in flight";
      return "no answer within " + seconds_text(timeout_ms) + " (" + curl_easy_strerror(rc) + ")";
    case CURLE_PEER_FAILED_VERIFICATION:
      return std::string(curl_easy_strerror(rc)) +
             " (the server's certificate does not verify: give its CA with CURL_CA_BUNDLE or SSL_CERT_FILE; "
             "verification is never turned off)";
    default: break;
  }
  return curl_easy_strerror(rc);
}

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t bytes = size * n;
  std::string& body = t->response->body;
  if (body.size() < max_body) body.append(data, std::min(bytes, max_body - body.size()));
  return bytes;
}

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  t->answering = true;
  const std::string_view line(data, size * n);
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name == "retry-after" || (name == "ratelimit-reset" && !t->response->retry_after)) {
    const auto ms = parse_retry_after(line.substr(colon + 1));
    if (ms.count() >= 0) t->response->retry_after = ms;
  }
  return size * n;
}

std::size_t on_read(char* buffer, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t got = std::fread(buffer, 1, size * n, t->upload);
  if (got == 0 && std::ferror(t->upload)) return CURL_READFUNC_ABORT;
  return got;
}

std::size_t on_read_body(char* buffer, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::size_t take = std::min(size * n, t->body.size() - t->body_at);
  std::memcpy(buffer, t->body.data() + t->body_at, take);
  t->body_at += take;
  return take;
}

/// libcurl asks to rewind only to send the request again on a new
/// connection: refused, so a non-idempotent request is never sent twice.
int refuse_rewind(void* user, curl_off_t offset, int) {
  auto* t = static_cast<Transfer*>(user);
  if (offset == 0 && t->body_at == 0) return CURL_SEEKFUNC_OK;
  return CURL_SEEKFUNC_FAIL;
}

std::int64_t req_timeout(const HttpRequest& r) { return static_cast<std::int64_t>(r.timeout.count()); }

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    platform::keep_tls_library_until_exit(); // before libcurl initialises OpenSSL
    curl_global_init(CURL_GLOBAL_DEFAULT);
  });
}

} // namespace

/// A started request: its transfer and, once done, its answer.
struct HttpClient::Flight {
  HttpResponse response;
  Transfer transfer;
  long timeout = 0;
  bool added = false; // on the multi handle
  bool done = false;
  std::uint64_t done_order = 0; // answers are given out in the order they came
};

Delivery classify(const HttpResponse& r) noexcept {
  if (r.ok()) return Delivery::ok;
  if (r.status == 0) return r.permanent ? Delivery::refused : Delivery::retry;
  if (r.status == 408 || r.status == 425 || r.status == 429) return Delivery::retry;
  if (r.status >= 500 && r.status != 501) return Delivery::retry;
  return Delivery::refused;
}

std::string describe(const HttpResponse& r) {
  if (r.status == 0) return "no answer: " + r.transport_error;
  std::string out = "HTTP ";
  out += std::to_string(r.status);
  // The server's own words: MLflow's error_code and message, GraphQL's errors, or an "error" field.
  std::string detail;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (!r.body.empty() && parser.parse(r.body).get(doc) == simdjson::SUCCESS) {
    std::string_view code, message;
    if (doc["error_code"].get(code) == simdjson::SUCCESS) detail.append(code);
    if (doc["message"].get(message) == simdjson::SUCCESS || doc["error"].get(message) == simdjson::SUCCESS ||
        doc["errors"].at(0)["message"].get(message) == simdjson::SUCCESS) {
      if (!detail.empty()) detail += ": ";
      detail.append(message);
    }
  }
  if (detail.empty()) {
    for (char c : std::string_view(r.body).substr(0, 200)) detail.push_back(c == '\n' || c == '\r' ? ' ' : c);
  }
  if (detail.size() > 300) detail.resize(300);
  if (!detail.empty()) {
    out += ' ';
    out += detail;
  }
  return out;
}

Backoff::Backoff(std::chrono::milliseconds base, std::chrono::milliseconds max, std::uint64_t seed)
    : base_(base), max_(max), rng_(seed) {}

std::chrono::milliseconds Backoff::next(std::optional<std::chrono::milliseconds> retry_after) {
  const int shift = std::min(attempt_, 30);
  ++attempt_;
  const auto grown = static_cast<double>(base_.count()) * static_cast<double>(std::uint64_t{1} << shift);
  const double cap = std::min(grown, static_cast<double>(max_.count()));
  std::uniform_real_distribution<double> jitter(0.75, 1.0);
  auto wait = std::chrono::milliseconds(static_cast<std::int64_t>(cap * jitter(rng_)));
  // A server that says how long to wait is believed (up to an hour).
  if (retry_after && *retry_after > wait) wait = std::min(*retry_after, std::chrono::milliseconds(3'600'000));
  return wait;
}

HttpClient::HttpClient(std::size_t parallel) : cut_ns_(std::numeric_limits<std::int64_t>::max()) {
  global_init();
  multi_ = curl_multi_init();
  for (std::size_t i = 0; i < std::max<std::size_t>(parallel, 1); ++i) handles_.push_back(curl_easy_init());
  flights_.resize(handles_.size());
}

HttpClient::~HttpClient() {
  for (std::size_t i = 0; i < flights_.size(); ++i)
    if (flights_[i] && flights_[i]->added) curl_multi_remove_handle(static_cast<CURLM*>(multi_), static_cast<CURL*>(handles_[i]));
  for (void* h : handles_)
    if (h) curl_easy_cleanup(static_cast<CURL*>(h));
  if (multi_) curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

void HttpClient::cut_at(std::chrono::steady_clock::time_point at) noexcept {
  cut_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count(),
                std::memory_order_relaxed);
}

void HttpClient::limit_silence(std::chrono::milliseconds grace) noexcept {
  silence_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(grace).count(), std::memory_order_relaxed);
}

bool HttpClient::unreachable() const noexcept { return unanswered_ >= 2 || (unanswered_ >= 1 && !ever_answered_); }

HttpResponse HttpClient::perform(const HttpRequest& req) { return std::move(perform_all(std::span(&req, 1)).front()); }

namespace {

/// Sets `c` up for `req`; false (and `res` says why) when it cannot be sent.
bool prepare(CURL* c, const HttpRequest& req, Transfer& t, long timeout) {
  HttpResponse& res = *t.response;
  // Reset keeps the live connections, so the next request reuses them.
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(c, CURLOPT_PRIVATE, &t);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  for (const char* var : {"CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
    if (const char* ca = std::getenv(var); ca && *ca) {
      curl_easy_setopt(c, CURLOPT_CAINFO, ca);
      break;
    }
  }
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min<long>(timeout, 10'000));
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  if (!req.user.empty() || !req.password.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(c, CURLOPT_USERNAME, req.user.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, req.password.c_str());
  }
  for (const std::string& h : req.headers) t.headers = curl_slist_append(t.headers, h.c_str());
  t.headers = curl_slist_append(t.headers, "Expect:"); // no 100-continue round trip
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, t.headers);

  if (!req.upload_file.empty()) {
    // A run's file: never a FIFO or a link planted where it belongs.
    const Result<int> fd = platform::open_regular(req.upload_file, O_RDONLY);
    if (fd) t.upload = ::fdopen(*fd, "rb");
    if (!t.upload) {
      if (fd) platform::close_fd(*fd);
      res.transport_error = "cannot read " + req.upload_file + ": " + (fd ? std::strerror(errno) : fd.error().message());
      return false;
    }
    std::fseek(t.upload, 0, SEEK_END);
    const long size = std::ftell(t.upload);
    std::fseek(t.upload, 0, SEEK_SET);
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(c, CURLOPT_READDATA, &t);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(size));
    if (req.method != "PUT") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  } else if ((req.method == "POST" || req.method == "PUT") && !req.idempotent) {
    t.body = req.body;
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read_body);
    curl_easy_setopt(c, CURLOPT_READDATA, &t);
    curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, refuse_rewind);
    curl_easy_setopt(c, CURLOPT_SEEKDATA, &t);
    if (req.method == "PUT") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  } else if (req.method == "POST" || req.method == "PUT") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body.data());
    if (req.method == "PUT") curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  } else if (req.method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  return true;
}

} // namespace

std::optional<std::size_t> HttpClient::start(const HttpRequest& request) {
  std::size_t i = 0;
  while (i < handles_.size() && flights_[i]) ++i;
  if (i == handles_.size()) return std::nullopt;
  auto& f = flights_[i] = std::make_unique<Flight>();
  ++in_flight_;
  Transfer& t = f->transfer;
  t.response = &f->response;
  t.cut_ns = &cut_ns_;
  t.silence_ns = &silence_ns_;
  t.suspect = unanswered_ > 0 || !ever_answered_;
  t.started_ns = now_ns();
  auto finish_now = [&](std::string why) {
    if (f->response.transport_error.empty()) f->response.transport_error = std::move(why);
    f->done = true;
    f->done_order = ++answers_;
    return i;
  };
  auto* c = static_cast<CURL*>(handles_[i]);
  if (!multi_ || !c) return finish_now("libcurl could not make a handle (out of memory?)");
  const std::int64_t cut_ms = (cut_ns_.load(std::memory_order_relaxed) - now_ns()) / 1'000'000;
  if (cut_ms <= 0) return finish_now("the time for uploading ran out");
  f->timeout = static_cast<long>(std::clamp<std::int64_t>(req_timeout(request), 1, cut_ms));
  if (!prepare(c, request, t, f->timeout)) return finish_now({});
  curl_multi_add_handle(static_cast<CURLM*>(multi_), c);
  f->added = true;
  return i;
}

void HttpClient::run_transfers() {
  auto* multi = static_cast<CURLM*>(multi_);
  int still = 0;
  bool failed = curl_multi_perform(multi, &still) != CURLM_OK;
  bool answered = false;
  while (CURLMsg* msg = failed ? nullptr : curl_multi_info_read(multi, &still)) {
    if (msg->msg != CURLMSG_DONE) continue;
    CURL* c = msg->easy_handle;
    const CURLcode rc = msg->data.result;
    const auto i = static_cast<std::size_t>(std::find(handles_.begin(), handles_.end(), c) - handles_.begin());
    Flight& f = *flights_[i];
    HttpResponse& res = f.response;
    if (rc == CURLE_OK) {
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &res.status);
      unanswered_ = 0;
      ever_answered_ = true;
    } else {
      res.status = 0;
      res.body.clear();
      res.transport_error = transport_error(rc, f.transfer, f.timeout);
      res.permanent = rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE ||
                      rc == CURLE_SSL_CERTPROBLEM || rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_URL_MALFORMAT;
      // A request cut by the caller's time says nothing of the server; one
      // refused, reset or left unanswered does.
      if (!f.transfer.cut && !res.permanent) ++unanswered_;
    }
    long opened = 0;
    if (curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &opened) == CURLE_OK && opened > 0)
      connections_ += static_cast<std::uint64_t>(opened);
    curl_multi_remove_handle(multi, c);
    f.added = false;
    f.done = true;
    f.done_order = ++answers_;
    answered = true;
  }
  if (!failed && !answered) failed = curl_multi_poll(multi, nullptr, 0, 100, nullptr) != CURLM_OK;
  if (!failed) return;
  // The multi handle itself failed: every request in flight ends without an answer.
  for (std::size_t i = 0; i < flights_.size(); ++i) {
    Flight* f = flights_[i].get();
    if (!f || f->done) continue;
    if (f->added) curl_multi_remove_handle(multi, static_cast<CURL*>(handles_[i]));
    f->added = false;
    f->done = true;
    f->done_order = ++answers_;
    f->response.transport_error = "libcurl failed to run the transfer";
  }
}

HttpResponse HttpClient::take(std::size_t ticket) {
  HttpResponse r = std::move(flights_[ticket]->response);
  flights_[ticket].reset();
  --in_flight_;
  return r;
}

std::optional<std::pair<std::size_t, HttpResponse>> HttpClient::next_answer() {
  for (;;) {
    if (in_flight_ == 0) return std::nullopt;
    std::optional<std::size_t> first;
    for (std::size_t i = 0; i < flights_.size(); ++i)
      if (flights_[i] && flights_[i]->done && (!first || flights_[i]->done_order < flights_[*first]->done_order))
        first = i;
    if (first) return std::pair{*first, take(*first)};
    run_transfers();
  }
}

std::vector<HttpResponse> HttpClient::perform_all(std::span<const HttpRequest> requests) {
  std::vector<HttpResponse> out(requests.size());
  if (requests.size() > handles_.size() - in_flight_) {
    for (HttpResponse& r : out) r.transport_error = "too many requests at once for the client's connections";
    return out;
  }
  std::vector<std::size_t> tickets;
  for (const HttpRequest& r : requests) tickets.push_back(*start(r));
  for (std::size_t k = 0; k < tickets.size(); ++k) {
    while (!flights_[tickets[k]]->done) run_transfers();
    out[k] = take(tickets[k]);
  }
  return out;
}

std::string url_encode(std::string_view s) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
        c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

} // namespace chorus::upload
