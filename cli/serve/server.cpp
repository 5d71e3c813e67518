#include "cli/serve/server.hpp"
#include "io/platform/random.hpp"

#include "cli/cli.hpp"
#include "cli/serve/api.hpp"
#include "cli/serve/assets.hpp"
#include "cli/serve/encoding.hpp"
#include "cli/serve/events_api.hpp"
#include "io/platform/posix.hpp"
#include "runtime/core/json.hpp"

#include <httplib.h>

#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <optional>
#include <netdb.h>
#include <sys/stat.h>
#include <thread>
#include <tuple>
#include <unistd.h>

namespace chorus::cli::serve {
namespace {

/// The most a request may carry in its body (a GET carries none).
constexpr std::size_t max_body_bytes = 16u << 10;
/// Keys one series request may ask for; runs one event stream may follow.
constexpr std::size_t max_keys = 512, max_stream_runs = 16;
/// The most steps and bins one histograms request may ask for.
constexpr int max_histogram_points = 2000, max_histogram_bins = 200;
/// The largest file read whole into an answer (so that it may be compressed); a larger one is streamed.
constexpr std::size_t max_whole_bytes = 64u << 20;
/// How often an event stream looks at its runs' files.
constexpr auto poll_every = std::chrono::milliseconds(500);
/// A comment line this often keeps an idle stream open, and finds one the
/// page closed (its thread is then free for another).
constexpr auto ping_every = std::chrono::seconds(5);

/// Compares without telling, by its time, how much of the token matched.
bool same_token(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

/// The value of cookie `name` in a Cookie header, or "".
std::string cookie(const httplib::Request& req, std::string_view name) {
  const std::string header = req.get_header_value("Cookie");
  std::string_view rest = header;
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find(';'), rest.size());
    std::string_view pair = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    while (!pair.empty() && pair.front() == ' ') pair.remove_prefix(1);
    if (pair.size() > name.size() && pair.starts_with(name) && pair[name.size()] == '=')
      return std::string(pair.substr(name.size() + 1));
  }
  return {};
}

/// `body` as the answer, in `coding` (already applied); `held` keeps it alive. Given to cpp-httplib
/// as a content provider of a known length, which it sends as it is: it
/// compresses nothing itself (its own would be Brotli at the highest quality,
/// on every request).
void put_view(httplib::Response& res, std::string_view body, std::string_view type, Coding coding,
              std::shared_ptr<const std::string> held = {}) {
  if (coding != Coding::identity) res.set_header("Content-Encoding", std::string(coding_name(coding)));
  res.set_header("Vary", "Accept-Encoding");
  res.set_content_provider(body.size(), std::string(type),
                           [body, held](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
                             return sink.write(body.data() + offset, length);
                           });
}

/// The same, for a body made for this answer (held until it is sent).
void put(httplib::Response& res, std::string body, std::string_view type, Coding coding) {
  auto held = std::make_shared<const std::string>(std::move(body));
  put_view(res, *held, type, coding, held);
}

/// Whether the request comes from this machine (its peer address is loopback).
bool from_this_machine(const httplib::Request& req) {
  std::string_view peer = req.remote_addr;
  if (peer.starts_with("::ffff:")) peer.remove_prefix(7); // an IPv4 peer of an IPv6 socket
  return is_loopback(std::string(peer));
}

/// An answer made for this request (JSON, a text file), compressed as is
/// cheapest end to end for where the client is (cli/serve/encoding.hpp).
void put_answer(const httplib::Request& req, httplib::Response& res, std::string body, std::string_view type) {
  const Coding coding =
      answer_coding(req.get_header_value("Accept-Encoding"), from_this_machine(req), body.size());
  if (coding == Coding::identity) return put(res, std::move(body), type, coding);
  std::string packed = compress(body, coding, answer_level(coding));
  put(res, std::move(packed), type, coding);
}

void send(const httplib::Request& req, httplib::Response& res, Reply r) {
  res.status = r.status;
  put_answer(req, res, std::move(r.body), "application/json");
}

/// A refusal: short, never compressed.
void refuse(httplib::Response& res, int status, std::string_view why) {
  Reply r = refusal(status, why);
  res.status = r.status;
  put(res, std::move(r.body), "application/json", Coding::identity);
}

/// A file of the page: by its content's name kept for good, by its own
/// name asked again each time (answered 304 while it is the same), in the
/// coding the browser takes of those built in.
void send_asset(const httplib::Request& req, httplib::Response& res, const AssetMatch& m) {
  const Asset& a = *m.asset;
  res.set_header("ETag", std::string(a.etag));
  res.set_header("Cache-Control", m.immutable ? "public, max-age=31536000, immutable" : "no-cache");
  const std::string seen = req.get_header_value("If-None-Match");
  if (!seen.empty() && (seen == "*" || seen.find(a.etag) != std::string::npos)) {
    res.status = 304;
    res.set_header("Vary", "Accept-Encoding");
    return;
  }
  const Coding coding = pick_coding(req.get_header_value("Accept-Encoding"), !a.br.empty(), !a.gzip.empty());
  put_view(res, coding == Coding::br ? a.br : coding == Coding::gzip ? a.gzip : a.body, a.type, coding);
}

/// The query parameter `name` (the first), or "".
std::string param(const httplib::Request& req, const char* name) {
  return req.has_param(name) ? req.get_param_value(name) : std::string();
}

std::string host_for_url(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

} // namespace

bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

Result<std::string> random_token() { return platform::random_hex(16, "a token"); }

struct Server::Impl {
  explicit Impl(ServeOptions o)
      : options(std::move(o)), api(options.root, options.cache_bytes, options.index_store, [this] { built_one(); }) {}

