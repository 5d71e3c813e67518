// What the SystemMonitor of one rank samples, as system.jsonl lines: the
// node's figures (on the node's local rank 0), the rank's process and the
// rank's GPU. Keys carry a label suffix, `/node-N` or `/rank-N`, so that the
// lines of 64 ranks on 8 nodes never collide in one run:
//
//   {"_timestamp": 1.7e9, "_runtime": 12.5, "_node": 0, "_rank": 3,
//    "system.proc.cpu.percent/rank-3": 99.1, "system.gpu.power_w/rank-3": 118.6, ...}
#pragma once

#include "io/platform/procfs.hpp"
#include "io/sampling/nvml.hpp"

#include <chorus/chorus.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace chorus::sampling {

struct SystemLabels {
  int node = 0;
  int rank = 0;
  unsigned local_rank = 0;
  bool node_figures = false; // this rank samples its node (local rank 0)
};

class SystemSampler {
public:
  /// `watched_dir`: the directory whose disk is reported (the run directory
  /// on the run host's node). `nvml_library`: nullptr for no GPU figures.
  /// `cuda_visible_devices`: CUDA_VISIBLE_DEVICES (nullptr = unset).
  SystemSampler(SystemLabels labels, std::string watched_dir, const char* nvml_library,
                const char* cuda_visible_devices, std::string proc_root = "/proc");
  ~SystemSampler();
  SystemSampler(const SystemSampler&) = delete;
  SystemSampler& operator=(const SystemSampler&) = delete;

  /// Why some figures are missing (no NVML, no GPU for this rank, no disk
  /// I/O for this directory), for one informational line; empty if none.
  [[nodiscard]] const std::string& notes() const noexcept { return notes_; }
  /// The GPU this rank's figures come from ("NVIDIA H100 80GB HBM3"), or empty.
  [[nodiscard]] const std::string& gpu_name() const noexcept { return gpu_name_; }

  /// Samples everything and renders one line (no newline) into `out`. An
  /// error names what could not be read; the line then holds the rest.
  [[nodiscard]] Error sample_line(std::string& out, std::int64_t now_us, double runtime_s);

private:
  SystemLabels labels_;
  std::optional<platform::HostSampler> host_;
  platform::ProcessSampler process_;
  std::unique_ptr<Nvml> nvml_;
  std::optional<unsigned> gpu_;
  std::string gpu_name_;
  std::string notes_;
  std::string node_suffix_, rank_suffix_;
  std::string key_; // reused for each key
  bool gpu_error_reported_ = false;
};

} // namespace chorus::sampling
