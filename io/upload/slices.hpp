// Slices of a run's append-only files as the Uploader hands them to a
// backend: a history or system slice kept across requests, and the
// artifacts.jsonl lines read as entries.
#pragma once

#include "io/upload/upload.hpp"

#include <span>
#include <string>
#include <vector>

namespace chorus::io::detail {

/// A history or system slice, kept while the backend takes it a request at
/// a time (MLflow takes ~100 lines of a 4 MiB slice a request), from its
/// line `next` on, and read again once less than half a slice is left of
/// it: each byte is read at most about twice, not once a request.
struct KeptSlice {
  LineSlice slice;
  Cursor from;          // where the slice starts in the file
  std::size_t next = 0; // its first line not consumed

  /// The slice from `at`: what is left of the kept one when `at` is the
  /// start of one of its lines and at least half of `read_bytes` is left.
  [[nodiscard]] Error refresh(const std::string& path, Cursor at, std::size_t read_bytes);
  [[nodiscard]] std::span<const std::string_view> lines() const { return std::span(slice.lines).subspan(next); }
  [[nodiscard]] std::span<const Cursor> after() const { return std::span(slice.after).subspan(next); }
};

/// The entries of artifacts.jsonl lines; a malformed line is an entry
/// without a name, which a backend skips.
void read_artifacts(std::span<const std::string_view> lines, std::vector<ArtifactEntry>& out);

} // namespace chorus::io::detail
