#include "io/store/wal_replay.hpp"

#include <algorithm>
#include <variant>

namespace chorus::store {
namespace {

std::int64_t frame_time(const core::wire::Frame& f) {
  std::int64_t ts = 0;
  if (f.type == core::wire::FrameType::host_event) {
    std::visit([&](const auto& e) { ts = e.ts_us; }, f.host);
  } else {
    core::wire::for_each_event(f, [&](const core::wire::RankEvent& ev) {
      if (const auto* v = std::get_if<core::wire::Values>(&ev)) ts = std::max(ts, v->ts_us);
    });
  }
  return ts;
}

} // namespace

Result<WalReplay> replay_wal(const std::string& path, chorus::core::Merger& merger, const ReplayFrameFn& before) {
  WalReplay out;
  Result<WalScan> scan = scan_wal(
      path,
      [&](std::span<const char> payload, std::uint64_t offset) {
        core::wire::Frame f;
        if (!core::wire::decode(payload, f)) {
          ++out.malformed;
          return;
        }
        const std::int64_t ts = frame_time(f);
        if (before) before(f, ts, offset);
        if (!merger.apply(payload)) {
          ++out.malformed;
          return;
        }
        out.last_ts = std::max(out.last_ts, ts);
        if (f.type != core::wire::FrameType::host_event) return;
        // Each attempt of a resumed run opens with a run_start and closes with a run_end.
        if (std::holds_alternative<core::wire::RunStart>(f.host)) {
          out.ended = false;
          out.end_state = RunState::crashed;
        } else if (const auto* e = std::get_if<core::wire::RunEnd>(&f.host); e && !out.ended) {
          out.ended = true;
          out.end_state = e->state;
        }
      });
  if (!scan) return scan.error();
  out.scan = std::move(*scan);
  return out;
}

std::optional<RunState> derived_end(const chorus::core::Merger& merger) {
  if (!merger.started() || !merger.all_done()) return std::nullopt;
  return merger.end_state();
}

std::vector<std::vector<char>> closing_frames(const chorus::core::Merger& merger, std::int64_t ts_us, RunState state,
                                              std::string_view reason) {
  std::vector<std::vector<char>> frames;
  for (int r = 0; r < merger.world_size(); ++r)
    if (merger.rank_state(r) == RunState::running)
      frames.push_back(core::wire::rank_dead(static_cast<std::uint32_t>(r), ts_us, reason));
  frames.push_back(core::wire::run_end(state, ts_us));
  return frames;
}

} // namespace chorus::store
