// Artifacts of a run directory: files copied into <run>/artifacts/<name>
// and listed, one JSON line each, in <run>/artifacts.jsonl, which the
// Uploader reads (io/upload/upload.hpp's ArtifactEntry). A copy streams the file
// through a fixed buffer, hashing it with SHA-256 as it goes, so a
// checkpoint of any size costs one chunk of memory.
//
//   artifacts.jsonl line:
//   {"name":"ckpt/model.pt","type":"model","size":N,"sha256":"<64 hex>","rank":R,"step":S,"timestamp":T}
//
// A name logged again replaces the file and appends a new line: readers
// take the last line of a name.
#pragma once

#include <chorus/chorus.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace simdjson::dom {
class object;
}

namespace chorus::store {

/// How much of a file a copy reads and writes at a time.
inline constexpr std::size_t artifact_chunk = 1u << 20;
/// The longest artifact name, in bytes.
inline constexpr std::size_t max_artifact_name_bytes = 250;

/// Why `name` cannot name an artifact, or an empty Error. A name is a
/// relative, normalized path (no leading '/', no empty or "." segment, no
/// ".." anywhere) of at most 250 bytes of ASCII letters, digits, '_', '.',
/// '-', ' ' and '/': what MLflow takes as an artifact path (^[/\w.\- ]*$)
/// and the uploader sends, so it uploads as it is. The error names the rule
/// the name breaks.
[[nodiscard]] Error validate_artifact_name(std::string_view name);

/// One line of artifacts.jsonl.
struct ArtifactRecord {
  std::string name;
  std::string type;
  std::uint64_t size = 0;
  std::string sha256; // lowercase hex
  std::int64_t rank = 0;
  std::int64_t step = -1; // the rank's step when it logged the artifact; -1 before any
  std::int64_t ts_us = 0; // written as Unix seconds, as history's _timestamp
};

/// The record as one JSON line, '\n' included.
[[nodiscard]] std::string artifact_line(const ArtifactRecord& r);

/// A line of artifacts.jsonl, parsed as a JSON object, read back: nothing
/// where it has no string `name`; a member missing or of another type is left
/// at its default (a timestamp that is no time, at 0). The one reader of the
/// lines: the Uploader's, `chorus serve`'s and the Python package's.
[[nodiscard]] std::optional<ArtifactRecord> artifact_record(const simdjson::dom::object& line);

/// Copies the regular file `source` to `dest` (mode 0600; missing parent
/// directories made 0700) so that a reader, or a crash, sees the old file
/// or the whole new one: chunks go to a temporary file in dest's directory,
/// which is fsynced and renamed over dest. Sets `size` and `sha256` (hex)
/// of what was copied. Once `stop` is set the copy ends at its next chunk
/// with Errc::timeout, leaving dest as it was.
[[nodiscard]] Error copy_hashed(const std::string& source, const std::string& dest, std::uint64_t& size,
                                std::string& sha256, const std::atomic<bool>* stop = nullptr);

/// Stores one artifact of the run in `run_dir`: checks `rec.name`, copies
/// `source` to <run_dir>/artifacts/<rec.name> (filling rec.size and
/// rec.sha256), then appends rec's line to <run_dir>/artifacts.jsonl in one
/// O_APPEND write, so that processes sharing the run directory may append at
/// once, and syncs it. When it returns ok, the file and its line are durable.
[[nodiscard]] Error store_artifact(const std::string& run_dir, const std::string& source, ArtifactRecord& rec,
                                   const std::atomic<bool>* stop = nullptr);

/// Whether the run directory `run_dir` lies on this machine: it exists here
/// and its run.json names this host as the run's. A rank whose run host is
/// on another node gets an error saying where to log artifacts instead.
[[nodiscard]] Error check_run_dir_is_here(const std::string& run_dir);

} // namespace chorus::store
