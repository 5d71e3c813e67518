// How `chorus serve` sends what it sends: the content coding each client
// gets (Accept-Encoding; none to this machine), the page's files compressed
// at build time and named by their content (kept by a browser for good, 304
// when asked again), and the runs list's event stream, which tells a page of
// a new run and says nothing while nothing changes.
#define BOOST_TEST_MODULE cli_serve_transfer
#include <boost/test/unit_test.hpp>

#include "cli/serve/encoding.hpp"
#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"
#include "tests/cli/serve_client.hpp"

#include <brotli/decode.h>
#include <httplib.h>
#include <zlib.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <thread>

using namespace chorus::test;
using chorus::cli::serve::Coding;
namespace serve = chorus::cli::serve;
namespace fs = std::filesystem;

namespace {

std::string gunzip(const std::string& in) {
  z_stream z{};
  BOOST_TEST_REQUIRE(inflateInit2(&z, 31) == Z_OK);
  std::string out;
  char buf[1 << 16];
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
  }
  inflateEnd(&z);
  BOOST_TEST_REQUIRE(rc == Z_STREAM_END, "not a whole gzip stream");
  return out;
}

std::string unbrotli(const std::string& in) {
  BrotliDecoderState* s = BrotliDecoderCreateInstance(nullptr, nullptr, nullptr);
  std::string out;
  const auto* next_in = reinterpret_cast<const std::uint8_t*>(in.data());
  std::size_t avail_in = in.size();
  BrotliDecoderResult rc = BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT;
  while (rc == BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT) {
    std::uint8_t buf[1 << 16];
    std::uint8_t* next_out = buf;
    std::size_t avail_out = sizeof buf;
    rc = BrotliDecoderDecompressStream(s, &avail_in, &next_in, &avail_out, &next_out, nullptr);
    out.append(reinterpret_cast<char*>(buf), sizeof buf - avail_out);
  }
  BrotliDecoderDestroyInstance(s);
  BOOST_TEST_REQUIRE(rc == BROTLI_DECODER_RESULT_SUCCESS, "not a whole Brotli stream");
  return out;
}

/// An answer as it came over the wire: nothing decoded.
struct Raw {
  int status = -1;
  std::string body, encoding, cache, etag, vary;
};

Raw raw_get(const std::string& host, int port, const std::string& path, const httplib::Headers& headers) {
  httplib::Client c(host, port);
  c.set_decompress(false);
  c.set_read_timeout(60, 0);
  const httplib::Result r = c.Get(path, headers);
  BOOST_TEST_REQUIRE(static_cast<bool>(r), "no answer to " << path << ": " << httplib::to_string(r.error()));
  return {r->status, r->body, r->get_header_value("Content-Encoding"), r->get_header_value("Cache-Control"),
          r->get_header_value("ETag"), r->get_header_value("Vary")};
}

std::string decoded(const Raw& r) {
  if (r.encoding == "br") return unbrotli(r.body);
  if (r.encoding == "gzip") return gunzip(r.body);
  BOOST_TEST_REQUIRE(r.encoding.empty(), "an unknown coding: " << r.encoding);
  return r.body;
}

const httplib::Headers browser{{"Accept-Encoding", "gzip, deflate, br"}};

/// An IPv4 address of this machine that is not loopback, or "".
std::string outside_address() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return {};
  std::string found;
  for (ifaddrs* i = all; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr) found = text;
  }
  ::freeifaddrs(all);
  return found;
}

/// The runs list's stream read until `done` says so of what came, or for
/// `limit` (then `done` was not met; the stream's pings keep it from ever
/// going silent).
std::string runs_stream(const Serve& s, const std::string& since, std::chrono::seconds limit,
                        const std::function<bool(const std::string&)>& done, const std::function<void()>& then = {}) {
  httplib::Client c = s.client();
  c.set_read_timeout(limit.count(), 0);
  const auto until = std::chrono::steady_clock::now() + limit;
  std::string seen;
  bool started = false;
  c.Get("/api/runs/stream?since=" + since, [&](const char* data, std::size_t n) {
    seen.append(data, n);
    if (!started && then) {
      started = true;
      then();
    }
    return !done(seen) && std::chrono::steady_clock::now() < until;
  });
  return seen;
}

