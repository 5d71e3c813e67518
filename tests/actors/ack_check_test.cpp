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

// The frames in flight: small ones go up to a count, so that a burst's
// first frames leave room for the next (the trainer's finish among them);
// large ones up to the bytes, so that a rank leaves no more in its host's
// mailbox than four full frames; and one frame always goes, however large.
BOOST_AUTO_TEST_CASE(the_window_counts_frames_and_bytes_and_always_lets_one_go) {
  using chorus::actors::FrameWindow;
  FrameWindow small;
  for (std::uint32_t k = 0; k < FrameWindow::max_frames; ++k) {
    BOOST_TEST(small.open(), "frame " << k);
    small.sent(1000);
  }
  BOOST_TEST(FrameWindow::max_frames > 4u);
  BOOST_TEST(!small.open());
  small.acked(1);
  BOOST_TEST(small.open());
  BOOST_TEST(small.in_flight() == FrameWindow::max_frames - 1);

  FrameWindow large;
  large.sent(FrameWindow::max_bytes / 4);
  large.sent(FrameWindow::max_bytes / 4);
  large.sent(FrameWindow::max_bytes / 4);
  BOOST_TEST(large.open());
  large.sent(FrameWindow::max_bytes / 4);
  BOOST_TEST(!large.open(), "four full frames fill it, as they did when it counted frames alone");
  large.acked(2);
  BOOST_TEST(large.bytes() == FrameWindow::max_bytes / 2);
  BOOST_TEST(large.open());

  FrameWindow huge;
  BOOST_TEST(huge.open());
  huge.sent(32u << 20); // a frame of large config texts
  BOOST_TEST(!huge.open());
  huge.acked(5); // no more than are in flight
  BOOST_TEST(huge.in_flight() == 0u);
  BOOST_TEST(huge.bytes() == 0u);
  BOOST_TEST(huge.open());
}
