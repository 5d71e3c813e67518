// A Run's artifact copies, off the trainer's thread and off the actor
// runtime's: one chorus thread per Run, started by the first log_artifact,
// copies files into the run directory in call order (io/store/artifacts.hpp) and
// settles their tickets. Finish waits for it, at most finish_timeout.
#pragma once

#include "runtime/client/channel.hpp"

#include <chorus/chorus.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace chorus::client {

class ArtifactCopier {
public:
  struct Job {
    std::string name, type;
    std::string source;  // absolute
    std::string run_dir;
    int rank = 0;
    std::int64_t step = -1;
    std::int64_t ts_us = 0;
    bool check_here = false; // off the run host: first check that the run directory is on this machine
  };

  ArtifactCopier(Channel& channel, std::chrono::milliseconds finish_timeout) noexcept
      : channel_(channel), finish_timeout_(finish_timeout) {}
  /// Stops: the copy under way ends at its next chunk, those waiting are
  /// settled with an error, the thread is joined.
  ~ArtifactCopier();
  ArtifactCopier(const ArtifactCopier&) = delete;
  ArtifactCopier& operator=(const ArtifactCopier&) = delete;

  /// Queues a copy. Its ticket completes once the file and its manifest line
  /// are durable, or with the error. After close(): Errc::finished at once.
  Pending push(Job job);
  /// Takes no more copies (the run is finishing); those queued still run.
  void close() noexcept;
  /// Whether finish must wait: copies are queued or under way and
  /// finish_timeout since close() has not run out. Once it has, they are
  /// abandoned (their tickets get Errc::timeout) and this is false.
  bool holds_finish() noexcept;

private:
  void loop();
  Error copy(const Job& job);

  Channel& channel_;
  const std::chrono::milliseconds finish_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::uint64_t, Job>> queue_; // (ticket, job)
  std::thread thread_;
  bool closed_ = false;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point closed_at_;
  std::atomic<std::size_t> busy_{0}; // copies queued or under way
  std::atomic<bool> abandon_{false};
};

} // namespace chorus::client