/// Whether what a runs stream sent holds a `changed` event.
bool told_changed(const std::string& seen) { return seen.find("event: changed") != std::string::npos; }

std::string version_of(const Serve& s) {
  const auto [status, body] = s.get("/api/runs");
  BOOST_TEST_REQUIRE(status == 200, body);
  return std::string(std::string_view(Json(body)["version"]));
}

} // namespace

BOOST_AUTO_TEST_CASE(the_coding_follows_accept_encoding_and_where_the_client_is) {
  using serve::accepts;
  using serve::answer_coding;
  using serve::pick_coding;
  BOOST_TEST((pick_coding("gzip, deflate, br") == Coding::br));
  BOOST_TEST((pick_coding("gzip, deflate") == Coding::gzip));
  BOOST_TEST((pick_coding("br;q=0, gzip") == Coding::gzip));
  BOOST_TEST((pick_coding("GZIP;Q=0.5") == Coding::gzip));
  BOOST_TEST((pick_coding("x-gzip") == Coding::gzip));
  BOOST_TEST((pick_coding("*") == Coding::br));
  BOOST_TEST((pick_coding("*;q=0") == Coding::identity));
  BOOST_TEST((pick_coding("br;q=nonsense") == Coding::identity));
  BOOST_TEST((pick_coding("identity") == Coding::identity));
  BOOST_TEST((pick_coding("") == Coding::identity));
  BOOST_TEST((pick_coding("gzip, br", false, true) == Coding::gzip)); // a file with no smaller Brotli form
  BOOST_TEST(!accepts("identity;q=0", Coding::identity));
  BOOST_TEST(accepts("gzip", Coding::identity));
  // Per-request answers: none to this machine or when small; else the client's best.
  BOOST_TEST((answer_coding("gzip, deflate, br", true, 1 << 20) == Coding::identity));
  BOOST_TEST((answer_coding("gzip, deflate, br", false, 100) == Coding::identity));
  BOOST_TEST((answer_coding("gzip, deflate, br", false, 1 << 20) == Coding::br));
  BOOST_TEST((answer_coding("gzip, deflate", false, 1 << 20) == Coding::gzip));
  // What is compressed decodes to what was given.
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "{\"x\":" + std::to_string(i) + ",\"y\":" + std::to_string(i * 0.37) + "},";
  for (const Coding c : {Coding::gzip, Coding::br}) {
    const std::string packed = serve::compress(text, c, serve::answer_level(c));
    BOOST_TEST(packed.size() < text.size() / 2);
    BOOST_TEST((c == Coding::br ? unbrotli(packed) : gunzip(packed)) == text);
  }
}

