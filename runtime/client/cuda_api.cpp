#include "runtime/client/cuda_api.hpp"

#include "io/platform/posix.hpp"
#include "runtime/core/immortal.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <type_traits>

#if defined(CHORUS_CHECK_CUDA_DECLS)
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nvrtc.h>
#endif

namespace chorus::client::cuda {

namespace {

/// dlopen of the first library of `names` that loads, trying what the process
/// already has first; `tried` lists what failed and why.
void* open_first(std::initializer_list<const char*> names, std::string& tried) {
  for (const char* n : names)
    if (void* h = ::dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) return h;
  std::string dirs[3];
  int ndirs = 0;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') dirs[ndirs++] = std::string(v).append("/lib64/");
  dirs[ndirs++] = "/usr/local/cuda/lib64/";
  for (const char* n : names) {
    if (void* h = ::dlopen(n, RTLD_NOW | RTLD_LOCAL)) return h;
    if (const char* e = ::dlerror(); tried.empty() && e != nullptr) tried = e;
    for (int i = 0; i < ndirs; ++i)
      if (void* h = ::dlopen(std::string(dirs[i]).append(n).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return nullptr;
}

/// Fills a function pointer from `lib`; 0 (naming it in `missing`) if
/// absent, else 1. A number, so that a table's binds join with `&`: every
/// one is made, none skipped after the first missing.
template <class F>
unsigned bind(void* lib, F& fn, const char* name, std::string& missing) {
  fn = platform::dl_symbol<F>(lib, name);
  if (fn == nullptr && missing.empty()) missing = name;
  return fn != nullptr ? 1u : 0u;
}

struct Loaded {
  std::once_flag once;
  bool ok = false;
  std::string why_not;
};

// Never destroyed: a device call on another thread may ask while the process exits.
core::Immortal<Loaded> loaded[4];
Runtime the_runtime;
Loaded& runtime_state = *loaded[0];
Driver the_driver;
Loaded& driver_state = *loaded[1];
Nvrtc the_nvrtc;
Loaded& nvrtc_state = *loaded[2];
Nccl the_nccl;
Loaded& nccl_state = *loaded[3];

/// Binds the entry points of `lib` into `state` with `bind_all(lib,
/// missing)`; else says why not: `lib` not found (`what`, with what was
/// tried, and `install`), or lacking an entry point (`short_name`, `old`).
template <class BindAll>
void load_from(Loaded& state, void* lib, const std::string& tried, std::string_view what, std::string_view install,
               std::string_view short_name, std::string_view old, BindAll&& bind_all) {
  if (lib == nullptr) {
    state.why_not = std::string(what).append(" could not be loaded (").append(tried).append("): ").append(install);
    return;
  }
  std::string missing;
  if (!bind_all(lib, missing)) {
    state.why_not = std::string(short_name).append(" that was loaded lacks ").append(missing).append(": ").append(old);
    return;
  }
  state.ok = true;
}

void load_runtime() {
  std::string tried;
  void* lib = open_first({"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}, tried);
  load_from(runtime_state, lib, tried, "the CUDA runtime (libcudart.so)",
            "install the CUDA toolkit or put its lib64 directory on LD_LIBRARY_PATH (CUDA_HOME is searched too)",
            "the CUDA runtime", "it is older than CUDA 10; use a CUDA 11 or later runtime",
            [](void* lib, std::string& missing) {
              Runtime& r = the_runtime;
              return bind(lib, r.GetDeviceCount, "cudaGetDeviceCount", missing) &
                     bind(lib, r.GetDevice, "cudaGetDevice", missing) &
                     bind(lib, r.SetDevice, "cudaSetDevice", missing) & bind(lib, r.Malloc, "cudaMalloc", missing) &
                     bind(lib, r.Free, "cudaFree", missing) & bind(lib, r.HostAlloc, "cudaHostAlloc", missing) &
                     bind(lib, r.FreeHost, "cudaFreeHost", missing) & bind(lib, r.Memcpy, "cudaMemcpy", missing) &
                     bind(lib, r.MemcpyAsync, "cudaMemcpyAsync", missing) &
                     bind(lib, r.EventCreateWithFlags, "cudaEventCreateWithFlags", missing) &
                     bind(lib, r.EventRecord, "cudaEventRecord", missing) &
                     bind(lib, r.EventQuery, "cudaEventQuery", missing) &
                     bind(lib, r.EventSynchronize, "cudaEventSynchronize", missing) &
                     bind(lib, r.EventDestroy, "cudaEventDestroy", missing) &
                     bind(lib, r.StreamCreateWithFlags, "cudaStreamCreateWithFlags", missing) &
                     bind(lib, r.StreamDestroy, "cudaStreamDestroy", missing) &
                     bind(lib, r.StreamWaitEvent, "cudaStreamWaitEvent", missing) &
                     bind(lib, r.StreamQuery, "cudaStreamQuery", missing) &
                     bind(lib, r.StreamSynchronize, "cudaStreamSynchronize", missing) &
                     bind(lib, r.LaunchHostFunc, "cudaLaunchHostFunc", missing) &
                     bind(lib, r.PointerGetAttributes, "cudaPointerGetAttributes", missing) &
                     bind(lib, r.MemsetAsync, "cudaMemsetAsync", missing) &
                     bind(lib, r.DeviceGetAttribute, "cudaDeviceGetAttribute", missing) &
                     bind(lib, r.GetErrorName, "cudaGetErrorName", missing) &
                     bind(lib, r.GetErrorString, "cudaGetErrorString", missing);
            });
}

/// The library that holds `probe` where the process has it already (a
/// stand-in preloaded for tests among them), else the first of `names`.
void* open_with(const char* probe, std::initializer_list<const char*> names, std::string& tried) {
  if (::dlsym(RTLD_DEFAULT, probe) != nullptr) return ::dlopen(nullptr, RTLD_NOW); // the global scope's handle
  return open_first(names, tried);
}

void load_driver() {
  std::string tried;
  void* lib = open_with("cuLibraryLoadData", {"libcuda.so.1", "libcuda.so"}, tried);
  load_from(driver_state, lib, tried, "the CUDA driver (libcuda.so.1)", "install the NVIDIA driver", "the CUDA driver",
            "it is older than CUDA 12; update the NVIDIA driver (525 or later)", [](void* lib, std::string& missing) {
              Driver& d = the_driver;
              return bind(lib, d.LibraryLoadData, "cuLibraryLoadData", missing) &
                     bind(lib, d.LibraryGetKernel, "cuLibraryGetKernel", missing) &
                     bind(lib, d.LaunchKernel, "cuLaunchKernel", missing) &
                     bind(lib, d.GetErrorName, "cuGetErrorName", missing) &
                     bind(lib, d.GetErrorString, "cuGetErrorString", missing);
            });
}

void load_nvrtc() {
  std::string tried;
  void* lib = open_with("nvrtcCreateProgram",
                        {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"}, tried);
  load_from(nvrtc_state, lib, tried, "NVRTC (libnvrtc.so), which compiles chorus's device histogram kernel,",
            "install the CUDA toolkit's NVRTC (or the nvidia-cuda-nvrtc wheel) or put its directory on "
            "LD_LIBRARY_PATH (CUDA_HOME is searched too)",
            "the NVRTC", "use the NVRTC of CUDA 11.2 or later", [](void* lib, std::string& missing) {
              Nvrtc& n = the_nvrtc;
              return bind(lib, n.CreateProgram, "nvrtcCreateProgram", missing) &
                     bind(lib, n.CompileProgram, "nvrtcCompileProgram", missing) &
                     bind(lib, n.GetPTXSize, "nvrtcGetPTXSize", missing) & bind(lib, n.GetPTX, "nvrtcGetPTX", missing) &
                     bind(lib, n.GetProgramLogSize, "nvrtcGetProgramLogSize", missing) &
                     bind(lib, n.GetProgramLog, "nvrtcGetProgramLog", missing) &
                     bind(lib, n.DestroyProgram, "nvrtcDestroyProgram", missing) &
                     bind(lib, n.GetErrorString, "nvrtcGetErrorString", missing) &
                     bind(lib, n.GetNumSupportedArchs, "nvrtcGetNumSupportedArchs", missing) &
                     bind(lib, n.GetSupportedArchs, "nvrtcGetSupportedArchs", missing);
            });
}

void load_nccl() {
  std::string tried;
  void* lib = open_first({"libnccl.so.2", "libnccl.so"}, tried);
  if (lib == nullptr) {
    nccl_state.why_not = "NCCL (libnccl.so.2) could not be loaded (" + tried +
                         "): install NCCL or put its directory on LD_LIBRARY_PATH";
    return;
  }
  Nccl& n = the_nccl;
  std::string missing;
  bool ok = bind(lib, n.GetVersion, "ncclGetVersion", missing) & bind(lib, n.GetUniqueId, "ncclGetUniqueId", missing) &
            bind(lib, n.CommInitRankConfig, "ncclCommInitRankConfig", missing) &
            bind(lib, n.CommGetAsyncError, "ncclCommGetAsyncError", missing) &
            bind(lib, n.CommAbort, "ncclCommAbort", missing) & bind(lib, n.CommDestroy, "ncclCommDestroy", missing) &
            bind(lib, n.Reduce, "ncclReduce", missing) & bind(lib, n.AllReduce, "ncclAllReduce", missing) &
            bind(lib, n.GetErrorString, "ncclGetErrorString", missing);
  std::string optional;
  bind(lib, n.CommFinalize, "ncclCommFinalize", optional);
  if (!ok || n.GetVersion(&n.version) != nccl_success || n.version < 21400) {
    nccl_state.why_not = "the NCCL that was loaded (version code " + std::to_string(n.version) + ") is older than 2.14" +
                         (missing.empty() ? std::string() : std::string(" (it lacks ").append(missing).append(")")) +
                         ": chorus needs NCCL 2.14 or later for its non-blocking communicator";
    return;
  }
  nccl_state.ok = true;
}

#if defined(CHORUS_CHECK_CUDA_DECLS)
// Where the toolkit's headers exist, the declarations above must match them.
static_assert(cudaSuccess == success && cudaErrorNotReady == not_ready);
static_assert(cudaMemcpyHostToDevice == host_to_device && cudaMemcpyDeviceToHost == device_to_host &&
              cudaMemcpyDeviceToDevice == device_to_device);
static_assert(cudaEventDisableTiming == event_disable_timing && cudaStreamNonBlocking == stream_non_blocking);
static_assert(sizeof(cudaPointerAttributes) <= sizeof(PointerAttributes) &&
              offsetof(cudaPointerAttributes, device) == offsetof(PointerAttributes, device));
static_assert(cudaMemoryTypeDevice == memory_device && cudaMemoryTypeManaged == memory_managed);
static_assert(cudaDevAttrMultiProcessorCount == attr_multiprocessor_count &&
              cudaDevAttrComputeCapabilityMajor == attr_cc_major && cudaDevAttrComputeCapabilityMinor == attr_cc_minor);
static_assert(CUDA_SUCCESS == success && NVRTC_SUCCESS == success);
// The entry points as the headers declare them, but for the handles (void* here).
static_assert(std::is_same_v<decltype(&cudaMemsetAsync), cudaError_t (*)(void*, int, size_t, cudaStream_t)>);
static_assert(std::is_same_v<decltype(&cuLibraryGetKernel), CUresult (*)(CUkernel*, CUlibrary, const char*)>);
static_assert(std::is_same_v<decltype(&cuLaunchKernel), CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                                                     unsigned, unsigned, unsigned, CUstream, void**,
                                                                     void**)>);
static_assert(std::is_same_v<decltype(&nvrtcCreateProgram), nvrtcResult (*)(nvrtcProgram*, const char*, const char*, int,
                                                                             const char* const*, const char* const*)>);
static_assert(std::is_same_v<decltype(&nvrtcCompileProgram), nvrtcResult (*)(nvrtcProgram, int, const char* const*)>);
static_assert(sizeof(ncclUniqueId) == sizeof(UniqueId) && NCCL_UNIQUE_ID_BYTES == unique_id_bytes);
static_assert(ncclSuccess == nccl_success && ncclInProgress == nccl_in_progress && ncclFloat32 == nccl_float32);
static_assert(int{ncclSum} == nccl_sum && int{ncclMax} == nccl_max && int{ncclMin} == nccl_min && int{ncclAvg} == nccl_avg);
static_assert(offsetof(ncclConfig_t, blocking) == offsetof(NcclConfig, blocking) &&
              offsetof(ncclConfig_t, netName) == offsetof(NcclConfig, net_name) &&
              offsetof(ncclConfig_t, splitShare) == offsetof(NcclConfig, split_share));
#endif

} // namespace

std::string Runtime::describe(int code) const {
  std::string out = GetErrorName ? GetErrorName(code) : "cudaError";
  out.append(" (").append(GetErrorString ? GetErrorString(code) : "?").append(")");
  return out;
}

Result<const Runtime*> runtime() {
  std::call_once(runtime_state.once, load_runtime);
  if (!runtime_state.ok) return Error(Errc::invalid_argument, runtime_state.why_not);
  return &the_runtime;
}

std::string Driver::describe(int code) const {
  const char* name = nullptr;
  const char* what = nullptr;
  if (GetErrorName) GetErrorName(code, &name);
  if (GetErrorString) GetErrorString(code, &what);
  return std::string(name ? name : "CUDA_ERROR " + std::to_string(code)) + " (" + (what ? what : "?") + ")";
}

Result<const Driver*> driver() {
  std::call_once(driver_state.once, load_driver);
  if (!driver_state.ok) return Error(Errc::invalid_argument, driver_state.why_not);
  return &the_driver;
}

Result<const Nvrtc*> nvrtc() {
  std::call_once(nvrtc_state.once, load_nvrtc);
  if (!nvrtc_state.ok) return Error(Errc::invalid_argument, nvrtc_state.why_not);
  return &the_nvrtc;
}

Result<const Nccl*> nccl() {
  std::call_once(nccl_state.once, load_nccl);
  if (!nccl_state.ok) return Error(Errc::invalid_argument, nccl_state.why_not);
  return &the_nccl;
}

} // namespace chorus::client::cuda
