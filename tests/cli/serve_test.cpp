// `chorus serve` over HTTP: a real server process on a free port, run
// directories written by hand (tests/cli/run_files.hpp), and its answers read
// with cpp-httplib's client: the runs list, series and their downsampling,
// the refusals (paths out of the directory, oversized or malformed requests,
// a missing token), damaged run files reported without harm, live rows
// on the event stream, and histograms (quantiles over steps, a step's bins).
#define BOOST_TEST_MODULE cli_serve
#include <boost/test/unit_test.hpp>

#include "io/store/histogram_log.hpp"
#include "tests/cli/process.hpp"
#include "tests/cli/run_files.hpp"
#include "tests/cli/serve_client.hpp"

#include <httplib.h>
#include <simdjson.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <functional>
#include <map>
#include <random>

using namespace chorus::test;
namespace fs = std::filesystem;

namespace {

/// A run with `rows` rows of `wave` (sin of the step, a spike at step
/// `spike`) and, with `epochs`, `epoch` (the step over 1000) on every row.
fs::path wave_run(const fs::path& root, const std::string& id, int rows, int spike, bool epochs = false) {
  const fs::path dir = make_run(root, "proj", "grp", {.id = id});
  std::string h;
  for (int s = 0; s < rows; ++s) {
    const double v = s == spike ? 100.0 : s == spike + 1 ? -100.0 : std::sin(s * 0.01);
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s) +
         R"(,"_runtime":)" + std::to_string(s) + R"(,"wave":)" + std::to_string(v);
    if (epochs) h += R"(,"epoch":)" + std::to_string(s / 1000.0);
    h += "}\n";
  }
  write_text(dir / "history.jsonl", h);
  return dir;
}

std::string series_path(const std::string& run, const std::vector<std::string>& keys, const std::string& rest) {
  std::string p = "/api/series?run=" + encode(run);
  for (const std::string& k : keys) p += "&key=" + encode(k);
  return p + rest;
}

} // namespace

BOOST_AUTO_TEST_CASE(lists_runs_by_group_newest_first_with_state_and_ranks) {
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "old", .start = 1'700'000'000});
  make_run(root.path, "proj", "grp", {.id = "new", .state = "failed", .world = 8, .start = 1'700'100'000});
  make_run(root.path, "other", "g2", {.id = "solo", .world = 1});
  write_text(root.path / "proj/grp/new/summary.json", R"({"_step":9,"loss":0.25,"note":"text"})");
  Serve s(root.path);
  const auto [status, body] = s.get("/api/runs");
  BOOST_REQUIRE_EQUAL(status, 200);
  const Json j(body);
  BOOST_TEST(j["count"].get_int64().value_unsafe() == 3);
  // proj/grp: new before old.
  std::vector<std::string> order;
  for (auto g : arr(j["groups"]))
    for (auto r : arr(g["runs"].value_unsafe())) order.emplace_back(r["path"].get_string().value_unsafe());
  BOOST_TEST_INFO(body);
  BOOST_TEST((std::find(order.begin(), order.end(), "proj/grp/new") < std::find(order.begin(), order.end(), "proj/grp/old")));
  BOOST_TEST(contains(body, R"("path":"other/g2/solo")"));
  for (auto g : arr(j["groups"]))
    for (auto r : arr(g["runs"].value_unsafe()))
      if (r["path"].get_string().value_unsafe() == "proj/grp/new") {
        BOOST_TEST(r["state"].get_string().value_unsafe() == "failed");
        BOOST_TEST(r["world_size"].get_int64().value_unsafe() == 8);
        BOOST_TEST(r["duration"].get_double().value_unsafe() == 95.0);
        BOOST_TEST(r["summary"]["loss"].get_double().value_unsafe() == 0.25);
        BOOST_TEST(r["summary"]["_step"].error() == simdjson::NO_SUCH_FIELD); // bookkeeping left out
      }
  // The page and the chart library are served from the binary.
  const auto [page_status, page] = s.get("/");
  BOOST_TEST(page_status == 200);
  BOOST_TEST(contains(page, "dygraph.min.")); // by its content's name (serve_transfer_test)
  const auto [lib_status, lib] = s.get("/dygraph.min.js");
  BOOST_TEST(lib_status == 200);
  BOOST_TEST(lib.size() > 100'000u);
}

BOOST_AUTO_TEST_CASE(a_run_has_its_ranks_config_keys_and_artifacts) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "r1", .world = 2, .crashed = 1});
  // Rank 1 joined (run.json's "joined"); rank 0, crashed, never did.
  std::string run_json = read_text(dir / "run.json");
  const std::size_t last_rank_end = run_json.rfind(R"("message":""})");
  BOOST_REQUIRE(last_rank_end != std::string::npos);
  run_json.insert(last_rank_end + std::string_view(R"("message":"")").size(), R"(,"joined":1700000000.125)");
  write_text(dir / "run.json", run_json);
  write_text(dir / "history.jsonl", history(100, 2));
  write_text(dir / "config.json", R"({"lr":0.001,"layers":[1,2]})");
  write_text(dir / "artifacts/model.bin", "weights!");
  write_text(dir / "artifacts.jsonl", R"({"name":"model.bin","type":"model","size":8,"sha256":"ab","rank":0,"step":5,"timestamp":1700000005})"
                                      "\n");
  Serve s(root.path);
  const auto [status, body] = s.get("/api/run?run=proj/grp/r1");
  BOOST_REQUIRE_EQUAL(status, 200);
  BOOST_TEST_INFO(body);
  const Json j(body);
  BOOST_TEST(arr(j["ranks"]).size() == 2u);
  BOOST_TEST(j["ranks"].at(0)["state"].get_string().value_unsafe() == "crashed");
  BOOST_TEST(j["ranks"].at(0)["message"].get_string().value_unsafe() == "heartbeat lost");
  BOOST_TEST((j["ranks"].at(0)["joined"].error() == simdjson::NO_SUCH_FIELD));
  BOOST_TEST(j["ranks"].at(1)["joined"].get_double().value_unsafe() == 1700000000.125);
  BOOST_TEST(j["config"]["lr"].get_double().value_unsafe() == 0.001);
  BOOST_TEST(j["history"]["rows"].get_int64().value_unsafe() == 100);
  BOOST_TEST(contains(body, R"("key":"loss","points":89,"nan":10,"inf":1)"));
  BOOST_TEST(contains(body, R"("key":"acc/rank-1")"));
  BOOST_TEST(contains(body, R"("key":"_progress/rank-1")"));
  BOOST_TEST(j["artifacts"].at(0)["available"].get_bool().value_unsafe());
  const auto [a_status, a_body] = s.get("/api/artifact?run=proj/grp/r1&name=model.bin");
  BOOST_TEST(a_status == 200);
  BOOST_TEST(a_body == "weights!");
  BOOST_TEST(!j.has("error"), "no error for a sound run");
}

