// Images, text and tables on their way into the ring: a job per call, made
// on the trainer's thread (pixels copied, text and tables checked and
// encoded), and a chorus thread per Run that encodes pixels to PNG
// (libpng). The ring slot of the call holds its job, in order with the
// rest of the rank's calls; the RankProxy sends it once it is ready.
#pragma once

#include "runtime/client/channel.hpp"
#include "runtime/core/media.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace chorus::client {

struct MediaJob {
  enum State : int { pending = 0, ready = 1, failed = 2 };
  std::atomic<int> state{pending};
  core::Media media; // ready: what travels
  Error error; // failed: why (the ticket's error)
  // Pixels to encode (HWC, 8 bits a channel), while pending.
  std::vector<std::uint8_t> pixels;
  int height = 0, width = 0, channels = 0;
};

/// PNG of HWC 8-bit pixels (1: grey, 3: RGB, 4: RGBA channels), or an Error.
[[nodiscard]] Error encode_png(const std::uint8_t* pixels, int height, int width, int channels, std::vector<char>& out);

class MediaEncoder {
public:
  explicit MediaEncoder(Channel& channel) : channel_(channel) {}
  /// Encodes what it is encoding, leaves the queued jobs pending (their
  /// slots' owner frees them), and joins its thread.
  ~MediaEncoder();
  MediaEncoder(const MediaEncoder&) = delete;
  MediaEncoder& operator=(const MediaEncoder&) = delete;

  /// Queues `job` (which the ring owns); its state turns ready or failed.
  void push(MediaJob* job);

private:
  void loop();

  Channel& channel_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<MediaJob*> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

} // namespace chorus::client
