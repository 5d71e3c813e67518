// CAF's deterministic test DSL (caf/test/dsl.hpp: inject, expect, allow,
// disallow over CAF's test coordinator) in Boost.Test cases, and
// ActorFixture, the actor system those tests drive.
//
// The DSL reports through CAF's own unit-test macros. Their engine and main
// (caf/test/unit_test_impl.hpp) are not built here: the engine picks tests
// with std::regex, which GCC 12 warns inside under ASan, and warnings are
// errors. So the few macros the DSL expands are redefined in Boost.Test's
// terms before it is included, and ActorFixture stands in for CAF's
// test_coordinator_fixture (whose constructor reads that engine's command
// line). The DSL checks in destructors, where nothing may throw: a failed
// requirement is logged with the statement it failed in (file, line, the
// expect or allow), then the test program aborts, which Boost.Test reports.
#pragma once

#include <boost/test/unit_test.hpp>

#include <caf/all.hpp>
#include <caf/test/unit_test.hpp>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace chorus::test {

/// The text of a DSL message: what an ostream takes, and CAF's own types
/// (handles, messages, its logger's argument wrappers) as CAF renders them.
struct DslText {
  std::string text;
  template <class T>
  DslText& operator<<(const T& x) {
    if constexpr (requires(std::ostream& os) { os << x; }) {
      std::ostringstream os;
      os << x;
      text += os.str();
    } else {
      text += caf::deep_to_string(x);
    }
    return *this;
  }
};

/// The DSL statement under way ("file:line: expect(...)"), for its failure.
inline std::string& dsl_statement() {
  static std::string s;
  return s;
}

[[noreturn]] inline void dsl_failed(const std::string& what) {
  BOOST_ERROR(dsl_statement() << ": " << what);
  std::abort();
}

} // namespace chorus::test

#undef CAF_MESSAGE
#undef CAF_CHECK_EQUAL
#undef CAF_REQUIRE
#undef CAF_REQUIRE_EQUAL
#undef CAF_FAIL
// Each DSL statement says what it is first (as the CAF engine logs it): a
// failure names the statement that failed, where it is in the test.
#define CAF_MESSAGE(msg)                                                                                             \
  (::chorus::test::dsl_statement() = (::chorus::test::DslText() << __FILE__ << ":" << __LINE__ << ": " << msg).text)
#define CAF_CHECK_EQUAL(x, y)                                                                                        \
  BOOST_CHECK_MESSAGE((x) == (y), "message element " << caf::deep_to_string(x) << ", expected "                      \
                                                     << caf::deep_to_string(y))
#define CAF_REQUIRE(...)                                                                                             \
  do {                                                                                                               \
    if (!(__VA_ARGS__)) ::chorus::test::dsl_failed("requirement failed: " #__VA_ARGS__);                             \
  } while (false)
#define CAF_REQUIRE_EQUAL(x, y) CAF_REQUIRE((x) == (y))
#define CAF_FAIL(msg) ::chorus::test::dsl_failed((::chorus::test::DslText() << msg).text)

#include <caf/test/dsl.hpp>

namespace chorus::test {

/// A stand-in for an actor the testee talks to (a RankProxy, a member Run):
/// it keeps every message it is sent, in order. A class, not a function:
/// CAF 0.17 dereferences a null argument tuple when it starts a function
/// actor spawned without arguments (UBSan says so).
class Recorder final : public caf::event_based_actor {
public:
  explicit Recorder(caf::actor_config& cfg) : caf::event_based_actor(cfg) {
    set_default_handler([](caf::scheduled_actor* self, caf::message_view& m) -> caf::result<caf::message> {
      static_cast<Recorder*>(self)->got.push_back(m.move_content_to_message());
      return caf::message();
    });
  }
  caf::behavior make_behavior() override {
    return {[this](caf::ok_atom x) { got.push_back(caf::make_message(x)); }};
  }
  const char* name() const override { return "chorus.test.recorder"; }

  std::vector<caf::message> got;
};

/// What the Recorder `a` got so far.
inline const std::vector<caf::message>& recorded(const caf::actor& a) {
  return dynamic_cast<Recorder&>(*caf::actor_cast<caf::abstract_actor*>(a)).got;
}

/// An actor system on CAF's test coordinator: nothing runs until the test
/// says so (sched.run_once(), sched.run(), the DSL), and delayed messages
/// wait on the test clock until it is advanced (advance_time) or a timeout is
/// triggered. It stops the actors the test keeps (keep(), recorder()) at the
/// end: the system cannot shut down while an actor with a timer of its own
/// (the Run actor's flush) is alive.
struct ActorFixture {
  struct Config : caf::actor_system_config {
    Config() {
      set("scheduler.policy", caf::atom("testing"));
      set("logger.file-verbosity", caf::atom("quiet"));
    }
  };

  Config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  /// The test itself, for the messages that must come from this process.
  caf::scoped_actor self{sys, true};
  std::vector<caf::actor> spawned;

  ActorFixture() { sched.clock().current_time += std::chrono::hours(1); } // as CAF's fixture: time is not 0

  ~ActorFixture() {
    // In the fixture's name: chorus's actors take no anonymous exit (actors/guard.hpp).
    for (const caf::actor& a : spawned) self->send_exit(a, caf::exit_reason::kill);
    sched.run();
  }

  caf::actor recorder() { return keep(sys.spawn<Recorder>()); }
  template <class Handle>
  Handle keep(Handle a) {
    if (a) spawned.push_back(caf::actor_cast<caf::actor>(a));
    return a;
  }

  /// Moves the test clock on by `d`, delivering the delayed messages due by then.
  void advance_time(caf::timespan d) { sched.clock().advance_time(d); }
  /// Delayed messages not yet delivered.
  std::size_t pending_timers() const { return sched.clock().schedule().size(); }

  /// The actor whose next message is `Ts...` from `sender`: one that `sender`
  /// spawned itself (the Run actor's WAL syncer, the Uploader's sender).
  template <class... Ts, class Handle>
  caf::actor receiver_of(const Handle& sender) {
    const auto from = caf::actor_cast<caf::strong_actor_ptr>(sender);
    for (caf::resumable* job : sched.jobs) {
      auto* a = dynamic_cast<caf::scheduled_actor*>(job);
      caf::mailbox_element* next = a != nullptr ? a->peek_at_next_mailbox_element() : nullptr;
      if (next != nullptr && next->sender == from && next->content().match_elements<Ts...>())
        return caf::actor_cast<caf::actor>(a);
    }
    BOOST_TEST_REQUIRE(false, "no actor has a " << caf::deep_to_string(caf::make_message(Ts{}...)) << " from "
                                                << caf::deep_to_string(from) << " next");
    return {};
  }
};

} // namespace chorus::test
