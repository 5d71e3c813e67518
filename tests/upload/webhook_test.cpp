// The webhook target (io/upload/webhook.cpp; docs/UPLOADS.md, "Webhooks"):
// each event of events.jsonl POSTed once, in order, with its line's fields
// and a `text`, against a webhook server in the test (cpp-httplib, plain and
// HTTPS with a throwaway CA), through 5xx, 429 with Retry-After, refusals, a
// damaged line, restarts and `chorus sync`; and the URL's path, its secret,
// in no message and no file of the run directory.
#define BOOST_TEST_MODULE upload_webhook
#include "io/store/event_log.hpp"
#include "io/upload/upload.hpp"
#include "tests/cli/process.hpp"
#include "tests/e2e/harness.hpp"
#include "tests/temp_dir.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/tracking_server.hpp"
#include "tests/upload/uploading.hpp"

#include <boost/test/unit_test.hpp>

#include <httplib.h>
#include <simdjson.h>

#include <cstdio>
#include <deque>
#include <fcntl.h>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace chorus::test {
namespace {

namespace fs = std::filesystem;

// The webhook's secret, as Slack's are made (/services/TEAM/BOT/TOKEN).
constexpr const char* secret_token = "Xq7hJ2mPzW9kR4vB8nC3dF6s";
const std::string secret_path = std::string("/services/T0CHORUS1/B0CHORUS2/") + secret_token;

/// What the server answers a POST instead of 200.
struct Scripted {
  int status = 200;
  std::string retry_after; // a Retry-After header, "" for none
  std::string body;
};

/// A POST as received, and the status it got.
struct Received {
  std::string path;   // path and query, as sent
  std::string content_type;
  std::string idempotency_key;
  std::string body;
  int remote_port = -1; // the client's end of the connection (the same: a kept-alive one)
  int status = 0;
};

/// An incoming-webhook server on 127.0.0.1 (HTTPS with `tls`): every POST
/// to any path gets 200 "ok" (as Slack's and Mattermost's answer), or the
/// next scripted answer. A 404 echoes the path it was asked for in its body,
/// as some servers do, so that the target's errors are seen to cut it out.
class WebhookServer {
public:
  explicit WebhookServer(const std::optional<TlsFiles>& tls = std::nullopt) {
    if (tls) server_ = std::make_unique<httplib::SSLServer>(tls->cert.c_str(), tls->key.c_str());
    else server_ = std::make_unique<httplib::Server>();
    server_->Post(".*", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lock(mu_);
      Scripted a;
      if (!script_.empty()) {
        a = script_.front();
        script_.pop_front();
      }
      res.status = a.status;
      if (!a.retry_after.empty()) res.set_header("Retry-After", a.retry_after);
      std::string body = a.body;
      if (a.status == 404 && body.empty()) body = "No webhook at " + req.target;
      res.set_content(a.status == 200 && body.empty() ? "ok" : body, "text/plain");
      received_.push_back({req.target, req.get_header_value("Content-Type"), req.get_header_value("Idempotency-Key"),
                           req.body, req.remote_port, a.status});
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    BOOST_REQUIRE_MESSAGE(port_ > 0, "the webhook server cannot listen on 127.0.0.1");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  ~WebhookServer() {
    server_->stop();
    thread_.join();
  }

  [[nodiscard]] int port() const { return port_; }
  void script(std::vector<Scripted> answers) {
    std::lock_guard lock(mu_);
    script_.insert(script_.end(), answers.begin(), answers.end());
  }
  [[nodiscard]] std::vector<Received> received() const {
    std::lock_guard lock(mu_);
    return received_;
  }
  /// The bodies answered 2xx, in order.
  [[nodiscard]] std::vector<std::string> delivered() const {
    std::vector<std::string> out;
    for (const Received& r : received())
      if (r.status / 100 == 2) out.push_back(r.body);
    return out;
  }

private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = -1;
  mutable std::mutex mu_;
  std::deque<Scripted> script_;
  std::vector<Received> received_;
};

std::string hook_url(const WebhookServer& s, const std::string& scheme = "webhook+http") {
  return scheme + "://127.0.0.1:" + std::to_string(s.port()) + secret_path;
}

/// The event of seq `seq`: a stalled rank, a NaN, a threshold, in turn.
chorus::core::EventDraft draft(std::uint64_t seq) {
  chorus::core::EventDraft d;
  d.ts_us = 1'700'000'000'250'000 + static_cast<std::int64_t>(seq) * 1'000'000;
  d.step = 12 + static_cast<std::int64_t>(seq);
  switch (seq % 3) {
  case 0:
    d.kind = EventKind::stalled;
    d.rank = 3;
    d.host = "node-a";
    d.pid = 4242;
    d.others_step = 40;
    d.seconds_us = 301'500'000;
    d.message = "rank 3 (process 4242 on node-a) has not moved past step " + std::to_string(d.step) +
                " for 301.5 s while others reached step 40";
    break;
  case 1:
    d.kind = EventKind::nonfinite;
    d.key = "loss";
    d.ranks = {1, 2};
    d.value = std::numeric_limits<double>::quiet_NaN();
    d.has_value = true;
    d.message = "loss is NaN at step " + std::to_string(d.step) + " on ranks 1 and 2 <check the learning rate & data>";
    break;
  default:
    d.kind = EventKind::threshold;
    d.key = "grad_norm";
    d.rule = "above";
    d.limit = 10;
    d.value = 12.5;
    d.has_value = true;
    d.message = "grad_norm is 12.5 at step " + std::to_string(d.step) + ", above 10";
  }
  return d;
}

/// Appends the events of seq [first, first + n) to the run's events.jsonl; their lines.
std::vector<std::string> add_events(RunFixture& run, std::uint64_t first, std::uint64_t n) {
  std::vector<std::string> lines;
  std::string out;
  for (std::uint64_t seq = first; seq < first + n; ++seq) {
    lines.push_back(store::event_line(draft(seq), seq));
    out += lines.back() + "\n";
  }
  run.append("events.jsonl", out);
  return lines;
}

/// The run ends: its last event (run_finished), then run.json's end.
std::string finish(RunFixture& run, std::uint64_t seq, RunState state = RunState::finished) {
  chorus::core::EventDraft d;
  d.kind = EventKind::run_finished;
  d.ts_us = 1'700'000'100'000'000;
  d.state = state;
  d.message = "the run ended " + std::string(to_string(state));
  const std::string line = store::event_line(d, seq);
  run.append("events.jsonl", line + "\n");
  run.write_run_json(std::string(to_string(state)), 1'700'000'100.0);
  return line;
}

/// The seq of each body, in order.
std::vector<std::uint64_t> seqs(const std::vector<std::string>& bodies) {
  simdjson::dom::parser parser;
  std::vector<std::uint64_t> out;
  for (const std::string& b : bodies) {
    simdjson::dom::element doc;
    BOOST_REQUIRE_MESSAGE(parser.parse(b).get(doc) == simdjson::SUCCESS, b);
    out.push_back(doc["seq"].get_uint64().value());
  }
  return out;
}

std::vector<std::uint64_t> iota(std::uint64_t from, std::uint64_t to) {
  std::vector<std::uint64_t> out;
  for (std::uint64_t i = from; i < to; ++i) out.push_back(i);
  return out;
}

/// Pumps until caught up (or done, stopped, `limit`), sleeping through waits.
upload::Uploader::Progress catch_up(upload::Uploader& up, std::chrono::milliseconds limit = 20s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  upload::Uploader::Progress p;
  while (std::chrono::steady_clock::now() < end) {
    p = up.pump(end);
    if (p.done || p.stopped || p.caught_up) break;
    if (p.wait_until) std::this_thread::sleep_until(std::min(*p.wait_until, end));
  }
  return p;
}

/// What a process writes to its stderr meanwhile (the Uploader's reports).
class StderrCapture {
public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    file_ = dir_ / "stderr";
    const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    BOOST_REQUIRE(saved_ >= 0 && fd >= 0);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~StderrCapture() { restore(); }
  std::string text() {
    restore();
    return read_text(file_);
  }

private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  TempDir dir_{"chorus-webhook-stderr"};
  std::string file_;
  int saved_ = -1;
};

/// No part of the secret path in `text`.
void check_no_secret(const std::string& text, const std::string& where) {
  BOOST_TEST(text.find(secret_token) == std::string::npos, where << " shows the webhook's token: " << text);
  BOOST_TEST(text.find("B0CHORUS2") == std::string::npos, where << " shows the webhook's path: " << text);
}

/// No file under the run directory names or holds the secret path.
void check_run_dir_clean(const std::string& dir) {
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
    check_no_secret(e.path().string(), "a file name");
    if (e.is_regular_file()) check_no_secret(read_text(e.path()), e.path().string());
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(url_keeps_its_path_secret) {
  const upload::UploadTarget t = target("webhook://hooks.example.com" + secret_path + "?thread=a#frag");
  BOOST_TEST(t.backend == "webhook");
  BOOST_TEST(t.base_url == "https://hooks.example.com"); // HTTPS unless webhook+http:// says otherwise
  BOOST_TEST(t.path == secret_path + "?thread=a");       // the query goes, the fragment does not
  BOOST_TEST(t.url == "webhook://hooks.example.com/…");
  check_no_secret(t.id, "the target id");
  BOOST_TEST(t.id.starts_with("webhook-hooks.example.com-"));
  // Two webhooks of one server are two targets; the protocol's spelling is not another.
  BOOST_TEST(target("webhook://hooks.example.com/services/T/B/other").id != t.id);
  BOOST_TEST(target("webhook+https://hooks.example.com" + secret_path + "?thread=a").id == t.id);
  BOOST_TEST(target("webhook+http://127.0.0.1:8065/hooks/abc").base_url == "http://127.0.0.1:8065");
  BOOST_TEST(target("webhook://h.example.com?k=v").path == "/?k=v");

  // Bad URLs: each error says what is wrong, and shows no path.
  const std::vector<std::pair<std::string, std::string>> bad{
      {"webhook:///services/T0CHORUS1/B0CHORUS2/" + std::string(secret_token), "has no host"},
      {"webhook://user:pw@hooks.example.com" + secret_path, "has credentials"},
      {"webhook://hooks.example.com/services/T0CHORUS1/B0CHORUS2/" + std::string(secret_token) + " x",
       "percent-encoded"},
      {"webhok://hooks.example.com" + secret_path, "has an unknown scheme"},
      {"hooks.example.com" + secret_path, "has no scheme"},
  };
  for (const auto& [url, why] : bad) {
    const auto parsed = upload::UploadTarget::parse(url);
    BOOST_REQUIRE(!parsed);
    BOOST_TEST(parsed.error().message().find(why) != std::string::npos, parsed.error().message());
    check_no_secret(parsed.error().message(), "the error for " + why);
  }
}

BOOST_AUTO_TEST_CASE(each_event_posted_once_in_order_with_its_text) {
  WebhookServer server;
  RunFixture run;
  run.history(0, 50);
  std::vector<std::string> lines = add_events(run, 0, 3);
  StderrCapture err;
  upload::Uploader up(run.dir(), target(hook_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  upload::Uploader::Progress p = catch_up(up);
  BOOST_REQUIRE_MESSAGE(p.caught_up && !p.done, p.error);

  const std::vector<Received> got = server.received();
  BOOST_REQUIRE_EQUAL(got.size(), 3u); // events only: no history
  simdjson::dom::parser parser;
  for (std::size_t i = 0; i < got.size(); ++i) {
    BOOST_TEST_CONTEXT("event " << i) {
      BOOST_TEST(got[i].path == secret_path);
      BOOST_TEST(got[i].content_type == "application/json");
      BOOST_TEST(got[i].idempotency_key == "chorus-run-" + std::to_string(i));
      BOOST_TEST(got[i].remote_port == got[0].remote_port); // one kept-alive connection
      // The line's fields as it has them, then `text`.
      const std::string& line = lines[i];
      BOOST_TEST(got[i].body.starts_with(line.substr(0, line.size() - 1) + ",\"text\":\"chorus: run run-rank-3 (run) in proj: "));
      simdjson::dom::element doc;
      BOOST_REQUIRE(parser.parse(got[i].body).get(doc) == simdjson::SUCCESS);
      BOOST_TEST(doc["seq"].get_uint64().value() == i);
    }
  }
  simdjson::dom::element doc;
  BOOST_REQUIRE(parser.parse(got[0].body).get(doc) == simdjson::SUCCESS);
  BOOST_TEST(std::string(doc["text"].get_string().value()) ==
             "chorus: run run-rank-3 (run) in proj: rank 3 stalled at step 12 — rank 3 (process 4242 on node-a) has "
             "not moved past step 12 for 301.5 s while others reached step 40");
  BOOST_TEST(std::string(doc["host"].get_string().value()) == "node-a");
  BOOST_TEST(doc["pid"].get_int64().value() == 4242);
  BOOST_REQUIRE(parser.parse(got[1].body).get(doc) == simdjson::SUCCESS);
  // Slack's markup characters escaped, as its incoming webhooks ask.
  BOOST_TEST(std::string(doc["text"].get_string().value()) ==
             "chorus: run run-rank-3 (run) in proj: loss is not finite at step 13 (ranks 1, 2) — loss is NaN at step 13 "
             "on ranks 1 and 2 &lt;check the learning rate &amp; data&gt;");
  BOOST_TEST(std::string(doc["value"].get_string().value()) == "NaN");
  BOOST_REQUIRE(parser.parse(got[2].body).get(doc) == simdjson::SUCCESS);
  BOOST_TEST(std::string(doc["text"].get_string().value()).starts_with(
      "chorus: run run-rank-3 (run) in proj: grad_norm crossed an alert rule at step 14 — "));
  BOOST_TEST(std::string(doc["rule"].get_string().value()) == "above");

  // Lines appended later go with the next round, and only they.
  const auto more = add_events(run, 3, 2);
  run.history(50, 10);
  p = catch_up(up);
  BOOST_REQUIRE_MESSAGE(p.caught_up, p.error);
  BOOST_TEST(seqs(server.delivered()) == iota(0, 5), boost::test_tools::per_element());
  BOOST_TEST(server.received().size() == 5u);

  // The run ends: its run_finished goes, then the end is delivered.
  finish(run, 5, RunState::failed);
  p = drain(up);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  BOOST_TEST(seqs(server.delivered()) == iota(0, 6), boost::test_tools::per_element());
  BOOST_REQUIRE(parser.parse(server.delivered().back()).get(doc) == simdjson::SUCCESS);
  BOOST_TEST(std::string(doc["text"].get_string().value()) ==
             "chorus: run run-rank-3 (run) in proj: the run ended failed — the run ended failed");
  BOOST_TEST(up.state().points == 6u);
  BOOST_TEST(up.state().url == "webhook+http://127.0.0.1:" + std::to_string(server.port()) + "/…");
  check_no_secret(err.text(), "stderr");
  check_run_dir_clean(run.dir());
}

BOOST_AUTO_TEST_CASE(server_errors_and_429_are_retried_without_duplicates) {
  WebhookServer server;
  RunFixture run;
  add_events(run, 0, 4);
  server.script({{500, "", "internal error"}, {429, "1", "rate limited"}, {503, "", ""}});
  StderrCapture err;
  upload::Uploader up(run.dir(), target(hook_url(server)), quick());
  BOOST_REQUIRE(!up.open());

  // The 500: backed off (quick(): 50 ms to begin with).
  upload::Uploader::Progress p = up.pump(std::chrono::steady_clock::now() + 10s);
  BOOST_REQUIRE(p.wait_until.has_value());
  BOOST_TEST(p.error.find("HTTP 500") != std::string::npos, p.error);
  std::this_thread::sleep_until(*p.wait_until);
  // The 429: its Retry-After (1 s) is waited out, far past the backoff (at most 400 ms here).
  const auto before = std::chrono::steady_clock::now();
  p = up.pump(before + 10s);
  BOOST_REQUIRE(p.wait_until.has_value());
  BOOST_TEST(p.error.find("HTTP 429") != std::string::npos, p.error);
  BOOST_TEST((*p.wait_until - before >= 1s));
  p = catch_up(up);
  BOOST_REQUIRE_MESSAGE(p.caught_up && p.error.empty(), p.error);

  BOOST_TEST(server.received().size() == 7u); // 3 refused tries of event 0, then 4 events
  BOOST_TEST(seqs(server.delivered()) == iota(0, 4), boost::test_tools::per_element());
  for (const Received& r : server.received()) BOOST_TEST(r.path == secret_path);
  check_no_secret(err.text(), "stderr");
  check_run_dir_clean(run.dir());
}

BOOST_AUTO_TEST_CASE(refusals_stop_with_the_status_and_no_retry) {
  for (const int status : {400, 401, 403, 404, 410}) {
    BOOST_TEST_CONTEXT("HTTP " << status) {
      WebhookServer server;
      RunFixture run;
      add_events(run, 0, 2);
      server.script({{status, "", ""}});
      StderrCapture err;
      {
        upload::Uploader up(run.dir(), target(hook_url(server)), quick());
        BOOST_REQUIRE(!up.open());
        upload::Uploader::Progress p = catch_up(up);
        BOOST_REQUIRE(p.stopped);
        BOOST_TEST(p.error.find("HTTP " + std::to_string(status)) != std::string::npos, p.error);
        BOOST_TEST(p.error.find("event 0 (stalled)") != std::string::npos, p.error);
        if (status == 404 || status == 410)
          BOOST_TEST(p.error.find("no webhook at this URL") != std::string::npos, p.error);
        if (status == 404) BOOST_TEST(p.error.find("No webhook at …") != std::string::npos, p.error); // its words, cut
        if (status == 401 || status == 403)
          BOOST_TEST(p.error.find("check that the webhook is enabled") != std::string::npos, p.error);
        if (status == 400) BOOST_TEST(p.error.find("takes a JSON body") != std::string::npos, p.error);
        check_no_secret(p.error, "the error");
        // Stopped: pumping again sends nothing.
        p = up.pump(std::chrono::steady_clock::now() + 1s);
        BOOST_TEST(p.stopped);
        BOOST_TEST(server.received().size() == 1u);
      }
      check_no_secret(err.text(), "stderr");
      check_run_dir_clean(run.dir());
      // Once the webhook is fixed, the next upload sends each event once, the refused one first.
      upload::Uploader again(run.dir(), target(hook_url(server)), quick());
      BOOST_REQUIRE(!again.open());
      BOOST_REQUIRE(catch_up(again).caught_up);
      BOOST_TEST(seqs(server.delivered()) == iota(0, 2), boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(a_restart_posts_nothing_twice) {
  WebhookServer server;
  RunFixture run;
  add_events(run, 0, 3);
  {
    upload::Uploader up(run.dir(), target(hook_url(server)), quick());
    BOOST_REQUIRE(!up.open());
    BOOST_REQUIRE(catch_up(up).caught_up);
  }
  add_events(run, 3, 2);
  {
    // Another process, from the offsets file alone.
    upload::Uploader up(run.dir(), target(hook_url(server, "webhook+http")), quick());
    BOOST_REQUIRE(!up.open());
    BOOST_REQUIRE(catch_up(up).caught_up);
  }
  finish(run, 5);
  {
    upload::Uploader up(run.dir(), target(hook_url(server)), quick());
    BOOST_REQUIRE(!up.open());
    BOOST_REQUIRE(drain(up).done);
  }
  BOOST_TEST(seqs(server.delivered()) == iota(0, 6), boost::test_tools::per_element());
  BOOST_TEST(server.received().size() == 6u);
  // Done: a later upload sends nothing.
  upload::Uploader later(run.dir(), target(hook_url(server)), quick());
  BOOST_REQUIRE(!later.open());
  BOOST_REQUIRE(drain(later).done);
  BOOST_TEST(server.received().size() == 6u);
}

// The run host writes run.json's end before the run_finished event: the end
// waits for it, so that it is never left behind.
BOOST_AUTO_TEST_CASE(the_end_waits_for_the_last_event) {
  WebhookServer server;
  RunFixture run;
  add_events(run, 0, 2);
  upload::Uploader up(run.dir(), target(hook_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(catch_up(up).caught_up);
  run.write_run_json("finished", 1'700'000'100.0);
  upload::Uploader::Progress p = up.pump(std::chrono::steady_clock::now() + 10s);
  BOOST_TEST(!p.done);
  BOOST_TEST(p.wait_until.has_value());
  finish(run, 2); // its line now (and run.json again)
  p = drain(up);
  BOOST_REQUIRE_MESSAGE(p.done, p.error);
  BOOST_TEST(seqs(server.delivered()) == iota(0, 3), boost::test_tools::per_element());

  // A crashed run (its host gone) waits for nothing: no run_finished comes.
  RunFixture crashed("crashed");
  add_events(crashed, 0, 1);
  crashed.write_run_json("crashed", 1'700'000'100.0);
  upload::Uploader c(crashed.dir(), target(hook_url(server)), quick());
  BOOST_REQUIRE(!c.open());
  p = c.pump(std::chrono::steady_clock::now() + 10s);
  BOOST_TEST(p.done);

  // One whose run_finished never comes (its host could not write it) ends all the same, a few seconds later.
  RunFixture lost("lost");
  add_events(lost, 0, 1);
  lost.write_run_json("failed", 1'700'000'100.0);
  upload::Uploader l(lost.dir(), target(hook_url(server)), quick());
  BOOST_REQUIRE(!l.open());
  p = drain(l);
  BOOST_TEST(p.done);
  BOOST_TEST(server.delivered().size() == 5u);
}

BOOST_AUTO_TEST_CASE(a_damaged_line_is_listed_and_passed_over) {
  WebhookServer server;
  RunFixture run;
  add_events(run, 0, 1);
  run.append("events.jsonl", "{\"seq\":1,\"kind\":\"stalled\",\"ti\n"); // torn
  add_events(run, 2, 1);
  upload::Uploader up(run.dir(), target(hook_url(server)), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE(catch_up(up).caught_up);
  BOOST_TEST(seqs(server.delivered()) == (std::vector<std::uint64_t>{0, 2}), boost::test_tools::per_element());
  const std::string refused = run.read("upload/" + up.target().id + ".refused.jsonl");
  BOOST_TEST(refused.find("{\"part\":\"events\",\"line\":1,\"why\":\"not an event line: ") == 0u, refused);
  BOOST_TEST(up.state().refused == 1u);
}

// An event's line of 20 MiB: the events before it are posted, then `chorus
// sync` stops, naming the file, the line and the bound, having held no more
// of the line than the bound (its peak memory against a sync of the run
// without that line).
BOOST_AUTO_TEST_CASE(sync_stops_at_an_event_line_past_the_bound_in_bounded_memory) {
  WebhookServer server;
  RunFixture run, plain;
  for (RunFixture* r : {&run, &plain}) add_events(*r, 0, 2);
  run.append("events.jsonl", "{\"seq\":2,\"kind\":\"stalled\",\"message\":\"" + std::string(20u << 20, 'a') + "\"}\n");
  for (RunFixture* r : {&run, &plain}) {
    add_events(*r, 3, 1);
    finish(*r, 4);
  }
  const Output base = run_chorus({"sync", plain.dir(), "--to", hook_url(server)});
  BOOST_REQUIRE_EQUAL(base.code, 0);
  const std::size_t before = server.delivered().size();
  const Output sync = run_chorus({"sync", run.dir(), "--to", hook_url(server)});
  BOOST_TEST_INFO_SCOPE(sync.out << sync.err);
  BOOST_TEST(sync.code == 1);
  BOOST_TEST(sync.err.find("events.jsonl: line 3 runs past 16 MiB without a newline") != std::string::npos);
  BOOST_TEST(sync.err.find("That line and every line after it are not read") != std::string::npos);
  const std::vector<std::string> all = server.delivered();
  BOOST_TEST(seqs(std::vector<std::string>(all.begin() + static_cast<std::ptrdiff_t>(before), all.end())) ==
                 (std::vector<std::uint64_t>{0, 1}),
             boost::test_tools::per_element());
  BOOST_TEST_MESSAGE("peak memory: " << base.max_rss_kb << " KiB without the line, " << sync.max_rss_kb << " KiB with it");
  BOOST_TEST(sync.max_rss_kb < base.max_rss_kb + line_bound_slack_kb);
  check_no_secret(sync.out + sync.err, "chorus sync's output");
}

BOOST_AUTO_TEST_CASE(https_with_the_servers_ca) {
  TempDir dir("chorus-webhook-tls");
  const TlsFiles tls = write_test_certificates(dir.str());
  fs::create_directories(dir.path / "other");
  const TlsFiles other = write_test_certificates((dir.path / "other").string());
  WebhookServer server(tls);
  RunFixture run;
  add_events(run, 0, 2);
  {
    // A CA that did not sign the server's certificate: refused, never sent in the clear, not retried.
    Env ca("CURL_CA_BUNDLE", other.ca);
    upload::Uploader up(run.dir(), target(hook_url(server, "webhook")), quick());
    BOOST_REQUIRE(!up.open());
    const upload::Uploader::Progress p = catch_up(up);
    BOOST_REQUIRE(p.stopped);
    BOOST_TEST(p.error.find("certificate") != std::string::npos, p.error);
    BOOST_TEST(server.received().empty());
  }
  Env ca("CURL_CA_BUNDLE", tls.ca);
  upload::Uploader up(run.dir(), target(hook_url(server, "webhook")), quick());
  BOOST_REQUIRE(!up.open());
  BOOST_REQUIRE_MESSAGE(catch_up(up).caught_up, up.state().last_error);
  BOOST_TEST(seqs(server.delivered()) == iota(0, 2), boost::test_tools::per_element());
}

// A real job under `chorus launch` (CHORUS_UPLOAD): the run host's events
// (a rank that ends failed, the run's end) go up as the run host writes them, each once.
BOOST_AUTO_TEST_CASE(a_live_run_posts_its_events) {
  WebhookServer server;
  TempDir dir("chorus-webhook-live");
  const e2e::Output o = e2e::run("CHORUS_SYSTEM_INTERVAL=0 CHORUS_UPLOAD=" + hook_url(server) + " " +
                                 e2e::launch_worker(dir.path / "runs", 2, e2e::test_port(91),
                                                    "--steps 50 --fail-rank 1 --finish-code 3"));
  BOOST_TEST_INFO_SCOPE(o.text);
  BOOST_TEST(o.text.find("FINISH_STATE 0 failed") != std::string::npos); // rank 1 ended the run failed
  check_no_secret(o.text, "chorus launch's output");
  const std::vector<fs::path> runs = e2e::find_runs(dir.path / "runs");
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  const std::vector<std::string> lines = lines_of(read_text(runs.front() / "events.jsonl"));
  BOOST_REQUIRE(!lines.empty());
  std::vector<std::string> kinds;
  for (const std::string& l : lines) {
    const auto e = store::parse_event_line(l);
    BOOST_REQUIRE_MESSAGE(e, l);
    kinds.emplace_back(to_string(e->event.kind));
  }
  BOOST_TEST(kinds.back() == "run_finished");
  BOOST_TEST((std::find(kinds.begin(), kinds.end(), "rank_failed") != kinds.end()));
  const std::vector<std::string> bodies = server.delivered();
  BOOST_REQUIRE_EQUAL(bodies.size(), lines.size());
  for (std::size_t i = 0; i < lines.size(); ++i)
    BOOST_TEST(bodies[i].starts_with(lines[i].substr(0, lines[i].size() - 1) + ",\"text\":\"chorus: run "), bodies[i]);
  check_run_dir_clean(runs.front().string());
}

// A rank that stops logging reaches the webhook: a real job whose rank 1
// hangs 4 s (stall_after 1 s) posts stalled, resumed and the run's end.
BOOST_AUTO_TEST_CASE(a_stalled_rank_is_posted) {
  WebhookServer server;
  TempDir dir("chorus-webhook-stall");
  const e2e::Output o = e2e::run("CHORUS_SYSTEM_INTERVAL=0 CHORUS_STALL_AFTER=1 CHORUS_UPLOAD=" + hook_url(server) +
                                 " CHORUS_DIR=" + (dir.path / "runs").string() + " " + e2e::bin("chorus") +
                                 " launch -n 2 --master-port " + std::to_string(e2e::test_port(92)) + " -- " +
                                 e2e::bin("chorus_e2e_events_worker") +
                                 " --steps 100 --step-ms 10 --stall-rank 1 --stall-step 5 --stall-ms 4000 "
                                 "--wait-for resumed");
  BOOST_TEST_INFO_SCOPE(o.text);
  BOOST_TEST(o.status == 0);
  check_no_secret(o.text, "chorus launch's output");
  std::vector<std::string> kinds;
  for (const std::string& body : server.delivered()) {
    simdjson::dom::parser parser;
    std::string_view kind, text;
    simdjson::dom::element e = parser.parse(body);
    BOOST_REQUIRE(!e["kind"].get(kind));
    BOOST_REQUIRE(!e["text"].get(text));
    kinds.emplace_back(kind);
    if (kind == "stalled") {
      BOOST_TEST(std::int64_t(e["rank"]) == 1);
      BOOST_TEST(text.find("rank 1") != std::string_view::npos, text);
    }
  }
  const std::vector<std::string> want{"stalled", "resumed", "run_finished"};
  BOOST_TEST(kinds == want, boost::test_tools::per_element());
}

// A live upload sends the first events, then the run ends and `chorus sync`
// (the real binary) sends the rest: each once, and the path in none of its output.
BOOST_AUTO_TEST_CASE(chorus_sync_goes_on_from_the_live_upload) {
  WebhookServer server;
  RunFixture run;
  add_events(run, 0, 3);
  {
    upload::Uploader live(run.dir(), target(hook_url(server)), quick());
    BOOST_REQUIRE(!live.open());
    BOOST_REQUIRE(catch_up(live).caught_up);
  }
  add_events(run, 3, 3);
  run.history(0, 20);
  finish(run, 6);
  const std::string url = hook_url(server);
  const Output sync = run_chorus({"sync", run.dir(), "--to", url});
  BOOST_TEST_INFO_SCOPE(sync.out << sync.err);
  BOOST_REQUIRE_EQUAL(sync.code, 0);
  BOOST_TEST(seqs(server.delivered()) == iota(0, 7), boost::test_tools::per_element());
  BOOST_TEST(server.received().size() == 7u);
  BOOST_TEST(sync.out.find("webhook+http://127.0.0.1:" + std::to_string(server.port()) + "/…") != std::string::npos);
  check_no_secret(sync.out + sync.err, "chorus sync's output");

  const Output again = run_chorus({"sync", run.dir(), "--to", url});
  BOOST_REQUIRE_EQUAL(again.code, 0);
  BOOST_TEST(server.received().size() == 7u);

  const Output status = run_chorus({"sync", "--status", run.dir()});
  BOOST_TEST_INFO_SCOPE(status.out << status.err);
  BOOST_REQUIRE_EQUAL(status.code, 0);
  BOOST_TEST(status.out.find("webhook+http://127.0.0.1:" + std::to_string(server.port()) + "/…") != std::string::npos);
  BOOST_TEST(status.out.find("done (finished)") != std::string::npos);
  check_no_secret(status.out + status.err, "chorus sync --status");

  // A refusal through the binary: exit 1, the status named, the path not.
  WebhookServer gone;
  gone.script({{404, "", ""}});
  const Output refused = run_chorus({"sync", run.dir(), "--to", hook_url(gone)});
  BOOST_TEST_INFO_SCOPE(refused.out << refused.err);
  BOOST_TEST(refused.code == 1);
  BOOST_TEST(refused.err.find("HTTP 404") != std::string::npos);
  BOOST_TEST(gone.received().size() == 1u);
  check_no_secret(refused.out + refused.err, "chorus sync's refusal");
  check_run_dir_clean(run.dir());
}

} // namespace chorus::test
