// The mechanics behind the Merger's hot path (pending rows, their order, the
// watermark), kept apart so that merger.cpp reads as its rules.
#pragma once

#include <chorus/chorus.hpp>
#include "runtime/core/media.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <vector>

namespace chorus::core {

/// Pending rows by step: open addressing with linear probing, so that a new
/// row costs no allocation once the table has grown to the run's spread.
class StepIndex {
public:
  static constexpr std::uint32_t npos = std::numeric_limits<std::uint32_t>::max();

  [[nodiscard]] std::uint32_t find(std::int64_t step) const noexcept {
    if (cells_.empty()) return npos;
    for (std::size_t i = home(step);; i = (i + 1) & mask_) {
      const Cell& c = cells_[i];
      if (c.slot == npos) return npos;
      if (c.step == step) return c.slot;
    }
  }

  /// `step` must not be present.
  void insert(std::int64_t step, std::uint32_t slot) {
    if ((size_ + 1) * 2 > cells_.size()) grow();
    std::size_t i = home(step);
    while (cells_[i].slot != npos) i = (i + 1) & mask_;
    cells_[i] = {step, slot};
    ++size_;
  }

  /// `step` must be present.
  void erase(std::int64_t step) noexcept {
    std::size_t i = home(step);
    while (cells_[i].slot == npos || cells_[i].step != step) i = (i + 1) & mask_;
    // Backward-shift deletion: no tombstones, so probe chains never rot.
    for (std::size_t j = (i + 1) & mask_; cells_[j].slot != npos; j = (j + 1) & mask_) {
      const std::size_t h = home(cells_[j].step);
      if (((j - h) & mask_) >= ((j - i) & mask_)) { // the hole lies on j's probe path
        cells_[i] = cells_[j];
        i = j;
      }
    }
    cells_[i].slot = npos;
    --size_;
  }

private:
  struct Cell {
    std::int64_t step = 0;
    std::uint32_t slot = npos;
  };

  /// Steps in blocks of 16: a block's place is hashed (spread, whatever the
  /// steps' stride), its steps lie side by side in it, so that the rows a
  /// rank logs one after another are found in the same few cache lines.
  [[nodiscard]] std::size_t home(std::int64_t step) const noexcept {
    const auto s = static_cast<std::uint64_t>(step);
    return static_cast<std::size_t>((((s >> block_bits) * 0x9E3779B97F4A7C15ull) >> shift_ << block_bits | (s & block_mask)) &
                                    mask_);
  }
  static constexpr int block_bits = 4;
  static constexpr std::uint64_t block_mask = (1u << block_bits) - 1;

  void grow() {
    std::vector<Cell> old = std::move(cells_);
    const std::size_t n = old.empty() ? 64 : old.size() * 2;
    cells_.assign(n, Cell{});
    mask_ = n - 1;
    shift_ = 64 - (std::countr_zero(n) - block_bits); // n >= 64: a block's place has bits to spare
    size_ = 0;
    for (const Cell& c : old)
      if (c.slot != npos) insert(c.step, c.slot);
  }

  std::vector<Cell> cells_;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t size_ = 0;
};

/// One rank's value in a pending row; `sort` is (key, rank), the key being
/// its global id while pending and its place in name order once committing.
struct Entry {
  std::uint64_t sort;
  double value;
};

inline std::uint64_t sort_key(std::uint32_t key, std::uint32_t rank) { return std::uint64_t{key} << 32 | rank; }

/// One rank's histogram in a pending row; `sort` as an Entry's.
struct HistogramEntry {
  std::uint64_t sort;
  Histogram value;
};

/// One rank's image, text or table in a pending row; `sort` as an Entry's.
struct MediaEntry {
  std::uint64_t sort;
  Media value;
};

struct PendingRow {
  std::int64_t step = 0;
  std::int64_t ts_us = 0;
  std::vector<Entry> entries;
  bool repeats = false; // may hold a (key, rank) twice: the later entry is the one that counts
  std::vector<HistogramEntry> histograms; // one a (key, rank): a later one replaces it
  std::vector<MediaEntry> media;          // likewise
};

/// The rows not committed yet: found by step in O(1), handed out lowest
/// step first; rows and their capacity are reused, so the steady state does
/// not allocate.
class PendingRows {
public:
  /// The row at `step`, made empty if it is new.
  PendingRow& at(std::int64_t step) {
    std::uint32_t slot = index_.find(step);
    if (slot == StepIndex::npos) {
      if (free_.empty()) {
        slot = static_cast<std::uint32_t>(rows_.size());
        rows_.emplace_back();
      } else {
        slot = free_.back();
        free_.pop_back();
      }
      PendingRow& row = rows_[slot];
      row.step = step;
      row.ts_us = std::numeric_limits<std::int64_t>::max();
      row.entries.clear();
      row.repeats = false;
      row.histograms.clear();
      row.media.clear();
      index_.insert(step, slot);
      steps_.push(step);
    }
    return rows_[slot];
  }