BOOST_AUTO_TEST_CASE(series_are_downsampled_to_the_width_and_whole_when_zoomed_in) {
  TempDir root;
  // Past the points a key keeps in memory (65,536): the whole range comes
  // from its blocks, a zoomed one from the file.
  wave_run(root.path, "big", 70'000, 41'234);
  wave_run(root.path, "small", 5'000, 3'333);
  Serve s(root.path);
  for (const auto& [run, rows, spike] : {std::tuple{"proj/grp/big", 70'000, 41'234}, std::tuple{"proj/grp/small", 5'000, 3'333}}) {
    BOOST_TEST_CONTEXT(run) {
      // The whole run in 100 pixels: at most two points a pixel, the spikes kept.
      const auto [status, body] = s.get(series_path(run, {"wave"}, "&width=100"));
      BOOST_REQUIRE_EQUAL(status, 200);
      const Json all(body);
      const auto w = all["series"]["wave"];
      const std::vector<double> x = numbers(w["x"]), y = numbers(w["y"]);
      BOOST_TEST(w["n"].get_int64().value_unsafe() == rows);
      BOOST_TEST(!w["full"].get_bool().value_unsafe());
      BOOST_TEST(x.size() <= 200u);
      BOOST_TEST(x.size() >= 100u);
      BOOST_TEST(std::is_sorted(x.begin(), x.end()));
      BOOST_TEST(*std::max_element(y.begin(), y.end()) == 100.0);
      BOOST_TEST(*std::min_element(y.begin(), y.end()) == -100.0);
      const auto at = std::find(y.begin(), y.end(), 100.0) - y.begin();
      BOOST_TEST(x[static_cast<std::size_t>(at)] == spike);

      // Zoomed into 300 steps at 1000 pixels: every point, exactly.
      const std::string from = std::to_string(spike - 100), to = std::to_string(spike + 199);
      const auto [zs, zbody] = s.get(series_path(run, {"wave"}, "&width=1000&from=" + from + "&to=" + to));
      BOOST_REQUIRE_EQUAL(zs, 200);
      const Json zoom(zbody);
      const auto z = zoom["series"]["wave"];
      const std::vector<double> zx = numbers(z["x"]), zy = numbers(z["y"]);
      BOOST_TEST(z["full"].get_bool().value_unsafe());
      BOOST_REQUIRE_EQUAL(zx.size(), 300u);
      BOOST_TEST(zx.front() == spike - 100);
      BOOST_TEST(zx.back() == spike + 199);
      BOOST_TEST(zy[100] == 100.0);
      BOOST_TEST(zy[101] == -100.0);
      BOOST_TEST(std::fabs(zy[0] - std::sin((spike - 100) * 0.01)) < 1e-6);

      // Against the run's time: the same points, x in seconds into the run.
      const auto [rs, rbody] = s.get(series_path(run, {"wave"}, "&x=rel&width=1000&from=10&to=19"));
      const Json rel(rbody);
      BOOST_TEST(numbers(rel["series"]["wave"]["x"]) == std::vector<double>({10, 11, 12, 13, 14, 15, 16, 17, 18, 19}),
                 boost::test_tools::per_element());
    }
  }
  // A key the run does not have is there, empty, and says so.
  const auto [status, body] = s.get(series_path("proj/grp/small", {"wave", "nope"}, ""));
  BOOST_TEST(status == 200);
  BOOST_TEST(contains(body, R"("nope":{"n":0,"full":true,"x":[],"y":[],"missing":true})"), body);
}

BOOST_AUTO_TEST_CASE(per_rank_columns_and_system_metrics_are_series) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "r1", .world = 2});
  write_text(dir / "history.jsonl", history(50, 2));
  std::string sys;
  for (int t = 0; t < 10; ++t)
    for (int r = 0; r < 2; ++r)
      sys += R"({"_timestamp":)" + std::to_string(1'700'000'000 + t) + R"(,"_runtime":)" + std::to_string(t) +
             R"(,"_node":0,"_rank":)" + std::to_string(r) + R"(,"system.cpu.percent/node-0":)" + std::to_string(50 + t) +
             R"(,"system.proc.threads/rank-)" + std::to_string(r) + R"(":)" + std::to_string(8 + r) + "}\n";
  write_text(dir / "system.jsonl", sys);
  Serve s(root.path);
  const auto [status, body] = s.get(series_path("proj/grp/r1", {"acc/rank-0", "acc/rank-1", "_progress/rank-1"}, "&width=500"));
  BOOST_REQUIRE_EQUAL(status, 200);
  const Json j(body);
  BOOST_TEST(numbers(j["series"]["acc/rank-1"]["y"]).size() == 50u);
  BOOST_TEST(numbers(j["series"]["acc/rank-1"]["y"])[10] == 1.1);
  BOOST_TEST(numbers(j["series"]["_progress/rank-1"]["y"]).back() == 49.0);
  const auto [ss, sbody] = s.get(series_path("proj/grp/r1", {"system.proc.threads/rank-1", "system.cpu.percent/node-0"},
                                             "&file=system&x=rel&width=500"));
  BOOST_REQUIRE_EQUAL(ss, 200);
  const Json sj(sbody);
  BOOST_TEST(numbers(sj["series"]["system.proc.threads/rank-1"]["y"]) == std::vector<double>(10, 9.0),
             boost::test_tools::per_element());
  // Both ranks' lines carry the node's figure: two points a time.
  BOOST_TEST(numbers(sj["series"]["system.cpu.percent/node-0"]["x"]).size() == 20u);
}

BOOST_AUTO_TEST_CASE(paths_out_of_the_directory_are_refused) {
  TempDir root, outside;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "r1"});
  make_run(outside.path, "p", "g", {.id = "secret"});
  write_text(outside.path / "secret.txt", "secret");
  write_text(dir / "artifacts/ok.txt", "ok");
  fs::create_directories(root.path / "proj/links");
  fs::create_symlink(outside.path / "p/g/secret", root.path / "proj/links/secret");   // a run out of the root
  fs::create_symlink(outside.path / "secret.txt", dir / "artifacts/leak.txt");        // an artifact out of the run
  fs::create_symlink(outside.path / "p", root.path / "linkedproj");                    // a project out of the root
  Serve s(root.path);
  for (const auto& [path, want] : std::vector<std::pair<std::string, int>>{
           {"/api/run?run=proj/grp/../../../etc", 400},
           {"/api/run?run=" + encode(outside.path.string() + "/p/g/secret"), 400},
           {"/api/run?run=%2e%2e/%2e%2e/etc/passwd", 400},
           {"/api/run?run=proj/grp/r1/../r1", 400},
           {"/api/run?run=proj//grp/r1", 400},
           {"/api/run?run=proj/links/secret", 403},
           {"/api/run?run=linkedproj/g/secret", 403},
           {"/api/run?run=proj/grp/nosuch", 404},
           {"/api/run", 400},
           {"/api/group?group=..%2F..", 400},
           {"/api/series?run=proj/links/secret&key=loss", 403},
           {"/api/events?run=proj/links/secret", 403},
           {"/api/artifact?run=proj/grp/r1&name=leak.txt", 403},
           {"/api/artifact?run=proj/grp/r1&name=..%2Frun.json", 400},
           {"/api/artifact?run=proj/grp/r1&name=%2Fetc%2Fpasswd", 400},
           {"/api/artifact?run=proj/grp/r1&name=ok.txt", 200},
           {"/../../etc/passwd", 404},
           {"/%2e%2e/%2e%2e/etc/passwd", 404},
       }) {
    const auto [status, body] = s.get(path);
    BOOST_TEST(status == want, path << " answered " << status << ": " << body);
    // Nothing of what lies outside: neither its run.json nor where it is.
    BOOST_TEST(!contains(body, "secret-name"), path << " leaked: " << body);
    BOOST_TEST(!contains(body, outside.str()), path << " leaked: " << body);
  }
  // The runs list leaves out the run that lies outside.
  const auto [status, body] = s.get("/api/runs");
  BOOST_TEST(status == 200);
  BOOST_TEST(!contains(body, "secret"), body);
  BOOST_TEST(!contains(body, outside.str()), body);
  BOOST_TEST(contains(body, "proj/grp/r1"));
}

BOOST_AUTO_TEST_CASE(oversized_malformed_and_writing_requests_are_refused) {
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "r1"});
  Serve s(root.path);
  std::string many;
  for (int i = 0; i < 600; ++i) many += "&key=k" + std::to_string(i);
  for (const auto& [path, want] : std::vector<std::pair<std::string, int>>{
           {"/api/runs?pad=" + std::string(9000, 'a'), 414},
           {"/api/series?run=proj/grp/r1" + many, 400},
           {"/api/series?run=proj/grp/r1&key=loss&width=100000", 400},
           {"/api/series?run=proj/grp/r1&key=loss&width=abc", 400},
           {"/api/series?run=proj/grp/r1&key=loss&from=x", 400},
           {"/api/series?run=proj/grp/r1&key=loss&x=sideways", 400},
           {"/api/series?run=proj/grp/r1", 400},
           {"/nosuchpage", 404},
       }) {
    const auto [status, body] = s.get(path);
    BOOST_TEST(status == want, path.substr(0, 80) << " answered " << status << ": " << body.substr(0, 200));
  }
  // A header line past the limit.
  const auto [hs, hbody] = s.get("/api/runs", {{"X-Big", std::string(20000, 'b')}});
  BOOST_TEST(hs == 400, "a 20 KB header was answered " << hs);
  // Nothing but GET (and HEAD).
  httplib::Client c = s.client();
  const httplib::Result post = c.Post("/api/runs", std::string(100, 'x'), "text/plain");
  BOOST_REQUIRE(post);
  BOOST_TEST(post->status == 405);
  const httplib::Result del = c.Delete("/api/run?run=proj/grp/r1");
  BOOST_REQUIRE(del);
  BOOST_TEST(del->status == 405);
  // Still serving after all that.
  BOOST_TEST(s.get("/api/runs").first == 200);
}

