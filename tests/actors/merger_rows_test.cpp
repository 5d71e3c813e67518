// The pending rows' index by step (runtime/core/merger_rows.hpp) against a
// std::unordered_map: steps one after another, strided (as evaluations every
// N steps log), spread at random and at the ends of the range, inserted and
// erased as a sliding window of rows moves on, and erased in any order.
#define BOOST_TEST_MODULE actors_merger_rows
#include <boost/test/unit_test.hpp>

#include "runtime/core/merger_rows.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <unordered_map>
#include <vector>

using chorus::core::PendingRows;
using chorus::core::StepIndex;

namespace {

/// Inserts `steps` in order, keeping at most `window` of them (the oldest
/// erased first, or one at random), and checks every step ever inserted
/// against the reference after each change.
void check_window(const std::vector<std::int64_t>& steps, std::size_t window, bool random_erase, std::uint32_t seed) {
  StepIndex index;
  std::unordered_map<std::int64_t, std::uint32_t> ref;
  std::vector<std::int64_t> held;
  std::mt19937 rng(seed);
  const auto agree = [&](std::int64_t step) {
    const auto it = ref.find(step);
    const std::uint32_t want = it == ref.end() ? StepIndex::npos : it->second;
    BOOST_TEST_REQUIRE(index.find(step) == want, "step " << step);
  };
  std::uint32_t slot = 0;
  for (const std::int64_t step : steps) {
    if (ref.count(step) != 0) continue;
    if (held.size() == window) {
      const std::size_t at = random_erase ? std::uniform_int_distribution<std::size_t>(0, held.size() - 1)(rng) : 0;
      index.erase(held[at]);
      ref.erase(held[at]);
      agree(held[at]);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(at));
    }
    index.insert(step, slot);
    ref.emplace(step, slot);
    held.push_back(step);
    ++slot;
    agree(step);
    if (step < std::numeric_limits<std::int64_t>::max()) agree(step + 1);
    if (step > std::numeric_limits<std::int64_t>::min() + 16) agree(step - 16);
  }
  for (const std::int64_t step : held) agree(step);
  for (const std::int64_t step : steps) agree(step);
}

} // namespace

BOOST_AUTO_TEST_CASE(steps_one_after_another_strided_and_random_are_found_and_forgotten) {
  std::vector<std::int64_t> consecutive(20000);
  for (std::size_t i = 0; i < consecutive.size(); ++i) consecutive[i] = static_cast<std::int64_t>(i);
  for (const std::int64_t stride : {2, 15, 16, 17, 1024, 1 << 20}) {
    std::vector<std::int64_t> strided(5000);
    for (std::size_t i = 0; i < strided.size(); ++i) strided[i] = static_cast<std::int64_t>(i) * stride;
    for (const std::size_t window : {std::size_t{1}, std::size_t{7}, std::size_t{300}, std::size_t{5000}}) {
      check_window(strided, window, false, 1);
      check_window(strided, window, true, 2);
    }
  }
  for (const std::size_t window : {std::size_t{1}, std::size_t{64}, std::size_t{4096}, std::size_t{20000}}) {
    check_window(consecutive, window, false, 3);
    check_window(consecutive, window, true, 4);
  }
  std::mt19937_64 rng(5);
  std::vector<std::int64_t> spread(8000);
  for (std::int64_t& s : spread) s = static_cast<std::int64_t>(rng() >> 1);
  // The ends of the range, and steps that differ only in their high bits.
  const std::int64_t top = std::numeric_limits<std::int64_t>::max();
  for (std::int64_t i = 0; i < 32; ++i) spread.insert(spread.end(), {top - i, i << 40, (i << 58) | 3});
  for (const std::size_t window : {std::size_t{3}, std::size_t{1000}, spread.size()}) {
    check_window(spread, window, false, 6);
    check_window(spread, window, true, 7);
  }
}

BOOST_AUTO_TEST_CASE(pending_rows_are_handed_out_lowest_step_first_and_their_slots_reused) {
  PendingRows rows;
  std::vector<std::int64_t> order;
  // Four ranks, each far ahead of the next: the same steps reached in turns.
  for (std::int64_t r = 0; r < 4; ++r)
    for (std::int64_t s = 0; s < 3000; s += 1 + r) rows.at(s).entries.push_back({static_cast<std::uint64_t>(r), 1.0});
  rows.take_below(1500, [&](chorus::core::PendingRow& row) {
    order.push_back(row.step);
    BOOST_TEST_REQUIRE(!row.entries.empty());
  });
  BOOST_TEST(order.size() == 1500u);
  BOOST_TEST(std::is_sorted(order.begin(), order.end()));
  BOOST_TEST(order.front() == 0);
  BOOST_TEST(order.back() == 1499);
  // A step taken is new again: its row comes back empty.
  BOOST_TEST(rows.at(10).entries.empty());
  BOOST_TEST(rows.at(2000).entries.size() == 3u); // ranks 0, 1 (every 2nd) and 3 (every 4th): 2000 % 3 != 0
  order.clear();
  rows.take_below(std::numeric_limits<std::int64_t>::max(), [&](chorus::core::PendingRow& row) { order.push_back(row.step); });
  BOOST_TEST(order.size() == 1501u); // 1500..2999 and 10
  BOOST_TEST(std::is_sorted(order.begin(), order.end()));
}