  ServeOptions options;
  // Before the API: its indexes' builders may tell `wake` until they are stopped.
  std::mutex mutex;
  std::condition_variable wake;
  std::uint64_t built = 0; // indexes whole since the start (under `mutex`)
  Api api;
  EventsApi run_events{api};
  httplib::Server http;
  int port = 0;
  std::atomic<std::size_t> streams{0};
  std::atomic<bool> stopping{false};

  /// An index built in the background is whole: the live pages' streams look now.
  void built_one() {
    {
      std::lock_guard lock(mutex);
      ++built;
    }
    wake.notify_all();
  }

  [[nodiscard]] std::string cookie_name() const { return "chorus_token_" + std::to_string(port); }

  /// Whether the request may be answered; where not, `res` says why.
  bool allowed(const httplib::Request& req, httplib::Response& res) {
    if (!options.token.empty()) {
      const std::string given = param(req, "token");
      if (!given.empty() && same_token(given, options.token)) {
        // The page's later requests carry it as a cookie, never in their address.
        res.set_header("Set-Cookie", cookie_name() + "=" + options.token + "; Path=/; HttpOnly; SameSite=Strict");
        return true;
      }
      if (same_token(cookie(req, cookie_name()), options.token)) return true;
      refuse(res, 401,
             "this chorus serve asks for its token: open the address it printed when it started "
             "(http://HOST:PORT/?token=...)");
      return false;
    }
    // Without a token the server listens on loopback only; a page of another
    // site that reaches it under its own name (DNS rebinding) is turned away.
    if (!req.has_header("Host")) return true;
    std::string host = req.get_header_value("Host");
    if (const std::size_t colon = host.rfind(':'); colon != std::string::npos && host.find(']', colon) == std::string::npos)
      host.resize(colon);
    if (host == "localhost" || host == "127.0.0.1" || host == "[::1]" || host == options.host ||
        host == host_for_url(options.host))
      return true;
    refuse(res, 403, "Host '" + host + "' is not this server's: open it as http://127.0.0.1:" + std::to_string(port) + "/");
    return false;
  }

