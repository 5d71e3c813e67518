// Histograms of values in GPU memory (Run::log_histogram's device overload;
// README, "Histograms"), counted on the GPU without a host sync:
//
//   trainer:  log_histogram(key, ptr, n, dtype, stream)
//               cudaMemsetAsync(scratch) ; chorus_histogram<<<..., stream>>>
//               (counts by the float's top 16 bits, NaN and infinities apart,
//               sum, min, max) ; cudaMemcpyAsync(pinned <- scratch) ; event,
//               then a device_histogram slot in the ring
//   proxy:    polls the event in ring order; once it has fired, the pinned
//             counts become a chorus::Histogram (core::histogram::from_dense)
//             and go out as log_histogram's do
//
// The kernel is chorus's own source, compiled by NVRTC once per process for
// the device's architecture and loaded as a context-independent library.
#pragma once

#include "runtime/client/cuda_api.hpp"

#include <chorus/chorus.hpp>
#include "runtime/core/result.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace chorus::client {

/// One histogram in flight: the GPU's counts land in `pinned`, then `event` fires.
struct DeviceHistogramJob {
  std::uint32_t* pinned = nullptr; // dense counts, then the statistics (DeviceBuckets::bytes)
  void* scratch = nullptr;         // the same, in device memory
  int device = -1;
  cuda::Event event = nullptr;
  DeviceHistogramJob* next_free = nullptr;
};

class DeviceBuckets {
public:
  /// The bytes of a job's counts and statistics.
  static const std::size_t bytes;

  explicit DeviceBuckets(const cuda::Runtime& rt) : rt_(rt) {}
  ~DeviceBuckets();
  DeviceBuckets(const DeviceBuckets&) = delete;
  DeviceBuckets& operator=(const DeviceBuckets&) = delete;

  /// Counts the `n` values of type `dtype` at `values` (device memory of
  /// `device`) on `stream`, then copies the counts back and records the
  /// job's event there. Never waits. The values must stay in place until
  /// the stream has run the kernel (as for any kernel of the trainer's).
  [[nodiscard]] Result<DeviceHistogramJob*> count(const void* values, std::uint64_t n, DeviceDtype dtype, int device,
                                                  cuda::Stream stream);
  /// true once the counts have landed, false while they have not; an error
  /// if the stream failed first.
  [[nodiscard]] Result<bool> poll(const DeviceHistogramJob& job) const;
  /// The histogram of a job that has landed.
  [[nodiscard]] static Histogram take(DeviceHistogramJob& job);
  /// Returns a job whose event has fired (or failed) to the pool.
  void release(DeviceHistogramJob* job);
  /// Returns a job whose work may still be running: pooled once its event fires.
  void abandon(DeviceHistogramJob* job);

private:
  Error load(int device);
  DeviceHistogramJob* take_free(int device); // under mu_

  const cuda::Runtime& rt_;
  std::mutex mu_;
  bool loaded_ = false;
  Error load_error_; // a failed load is not retried: every later call reports it
  cuda::Library library_ = nullptr;
  cuda::Kernel kernel_ = nullptr;
  const cuda::Driver* driver_ = nullptr;
  std::vector<int> blocks_; // by device: the grid that fills it
  DeviceHistogramJob* free_ = nullptr;
  std::vector<DeviceHistogramJob*> abandoned_;
  std::vector<std::unique_ptr<DeviceHistogramJob>> all_;
};

/// The kernel's source, and its PTX for compute capability `arch` (75 for
/// sm_75; 0: the highest NVRTC supports), or NVRTC's error with its log.
[[nodiscard]] const char* device_histogram_source() noexcept;
[[nodiscard]] Result<std::string> device_histogram_ptx(int arch);

} // namespace chorus::client