BOOST_AUTO_TEST_CASE(the_page_comes_compressed_and_its_files_are_named_by_their_content) {
  TempDir root;
  Serve s(root.path, {"--no-token"});
  const Raw page = raw_get("127.0.0.1", s.port, "/", browser);
  BOOST_TEST(page.status == 200);
  BOOST_TEST(page.encoding == "br");
  BOOST_TEST(page.cache == "no-cache");
  BOOST_TEST(!page.etag.empty());
  const std::string html = decoded(page);
  // The page names its script by a name that carries the script's hash.
  std::smatch m;
  BOOST_TEST_REQUIRE(std::regex_search(html, m, std::regex(R"re(src="(app\.[0-9a-f]{12}\.js)")re")), html);
  const std::string hashed = "/" + m[1].str();
  BOOST_TEST(html.find("\"app.js\"") == std::string::npos);
  const Raw script = raw_get("127.0.0.1", s.port, hashed, browser);
  BOOST_TEST(script.status == 200);
  BOOST_TEST(script.encoding == "br");
  BOOST_TEST(script.cache.find("immutable") != std::string::npos);
  BOOST_TEST(script.cache.find("max-age=31536000") != std::string::npos);
  BOOST_TEST(script.vary == "Accept-Encoding");
  // The same file by its own name, in every coding, is the same text.
  const Raw plain = raw_get("127.0.0.1", s.port, "/app.js", {});
  BOOST_TEST(plain.encoding == "");
  BOOST_TEST(plain.cache == "no-cache");
  BOOST_TEST(plain.body.find("function runsPage") != std::string::npos);
  BOOST_TEST(decoded(script) == plain.body);
  const Raw gz = raw_get("127.0.0.1", s.port, hashed, {{"Accept-Encoding", "gzip"}});
  BOOST_TEST(gz.encoding == "gzip");
  BOOST_TEST(decoded(gz) == plain.body);
  BOOST_TEST(gz.body.size() < plain.body.size() / 2);
  // Asked again with what it has: not sent again.
  const Raw again = raw_get("127.0.0.1", s.port, "/", {{"Accept-Encoding", "br"}, {"If-None-Match", page.etag}});
  BOOST_TEST(again.status == 304);
  BOOST_TEST(again.body.empty());
  const Raw changed = raw_get("127.0.0.1", s.port, "/", {{"If-None-Match", "\"000000000000\""}});
  BOOST_TEST(changed.status == 200);
  BOOST_TEST(decoded(changed) == html);
}

BOOST_AUTO_TEST_CASE(answers_go_as_they_are_to_this_machine_and_cheaply_compressed_elsewhere) {
  TempDir root;
  for (int i = 0; i < 40; ++i) make_run(root.path, "proj", "grp", {.id = "run" + std::to_string(i)});
  const std::string outside = outside_address();
  // Elsewhere means another address: serve listens on every one, with its token.
  Serve s(root.path, {"--host", "0.0.0.0"});
  const httplib::Headers cookie = s.auth();
  httplib::Headers asked = browser;
  asked.insert(cookie.begin(), cookie.end());
  const Raw here = raw_get("127.0.0.1", s.port, "/api/runs", asked);
  BOOST_TEST(here.status == 200);
  BOOST_TEST(here.encoding == "");
  BOOST_TEST(here.body.size() > 4096u);
  BOOST_TEST(Json(here.body)["count"].get_uint64().value() == 40u);
  if (outside.empty()) {
    BOOST_TEST_MESSAGE("this machine has no address but loopback: the answer to another machine is not tried");
    return;
  }
  const Raw there = raw_get(outside, s.port, "/api/runs", asked);
  BOOST_TEST(there.status == 200);
  BOOST_TEST(there.encoding == "br");
  BOOST_TEST(there.body.size() < here.body.size() / 2);
  BOOST_TEST(Json(decoded(there))["count"].get_uint64().value() == 40u);
  httplib::Headers gzip_only{{"Accept-Encoding", "gzip"}};
  gzip_only.insert(cookie.begin(), cookie.end());
  const Raw gz = raw_get(outside, s.port, "/api/runs", gzip_only);
  BOOST_TEST(gz.encoding == "gzip");
  BOOST_TEST(Json(decoded(gz))["count"].get_uint64().value() == 40u);
  // A small answer (a refusal) goes as it is.
  const Raw refused = raw_get(outside, s.port, "/api/run?run=proj/grp/none", asked);
  BOOST_TEST(refused.status == 404);
  BOOST_TEST(refused.encoding == "");
}

BOOST_AUTO_TEST_CASE(the_runs_stream_tells_of_a_new_run_and_is_silent_while_nothing_changes) {
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "old"});
  Serve s(root.path);
  const std::string version = version_of(s);
  // Nothing changes: no event (the stream is read for 3 s).
  const std::string quiet = runs_stream(s, version, std::chrono::seconds(3), told_changed);
  BOOST_TEST(!told_changed(quiet), quiet);
  BOOST_TEST(quiet.find("retry:") != std::string::npos, quiet);
  // A new run: told, and then in the list, with a new version.
  std::thread maker;
  const std::string told = runs_stream(s, version, std::chrono::seconds(30), told_changed, [&] {
    maker = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      make_run(root.path, "proj", "grp2", {.id = "new", .state = "running", .ended = false});
    });
  });
  if (maker.joinable()) maker.join();
  BOOST_TEST(told_changed(told), told);
  const auto [status, body] = s.get("/api/runs");
  BOOST_TEST(body.find("\"new\"") != std::string::npos);
  BOOST_TEST(version_of(s) != version);
  // A page whose list is older than the stream is told at once.
  const std::string stale = runs_stream(s, version, std::chrono::seconds(30), told_changed);
  BOOST_TEST(told_changed(stale), stale);
}