BOOST_AUTO_TEST_CASE(damaged_run_files_are_reported_on_the_run_not_fatal) {
  TempDir root;
  const fs::path bad = root.path / "proj/grp/bad";
  write_text(bad / "run.json", "{\"id\": \"bad\", \"state\": \"runn");
  const fs::path torn = make_run(root.path, "proj", "grp", {.id = "torn"});
  write_text(torn / "history.jsonl", history(10, 1) + "{\"_step\": 10, \"loss\": oops}\n" + history(12, 1).substr(history(11, 1).size()));
  write_text(torn / "config.json", "[1, 2,");
  Serve s(root.path);
  const auto [status, body] = s.get("/api/run?run=proj/grp/bad");
  BOOST_REQUIRE_EQUAL(status, 200);
  const Json j(body);
  BOOST_TEST_INFO(body);
  BOOST_TEST(contains(std::string(j["error"].get_string().value_unsafe()), "run.json"));
  BOOST_TEST(j["shown_state"].get_string().value_unsafe() == "unreadable");

  const auto [ts, tbody] = s.get("/api/run?run=proj/grp/torn");
  BOOST_REQUIRE_EQUAL(ts, 200);
  const Json t(tbody);
  BOOST_TEST_INFO(tbody);
  BOOST_TEST(contains(std::string(t["error"].get_string().value_unsafe()), "config.json"));
  BOOST_TEST(t["history"]["rows"].get_int64().value_unsafe() == 11);
  BOOST_TEST(t["history"]["skipped"].get_int64().value_unsafe() == 1);
  BOOST_TEST(contains(tbody, "damaged line"));
  const auto [ss, sbody] = s.get(series_path("proj/grp/torn", {"lr"}, ""));
  BOOST_TEST(ss == 200);
  BOOST_TEST(numbers(Json(sbody)["series"]["lr"]["x"]).size() == 11u);

  // The list shows both, the damaged one with its error; the server lives on.
  const auto [ls, lbody] = s.get("/api/runs");
  BOOST_TEST(ls == 200);
  BOOST_TEST(contains(lbody, R"("path":"proj/grp/bad")"));
  BOOST_TEST(contains(lbody, R"("shown_state":"unreadable")"));
  // A history line past 16 MiB without a newline: an error on the run, not a stall.
  const fs::path huge = make_run(root.path, "proj", "grp", {.id = "huge"});
  write_text(huge / "history.jsonl", history(5, 1) + std::string(17u << 20, ' '));
  const auto [hs, hbody] = s.get("/api/run?run=proj/grp/huge");
  BOOST_TEST(hs == 200);
  BOOST_TEST(contains(hbody, "16 MiB"), hbody.substr(0, 2000));
  BOOST_TEST(s.get("/api/runs").first == 200);
  const Output o = s.stop();
  BOOST_TEST(o.code == 0, o.out << o.err);
}

BOOST_AUTO_TEST_CASE(off_loopback_every_request_needs_the_token) {
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "r1"});
  Serve s(root.path, {"--host", "0.0.0.0"});
  BOOST_REQUIRE_EQUAL(s.token.size(), 32u);
  s.with_token = false;
  for (const std::string path : {"/", "/app.js", "/api/runs", "/api/run?run=proj/grp/r1"}) {
    BOOST_TEST(s.get(path).first == 401, path);
    BOOST_TEST(s.get(path + std::string(path.find('?') == std::string::npos ? "?" : "&") + "token=" + std::string(32, '0')).first == 401);
  }
  httplib::Client c = s.client();
  const httplib::Result first = c.Get("/?token=" + s.token);
  BOOST_REQUIRE(first);
  BOOST_TEST(first->status == 200);
  const std::string cookie = first->get_header_value("Set-Cookie");
  BOOST_TEST(contains(cookie, "HttpOnly"));
  BOOST_TEST(contains(cookie, "SameSite=Strict"));
  // The page's later requests carry the cookie.
  const auto [status, body] = s.get("/api/runs", {{"Cookie", cookie.substr(0, cookie.find(';'))}});
  BOOST_TEST(status == 200);
  BOOST_TEST(contains(body, "proj/grp/r1"));
  BOOST_TEST(s.get("/api/runs", {{"Cookie", "chorus_token_" + std::to_string(s.port) + "=nope"}}).first == 401);
  BOOST_TEST(s.get("/api/runs?token=" + s.token).first == 200);
}

BOOST_AUTO_TEST_CASE(on_loopback_without_a_token_other_hosts_names_are_turned_away) {
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "r1"});
  Serve s(root.path, {"--no-token"});
  BOOST_TEST(s.token.empty());
  BOOST_TEST(s.get("/api/runs").first == 200);
  BOOST_TEST(s.get("/api/runs", {{"Host", "localhost:" + std::to_string(s.port)}}).first == 200);
  BOOST_TEST(s.get("/api/runs", {{"Host", "attacker.example:" + std::to_string(s.port)}}).first == 403);
}

namespace {

/// Whether the test runs as root, which acting as another user needs; says so where not.
bool root_or_skip() {
  if (::geteuid() == 0) return true;
  BOOST_TEST_MESSAGE("skipped: acting as another user needs root");
  return false;
}

/// "PATH STATUS" for each path, asked by another user of the machine (as_other_user).
std::string statuses_for_another_user(int port, const std::vector<std::string>& paths) {
  return as_other_user(other_uid, [&] {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(10, 0);
    c.set_read_timeout(10, 0);
    std::string out;
    for (const std::string& p : paths) {
      const httplib::Result r = c.Get(p);
      out += p + " " + (r ? std::to_string(r->status) : std::string("no-answer"));
      if (r && r->status == 200) out += contains(r->body, "<!doctype html>") ? " page" : contains(r->body, "r1") ? " r1" : "";
      out += "\n";
    }
    return out;
  });
}

/// Gives the run directory `dir` to `uid`, with `dir_mode` on it and `file_mode` on its files.
void give(const fs::path& dir, int uid, fs::perms dir_mode, fs::perms file_mode) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    BOOST_REQUIRE(::lchown(e.path().c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid)) == 0);
    fs::permissions(e.path(), e.is_directory() ? dir_mode : file_mode);
  }
  BOOST_REQUIRE(::lchown(dir.c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid)) == 0);
  fs::permissions(dir, dir_mode);
}

} // namespace

// Loopback is shared by every user of the machine: the token is asked there too.
BOOST_AUTO_TEST_CASE(on_loopback_another_user_gets_nothing_without_the_token) {
  if (!root_or_skip()) return;
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "r1"});
  Serve s(root.path);
  BOOST_REQUIRE_EQUAL(s.token.size(), 32u); // printed inside the address: http://127.0.0.1:PORT/?token=...
  const std::string seen = statuses_for_another_user(
      s.port, {"/", "/app.js", "/api/runs", "/api/run?run=proj/grp/r1", "/api/events?run=proj/grp/r1",
               "/?token=" + std::string(32, '0'), "/?token=" + s.token, "/api/runs?token=" + s.token});
  BOOST_TEST_INFO(seen);
  for (const std::string p : {"/", "/app.js", "/api/runs", "/api/run?run=proj/grp/r1", "/api/events?run=proj/grp/r1"})
    BOOST_TEST(contains(seen, p + " 401\n"), p);
  BOOST_TEST(contains(seen, "/?token=" + std::string(32, '0') + " 401\n"));
  BOOST_TEST(contains(seen, "/?token=" + s.token + " 200 page\n"));
  BOOST_TEST(contains(seen, "/api/runs?token=" + s.token + " 200 r1\n"));
}

BOOST_AUTO_TEST_CASE(no_token_is_the_old_way_with_a_warning_that_says_who_can_read) {
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "r1"});
  Serve s(root.path, {"--no-token"});
  BOOST_TEST(s.token.empty());
  if (::geteuid() == 0) {
    const std::string seen = statuses_for_another_user(s.port, {"/api/runs"});
    BOOST_TEST(contains(seen, "/api/runs 200 r1\n"), seen);
  }
  const Output o = s.stop();
  BOOST_TEST(contains(o.err, "warning: --no-token: every user of this machine can read the runs shown here"), o.err);
  // Off loopback, never.
  const Output off = run_chorus({"serve", root.str(), "--no-token", "--host", "0.0.0.0", "--port", "0"});
  BOOST_TEST(off.code == 2);
  BOOST_TEST(contains(off.err, "loopback only"), off.err);
}

