// A run's media.jsonl indexed for `chorus serve`: per key (an image, text or
// table key), its kind, the ranks that logged it and, per step and rank, the
// file under media/ its line names, with its caption, size and an image's
// width and height. The files themselves are never read here: the server
// hands one out only where a line of this index names it (Api::resolve_media).
// Lines are read through store::read_media_line, the format's one reader; a line
// it refuses, or one whose format does not go with its kind, or whose key
// holds another kind, is skipped and counted, the first named.
//
// The index grows with the file as HistogramIndex does (FollowedFile): each
// refresh reads the complete lines appended since the last one, at most
// `step_bytes` of them; a line being written is taken once it is whole.
#pragma once

#include "cli/serve/followed_file.hpp"
#include "cli/serve/lines_index.hpp"
#include "runtime/core/json.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::cli::serve {

/// The Content-Type a media file of `format` is served with ("png", "jpeg",
/// "md", "json"); "" for a format that is none of them.
[[nodiscard]] std::string_view media_content_type(std::string_view format) noexcept;

/// The file of one media.jsonl line, as the server hands it out.
struct MediaFile {
  std::string path;      // relative to the run directory, under media/
  std::string_view type; // its Content-Type
  std::uint64_t size = 0;
};

class MediaIndex {
public:
  /// The most one refresh reads.
  static constexpr std::uint64_t step_bytes = 64u << 20;

  explicit MediaIndex(std::string path, std::uint64_t step_bytes_ = step_bytes);
  MediaIndex(const MediaIndex&) = delete;
  MediaIndex& operator=(const MediaIndex&) = delete;

  /// Takes in the complete lines appended since the last call (at most
  /// step_bytes of them); starts over where the file was replaced or cut.
  /// Returns whether anything changed.
  bool refresh();

  /// `rows`: lines taken; `keys`: media keys; `skipped`, `first_skipped`: the lines refused.
  [[nodiscard]] IndexState state() const;
  /// Writes the keys as a JSON array, sorted: key, kind, ranks, steps, entries, first and last step.
  void keys_json(core::JsonWriter& w) const;
  /// Writes `key`'s fields into the object `w` is in (docs/DASHBOARD.md,
  /// /api/media): its kind, ranks, every step, and the entries (one a rank)
  /// of step `step` (the key's last step at or before it, or its first; the
  /// last where unset), each with the address of its file under the run
  /// `run`. False, with nothing written, where the file has no such key.
  bool key_json(std::string_view key, std::optional<std::int64_t> step, std::string_view run,
                core::JsonWriter& w) const;
  /// The file a line names for `key` at `step` from `rank`; none where no line does.
  [[nodiscard]] std::optional<MediaFile> file(std::string_view key, std::int64_t step, int rank) const;
  /// The bytes the index holds.
  [[nodiscard]] std::size_t memory() const;

private:
  /// One line's file: a step of a rank.
  struct Entry {
    std::int64_t step = 0;
    int rank = 0;
    double wall = 0, rel = 0;
    std::uint64_t size = 0;
    std::uint32_t width = 0, height = 0;
    std::string format, path, caption;
  };
  struct Key {
    std::string kind;
    std::vector<int> ranks;      // sorted
    std::vector<Entry> entries;  // by step, then rank
  };

  FollowedFile file_;
  const std::uint64_t step_bytes_;
  mutable std::shared_mutex mutex_;
  std::map<std::string, Key, std::less<>> keys_;
  std::size_t entries_ = 0;
};

} // namespace chorus::cli::serve