// Each change below the root a list shows, told however the runs' directories
// are followed (watched on a local filesystem; looked at elsewhere), and
// nothing told while nothing changes.
BOOST_AUTO_TEST_CASE(the_runs_stream_tells_of_each_change_below_the_root) {
  TempDir root;
  const fs::path old_run = make_run(root.path, "proj", "grp", {.id = "old"});
  make_run(root.path, "proj", "grp", {.id = "gone"});
  Serve s(root.path);
  const auto told_of = [&](const char* what, const std::function<void()>& change) {
    const std::string since = version_of(s);
    // Settled first: nothing for 2 s, then the change.
    const std::string quiet = runs_stream(s, since, std::chrono::seconds(2), told_changed);
    BOOST_TEST(!told_changed(quiet), what << ", before: " << quiet);
    std::thread maker;
    const std::string told = runs_stream(s, since, std::chrono::seconds(30), told_changed, [&] {
      maker = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        change();
      });
    });
    if (maker.joinable()) maker.join();
    BOOST_TEST(told_changed(told), what << ": " << told);
    BOOST_TEST(version_of(s) != since, what);
  };
  // A new run in a group that is there already (its group's directory changes).
  told_of("a run in a known group", [&] { make_run(root.path, "proj", "grp", {.id = "new"}); });
  // A run's run.json replaced by rename, as its host writes it: its own directory changes.
  told_of("a run's state", [&] {
    RunSpec r{.id = "old", .state = "failed"};
    write_text(old_run / "run.json.tmp", run_json(r, old_run));
    fs::rename(old_run / "run.json.tmp", old_run / "run.json");
  });
  // A run removed.
  told_of("a run removed", [&] { fs::remove_all(root.path / "proj" / "grp" / "gone"); });
  const auto [status, body] = s.get("/api/runs");
  BOOST_TEST(body.find("\"gone\"") == std::string::npos, body);
  BOOST_TEST(body.find("\"failed\"") != std::string::npos, body);
}

// The list's answer stands while nothing below the root changes; anything
// that does is in the next answer at once: a summary written in place (no
// rename), a run renamed. (A run made readable to the user serve runs as:
// serve_test, served_as_root_another_users_private_run_is_not_shown.)
BOOST_AUTO_TEST_CASE(the_runs_list_is_answered_afresh_after_any_change) {
  TempDir root;
  const fs::path run = make_run(root.path, "proj", "grp", {.id = "r1"});
  write_text(run / "summary.json", R"({"loss":0.5})");
  Serve s(root.path);
  const auto list = [&] {
    const auto [status, body] = s.get("/api/runs");
    BOOST_TEST_REQUIRE(status == 200, body);
    return body;
  };
  const std::string first = list();
  BOOST_TEST(first.find(R"("loss":0.5)") != std::string::npos, first);
  BOOST_TEST(list() == first); // nothing changed: the same answer
  // In place: the file's content, not its directory's.
  {
    std::ofstream f(run / "summary.json", std::ios::trunc);
    f << R"({"loss":0.125})";
  }
  const std::string edited = list();
  BOOST_TEST(edited.find(R"("loss":0.125)") != std::string::npos, edited);
  fs::rename(run, root.path / "proj" / "grp" / "r2");
  const std::string renamed = list();
  BOOST_TEST(renamed.find("proj/grp/r2") != std::string::npos, renamed);
  BOOST_TEST(renamed.find("proj/grp/r1") == std::string::npos, renamed);
}
