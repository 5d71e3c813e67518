// A CUDA runtime for machines without a GPU: the entry points chorus's
// device path loads (runtime/client/cuda_api.cpp), over host memory, with the
// asynchrony that matters to chorus kept. An asynchronous copy happens only
// when an event recorded after it is found complete, and an event is found
// complete only at its third query, so code that read a copy's destination
// before its event fired, or that did not poll, would see stale values.
//
// Built as a library whose soname is the real runtime's: loaded first
// (LD_PRELOAD), it is the runtime chorus finds already in the process. It
// stands in for the GPU in the tests of the Python package's device path
// (tests/python/test_device_path.py); the `gpu` tests use the real one.
//
// It stands in for the driver's kernel launch and NVRTC too (chorus finds
// their entry points in the process before it loads libcuda or libnvrtc):
// the one kernel chorus launches, its device histogram's, runs here as host
// code with the kernel's rules (runtime/client/device_histogram.cpp), in
// order with the copies.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>

namespace {

/// A copy, a memset or a kernel, run when an event recorded after it is found complete.
using Copy = std::function<void()>;

struct Event {
  std::size_t upto = 0; // copies issued before it was recorded
  int queries_left = 0; // queries that still answer "not ready"
};

std::mutex mu;
std::deque<Copy> pending; // issued, not done
std::size_t issued = 0, done = 0;

void run_copies(std::size_t upto) { // under mu
  while (done < upto && !pending.empty()) {
    const Copy c = pending.front();
    pending.pop_front();
    c();
    ++done;
  }
}

constexpr int success = 0, not_ready = 600, invalid_value = 1;

struct PointerAttributes {
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
  long reserved[8];
};

} // namespace

extern "C" {

/// Tells a test that this runtime, not a real one, is loaded.
int chorus_fake_cudart = 1;

int cudaGetDeviceCount(int* n) {
  *n = 1;
  return success;
}
int cudaGetDevice(int* d) {
  *d = 0;
  return success;
}
int cudaSetDevice(int) { return success; }
int cudaMalloc(void** p, std::size_t n) {
  *p = std::malloc(n);
  return *p ? success : 2;
}
int cudaFree(void* p) {
  std::free(p);
  return success;
}
int cudaHostAlloc(void** p, std::size_t n, unsigned) { return cudaMalloc(p, n); }
int cudaFreeHost(void* p) { return cudaFree(p); }
int cudaMemcpy(void* dst, const void* src, std::size_t n, int) {
  std::lock_guard lock(mu);
  run_copies(issued);
  std::memcpy(dst, src, n);
  return success;
}
int cudaMemcpyAsync(void* dst, const void* src, std::size_t n, int, void*) {
  if (dst == nullptr || src == nullptr) return invalid_value;
  std::lock_guard lock(mu);
  pending.push_back([=] { std::memcpy(dst, src, n); });
  ++issued;
  return success;
}
int cudaMemsetAsync(void* dst, int v, std::size_t n, void*) {
  if (dst == nullptr) return invalid_value;
  std::lock_guard lock(mu);
  pending.push_back([=] { std::memset(dst, v, n); });
  ++issued;
  return success;
}
int cudaDeviceGetAttribute(int* v, int attr, int) {
  *v = attr == 16 ? 4 : attr == 75 ? 9 : 0; // 4 multiprocessors, compute capability 9.0
  return success;
}
int cudaEventCreateWithFlags(void** e, unsigned) {
  *e = new Event;
  return success;
}
int cudaEventRecord(void* e, void*) {
  std::lock_guard lock(mu);
  auto* ev = static_cast<Event*>(e);
  ev->upto = issued;
  ev->queries_left = 2;
  return success;
}
int cudaEventQuery(void* e) {
  std::lock_guard lock(mu);
  auto* ev = static_cast<Event*>(e);
  if (ev->queries_left > 0) {
    --ev->queries_left;
    return not_ready;
  }
  run_copies(ev->upto);
  return success;
}
int cudaEventSynchronize(void* e) {
  std::lock_guard lock(mu);
  auto* ev = static_cast<Event*>(e);
  ev->queries_left = 0;
  run_copies(ev->upto);
  return success;
}
int cudaEventDestroy(void* e) {
  delete static_cast<Event*>(e);
  return success;
}
int cudaStreamCreateWithFlags(void** s, unsigned) {
  *s = new int(0);
  return success;
}
int cudaStreamDestroy(void* s) {
  delete static_cast<int*>(s);
  return success;
}
int cudaStreamWaitEvent(void*, void*, unsigned) { return success; }
int cudaStreamQuery(void*) {
  std::lock_guard lock(mu);
  run_copies(issued);
  return success;
}
int cudaStreamSynchronize(void* s) { return cudaStreamQuery(s); }
int cudaLaunchHostFunc(void* s, void (*fn)(void*), void* arg) {
  cudaStreamSynchronize(s);
  fn(arg);
  return success;
}
int cudaPointerGetAttributes(PointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof *a);
  a->type = 2; // cudaMemoryTypeDevice: every pointer here stands for device memory
  a->device_pointer = const_cast<void*>(p);
  return success;
}
const char* cudaGetErrorName(int e) { return e == success ? "cudaSuccess" : e == not_ready ? "cudaErrorNotReady" : "cudaErrorUnknown"; }
const char* cudaGetErrorString(int e) { return cudaGetErrorName(e); }

