#include "runtime/client/device.hpp"

#include <algorithm>
#include <thread>

namespace chorus::client {

namespace {

std::string cuda_call(const cuda::Runtime& rt, const char* what, int rc) {
  return std::string(what).append(" failed: ").append(rt.describe(rc));
}

/// Why copying from `p` failed, in the caller's terms.
std::string explain_pointer(const cuda::Runtime& rt, const float* p, int rc) {
  cuda::PointerAttributes a{};
  if (p == nullptr) return "the value's pointer is null: pass the address of a float in device memory";
  if (rt.PointerGetAttributes(&a, p) == cuda::success && a.type != cuda::memory_device && a.type != cuda::memory_managed)
    return "the value's pointer is not device memory: log_device takes floats that live on the GPU; log host values "
           "with log()";
  return cuda_call(rt, "cudaMemcpyAsync from the value's device pointer", rc) +
         " (a failed kernel earlier on the stream also shows up here)";
}

/// How many values from `i` on sit next to each other in device memory: one
/// copy moves them all (a CUDA call costs microseconds, the bytes nothing).
std::uint32_t adjacent_run(std::span<const float* const> values, std::uint32_t i) {
  std::uint32_t run = 1;
  while (i + run < values.size() && values[i] != nullptr && values[i + run] == values[i] + run) ++run;
  return run;
}

/// NCCL's operation for `op`, or an error naming the fix where it has none.
Result<int> nccl_op_of(Reduce op) {
  switch (op) {
    case Reduce::mean: return cuda::nccl_avg;
    case Reduce::sum: return cuda::nccl_sum;
    case Reduce::min: return cuda::nccl_min;
    case Reduce::max: return cuda::nccl_max;
    case Reduce::first:
      return Error{Errc::invalid_argument,
                   "reduce_device cannot reduce with Reduce::first: NCCL has no such operation. To keep one rank's "
                   "value, log it with log_device on that rank and declare the key with define_metric(key, "
                   "Reduce::first); else use mean, sum, min or max"};
    case Reduce::merge:
      return Error{Errc::invalid_argument,
                   "reduce_device cannot reduce with Reduce::merge: merge is for histograms. Log each rank's "
                   "histogram with log_histogram under a key declared define_metric(key, Reduce::merge); else use "
                   "mean, sum, min or max"};
    case Reduce::none: break;
  }
  return Error{Errc::invalid_argument, "reduce_device needs a reduction: mean, sum, min or max"};
}

} // namespace

Result<std::unique_ptr<DeviceCapture>> DeviceCapture::create() {
  const Result<const cuda::Runtime*> loaded = cuda::runtime();
  if (!loaded) return Error{Errc::invalid_argument, "device logging needs CUDA: " + loaded.error().message()};
  const cuda::Runtime* rt = *loaded;
  int count = 0;
  if (int rc = rt->GetDeviceCount(&count); rc != cuda::success || count == 0)
    return Error{Errc::invalid_argument, "device logging needs a CUDA device, and this process sees none (" +
                                             (rc != cuda::success ? rt->describe(rc) : std::string("0 devices")) +
                                             "): check the driver and CUDA_VISIBLE_DEVICES"};
  return std::unique_ptr<DeviceCapture>(new DeviceCapture(rt));
}

DeviceCapture::~DeviceCapture() {
  for (auto& c : all_) {
    // A capture whose copy has not landed (its stream is stuck) keeps its
    // memory: freeing it would wait for the stream, or let the copy land in
    // freed memory.
    if (rt_->EventQuery(c->event) != cuda::success) {
      (void)c.release();
      continue;
    }
    rt_->EventDestroy(c->event);
    rt_->FreeHost(c->pinned);
  }
}

Result<Capture*> DeviceCapture::capture(std::span<const float* const> values, cuda::Stream stream) {
  const auto n = static_cast<std::uint32_t>(values.size());
  Capture* c = nullptr;
  {
    std::lock_guard lock(mu_);
    // A capture is reused once it is big enough and its last copy has landed.
    for (Capture** link = &free_; *link != nullptr; link = &(*link)->next_free) {
      Capture* f = *link;
      if (f->capacity >= n && (f->landed || rt_->EventQuery(f->event) == cuda::success)) {
        *link = f->next_free;
        c = f;
        break;
      }
    }
  }
  if (c != nullptr) c->landed = false;
  if (c == nullptr) {
    auto fresh = std::make_unique<Capture>();
    fresh->capacity = std::max<std::uint32_t>(n, 16);
    void* mem = nullptr;
    if (int rc = rt_->HostAlloc(&mem, fresh->capacity * sizeof(float), 0); rc != cuda::success) {
      return Error{Errc::internal, cuda_call(*rt_, "cudaHostAlloc of pinned memory for device values", rc)};
    }
    fresh->pinned = static_cast<float*>(mem);
    if (int rc = rt_->EventCreateWithFlags(&fresh->event, cuda::event_disable_timing); rc != cuda::success) {
      rt_->FreeHost(mem);
      return Error{Errc::internal, cuda_call(*rt_, "cudaEventCreateWithFlags", rc)};
    }
    c = fresh.get();
    std::lock_guard lock(mu_);
    all_.push_back(std::move(fresh));
  }
  for (std::uint32_t i = 0; i < n;) {
    const std::uint32_t run = adjacent_run(values, i);
    if (int rc = rt_->MemcpyAsync(c->pinned + i, values[i], run * sizeof(float), cuda::device_to_host, stream);
        rc != cuda::success) {
      Error err{Errc::invalid_argument, explain_pointer(*rt_, values[i], rc)};
      rt_->EventRecord(c->event, stream); // the copies issued so far must land before reuse
      release(c);
      return err;
    }
    i += run;
  }
  if (int rc = rt_->EventRecord(c->event, stream); rc != cuda::success) {
    // Without its event the copies cannot be tracked: keep the capture out of reuse.
    return Error{Errc::invalid_argument, cuda_call(*rt_, "cudaEventRecord on the given stream", rc) +
                                       ": pass the cudaStream_t the values are computed on (or nullptr for the "
                                       "default stream)"};
  }
  c->copied = n;
  return c;
}

Result<bool> DeviceCapture::poll(Capture& c) const {
  const int rc = rt_->EventQuery(c.event);
  if (rc == cuda::success) {
    c.landed = true; // read under mu_ by capture() once release() has put it back
    return true;
  }
  if (rc == cuda::not_ready) return false;
  return Error{Errc::io_error, "the CUDA stream failed before device values could be read (" + rt_->describe(rc) +
                                  "): those values are lost; the error came from the trainer's own GPU work"};
}

void DeviceCapture::release(Capture* c) {
  if (c == nullptr) return;
  std::lock_guard lock(mu_);
  c->next_free = free_;
  free_ = c;
}

// ---- NCCL -----------------------------------------------------------------

DeviceReducer::~DeviceReducer() {
  const cuda::Runtime& rt = capture_.runtime();
  // Abort rather than destroy: a peer that has gone would make a graceful
  // destroy wait for it.
  if (comm_ != nullptr) nccl_->CommAbort(comm_);
  if (stream_ != nullptr) {
    if (rt.StreamQuery(stream_) == cuda::success) {
      rt.Free(staging_);
      rt.Free(result_);
    }
    rt.StreamDestroy(stream_);
  }
  if (values_ready_ != nullptr) rt.EventDestroy(values_ready_);
  if (values_copied_ != nullptr) rt.EventDestroy(values_copied_);
}

Error DeviceReducer::wait_comm(const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + init_timeout_;
  for (;;) {
    int state = cuda::nccl_success;
    if (int rc = nccl_->CommGetAsyncError(comm_, &state); rc != cuda::nccl_success) state = rc;
    if (state == cuda::nccl_success) return {};
    if (state != cuda::nccl_in_progress)
      return {Errc::internal, std::string("NCCL failed ").append(what).append(": ").append(nccl_->GetErrorString(state))};
    if (std::chrono::steady_clock::now() > deadline)
      return {Errc::timeout, std::string("NCCL did not finish ")
                                 .append(what)
                                 .append(" within init_timeout (")
                                 .append(std::to_string(init_timeout_.count()))
                                 .append(" ms): every rank of the run must call reduce_device, with the same keys in "
                                         "the same order, and each rank needs its own GPU")};
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Error DeviceReducer::init(int device) {
  const Result<const cuda::Nccl*> loaded = cuda::nccl();
  if (!loaded) return {Errc::invalid_argument, "reduce_device needs NCCL: " + loaded.error().message()};
  nccl_ = *loaded;
  const cuda::Runtime& rt = capture_.runtime();
  std::vector<char> id(cuda::unique_id_bytes);
  cuda::UniqueId uid{};
  if (rank_ == 0) {
    if (int rc = nccl_->GetUniqueId(&uid); rc != cuda::nccl_success)
      return {Errc::internal, std::string("ncclGetUniqueId failed: ") + nccl_->GetErrorString(rc)};
    std::copy_n(uid.internal, cuda::unique_id_bytes, id.begin());
  }
  if (Error e = exchange_(rank_ == 0, id)) return e;
  if (id.size() != cuda::unique_id_bytes)
    return {Errc::internal, "the run host sent an NCCL id of " + std::to_string(id.size()) + " bytes, not 128"};
  std::copy_n(id.begin(), cuda::unique_id_bytes, uid.internal);

  device_ = device;
  if (int rc = rt.StreamCreateWithFlags(&stream_, cuda::stream_non_blocking); rc != cuda::success)
    return {Errc::internal, cuda_call(rt, "cudaStreamCreateWithFlags", rc)};
  if (int rc = rt.EventCreateWithFlags(&values_ready_, cuda::event_disable_timing); rc != cuda::success)
    return {Errc::internal, cuda_call(rt, "cudaEventCreateWithFlags", rc)};
  if (int rc = rt.EventCreateWithFlags(&values_copied_, cuda::event_disable_timing); rc != cuda::success)
    return {Errc::internal, cuda_call(rt, "cudaEventCreateWithFlags", rc)};

  cuda::NcclConfig config;
  config.blocking = 0; // bounded by wait_comm instead of blocking for ever on a missing rank
  const int rc = nccl_->CommInitRankConfig(&comm_, world_, uid, rank_, &config);
  if (rc != cuda::nccl_success && rc != cuda::nccl_in_progress) {
    comm_ = nullptr;
    return {Errc::internal, std::string("ncclCommInitRankConfig failed: ") + nccl_->GetErrorString(rc)};
  }
  if (Error e = wait_comm("forming the communicator")) {
    nccl_->CommAbort(comm_);
    comm_ = nullptr;
    return e;
  }
  return {};
}

Error DeviceReducer::check(Reduce op) { return nccl_op_of(op).error(); }

Result<Capture*> DeviceReducer::reduce(std::span<const float* const> values, Reduce op, cuda::Stream stream) {
  const Result<int> nccl_op = nccl_op_of(op);
  if (!nccl_op) return nccl_op.error();
  const cuda::Runtime& rt = capture_.runtime();
  int device = 0;
  if (int rc = rt.GetDevice(&device); rc != cuda::success) {
    return Error{Errc::internal, cuda_call(rt, "cudaGetDevice", rc)};
  }
  if (!ready_) {
    if (!init_error_) {
      init_error_ = init(device);
      if (init_error_)
        init_error_ = Error(init_error_.code(), init_error_.message() + " (reduce_device stays off for this run)");
    }
    if (init_error_) return init_error_;
    ready_ = true;
  }
  if (device != device_) {
    return Error{Errc::invalid_argument, "reduce_device called with device " + std::to_string(device) +
                                       " current, but this rank's communicator is on device " +
                                       std::to_string(device_) + ": keep one device per rank"};
  }
  const auto n = static_cast<std::uint32_t>(values.size());
  if (n > capacity_) {
    // Growing waits for chorus's own stream (never the trainer's), once.
    rt.StreamSynchronize(stream_);
    rt.Free(staging_);
    rt.Free(result_);
    staging_ = result_ = nullptr;
    capacity_ = 0;
    void* a = nullptr;
    void* b = nullptr;
    const std::size_t want = std::max<std::size_t>(n, 64);
    if (int rc = rt.Malloc(&a, want * sizeof(float)); rc != cuda::success) {
      return Error{Errc::internal, cuda_call(rt, "cudaMalloc", rc)};
    }
    if (int rc = rt.Malloc(&b, want * sizeof(float)); rc != cuda::success) {
      rt.Free(a);
      return Error{Errc::internal, cuda_call(rt, "cudaMalloc", rc)};
    }
    staging_ = static_cast<float*>(a);
    result_ = static_cast<float*>(b);
    capacity_ = want;
  }
  // chorus's stream starts where the trainer's values are ready; the trainer's
  // stream goes on once chorus has its copy, not after the reduction.
  if (int rc = rt.EventRecord(values_ready_, stream); rc != cuda::success) {
    return Error{Errc::invalid_argument, cuda_call(rt, "cudaEventRecord on the given stream", rc)};
  }
  rt.StreamWaitEvent(stream_, values_ready_, 0);
  for (std::uint32_t i = 0; i < n;) {
    const std::uint32_t run = adjacent_run(values, i);
    if (int rc = rt.MemcpyAsync(staging_ + i, values[i], run * sizeof(float), cuda::device_to_device, stream_);
        rc != cuda::success) {
      return Error{Errc::invalid_argument, explain_pointer(rt, values[i], rc)};
    }
    i += run;
  }
  rt.EventRecord(values_copied_, stream_);
  rt.StreamWaitEvent(stream, values_copied_, 0);

  const int rc = nccl_->Reduce(staging_, result_, n, cuda::nccl_float32, *nccl_op, 0, comm_, stream_);
  if (rc == cuda::nccl_in_progress) {
    if (Error e = wait_comm("enqueueing a reduction")) return e;
  } else if (rc != cuda::nccl_success) {
    return Error{Errc::internal, std::string("ncclReduce failed: ") + nccl_->GetErrorString(rc)};
  }
  if (rank_ != 0) return static_cast<Capture*>(nullptr);
  thread_local std::vector<const float*> results;
  results.resize(n);
  for (std::uint32_t i = 0; i < n; ++i) results[i] = result_ + i; // adjacent: one copy
  return capture_.capture(results, stream_);
}

} // namespace chorus::client
