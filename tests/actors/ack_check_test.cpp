// A RankProxy takes from its run host only acks that fit what it sent
// (actors/rank_proxy.hpp, bad_ack): anything else would make the trainer
// read as logged a value the run never kept.
#define BOOST_TEST_MODULE actors_ack_check
#include "actors/rank_proxy.hpp"

#include <boost/test/unit_test.hpp>

using chorus::actors::AckErrors;
using chorus::actors::AckWindow;
using chorus::actors::bad_ack;

namespace {

AckErrors error_at(std::uint64_t seq) {
  AckErrors out;
  out.emplace_back(seq, chorus::Error(chorus::Errc::invalid_argument, "refused"), false);
  return out;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

} // namespace

BOOST_AUTO_TEST_CASE(acks_within_what_was_sent_are_taken) {
  const AckWindow w{.in_flight = 2, .sent = 40, .acked = 10};
  BOOST_TEST(bad_ack(w, 1, 25, {}).empty());
  BOOST_TEST(bad_ack(w, 2, 40, error_at(33)).empty());
  BOOST_TEST(bad_ack(w, 0, 10, {}).empty()); // nothing new: a repeated state is no harm
}

BOOST_AUTO_TEST_CASE(an_ack_beyond_the_last_call_sent_is_refused) {
  const std::string why = bad_ack(AckWindow{.in_flight = 1, .sent = 40, .acked = 10}, 1, 1500, {});
  BOOST_TEST(contains(why, "completing call 1500, beyond the last one the rank sent (40)"), why);
}

BOOST_AUTO_TEST_CASE(an_ack_that_goes_back_is_refused) {
  const std::string why = bad_ack(AckWindow{.in_flight = 1, .sent = 40, .acked = 30}, 1, 20, {});
  BOOST_TEST(contains(why, "completing call 20 after one that completed call 30"), why);
}

BOOST_AUTO_TEST_CASE(an_ack_for_more_frames_than_in_flight_is_refused) {
  const std::string why = bad_ack(AckWindow{.in_flight = 1, .sent = 40, .acked = 10}, 3, 20, {});
  BOOST_TEST(contains(why, "for 3 frames while 1 were in flight"), why);
}

BOOST_AUTO_TEST_CASE(an_error_outside_the_calls_completed_is_refused) {
  const AckWindow w{.in_flight = 1, .sent = 40, .acked = 10};
  BOOST_TEST(contains(bad_ack(w, 1, 20, error_at(21)), "error for call 21"));
  BOOST_TEST(contains(bad_ack(w, 1, 20, error_at(0)), "error for call 0"));
}
