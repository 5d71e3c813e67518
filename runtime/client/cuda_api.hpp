// The CUDA runtime and NCCL, loaded with dlopen when first needed, so that
// chorus builds and runs on machines without either: a trainer that never
// logs device values never loads them, and one that does gets an error that
// names what is missing. Only the few entry points chorus uses are declared;
// where the toolkit's headers exist at build time, cuda_api.cpp checks these
// declarations against them.
#pragma once

#include "runtime/core/result.hpp"

#include <cstddef>
#include <string>

namespace chorus::client::cuda {

using Stream = void*; // cudaStream_t
using Event = void*;  // cudaEvent_t

inline constexpr int success = 0;        // cudaSuccess
inline constexpr int not_ready = 600;    // cudaErrorNotReady
inline constexpr int host_to_device = 1; // cudaMemcpyKind
inline constexpr int device_to_host = 2;
inline constexpr int device_to_device = 3;
inline constexpr unsigned event_disable_timing = 0x02;
inline constexpr unsigned stream_non_blocking = 0x01;

/// cudaPointerAttributes (CUDA 11 and later; CUDA 13 added the reserved
/// words, and an older runtime writes less).
struct PointerAttributes {
  int type; // cudaMemoryType
  int device;
  void* device_pointer;
  void* host_pointer;
  long reserved[8];
};
inline constexpr int memory_device = 2;  // cudaMemoryTypeDevice
inline constexpr int memory_managed = 3; // cudaMemoryTypeManaged
inline constexpr int attr_multiprocessor_count = 16; // cudaDevAttrMultiProcessorCount
inline constexpr int attr_cc_major = 75;             // cudaDevAttrComputeCapabilityMajor
inline constexpr int attr_cc_minor = 76;             // cudaDevAttrComputeCapabilityMinor

/// The CUDA runtime's entry points (cudaXxx without the prefix).
struct Runtime {
  int (*GetDeviceCount)(int*);
  int (*GetDevice)(int*);
  int (*SetDevice)(int);
  int (*Malloc)(void**, std::size_t);
  int (*Free)(void*);
  int (*HostAlloc)(void**, std::size_t, unsigned);
  int (*FreeHost)(void*);
  int (*Memcpy)(void*, const void*, std::size_t, int);
  int (*MemcpyAsync)(void*, const void*, std::size_t, int, Stream);
  int (*EventCreateWithFlags)(Event*, unsigned);
  int (*EventRecord)(Event, Stream);
  int (*EventQuery)(Event);
  int (*EventSynchronize)(Event);
  int (*EventDestroy)(Event);
  int (*StreamCreateWithFlags)(Stream*, unsigned);
  int (*StreamDestroy)(Stream);
  int (*StreamWaitEvent)(Stream, Event, unsigned);
  int (*StreamQuery)(Stream);
  int (*StreamSynchronize)(Stream);
  int (*LaunchHostFunc)(Stream, void (*)(void*), void*);
  int (*PointerGetAttributes)(PointerAttributes*, const void*);
  int (*MemsetAsync)(void*, int, std::size_t, Stream);
  int (*DeviceGetAttribute)(int*, int, int);
  const char* (*GetErrorName)(int);
  const char* (*GetErrorString)(int);

  /// "cudaErrorInvalidValue (invalid argument)"
  [[nodiscard]] std::string describe(int code) const;
};

/// The loaded runtime, or an error saying what is missing and how to fix
/// it. Loaded once per process; later calls are one atomic load. A runtime
/// the process has already loaded (the trainer's own) is preferred.
[[nodiscard]] Result<const Runtime*> runtime();

// ---- The driver's kernel launch, and NVRTC ---------------------------------
// chorus's own kernels (the device histogram's) are compiled from source by
// NVRTC to PTX once per process, loaded as a context-independent library
// and launched on the caller's stream: the driver API of CUDA 12.

using Library = void*; // CUlibrary
using Kernel = void*;  // CUkernel (cuLaunchKernel takes one as its CUfunction)

struct Driver {
  int (*LibraryLoadData)(Library*, const void*, void*, void**, unsigned, void*, void**, unsigned);
  int (*LibraryGetKernel)(Kernel*, Library, const char*);
  int (*LaunchKernel)(Kernel, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, Stream, void**,
                      void**);
  int (*GetErrorName)(int, const char**);
  int (*GetErrorString)(int, const char**);

  /// "CUDA_ERROR_INVALID_PTX (a PTX JIT compilation failed)"
  [[nodiscard]] std::string describe(int code) const;
};

/// The CUDA driver's entry points (libcuda.so.1, CUDA 12 or later), or an
/// error saying what is missing.
[[nodiscard]] Result<const Driver*> driver();

using Program = void*; // nvrtcProgram

struct Nvrtc {
  int (*CreateProgram)(Program*, const char*, const char*, int, const char* const*, const char* const*);
  int (*CompileProgram)(Program, int, const char* const*);
  int (*GetPTXSize)(Program, std::size_t*);
  int (*GetPTX)(Program, char*);
  int (*GetProgramLogSize)(Program, std::size_t*);
  int (*GetProgramLog)(Program, char*);
  int (*DestroyProgram)(Program*);
  const char* (*GetErrorString)(int);
  int (*GetNumSupportedArchs)(int*);
  int (*GetSupportedArchs)(int*);
};

/// NVRTC (libnvrtc.so, CUDA 11.2 or later), or an error saying what is
/// missing and how to fix it.
[[nodiscard]] Result<const Nvrtc*> nvrtc();

// ---- NCCL -----------------------------------------------------------------

inline constexpr std::size_t unique_id_bytes = 128;
struct UniqueId {
  char internal[unique_id_bytes];
};
using Comm = void*; // ncclComm_t

inline constexpr int nccl_success = 0;
inline constexpr int nccl_in_progress = 7;
inline constexpr int nccl_float32 = 7;
enum NcclOp : int { nccl_sum = 0, nccl_prod = 1, nccl_max = 2, nccl_min = 3, nccl_avg = 4 };

/// ncclConfig_t as NCCL 2.14 laid it out; NCCL reads a config by its size and
/// version, so later releases accept it.
struct NcclConfig {
  std::size_t size = sizeof(NcclConfig);
  unsigned magic = 0xcafebeef;
  unsigned version = 21400;
  int blocking = -2147483648;
  int cga_cluster_size = -2147483648;
  int min_ctas = -2147483648;
  int max_ctas = -2147483648;
  const char* net_name = nullptr;
  int split_share = -2147483648;
};

struct Nccl {
  int (*GetVersion)(int*);
  int (*GetUniqueId)(UniqueId*);
  int (*CommInitRankConfig)(Comm*, int, UniqueId, int, NcclConfig*);
  int (*CommGetAsyncError)(Comm, int*);
  int (*CommAbort)(Comm);
  int (*CommDestroy)(Comm);
  int (*CommFinalize)(Comm); // may be null (NCCL before 2.14)
  int (*Reduce)(const void*, void*, std::size_t, int, int, int, Comm, Stream);
  int (*AllReduce)(const void*, void*, std::size_t, int, int, Comm, Stream);
  const char* (*GetErrorString)(int);

  int version = 0; // 22809 for 2.28.9
};

/// NCCL (2.14 or later: chorus needs its non-blocking communicators), or
/// an error saying what is missing.
[[nodiscard]] Result<const Nccl*> nccl();

} // namespace chorus::client::cuda
