// stop_with (actors/guard.hpp): a helper whose parent ended before the
// helper started stops at once. The Run actor's WAL syncer is a blocking
// helper started on a thread of its own, and under load a run host that
// refused to resume had its Run actor gone before the syncer ran; CAF 0.17
// monitors an address through a raw pointer, so the syncer called into the
// destroyed actor ("pure virtual method called") and the host aborted.
#define BOOST_TEST_MODULE stop_with
#include "actors/guard.hpp"

#include <boost/test/unit_test.hpp>

#include <caf/all.hpp>

#include <chrono>
#include <thread>

using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(a_helper_whose_parent_ended_before_it_started_stops_at_once) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::actor_addr gone;
  {
    // (An argument: CAF 0.17 reads a null argument tuple for a function spawned without one.)
    caf::actor parent = sys.spawn([](caf::event_based_actor*, int) -> caf::behavior { return {[](int) {}}; }, 0);
    gone = parent.address();
    caf::anon_send_exit(parent, caf::exit_reason::kill);
  }
  // Ended and destroyed: its address no longer gives a handle.
  for (int i = 0; i < 10000 && caf::actor_cast<caf::strong_actor_ptr>(gone); ++i) std::this_thread::sleep_for(1ms);
  BOOST_REQUIRE(!caf::actor_cast<caf::strong_actor_ptr>(gone));

  caf::actor helper = chorus::actors::spawn_guarded(
      sys,
      [](caf::event_based_actor* self, caf::actor_addr parent) -> caf::behavior {
        chorus::actors::stop_with(self, parent);
        return {[](int) {}};
      },
      gone);
  caf::scoped_actor watcher{sys};
  watcher->monitor(helper);
  bool stopped = false;
  watcher->receive([&](caf::down_msg& dm) { stopped = dm.source == helper.address(); },
                   caf::after(std::chrono::seconds(30)) >> [] {});
  BOOST_TEST(stopped);
}
