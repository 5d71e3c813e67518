// How many requests go in flight at once to one server, sized from its
// answers (io/upload/mlflow_points.cpp): a server that answers as fast with
// more in flight has idle workers, so the window grows; one whose answers
// slow down as the window grows is queueing them, so it stops growing (and
// shrinks past a few queued); one that says it is busy (429, 5xx) or does
// not answer gets half as many at once.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <optional>

namespace chorus::upload {

class RequestWindow {
public:
  /// Requests queued at the server (beyond those it serves at once) that
  /// the window aims at: enough that a worker finishing one always finds
  /// the next waiting, few enough to leave the server to other clients.
  static constexpr double min_queued = 2, max_queued = 4;

  RequestWindow(std::size_t initial, std::size_t max) : size_(static_cast<double>(initial)), max_(max) {}

  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(size_); }
  [[nodiscard]] std::size_t max() const noexcept { return max_; }

  /// What a request carries from its sending to its answer: the window's
  /// back-offs so far (answered() weighs only answers sent since the last).
  [[nodiscard]] std::uint64_t epoch() const noexcept { return backoffs_; }

  /// A request sent at `sent_in` (epoch()) was answered (2xx) after
  /// `latency`. Only `measures` ones (requests of the usual size: a small
  /// one is quick whatever the queue) size the window, and only those sent
  /// since the last back-off: the answers of a window sent before the
  /// server said it was busy tell nothing of the halved one (as TCP does
  /// not grow its window while it recovers). The quickest answer yet is the
  /// server's own time for a request; `latency` beyond it, times the window,
  /// estimates how many requests wait at the server (TCP Vegas's estimate);
  /// the window moves by one request a window of answers towards
  /// [min_queued, max_queued].
  void answered(std::chrono::nanoseconds latency, bool measures, std::uint64_t sent_in) {
    if (!measures || latency.count() <= 0 || sent_in != backoffs_) return;
    if (!base_ || latency < *base_) base_ = latency;
    const double queued = size_ * (1.0 - static_cast<double>(base_->count()) / static_cast<double>(latency.count()));
    if (queued < min_queued) size_ += 1.0 / size_;
    else if (queued > max_queued) size_ -= 1.0 / size_;
    size_ = std::clamp(size_, 1.0, static_cast<double>(max_));
  }

  /// The server said it is busy (429, 503, another 5xx) or did not answer: half as many at once.
  void backed_off() {
    size_ = std::max(1.0, size_ / 2);
    ++backoffs_;
  }

private:
  double size_;
  std::uint64_t backoffs_ = 0;
  std::size_t max_;
  std::optional<std::chrono::nanoseconds> base_;
};

} // namespace chorus::upload
