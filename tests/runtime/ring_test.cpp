// The trainer's queue (client::Ring): slots published lap after lap, and the
// slots of a ring that ended taken by the next ring of their size, none of
// them published for its first lap.
#define BOOST_TEST_MODULE runtime_ring
#include <boost/test/unit_test.hpp>

#include "runtime/client/ingest.hpp"

#include <cstdint>
#include <memory>

using chorus::client::Ring;
using chorus::client::Slot;

namespace {

/// Writes `n` positions through `r` (each slot's step is its position) and reads them back in order.
void pass(Ring& r, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t pos = 0;
    BOOST_REQUIRE(r.try_reserve(1, pos));
    BOOST_TEST(r.peek(pos) == nullptr, "position " << pos << " read as published before it was");
    r.at(pos).step = static_cast<std::int64_t>(pos);
    r.publish(r.at(pos), pos);
    const Slot* s = r.peek(pos);
    BOOST_REQUIRE(s != nullptr);
    BOOST_TEST(s->step == static_cast<std::int64_t>(pos));
    r.release_to(pos + 1);
  }
}

/// The first position of `r`'s first lap that reads as published; its capacity where none does.
std::uint64_t first_published(Ring& r) {
  std::uint64_t pos = 0;
  while (pos < r.capacity() && r.peek(pos) == nullptr) ++pos;
  return pos;
}

} // namespace

BOOST_AUTO_TEST_CASE(slots_are_published_for_their_own_lap_only) {
  Ring r(8);
  BOOST_TEST(r.capacity() == 8u);
  pass(r, 3 * 8 + 5); // three laps and part of a fourth
  std::uint64_t pos = 0;
  BOOST_REQUIRE(r.try_reserve(8, pos));
  BOOST_TEST(!r.try_reserve(1, pos)); // full until the consumer releases
}

BOOST_AUTO_TEST_CASE(a_ring_takes_the_slots_of_the_last_ring_of_its_size_afresh) {
  const Slot* first = nullptr;
  {
    Ring r(64);
    first = &r.at(0);
    pass(r, 64 + 17); // its slots left published for laps 0 and 1
  }
  Ring again(64);
  BOOST_TEST(&again.at(0) == first); // the same memory, not faulted in again
  BOOST_TEST(first_published(again) == again.capacity(),
             "slot " << first_published(again) << " kept the last ring's publication");
  pass(again, 3 * 64);
  // A ring of another size takes memory of its own; the one kept stays for its size.
  Ring other(128);
  BOOST_TEST(&other.at(0) != &again.at(0));
}

BOOST_AUTO_TEST_CASE(slots_kept_for_one_size_wait_through_a_ring_of_another) {
  const Slot* kept = nullptr;
  {
    Ring r(32);
    kept = &r.at(0);
    pass(r, 40);
  }
  {
    Ring other(16); // not its size: made afresh, and the kept slots wait on
    BOOST_TEST(&other.at(0) != kept);
    pass(other, 16);
    Ring again(32);
    BOOST_TEST(&again.at(0) == kept);
    BOOST_TEST(first_published(again) == again.capacity());
    pass(again, 70);
  }
}

// A ring clears again only the slots the last one wrote: what a short run
// wrote, or all of them once it went round. None reads as published.
BOOST_AUTO_TEST_CASE(a_ring_clears_again_every_slot_the_last_one_wrote) {
  {
    Ring r(64);
    pass(r, 40); // part of one lap
  }
  {
    Ring b(64);
    BOOST_TEST(first_published(b) == b.capacity());
    pass(b, 10); // fewer than the ring before it
  }
  {
    Ring c(64);
    BOOST_TEST(first_published(c) == c.capacity());
    pass(c, 64 + 5); // round once and on
  }
  {
    Ring d(64);
    BOOST_TEST(first_published(d) == d.capacity());
    pass(d, 2);
  }
  Ring e(64);
  BOOST_TEST(first_published(e) == e.capacity());
  pass(e, 3 * 64);
}
