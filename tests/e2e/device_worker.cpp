// One rank of a GPU test job under `chorus launch`: each rank puts known
// floats on its GPU (local rank modulo the devices) and reduces them with
// reduce_device. Prints RUN_DIR on the run host, errors on stderr.
#include "runtime/client/cuda_api.hpp"

#include <chorus/chorus.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace cuda = chorus::client::cuda;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  const chorus::Result<const cuda::Runtime*> loaded = cuda::runtime();
  int devices = 0;
  if (!loaded || (*loaded)->GetDeviceCount(&devices) != cuda::success || devices == 0) {
    std::fprintf(stderr, "no CUDA device: %s\n", loaded ? "none visible" : loaded.error().message().c_str());
    return 77;
  }
  const cuda::Runtime* rt = *loaded;
  chorus::Options opt;
  opt.project = "device";
  opt.mode = chorus::Mode::shared;
  opt.system_interval = 0;
  opt.init_timeout = std::chrono::milliseconds(20'000);
  chorus::Error err;
  chorus::Run run = chorus::init(opt, err);
  if (err) {
    std::fprintf(stderr, "init failed: %s\n", err.message().c_str());
    return 3;
  }
  const int rank = run.topology().rank;
  rt->SetDevice(run.topology().local_rank % devices);
  // Step s, rank r: loss = r + s/2, tokens = 100 + r, peak = s - r.
  std::vector<float> host(3 * static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    host[3 * s] = static_cast<float>(rank) + 0.5f * static_cast<float>(s);
    host[3 * s + 1] = 100.0f + static_cast<float>(rank);
    host[3 * s + 2] = static_cast<float>(s - rank);
  }
  void* dev = nullptr;
  if (rt->Malloc(&dev, host.size() * sizeof(float)) != cuda::success ||
      rt->Memcpy(dev, host.data(), host.size() * sizeof(float), cuda::host_to_device) != cuda::success) {
    std::fprintf(stderr, "rank %d: cannot put values on the GPU\n", rank);
    return 5;
  }
  const float* d = static_cast<const float*>(dev);
  int failures = 0;
  for (int s = 0; s < steps; ++s) {
    const chorus::DeviceMetric mean[] = {{"loss", d + 3 * s}};
    const chorus::DeviceMetric sum[] = {{"tokens", d + 3 * s + 1}};
    const chorus::DeviceMetric max[] = {{"peak", d + 3 * s + 2}};
    for (auto [m, op] : {std::pair{std::span<const chorus::DeviceMetric>(mean), chorus::Reduce::mean},
                         std::pair{std::span<const chorus::DeviceMetric>(sum), chorus::Reduce::sum},
                         std::pair{std::span<const chorus::DeviceMetric>(max), chorus::Reduce::max}}) {
      if (chorus::Error e = run.reduce_device(m, op, nullptr, {.step = s}).wait()) {
        if (failures++ == 0) std::fprintf(stderr, "rank %d reduce_device: %s\n", rank, e.message().c_str());
      }
    }
  }
  chorus::FinishResult r = run.finish().wait();
  if (r.error) std::fprintf(stderr, "rank %d finish: %s\n", rank, r.error.message().c_str());
  if (run.is_host()) std::printf("RUN_DIR=%s\n", r.run_dir.c_str());
  rt->Free(dev);
  return failures > 0 ? 6 : (r.error ? 4 : 0);
}