// Root reads anything: it shows only what a run's owner lets other users read.
BOOST_AUTO_TEST_CASE(served_as_root_another_users_private_run_is_not_shown) {
  if (!root_or_skip()) return;
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "r1"});
  const fs::path theirs = make_run(root.path, "proj", "grp", {.id = "theirs"});
  write_text(theirs / "history.jsonl", history(5, 1));
  give(theirs, other_uid, fs::perms::owner_all, fs::perms::owner_read | fs::perms::owner_write); // 0700, 0600
  Serve s(root.path);
  {
    const Json runs(s.get("/api/runs").second);
    BOOST_TEST(std::int64_t(runs["count"]) == 1);
    BOOST_TEST(std::int64_t(runs["not_shown"]) == 1);
    BOOST_TEST(contains(std::string(std::string_view(runs["not_shown_why"])), "belongs to nobody (uid 65534), and its mode 0700"),
               runs.text);
    BOOST_TEST(!contains(runs.text, "theirs-name"), runs.text);
  }
  for (const std::string p : {"/api/run?run=proj/grp/theirs", "/api/series?run=proj/grp/theirs&key=loss",
                              "/api/run/events?run=proj/grp/theirs", "/api/events?run=proj/grp/theirs"}) {
    const auto [status, body] = s.get(p);
    BOOST_TEST(status == 403, p << " " << body);
    BOOST_TEST(!contains(body, "theirs-name"), body);
  }
  // Its directory opened to others, its files still private: still not shown.
  fs::permissions(theirs, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
  const auto [closed, why] = s.get("/api/run?run=proj/grp/theirs");
  BOOST_TEST(closed == 403);
  BOOST_TEST(contains(why, "run.json belongs to nobody"), why);
  // Shared with every user: shown.
  give(theirs, other_uid, fs::perms(0755), fs::perms(0644));
  const auto [open, body] = s.get("/api/run?run=proj/grp/theirs");
  BOOST_TEST(open == 200, body);
  BOOST_TEST(contains(body, "theirs-name"), body);
  BOOST_TEST(std::int64_t(Json(s.get("/api/runs").second)["count"]) == 2);
}

// Served by another user: what the kernel lets it read, and nothing else.
BOOST_AUTO_TEST_CASE(served_by_another_user_what_it_may_not_read_is_not_shown) {
  if (!root_or_skip()) return;
  TempDir root;
  // The runs directory private to root: serve cannot start there.
  const Output refused = run_chorus({"serve", root.str(), "--port", "0"}, {}, other_uid);
  BOOST_TEST(refused.code == 1);
  BOOST_TEST(contains(refused.err, "cannot be read by nobody (uid 65534), whom chorus serve runs as"), refused.err);
  // Open to all, with a run of root's own that is private (0700) and one shared.
  fs::permissions(root.path, fs::perms(0755));
  const fs::path shared = make_run(root.path, "proj", "grp", {.id = "r1"});
  const fs::path mine = make_run(root.path, "proj", "grp", {.id = "private"});
  give(shared, 0, fs::perms(0755), fs::perms(0644));
  give(mine, 0, fs::perms(0700), fs::perms(0600));
  for (const fs::path& d : {root.path / "proj", root.path / "proj" / "grp"}) fs::permissions(d, fs::perms(0755));
  Serve s(root.path, {}, other_uid);
  const Json runs(s.get("/api/runs").second);
  BOOST_TEST(std::int64_t(runs["count"]) == 1, runs.text);
  BOOST_TEST(contains(runs.text, "proj/grp/r1"));
  BOOST_TEST(!contains(runs.text, "private-name"));
  const auto [status, body] = s.get("/api/run?run=proj/grp/private");
  BOOST_TEST(status == 403, body);
  BOOST_TEST(contains(body, "cannot be read by nobody"), body);
  BOOST_TEST(s.get("/api/run?run=proj/grp/r1").first == 200);
}

BOOST_AUTO_TEST_CASE(a_port_in_use_or_a_missing_directory_is_named_with_the_fix) {
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "r1"});
  Serve s(root.path);
  const Output busy = run_chorus({"serve", root.str(), "--port", std::to_string(s.port)});
  BOOST_TEST(busy.code == 1);
  BOOST_TEST(contains(busy.err, "port " + std::to_string(s.port)), busy.err);
  BOOST_TEST(contains(busy.err, "--port"), busy.err);
  const Output missing = run_chorus({"serve", root / "nope"});
  BOOST_TEST(missing.code == 1);
  BOOST_TEST(contains(missing.err, "no directory at"), missing.err);
  const Output usage = run_chorus({"serve", "--port", "70000"});
  BOOST_TEST(usage.code == 2);
}

BOOST_AUTO_TEST_CASE(new_rows_reach_the_event_stream) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "live", .state = "running", .ended = false});
  write_text(dir / "history.jsonl", history(20, 2));
  Serve s(root.path);
  const std::string seen = s.events("proj/grp/live", R"("rows":20)", [&] {
    // Five more rows, and a last one being written: its complete lines only.
    std::ofstream f(dir / "history.jsonl", std::ios::app);
    f << history(25, 2).substr(history(20, 2).size()) << R"({"_step":25,"loss")";
  }, R"("rows":25)");
  BOOST_TEST_INFO(seen);
  BOOST_TEST(contains(seen, "event: history"));
  BOOST_TEST(contains(seen, "event: run"));
  BOOST_TEST(contains(seen, R"("rows":25,)"));
  BOOST_TEST(contains(seen, R"("last_step":24)"));
  BOOST_TEST(contains(seen, R"("unfinished":true)"));
  // The new rows are in the series.
  const auto [status, body] = s.get(series_path("proj/grp/live", {"lr"}, ""));
  BOOST_TEST(numbers(Json(body)["series"]["lr"]["x"]).size() == 25u);
}

BOOST_AUTO_TEST_CASE(barriers_show_each_ranks_wait_and_the_ranks_the_others_wait_for) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "r1", .state = "running", .world = 3, .ended = false, .last_step = -1});
  // Ranks 0 and 1 at step 99, rank 2's per-rank values stop at step 59.
  std::string h;
  for (int s = 0; s < 100; ++s) {
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s) + R"(,"_runtime":)" +
         std::to_string(s);
    for (int r = 0; r < 3; ++r)
      if (r < 2 || s < 60) h += ",\"t/rank-" + std::to_string(r) + "\":" + std::to_string(s + r);
    h += "}\n";
  }
  write_text(dir / "history.jsonl", h);
  // Rank 1 came last twice (the others waited 3.5 s and 3 s for it); rank 2
  // never reached the third barrier, which timed out after 5 s; a damaged line.
  write_text(dir / "barriers.jsonl",
             R"({"name":"epoch-0","index":0,"step":9,"opened":100,"released":102,"error":null,"ranks":[{"rank":0,"arrived":100,"waited":2},{"rank":1,"arrived":102,"waited":0},{"rank":2,"arrived":100.5,"waited":1.5}]})"
             "\n"
             R"({"name":"epoch-1","index":1,"step":19,"opened":110,"released":112,"error":null,"ranks":[{"rank":0,"arrived":110,"waited":2},{"rank":1,"arrived":112,"waited":0},{"rank":2,"arrived":111,"waited":1}]})"
             "\n{oops\n"
             R"({"name":"epoch-2","index":2,"step":29,"opened":120,"released":125,"error":"barrier \"epoch-2\" timed out after 5000 ms: rank 2 did not reach it","ranks":[{"rank":0,"arrived":120,"waited":5},{"rank":1,"arrived":121,"waited":4},{"rank":2,"arrived":null,"waited":null}]})"
             "\n");
  Serve s(root.path);
  const auto [status, body] = s.get("/api/run?run=proj/grp/r1");
  BOOST_REQUIRE_EQUAL(status, 200);
  BOOST_TEST_INFO(body);
  const Json j(body);
  const auto b = j["barriers"];
  BOOST_TEST(b["total"].get_uint64().value_unsafe() == 3u);
  BOOST_TEST(b["skipped"].get_uint64().value_unsafe() == 1u);
  BOOST_TEST(b["failed"].get_uint64().value_unsafe() == 1u);
  BOOST_TEST(arr(b["records"]).size() == 3u);
  BOOST_TEST(b["records"].at(0)["ranks"].at(2)["waited"].get_double().value_unsafe() == 1.5);
  BOOST_TEST(b["records"].at(2)["ranks"].at(2)["arrived"].is_null());
  BOOST_TEST(contains(std::string(b["records"].at(2)["error"].get_string().value_unsafe()), "timed out"));
  // Per rank: its own waits, the barriers it came last to, the waits it caused.
  BOOST_TEST(b["ranks"].at(0)["waited"].get_double().value_unsafe() == 9.0);
  BOOST_TEST(b["ranks"].at(1)["last"].get_uint64().value_unsafe() == 2u);
  BOOST_TEST(b["ranks"].at(1)["caused"].get_double().value_unsafe() == 6.5);
  BOOST_TEST(b["ranks"].at(2)["absent"].get_uint64().value_unsafe() == 1u);
  BOOST_TEST(b["ranks"].at(2)["caused"].get_double().value_unsafe() == 9.0);
  BOOST_TEST(b["ranks"].at(0)["caused"].get_double().value_unsafe() == 0.0);
  // The damaged line is named on the run's page, and the rest still shown.
  BOOST_TEST(contains(body, "barriers.jsonl: 1 damaged line(s) skipped (line 3: not JSON"));
  // The laggards: rank 1 and rank 2 (waited for, and behind), never rank 0.
  const auto lag = arr(j["laggards"]);
  BOOST_REQUIRE_EQUAL(lag.size(), 2u);
  BOOST_TEST(j["laggards"].at(0)["rank"].get_int64().value_unsafe() == 1);
  BOOST_TEST(contains(std::string(j["laggards"].at(0)["why"].get_string().value_unsafe()), "the others waited 6.500 s for it, at 2 of 3 barriers"));
  BOOST_TEST(j["laggards"].at(1)["rank"].get_int64().value_unsafe() == 2);
  const std::string why2(j["laggards"].at(1)["why"].get_string().value_unsafe());
  BOOST_TEST(contains(why2, "it never reached some"), why2);
  BOOST_TEST(contains(why2, "at step 59, 40 behind rank 0"), why2);

  // A run without barriers.jsonl says so, and names no laggard where all keep pace.
  const fs::path quiet = make_run(root.path, "proj", "grp", {.id = "r2", .world = 2});
  write_text(quiet / "history.jsonl", history(100, 2));
  const auto [qs, qbody] = s.get("/api/run?run=proj/grp/r2");
  BOOST_REQUIRE_EQUAL(qs, 200);
  const Json q(qbody);
  BOOST_TEST(q["barriers"]["missing"].get_bool().value_unsafe());
  BOOST_TEST(arr(q["laggards"]).size() == 0u);
}

