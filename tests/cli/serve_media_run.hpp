// A run's images, text and tables written by hand as the RunWriter leaves
// them (io/store/media_log.hpp): each a file under media/ and a line of
// media.jsonl naming it, for the tests of `chorus serve`'s media.
#pragma once

#include "io/store/media_log.hpp"
#include "runtime/core/media.hpp"
#include "tests/cli/process.hpp"

#include <cstdint>
#include <filesystem>
#include <string>

namespace chorus::test {

struct MediaSpec {
  std::string key;
  int rank = 0;
  std::int64_t step = 0;
  core::MediaKind kind = core::MediaKind::image;
  std::string format = "png";
  std::string data;
  std::string caption;
  std::uint32_t width = 0, height = 0;
};

/// Where the file of `m` lies, relative to the run directory.
inline std::string media_file_path(const MediaSpec& m) {
  core::Media media;
  media.format = m.format;
  return store::media_path(m.key, m.rank, m.step, media.extension());
}

/// The media.jsonl line of `m` (with its newline), as the RunWriter writes it.
inline std::string media_line(const MediaSpec& m) {
  core::Media media;
  media.kind = m.kind;
  media.format = m.format;
  media.caption = m.caption;
  media.width = m.width;
  media.height = m.height;
  media.data.assign(m.data.begin(), m.data.end());
  std::string out;
  store::append_media_line(out, m.step, (1'700'000'000 + m.step) * 1'000'000, m.step * 1'000'000, m.key, m.rank, media,
                        media_file_path(m));
  return out;
}

/// Writes the file of `m` under `dir` and returns its line (the file first, as the RunWriter does).
inline std::string write_media(const std::filesystem::path& dir, const MediaSpec& m) {
  write_text(dir / media_file_path(m), m.data);
  return media_line(m);
}

/// Appends `text` to the file at `path`.
inline void append_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::app | std::ios::binary) << text;
}

} // namespace chorus::test
