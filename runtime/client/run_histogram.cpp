// Run::log_histogram and Writer::log_histogram: the histogram is built on
// the calling thread and travels, whole, in one ring slot.
#include "runtime/client/run_impl.hpp"
#include "runtime/core/wire.hpp"

#include <memory>
#include <new>

namespace chorus {
namespace detail {

Pending RunImpl::log_histogram(std::uint32_t stream, bool writer, std::string_view key, std::unique_ptr<Histogram> h,
                               const LogOptions& opts, bool same_step) noexcept {
  if (closed_.load(std::memory_order_relaxed)) {
    note_after_finish("log_histogram");
    return refuse({Errc::finished, "log_histogram after finish: this run has finished and takes no more values; "
                                   "log before calling finish()"});
  }
  try {
    if (writer && stream == 0) return refuse_no_stream("this writer");
    auto note = [&](const Error& why) {
      const RefusedValue v{std::string(key.substr(0, 256)),
                           h ? "{\"histogram\":{\"count\":" + std::to_string(h->count()) + "}}" : std::string()};
      (void)refuse_values(opts.step, why, std::span(&v, 1), 1, Room::force);
      return refuse(why);
    };
    if (!h) return refuse({Errc::internal, "out of memory while bucketing the histogram"});
    if (opts.step && *opts.step < 0)
      return note({Errc::invalid_argument, "step " + std::to_string(*opts.step) + " is negative: steps start at 0"});
    const std::uint32_t id = KeyTable::instance().intern_metric(key);
    if (id == KeyTable::invalid) return note(validate_metric_key(key));
    std::uint64_t pos;
    if (!reserve(1, pos, Room::configured))
      return channel_.failed() ? host_gone() : Pending(&channel_, immediate_bit, false);
    if (!writer || opts.step) note_step(opts.step);
    Slot& s = ring_.at(pos);
    s.kind = SlotKind::histogram;
    s.key = id;
    s.count = static_cast<std::uint16_t>(stream);
    s.step = opts.step ? *opts.step : same_step ? wire::same_step : wire::auto_step;
    s.histogram = h.release(); // the RankProxy frees it
    Ring::publish(s, pos);
    channel_.wake();
    return Pending(&channel_, pos + 1, false);
  } catch (const std::bad_alloc&) {
    return refuse({Errc::internal, "out of memory while logging a histogram"});
  }
}

namespace {
template <class Values>
std::unique_ptr<Histogram> bucketed(Values values) noexcept {
  try {
    return std::make_unique<Histogram>(values);
  } catch (...) {
    return nullptr;
  }
}
std::unique_ptr<Histogram> copied(const Histogram& h) noexcept {
  try {
    return std::make_unique<Histogram>(h);
  } catch (...) {
    return nullptr;
  }
}
} // namespace

} // namespace detail

Pending Run::log_histogram(std::string_view key, std::span<const double> values, const LogOptions& opts) noexcept {
  auto* impl = detail::live(impl_);
  return impl ? impl->log_histogram(0, false, key, detail::bucketed(values), opts) : Pending{};
}
Pending Run::log_histogram(std::string_view key, std::span<const float> values, const LogOptions& opts) noexcept {
  auto* impl = detail::live(impl_);
  return impl ? impl->log_histogram(0, false, key, detail::bucketed(values), opts) : Pending{};
}
Pending Run::log_histogram(std::string_view key, const Histogram& histogram, const LogOptions& opts) noexcept {
  auto* impl = detail::live(impl_);
  return impl ? impl->log_histogram(0, false, key, detail::copied(histogram), opts) : Pending{};
}
Pending Writer::log_histogram(std::string_view key, std::span<const double> values, const LogOptions& opts) noexcept {
  auto* impl = detail::live(impl_);
  return impl ? impl->log_histogram(id_, true, key, detail::bucketed(values), opts) : Pending{};
}
Pending Writer::log_histogram(std::string_view key, std::span<const float> values, const LogOptions& opts) noexcept {
  auto* impl = detail::live(impl_);
  return impl ? impl->log_histogram(id_, true, key, detail::bucketed(values), opts) : Pending{};
}
Pending Writer::log_histogram(std::string_view key, const Histogram& histogram, const LogOptions& opts) noexcept {
  auto* impl = detail::live(impl_);
  return impl ? impl->log_histogram(id_, true, key, detail::copied(histogram), opts) : Pending{};
}

} // namespace chorus
