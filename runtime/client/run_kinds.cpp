// The kinds of value beyond scalars: histograms (built on the calling
// thread), images, text and tables (a MediaJob: pixels are encoded to PNG on
// the Run's MediaEncoder thread). Each call travels whole in one ring slot,
// in order with the rank's other calls.
#include "runtime/client/device.hpp"
#include "runtime/client/media_encoder.hpp"
#include "runtime/client/run_impl.hpp"
#include "runtime/core/json.hpp"
#include "runtime/core/wire.hpp"

#include <cmath>
#include <memory>
#include <new>

namespace chorus {
namespace client {

Pending RunImpl::refuse_kind(std::string_view key, const LogOptions& opts, const Error& why,
                             std::string refused_json) noexcept {
  try {
    const RefusedValue v{std::string(key.substr(0, 256)), std::move(refused_json)};
    (void)refuse_values(opts.step, why, std::span(&v, 1), 1, Room::force);
  } catch (...) {
    // Out of memory: the ticket still says why.
  }
  return refuse(why);
}

template <class Describe, class Fill>
Pending RunImpl::push_kind(SlotKind kind, std::uint32_t stream, bool writer, std::string_view key,
                           const LogOptions& opts, bool same_step, Describe&& refused_json, Fill&& fill) noexcept {
  const char* call = kind == SlotKind::media ? "log_media" : "log_histogram";
  if (closed_.load(std::memory_order_relaxed)) {
    note_after_finish(call);
    return refuse({Errc::finished, std::string(call) + " after finish: this run has finished and takes no more "
                                                       "values; log before calling finish()"});
  }
  try {
    if (writer && stream == 0) return refuse_no_stream("this writer");
    auto note = [&](const Error& why) { return refuse_kind(key, opts, why, refused_json()); };
    if (opts.step && *opts.step < 0)
      return note({Errc::invalid_argument, "step " + std::to_string(*opts.step) + " is negative: steps start at 0"});
    const std::uint32_t id = KeyTable::instance().intern_metric(key);
    if (id == KeyTable::invalid) return note(validate_metric_key(key));
    std::uint64_t pos;
    if (!reserve(1, pos, Room::configured))
      return channel_.failed() ? host_gone() : Pending(&channel_, immediate_bit, false);
    if (!writer || opts.step) note_step(opts.step);
    Slot& s = ring_.at(pos);
    s.kind = kind;
    s.key = id;
    s.count = static_cast<std::uint16_t>(stream);
    s.step = opts.step ? *opts.step : same_step ? core::wire::same_step : core::wire::auto_step;
    fill(s); // the slot takes what it carries; the RankProxy frees it
    ring_.publish(s, pos, clock_.now());
    channel_.wake();
    return Pending(&channel_, pos + 1, false);
  } catch (const std::bad_alloc&) {
    return refuse({Errc::internal, std::string("out of memory in ") + call});
  }
}

Pending RunImpl::log_histogram(std::uint32_t stream, bool writer, std::string_view key, std::unique_ptr<Histogram> h,
                               const LogOptions& opts, bool same_step) noexcept {
  if (!h) return refuse({Errc::internal, "out of memory while bucketing the histogram"});
  return push_kind(
      SlotKind::histogram, stream, writer, key, opts, same_step,
      [&] { return "{\"histogram\":{\"count\":" + std::to_string(h->count()) + "}}"; },
      [&](Slot& s) { s.histogram = h.release(); });
}

Pending RunImpl::log_histogram_device(std::uint32_t stream, bool writer, std::string_view key, const void* values,
                                      std::size_t n, DeviceDtype dtype, CudaStream cuda_stream, const LogOptions& opts,
                                      bool same_step) noexcept {
  if (n == 0) return log_histogram(stream, writer, key, std::make_unique<Histogram>(), opts, same_step);
  const auto refused_json = [&] {
    return "{\"histogram\":{\"count\":" + std::to_string(n) + ",\"on_gpu\":true}}";
  };
  bool launched = false;
  DeviceHistogramJob* job = nullptr;
  const auto fill = [&](Slot& s) {
    s.device_histogram = job;
    launched = false; // the slot has it
  };
  // What push_kind refuses (after finish, a negative step, a bad key) is
  // refused before the GPU counts anything.
  if (closed_.load(std::memory_order_relaxed) || (opts.step && *opts.step < 0) ||
      KeyTable::instance().intern_metric(key) == KeyTable::invalid || (writer && stream == 0))
    return push_kind(SlotKind::device_histogram, stream, writer, key, opts, same_step, refused_json, fill);
  try {
    auto refuse_here = [&](Error e) { return refuse_kind(key, opts, e, refused_json()); };
    if (static_cast<unsigned>(dtype) > static_cast<unsigned>(DeviceDtype::bfloat16))
      return refuse_here({Errc::invalid_argument, "log_histogram's dtype " + std::to_string(static_cast<int>(dtype)) +
                                                      " is none of DeviceDtype's: float32, float16 or bfloat16"});
    if (n > std::uint64_t{0xffffffffu})
      return refuse_here({Errc::invalid_argument, "log_histogram of " + std::to_string(n) +
                                                      " device values in one call: the GPU counts at most 2^32 - 1 a "
                                                      "call; merge the histograms of parts under one key instead"});
    if (values == nullptr)
      return refuse_here({Errc::invalid_argument,
                          "log_histogram's device pointer is null: pass the address of the values in GPU memory"});
    DeviceCapture* device = nullptr;
    {
      std::lock_guard lock(device_mu_);
      if (Error e = make_device()) return refuse_here(std::move(e));
      device = device_.get();
    }
    const cuda::Runtime& rt = device->runtime();
    cuda::PointerAttributes a{};
    int current = -1;
    if (rt.PointerGetAttributes(&a, values) != cuda::success ||
        (a.type != cuda::memory_device && a.type != cuda::memory_managed))
      return refuse_here({Errc::invalid_argument,
                          "log_histogram's device pointer is not GPU memory: pass the values on the GPU, or log host "
                          "values with log_histogram(key, std::span<const float>)"});
    // The kernel runs on the values' device; the thread's current device is
    // left as it was.
    const bool elsewhere = rt.GetDevice(&current) == cuda::success && a.type == cuda::memory_device && a.device != current;
    if (elsewhere) (void)rt.SetDevice(a.device);
    Result<DeviceHistogramJob*> counted =
        device->buckets().count(values, n, dtype, a.type == cuda::memory_device ? a.device : std::max(current, 0),
                                static_cast<cuda::Stream>(cuda_stream));
    if (elsewhere) (void)rt.SetDevice(current);
    if (!counted) return refuse_here(counted.error());
    job = *counted;
    launched = true;
  } catch (const std::bad_alloc&) {
    return refuse({Errc::internal, "out of memory in log_histogram"});
  }
  Pending p = push_kind(SlotKind::device_histogram, stream, writer, key, opts, same_step, refused_json, fill);
  if (launched) device_ptr_.load(std::memory_order_acquire)->buckets().abandon(job); // refused: pooled once it ran
  return p;
}

Pending RunImpl::log_media(std::uint32_t stream, bool writer, std::string_view key, std::unique_ptr<MediaJob> job,
                           const LogOptions& opts, bool same_step) noexcept {
  if (!job) return refuse({Errc::internal, "out of memory while taking an image, text or table"});
  const std::string_view kind = to_string(job->media.kind);
  if (job->state.load(std::memory_order_relaxed) == MediaJob::failed) { // refused on this thread: only the refusal goes
    try {
      return refuse_kind(key, opts, job->error, "{\"" + std::string(kind) + "\":{\"error\":true}}");
    } catch (...) {
      return refuse(job->error);
    }
  }
  MediaJob* pending_encode = job->state.load(std::memory_order_relaxed) == MediaJob::pending ? job.get() : nullptr;
  Pending p = push_kind(
      SlotKind::media, stream, writer, key, opts, same_step, [&] { return "{\"" + std::string(kind) + "\":{}}"; },
      [&](Slot& s) { s.media = job.release(); });
  if (pending_encode != nullptr && job == nullptr) media_encoder().push(pending_encode);
  return p;
}

MediaEncoder& RunImpl::media_encoder() {
  std::lock_guard lock(media_mu_);
  if (!media_encoder_) media_encoder_ = std::make_unique<MediaEncoder>(channel_);
  return *media_encoder_;
}

namespace {

/// A table as JSON: {"columns": [...], "data": [[...], ...]}, or why it is refused.
Error table_json(std::span<const std::string> columns, std::span<const std::vector<Value>> rows, std::vector<char>& out) {
  if (columns.empty()) return {Errc::invalid_argument, "a table needs at least one column: name its columns"};
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].size() != columns.size())
      return {Errc::invalid_argument, "row " + std::to_string(i) + " of the table has " +
                                          std::to_string(rows[i].size()) + " cells, but the table has " +
                                          std::to_string(columns.size()) + " columns: give every row one cell a column"};
  std::string json;
  core::JsonWriter w(json);
  w.begin_object().key("columns").begin_array();
  for (const std::string& c : columns) w.string(c);
  w.end_array().key("data").begin_array();
  for (const std::vector<Value>& row : rows) {
    w.begin_array();
    for (const Value& v : row) w.value(v);
    w.end_array();
    if (json.size() > core::max_media_bytes) break;
  }
  w.end_array().end_object();
  if (json.size() > core::max_media_bytes)
    return {Errc::invalid_argument, "the table is over the 64 MiB chorus takes as one value: split it, or log it "
                                    "as an artifact (log_artifact)"};
  out.assign(json.begin(), json.end());
  return {};
}

} // namespace

