// The wire frame decoder and the Merger on any bytes: the input is split
// into frames (a u16 length before each), each decoded and its events
// walked, then all applied in order to a Merger, as `chorus recover` replays
// a WAL.
#include "fuzz/seeds.hpp"
#include "runtime/core/merger.hpp"
#include "runtime/core/wire.hpp"

#include <cstring>
#include <vector>

using namespace chorus;

namespace {

class NullSink final : public core::HistorySink {
public:
  void run_start(std::string_view, std::int64_t, std::uint32_t) override {}
  void row(const core::Row&) override {}
  void config(int, std::string_view) override {}
  void summary(int, std::string_view) override {}
  void rejected(int, std::uint64_t, std::int64_t, std::span<const std::pair<std::string_view, double>>,
                const Error&) override {}
  void rank_state(int, RunState, std::int64_t, std::string_view, std::string_view) override {}
  void completed(int, std::uint64_t, const Error*) override {}
  void run_end(RunState, std::int64_t) override {}
};

} // namespace

// Seeds: the sample run's frames, each with its length before it, all in one input.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string all;
  for (const auto& f : fuzz::sample_frames()) {
    const auto len = static_cast<std::uint16_t>(f.size());
    all.append(reinterpret_cast<const char*>(&len), 2).append(f.data(), f.size());
  }
  fuzz::write_seeds_if_asked({all});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::span<const char>> frames;
  const char* p = reinterpret_cast<const char*>(data);
  for (std::size_t at = 0; at + 2 <= size;) {
    std::uint16_t len;
    std::memcpy(&len, p + at, 2);
    at += 2;
    const std::size_t n = std::min<std::size_t>(len, size - at);
    frames.emplace_back(p + at, n);
    at += n;
  }
  NullSink sink;
  core::Merger merger(sink);
  for (const auto& f : frames) {
    core::wire::Frame frame;
    if (core::wire::decode(f, frame)) {
      std::size_t events = 0;
      core::wire::for_each_event(frame, [&](const core::wire::RankEvent&) { ++events; });
      if (frame.type == core::wire::FrameType::rank_batch && events != frame.events) std::abort();
    }
    (void)merger.apply(f);
  }
  return 0;
}
