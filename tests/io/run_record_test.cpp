#define BOOST_TEST_MODULE io_run_record
#include <boost/test/unit_test.hpp>

#include "io/store/run_record.hpp"
#include "tests/io/files.hpp"
#include "tests/temp_dir.hpp"

#include <simdjson.h>

#include <optional>
#include <string>

using namespace chorus;
using namespace chorus::store;
using chorus::test::files::mode_of;
using chorus::test::files::slurp;
using chorus::test::files::spit;
using chorus::test::TempDir;

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)
BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::RunState)
BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::store::RunRecord)

namespace {

/// A record with every field set, as a run of a group resumed once leaves it.
RunRecord full_record() {
  RunRecord r;
  r.id = "abc123";
  r.name = "the \"best\" run";
  r.project = "proj";
  r.group = "torchrun-1";
  r.job_type = "train";
  r.notes = "line one\nline two, \xC3\xA9t\xC3\xA9";
  r.mode = "shared";
  r.scope = "global";
  r.host = "node-0";
  r.pid = 4242;
  r.dir = "/runs/proj/torchrun-1/abc123";
  r.launcher = "torchrun";
  r.job_id = "job-7";
  r.nodes = 2;
  r.group_index = 1;
  r.rank = 4;
  r.node = 1;
  r.state = "failed";
  r.start_us = 1'700'000'000'250'000;
  r.end_us = 1'700'000'105'123'456;
  r.segments = {{1'700'000'000'250'000, 1'700'000'003'250'000, "crashed", ExitCodes{{4, 137}, {5, 137}}},
                {1'700'000'100'250'000, 1'700'000'105'123'456, "finished", std::nullopt}};
  r.exit_codes = ExitCodes{{4, 0}, {5, 3}};
  r.world_size = 2;
  r.rows = 1234;
  r.rejected = 5;
  r.lengths = {{"history.jsonl", 123456}, {"events.jsonl", 0}, {"summary.json", 88}};
  r.error = "rank 5 exited with code 3 after the run ended";
  r.ranks = {{4, "finished", 99, "node-0", "", 1'700'000'100'312'000},
             {5, "crashed", -1, "node-1", "the run host died", std::nullopt}};
  r.unknown = {{"from_a_later_version", R"({"a":[1,2,null],"b":"x"})"}};
  return r;
}

RunRecord parse_ok(const std::string& json) {
  Result<RunRecord> r = RunRecord::parse(json);
  BOOST_TEST_REQUIRE(r.has_value(), r.error().message() << ": " << json);
  return *r;
}

} // namespace

BOOST_AUTO_TEST_CASE(every_field_round_trips) {
  const RunRecord r = full_record();
  const std::string json = r.json();
  const RunRecord back = parse_ok(json);
  BOOST_TEST(back.damage.empty(), back.damage);
  BOOST_TEST((back == r), json);
  BOOST_TEST(back.json() == json); // and writes the same text again

  // Through a file: atomic, private, one object and a newline.
  TempDir tmp;
  const std::string path = tmp / "run.json";
  BOOST_REQUIRE(!r.write(path));
  BOOST_TEST(slurp(path) == json + "\n");
  BOOST_TEST(mode_of(path) == 0600u);
  const Result<RunRecord> read = RunRecord::read(path);
  BOOST_REQUIRE_MESSAGE(read.has_value(), read.error().message());
  BOOST_TEST((*read == r));
}

BOOST_AUTO_TEST_CASE(the_file_keeps_its_keys_and_types) {
  const std::string json = full_record().json();
  simdjson::dom::parser p;
  simdjson::dom::object o;
  BOOST_REQUIRE(!p.parse(json).get(o));
  for (const char* key : {"id", "name", "project", "group", "job_type", "notes", "mode", "scope", "host", "dir",
                          "launcher", "job_id", "state", "error"})
    BOOST_TEST(o[key].is_string(), key);
  for (const char* key : {"pid", "nodes", "group_index", "rank", "node", "world_size", "rows", "rejected"})
    BOOST_TEST(o[key].is_int64(), key);
  BOOST_TEST(o["start_time"].is_number());
  BOOST_TEST(o["end_time"].is_number());
  BOOST_TEST(o["segments"].is_array());
  BOOST_TEST(o["ranks"].is_array());
  BOOST_TEST(o["exit_codes"].is_object());
  // Times are exact to the microsecond, not rounded through a double.
  BOOST_TEST(json.find(R"("start_time":1700000000.25,"end_time":1700000105.123456,)") != std::string::npos, json);
  BOOST_TEST(json.find(R"("exit_codes":{"4":0,"5":3})") != std::string::npos, json);
  BOOST_TEST(json.find(R"("lengths":{"history.jsonl":123456,"events.jsonl":0,"summary.json":88},"error":)") !=
                 std::string::npos,
             json);
  BOOST_TEST(json.find(R"("ranks":[{"rank":4,"state":"finished","last_step":99,"host":"node-0","message":"",)"
                       R"("joined":1700000100.312},{"rank":5,"state":"crashed","last_step":-1,"host":"node-1",)"
                       R"("message":"the run host died"}])") != std::string::npos,
             json);
  // The identity first, in the order a run host writes it.
  BOOST_TEST(json.rfind(R"({"id":"abc123","name":"the \"best\" run","project":"proj",)", 0) == 0u, json);
}

BOOST_AUTO_TEST_CASE(a_running_run_has_a_null_end) {
  RunRecord r;
  r.id = "r";
  r.state = "running";
  r.start_us = 3;
  const std::string json = r.json();
  BOOST_TEST(json.find(R"("state":"running","start_time":0.000003,"end_time":null,"segments":[])") != std::string::npos,
             json);
  BOOST_TEST(json.find("exit_codes") == std::string::npos);
  BOOST_TEST(json.find("\"error\"") == std::string::npos);
  BOOST_TEST(json.find("group_index") == std::string::npos); // not a run of a group
  BOOST_TEST(!parse_ok(json).end_us.has_value());
}

BOOST_AUTO_TEST_CASE(identity_json_is_who_the_run_is_and_when_it_started) {
  const RunRecord r = full_record();
  const std::string json = r.identity_json();
  BOOST_TEST(json.find(R"("nodes":2,"start_time":1700000000.25,"group_index":1,"rank":4,"node":1,)") !=
                 std::string::npos,
             json);
  for (const char* key : {"\"state\"", "end_time", "segments", "exit_codes", "world_size", "ranks", "\"error\""})
    BOOST_TEST(json.find(key) == std::string::npos, key);
  BOOST_TEST(json.find("from_a_later_version") != std::string::npos);
  BOOST_TEST((parse_ok(json).identity() == r.identity()));
  BOOST_TEST((r.identity().identity() == r.identity()));
}

BOOST_AUTO_TEST_CASE(members_a_reader_does_not_know_survive_a_rewrite) {
  RunRecord r = parse_ok(R"({"id":"r","later":{"x":[1,"two"]},"state":"finished","later":7,"ranks":[]})");
  BOOST_REQUIRE(r.unknown.size() == 1u); // the first of a repeated key counts
  BOOST_TEST(r.unknown[0].first == "later");
  BOOST_TEST(r.unknown[0].second == R"({"x":[1,"two"]})");
  r.exit_codes = ExitCodes{{0, 0}};
  BOOST_TEST(r.json() == R"({"id":"r","later":{"x":[1,"two"]},"state":"finished","exit_codes":{"0":0},"ranks":[]})");
}

BOOST_AUTO_TEST_CASE(what_a_file_lacks_stays_lacking_until_it_has_a_value) {
  RunRecord r = parse_ok(R"({"id":"r","state":"running"})");
  BOOST_TEST(r.json() == R"({"id":"r","state":"running"})");
  r.name = "named";
  r.end_us = 2'000'000;
  BOOST_TEST(r.json() == R"({"id":"r","name":"named","state":"running","end_time":2})");
  // A record made afresh has every member of the identity.
  RunRecord fresh;
  fresh.id = "r";
  BOOST_TEST(fresh.json().find(R"("job_type":"","notes":"")") != std::string::npos, fresh.json());
  // Only who the run is: the run's own members are written afresh.
  const RunRecord who = parse_ok(R"({"id":"r","pid":7,"state":"running"})").identity();
  BOOST_TEST(who.json() == R"({"id":"r","pid":7,"state":"","end_time":null,"segments":[],"ranks":[]})");
}

BOOST_AUTO_TEST_CASE(a_damaged_file_is_named_with_its_fix) {
  TempDir tmp;
  const std::string path = tmp / "run.json";
  const std::string whole = full_record().json();
  spit(path, whole.substr(0, whole.size() / 2)); // cut short by a crash
  Error e = RunRecord::read(path).error();
  BOOST_TEST((e.code() == Errc::invalid_argument));
  BOOST_TEST(e.message().find(path + " is not valid JSON (") == 0u, e.message());
  BOOST_TEST(e.message().find("cut short while being written") != std::string::npos, e.message());
  BOOST_TEST(e.message().find("chorus recover " + tmp.str() + " rebuilds it") != std::string::npos, e.message());

  spit(path, "[1,2]");
  e = RunRecord::read(path).error();
  BOOST_TEST(e.message().find(path + " is not a JSON object. chorus recover ") == 0u, e.message());

  spit(path, "");
  e = RunRecord::read(path).error();
  BOOST_TEST(e.message().find("is not valid JSON") != std::string::npos, e.message());

  // One that cannot be read at all says so as reading does.
  e = RunRecord::read(tmp / "absent.json").error();
  BOOST_TEST((e.code() == Errc::io_error));
  BOOST_TEST(e.message().find(tmp / "absent.json") != std::string::npos, e.message());
}

BOOST_AUTO_TEST_CASE(members_of_the_wrong_type_are_left_out_and_huge_numbers_named) {
  const RunRecord r = parse_ok(R"({"id":7,"pid":1e300,"nodes":"two","world_size":2.9,"state":"finished",)"
                               R"("start_time":1e300,"end_time":"soon","rows":-1,)"
                               R"("ranks":[3,{"rank":1,"last_step":1.5e19}],"segments":{},)"
                               R"("exit_codes":{"0":1,"x":2,"-1":3,"2":"4","3":1.5,"4":0}})");
  BOOST_TEST(r.id.empty());
  BOOST_TEST(r.pid == 0);
  BOOST_TEST(r.nodes == 0);
  BOOST_TEST(r.damage == "\"pid\" is 1e+300, beyond a whole number's range"); // the first only
  BOOST_TEST(*r.world_size == 2); // cut to its integer part
  BOOST_TEST(*r.rows == -1);
  BOOST_TEST(!r.start_us.has_value()); // no calendar holds it
  BOOST_TEST(!r.end_us.has_value());
  BOOST_REQUIRE(r.ranks.size() == 1u);
  BOOST_TEST(r.ranks[0].rank == 1);
  BOOST_TEST(r.ranks[0].last_step == -1);
  BOOST_TEST(r.segments.empty());
  BOOST_TEST((*r.exit_codes == ExitCodes{{0, 1}, {4, 0}}));
}

BOOST_AUTO_TEST_CASE(times_read_from_integers_and_decimals) {
  const RunRecord r = parse_ok(R"({"start_time":1700000000,"end_time":1700000000.123456,)"
                               R"("segments":[{"start_time":-1.5,"end_time":null,"state":"running"}]})");
  BOOST_TEST(*r.start_us == 1'700'000'000'000'000);
  BOOST_TEST(*r.end_us == 1'700'000'000'123'456);
  BOOST_REQUIRE(r.segments.size() == 1u);
  BOOST_TEST(*r.segments[0].start_us == -1'500'000);
  BOOST_TEST(!r.segments[0].end_us.has_value());
  BOOST_TEST(RunRecord::seconds(*r.end_us) == 1700000000.123456);
  BOOST_TEST(r.json().find(R"("segments":[{"start_time":-1.5,"end_time":null,"state":"running"}])") !=
                 std::string::npos,
             r.json());
}

BOOST_AUTO_TEST_CASE(exit_codes_fail_a_finished_run_at_the_first_nonzero) {
  BOOST_TEST(failure_of_exit_codes(ExitCodes{}).empty());
  BOOST_TEST(failure_of_exit_codes(ExitCodes{{0, 0}, {1, 0}}).empty());
  BOOST_TEST(failure_of_exit_codes(ExitCodes{{0, 0}, {1, 137}, {2, 1}}) == "rank 1 exited with code 137 after the run ended");
}

BOOST_AUTO_TEST_CASE(state_reads_as_a_run_state) {
  RunRecord r;
  for (RunState s : {RunState::running, RunState::finished, RunState::failed, RunState::crashed, RunState::killed}) {
    r.state = std::string(to_string(s));
    BOOST_TEST((r.run_state() == s), r.state);
  }
  r.state = "paused";
  BOOST_TEST(!r.run_state().has_value());
}

// A rank's "joined": when the run host accepted its join, to the millisecond;
// absent for a rank that never joined, and left out where it is no time.
BOOST_AUTO_TEST_CASE(a_ranks_join_time_is_written_to_the_millisecond_and_read_back) {
  static_assert(RunRecord::joined_ms(1'499) == 1'000 && RunRecord::joined_ms(1'500) == 2'000);
  static_assert(RunRecord::joined_ms(-1'499) == -1'000 && RunRecord::joined_ms(-1'500) == -2'000);
  static_assert(RunRecord::joined_ms(0) == 0 && RunRecord::joined_ms(7'000) == 7'000);
  RunRecord r;
  r.id = "r";
  r.state = "running";
  r.start_us = 1'700'000'000'000'000;
  r.ranks = {{0, "running", -1, "h0", "", 1'700'000'000'250'000},
             {1, "crashed", -1, "h1", "never connected", std::nullopt},
             {2, "running", -1, "h2", "", 1'700'000'003'000'000}};
  const std::string json = r.json();
  BOOST_TEST(json.find(R"({"rank":0,"state":"running","last_step":-1,"host":"h0","message":"","joined":1700000000.25})") !=
                 std::string::npos,
             json);
  BOOST_TEST(json.find(R"({"rank":1,"state":"crashed","last_step":-1,"host":"h1","message":"never connected"})") !=
                 std::string::npos,
             json);
  BOOST_TEST(json.find(R"("message":"","joined":1700000003})") != std::string::npos, json);
  const RunRecord back = parse_ok(json);
  BOOST_TEST((back == r), json);
  BOOST_REQUIRE(back.ranks.size() == 3u);
  BOOST_TEST(*back.ranks[0].joined_us == 1'700'000'000'250'000);
  BOOST_TEST(!back.ranks[1].joined_us.has_value());
  BOOST_TEST(back.json() == json);

  // Microseconds go to the nearest millisecond.
  r.ranks[0].joined_us = 1'700'000'000'312'499;
  BOOST_TEST(r.json().find(R"("joined":1700000000.312})") != std::string::npos, r.json());
  r.ranks[0].joined_us = 1'700'000'000'312'500;
  BOOST_TEST(r.json().find(R"("joined":1700000000.313})") != std::string::npos, r.json());

  // A file of an earlier version, without it, reads; one that is no time is left out, as other members.
  const RunRecord odd = parse_ok(R"({"id":"r","state":"finished","ranks":[{"rank":0,"joined":"soon"},)"
                                 R"({"rank":1,"joined":1e300},{"rank":2,"joined":1700000000.5},{"rank":3},)"
                                 R"({"rank":4,"joined":null},{"rank":5,"joined":1700000001}]})");
  BOOST_TEST(odd.damage.empty(), odd.damage);
  BOOST_REQUIRE(odd.ranks.size() == 6u);
  for (std::size_t i : {0u, 1u, 3u, 4u}) BOOST_TEST(!odd.ranks[i].joined_us.has_value(), "rank " << i);
  BOOST_TEST(*odd.ranks[2].joined_us == 1'700'000'000'500'000);
  BOOST_TEST(*odd.ranks[5].joined_us == 1'700'000'001'000'000);
  BOOST_TEST(odd.json().find(R"("message":"","joined":1700000000.5})") != std::string::npos, odd.json());
}

BOOST_AUTO_TEST_CASE(lengths_keep_whole_byte_counts_and_leave_out_the_rest) {
  const RunRecord r = parse_ok(R"({"id":"x","state":"finished","lengths":{"history.jsonl":10,"events.jsonl":-1,)"
                               R"("summary.json":"12","config.json":3.5,"rejected.jsonl":18446744073709551615}})");
  const std::vector<std::pair<std::string, std::uint64_t>> kept = {{"history.jsonl", 10},
                                                                   {"rejected.jsonl", 18446744073709551615ull}};
  BOOST_TEST((r.lengths == kept));
  // Not an object: none kept. And who the run is says nothing of its files.
  BOOST_TEST(parse_ok(R"({"id":"x","lengths":[1,2]})").lengths.empty());
  BOOST_TEST(r.identity().lengths.empty());
  BOOST_TEST(r.identity().json().find("lengths") == std::string::npos);
}
