// group.json: the member reports' codec, the manifest's, its settling, and
// updates from several processes at once.
#define BOOST_TEST_MODULE io_group_file
#include <boost/test/unit_test.hpp>

#include "io/store/group_file.hpp"
#include "tests/temp_dir.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

using namespace chorus;
using chorus::test::TempDir;

namespace {

store::GroupMember member(std::int64_t index, std::string state = "finished") {
  store::GroupMember m;
  m.index = index;
  m.id = "run" + std::to_string(index);
  m.name = "job-rank-" + std::to_string(index);
  m.dir = "/runs/p/job/run" + std::to_string(index);
  m.host = "node\"" + std::to_string(index); // a quote survives the trip
  m.pid = 100 + index;
  m.node = index / 2;
  m.state = std::move(state);
  m.start_time = 1000.0 + static_cast<double>(index);
  if (m.ended()) m.end_time = 2000.0 + static_cast<double>(index);
  m.rows = 40;
  m.ranks = {{index, m.state, 39}};
  m.summary = R"({"loss":0.25,"done":true})";
  return m;
}

store::GroupManifest manifest(std::int64_t size) {
  store::GroupManifest g;
  g.group = "job";
  g.project = "p";
  g.mode = "new";
  g.scope = "global";
  g.launcher = "torchrun";
  g.job_id = "7";
  g.host = "node0";
  g.size = size;
  g.start_time = 1000.5;
  return g;
}

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_member_report_reads_back_as_it_was_written) {
  const store::GroupMember m = member(3, "crashed");
  const Result<store::GroupMember> parsed = store::parse_member(store::member_json(m));
  BOOST_REQUIRE_MESSAGE(parsed, parsed.error().message());
  store::GroupMember back = *parsed;
  BOOST_TEST(back.index == 3);
  BOOST_TEST(back.id == m.id);
  BOOST_TEST(back.host == m.host);
  BOOST_TEST(back.state == "crashed");
  BOOST_TEST(back.ended());
  BOOST_TEST(*back.start_time == 1003.0);
  BOOST_TEST(*back.end_time == 2003.0);
  BOOST_REQUIRE_EQUAL(back.ranks.size(), 1u);
  BOOST_TEST(back.ranks[0].rank == 3);
  BOOST_TEST(back.ranks[0].last_step == 39);
  BOOST_TEST(back.summary == m.summary);
  // A report without an end is still running.
  store::GroupMember running = member(1, "running");
  const Result<store::GroupMember> parsed_running = store::parse_member(store::member_json(running));
  BOOST_REQUIRE(parsed_running);
  back = *parsed_running;
  BOOST_TEST(!back.ended());
  BOOST_TEST(!back.end_time);
}

BOOST_AUTO_TEST_CASE(a_malformed_report_is_refused_and_names_the_field) {
  const Error not_object = store::parse_member("[1,2]").error();
  BOOST_TEST((not_object.code() == Errc::invalid_argument));
  BOOST_TEST(not_object.message().find("not a JSON object") != std::string::npos);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"index":1,"state":"sideways"})", "state"},
      {R"({"index":-1})", "index"},
      {R"({"index":"one"})", "index"},
      {R"({"index":1,"summary":[1]})", "summary"},
      {R"({"index":1,"ranks":[{"rank":0,"state":"done"}]})", "ranks"},
      {R"({"index":1,"name":7})", "name"},
      {R"({"index":1,"end_time":"soon"})", "end_time"},
  };
  for (auto [json, field] : bad) {
    const Result<store::GroupMember> parsed = store::parse_member(json);
    BOOST_TEST(!parsed, json);
    BOOST_TEST(parsed.error().message().find(field) != std::string::npos, json << ": " << parsed.error().message());
  }
  const std::string long_name = R"({"index":1,"name":")" + std::string(5000, 'x') + "\"}";
  BOOST_TEST(!store::parse_member(long_name));
}

