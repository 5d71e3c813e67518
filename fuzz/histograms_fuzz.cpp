// histograms.jsonl's, media.jsonl's and events.jsonl's lines, and a
// histogram's and a media's frame encoding, on any bytes: the first byte
// picks which. What a
// reader accepts must hold together (a histogram's buckets add up to its
// finite count, min <= max within them; a media's kind and format agree)
// and write back to what reads the same.
#include "fuzz/seeds.hpp"
#include "io/store/event_log.hpp"
#include "io/store/histogram_log.hpp"
#include "io/store/media_log.hpp"
#include "runtime/core/media.hpp"
#include "runtime/core/histogram.hpp"

#include <simdjson.h>

#include <cstdlib>
#include <cstring>
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
  core::histogram::encode(h, out);
  return out;
}

std::string line_of(const Histogram& h) {
  std::string out;
  store::append_histogram_line(out, 3, 1'700'000'000'000'000, 5'000'000, "grad", 2, 0, h);
  return out;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const double v[] = {-2.0, -0.0, 1e-45, 0.5, 0.5, 7.0, 1e308};
  Histogram h{std::span<const double>(v)};
  h.add(std::numeric_limits<double>::quiet_NaN());
  std::vector<char> bytes;
  core::histogram::encode(h, bytes);
  core::Media m;
  m.kind = core::MediaKind::table;
  m.format = "json";
  m.caption = "preds";
  const std::string table = R"({"columns":["a"],"data":[[1]]})";
  m.data.assign(table.begin(), table.end());
  std::vector<char> media_bytes;
  core::media::encode(m, media_bytes);
  std::string media_line;
  store::append_media_line(media_line, 2, 1'700'000'000'000'000, 1'000'000, "preds", 1, m,
                        store::media_path("preds", 1, 2, m.extension()));
  core::EventDraft stalled;
  stalled.kind = EventKind::stalled;
  stalled.ts_us = 1'700'000'000'250'000;
  stalled.rank = 3;
  stalled.step = 12;
  stalled.message = "rank 3 (process 4242 on node-a) has not logged past step 12 for 301 s";
  stalled.host = "node-a";
  stalled.pid = 4242;
  stalled.others_step = 40;
  stalled.seconds_us = 301'000'000;
  core::EventDraft nan;
  nan.kind = EventKind::nonfinite;
  nan.ts_us = 1'700'000'001'000'000;
  nan.step = 120;
  nan.key = "loss";
  nan.message = "loss is NaN at step 120";
  nan.ranks = {2, 5};
  nan.value = std::numeric_limits<double>::quiet_NaN();
  nan.has_value = true;
  fuzz::write_seeds_if_asked({std::string(1, '\0') + line_of(h), std::string(1, '\1') + std::string(bytes.begin(), bytes.end()),
                              std::string(1, '\3') + std::string(media_bytes.begin(), media_bytes.end()),
                              std::string(1, '\2') + media_line, std::string(1, '\4') + store::event_line(stalled, 0),
                              std::string(1, '\4') + store::event_line(nan, 1)});
  return 0;
}

/// A media encoding or a media.jsonl line (the second bit of the first byte).
void media_input(bool binary, const char* body, std::size_t n) {
  if (binary) {
    core::Media m;
    const bool ok = core::media::decode(std::span<const char>(body, n), m);
    if (ok != core::media::valid(std::span<const char>(body, n))) std::abort();
    if (!ok) return;
    std::vector<char> again;
    core::media::encode(m, again);
    if (again.size() != n || std::memcmp(again.data(), body, n) != 0) std::abort(); // one encoding per media
    core::media::ImageHeader h;
    (void)core::media::image_header(std::span<const char>(m.data.data(), m.data.size()), h);
    return;
  }
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  if (parser.parse(body, n).get(e) != simdjson::SUCCESS) return;
  Result<store::MediaLine> line = store::read_media_line(e);
  if (!line) return;
  if (!line->path.starts_with("media/") || line->path.find("..") != std::string_view::npos) std::abort();
  (void)store::media_path(line->key, line->rank, line->step, line->format);
}

/// An events.jsonl line: what reads as an event holds together.
void event_input(const char* body, std::size_t n) {
  const Result<store::EventLine> line = store::parse_event_line(std::string_view(body, n));
  if (!line) return;
  const Event& e = line->event;
  if (to_string(e.kind) == "unknown" || e.rank < -1 || e.step < -1) std::abort();
  for (const int r : e.ranks)
    if (r < 0) std::abort();
  if (e.json != std::string_view(body, n)) std::abort();
  if (store::event_kind(to_string(e.kind)) != e.kind) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const char* body = reinterpret_cast<const char*>(data + 1);
  const std::size_t n = size - 1;
  if ((data[0] & 4u) != 0) {
    event_input(body, n);
    return 0;
  }
  if ((data[0] & 2u) != 0) {
    media_input((data[0] & 1u) != 0, body, n);
    return 0;
  }
  if ((data[0] & 1u) != 0) {
    Histogram h;
    const bool ok = core::histogram::decode(std::span<const char>(body, n), h);
    if (ok != core::histogram::valid(std::span<const char>(body, n))) std::abort();
    if (!ok) return 0;
    check(h);
    const std::vector<char> again = bytes_of(h);
    Histogram back;
    if (!core::histogram::decode(again, back) || bytes_of(back) != again) std::abort();
    return 0;
  }
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  if (parser.parse(body, n).get(e) != simdjson::SUCCESS) return 0;
  Result<store::HistogramLine> line = store::read_histogram_line(e);
  if (!line) return 0;
  check(line->value);
  // What was read writes back to a line that reads the same.
  simdjson::dom::parser again;
  simdjson::dom::element e2;
  const std::string text = line_of(line->value);
  if (again.parse(text).get(e2) != simdjson::SUCCESS) std::abort();
  Result<store::HistogramLine> back = store::read_histogram_line(e2);
  if (!back || bytes_of(back->value) != bytes_of(line->value)) std::abort();
  return 0;
}