std::unique_ptr<MediaJob> image_job(const Image& image) noexcept {
  try {
    auto job = std::make_unique<MediaJob>();
    job->media.kind = core::MediaKind::image;
    auto fail = [&](Error e) {
      job->error = std::move(e);
      job->state.store(MediaJob::failed, std::memory_order_relaxed);
      return std::move(job);
    };
    if (image.caption().size() > core::max_caption_bytes || !core::valid_utf8(image.caption()))
      return fail({Errc::invalid_argument, "an image's caption is UTF-8 of at most 4096 bytes"});
    job->media.caption = image.caption();
    const std::size_t sources = !image.u8().empty() + !image.f32().empty() + !image.file_bytes().empty();
    if (sources == 0) return fail({Errc::invalid_argument, "the image is empty: pass its pixels or a PNG or JPEG file's bytes"});
    if (!image.file_bytes().empty()) {
      const auto bytes = image.file_bytes();
      if (bytes.size() > core::max_media_bytes)
        return fail({Errc::invalid_argument, "the image file is " + std::to_string(bytes.size() >> 20) +
                                                 " MiB, over the 64 MiB chorus takes: scale it down"});
      core::media::ImageHeader header;
      if (Error e = core::media::image_header(bytes, header)) return fail(std::move(e));
      job->media.format = header.format;
      job->media.width = header.width;
      job->media.height = header.height;
      job->media.data.assign(bytes.begin(), bytes.end());
      job->state.store(MediaJob::ready, std::memory_order_relaxed);
      return job;
    }
    const int h = image.height(), w = image.width(), c = image.channels();
    if (c != 1 && c != 3 && c != 4)
      return fail({Errc::invalid_argument, "an image has 1 (grey), 3 (RGB) or 4 (RGBA) channels, not " + std::to_string(c) +
                                               ": pixels are height x width x channels (HWC)"});
    if (h <= 0 || w <= 0)
      return fail({Errc::invalid_argument, "the image is empty (" + std::to_string(h) + " x " + std::to_string(w) +
                                               " pixels): log an image with pixels"});
    if (h > core::max_image_side || w > core::max_image_side)
      return fail({Errc::invalid_argument, "the image is " + std::to_string(h) + " x " + std::to_string(w) +
                                               " pixels, over the 16384 a side chorus takes: scale it down"});
    const std::size_t n = static_cast<std::size_t>(h) * static_cast<std::size_t>(w) * static_cast<std::size_t>(c);
    const std::size_t given = image.u8().empty() ? image.f32().size() : image.u8().size();
    if (given != n)
      return fail({Errc::invalid_argument, "the pixels hold " + std::to_string(given) + " values, but a " +
                                               std::to_string(h) + " x " + std::to_string(w) + " x " + std::to_string(c) +
                                               " image (height x width x channels, HWC) needs " + std::to_string(n)});
    job->pixels.resize(n);
    if (!image.u8().empty()) {
      std::memcpy(job->pixels.data(), image.u8().data(), n);
    } else {
      const float* f = image.f32().data();
      for (std::size_t i = 0; i < n; ++i) {
        const float v = std::isnan(f[i]) ? 0.0f : std::clamp(f[i], 0.0f, 1.0f);
        job->pixels[i] = static_cast<std::uint8_t>(std::lround(v * 255.0f));
      }
    }
    job->height = h;
    job->width = w;
    job->channels = c;
    job->media.format = "png";
    job->media.width = static_cast<std::uint32_t>(w);
    job->media.height = static_cast<std::uint32_t>(h);
    job->media.channels = static_cast<std::uint8_t>(c);
    return job; // pending: the encoder makes its PNG
  } catch (...) {
    return nullptr;
  }
}