BOOST_AUTO_TEST_CASE(group_json_reads_back_with_each_members_exit_codes) {
  TempDir dir;
  store::GroupManifest g = manifest(2);
  g.members = {member(0), member(1, "crashed")};
  g.exit_codes = {{0, 0}, {1, 137}};
  g.settle();
  std::ofstream(dir / "group.json") << store::group_json(g);

  const Result<store::GroupManifest> read = store::read_group_file(dir.str());
  BOOST_REQUIRE_MESSAGE(read, read.error().message());
  const store::GroupManifest& back = *read;
  BOOST_TEST(back.group == "job");
  BOOST_TEST(back.mode == "new");
  BOOST_TEST(back.size == 2);
  BOOST_TEST(back.state == "crashed");
  BOOST_REQUIRE_EQUAL(back.members.size(), 2u);
  BOOST_TEST(back.members[1].state == "crashed");
  BOOST_TEST(back.exit_codes.at(1) == 137);
  BOOST_TEST((back.exit_codes_of(back.members[1]) == std::map<std::int64_t, std::int64_t>{{1, 137}}));
  // The member objects carry their own codes for a reader of one member.
  BOOST_TEST(store::group_json(g).find(R"("exit_codes":{"1":137})") != std::string::npos);

  write(dir / "group.json", R"({"group":"job","size":2,"exit_codes":{"one":1}})");
  BOOST_TEST(!store::read_group_file(dir.str()));
  write(dir / "group.json", R"({"group":"job","members":[{"index":0,"state":"gone"}]})");
  const Error bad = store::read_group_file(dir.str()).error();
  BOOST_TEST(bad.message().find("state") != std::string::npos);
  BOOST_TEST((store::read_group_file(dir / "nowhere").error().code() == Errc::io_error));
}

BOOST_AUTO_TEST_CASE(a_group_settles_once_every_member_has_ended) {
  store::GroupManifest g = manifest(3);
  g.members = {member(2), member(0, "running")};
  g.settle();
  BOOST_TEST(g.state == "running");
  BOOST_TEST(g.members[0].index == 0); // by place
  BOOST_TEST(*g.start_time == 1000.0); // the earliest member's start
  BOOST_TEST(!g.end_time);
  g.members[0] = member(0);
  g.settle();
  BOOST_TEST(g.state == "running"); // the third run has not been heard of
  g.members.push_back(member(1, "killed"));
  g.settle();
  BOOST_TEST(g.state == "killed");
  BOOST_TEST(*g.end_time == 2002.0); // the last member's end
  g.members[1] = member(1, "missing");
  g.members[1].end_time.reset();
  g.settle();
  BOOST_TEST(g.state == "crashed"); // a run that never came is lost, as a crashed one
  g.members[1] = member(1, "crashed");
  g.members[2] = member(2, "failed");
  g.settle();
  BOOST_TEST(g.state == "failed"); // a failure outranks a loss
  g.members[1] = member(1);
  g.members[2] = member(2);
  g.settle();
  BOOST_TEST(g.state == "finished");
}

BOOST_AUTO_TEST_CASE(updates_from_several_processes_lose_nothing) {
  TempDir dir;
  BOOST_TEST(!store::update_group_file(dir.str(), [](store::GroupManifest& g, bool exists) {
    BOOST_TEST(!exists);
    g = manifest(64);
    return true;
  }));
  struct stat st {};
  BOOST_REQUIRE(::stat((dir / "group.json").c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  // Each process adds its ranks' codes one at a time, as the launches of
  // several nodes and the Group actor do: every one of them must stay.
  constexpr int procs = 4, each = 16;
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      bool ok = true;
      for (int i = 0; i < each; ++i)
        ok = !store::update_group_file(dir.str(), [&](store::GroupManifest& g, bool exists) {
          g.exit_codes[p * each + i] = p;
          return exists;
        }) && ok;
      ::_exit(ok ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int status = 0;
    ::waitpid(k, &status, 0);
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  Result<store::GroupManifest> g = store::read_group_file(dir.str());
  BOOST_REQUIRE(g);
  BOOST_TEST(g->exit_codes.size() == static_cast<std::size_t>(procs * each));
  BOOST_TEST(g->size == 64);
  // An update that declines writes nothing.
  BOOST_TEST(!store::update_group_file(dir.str(), [](store::GroupManifest& m, bool) {
    m.size = 1;
    return false;
  }));
  g = store::read_group_file(dir.str());
  BOOST_REQUIRE(g);
  BOOST_TEST(g->size == 64);
}