  void routes() {
    // SO_REUSEADDR only: a restart binds at once, but a port another server
    // listens on is refused (cpp-httplib's default, SO_REUSEPORT, would share it).
    http.set_socket_options([](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    // TCP_NODELAY, which the connections it accepts inherit: cpp-httplib
    // writes an answer's headers and body apart, and Nagle's algorithm held
    // the body of every answer after the first on a kept-alive connection
    // until the browser's delayed ACK, about 40 ms (BENCHMARKS.md, bench_serve).
    http.set_tcp_nodelay(true);
    http.set_payload_max_length(max_body_bytes);
    http.set_keep_alive_max_count(100);
    http.set_read_timeout(10, 0);
    http.set_write_timeout(10, 0);
    const std::size_t threads = options.max_streams + 16;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_header("X-Frame-Options", "DENY");
      res.set_header("Referrer-Policy", "no-referrer");
      res.set_header("Content-Security-Policy",
                     "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                     "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'");
      if (req.method != "GET" && req.method != "HEAD") {
        res.set_header("Allow", "GET, HEAD");
        refuse(res, 405, "chorus serve only reads: GET requests only");
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!allowed(req, res)) return httplib::Server::HandlerResponse::Handled;
      if (req.path.starts_with("/api/")) res.set_header("Cache-Control", "no-store");
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      // An answer already made (a refusal is one) stands; only cpp-httplib's own bare statuses get a why.
      if (!res.body.empty() || res.has_header("Content-Type")) return;
      const char* why = res.status == 404   ? "no such page or endpoint"
                        : res.status == 413 ? "the request is too large"
                        : res.status == 414 ? "the request's address is too long"
                        : res.status == 400 ? "a malformed request"
                                            : "the request was refused";
      refuse(res, res.status, why);
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string why = "an internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        why += std::string(": ") + e.what();
      } catch (...) {
      }
      refuse(res, 500, why);
    });

    http.Get("/api/runs", [this](const httplib::Request& req, httplib::Response& res) { send(req, res, api.runs()); });
    http.Get("/api/runs/stream", [this](const httplib::Request& req, httplib::Response& res) { runs_stream(req, res); });
    http.Get("/api/run", [this](const httplib::Request& req, httplib::Response& res) {
      send(req, res, api.run(param(req, "run")));
    });
    http.Get("/api/group", [this](const httplib::Request& req, httplib::Response& res) {
      send(req, res, api.group(param(req, "group")));
    });
    http.Get("/api/series", [this](const httplib::Request& req, httplib::Response& res) { series(req, res); });
    http.Get("/api/histograms", [this](const httplib::Request& req, httplib::Response& res) { histograms(req, res); });
    http.Get("/api/artifact", [this](const httplib::Request& req, httplib::Response& res) { artifact(req, res); });
    http.Get("/api/media", [this](const httplib::Request& req, httplib::Response& res) { media(req, res); });
    http.Get("/api/media/file", [this](const httplib::Request& req, httplib::Response& res) { media_file(req, res); });
    http.Get("/api/run/events", [this](const httplib::Request& req, httplib::Response& res) {
      send(req, res, run_events.events(param(req, "run"), param(req, "after")));
    });
    http.Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) { events(req, res); });
    http.Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
      std::string body = "{\"root\":";
      core::append_json_string(body, options.root);
      body += ",\"streams\":" + std::to_string(streams.load()) + ",\"cached_bytes\":" +
              std::to_string(api.cached_bytes() + run_events.cached_bytes()) + ",\"token\":" + (options.token.empty() ? "false" : "true") + "}";
      put(res, std::move(body), "application/json", Coding::identity);
    });
    http.Get(R"(/[A-Za-z0-9_.\-]*)", [](const httplib::Request& req, httplib::Response& res) {
      const AssetMatch a = find_asset(req.path);
      if (!a) return refuse(res, 404, "no such page: the dashboard is at /");
      send_asset(req, res, a);
    });
  }

  void series(const httplib::Request& req, httplib::Response& res) {
    SeriesRequest r;
    const std::string file = param(req, "file");
    if (!file.empty() && file != "history" && file != "system") return refuse(res, 400, "file is history or system");
    const std::size_t keys = req.get_param_value_count("key");
    if (keys == 0) return refuse(res, 400, "no key: ask for one or more with key=KEY");
    if (keys > max_keys) return refuse(res, 400, "more than " + std::to_string(max_keys) + " keys in one request");
    for (std::size_t i = 0; i < keys; ++i) r.keys.push_back(req.get_param_value("key", i));
    if (const std::string x = param(req, "x"); !x.empty()) {
      const std::optional<XAxis> axis = parse_x_axis(x);
      if (!axis) return refuse(res, 400, "x is step, wall or rel");
      r.x = *axis;
    }
    for (const auto& [name, into] : {std::pair{"from", &r.from}, std::pair{"to", &r.to}})
      if (const std::string v = param(req, name); !v.empty()) {
        *into = parse_double(v);
        if (!*into) return refuse(res, 400, std::string(name) + " is a number");
      }
    if (const std::string w = param(req, "width"); !w.empty()) {
      const std::optional<std::int64_t> width = parse_int(w, 1, 8192);
      if (!width) return refuse(res, 400, "width is a whole number of pixels from 1 to 8192");
      r.width = static_cast<std::size_t>(*width);
    }
    // x by a key's values (a declared step metric): it takes x's place.
    r.x_key = param(req, "xkey");
    // While the history is indexed: every line read for these keys, not the overview.
    if (const std::string e = param(req, "exact"); !e.empty()) {
      if (e != "0" && e != "1") return refuse(res, 400, "exact is 0 or 1");
      r.exact = e == "1";
    }
    send(req, res, api.series(param(req, "run"), file == "system" ? FileKind::system : FileKind::history, r));
  }

  void histograms(const httplib::Request& req, httplib::Response& res) {
    HistogramRequest r;
    r.column = param(req, "column");
    if (r.column.empty()) return refuse(res, 400, "no column: ask for one with column=COLUMN (key, or key/rank-N)");
    if (const std::string v = param(req, "step"); !v.empty()) {
      r.step = parse_int(v, 0, INT64_MAX);
      if (!r.step) return refuse(res, 400, "step is a whole number of 0 or more");
    }
    for (const auto& [name, into, least, most] : {std::tuple{"points", &r.points, 0, max_histogram_points},
                                                 std::tuple{"bins", &r.bins, 1, max_histogram_bins}})
      if (const std::string v = param(req, name); !v.empty()) {
        const std::optional<std::int64_t> n = parse_int(v, least, most);
        if (!n)
          return refuse(res, 400, std::string(name) + " is a whole number from " + std::to_string(least) + " to " +
                                      std::to_string(most));
        *into = static_cast<std::size_t>(*n);
      }
    send(req, res, api.histograms(param(req, "run"), r));
  }

  void artifact(const httplib::Request& req, httplib::Response& res) {
    const std::string name = param(req, "name");
    const Resolved where = api.resolve_artifact(param(req, "run"), name);
    if (!where) return refuse(res, where.status, where.why);
    if (!send_file(req, res, where.dir, "application/octet-stream", false)) return;
    std::string base = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
    res.set_header("Content-Disposition", "attachment; filename=\"" + base + "\"");
  }

  void media(const httplib::Request& req, httplib::Response& res) {
    std::optional<std::int64_t> step;
    if (const std::string v = param(req, "step"); !v.empty()) {
      step = parse_int(v, 0, INT64_MAX);
      if (!step) return refuse(res, 400, "step is a whole number of 0 or more");
    }
    send(req, res, api.media(param(req, "run"), param(req, "key"), step));
  }

  /// A media file, named by its key, step and rank: only one that a line of media.jsonl names.
  void media_file(const httplib::Request& req, httplib::Response& res) {
    const std::string key = param(req, "key");
    if (key.empty()) return refuse(res, 400, "no key: name the media with key=KEY&step=S&rank=R");
    const std::optional<std::int64_t> step = parse_int(param(req, "step"), 0, INT64_MAX);
    const std::optional<std::int64_t> rank = parse_int(param(req, "rank"), 0, INT32_MAX);
    if (!step || !rank) return refuse(res, 400, "step and rank are whole numbers of 0 or more");
    std::string_view type;
    const Resolved where = api.resolve_media(param(req, "run"), key, *step, static_cast<int>(*rank), type);
    if (!where) return refuse(res, where.status, where.why);
    // Text and tables whole, so that they are compressed as every answer is; images streamed as they are.
    send_file(req, res, where.dir, std::string(type), !type.starts_with("image/"));
  }

  /// The regular file at `path` as the answer: `whole` (and at most
  /// max_whole_bytes), read into the body; else read a piece at a time, so
  /// that a file of any size goes out in bounded memory. False, with a
  /// refusal in `res`, where it cannot be read.
  static bool send_file(const httplib::Request& req, httplib::Response& res, const std::string& path,
                        const std::string& type, bool whole) {
    const Result<int> fd = platform::open_regular(path, O_RDONLY);
    if (!fd) {
      refuse(res, 404, fd.error().message());
      return false;
    }
    struct stat st {};
    if (::fstat(*fd, &st) != 0) {
      const int e = errno;
      platform::close_fd(*fd);
      refuse(res, 500, std::string("cannot read the file: ") + std::strerror(e));
      return false;
    }
    const auto size = static_cast<std::size_t>(st.st_size);
    if (whole && size <= max_whole_bytes) {
      std::string body(size, '\0');
      std::size_t got = 0;
      while (got < size) {
        const ssize_t n = ::pread(*fd, body.data() + got, size - got, static_cast<off_t>(got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
      }
      platform::close_fd(*fd);
      body.resize(got);
      put_answer(req, res, std::move(body), type);
      return true;
    }
    const auto file = std::make_shared<int>(*fd);
    res.set_content_provider(
        size, type,
        [file](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
          char buf[1 << 16];
          const ssize_t n = ::pread(*file, buf, std::min(length, sizeof buf), static_cast<off_t>(offset));
          if (n <= 0) return false;
          return sink.write(buf, static_cast<std::size_t>(n));
        },
        [file](bool) { platform::close_fd(*file); });
    return true;
  }

  /// A stream of server-sent events for a page showing the runs list: a
  /// `changed` event whenever GET /api/runs would answer anything new (a new
  /// run, a run's state or summary, a running run's progress; Api::runs_stamp),
  /// looked at every poll_every. The page reads the list again then; while
  /// nothing changes, it costs the page nothing and the server one look at
  /// the runs' files a poll.
  void runs_stream(const httplib::Request& req, httplib::Response& res) {
    if (!take_stream(res)) return;
    // What the page read with its list (`version` of GET /api/runs), else what is now.
    std::string since = param(req, "since");
    if (since.empty()) since = runs_version(api.runs_stamp());
    auto told = std::make_shared<std::string>(std::move(since));
    auto stream = std::make_shared<Stream>(*this);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, told, stream](std::size_t, httplib::DataSink& sink) {
          std::string out;
          if (std::string now = runs_version(api.runs_stamp()); now != *told) {
            *told = std::move(now);
            out += "event: changed\ndata: {}\n\n";
          }
          return stream_write(sink, out, *stream);
        },
        [this](bool) { --streams; });
  }

  /// One more live page, or a refusal (503) where there are too many.
  bool take_stream(httplib::Response& res) {
    if (++streams > options.max_streams) {
      --streams;
      refuse(res, 503, "too many live pages at once (" + std::to_string(options.max_streams) +
                           "): close some, or reload later");
      return false;
    }
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Accel-Buffering", "no");
    return true;
  }

  /// Where a stream of server-sent events stands.
  struct Stream {
    explicit Stream(Impl& server) {
      std::lock_guard lock(server.mutex);
      seen = server.built;
    }
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
    bool first = true;
    std::uint64_t seen = 0; // the indexes whole when it last looked
  };

  /// Writes `out` to a stream (a comment line instead, where nothing was
  /// written for ping_every; the retry time first), then waits poll_every,
  /// or until an index is whole, or the server stops. False where the page is gone.
  bool stream_write(httplib::DataSink& sink, std::string& out, Stream& stream) {
    const auto now = std::chrono::steady_clock::now();
    if (stream.first) out.insert(0, "retry: 1000\n\n");
    stream.first = false;
    if (out.empty() && now - stream.last_write >= ping_every) out = ": ping\n\n";
    if (!out.empty()) {
      if (!sink.write(out.data(), out.size())) return false;
      stream.last_write = now;
    }
    std::unique_lock lock(mutex);
    wake.wait_for(lock, poll_every, [&] { return stopping.load() || built != stream.seen; });
    stream.seen = built;
    if (stopping) sink.done();
    return true;
  }

  void events(const httplib::Request& req, httplib::Response& res) {
    const std::size_t n = req.get_param_value_count("run");
    if (n == 0) return refuse(res, 400, "no run: follow one or more with run=PATH");
    if (n > max_stream_runs) return refuse(res, 400, "one stream follows at most " + std::to_string(max_stream_runs) + " runs");
    auto runs = std::make_shared<std::vector<std::pair<std::string, Seen>>>();
    for (std::size_t i = 0; i < n; ++i) {
      const std::string rel = req.get_param_value("run", i);
      if (const Resolved where = api.resolve_run(rel); !where) return refuse(res, where.status, where.why);
      runs->emplace_back(rel, Seen{});
    }
    if (!take_stream(res)) return;
    auto stream = std::make_shared<Stream>(*this);
    auto told = std::make_shared<std::vector<EventsSeen>>(runs->size()); // of each run's events.jsonl
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, runs, stream, told](std::size_t, httplib::DataSink& sink) {
          std::string out;
          for (std::size_t i = 0; i < runs->size(); ++i)
            out += api.changes((*runs)[i].first, (*runs)[i].second) + run_events.changes((*runs)[i].first, (*told)[i]);
          return stream_write(sink, out, *stream);
        },
        [this](bool) { --streams; });
  }
};

