// bench_device_histogram: what Run::log_histogram's device overload costs
// the trainer thread for 1 M floats in GPU memory (target: <= 0.2 ms of host
// time, no host sync), beside
//   floor   CUDA's own calls the overload makes, bare: a memset, a kernel
//           launch is not among them (it needs chorus's kernel), a 256 KiB
//           device-to-host copy and an event record;
//   host    the same values' histogram from host memory (log_histogram of a
//           span), the path a trainer takes without a GPU.
// Host time is the call's own, per call; the GPU time of the count is taken
// with CUDA events around it. Every histogram is checked to be committed.
#include "bench/local_run.hpp"

#include <chorus/chorus.hpp>

#include <cuda_runtime_api.h>

#include <fstream>
#include <random>
#include <vector>

using namespace bench;

namespace {

double percentile(std::vector<double> v, double q) { return quantile(v, q); }

std::size_t lines_of(const std::string& path) {
  std::ifstream in(path);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

} // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_device_histogram: no CUDA device here; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  constexpr std::size_t n = 1 << 20;
  constexpr int calls = 400;
  std::printf("bench_device_histogram on %s: %zu floats (normal), %d calls a case\n\n", prop.name, n, calls);
  std::vector<float> host(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& f : host) f = normal(rng);
  float* dev = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&dev), n * sizeof(float));
  cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  // The floor: the CUDA calls of one device histogram but its kernel, bare.
  std::vector<double> floor_us;
  {
    void* scratch = nullptr;
    void* pinned = nullptr;
    constexpr std::size_t bytes = 65536 * 4 + 40;
    cudaMalloc(&scratch, bytes);
    cudaMallocHost(&pinned, bytes);
    cudaEvent_t ev = nullptr;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    for (int i = 0; i < calls; ++i) {
      const std::int64_t t0 = now_ns();
      cudaMemsetAsync(scratch, 0, bytes, stream);
      cudaMemcpyAsync(pinned, scratch, bytes, cudaMemcpyDeviceToHost, stream);
      cudaEventRecord(ev, stream);
      floor_us.push_back(static_cast<double>(now_ns() - t0) / 1e3);
      if (i % 16 == 15) cudaStreamSynchronize(stream);
    }
    cudaStreamSynchronize(stream);
    cudaEventDestroy(ev);
    cudaFree(scratch);
    cudaFreeHost(pinned);
  }

  TempDir dir;
  chorus::Run run = local_run(dir);
  // The first call compiles the kernel (NVRTC), once per process.
  const std::int64_t c0 = now_ns();
  chorus::Error first = run.log_histogram("warm", dev, n, chorus::DeviceDtype::float32, stream).wait();
  const double compile_ms = static_cast<double>(now_ns() - c0) / 1e6;
  if (first) {
    std::printf("the device histogram failed: %s\n", first.message().c_str());
    return 1;
  }
  std::vector<double> device_us, gpu_us, host_us;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < calls; ++i) {
    cudaEventRecord(start, stream);
    const std::int64_t t0 = now_ns();
    (void)run.log_histogram("grad", dev, n, chorus::DeviceDtype::float32, stream);
    device_us.push_back(static_cast<double>(now_ns() - t0) / 1e3);
    cudaEventRecord(stop, stream);
    if (i % 16 == 15) {
      // Outside the timed calls: the GPU time of the last one.
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      gpu_us.push_back(static_cast<double>(ms) * 1e3);
    }
    const std::int64_t t1 = now_ns();
    (void)run.log_histogram("grad_host", std::span<const float>(host));
    host_us.push_back(static_cast<double>(now_ns() - t1) / 1e3);
  }
  chorus::FinishResult r = run.finish().wait();
  const std::size_t lines = lines_of(r.run_dir + "/histograms.jsonl");

  Table t({"case (us a call, host)", "p50", "p99"});
  t.add({"log_histogram, 1 M device floats", num(percentile(device_us, 0.5), 1), num(percentile(device_us, 0.99), 1)});
  t.add({"CUDA's floor (memset + 256 KiB copy + event)", num(percentile(floor_us, 0.5), 1),
         num(percentile(floor_us, 0.99), 1)});
  t.add({"log_histogram, 1 M host floats", num(percentile(host_us, 0.5), 1), num(percentile(host_us, 0.99), 1)});
  t.print();
  std::printf("\nGPU time of one count (memset, kernel, copy back): p50 %s us\n", num(percentile(gpu_us, 0.5), 1).c_str());
  std::printf("the first call (NVRTC compiles the kernel): %s ms\n", num(compile_ms, 1).c_str());
  std::printf("histograms.jsonl: %zu lines, expected %d: %s\n", lines, 2 * calls + 1,
              lines == static_cast<std::size_t>(2 * calls + 1) ? "all committed" : "MISSING");
  const double p50 = percentile(device_us, 0.5);
  std::printf("\ntarget: 1 M device floats <= 200 us of host time: p50 %s us -> %s; host path / device path, p50: %sx\n",
              num(p50, 1).c_str(), p50 <= 200 ? "met" : "NOT met",
              num(percentile(host_us, 0.5) / p50, 1).c_str());
  report("device_histogram.call_us_p50", p50);
  report("device_histogram.gpu_us_p50", percentile(gpu_us, 0.5));
  cudaFree(dev);
  cudaStreamDestroy(stream);
  return lines == static_cast<std::size_t>(2 * calls + 1) ? 0 : 1;
}
