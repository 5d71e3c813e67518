#include "runtime/client/media_encoder.hpp"

#include <png.h>

#include <csetjmp>
#include <cstring>
#include <string>

namespace chorus::client {
namespace {

struct PngOut {
  std::vector<char>* out;
  char message[256];
};

void write_data(png_structp png, png_bytep data, png_size_t n) {
  auto* o = static_cast<PngOut*>(png_get_io_ptr(png));
  o->out->insert(o->out->end(), reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + n);
}
void flush_data(png_structp) {}
void on_error(png_structp png, png_const_charp msg) {
  auto* o = static_cast<PngOut*>(png_get_error_ptr(png));
  std::snprintf(o->message, sizeof o->message, "%s", msg);
  png_longjmp(png, 1);
}
void on_warning(png_structp, png_const_charp) {}

/// libpng's part, with no C++ object alive across its setjmp: false (and
/// `o.message`) where it failed.
bool run_libpng(PngOut& o, const std::uint8_t* pixels, int height, int width, int color_type, int channels) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &o, on_error, on_warning);
  if (png == nullptr) return false;
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info != nullptr ? &info : nullptr);
    return false;
  }
  png_set_write_fn(png, &o, write_data, flush_data);
  // Training images are written often and read rarely: a fast level.
  png_set_compression_level(png, 3);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, color_type,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const std::size_t stride = static_cast<std::size_t>(width) * static_cast<std::size_t>(channels);
  for (int y = 0; y < height; ++y)
    png_write_row(png, const_cast<png_bytep>(pixels + static_cast<std::size_t>(y) * stride));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

} // namespace

Error encode_png(const std::uint8_t* pixels, int height, int width, int channels, std::vector<char>& out) {
  const int color = channels == 1 ? PNG_COLOR_TYPE_GRAY
                    : channels == 3 ? PNG_COLOR_TYPE_RGB
                    : channels == 4 ? PNG_COLOR_TYPE_RGB_ALPHA
                                    : -1;
  if (color < 0) return {Errc::invalid_argument, "an image has 1, 3 or 4 channels, not " + std::to_string(channels)};
  out.clear();
  out.reserve(static_cast<std::size_t>(height) * static_cast<std::size_t>(width) * static_cast<std::size_t>(channels) / 2 + 1024);
  PngOut o{&out, {}};
  try {
    if (!run_libpng(o, pixels, height, width, color, channels))
      return {Errc::internal, std::string("PNG encoding failed: ") + (o.message[0] ? o.message : "out of memory")};
  } catch (const std::bad_alloc&) {
    return {Errc::internal, "out of memory while encoding a PNG"};
  }
  return {};
}

MediaEncoder::~MediaEncoder() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MediaEncoder::push(MediaJob* job) {
  std::lock_guard lock(mu_);
  jobs_.push_back(job);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  cv_.notify_one();
}

void MediaEncoder::loop() {
  for (;;) {
    MediaJob* job = nullptr;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = jobs_.front();
      jobs_.pop_front();
    }
    Error e = encode_png(job->pixels.data(), job->height, job->width, job->channels, job->media.data);
    if (!e && job->media.data.size() > core::max_media_bytes)
      e = Error(Errc::invalid_argument, "the image's PNG is " + std::to_string(job->media.data.size() >> 20) +
                                            " MiB, over the 64 MiB chorus takes: scale it down");
    std::vector<std::uint8_t>().swap(job->pixels);
    if (e) {
      job->error = std::move(e);
      job->state.store(MediaJob::failed, std::memory_order_release);
    } else {
      job->state.store(MediaJob::ready, std::memory_order_release);
    }
    channel_.wake();
  }
}

} // namespace chorus::client
