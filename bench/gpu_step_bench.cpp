// bench_gpu_step: what device logging costs a training step. The same
// stand-in step (three SGEMMs and a loss reduction) runs flat out with
//   none     no logging (the reference),
//   chorus   run.log_device of loss and gnorm every step (no host sync),
//   reduce   run.reduce_device of both (NCCL, one rank),
//   item     the usual alternative: copy both to the host and wait for the
//            stream (PyTorch's .item()), then run.log the host values.
// Time per step is wall time over the whole loop, ending with one stream
// synchronisation; every run's history is checked to hold every step.
#include "bench/bench.hpp"
#include "bench/gpu_step_kernels.hpp"

#include <chorus/chorus.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <fstream>
#include <vector>

using namespace bench;

namespace {

enum class Variant { none, chorus, reduce, item };
const char* name(Variant v) {
  switch (v) {
    case Variant::none: return "none";
    case Variant::chorus: return "chorus";
    case Variant::reduce: return "reduce";
    case Variant::item: return "item";
  }
  return "?";
}

struct Result {
  double us_per_step = 0;
  double call_ns = 0; // host time of the logging call itself, per step
  std::size_t rows = 0;
};

std::size_t history_rows(const std::string& dir) {
  std::ifstream in(dir + "/history.jsonl");
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

Result measure(bench_gpu::Model& m, cudaStream_t stream, Variant v, int steps) {
  TempDir dir;
  chorus::Options opt;
  opt.project = "bench";
  opt.dir = dir.path.string();
  opt.read_env = false;
  opt.topology = chorus::Topology{};
  opt.system_interval = 0;
  opt.queue_capacity = 1 << 16;
  chorus::Run run = chorus::init(opt);
  float* host = nullptr;
  cudaMallocHost(reinterpret_cast<void**>(&host), 2 * sizeof(float));
  const chorus::DeviceMetric metrics[] = {{"loss", m.scalars}, {"gnorm", m.scalars + 1}};
  // Warm up: the first device call loads CUDA into chorus, the first reduce forms NCCL.
  m.step(stream);
  if (v == Variant::chorus) (void)run.log_device(metrics, stream, {.step = 0}).wait();
  if (v == Variant::reduce) (void)run.reduce_device(metrics, chorus::Reduce::mean, stream, {.step = 0}).wait();
  cudaStreamSynchronize(stream);

  std::int64_t call_ns = 0;
  const std::int64_t t0 = now_ns();
  for (int s = 1; s <= steps; ++s) {
    m.step(stream);
    const std::int64_t c0 = now_ns();
    switch (v) {
      case Variant::none: break;
      case Variant::chorus: run.log_device(metrics, stream, {.step = s}); break;
      case Variant::reduce: run.reduce_device(metrics, chorus::Reduce::mean, stream, {.step = s}); break;
      case Variant::item:
        cudaMemcpyAsync(host, m.scalars, 2 * sizeof(float), cudaMemcpyDeviceToHost, stream);
        cudaStreamSynchronize(stream);
        run.log({{"loss", host[0]}, {"gnorm", host[1]}}, {.step = s});
        break;
    }
    call_ns += now_ns() - c0;
  }
  cudaStreamSynchronize(stream);
  const std::int64_t t1 = now_ns();
  chorus::FinishResult r = run.finish().wait();
  if (r.error) std::fprintf(stderr, "%s: finish: %s\n", name(v), r.error.message().c_str());
  cudaFreeHost(host);
  Result out;
  out.us_per_step = static_cast<double>(t1 - t0) / 1e3 / steps;
  out.call_ns = static_cast<double>(call_ns) / steps;
  out.rows = v == Variant::none ? 0 : history_rows(r.run_dir);
  return out;
}

/// The floor under log_device: CUDA's own cost of one asynchronous 8-byte
/// device-to-host copy plus an event record, called bare, per call (ns).
double raw_capture_ns(cudaStream_t stream, const float* dev) {
  float* pinned = nullptr;
  cudaMallocHost(reinterpret_cast<void**>(&pinned), 2 * sizeof(float));
  cudaEvent_t ev = nullptr;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  std::int64_t total = 0;
  const int calls = 20000;
  for (int i = 0; i < calls; ++i) {
    const std::int64_t t0 = now_ns();
    cudaMemcpyAsync(pinned, dev, 2 * sizeof(float), cudaMemcpyDeviceToHost, stream);
    cudaEventRecord(ev, stream);
    total += now_ns() - t0;
    if (i % 64 == 63) cudaStreamSynchronize(stream);
  }
  cudaStreamSynchronize(stream);
  cudaEventDestroy(ev);
  cudaFreeHost(pinned);
  return static_cast<double>(total) / calls;
}

} // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_gpu_step: no CUDA device here; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("bench_gpu_step on %s\n\n", prop.name);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  {
    bench_gpu::Model probe;
    if (probe.make(32)) {
      const double raw = raw_capture_ns(stream, probe.scalars);
      std::printf("CUDA's floor: cudaMemcpyAsync (8 bytes, device to pinned host) + cudaEventRecord = %s ns a call\n\n",
                  num(raw, 0).c_str());
      report("gpu_step.raw_capture_ns", raw);
      probe.free();
    }
  }
  std::printf("%-6s %-8s %12s %10s %14s %8s\n", "size", "logging", "us/step", "vs none", "call ns/step", "rows");
  for (const int size : {256, 1024}) {
    bench_gpu::Model m;
    if (!m.make(size)) {
      std::printf("cannot allocate the model on the GPU\n");
      return 1;
    }
    const int steps = size == 256 ? 4000 : 400;
    std::vector<double> reference;
    for (Variant v : {Variant::none, Variant::chorus, Variant::reduce, Variant::item}) {
      // The median of three runs.
      std::vector<Result> runs;
      for (int i = 0; i < 3; ++i) runs.push_back(measure(m, stream, v, steps));
      std::sort(runs.begin(), runs.end(), [](const Result& a, const Result& b) { return a.us_per_step < b.us_per_step; });
      const Result& r = runs[1];
      if (v == Variant::none) reference.push_back(r.us_per_step);
      const double ratio = r.us_per_step / reference.back();
      std::printf("%-6d %-8s %12s %9sx %14s %8s\n", size, name(v), num(r.us_per_step, 1).c_str(), num(ratio, 3).c_str(),
                  num(r.call_ns, 0).c_str(), v == Variant::none ? "-" : std::to_string(r.rows).c_str());
      // chorus and reduce log a warm-up row at step 0 too.
      const std::size_t expected = static_cast<std::size_t>(steps) + (v == Variant::item ? 0 : 1);
      if (v != Variant::none && r.rows != expected) std::printf("  MISSED: %zu rows, expected %zu\n", r.rows, expected);
      const std::string key = std::string("gpu_step.n") + std::to_string(size) + "." + name(v);
      report((key + ".us_per_step").c_str(), r.us_per_step);
      report((key + ".ratio").c_str(), ratio);
      report((key + ".call_ns").c_str(), r.call_ns);
    }
    m.free();
  }
  cudaStreamDestroy(stream);
  return 0;
}
