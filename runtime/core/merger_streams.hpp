// A rank's ordered streams, for the Merger: its default stream (Run::log)
// and the writer streams it opened (Run::writer). Each stream's steps are
// non-decreasing on their own; the rank stands, for the watermark, at the
// minimum over its live streams.
#pragma once

#include "runtime/core/wire.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace chorus::core {

class RankStreams {
public:
  static constexpr std::int64_t no_step = -1;

  struct Stream {
    std::int64_t last_step = no_step; // the step it last logged at
    std::int64_t cursor = no_step;    // last_step, or past what a barrier committed: auto steps go on from here
    bool live = false;                // counts in the rank's minimum
    bool named = false;               // open as far as the frames checked so far say (writers only)
  };

  // ---- while a frame is checked: opens and closes must pair up ------------

  /// Applies a stream event to what is named; false if it opens a stream
  /// already open or closes one that is not.
  bool name(const wire::Stream& e) {
    Stream& s = at(e.id);
    if (s.named == e.open) return false;
    s.named = e.open;
    flips_.push_back(e.id);
    return true;
  }
  /// Whether values may name stream `id` (the default stream always may).
  [[nodiscard]] bool named(std::uint32_t id) const noexcept {
    return id == 0 || (id < streams_.size() && streams_[id].named);
  }
  /// Ends a frame's check: keeps what it named, or (it was malformed) undoes it.
  void checked(bool ok) {
    if (!ok)
      for (auto it = flips_.rbegin(); it != flips_.rend(); ++it) streams_[*it].named = !streams_[*it].named;
    flips_.clear();
  }

  // ---- while events are processed -----------------------------------------

  /// Stream `id`; ids are bounded by core::wire::max_streams, so this stays small.
  Stream& at(std::uint32_t id) {
    if (id >= streams_.size()) streams_.resize(std::size_t{id} + 1);
    return streams_[id];
  }

  /// The default stream joins the minimum at its first values, where barriers
  /// left its cursor; in a rank that opened writers, as a writer opens: past
  /// the last committed step, so that its automatic steps never land on rows
  /// its writers already let commit. (Rows commit past a rank without
  /// writers only where a barrier timed out without it: its automatic steps
  /// at or below meet step_committed, which tells it so.)
  Stream& default_stream(std::int64_t last_committed) {
    Stream& s = streams_[0];
    if (!s.live) {
      s.live = true;
      if (had_writers_) s.cursor = std::max(s.cursor, last_committed);
      recompute();
    }
    return s;
  }

  /// A writer opens after the last committed step: its automatic steps go on
  /// from there, and it holds back no row already committed.
  void open(std::uint32_t id, std::int64_t last_committed) {
    Stream& s = at(id);
    const bool named = s.named;
    s = Stream{no_step, last_committed, true, named};
    ++live_writers_;
    had_writers_ = true;
    recompute();
  }
  /// A writer closes: the rank no longer waits for it, and stands at least where it got to.
  void close(std::uint32_t id) {
    Stream& s = at(id);
    s.live = false;
    --live_writers_;
    idle_ = std::max(idle_, s.cursor);
    recompute();
  }

  /// Moves stream `s` to `cursor` (never back).
  void advance(Stream& s, std::int64_t cursor) {
    if (cursor <= s.cursor) return;
    const bool was_min = s.cursor == min_;
    s.cursor = cursor;
    if (was_min) recompute();
  }
  /// A barrier committed everything through `step`: every stream goes on past it.
  void raise(std::int64_t step) {
    for (Stream& s : streams_) s.cursor = std::max(s.cursor, step);
    idle_ = std::max(idle_, step);
    recompute();
  }

  /// Where the rank stands: the minimum over its live streams; with none
  /// live, the furthest any got (a rank that stopped logging holds back the
  /// rows above its last step, as it always did).
  [[nodiscard]] std::int64_t cursor() const noexcept { return min_; }

private:
  void recompute() noexcept {
    if (live_writers_ == 0) {
      min_ = streams_[0].live ? streams_[0].cursor : idle_;
      return;
    }
    std::int64_t m = streams_[0].live ? streams_[0].cursor : std::numeric_limits<std::int64_t>::max();
    for (std::size_t i = 1; i < streams_.size(); ++i)
      if (streams_[i].live) m = std::min(m, streams_[i].cursor);
    min_ = m;
  }

  std::vector<Stream> streams_ = std::vector<Stream>(1);
  std::vector<std::uint32_t> flips_;
  std::uint32_t live_writers_ = 0;
  bool had_writers_ = false; // a writer opened at some time
  std::int64_t idle_ = no_step;
  std::int64_t min_ = no_step;
};

} // namespace chorus::core