BOOST_AUTO_TEST_CASE(a_groups_members_far_behind_the_furthest_are_marked) {
  TempDir root;
  make_run(root.path, "proj", "grp", {.id = "ahead", .world = 2, .last_step = 990});
  make_run(root.path, "proj", "grp", {.id = "near", .world = 2, .last_step = 985});
  make_run(root.path, "proj", "grp", {.id = "behind", .world = 2, .last_step = 400});
  Serve s(root.path);
  const auto [status, body] = s.get("/api/group?group=proj/grp");
  BOOST_REQUIRE_EQUAL(status, 200);
  BOOST_TEST_INFO(body);
  const Json j(body);
  std::map<std::string, std::int64_t> behind;
  for (simdjson::dom::element m : arr(j["members"])) {
    std::int64_t by = 0;
    if (m["behind"].get(by) == simdjson::SUCCESS) behind[std::string(m["id"].get_string().value_unsafe())] = by;
  }
  BOOST_TEST(behind.size() == 1u);
  BOOST_TEST(behind["behind"] == 590);
}

BOOST_AUTO_TEST_CASE(a_run_whose_host_is_lost_reads_crashed_on_the_list_the_page_and_the_stream) {
  TempDir root;
  RunSpec spec{.state = "running", .world = 2, .host = other_host, .ended = false, .last_step = -1};
  spec.id = "lost";
  const fs::path lost = make_run(root.path, "proj", "grp", spec);
  write_lease(lost, other_host, 3600);
  write_text(lost / "summary.json", R"({"_step":41})");
  spec.id = "live";
  const fs::path live = make_run(root.path, "proj", "grp", spec);
  write_lease(live, other_host, 1);
  Serve s(root.path);

  const auto [status, body] = s.get("/api/runs");
  BOOST_REQUIRE_EQUAL(status, 200);
  BOOST_TEST_INFO(body);
  std::map<std::string, std::string> states;
  const Json runs(body); // named: the elements below view its parse
  for (auto g : arr(runs["groups"]))
    for (auto r : arr(g["runs"].value_unsafe()))
      states[std::string(r["path"].get_string().value_unsafe())] =
          std::string(r["state"].get_string().value_unsafe()) + "/" +
          std::string(r["shown_state"].get_string().value_unsafe()) + "/" +
          std::string(r["recorded_state"].get_string().value_unsafe()) + "/" +
          std::string(r["host_life"].get_string().value_unsafe());
  BOOST_TEST(states["proj/grp/lost"] == "crashed/crashed/running/gone");
  BOOST_TEST(states["proj/grp/live"] == "running/running/running/alive");

  const auto [run_status, run_body] = s.get("/api/run?run=proj/grp/lost");
  BOOST_REQUIRE_EQUAL(run_status, 200);
  BOOST_TEST_INFO(run_body);
  const Json j(run_body);
  BOOST_TEST(j["host_lost"].get_bool().value_unsafe());
  BOOST_TEST(contains(std::string(j["run_error"].get_string().value_unsafe()), "last committed step 41"));
  for (auto k : arr(j["ranks"])) {
    BOOST_TEST(k["state"].get_string().value_unsafe() == "crashed");
    BOOST_TEST(k["last_step"].get_int64().value_unsafe() == 41);
  }

  // The live run's host stops renewing: its page hears of it, though no run file changes.
  const std::string seen =
      s.events("proj/grp/live", "event: run", [&] { write_lease(live, other_host, 3600); }, R"("state":"crashed")");
  BOOST_TEST_INFO(seen);
  BOOST_TEST(contains(seen, R"("state":"running")"));
  BOOST_TEST(contains(seen, R"("state":"crashed","shown_state":"crashed","recorded_state":"running")"));
}

BOOST_AUTO_TEST_CASE(a_run_whose_files_a_crash_cut_short_is_marked_on_the_list_and_the_page) {
  TempDir root;
  const fs::path cut = make_run(root.path, "proj", "grp", {.id = "cut"});
  const fs::path whole = make_run(root.path, "proj", "grp", {.id = "whole"});
  // Each run.json records its history's length at the end; the cut one's file holds less.
  for (const fs::path& dir : {cut, whole}) {
    write_text(dir / "history.jsonl", history());
    std::string run = read_text(dir / "run.json");
    const auto bytes = fs::file_size(dir / "history.jsonl") + (dir == cut ? 100 : 0);
    run.insert(run.rfind('}'), R"(,"lengths":{"history.jsonl":)" + std::to_string(bytes) + "}");
    write_text(dir / "run.json", run);
  }
  Serve s(root.path);
  const auto [status, body] = s.get("/api/runs");
  BOOST_REQUIRE_EQUAL(status, 200);
  BOOST_TEST_INFO(body);
  std::map<std::string, bool> marked;
  const Json runs(body);
  for (auto g : arr(runs["groups"]))
    for (auto r : arr(g["runs"].value_unsafe()))
      marked[std::string(r["path"].get_string().value_unsafe())] = r["files_cut"].get_bool().value_unsafe();
  BOOST_TEST(marked["proj/grp/cut"]);
  BOOST_TEST(!marked["proj/grp/whole"]);
  const auto [run_status, run_body] = s.get("/api/run?run=proj/grp/cut");
  BOOST_REQUIRE_EQUAL(run_status, 200);
  const Json j(run_body);
  BOOST_TEST(j["state"].get_string().value_unsafe() == "finished");
  const std::string error(j["run_error"].get_string().value_unsafe());
  BOOST_TEST(contains(error, "history.jsonl holds"), error);
  BOOST_TEST(contains(error, "chorus recover"), error);
}