  /// Hands each row below `mark` to `commit`, lowest step first, and drops it.
  template <class F>
  void take_below(std::int64_t mark, F&& commit) {
    while (!steps_.empty() && steps_.top() < mark) {
      const std::int64_t step = steps_.top();
      steps_.pop();
      const std::uint32_t slot = index_.find(step);
      index_.erase(step);
      commit(rows_[slot]);
      free_.push_back(slot);
    }
  }

private:
  std::vector<PendingRow> rows_;
  std::vector<std::uint32_t> free_;
  StepIndex index_;
  std::priority_queue<std::int64_t, std::vector<std::int64_t>, std::greater<>> steps_;
};

/// Sorts a row's entries by (key, rank). A full row (every rank, most keys)
/// sorts in linear time: by rank, then stably by key; a sparse one by
/// comparison, unless equal entries must keep their order (`stable`).
class EntrySorter {
public:
  void sort(std::vector<Entry>& v, std::size_t ranks, std::size_t keys, bool stable = false) {
    const std::size_t n = v.size();
    if (!stable && (n < 256 || ranks + keys > 2 * n)) {
      std::sort(v.begin(), v.end(), [](const Entry& a, const Entry& b) { return a.sort < b.sort; });
      return;
    }
    scratch_.resize(n);
    pass(v, scratch_, ranks, [](const Entry& e) { return static_cast<std::size_t>(e.sort & 0xffffffffu); });
    pass(scratch_, v, keys, [](const Entry& e) { return static_cast<std::size_t>(e.sort >> 32); });
  }

private:
  template <class Bucket>
  void pass(const std::vector<Entry>& from, std::vector<Entry>& to, std::size_t buckets, Bucket bucket_of) {
    at_.assign(buckets + 1, 0);
    for (const Entry& e : from) ++at_[bucket_of(e) + 1];
    for (std::size_t b = 1; b <= buckets; ++b) at_[b] += at_[b - 1];
    for (const Entry& e : from) to[at_[bucket_of(e)]++] = e;
  }

  std::vector<Entry> scratch_;
  std::vector<std::size_t> at_;
};

/// Calls `f(i, j)` for each run [i, j) of `n` sorted entries (Entry,
/// HistogramEntry, MediaEntry) that share one key.
template <class E, class F>
void each_key_run(const E* e, std::size_t n, F&& f) {
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i + 1;
    while (j < n && (e[j].sort >> 32) == (e[i].sort >> 32)) ++j;
    f(i, j);
    i = j;
  }
}

/// A committing row's histograms or media by (key's place in name order,
/// rank): `order` maps a key's global id to its place.
template <class E>
void sort_by_name(std::vector<E>& v, const std::vector<std::uint32_t>& order) {
  for (E& e : v) e.sort = sort_key(order[e.sort >> 32], static_cast<std::uint32_t>(e.sort));
  std::sort(v.begin(), v.end(), [](const E& a, const E& b) { return a.sort < b.sort; });
}

/// The entry of (key, rank) `sort` in a pending row's histograms or media,
/// made where it is not there yet (a later one of a rank and step replaces).
template <class E>
E& entry_of(std::vector<E>& v, std::uint64_t sort) {
  auto it = std::find_if(v.begin(), v.end(), [sort](const E& e) { return e.sort == sort; });
  if (it == v.end()) it = v.insert(v.end(), E{sort, {}});
  return *it;
}

/// Keeps, of each run of sorted entries with one (key, rank), the last.
inline void keep_last(std::vector<Entry>& v) {
  std::size_t out = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (i + 1 == v.size() || v[i + 1].sort != v[i].sort) v[out++] = v[i];
  v.resize(out);
}

/// The commit watermark: the lowest step any live rank may still log at. A
/// min-tree over the ranks, so a rank's move costs log(ranks) and the
/// minimum is read at once.
class Watermark {
public:
  void reset(std::size_t ranks, std::int64_t initial) {
    leaves_ = std::bit_ceil(std::max<std::size_t>(ranks, 1));
    tree_.assign(2 * leaves_, std::numeric_limits<std::int64_t>::max());
    for (std::size_t r = 0; r < ranks; ++r) tree_[leaves_ + r] = initial;
    for (std::size_t i = leaves_ - 1; i >= 1; --i) tree_[i] = std::min(tree_[2 * i], tree_[2 * i + 1]);
  }

  void set(std::size_t rank, std::int64_t v) noexcept {
    std::size_t i = leaves_ + rank;
    if (tree_[i] == v) return;
    tree_[i] = v;
    for (i >>= 1; i >= 1; i >>= 1) tree_[i] = std::min(tree_[2 * i], tree_[2 * i + 1]);
  }

  [[nodiscard]] std::int64_t min() const noexcept {
    return tree_.empty() ? std::numeric_limits<std::int64_t>::max() : tree_[1];
  }

private:
  std::size_t leaves_ = 0;
  std::vector<std::int64_t> tree_;
};

} // namespace chorus::core
