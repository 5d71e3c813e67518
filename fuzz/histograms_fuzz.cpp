// histograms.jsonl's lines and a histogram's frame encoding on any bytes:
// the first byte picks which. What either reader accepts must hold together
// (the buckets add up to the finite count, min <= max within them) and
// write back to what reads the same.
#include "fuzz/seeds.hpp"
#include "io/store/histogram_log.hpp"
#include "runtime/core/histogram.hpp"

#include <simdjson.h>

#include <cstdlib>
#include <string>
#include <vector>

using namespace chorus;

namespace {

void check(const Histogram& h) {
  std::uint64_t in_buckets = 0;
  for (const Histogram::Bucket& b : h.buckets()) {
    if (b.count == 0 || !(b.lo < b.hi)) std::abort();
    in_buckets += b.count;
  }
  if (in_buckets != h.finite_count()) std::abort();
  if (h.finite_count() != 0 && !(h.min() <= h.max())) std::abort();
  (void)h.quantile(0.5);
}

/// The encoding: equal bytes, equal histograms (a NaN sum included, which
/// operator== calls unequal to itself).
std::vector<char> bytes_of(const Histogram& h) {
  std::vector<char> out;
  detail::histogram::encode(h, out);
  return out;
}

std::string line_of(const Histogram& h) {
  std::string out;
  io::append_histogram_line(out, 3, 1'700'000'000'000'000, 5'000'000, "grad", 2, 0, h);
  return out;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const double v[] = {-2.0, -0.0, 1e-45, 0.5, 0.5, 7.0, 1e308};
  Histogram h{std::span<const double>(v)};
  h.add(std::numeric_limits<double>::quiet_NaN());
  std::vector<char> bytes;
  detail::histogram::encode(h, bytes);
  fuzz::write_seeds_if_asked({std::string(1, '\0') + line_of(h), std::string(1, '\1') + std::string(bytes.begin(), bytes.end())});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* body = reinterpret_cast<const char*>(data + 1);
  const std::size_t n = size - 1;
  if ((data[0] & 1u) != 0) {
    Histogram h;
    const bool ok = detail::histogram::decode(std::span<const char>(body, n), h);
    if (ok != detail::histogram::valid(std::span<const char>(body, n))) std::abort();
    if (!ok) return 0;
    check(h);
    const std::vector<char> again = bytes_of(h);
    Histogram back;
    if (!detail::histogram::decode(again, back) || bytes_of(back) != again) std::abort();
    return 0;
  }
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  if (parser.parse(body, n).get(e) != simdjson::SUCCESS) return 0;
  Result<io::HistogramLine> line = io::read_histogram_line(e);
  if (!line) return 0;
  check(line->value);
  // What was read writes back to a line that reads the same.
  simdjson::dom::parser again;
  simdjson::dom::element e2;
  const std::string text = line_of(line->value);
  if (again.parse(text).get(e2) != simdjson::SUCCESS) std::abort();
  Result<io::HistogramLine> back = io::read_histogram_line(e2);
  if (!back || bytes_of(back->value) != bytes_of(line->value)) std::abort();
  return 0;
}
