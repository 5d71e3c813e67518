// `chorus serve`'s events of a run (events.jsonl, io/store/event_log.hpp) over
// HTTP, against a real server (tests/cli/serve_client.hpp): GET
// /api/run/events answers the events as the file has them, lines appended
// while it serves included (only the new ones with `after`), a line being
// written only once it is whole, a line that is no event skipped and
// counted; a run keeps its last 10,000; a file rewritten is read afresh;
// the page's event stream says when the file changed; an unknown run and a
// missing token are refused as the rest of the API refuses them.
#define BOOST_TEST_MODULE cli_serve_events
#include <boost/test/unit_test.hpp>

#include "io/store/event_log.hpp"
#include "tests/cli/run_files.hpp"
#include "tests/cli/serve_client.hpp"
#include "tests/cli/serve_media_run.hpp"

#include <cstdint>
#include <string>
#include <vector>

using namespace chorus::test;
using chorus::EventKind;
using chorus::core::EventDraft;
namespace fs = std::filesystem;

namespace {

const std::string run = "proj/grp/r1";
const std::string events_path = "/api/run/events?run=" + encode(run);

/// The events.jsonl line of event `seq` (with its newline), as the run host writes it: of rank `seq % 4`
/// at step `10 * seq` (run_finished: neither).
std::string line(std::uint64_t seq, EventKind kind = EventKind::stalled, std::string message = {}) {
  EventDraft d;
  d.kind = kind;
  d.ts_us = static_cast<std::int64_t>(1'700'000'000 + seq) * 1'000'000 + 250'000;
  d.rank = static_cast<int>(seq % 4);
  d.step = static_cast<std::int64_t>(10 * seq);
  if (kind == EventKind::run_finished) {
    // The run's end: of no rank, at no step.
    d.rank = -1;
    d.step = -1;
    d.state = chorus::RunState::finished;
  }
  d.message = message.empty() ? "event " + std::to_string(seq) : std::move(message);
  if (kind == EventKind::stalled) {
    d.host = "node-a";
    d.pid = 4242;
    d.others_step = d.step + 30;
    d.seconds_us = 301'500'000;
  }
  return chorus::store::event_line(d, seq) + "\n";
}

/// The `seq` of each event of an answer.
std::vector<std::uint64_t> seqs(const Json& j) {
  std::vector<std::uint64_t> out;
  for (simdjson::dom::element e : arr(j["events"])) out.push_back(std::uint64_t(e["seq"]));
  return out;
}

fs::path events_run(const fs::path& root, const std::string& lines) {
  const fs::path dir = make_run(root, "proj", "grp", {.id = "r1", .state = "running", .ended = false});
  write_text(dir / "history.jsonl", history(20, 2));
  if (!lines.empty()) write_text(dir / chorus::store::events_file, lines);
  return dir;
}

} // namespace

BOOST_AUTO_TEST_CASE(events_are_answered_as_the_file_has_them_and_those_appended_while_serving_too) {
  TempDir root;
  const fs::path dir = events_run(root.path, line(0) + line(1, EventKind::nonfinite) +
                                                 line(2, EventKind::run_finished, "the run <b>ended</b> finished"));
  Serve s(root.path);
  const auto [status, body] = s.get(events_path);
  BOOST_REQUIRE_EQUAL(status, 200);
  const Json j(body);
  BOOST_TEST(std::string_view(j["run"]) == run);
  BOOST_TEST(std::uint64_t(j["rows"]) == 3u);
  BOOST_TEST(std::uint64_t(j["skipped"]) == 0u);
  BOOST_TEST(!bool(j["missing"]));
  BOOST_TEST(!bool(j["unfinished"]));
  BOOST_TEST(std::uint64_t(j["left_out"]) == 0u);
  BOOST_TEST(std::int64_t(j["last_step"]) == 10);
  BOOST_TEST(seqs(j) == (std::vector<std::uint64_t>{0, 1, 2}), boost::test_tools::per_element());
  // Each event: the fields every kind has, and the details of its line.
  const simdjson::dom::element first = arr(j["events"]).at(0);
  BOOST_TEST(std::string_view(first["kind"]) == "stalled");
  BOOST_TEST(double(first["time"]) == 1'700'000'000.25);
  BOOST_TEST(std::int64_t(first["rank"]) == 0);
  BOOST_TEST(std::int64_t(first["step"]) == 0);
  BOOST_TEST(first["key"].is_null());
  BOOST_TEST(first["state"].is_null());
  BOOST_TEST(std::string_view(first["message"]) == "event 0");
  BOOST_TEST(std::string_view(first["host"]) == "node-a");
  BOOST_TEST(std::int64_t(first["pid"]) == 4242);
  BOOST_TEST(std::int64_t(first["others_step"]) == 30);
  BOOST_TEST(double(first["seconds"]) == 301.5);
  const simdjson::dom::element last = arr(j["events"]).at(2);
  BOOST_TEST(std::string_view(last["kind"]) == "run_finished");
  BOOST_TEST(std::string_view(last["state"]) == "finished");
  BOOST_TEST(last["step"].is_null());
  BOOST_TEST(last["rank"].is_null());
  BOOST_TEST(std::string_view(last["message"]) == "the run <b>ended</b> finished");

  // Two more while it serves: both in the next answer; with `after`, only they.
  append_text(dir / chorus::store::events_file, line(3, EventKind::threshold) + line(4, EventKind::rank_failed));
  const Json all(s.get(events_path).second);
  BOOST_TEST(seqs(all) == (std::vector<std::uint64_t>{0, 1, 2, 3, 4}), boost::test_tools::per_element());
  BOOST_TEST(std::uint64_t(all["generation"]) == std::uint64_t(j["generation"]));
  const Json since(s.get(events_path + "&after=3").second);
  BOOST_TEST(std::uint64_t(since["rows"]) == 5u);
  BOOST_TEST(seqs(since) == (std::vector<std::uint64_t>{3, 4}), boost::test_tools::per_element());
  BOOST_TEST(seqs(Json(s.get(events_path + "&after=5").second)).empty());
  BOOST_TEST(seqs(Json(s.get(events_path + "&after=0").second)).size() == 5u);
}

BOOST_AUTO_TEST_CASE(a_line_being_written_is_served_once_it_is_whole) {
  TempDir root;
  const fs::path dir = events_run(root.path, line(0));
  Serve s(root.path);
  BOOST_TEST(seqs(Json(s.get(events_path).second)).size() == 1u);
  const std::string torn = line(1, EventKind::straggler);
  append_text(dir / chorus::store::events_file, torn.substr(0, torn.size() / 2));
  const Json half(s.get(events_path).second);
  BOOST_TEST(seqs(half) == (std::vector<std::uint64_t>{0}), boost::test_tools::per_element());
  BOOST_TEST(std::uint64_t(half["rows"]) == 1u);
  BOOST_TEST(std::uint64_t(half["skipped"]) == 0u);
  BOOST_TEST(bool(half["unfinished"]));
  // Its end, but no newline yet: still not.
  append_text(dir / chorus::store::events_file, torn.substr(torn.size() / 2, torn.size() - 1 - torn.size() / 2));
  BOOST_TEST(seqs(Json(s.get(events_path).second)).size() == 1u);
  append_text(dir / chorus::store::events_file, "\n");
  const Json whole(s.get(events_path).second);
  BOOST_TEST(seqs(whole) == (std::vector<std::uint64_t>{0, 1}), boost::test_tools::per_element());
  BOOST_TEST(!bool(whole["unfinished"]));
  BOOST_TEST(std::string_view(arr(whole["events"]).at(1)["kind"]) == "straggler");
}

BOOST_AUTO_TEST_CASE(a_line_that_is_no_event_is_skipped_and_counted) {
  TempDir root;
  events_run(root.path, line(0) + "not JSON at all\n" + line(1) + R"({"seq":2,"kind":"exploded","time":1,"message":"?"})" +
                            "\n" + line(3));
  Serve s(root.path);
  const Json j(s.get(events_path).second);
  BOOST_TEST(seqs(j) == (std::vector<std::uint64_t>{0, 1, 3}), boost::test_tools::per_element());
  BOOST_TEST(std::uint64_t(j["rows"]) == 3u);
  BOOST_TEST(std::uint64_t(j["skipped"]) == 2u);
  const std::string why{std::string_view(j["first_skipped"])};
  BOOST_TEST(why.starts_with("line 2: not JSON"), why);
  // The run's other answers are not troubled by it.
  BOOST_TEST(s.get("/api/run?run=" + encode(run)).first == 200);
}

BOOST_AUTO_TEST_CASE(a_run_keeps_its_last_ten_thousand_events_and_counts_the_others) {
  TempDir root;
  std::string lines;
  for (std::uint64_t seq = 0; seq < 10'050; ++seq) lines += line(seq);
  const fs::path dir = events_run(root.path, lines);
  Serve s(root.path);
  const Json j(s.get(events_path).second);
  BOOST_TEST(std::uint64_t(j["rows"]) == 10'050u);
  BOOST_TEST(std::uint64_t(j["left_out"]) == 50u);
  BOOST_TEST(std::uint64_t(j["kept"]) == 10'000u);
  const std::vector<std::uint64_t> got = seqs(j);
  BOOST_REQUIRE_EQUAL(got.size(), 10'000u);
  BOOST_TEST(got.front() == 50u);
  BOOST_TEST(got.back() == 10'049u);
  // One more pushes out the oldest kept.
  append_text(dir / chorus::store::events_file, line(10'050));
  const Json more(s.get(events_path + "&after=10040").second);
  BOOST_TEST(std::uint64_t(more["left_out"]) == 51u);
  BOOST_TEST(seqs(more).size() == 11u);
}

BOOST_AUTO_TEST_CASE(a_file_rewritten_is_read_afresh) {
  TempDir root;
  const fs::path dir = events_run(root.path, line(0) + line(1) + line(2));
  Serve s(root.path);
  const Json before(s.get(events_path).second);
  BOOST_TEST(seqs(before).size() == 3u);
  // chorus recover writes the file anew: shorter here, so that it reads as another file.
  write_text(dir / chorus::store::events_file, line(0, EventKind::rank_lost));
  const Json after(s.get(events_path + "&after=3").second);
  BOOST_TEST(std::uint64_t(after["generation"]) != std::uint64_t(before["generation"]));
  BOOST_TEST(std::uint64_t(after["rows"]) == 1u);
  const Json all(s.get(events_path).second);
  BOOST_REQUIRE_EQUAL(seqs(all).size(), 1u);
  BOOST_TEST(std::string_view(arr(all["events"]).at(0)["kind"]) == "rank_lost");
}

BOOST_AUTO_TEST_CASE(a_run_without_events_has_none_and_says_its_file_is_missing) {
  TempDir root;
  const fs::path dir = events_run(root.path, "");
  Serve s(root.path);
  const Json j(s.get(events_path).second);
  BOOST_TEST(bool(j["missing"]));
  BOOST_TEST(seqs(j).empty());
  write_text(dir / chorus::store::events_file, line(0));
  const Json now(s.get(events_path).second);
  BOOST_TEST(!bool(now["missing"]));
  BOOST_TEST(seqs(now).size() == 1u);
}

BOOST_AUTO_TEST_CASE(events_appended_reach_the_event_stream) {
  TempDir root;
  const fs::path dir = events_run(root.path, line(0) + line(1));
  Serve s(root.path);
  const std::string prefix = "event: events\ndata: {\"run\":\"" + run + "\",\"rows\":";
  const std::string seen = s.events(
      encode(run), prefix + "2,",
      [&] { append_text(dir / chorus::store::events_file, line(2, EventKind::resumed) + line(3).substr(0, 20)); },
      prefix + "3,");
  BOOST_TEST_INFO(seen);
  BOOST_TEST(contains(seen, prefix + "2,"));
  BOOST_TEST(contains(seen, prefix + "3,"));
  BOOST_TEST(contains(seen, R"("unfinished":true)"));
}

BOOST_AUTO_TEST_CASE(an_unknown_run_a_bad_path_and_a_bad_after_are_refused_as_the_api_refuses_them) {
  TempDir root;
  events_run(root.path, line(0));
  Serve s(root.path);
  for (const auto& [path, status] : std::vector<std::pair<std::string, int>>{
           {"/api/run/events?run=proj/grp/nope", 404},
           {"/api/run/events?run=proj/grp/../grp/r1", 400},
           {"/api/run/events?run=/etc", 400},
           {"/api/run/events", 400},
           {events_path + "&after=-1", 400},
           {events_path + "&after=many", 400}}) {
    const auto [got, body] = s.get(path);
    BOOST_TEST(got == status, path);
    BOOST_TEST(Json(body).has("error"), path);
  }
  // The same refusal as the run's own endpoint.
  BOOST_TEST(s.get("/api/run/events?run=proj/grp/nope").second == s.get("/api/run?run=proj/grp/nope").second);
  // Only GET and HEAD.
  httplib::Client c = s.client();
  const httplib::Result post = c.Post(events_path, "", "text/plain");
  BOOST_REQUIRE(post);
  BOOST_TEST(post->status == 405);
}

BOOST_AUTO_TEST_CASE(the_events_need_the_token) {
  TempDir root;
  events_run(root.path, line(0));
  Serve s(root.path); // on loopback, which every user of the machine reaches
  BOOST_REQUIRE_EQUAL(s.token.size(), 32u);
  s.with_token = false;
  BOOST_TEST(s.get(events_path).first == 401);
  BOOST_TEST(s.get(events_path + "&token=" + std::string(32, '0')).first == 401);
  const auto [status, body] = s.get(events_path + "&token=" + s.token);
  BOOST_TEST(status == 200);
  BOOST_TEST(seqs(Json(body)).size() == 1u);
}