// ---- the driver's launch and NVRTC, for the device histogram ---------------

int chorus_fake_kernels = 0; // kernels launched

int cuLibraryLoadData(void** lib, const void* code, void*, void**, unsigned, void*, void**, unsigned) {
  if (code == nullptr || std::strstr(static_cast<const char*>(code), "chorus_histogram") == nullptr) return 218;
  *lib = new int(1);
  return success;
}
int cuLibraryGetKernel(void** kernel, void*, const char* name) {
  if (std::strcmp(name, "chorus_histogram") != 0) return 500; // CUDA_ERROR_NOT_FOUND
  *kernel = new int(2);
  return success;
}
int cuLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void** args,
                   void**) {
  const void* values = *static_cast<const void**>(args[0]);
  const auto n = *static_cast<unsigned long long*>(args[1]);
  const int dtype = *static_cast<int*>(args[2]);
  auto* counts = *static_cast<std::uint32_t**>(args[3]);
  std::lock_guard lock(mu);
  ++chorus_fake_kernels;
  pending.push_back([=] {
    auto* stats = reinterpret_cast<std::uint64_t*>(counts + 65536);
    auto* ext = reinterpret_cast<std::uint32_t*>(stats + 4);
    double sum = 0;
    for (unsigned long long i = 0; i < n; ++i) {
      std::uint32_t u;
      if (dtype == 0) {
        std::memcpy(&u, static_cast<const char*>(values) + i * 4, 4);
      } else {
        std::uint16_t h;
        std::memcpy(&h, static_cast<const char*>(values) + i * 2, 2);
        if (dtype == 2) {
          u = std::uint32_t{h} << 16;
        } else { // IEEE half, widened exactly
          const std::uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
          if (e == 0x1fu)
            u = sign | 0x7f800000u | (m << 13);
          else if (e == 0)
            u = sign | std::bit_cast<std::uint32_t>(static_cast<float>(m) * 5.9604644775390625e-8f);
          else
            u = sign | ((e + 112u) << 23) | (m << 13);
        }
      }
      if (((u >> 23) & 0xffu) == 0xffu) {
        ++stats[(u & 0x7fffffu) ? 0 : (u >> 31) ? 2 : 1];
        continue;
      }
      ++counts[u >> 16];
      sum += static_cast<double>(std::bit_cast<float>(u));
      const std::uint32_t key = (u >> 31) ? ~u : (u | 0x80000000u);
      ext[0] = std::max(ext[0], ~key);
      ext[1] = std::max(ext[1], key);
    }
    double had;
    std::memcpy(&had, &stats[3], 8);
    had += sum;
    std::memcpy(&stats[3], &had, 8);
  });
  ++issued;
  return success;
}
int cuGetErrorName(int e, const char** s) {
  *s = e == success ? "CUDA_SUCCESS" : "CUDA_ERROR_UNKNOWN";
  return success;
}
int cuGetErrorString(int e, const char** s) { return cuGetErrorName(e, s); }

int nvrtcCreateProgram(void** p, const char* src, const char*, int, const char* const*, const char* const*) {
  *p = new const char*(src);
  return success;
}
int nvrtcCompileProgram(void*, int, const char* const*) { return success; }
int nvrtcGetPTXSize(void*, std::size_t* n) {
  *n = sizeof "// stand-in PTX of chorus_histogram";
  return success;
}
int nvrtcGetPTX(void*, char* out) {
  std::strcpy(out, "// stand-in PTX of chorus_histogram");
  return success;
}
int nvrtcGetProgramLogSize(void*, std::size_t* n) {
  *n = 1;
  return success;
}
int nvrtcGetProgramLog(void*, char* out) {
  *out = '\0';
  return success;
}
int nvrtcDestroyProgram(void** p) {
  delete static_cast<const char**>(*p);
  return success;
}
const char* nvrtcGetErrorString(int) { return "NVRTC_ERROR"; }
int nvrtcGetNumSupportedArchs(int* n) {
  *n = 2;
  return success;
}
int nvrtcGetSupportedArchs(int* a) {
  a[0] = 75;
  a[1] = 90;
  return success;
}

} // extern "C"
