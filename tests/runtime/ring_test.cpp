// The trainer's queue (client::Ring): slots published lap after lap, the
// slots of a ring that ended taken by the next ring of their size, none of
// them published for its first lap, and the ring handed from its owner to
// many producers without a position taken twice.
#define BOOST_TEST_MODULE runtime_ring
#include <boost/test/unit_test.hpp>

#include "io/platform/fences.hpp"
#include "runtime/client/ingest.hpp"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

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

// The owner: the first thread to reserve moves the head without a locked
// instruction until a second thread reserves; from then on the ring is
// shared, and every reservation is a CAS.
BOOST_AUTO_TEST_CASE(the_first_thread_to_reserve_owns_the_ring_until_a_second_reserves) {
  if (!chorus::platform::asymmetric_fences()) {
    BOOST_TEST_MESSAGE("the kernel has no private expedited membarrier here: every ring is shared from the start");
    Ring r(8);
    std::uint64_t pos = 0;
    BOOST_REQUIRE(r.try_reserve(1, pos));
    BOOST_TEST(r.shared());
    return;
  }
  Ring r(64);
  std::uint64_t pos = 0;
  BOOST_REQUIRE(r.try_reserve(3, pos));
  BOOST_TEST(pos == 0u);
  BOOST_REQUIRE(r.try_reserve(2, pos));
  BOOST_TEST(pos == 3u);
  BOOST_TEST(!r.shared(), "one thread's reservations made the ring shared");
  std::uint64_t theirs = 0;
  bool reserved = false;
  std::thread([&] { reserved = r.try_reserve(4, theirs); }).join();
  BOOST_REQUIRE(reserved);
  BOOST_TEST(theirs == 5u); // after the owner's, none taken twice
  BOOST_TEST(r.shared());
  BOOST_REQUIRE(r.try_reserve(1, pos));
  BOOST_TEST(pos == 9u);
  BOOST_REQUIRE(r.try_reserve(54, pos));
  BOOST_TEST(!r.try_reserve(1, pos)); // full: the owner's room check holds for the CAS too
}

namespace {

/// One round of the handoff: the others wait, started; the owner takes the
/// ring with its first reservation, lets them go, and reserves single slots
/// flat out, so that their first reservations fall among its own, some
/// inside one. Each slot carries its producer and sequence; they are read
/// back in position order once all are done (the ring holds them all). A
/// position reserved twice shows as a sequence out of order and a position
/// never published.
void handoff_round(unsigned others, std::uint64_t owners, std::uint64_t theirs) {
  const std::uint64_t total = owners + others * theirs;
  Ring r(total);
  std::atomic<bool> go{false};
  std::atomic<unsigned> refused{0};
  auto produce = [&](unsigned id, std::uint64_t n) {
    if (id != 0)
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    for (std::uint64_t seq = 0; seq < n; ++seq) {
      std::uint64_t pos = 0;
      if (!r.try_reserve(1, pos)) {
        refused.fetch_add(1);
        return;
      }
      Slot& s = r.at(pos);
      s.key = id;
      s.step = static_cast<std::int64_t>(seq);
      r.publish(s, pos);
      if (id == 0 && seq == 0) go.store(true, std::memory_order_release);
    }
  };
  std::vector<std::thread> threads;
  for (unsigned id = 1; id <= others; ++id) threads.emplace_back(produce, id, theirs);
  threads.emplace_back(produce, 0u, owners);
  for (auto& t : threads) t.join();

  BOOST_REQUIRE_MESSAGE(refused == 0u, "a ring that holds every value refused one");
  BOOST_TEST(r.head() == total);
  std::vector<std::int64_t> next(others + 1, 0);
  for (std::uint64_t pos = 0; pos < total; ++pos) { // checked without a Boost.Test line per slot: millions of them
    const Slot* s = r.peek(pos);
    if (s == nullptr) {
      BOOST_ERROR("position " << pos << " of " << total << " was never published: another producer's took its slot");
      return;
    }
    if (s->key > others || s->step != next[s->key]) {
      BOOST_ERROR("position " << pos << " holds producer " << s->key << "'s value " << s->step << ", expected "
                              << (s->key > others ? -1 : next[s->key]) << ": a position was reserved twice");
      return;
    }
    ++next[s->key];
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(producers_that_join_the_owner_mid_flight_take_every_position_once) {
  // On every CPU: reservations at the same time on two cores.
  for (unsigned round = 0; round < 300; ++round) handoff_round(1 + round % 3, 60000, 2000);
}

BOOST_AUTO_TEST_CASE(producers_that_join_an_owner_switched_out_inside_a_reservation_wait_for_it) {
  // On one CPU: the owner is switched out at the timer's tick, wherever it
  // is, often between its look at the head and its store of it; the others
  // then run, and must not reserve until it is out.
  cpu_set_t all;
  BOOST_REQUIRE(::sched_getaffinity(0, sizeof all, &all) == 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &all)) ++cpu;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  BOOST_REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0); // the threads made from here on inherit it
  for (unsigned round = 0; round < 40; ++round) handoff_round(2 + round % 2, 1'500'000, 2000);
  BOOST_REQUIRE(::sched_setaffinity(0, sizeof all, &all) == 0);
}

// A queue of the default size (2 MiB) is memory mapped for it and handed
// out zeroed by the kernel, not written through: fresh, and again when the
// next ring of its size takes it, no slot reads as published.
BOOST_AUTO_TEST_CASE(a_ring_of_the_default_size_starts_with_no_slot_published) {
  constexpr std::size_t n = std::size_t{1} << 16; // 2 MiB of slots
  const Slot* first = nullptr;
  {
    Ring r(n);
    first = &r.at(0);
    BOOST_TEST(reinterpret_cast<std::uintptr_t>(first) % (std::size_t{2} << 20) == 0u); // on a huge page's boundary
    BOOST_TEST(first_published(r) == r.capacity(), "slot " << first_published(r) << " read as published");
    pass(r, n + 100); // round once and on
  }
  Ring again(n);
  BOOST_TEST(&again.at(0) == first);
  BOOST_TEST(first_published(again) == again.capacity());
  pass(again, 2 * n);
  {
    Ring other(n / 2); // 1 MiB: its own memory, written through
    BOOST_TEST(first_published(other) == other.capacity());
  }
  Ring third(n); // the kept one went back for the smaller ring's: fresh memory again
  BOOST_TEST(first_published(third) == third.capacity());
}
