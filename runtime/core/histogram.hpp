// chorus::Histogram's bucket layout as numbers, and the codec of a histogram
// in a rank's frame (so in the WAL): one encoding for the RankProxy, the Run
// actor and `chorus recover`. The layout itself is documented on
// chorus::Histogram (runtime/include/chorus/chorus.hpp) and in README,
// "Histograms".
//
// Encoding, little-endian, no padding:
//   u64 nan, u64 +inf, u64 -inf, f64 sum, f64 min, f64 max, u32 n,
//   n x {i32 bucket index, u64 count}      (non-empty buckets, ascending)
// min and max are 0 when no value is finite.
#pragma once

#include <chorus/chorus.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace chorus::core {

struct HistogramAccess {
  static std::vector<std::pair<std::int32_t, std::uint64_t>>& buckets(Histogram& h) noexcept { return h.buckets_; }
  static const std::vector<std::pair<std::int32_t, std::uint64_t>>& buckets(const Histogram& h) noexcept {
    return h.buckets_;
  }
  /// The counters and statistics beside the buckets (a decoded histogram's).
  static void set(Histogram& h, std::uint64_t finite, std::uint64_t nan, std::uint64_t pos_inf, std::uint64_t neg_inf,
                  double sum, double min, double max) noexcept {
    h.finite_ = finite;
    h.nan_ = nan;
    h.pos_inf_ = pos_inf;
    h.neg_inf_ = neg_inf;
    h.sum_ = sum;
    h.min_ = min;
    h.max_ = max;
  }
};

namespace histogram {

/// The largest bucket index: the positive bucket of the largest doubles.
inline constexpr std::int32_t max_index = 1150 * 128;
/// Bytes of an encoding's fixed part, and of each bucket.
inline constexpr std::size_t head_bytes = 3 * 8 + 3 * 8 + 4;
inline constexpr std::size_t bucket_bytes = 12;

[[nodiscard]] inline std::size_t encoded_size(const Histogram& h) noexcept {
  return head_bytes + HistogramAccess::buckets(h).size() * bucket_bytes;
}
/// Appends the encoding of `h` to `out`.
void encode(const Histogram& h, std::vector<char>& out);
/// Decodes one encoding (exactly `body`); false, `out` unspecified, when it is
/// not one the encoder writes: a short or long body, buckets out of order or
/// of the layout, an empty bucket, counts that overflow, a min or max
/// outside the first or last bucket.
[[nodiscard]] bool decode(std::span<const char> body, Histogram& out);
/// Whether `body` is an encoding decode() takes (without building it).
[[nodiscard]] bool valid(std::span<const char> body);

/// Float values counted as the GPU counts them (runtime/client/device_histogram.cpp):
/// `counts[k]` values whose float bits' top 16 bits are k, NaN and
/// infinities counted apart (their keys hold none); the histogram of them,
/// with the statistics given (min and max as doubles, used where a value
/// was finite). Leaves `counts` zero.
[[nodiscard]] Histogram from_dense(std::uint32_t* counts, std::uint64_t nan, std::uint64_t pos_inf,
                                   std::uint64_t neg_inf, double sum, double min, double max);
/// The keys `counts` of from_dense has.
inline constexpr std::size_t dense_keys = 65536;

} // namespace histogram
} // namespace chorus::core
