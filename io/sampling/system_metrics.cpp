#include "io/sampling/system_metrics.hpp"

#include "runtime/core/json.hpp"

#include <cctype>
#include <filesystem>
#include <string_view>

namespace chorus::sampling {

namespace {

void note(std::string& notes, std::string_view line) {
  if (!notes.empty()) notes.append("; ");
  notes.append(line);
}

} // namespace

namespace {

/// Whether this process is meant to see a GPU: CUDA_VISIBLE_DEVICES names
/// one, or an NVIDIA device node exists. Only then is a missing NVML worth a word.
bool gpu_expected(const char* cuda_visible_devices) {
  if (cuda_visible_devices != nullptr)
    return *cuda_visible_devices != '\0' && std::string_view(cuda_visible_devices) != "-1";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 6 && name.starts_with("nvidia") && std::isdigit(static_cast<unsigned char>(name[6]))) return true;
  }
  return false;
}

} // namespace

SystemSampler::SystemSampler(SystemLabels labels, std::string watched_dir, const char* nvml_library,
                             const char* cuda_visible_devices, std::string proc_root)
    : labels_(labels), process_(0, proc_root) {
  node_suffix_.append("/node-").append(std::to_string(labels.node));
  rank_suffix_.append("/rank-").append(std::to_string(labels.rank));
  if (labels.node_figures) {
    host_.emplace(std::move(watched_dir), std::move(proc_root));
    if (!host_->limitations().empty()) note(notes_, host_->limitations());
  }
  if (nvml_library == nullptr) return;
  Result<std::unique_ptr<Nvml>> loaded = Nvml::load(nvml_library);
  if (!loaded) {
    if (gpu_expected(cuda_visible_devices)) note(notes_, loaded.error().message());
    return;
  }
  nvml_ = std::move(*loaded);
  const VisibleDevices visible = parse_cuda_visible_devices(cuda_visible_devices);
  const auto id = rank_gpu_id(visible, labels.local_rank, nvml_->device_count());
  if (!id) {
    std::string line = "rank ";
    line.append(std::to_string(labels.rank)).append(" sees no GPU (CUDA_VISIBLE_DEVICES ");
    line.append(cuda_visible_devices ? std::string("\"").append(cuda_visible_devices).append("\"") : "unset");
    line.append(", ").append(std::to_string(nvml_->device_count())).append(" devices): no GPU metrics");
    note(notes_, line);
    return;
  }
  const Result<unsigned> gpu = nvml_->find(*id);
  if (!gpu) {
    note(notes_, std::string("rank ").append(std::to_string(labels.rank)).append(": ").append(gpu.error().message()));
    return;
  }
  gpu_ = *gpu;
  gpu_name_ = nvml_->name(*gpu_);
}

SystemSampler::~SystemSampler() = default;

Error SystemSampler::sample_line(std::string& out, std::int64_t now_us, double runtime_s) {
  out.clear();
  core::JsonWriter w(out);
  w.begin_object();
  w.key("_timestamp").number(static_cast<double>(now_us) / 1e6);
  w.key("_runtime").number(runtime_s);
  w.key("_node").integer(labels_.node);
  w.key("_rank").integer(labels_.rank);
  auto put = [&](std::string_view name, const std::string& suffix, double v) {
    key_.assign("system.").append(name).append(suffix);
    w.key(key_).number(v);
  };
  auto put_opt = [&](std::string_view name, const std::string& suffix, const std::optional<double>& v) {
    if (v) put(name, suffix, *v);
  };
  Error first;
  if (host_) {
    platform::HostSample h;
    if (Error e = host_->sample(h)) {
      first = std::move(e);
    } else {
      put("cpu.percent", node_suffix_, h.cpu_percent);
      put("cpu.count", node_suffix_, h.cpu_count);
      put("memory.used_bytes", node_suffix_, h.memory_used_bytes);
      put("memory.total_bytes", node_suffix_, h.memory_total_bytes);
      put("memory.percent", node_suffix_, h.memory_percent);
      put_opt("disk.used_bytes", node_suffix_, h.disk_used_bytes);
      put_opt("disk.total_bytes", node_suffix_, h.disk_total_bytes);
      put_opt("disk.percent", node_suffix_, h.disk_percent);
      put_opt("disk.read_bytes_per_s", node_suffix_, h.disk_read_bytes_per_s);
      put_opt("disk.write_bytes_per_s", node_suffix_, h.disk_write_bytes_per_s);
      put_opt("network.rx_bytes_per_s", node_suffix_, h.net_rx_bytes_per_s);
      put_opt("network.tx_bytes_per_s", node_suffix_, h.net_tx_bytes_per_s);
    }
  }
  platform::ProcessSample p;
  if (Error e = process_.sample(p)) {
    if (!first) first = std::move(e);
  } else {
    put("proc.cpu.percent", rank_suffix_, p.cpu_percent);
    put("proc.memory.rss_bytes", rank_suffix_, p.rss_bytes);
    put("proc.threads", rank_suffix_, p.threads);
  }
  if (gpu_) {
    GpuSample g;
    // A partial sample still carries what was read; its error is told once.
    if (Error e = nvml_->sample(*gpu_, g); e && !gpu_error_reported_ && !first) {
      first = std::move(e);
      gpu_error_reported_ = true;
    }
    put_opt("gpu.utilization_percent", rank_suffix_, g.utilization_percent);
    put_opt("gpu.memory_utilization_percent", rank_suffix_, g.memory_utilization_percent);
    put_opt("gpu.memory.used_bytes", rank_suffix_, g.memory_used_bytes);
    put_opt("gpu.memory.total_bytes", rank_suffix_, g.memory_total_bytes);
    put_opt("gpu.temperature_c", rank_suffix_, g.temperature_c);
    put_opt("gpu.power_w", rank_suffix_, g.power_w);
    put_opt("gpu.sm_clock_mhz", rank_suffix_, g.sm_clock_mhz);
    put_opt("gpu.memory_clock_mhz", rank_suffix_, g.memory_clock_mhz);
  }
  w.end_object();
  return first;
}

} // namespace chorus::sampling
