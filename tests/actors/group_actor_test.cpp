// The Group actor (actors/group.cpp) driven message by message on CAF's test
// coordinator: its two member runs are recorders that report as a Run
// actor's GroupLink does, and its timers wait on the test clock.
#define BOOST_TEST_MODULE actors_group
#include "tests/actors/caf_dsl.hpp"

#include "actors/group.hpp"
#include "tests/temp_dir.hpp"

#include <filesystem>
#include <string>
#include <vector>

using namespace chorus;
using namespace chorus::actors;
using namespace std::chrono_literals;

namespace {

/// A group of two runs (one per rank) kept in a temporary directory.
struct GroupFixture : test::ActorFixture {
  chorus::test::TempDir tmp;
  GroupHost host;
  group_actor group;
  std::vector<caf::actor> members; // their Run actors

  GroupFixture() {
    host.dir = tmp / "group";
    std::filesystem::create_directories(host.dir);
    host.manifest.group = "grp";
    host.manifest.project = "proj";
    host.manifest.mode = "per_rank";
    host.manifest.size = 2;
    host.manifest.start_time = 1'700'000'000.0;
    host.expected_ranks = {{0}, {1}};
    host.join_timeout = 30s;
    host.finish_timeout = 60s;
    host.secret = "the job's secret";
    group = keep(spawn_group_actor(sys, host));
    for (int i = 0; i < 2; ++i) members.push_back(recorder());
    sched.run();
  }

  /// What the run at place `index` says of itself.
  static std::string report(std::int64_t index, const std::string& state, std::int64_t rows = 0) {
    store::GroupMember m;
    m.index = index;
    m.id = "run-" + std::to_string(index);
    m.name = m.id;
    m.state = state;
    m.rows = rows;
    m.start_time = 1'700'000'000.0;
    if (state != "running") m.end_time = 1'700'000'100.0;
    m.ranks.push_back({index, state, rows - 1});
    return store::member_json(m);
  }

  /// `sender` sends report `seq`, naming `named` as the run it describes.
  void send(const caf::actor& sender, std::int64_t seq, const std::string& json, const caf::actor& named,
            const std::string& secret = "the job's secret") {
    inject((member_atom, std::int64_t, std::string, caf::actor, std::string),
           from(sender).to(group).with(member_atom::value, seq, json, named, secret));
  }
  /// Member `i` reports and the group acknowledges it.
  void reported(std::size_t i, std::int64_t seq, const std::string& json) {
    send(members[i], seq, json, members[i]);
    expect((member_ok_atom, std::int64_t), from(group).to(members[i]).with(_, seq));
  }

  store::GroupManifest manifest() {
    Result<store::GroupManifest> g = store::read_group_file(host.dir);
    BOOST_TEST_REQUIRE(g.has_value(), g.error().message());
    return std::move(*g);
  }
  /// A member of group.json, which must be there.
  static store::GroupMember member(const store::GroupManifest& g, std::int64_t index) {
    const store::GroupMember* m = g.member(index);
    BOOST_TEST_REQUIRE(m != nullptr, "no member " << index << " in group.json");
    return *m;
  }
};

bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

} // namespace

BOOST_FIXTURE_TEST_SUITE(group_actor, GroupFixture)

BOOST_AUTO_TEST_CASE(reports_are_acknowledged_and_the_latest_is_kept) {
  BOOST_TEST(manifest().members.empty());
  reported(0, 1, report(0, "running"));
  BOOST_TEST(member(manifest(), 0).id == "run-0"); // a run's arrival is written at once

  // A report that names another run than its sender is dropped, unanswered.
  send(members[1], 1, report(1, "running"), members[0]);
  BOOST_TEST(!sched.prioritize(members[1]));

  // Progress is written within the write interval.
  reported(0, 3, report(0, "running", 7));
  BOOST_TEST(member(manifest(), 0).rows == 0);
  advance_time(500ms);
  expect((flush_atom), from(group).to(group).with(_));
  BOOST_TEST(member(manifest(), 0).rows == 7);

  // An older report, arriving late, is acknowledged but not taken.
  reported(0, 2, report(0, "running", 5));
  reported(1, 1, report(1, "running")); // written at once, with the rest
  const auto g = manifest();
  BOOST_TEST(member(g, 0).rows == 7);
  BOOST_TEST(member(g, 1).id == "run-1");
  BOOST_TEST(g.state == "running");
}

