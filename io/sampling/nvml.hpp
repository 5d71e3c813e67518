// GPU metrics from NVML, loaded with dlopen at run time: chorus builds and runs
// where there is no NVIDIA driver, and then simply reports no GPU metrics.
// Also: which GPU a rank uses, read from CUDA_VISIBLE_DEVICES the way the CUDA
// runtime reads it.
#pragma once

#include "runtime/core/result.hpp"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::sampling {

/// One reading of a GPU. A field the device does not report is absent.
struct GpuSample {
  std::optional<double> utilization_percent, memory_utilization_percent;
  std::optional<double> memory_used_bytes, memory_total_bytes;
  std::optional<double> temperature_c, power_w, sm_clock_mhz, memory_clock_mhz;
};

/// The NVIDIA Management Library of this machine, while it is loaded and
/// initialised. Device indices are NVML's (PCI bus order). Thread-safe: NVML is,
/// and nothing here changes after load().
class Nvml {
public:
  /// dlopen(library, RTLD_NOW | RTLD_LOCAL) and nvmlInit_v2. On failure an
  /// Errc::io_error whose message is one informational line that ends in
  /// "no GPU metrics", e.g. "NVML not found (libnvidia-ml.so.1: cannot open
  /// shared object file: ...): no GPU metrics". Never throws, never aborts.
  [[nodiscard]] static Result<std::unique_ptr<Nvml>> load(const char* library = "libnvidia-ml.so.1");

  /// nvmlShutdown, then dlclose.
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  [[nodiscard]] unsigned device_count() const noexcept;

  /// The device that a CUDA_VISIBLE_DEVICES entry names: an index ("0"), a GPU
  /// UUID ("GPU-8f1a...", or a prefix of one that matches a single GPU, as CUDA
  /// allows), or a MIG device ("MIG-<uuid>", a unique prefix of one, or the old
  /// "MIG-GPU-<uuid>/<gi>/<ci>"), which maps to the GPU that holds it. An
  /// Errc::invalid_argument saying so if none (or more than one) matches.
  [[nodiscard]] Result<unsigned> find(std::string_view id) const;

  /// "NVIDIA H100 80GB HBM3"; empty if it cannot be read.
  [[nodiscard]] std::string name(unsigned index) const;
  /// "GPU-8f1a2b3c-..."; empty if it cannot be read.
  [[nodiscard]] std::string uuid(unsigned index) const;

  /// Reads every field of `out` afresh; allocates nothing unless it fails. A
  /// field the device answers NOT_SUPPORTED for is left absent. Any other NVML
  /// failure leaves its field absent too, the others are still read, and the
  /// first failure comes back (Errc::io_error; Errc::invalid_argument for an
  /// index past device_count()).
  [[nodiscard]] Error sample(unsigned index, GpuSample& out) const;

private:
  struct Api; // the library handle, the resolved functions, the device handles
  explicit Nvml(std::unique_ptr<Api> api) noexcept;
  std::unique_ptr<Api> api_;
};

/// CUDA_VISIBLE_DEVICES as the CUDA runtime reads it: unset = every device
/// (`all`); set = the entries in `ids`, which may be none.
struct VisibleDevices {
  bool all = true;
  std::vector<std::string> ids;
};

/// Parses CUDA_VISIBLE_DEVICES (`value` nullptr = unset). Entries are
/// comma-separated, whitespace around them is dropped, and parsing stops at the
/// first entry that is not an index, "GPU-<hex>" or "MIG-<id>" (as the CUDA
/// runtime does), so "" , "-1" and "NoDevFiles" leave no device.
[[nodiscard]] VisibleDevices parse_cuda_visible_devices(const char* value);

/// The device a rank uses, as chorus and the usual trainer see it: entry
/// local_rank modulo the number of visible entries, or index local_rank modulo
/// device_count when every device is visible. An index entry at or past
/// device_count ends the list, as it does for CUDA. nullopt when the rank has no
/// GPU (none visible, or none present); otherwise the id to pass to Nvml::find.
[[nodiscard]] std::optional<std::string> rank_gpu_id(const VisibleDevices& visible, unsigned local_rank,
                                                     unsigned device_count);

} // namespace chorus::sampling
