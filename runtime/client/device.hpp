// The GPU path of a rank (README, "Values on the GPU"): device values captured
// without a host sync, and reduced across the run's ranks with NCCL.
//
//   trainer:  run.log_device(...)    cudaMemcpyAsync(pinned <- device) + event on the
//                                    trainer's stream, then a device_head in the ring
//   proxy:    drain()                polls the event; once it has fired, the values
//                                    go out like any other log call, in ring order
//   trainer:  run.reduce_device(...) copies into chorus's buffer on chorus's stream,
//                                    ncclReduce to the run host; only there is the
//                                    result captured as above
#pragma once

#include "runtime/client/cuda_api.hpp"
#include "runtime/client/device_histogram.hpp"

#include "runtime/core/result.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace chorus::client {

/// One device log call in flight: where its values land on the host, and the
/// event that fires once they have.
struct Capture {
  float* pinned = nullptr;
  std::uint32_t capacity = 0;
  /// How many values the last capture() copied: the first `copied` values
  /// of its log call (the rest, host values logged beside them, are in the ring).
  std::uint32_t copied = 0;
  cuda::Event event = nullptr;
  bool landed = false; // poll() saw the event fire: reuse needs no query
  Capture* next_free = nullptr;
};

class DeviceCapture {
public:
  /// Fails where there is no CUDA runtime or no device.
  [[nodiscard]] static Result<std::unique_ptr<DeviceCapture>> create();
  ~DeviceCapture();
  DeviceCapture(const DeviceCapture&) = delete;
  DeviceCapture& operator=(const DeviceCapture&) = delete;

  /// Issues an asynchronous copy of each `values[i]` (a float in device
  /// memory) on `stream`, then records the capture's event there. Never waits.
  [[nodiscard]] Result<Capture*> capture(std::span<const float* const> values, cuda::Stream stream);
  /// true once the values have landed, false while they have not; an error
  /// if the stream failed first.
  [[nodiscard]] Result<bool> poll(Capture& c) const;
  /// Returns a capture to the pool (its event need not have fired).
  void release(Capture* c);

  [[nodiscard]] const cuda::Runtime& runtime() const noexcept { return *rt_; }
  /// Histograms counted on the GPU (device_histogram.hpp).
  [[nodiscard]] DeviceBuckets& buckets() noexcept { return buckets_; }

private:
  explicit DeviceCapture(const cuda::Runtime* rt) : rt_(rt), buckets_(*rt) {}
  const cuda::Runtime* rt_;
  DeviceBuckets buckets_;
  std::mutex mu_;
  Capture* free_ = nullptr;
  std::vector<std::unique_ptr<Capture>> all_;
};

/// Hands the run's NCCL unique id around: the run host provides it
/// (`provide` true, `id` filled), the other ranks fetch it (`id` set).
using NcclIdExchange = std::function<Error(bool provide, std::vector<char>& id)>;

/// The run's own NCCL communicator, stream and buffers; made on first use
/// (every rank's first reduce_device), bounded by init_timeout.
class DeviceReducer {
public:
  DeviceReducer(DeviceCapture& capture, int rank, int world, std::chrono::milliseconds init_timeout,
                NcclIdExchange exchange)
      : capture_(capture), rank_(rank), world_(world), init_timeout_(init_timeout), exchange_(std::move(exchange)) {}
  ~DeviceReducer();
  DeviceReducer(const DeviceReducer&) = delete;
  DeviceReducer& operator=(const DeviceReducer&) = delete;

  /// An error naming the fix where `op` is no reduction NCCL can do (none,
  /// first, an unknown value).
  static Error check(Reduce op);

  /// Reduces `values` (floats in device memory, ready in `stream`'s order)
  /// over the run's ranks. On the run host (rank 0) returns the capture of
  /// the result; elsewhere nullptr. `stream` waits only for chorus's copy of
  /// the values, not for the reduction.
  [[nodiscard]] Result<Capture*> reduce(std::span<const float* const> values, Reduce op, cuda::Stream stream);

private:
  Error init(int device);
  Error wait_comm(const char* what);

  DeviceCapture& capture_;
  int rank_, world_;
  std::chrono::milliseconds init_timeout_;
  NcclIdExchange exchange_;
  const cuda::Nccl* nccl_ = nullptr;
  Error init_error_; // a failed init is not retried: every later call reports it
  bool ready_ = false;
  int device_ = -1;
  cuda::Comm comm_ = nullptr;
  cuda::Stream stream_ = nullptr;
  cuda::Event values_ready_ = nullptr, values_copied_ = nullptr;
  float* staging_ = nullptr; // the values, gathered (device memory)
  float* result_ = nullptr;  // the reduction (device memory, run host only)
  std::size_t capacity_ = 0;
};

} // namespace chorus::client