namespace {

/// A run of 100 rows: `loss` and `acc/rank-0..1` every row, `val/loss` and
/// `epoch` (1 to 10) every tenth; metrics.json declares `val/loss` and `acc`
/// with the step metric `epoch`.
fs::path epoch_run(const fs::path& root, const std::string& id) {
  const fs::path dir = make_run(root, "proj", "grp", {.id = id, .world = 2});
  std::string h;
  for (int s = 0; s < 100; ++s) {
    h += R"({"_step":)" + std::to_string(s) + R"(,"_timestamp":)" + std::to_string(1'700'000'000 + s) +
         R"(,"_runtime":)" + std::to_string(s) + R"(,"loss":)" + std::to_string(100 - s);
    for (int r = 0; r < 2; ++r) h += ",\"acc/rank-" + std::to_string(r) + "\":" + std::to_string(s + r * 1000);
    if (s % 10 == 9) h += R"(,"val/loss":)" + std::to_string(s * 0.5) + R"(,"epoch":)" + std::to_string((s + 1) / 10);
    h += "}\n";
  }
  write_text(dir / "history.jsonl", h);
  write_text(dir / "metrics.json", R"({"val/loss":{"reduce":"mean","summary":"min","step_metric":"epoch"},)"
                                   R"("acc":{"reduce":"none","summary":"max","step_metric":"epoch"}})"
                                   "\n");
  return dir;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_run_carries_its_declarations_and_a_key_is_charted_against_its_step_metric) {
  TempDir root;
  epoch_run(root.path, "declared");
  Serve s(root.path);
  const auto [status, body] = s.get("/api/run?run=proj/grp/declared");
  BOOST_REQUIRE_EQUAL(status, 200);
  BOOST_TEST_INFO(body);
  const Json j(body);
  BOOST_TEST(j["metrics"]["val/loss"]["step_metric"].get_string().value_unsafe() == "epoch");
  BOOST_TEST(j["metrics"]["val/loss"]["summary"].get_string().value_unsafe() == "min");
  BOOST_TEST(j["metrics"]["acc"]["reduce"].get_string().value_unsafe() == "none");
  BOOST_TEST(!j.has("error"), "no error for a sound run");

  // Against epoch: the rows that have both, x the epoch on each.
  const auto [vs, vbody] = s.get(series_path("proj/grp/declared", {"val/loss", "loss"}, "&xkey=epoch"));
  BOOST_REQUIRE_EQUAL(vs, 200);
  BOOST_TEST_INFO(vbody);
  const Json v(vbody);
  const std::vector<double> epochs{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  BOOST_TEST(numbers(v["series"]["val/loss"]["x"]) == epochs, boost::test_tools::per_element());
  const std::vector<double> val{4.5, 9.5, 14.5, 19.5, 24.5, 29.5, 34.5, 39.5, 44.5, 49.5};
  BOOST_TEST(numbers(v["series"]["val/loss"]["y"]) == val, boost::test_tools::per_element());
  // loss is on every row, epoch on every tenth: ten points, at the rows with an epoch.
  BOOST_TEST(numbers(v["series"]["loss"]["x"]) == epochs, boost::test_tools::per_element());
  BOOST_TEST(numbers(v["series"]["loss"]["y"]) == std::vector<double>({91, 81, 71, 61, 51, 41, 31, 21, 11, 1}),
             boost::test_tools::per_element());
  BOOST_TEST(v["series"]["loss"]["n"].get_int64().value_unsafe() == 10);
  BOOST_TEST(v["from"].get_double().value_unsafe() == 1.0);
  BOOST_TEST(v["to"].get_double().value_unsafe() == 10.0);
  BOOST_TEST(!v.has("x_missing"));
  // A per-rank column, zoomed into epochs 3 to 5.
  const auto [zs, zbody] = s.get(series_path("proj/grp/declared", {"acc/rank-1"}, "&xkey=epoch&from=3&to=5"));
  const Json z(zbody);
  BOOST_TEST(numbers(z["series"]["acc/rank-1"]["x"]) == std::vector<double>({3, 4, 5}), boost::test_tools::per_element());
  BOOST_TEST(numbers(z["series"]["acc/rank-1"]["y"]) == std::vector<double>({1029, 1039, 1049}),
             boost::test_tools::per_element());
  // A step metric the history does not have: nothing, and the answer says why.
  const auto [ms, mbody] = s.get(series_path("proj/grp/declared", {"loss"}, "&xkey=nosuch"));
  BOOST_TEST(ms == 200);
  BOOST_TEST(contains(mbody, R"("x_missing":true)"), mbody);
  BOOST_TEST(contains(mbody, R"("loss":{"n":0,"full":true,"x":[],"y":[])"), mbody);
}

BOOST_AUTO_TEST_CASE(a_long_step_metric_charts_the_same_kept_by_the_index_or_read_from_the_file) {
  TempDir root;
  // Past the points a key keeps in memory (65,536): declared as wave's step
  // metric, epoch keeps them all; undeclared, it is read from the file.
  const int rows = 70'000, spike = 41'234;
  const fs::path kept = wave_run(root.path, "kept", rows, spike, true);
  write_text(kept / "metrics.json", R"({"wave":{"reduce":"none","summary":"last","step_metric":"epoch"}})");
  wave_run(root.path, "read", rows, spike, true);
  Serve s(root.path);
  const double at = spike / 1000.0;
  std::vector<std::int64_t> cached; // the indexes' bytes after each run's first request
  for (const char* run : {"proj/grp/kept", "proj/grp/read"}) {
    BOOST_TEST_CONTEXT(run) {
      const auto [status, body] = s.get(series_path(run, {"wave"}, "&xkey=epoch&width=100"));
      BOOST_REQUIRE_EQUAL(status, 200);
      cached.push_back(Json(s.get("/api/status").second)["cached_bytes"].get_int64().value_unsafe());
      const Json all(body);
      const auto w = all["series"]["wave"];
      const std::vector<double> x = numbers(w["x"]), y = numbers(w["y"]);
      BOOST_TEST(w["n"].get_int64().value_unsafe() == rows);
      BOOST_TEST(x.size() <= 200u);
      BOOST_TEST(x.size() >= 100u);
      BOOST_TEST(std::is_sorted(x.begin(), x.end()));
      BOOST_TEST(all["from"].get_double().value_unsafe() == 0.0); // the step metric's range
      BOOST_TEST(all["to"].get_double().value_unsafe() == (rows - 1) / 1000.0);
      const auto top = std::find(y.begin(), y.end(), 100.0) - y.begin();
      BOOST_REQUIRE(static_cast<std::size_t>(top) < y.size());
      BOOST_TEST(x[static_cast<std::size_t>(top)] == at);
      BOOST_TEST(*std::min_element(y.begin(), y.end()) == -100.0);
      // Zoomed into 300 rows' epochs at 1000 pixels: every point, exactly.
      const auto [zs, zbody] = s.get(series_path(run, {"wave"}, "&xkey=epoch&width=1000&from=" +
                                                                  std::to_string((spike - 100) / 1000.0) +
                                                                  "&to=" + std::to_string((spike + 199) / 1000.0)));
      const Json zoom(zbody);
      const std::vector<double> zx = numbers(zoom["series"]["wave"]["x"]), zy = numbers(zoom["series"]["wave"]["y"]);
      BOOST_TEST(zoom["series"]["wave"]["full"].get_bool().value_unsafe());
      BOOST_REQUIRE_EQUAL(zx.size(), 300u);
      BOOST_TEST(zx[100] == at);
      BOOST_TEST(zy[100] == 100.0);
      BOOST_TEST(zy[101] == -100.0);
    }
  }
  // The declared run's index holds every point of epoch (a row and a value each); the other's none of them.
  BOOST_REQUIRE_EQUAL(cached.size(), 2u);
  const std::int64_t kept_bytes = cached[0], read_bytes = cached[1] - cached[0];
  BOOST_TEST(kept_bytes - read_bytes >= std::int64_t{rows} * 12, kept_bytes << " and " << read_bytes);
}

BOOST_AUTO_TEST_CASE(a_damaged_metrics_json_is_reported_on_the_run_not_fatal) {
  TempDir root;
  const fs::path torn = epoch_run(root.path, "torn");
  write_text(torn / "metrics.json", R"({"val/loss":{"reduce":"mean","summ)");
  const fs::path unknown = epoch_run(root.path, "unknown");
  write_text(unknown / "metrics.json", R"({"val/loss":{"reduce":"mean","summary":"median","step_metric":null}})");
  Serve s(root.path);
  for (const auto& [run, why] :
       {std::pair{"proj/grp/torn", "is not a JSON object"}, std::pair{"proj/grp/unknown", "median"}}) {
    BOOST_TEST_CONTEXT(run) {
      const auto [status, body] = s.get(std::string("/api/run?run=") + run);
      BOOST_REQUIRE_EQUAL(status, 200);
      BOOST_TEST_INFO(body);
      const Json j(body);
      const std::string error(j["error"].get_string().value_unsafe());
      BOOST_TEST(contains(error, "metrics.json"));
      BOOST_TEST(contains(error, why));
      BOOST_TEST(contains(error, "chorus recover")); // and its fix
      BOOST_TEST(j["metrics"].is_null());
      BOOST_TEST(j["history"]["rows"].get_int64().value_unsafe() == 100); // the rest is there
      BOOST_TEST(s.get(series_path(run, {"loss"}, "")).first == 200);
    }
  }
  const Output o = s.stop();
  BOOST_TEST(o.code == 0, o.out << o.err);
}

namespace {

/// The values of `step`'s histogram in column `column`: a normal spread
/// that widens and moves with the step; with `odd`, NaN and infinities too.
chorus::Histogram spread(std::int64_t step, int column, int n = 1000, bool odd = false) {
  std::mt19937 gen(static_cast<unsigned>(step * 31 + column));
  std::normal_distribution<double> d(0.1 * static_cast<double>(step) + column, 1.0 + 0.05 * static_cast<double>(step));
  chorus::Histogram h;
  for (int i = 0; i < n; ++i) h.add(d(gen));
  if (odd) {
    h.add(std::nan(""));
    h.add(HUGE_VAL);
    h.add(HUGE_VAL);
    h.add(-HUGE_VAL);
  }
  return h;
}

/// histograms.jsonl's line of `h` (written by store::append_histogram_line, the format's one writer).
std::string histogram_line(std::int64_t step, std::string_view key, int rank, std::uint32_t ranks,
                           const chorus::Histogram& h) {
  std::string out;
  chorus::store::append_histogram_line(out, step, (1'700'000'000 + step) * 1'000'000, step * 1'000'000, key, rank, ranks, h);
  return out;
}

/// A JSON number, or the text chorus writes a non-finite one as.
double value_of(simdjson::dom::element e) {
  std::string_view text;
  if (e.get(text) == simdjson::SUCCESS)
    return text == "NaN" ? std::nan("") : text == "Infinity" ? HUGE_VAL : text == "-Infinity" ? -HUGE_VAL : 0;
  return double(e);
}

std::string histograms_path(const std::string& run, const std::string& column, const std::string& rest = "") {
  return "/api/histograms?run=" + encode(run) + "&column=" + encode(column) + rest;
}

/// Checks `at` (the answer's chosen step) against `h`: its figures, and bins
/// that merge its buckets whole, at most `bins` of them.
void check_bins(simdjson::dom::element at, const chorus::Histogram& h, std::size_t bins) {
  BOOST_TEST(at["count"].get_uint64().value_unsafe() == h.count());
  BOOST_TEST(at["finite"].get_uint64().value_unsafe() == h.finite_count());
  BOOST_TEST(at["nan"].get_uint64().value_unsafe() == h.nan_count());
  BOOST_TEST(at["inf"].get_uint64().value_unsafe() == h.pos_inf_count());
  BOOST_TEST(at["-inf"].get_uint64().value_unsafe() == h.neg_inf_count());
  BOOST_TEST(value_of(at["min"].value_unsafe()) == h.min());
  BOOST_TEST(value_of(at["max"].value_unsafe()) == h.max());
  std::vector<std::array<double, 3>> got;
  for (simdjson::dom::element b : arr(at["bins"].value_unsafe())) {
    const std::vector<double> v = numbers(b);
    BOOST_REQUIRE_EQUAL(v.size(), 3u);
    got.push_back({v[0], v[1], v[2]});
  }
  BOOST_TEST(got.size() == bins);
  // Every value but NaN and the infinities, in bins that tile the range from the smallest to the largest.
  double total = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    total += got[i][2];
    BOOST_TEST(got[i][0] <= got[i][1]);
    if (i > 0) BOOST_TEST(got[i - 1][1] == got[i][0]);
  }
  BOOST_TEST(total == static_cast<double>(h.count() - h.nan_count() - h.pos_inf_count() - h.neg_inf_count()));
  BOOST_TEST(got.front()[0] == h.min());
  BOOST_TEST(got.back()[1] == h.max());
  // Near the even cuts of the range: off by a bucket at most (1/128 of its magnitude).
  const double width = (h.max() - h.min()) / static_cast<double>(bins);
  for (std::size_t i = 1; i < got.size(); ++i) {
    const double even = h.min() + width * static_cast<double>(i);
    BOOST_TEST(std::abs(got[i][0] - even) <= std::abs(even) / 64 + 1e-12, "cut " << i << " at " << got[i][0]);
  }
  // Each bucket lies whole in one bin: the bins' counts are sums of whole buckets.
  std::vector<double> sums(got.size(), 0);
  for (const chorus::Histogram::Bucket& b : h.buckets()) {
    const double lo = std::max(b.lo, h.min()), hi = std::min(b.hi, h.max());
    std::size_t holders = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i][0] <= lo && hi <= got[i][1]) {
        sums[i] += static_cast<double>(b.count);
        ++holders;
        break;
      }
    BOOST_TEST(holders == 1u, "bucket [" << b.lo << ", " << b.hi << ") in no bin");
  }
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST(sums[i] == got[i][2]);
}

} // namespace

BOOST_AUTO_TEST_CASE(histograms_give_their_quantiles_over_steps_and_a_steps_buckets_in_bins) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "hist", .world = 2});
  write_text(dir / "history.jsonl", history(10, 2));
  // grad merged over the two ranks (with NaN and infinities at step 3), act a column per rank.
  std::string lines;
  for (std::int64_t step = 0; step < 10; ++step) {
    lines += histogram_line(step, "act", 0, 0, spread(step, 1));
    lines += histogram_line(step, "act", 1, 0, spread(step, 2));
    lines += histogram_line(step, "grad", -1, 2, spread(step, 0, 1000, step == 3));
  }
  write_text(dir / "histograms.jsonl", lines);
  Serve s(root.path);

  // The run lists its columns: by key, each rank's.
  {
    const auto [status, body] = s.get("/api/run?run=proj/grp/hist");
    BOOST_REQUIRE_EQUAL(status, 200);
    BOOST_TEST_INFO(body);
    const Json j(body);
    BOOST_TEST(j["histograms"]["rows"].get_uint64().value_unsafe() == 30u);
    BOOST_TEST(j["histograms"]["skipped"].get_uint64().value_unsafe() == 0u);
    BOOST_TEST(j["histograms"]["last_step"].get_int64().value_unsafe() == 9);
    std::vector<std::string> columns;
    for (simdjson::dom::element c : arr(j["histograms"]["columns"].value_unsafe())) {
      columns.emplace_back(c["column"].get_string().value_unsafe());
      BOOST_TEST(c["steps"].get_uint64().value_unsafe() == 10u);
      BOOST_TEST(c["first_step"].get_int64().value_unsafe() == 0);
      BOOST_TEST(c["last_step"].get_int64().value_unsafe() == 9);
    }
    BOOST_TEST(columns == (std::vector<std::string>{"act/rank-0", "act/rank-1", "grad"}), boost::test_tools::per_element());
    BOOST_TEST(contains(body, R"("column":"act/rank-1","key":"act","rank":1)"));
    BOOST_TEST(contains(body, R"("column":"grad","key":"grad","rank":null)"));
  }

  // grad: per step the quantiles Histogram::quantile gives, its counts, and the last step's bins.
  {
    const auto [status, body] = s.get(histograms_path("proj/grp/hist", "grad"));
    BOOST_REQUIRE_EQUAL(status, 200);
    BOOST_TEST_INFO(body.substr(0, 2000));
    const Json j(body);
    BOOST_TEST(j["steps"].get_uint64().value_unsafe() == 10u);
    BOOST_TEST(j["full"].get_bool().value_unsafe());
    BOOST_TEST(j["rank"].is_null());
    const simdjson::dom::element series = j["series"];
    BOOST_TEST(numbers(series["step"].value_unsafe()) == (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}),
               boost::test_tools::per_element());
    const std::pair<const char*, double> quantiles[] = {{"p0", 0.0},   {"p5", 0.05}, {"p25", 0.25}, {"p50", 0.5},
                                                        {"p75", 0.75}, {"p95", 0.95}, {"p100", 1.0}};
    for (const auto& [name, q] : quantiles) {
      std::size_t i = 0;
      for (simdjson::dom::element v : arr(series[name].value_unsafe())) {
        const chorus::Histogram h = spread(static_cast<std::int64_t>(i), 0, 1000, i == 3);
        BOOST_TEST(value_of(v) == h.quantile(q), name << " at step " << i);
        ++i;
      }
      BOOST_TEST(i == 10u);
    }
    BOOST_TEST(value_of(arr(series["p0"].value_unsafe()).at(3).value_unsafe()) == -HUGE_VAL); // the infinities sort at the ends
    BOOST_TEST(numbers(series["count"].value_unsafe())[3] == 1004);
    BOOST_TEST(numbers(series["nan"].value_unsafe())[3] == 1);
    BOOST_TEST(numbers(series["inf"].value_unsafe())[3] == 2);
    BOOST_TEST(numbers(series["-inf"].value_unsafe())[3] == 1);
    BOOST_TEST(numbers(series["ranks"].value_unsafe())[0] == 2);
    BOOST_TEST(numbers(series["wall"].value_unsafe())[9] == 1'700'000'009);
    BOOST_TEST(j["at"]["step"].get_int64().value_unsafe() == 9);
    check_bins(j["at"], spread(9, 0), 60);
  }

  // A chosen step, the last at or before it, in fewer bins; a rank's column.
  for (const auto& [rest, column, step, bins] :
       {std::tuple{"&step=3", "grad", 3, 60}, std::tuple{"&step=3&bins=5", "grad", 3, 5},
        std::tuple{"&step=1000", "grad", 9, 60}, std::tuple{"&step=4&bins=1", "act/rank-1", 4, 1}}) {
    BOOST_TEST_CONTEXT(column << rest) {
      const auto [status, body] = s.get(histograms_path("proj/grp/hist", column, rest));
      BOOST_REQUIRE_EQUAL(status, 200);
      const Json j(body);
      BOOST_TEST(j["at"]["step"].get_int64().value_unsafe() == step);
      const bool grad = std::string_view(column) == "grad";
      check_bins(j["at"], spread(step, grad ? 0 : 2, 1000, grad && step == 3), static_cast<std::size_t>(bins));
    }
  }
  const auto [one_status, one] = s.get(histograms_path("proj/grp/hist", "act/rank-1", "&points=0"));
  BOOST_REQUIRE_EQUAL(one_status, 200);
  BOOST_TEST(Json(one)["rank"].get_int64().value_unsafe() == 1);
  BOOST_TEST(numbers(Json(one)["series"]["p50"]).empty());

  // Refusals: no column, one the run lacks, a run without histograms, numbers out of range.
  make_run(root.path, "proj", "grp", {.id = "plain"});
  for (const auto& [path, code] :
       {std::pair{std::string("/api/histograms?run=proj/grp/hist"), 400}, std::pair{histograms_path("proj/grp/hist", "loss"), 404},
        std::pair{histograms_path("proj/grp/plain", "grad"), 404}, std::pair{histograms_path("proj/grp/hist", "grad", "&bins=0"), 400},
        std::pair{histograms_path("proj/grp/hist", "grad", "&points=5000"), 400},
        std::pair{histograms_path("proj/grp/hist", "grad", "&step=-1"), 400},
        std::pair{histograms_path("proj/../hist", "grad"), 400}}) {
    const auto [status, body] = s.get(path);
    BOOST_TEST(status == code, path << ": " << body);
    BOOST_TEST(contains(body, "\"error\""), body);
  }
  const auto [plain_status, plain] = s.get("/api/run?run=proj/grp/plain");
  BOOST_TEST(contains(plain, R"("histograms":{"rows":0,)"), plain);
  BOOST_TEST(contains(plain, R"("missing":true)"), plain);
}

