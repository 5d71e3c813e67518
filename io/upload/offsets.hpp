// A target's offsets file, <run>/upload/<target>.json (UploadState), as the
// Uploader keeps it: the digests it records of delivered files, and its
// writes after every answer.
#pragma once

#include "io/upload/upload.hpp"

#include <string>
#include <string_view>

namespace chorus::upload {

/// The digest UploadState keeps of a delivered config.json or summary.json.
[[nodiscard]] std::string delivered_digest(std::string_view content);

/// Writes the offsets after every answer, but makes them durable (fsync) at
/// most once per `durable_every`, and whenever the remote run or the end
/// state changes: an fsync costs milliseconds on many disks, one per request
/// capped MLflow at ~100 requests a second. What a crash of the machine
/// could lose (the last second's offsets) is settled with the server as
/// after a lost answer: MLflow's offset tag says what it stored, W&B's
/// file_stream places lines at their offsets. The events' offset
/// (UploadState::events) is made durable whenever it moves: a webhook keeps
/// nothing to settle with, and events are few.
class OffsetsWriter {
public:
  static constexpr std::chrono::milliseconds durable_every{1000};

  explicit OffsetsWriter(std::string path) : path_(std::move(path)) {}

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// Replaces the file with `st`; durably when due.
  [[nodiscard]] Error save(const UploadState& st);
  /// Makes a replacement that was not made durable durable now.
  [[nodiscard]] Error flush(const UploadState& st);

private:
  std::string path_;
  SteadyTime durable_at_{};
  std::string durable_run_, durable_final_;
  store::Cursor durable_events_;
  bool pending_durable_ = false;
};

} // namespace chorus::upload
