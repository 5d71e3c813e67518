// Slices of a run's append-only files as the Uploader hands them to a
// backend: a history, system, histograms or media slice kept across
// requests, the steps a by-step backend may take whole, and the
// artifacts.jsonl lines read as entries.
#pragma once

#include "io/upload/upload.hpp"

#include <optional>
#include <span>
#include <string>
#include <vector>

namespace chorus::upload {

/// A history or system slice, kept while the backend takes it a request at
/// a time (MLflow takes ~100 lines of a 4 MiB slice a request), from its
/// line `next` on, and read again once less than half a slice is left of
/// it: each byte is read at most about twice, not once a request.
struct KeptSlice {
  LineSlice slice;
  store::Cursor from;          // where the slice starts in the file
  std::size_t next = 0; // its first line not consumed
  SteadyTime read_at{}; // when the slice was read
  /// Each line's step, once index_steps() ran (no_step: a line that has none).
  std::vector<std::int64_t> steps;
  static constexpr std::int64_t no_step = -1;

  /// The slice from `at`: what is left of the kept one when `at` is the
  /// start of one of its lines, at least half of `read_bytes` is left, and
  /// it was read no earlier than `fresh_after`.
  /// `limit`: read_lines'.
  [[nodiscard]] Error refresh(const std::string& path, store::Cursor at, std::size_t read_bytes, SteadyTime fresh_after = {},
                              std::uint64_t limit = UINT64_MAX);
  [[nodiscard]] std::span<const std::string_view> lines() const { return std::span(slice.lines).subspan(next); }
  [[nodiscard]] std::span<const store::Cursor> after() const { return std::span(slice.after).subspan(next); }
  /// What a slice's lines are, for index_steps.
  enum class Lines { history, histograms, media };
  /// Reads each line's step (history.jsonl's rows, histograms.jsonl's or
  /// media.jsonl's lines), once per slice read.
  void index_steps(Lines kind);
};

/// How many lines of each slice, from its first not consumed, belong to
/// steps that history.jsonl, histograms.jsonl and media.jsonl (`media` null
/// where the backend takes none) are all known to hold whole
/// (HistogramUse::by_step), each slice indexed (index_steps) and read in
/// that order, each no earlier than the one before. A step is whole once a
/// later step is in another file, or a slice read to the file's end says
/// no more of it can come: the run host writes a step's media, then its
/// histograms, then its row, and every earlier row before a step's media
/// and histograms. So a step of histograms.jsonl or media.jsonl says the
/// rows before it are whole only in a history.jsonl read after it:
/// `before` holds the last steps of those files as read before the
/// history slice (KeptSlice::no_step: none). `ended_at`: when the run was first seen ended,
/// if it was (nothing more comes, so a slice read to the end after it is
/// all there is). A step whose histograms or media fill a slice read from
/// its first line goes in parts, so that an upload never holds more than a slice.
struct WholeSteps {
  std::size_t history = 0, histograms = 0, media = 0;
};
struct StepsBefore {
  std::int64_t histograms = KeptSlice::no_step, media = KeptSlice::no_step;
};
[[nodiscard]] WholeSteps whole_steps(const KeptSlice& history, const KeptSlice& histograms, const KeptSlice* media,
                                     StepsBefore before, std::optional<SteadyTime> ended_at);
/// The last step of a slice's lines (index_steps ran), or KeptSlice::no_step.
[[nodiscard]] std::int64_t last_step(const KeptSlice& k);

/// The entries of artifacts.jsonl lines; a malformed line is an entry
/// without a name, which a backend skips.
void read_artifacts(std::span<const std::string_view> lines, std::vector<ArtifactEntry>& out);

} // namespace chorus::upload
