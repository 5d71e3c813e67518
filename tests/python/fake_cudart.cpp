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
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>

namespace {

struct Copy {
  void* dst;
  const void* src;
  std::size_t n;
};

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
    std::memcpy(c.dst, c.src, c.n);
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
  pending.push_back({dst, src, n});
  ++issued;
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

} // extern "C"
