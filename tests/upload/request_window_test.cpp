// The MLflow upload's window (io/upload/request_window.hpp), sized from
// answers given to it here, from model servers: how long each answer takes
// follows from how many requests are in flight.
#define BOOST_TEST_MODULE upload_request_window
#include <boost/test/unit_test.hpp>

#include "io/upload/request_window.hpp"

#include <algorithm>
#include <cstdint>

using chorus::upload::RequestWindow;
using namespace std::chrono_literals;

namespace {

/// `answers` answers from a server with `workers` workers that take 10 ms a
/// request: with more in flight than workers, requests wait their turn.
void serve(RequestWindow& w, std::size_t workers, int answers) {
  for (int i = 0; i < answers; ++i) {
    const double load = std::max(1.0, static_cast<double>(w.size()) / static_cast<double>(workers));
    w.answered(std::chrono::microseconds(static_cast<std::int64_t>(load * 10'000)), true, w.epoch());
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(a_server_that_keeps_up_gets_more_at_once_up_to_the_most) {
  RequestWindow w(4, 8);
  w.answered(10ms, true, w.epoch());
  for (int i = 0; i < 4; ++i) w.answered(10ms, true, w.epoch());
  BOOST_TEST(w.size() == 5u); // one more after about a window of answers
  serve(w, 100, 200);
  BOOST_TEST(w.size() == 8u);
}

BOOST_AUTO_TEST_CASE(a_server_whose_answers_slow_with_the_window_gets_a_few_queued) {
  // One worker: every request beyond the one served waits; the window
  // settles where 2 to 4 wait, enough for the worker never to idle.
  RequestWindow one(4, 8);
  one.answered(10ms, true, one.epoch()); // the first of a window is served at once
  serve(one, 1, 400);
  BOOST_TEST(one.size() >= 3u);
  BOOST_TEST(one.size() <= 5u);
  // Four workers: a few beyond them.
  RequestWindow four(4, 8);
  four.answered(10ms, true, four.epoch());
  serve(four, 4, 400);
  BOOST_TEST(four.size() >= 6u);
}

BOOST_AUTO_TEST_CASE(slow_answers_shrink_it) {
  RequestWindow w(8, 8);
  w.answered(10ms, true, w.epoch());
  for (int i = 0; i < 200; ++i) w.answered(100ms, true, w.epoch()); // the server slowed down tenfold
  BOOST_TEST(w.size() <= 4u);
  BOOST_TEST(w.size() >= 1u);
}

BOOST_AUTO_TEST_CASE(a_busy_server_halves_it_down_to_one) {
  RequestWindow w(8, 8);
  w.backed_off();
  BOOST_TEST(w.size() == 4u);
  for (int i = 0; i < 10; ++i) w.backed_off();
  BOOST_TEST(w.size() == 1u);
  serve(w, 100, 3); // grows back from one, a request a window of answers
  BOOST_TEST(w.size() == 2u);
}

BOOST_AUTO_TEST_CASE(small_requests_do_not_size_it) {
  RequestWindow w(4, 8);
  w.answered(100ms, true, w.epoch());
  for (int i = 0; i < 100; ++i) w.answered(1ms, false, w.epoch()); // the tail of a file: quick whatever the queue
  BOOST_TEST(w.size() == 4u);
  for (int i = 0; i < 30; ++i) w.answered(100ms, true, w.epoch()); // as quick as the quickest: it grows
  BOOST_TEST(w.size() > 4u);
}

BOOST_AUTO_TEST_CASE(answers_sent_before_a_back_off_do_not_grow_the_halved_window) {
  // A window of 8 in flight; one answer says the server is busy, the other
  // seven come back quick: they were sent before it, and say nothing of
  // the window of 4 that follows.
  RequestWindow w(8, 8);
  w.answered(10ms, true, w.epoch());
  const std::uint64_t before = w.epoch();
  w.backed_off();
  BOOST_TEST(w.size() == 4u);
  for (int i = 0; i < 7; ++i) w.answered(10ms, true, before);
  BOOST_TEST(w.size() == 4u, "answers sent before the back-off grew the halved window to " << w.size());
  // The halved window's own answers grow it as before.
  for (int i = 0; i < 5; ++i) w.answered(10ms, true, w.epoch());
  BOOST_TEST(w.size() == 5u);
}