std::unique_ptr<MediaJob> text_job(std::string_view text) noexcept {
  try {
    auto job = std::make_unique<MediaJob>();
    job->media.kind = core::MediaKind::text;
    job->media.format = "md";
    Error e;
    if (text.size() > core::max_media_bytes)
      e = Error(Errc::invalid_argument, "the text is over the 64 MiB chorus takes as one value: split it");
    else if (!core::valid_utf8(text))
      e = Error(Errc::invalid_argument, "the text is not valid UTF-8: log UTF-8 text (markdown)");
    if (e) {
      job->error = std::move(e);
      job->state.store(MediaJob::failed, std::memory_order_relaxed);
      return job;
    }
    job->media.data.assign(text.begin(), text.end());
    job->state.store(MediaJob::ready, std::memory_order_relaxed);
    return job;
  } catch (...) {
    return nullptr;
  }
}

std::unique_ptr<MediaJob> table_job(std::span<const std::string> columns, std::span<const std::vector<Value>> rows) noexcept {
  try {
    auto job = std::make_unique<MediaJob>();
    job->media.kind = core::MediaKind::table;
    job->media.format = "json";
    if (Error e = table_json(columns, rows, job->media.data)) {
      job->error = std::move(e);
      job->state.store(MediaJob::failed, std::memory_order_relaxed);
    } else {
      job->state.store(MediaJob::ready, std::memory_order_relaxed);
    }
    return job;
  } catch (...) {
    return nullptr;
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

} // namespace client

Pending Run::log_image(std::string_view key, const Image& image, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_media(0, false, key, client::image_job(image), opts) : Pending{};
}
Pending Run::log_text(std::string_view key, std::string_view text, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_media(0, false, key, client::text_job(text), opts) : Pending{};
}
Pending Run::log_table(std::string_view key, std::span<const std::string> columns,
                       std::span<const std::vector<Value>> rows, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_media(0, false, key, client::table_job(columns, rows), opts) : Pending{};
}
Pending Run::log_histogram(std::string_view key, std::span<const double> values, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_histogram(0, false, key, client::bucketed(values), opts) : Pending{};
}
Pending Run::log_histogram(std::string_view key, std::span<const float> values, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_histogram(0, false, key, client::bucketed(values), opts) : Pending{};
}
Pending Run::log_histogram(std::string_view key, const Histogram& histogram, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_histogram(0, false, key, client::copied(histogram), opts) : Pending{};
}
Pending Run::log_histogram(std::string_view key, const void* device_values, std::size_t count, DeviceDtype dtype,
                           CudaStream stream, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_histogram_device(0, false, key, device_values, count, dtype, stream, opts) : Pending{};
}
Pending Writer::log_histogram(std::string_view key, std::span<const double> values, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_histogram(id_, true, key, client::bucketed(values), opts) : Pending{};
}
Pending Writer::log_histogram(std::string_view key, std::span<const float> values, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_histogram(id_, true, key, client::bucketed(values), opts) : Pending{};
}
Pending Writer::log_histogram(std::string_view key, const Histogram& histogram, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_histogram(id_, true, key, client::copied(histogram), opts) : Pending{};
}

} // namespace chorus