Server::Server(ServeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) { impl_->routes(); }
Server::~Server() = default;

Error Server::bind() {
  const ServeOptions& o = impl_->options;
  addrinfo hints{}, *found = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (const int e = ::getaddrinfo(o.host.c_str(), nullptr, &hints, &found); e != 0)
    return invalid("cannot listen on host '" + o.host + "': " + ::gai_strerror(e) +
                   "; give --host an address of this machine (127.0.0.1, the default, or 0.0.0.0 for all)");
  ::freeaddrinfo(found);
  errno = 0;
  int port = o.port;
  bool ok = true;
  if (o.port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    ok = port > 0;
  } else {
    ok = impl_->http.bind_to_port(o.host, o.port);
  }
  if (ok) {
    impl_->port = port;
    return {};
  }
  const int e = errno;
  const std::string where = host_for_url(o.host) + ":" + std::to_string(o.port);
  if (e == EADDRINUSE)
    return Error(Errc::address_in_use, "port " + std::to_string(o.port) + " on " + o.host +
                                           " is in use (another chorus serve, or another server): give another with "
                                           "--port P, or --port 0 for any free one");
  if (e == EACCES)
    return Error(Errc::address_in_use, "cannot listen on " + where + ": permission denied (ports below 1024 need "
                                                                     "privileges); give --port 1024 or above");
  if (e == EADDRNOTAVAIL)
    return Error(Errc::address_in_use, "cannot listen on " + where + ": " + o.host +
                                           " is not an address of this machine; give --host one of its addresses");
  return Error(Errc::address_in_use, "cannot listen on " + where + (e != 0 ? std::string(": ") + std::strerror(e) : "") +
                                         "; give another --host or --port");
}

int Server::port() const { return impl_->port; }

std::string Server::url() const {
  const ServeOptions& o = impl_->options;
  // Listening on every address: the machine's name is the one to give others.
  std::string host = o.host;
  if (host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    host = ::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0' ? name : "127.0.0.1";
  }
  std::string url = "http://" + host_for_url(host) + ":" + std::to_string(impl_->port) + "/";
  if (!o.token.empty()) url += "?token=" + o.token;
  return url;
}

Error Server::run() {
  // The runs are listed once while the first page is still on its way, so
  // that its list (`/api/runs`) is answered from what is already read:
  // every run.json and summary.json once, a stat each after.
  std::thread warm([this] { (void)impl_->api.runs(); });
  const bool listened = impl_->http.listen_after_bind();
  warm.join();
  if (!listened && !impl_->stopping)
    return Error(Errc::io_error, "the server stopped listening on port " + std::to_string(impl_->port));
  return {};
}

void Server::stop() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  impl_->http.stop();
}

} // namespace chorus::cli::serve
