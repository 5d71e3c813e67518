// Run::log_device and Run::reduce_device: the trainer-side half of the GPU
// path (see device.hpp). Slower than log() by design — a few CUDA calls per
// value — but never a host sync.
#include "runtime/client/run_impl.hpp"
#include "runtime/client/system.hpp"
#include "runtime/core/wire.hpp"

#include <vector>

namespace chorus {
namespace client {

Error RunImpl::make_device() {
  if (!device_ && !device_error_) {
    Result<std::unique_ptr<DeviceCapture>> made = DeviceCapture::create();
    if (made) device_ = std::move(*made);
    device_error_ = made.error();
    device_ptr_.store(device_.get(), std::memory_order_release);
  }
  return device_error_;
}

Pending RunImpl::log_device(std::span<const DeviceMetric> values, CudaStream stream, const LogOptions& opts,
                            std::optional<Reduce> reduce, std::span<const Metric> host) noexcept {
  const char* call = reduce ? "reduce_device" : "log_device";
  try {
    if (closed_.load(std::memory_order_relaxed))
      return refuse({Errc::finished, std::string(call) + " after finish: this run has finished and takes no more "
                                                         "values; log before calling finish()"});
    const std::size_t n = values.size();
    if (n == 0) return {};
    if (reduce && !host.empty())
      return refuse({Errc::internal, "reduce_device takes device values only"});
    if (n + host.size() > max_values_per_call || n + host.size() > ring_.capacity())
      return refuse({Errc::invalid_argument, std::string(call) + " of " + std::to_string(n + host.size()) +
                                                 " values in one call: split the call or raise "
                                                 "Options::queue_capacity"});
    if (opts.step && *opts.step < 0)
      return refuse({Errc::invalid_argument, "step " + std::to_string(*opts.step) + " is negative: steps start at 0"});
    if (reduce)
      if (Error e = DeviceReducer::check(*reduce)) return refuse(std::move(e));

    thread_local std::vector<std::uint32_t> ids;
    thread_local std::vector<const float*> ptrs;
    thread_local std::vector<Metric> beside; // the host values with good keys
    ids.resize(n);
    ptrs.resize(n);
    auto& keys = KeyTable::instance();
    for (std::size_t i = 0; i < n; ++i) {
      ids[i] = keys.intern_metric(values[i].key);
      // All or nothing: reduce_device is a collective, so every rank must
      // refuse the same call.
      if (ids[i] == KeyTable::invalid) {
        Error e = validate_metric_key(values[i].key);
        return refuse({e.code(), e.message() + " (nothing of this " + call + " call was logged)"});
      }
      ptrs[i] = values[i].value;
    }
    // Host values beside them take the slots after the device values.
    beside.clear();
    std::size_t first_bad = host.size();
    for (std::size_t i = 0; i < host.size(); ++i) {
      const std::uint32_t id = keys.intern_metric(host[i].key);
      if (id == KeyTable::invalid) {
        if (first_bad == host.size()) first_bad = i;
        continue;
      }
      ids.push_back(id);
      beside.push_back(host[i]);
    }
    const std::size_t total = ids.size();

    std::lock_guard lock(device_mu_);
    if (Error e = make_device()) return refuse(std::move(e));

    const std::int64_t step = opts.step ? *opts.step : core::wire::auto_step;
    Capture* captured = nullptr;
    if (reduce) {
      if (!reducer_)
        reducer_ = std::make_unique<DeviceReducer>(
            *device_, settings_.run_rank, settings_.run_world, settings_.opts.init_timeout,
            [this](bool provide, std::vector<char>& id) { return system_->exchange_nccl_id(provide, id); });
      Result<Capture*> reduced = reducer_->reduce(ptrs, *reduce, stream);
      if (!reduced) return refuse(std::move(reduced).error());
      captured = *reduced;
      if (captured == nullptr) {
        // Off the run host nothing comes back to this rank: it only moves its
        // step, so that automatic steps stay in line with the host's.
        note_step(opts.step);
        return push_control(SlotKind::step_mark, [&](Slot& s) { s.step = step; });
      }
      // Only the run host logs the result: undeclared, it would be the column
      // key/rank-0. Declared first, it is `key`, as the reduction it is.
      for (std::size_t i = 0; i < n; ++i)
        if (device_declared_.insert(ids[i]).second)
          (void)push_control(SlotKind::define, [&](Slot& s) {
            s.key = ids[i];
            s.reduce = Reduce::first;
          });
    } else {
      Result<Capture*> copied = device_->capture(ptrs, stream);
      if (!copied) return refuse(std::move(copied).error());
      captured = *copied;
    }

    std::uint64_t pos;
    if (!reserve(static_cast<std::uint32_t>(total), pos, Room::configured)) {
      device_->release(captured);
      return channel_.failed() ? host_gone() : Pending(&channel_, immediate_bit, false);
    }
    note_step(opts.step);
    // Value slots first, the head last: the RankProxy reads a call once its
    // last slot is published, and a head always names its capture.
    for (std::size_t j = total; j-- > 0;) {
      Slot& s = ring_.at(pos + j);
      s.key = ids[j];
      s.kind = j == 0 ? SlotKind::device_head : SlotKind::value;
      s.count = static_cast<std::uint16_t>(total);
      s.step = step;
      if (j == 0)
        s.capture = captured;
      else
        s.value = j < n ? 0 : beside[j - n].value;
      ring_.publish(s, pos + j, j == 0 ? clock_.now() : 0);
    }
    channel_.wake();
    const std::uint64_t seq = pos + total;
    if (first_bad != host.size()) {
      channel_.set_error(seq, partly_logged(host[first_bad].key, total));
      return Pending(&channel_, seq, true);
    }
    return Pending(&channel_, seq, false);
  } catch (const std::bad_alloc&) {
    return refuse({Errc::internal, "out of memory"});
  }
}

} // namespace client

Pending Run::log_device(std::span<const DeviceMetric> values, CudaStream stream, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_device(values, stream, opts, std::nullopt) : Pending{};
}
Pending Run::reduce_device(std::span<const DeviceMetric> values, Reduce op, CudaStream stream,
                           const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_device(values, stream, opts, op) : Pending{};
}

} // namespace chorus