BOOST_AUTO_TEST_CASE(histograms_of_a_long_run_are_spread_over_steps_and_follow_the_file_as_it_grows) {
  TempDir root;
  const fs::path dir = make_run(root.path, "proj", "grp", {.id = "long", .state = "running", .ended = false});
  std::string lines;
  for (std::int64_t step = 0; step < 1200; ++step) lines += histogram_line(step, "grad", -1, 0, spread(step, 0, 50));
  write_text(dir / "histograms.jsonl", lines);
  Serve s(root.path);
  auto answer = [&](const std::string& rest = "") {
    const auto [status, body] = s.get(histograms_path("proj/grp/long", "grad", rest));
    BOOST_REQUIRE_EQUAL(status, 200);
    return body;
  };
  {
    // At most 500 steps, evenly spread, the first and the last among them.
    const Json j(answer());
    BOOST_TEST(j["steps"].get_uint64().value_unsafe() == 1200u);
    BOOST_TEST(!j["full"].get_bool().value_unsafe());
    const std::vector<double> steps = numbers(j["series"]["step"]);
    BOOST_REQUIRE_EQUAL(steps.size(), 500u);
    BOOST_TEST(steps.front() == 0);
    BOOST_TEST(steps.back() == 1199);
    for (std::size_t i = 1; i < steps.size(); ++i) BOOST_TEST((steps[i] - steps[i - 1] == 2 || steps[i] - steps[i - 1] == 3));
    BOOST_TEST(numbers(j["series"]["p50"]).size() == 500u);
    BOOST_TEST(numbers(Json(answer("&points=7"))["series"]["step"]) ==
                   (std::vector<double>{0, 200, 400, 600, 799, 999, 1199}),
               boost::test_tools::per_element());
  }
  // A line appended is there at the next request; a line being written is not, yet.
  {
    std::ofstream f(dir / "histograms.jsonl", std::ios::app);
    f << histogram_line(1200, "grad", -1, 0, spread(1200, 0, 50));
    f << histogram_line(1201, "grad", -1, 0, spread(1201, 0, 50)).substr(0, 40);
  }
  {
    const Json j(answer());
    BOOST_TEST(j["steps"].get_uint64().value_unsafe() == 1201u);
    BOOST_TEST(j["last_step"].get_int64().value_unsafe() == 1200);
    BOOST_TEST(j["unfinished"].get_bool().value_unsafe());
    BOOST_TEST(j["at"]["step"].get_int64().value_unsafe() == 1200);
    BOOST_TEST(numbers(j["series"]["step"]).back() == 1200);
    check_bins(j["at"], spread(1200, 0, 50), 60);
  }
  // Damaged lines are skipped and counted, the first named; the lines after them are read.
  {
    std::ofstream f(dir / "histograms.jsonl", std::ios::app);
    f << histogram_line(1201, "grad", -1, 0, spread(1201, 0, 50)).substr(40);
    f << "{\"_step\": 1202, \"key\": oops}\n";
    std::string wrong = histogram_line(1202, "grad", -1, 0, spread(1202, 0, 50));
    wrong.replace(wrong.find("\"count\":50"), 10, "\"count\":51");
    f << wrong;
    f << histogram_line(1203, "grad", -1, 0, spread(1203, 0, 50));
  }
  {
    const std::string body = answer("&step=1202");
    BOOST_TEST_INFO(body.substr(0, 600));
    const Json j(body);
    BOOST_TEST(j["skipped"].get_uint64().value_unsafe() == 2u);
    const std::string first(j["first_skipped"].get_string().value_unsafe());
    BOOST_TEST(contains(first, "line 1203: "), first);
    BOOST_TEST(j["steps"].get_uint64().value_unsafe() == 1203u);
    BOOST_TEST(j["last_step"].get_int64().value_unsafe() == 1203);
    BOOST_TEST(!j["unfinished"].get_bool().value_unsafe());
    BOOST_TEST(j["at"]["step"].get_int64().value_unsafe() == 1201); // the last at or before 1202
    check_bins(j["at"], spread(1201, 0, 50), 60);
  }
  const auto [status, run] = s.get("/api/run?run=proj/grp/long");
  BOOST_TEST(contains(run, "histograms.jsonl: 2 damaged line(s) skipped (line 1203: "), run);
  // The event stream says when the histograms grow.
  const std::string seen = s.events("proj/grp/long", "event: histograms", [&] {
    std::ofstream f(dir / "histograms.jsonl", std::ios::app);
    f << histogram_line(1204, "grad", -1, 0, spread(1204, 0, 50));
  }, R"("last_step":1204)");
  BOOST_TEST_INFO(seen);
  BOOST_TEST(contains(seen, R"("rows":1203,"skipped":2,)"));
  BOOST_TEST(contains(seen, R"("rows":1204,"skipped":2,)"));
  BOOST_TEST(contains(seen, R"("last_step":1204)"));
}
