#include "runtime/client/device_histogram.hpp"

#include "runtime/core/histogram.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace chorus::client {

namespace {

// The statistics after the dense counts: u64 NaN, +Inf and -Inf counts, the
// sum (a double), then two u32: the largest ~key (so the smallest value)
// and the largest key of the finite values, where a key orders floats as
// unsigned integers do. All start at zero (the memset).
constexpr std::size_t stats_words = 4; // u64 words before the two u32
constexpr std::size_t job_bytes = core::histogram::dense_keys * 4 + stats_words * 8 + 8;

// The kernel: one grid-stride pass over the values, a warp at a time, so
// that the lanes of a warp that count into one bucket add once
// (__match_any_sync). chorus's own code, compiled by NVRTC at run time; no
// headers, so that NVRTC alone (without the toolkit's include directory)
// compiles it. dtype: 0 float32, 1 float16, 2 bfloat16.
constexpr const char* kernel_source = R"cuda(
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float half_bits_to_float(u32 h) {
  const u32 sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) { // subnormal or zero: m * 2^-24, exact in a float
    const float f = (float)m * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ u64 warp_sum(u64 v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ u32 warp_max(u32 v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

extern "C" __global__ void chorus_histogram(const void* values, u64 n, int dtype, u32* counts) {
  u64* stats = (u64*)(counts + 65536);
  u64 nan = 0, pinf = 0, ninf = 0;
  double sum = 0.0;
  u32 lo = 0, hi = 0; // the largest ~key, and the largest key
  const u32 lane = threadIdx.x & 31u;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  // Warp-uniform trips: every lane of a warp runs each one (blockDim is a multiple of 32).
  for (u64 base = (u64)blockIdx.x * blockDim.x + threadIdx.x - lane; base < n; base += stride) {
    const u64 i = base + lane;
    u32 k = 0xffffffffu; // no count
    if (i < n) {
      float x;
      if (dtype == 0) x = ((const float*)values)[i];
      else if (dtype == 1) x = half_bits_to_float(((const unsigned short*)values)[i]);
      else x = __uint_as_float((u32)((const unsigned short*)values)[i] << 16);
      const u32 u = __float_as_uint(x);
      if (((u >> 23) & 0xffu) == 0xffu) {
        if (u & 0x7fffffu) ++nan;
        else if (u >> 31) ++ninf;
        else ++pinf;
      } else {
        k = u >> 16;
        sum += (double)x;
        const u32 key = (u >> 31) ? ~u : (u | 0x80000000u);
        lo = max(lo, ~key);
        hi = max(hi, key);
      }
    }
#if __CUDA_ARCH__ >= 700
    const u32 same = __match_any_sync(0xffffffffu, k);
    if (k != 0xffffffffu && lane == (u32)(__ffs(same) - 1)) atomicAdd(&counts[k], (u32)__popc(same));
#else
    if (k != 0xffffffffu) atomicAdd(&counts[k], 1u);
#endif
  }
  nan = warp_sum(nan);
  pinf = warp_sum(pinf);
  ninf = warp_sum(ninf);
  sum = warp_sum(sum);
  lo = warp_max(lo);
  hi = warp_max(hi);
  if (lane == 0) {
    if (nan) atomicAdd(&stats[0], nan);
    if (pinf) atomicAdd(&stats[1], pinf);
    if (ninf) atomicAdd(&stats[2], ninf);
    if (lo | hi) {
      atomicAdd((double*)&stats[3], sum);
      atomicMax((u32*)&stats[4], lo);
      atomicMax((u32*)&stats[4] + 1, hi);
    }
  }
}
)cuda";

/// A float from its key (the order-preserving map the kernel takes).
double from_key(std::uint32_t key) {
  const std::uint32_t u = (key & 0x80000000u) ? key & 0x7fffffffu : ~key;
  return static_cast<double>(std::bit_cast<float>(u));
}

constexpr unsigned block_threads = 256;

} // namespace

const std::size_t DeviceBuckets::bytes = job_bytes;

const char* device_histogram_source() noexcept { return kernel_source; }

Result<std::string> device_histogram_ptx(int arch) {
  Result<const cuda::Nvrtc*> loaded = cuda::nvrtc();
  if (!loaded) return loaded.error();
  const cuda::Nvrtc& nv = **loaded;
  int count = 0;
  std::vector<int> archs;
  if (nv.GetNumSupportedArchs(&count) == cuda::success && count > 0) {
    archs.resize(static_cast<std::size_t>(count));
    if (nv.GetSupportedArchs(archs.data()) != cuda::success) archs.clear();
  }
  // The newest architecture NVRTC compiles for that the device runs: its PTX
  // is JIT-compiled by the driver for the device itself.
  int pick = 0;
  for (int a : archs)
    if (arch == 0 || a <= arch) pick = std::max(pick, a);
  if (pick == 0)
    return Error(Errc::invalid_argument,
                 "the GPU (compute capability " + std::to_string(arch / 10) + "." + std::to_string(arch % 10) +
                     ") is older than every architecture the NVRTC loaded compiles for" +
                     (archs.empty() ? std::string() : " (the oldest: " + std::to_string(archs.front()) + ")") +
                     ": load the NVRTC of an older CUDA toolkit, or log the values' histogram from the host");
  cuda::Program prog = nullptr;
  if (int rc = nv.CreateProgram(&prog, kernel_source, "chorus_histogram.cu", 0, nullptr, nullptr); rc != cuda::success)
    return Error(Errc::internal, std::string("NVRTC could not take chorus's histogram kernel: ") + nv.GetErrorString(rc));
  const std::string option = "--gpu-architecture=compute_" + std::to_string(pick);
  const char* options[] = {option.c_str()};
  const int rc = nv.CompileProgram(prog, 1, options);
  std::string out;
  if (rc != cuda::success) {
    std::size_t n = 0;
    std::string log;
    if (nv.GetProgramLogSize(prog, &n) == cuda::success && n > 1) {
      log.resize(n);
      if (nv.GetProgramLog(prog, log.data()) != cuda::success) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    nv.DestroyProgram(&prog);
    return Error(Errc::internal, std::string("NVRTC could not compile chorus's histogram kernel for compute_") +
                                     std::to_string(pick) + " (" + nv.GetErrorString(rc) + "): " + log);
  }
  std::size_t n = 0;
  if (nv.GetPTXSize(prog, &n) == cuda::success && n > 0) {
    out.resize(n);
    if (nv.GetPTX(prog, out.data()) != cuda::success) out.clear();
  }
  nv.DestroyProgram(&prog);
  if (out.empty()) return Error(Errc::internal, "NVRTC compiled chorus's histogram kernel but gave no PTX");
  return out; // NUL-terminated, as the driver takes PTX
}

DeviceBuckets::~DeviceBuckets() {
  for (auto& j : all_) {
    // A job whose work has not run (its stream is stuck) keeps its memory,
    // as DeviceCapture's captures do: freeing it would wait for the stream,
    // or let the kernel and the copy write into freed memory.
    if (rt_.EventQuery(j->event) != cuda::success) {
      (void)j.release();
      continue;
    }
    rt_.EventDestroy(j->event);
    rt_.Free(j->scratch);
    rt_.FreeHost(j->pinned);
  }
}

Error DeviceBuckets::load(int device) {
  int major = 0, minor = 0;
  if (int rc = rt_.DeviceGetAttribute(&major, cuda::attr_cc_major, device); rc != cuda::success)
    return {Errc::internal, "cudaDeviceGetAttribute failed: " + rt_.describe(rc)};
  (void)rt_.DeviceGetAttribute(&minor, cuda::attr_cc_minor, device);
  Result<std::string> ptx = device_histogram_ptx(major * 10 + minor);
  if (!ptx) return ptx.error();
  Result<const cuda::Driver*> d = cuda::driver();
  if (!d) return d.error();
  driver_ = *d;
  if (int rc = driver_->LibraryLoadData(&library_, ptx->c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0);
      rc != cuda::success)
    return {Errc::internal,
            "the CUDA driver could not load chorus's histogram kernel: " + driver_->describe(rc) +
                (rc == 222 // CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                     ? ": the NVRTC loaded is newer than the driver; update the NVIDIA driver, or put an NVRTC no "
                       "newer than the driver first on LD_LIBRARY_PATH"
                     : "")};
  if (int rc = driver_->LibraryGetKernel(&kernel_, library_, "chorus_histogram"); rc != cuda::success)
    return {Errc::internal, "the CUDA driver has no chorus_histogram kernel: " + driver_->describe(rc)};
  return {};
}

DeviceHistogramJob* DeviceBuckets::take_free(int device) {
  // Jobs given up on while their work ran go back once it has.
  for (std::size_t i = 0; i < abandoned_.size();) {
    if (rt_.EventQuery(abandoned_[i]->event) != cuda::not_ready) {
      abandoned_[i]->next_free = free_;
      free_ = abandoned_[i];
      abandoned_[i] = abandoned_.back();
      abandoned_.pop_back();
    } else {
      ++i;
    }
  }
  for (DeviceHistogramJob** p = &free_; *p != nullptr; p = &(*p)->next_free)
    if ((*p)->device == device) {
      DeviceHistogramJob* j = *p;
      *p = j->next_free;
      j->next_free = nullptr;
      return j;
    }
  return nullptr;
}

Result<DeviceHistogramJob*> DeviceBuckets::count(const void* values, std::uint64_t n, DeviceDtype dtype, int device,
                                                 cuda::Stream stream) {
  std::lock_guard lock(mu_);
  if (!loaded_) {
    load_error_ = load(device);
    loaded_ = true;
  }
  if (load_error_) return load_error_;
  const auto d = static_cast<std::size_t>(device);
  if (blocks_.size() <= d) blocks_.resize(d + 1, 0);
  if (blocks_[d] == 0) { // the grid that fills this device: 8 blocks a multiprocessor
    int sms = 0;
    (void)rt_.DeviceGetAttribute(&sms, cuda::attr_multiprocessor_count, device);
    blocks_[d] = std::max(sms, 1) * 8;
  }
  DeviceHistogramJob* job = take_free(device);
  if (job == nullptr) {
    auto made = std::make_unique<DeviceHistogramJob>();
    made->device = device;
    void* pinned = nullptr;
    int rc = rt_.Malloc(&made->scratch, bytes);
    if (rc == cuda::success) rc = rt_.HostAlloc(&pinned, bytes, 0);
    made->pinned = static_cast<std::uint32_t*>(pinned);
    if (rc == cuda::success) rc = rt_.EventCreateWithFlags(&made->event, cuda::event_disable_timing);
    if (rc != cuda::success) {
      if (made->scratch) rt_.Free(made->scratch);
      if (made->pinned) rt_.FreeHost(made->pinned);
      return Error(Errc::internal, "could not allocate a device histogram's buffers: " + rt_.describe(rc));
    }
    job = made.get();
    all_.push_back(std::move(made));
  }
  const void* v = values;
  std::uint64_t count = n;
  int type = static_cast<int>(dtype);
  void* out = job->scratch;
  void* args[] = {&v, &count, &type, &out};
  const std::uint64_t wanted = (n + block_threads - 1) / block_threads;
  const auto grid = static_cast<unsigned>(
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(wanted, static_cast<std::uint64_t>(blocks_[d]))));
  std::string failed;
  int rc = rt_.MemsetAsync(job->scratch, 0, bytes, stream);
  if (rc != cuda::success) {
    failed = "cudaMemsetAsync: " + rt_.describe(rc);
  } else if (rc = driver_->LaunchKernel(kernel_, grid, 1, 1, block_threads, 1, 1, 0, stream, args, nullptr);
             rc != cuda::success) {
    failed = "the histogram kernel's launch: " + driver_->describe(rc);
  } else if (rc = rt_.MemcpyAsync(job->pinned, job->scratch, bytes, cuda::device_to_host, stream); rc != cuda::success) {
    failed = "cudaMemcpyAsync: " + rt_.describe(rc);
  } else if (rc = rt_.EventRecord(job->event, stream); rc != cuda::success) {
    failed = "cudaEventRecord: " + rt_.describe(rc);
  }
  if (!failed.empty()) {
    (void)rt_.EventRecord(job->event, stream); // what was issued runs before the job is reused
    abandoned_.push_back(job);
    return Error(Errc::internal, "a device histogram could not be counted (" + failed + ")");
  }
  return job;
}

Result<bool> DeviceBuckets::poll(const DeviceHistogramJob& job) const {
  const int rc = rt_.EventQuery(job.event);
  if (rc == cuda::success) return true;
  if (rc == cuda::not_ready) return false;
  return Error(Errc::internal, "the stream of a device histogram failed before its counts landed: " + rt_.describe(rc) +
                                   " (the histogram is lost; the run goes on)");
}

Histogram DeviceBuckets::take(DeviceHistogramJob& job) {
  std::uint32_t* counts = job.pinned;
  std::uint64_t stats[stats_words];
  std::uint32_t ext[2];
  std::memcpy(stats, counts + core::histogram::dense_keys, sizeof stats);
  std::memcpy(ext, counts + core::histogram::dense_keys + stats_words * 2, sizeof ext);
  const double sum = std::bit_cast<double>(stats[3]);
  return core::histogram::from_dense(counts, stats[0], stats[1], stats[2], sum, from_key(~ext[0]), from_key(ext[1]));
}

void DeviceBuckets::release(DeviceHistogramJob* job) {
  std::lock_guard lock(mu_);
  job->next_free = free_;
  free_ = job;
}

void DeviceBuckets::abandon(DeviceHistogramJob* job) {
  std::lock_guard lock(mu_);
  abandoned_.push_back(job);
}

} // namespace chorus::client