BOOST_AUTO_TEST_CASE(a_report_without_the_jobs_secret_takes_no_place) {
  // A process outside the job claims place 0 first: unanswered, not written.
  const caf::actor outsider = recorder();
  sched.run();
  send(outsider, 1, report(0, "running"), outsider, "a guess");
  BOOST_TEST(!sched.prioritize(outsider));
  BOOST_TEST(manifest().members.empty());
  // The job's run then takes it.
  reported(0, 1, report(0, "running"));
  BOOST_TEST(member(manifest(), 0).id == "run-0");
}

BOOST_AUTO_TEST_CASE(a_member_that_goes_down_is_recorded_crashed) {
  reported(0, 1, report(0, "running"));
  reported(1, 1, report(1, "running", 4));
  caf::anon_send_exit(members[1], caf::exit_reason::kill);
  expect((caf::exit_msg), from(_).to(members[1]).with(_));
  expect((caf::down_msg), from(_).to(group).with(_));
  advance_time(500ms);
  expect((flush_atom), from(group).to(group).with(_));

  const auto g = manifest();
  const store::GroupMember m = member(g, 1);
  BOOST_TEST(m.state == "crashed");
  BOOST_TEST(contains(m.message, "its run host exited or its connection was lost"), m.message);
  BOOST_TEST_REQUIRE(m.ranks.size() == 1u);
  BOOST_TEST(m.ranks[0].state == "crashed");
  BOOST_TEST(m.end_time.has_value());
  BOOST_TEST(member(g, 0).state == "running");
  BOOST_TEST(g.state == "running"); // run-0 has not ended
}

BOOST_AUTO_TEST_CASE(finish_is_answered_once_every_member_ended) {
  reported(0, 1, report(0, "running"));
  reported(1, 1, report(1, "running"));
  inject((finish_atom), from(self).to(group).with(finish_atom::value));
  reported(0, 2, report(0, "finished", 10));
  disallow((caf::ok_atom), from(group).to(self).with(_)); // run-1 is still running
  BOOST_TEST(member(manifest(), 0).state == "finished"); // a run's end is written at once

  reported(1, 2, report(1, "failed", 3));
  expect((caf::ok_atom), from(group).to(self).with(_));
  const auto g = manifest();
  BOOST_TEST(g.state == "failed");
  BOOST_TEST(g.end_time.has_value());
  BOOST_TEST(member(g, 1).state == "failed");

  // Once ended, a member's later report changes nothing.
  reported(1, 3, report(1, "running"));
  BOOST_TEST(member(manifest(), 1).state == "failed");
}

BOOST_AUTO_TEST_CASE(finish_gives_up_after_finish_timeout_and_records_the_places_never_registered) {
  reported(0, 1, report(0, "running"));
  inject((finish_atom), from(self).to(group).with(finish_atom::value));
  advance_time(host.finish_timeout); // join_timeout comes first
  expect((join_tmo_atom), from(group).to(group).with(_));
  disallow((caf::ok_atom), from(group).to(self).with(_));
  expect((finish_tmo_atom), from(group).to(group).with(_));
  expect((caf::ok_atom), from(group).to(self).with(_));

  const auto g = manifest();
  const store::GroupMember still = member(g, 0);
  BOOST_TEST(still.state == "unknown");
  BOOST_TEST(contains(still.message, "finish_timeout"), still.message);
  const store::GroupMember missing = member(g, 1);
  BOOST_TEST(missing.state == "missing");
  BOOST_TEST(contains(missing.message, "never registered with the group within init_timeout"), missing.message);
  BOOST_TEST_REQUIRE(missing.ranks.size() == 1u);
  BOOST_TEST(missing.ranks[0].rank == 1);
  BOOST_TEST(g.state != "running");
}

BOOST_AUTO_TEST_SUITE_END()
