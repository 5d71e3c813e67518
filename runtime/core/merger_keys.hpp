// The Merger's keys: the run's table of key names (global ids in order of
// first sight, each key's reduction, the name order rows are written in),
// each rank's local ids for them, and the check that a rank's frame uses
// only ids it defined, consistently, with seqs as its RankProxy numbers them.
#pragma once

#include <chorus/chorus.hpp>
#include "runtime/core/merger_streams.hpp"
#include "runtime/core/wire.hpp"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace chorus::core::merging {
// (A namespace of their own: other layers have a key table and local keys of
// their own, runtime/client/ingest.hpp.)


inline constexpr std::uint32_t no_key = std::numeric_limits<std::uint32_t>::max();
inline constexpr std::uint32_t key_in_frame = no_key - 1; // defined earlier in the frame being checked
// Bounds on what one frame may make the Merger allocate.
inline constexpr std::uint32_t max_local_key = 1u << 22;
// A rank's seqs count the slots of its queue: one event moves them by its
// values (at most 65535 a call) or by one. A bigger jump is not a frame its
// RankProxy wrote, and would complete tickets not yet sent.
inline constexpr std::uint64_t max_seq_advance = 1u << 17;

/// The run's keys: global ids in order of first sight; rows name them
/// through these.
class RunKeys {
public:
  std::uint32_t intern(std::string_view name) {
    if (auto it = gid_of_.find(name); it != gid_of_.end()) return it->second;
    const auto gid = static_cast<std::uint32_t>(names_.size());
    names_.emplace_back(name);
    gid_of_.emplace(names_.back(), gid);
    reduction_.push_back(Reduce::none);
    view_.push_back({});
    kind_.push_back(Kind::unset);
    order_stale_ = true;
    return gid;
  }

  [[nodiscard]] const std::string& operator[](std::uint32_t gid) const { return names_[gid]; }
  [[nodiscard]] std::size_t size() const noexcept { return names_.size(); }
  Reduce& reduction(std::uint32_t gid) { return reduction_[gid]; }
  /// What a key holds: the first kind logged under it (or a Reduce::merge
  /// declaration: histograms) decides, for the whole run.
  enum class Kind : std::uint8_t { unset, scalar, histogram, image, text, table };
  Kind& kind(std::uint32_t gid) { return kind_[gid]; }
  /// How a key shows (define_metric's summary and step_metric).
  struct View {
    Summary summary = Summary::last;
    std::uint32_t step = no_key; // the key its charts take as x; no_key: _step
  };
  View& view(std::uint32_t gid) { return view_[gid]; }

  /// Each key's place in name order, by global id.
  const std::vector<std::uint32_t>& order() {
    sort_names();
    return order_;
  }
  /// The global ids in name order.
  const std::vector<std::uint32_t>& by_order() {
    sort_names();
    return by_order_;
  }

private:
  void sort_names() {
    if (!order_stale_) return;
    by_order_.resize(names_.size());
    std::iota(by_order_.begin(), by_order_.end(), 0u);
    std::sort(by_order_.begin(), by_order_.end(),
              [this](std::uint32_t a, std::uint32_t b) { return names_[a] < names_[b]; });
    order_.resize(names_.size());
    for (std::uint32_t i = 0; i < by_order_.size(); ++i) order_[by_order_[i]] = i;
    order_stale_ = false;
  }

  std::deque<std::string> names_; // a deque, so the views in gid_of_ stay valid
  std::unordered_map<std::string_view, std::uint32_t> gid_of_;
  std::vector<Reduce> reduction_;
  std::vector<View> view_;
  std::vector<Kind> kind_;
  std::vector<std::uint32_t> order_, by_order_; // name order, rebuilt once new keys came
  bool order_stale_ = false;
};

/// A rank's id for a key, and where that rank's value of it sits in the
/// pending row it last logged it at (so a repeat replaces, not appends).
struct LocalKey {
  std::uint32_t gid = no_key;
  std::uint32_t canon = 0; // the local id owning the replace slot (two ids may name one key)
  std::uint32_t entry = 0; // its value's index in the row at `step` (while a frame is checked: its name's)
  std::int64_t step = RankStreams::no_step;
  std::int64_t top = RankStreams::no_step; // the highest step it was logged at: below it, a row may hold it already
  bool scalar = false; // this rank logged scalars under it (so the key holds scalars)
};

/// Checks a rank's frame before any of it is applied; keeps its scratch
/// between frames.
class FrameCheck {
public:
  /// Checks that every key a frame uses is defined before its use, and
  /// consistently, and that its seqs go up as a RankProxy numbers them; new
  /// ids are marked, and unmarked again on failure.
  bool run(std::span<const char> body, std::vector<LocalKey>& keys, RankStreams& streams, std::uint64_t& rank_seq,
           const RunKeys& names) {
    fresh_ids_.clear();
    fresh_names_.clear();
    ends_rank_ = false;
    auto known = [&keys](std::uint32_t id) { return id < keys.size() && keys[id].gid != no_key; };
    bool ok = true;
    std::uint64_t seq = rank_seq;
    wire::EventReader in(body);
    wire::RankEvent ev;
    while (ok && in.next(ev)) {
      const std::uint64_t next = std::visit(
          [seq](const auto& e) -> std::uint64_t {
            if constexpr (requires { e.seq; }) return e.seq;
            return seq + 1; // a key definition carries none
          },
          ev);
      if (next <= seq || next - seq > max_seq_advance) {
        ok = false;
        break;
      }
      if (!std::holds_alternative<wire::KeyDef>(ev)) seq = next;
      if (const auto* k = std::get_if<wire::KeyDef>(&ev)) {
        if (k->id >= max_local_key) {
          ok = false;
          break;
        }
        if (k->id >= keys.size())
          keys.resize(std::min<std::size_t>(std::max<std::size_t>(k->id + 1, keys.size() * 2), max_local_key));
        LocalKey& lk = keys[k->id];
        if (lk.gid == no_key) {
          lk.gid = key_in_frame;
          lk.entry = static_cast<std::uint32_t>(fresh_names_.size());
          fresh_names_.push_back(k->name);
          fresh_ids_.push_back(k->id);
        } else if (lk.gid == key_in_frame) {
          ok = fresh_names_[lk.entry] == k->name;
        } else {
          ok = names[lk.gid] == k->name;
        }
      } else if (const auto* v = std::get_if<wire::Values>(&ev)) {
        ok = streams.named(v->stream);
        for (std::uint32_t i = 0; ok && i < v->n; ++i) ok = known(v->key(i));
      } else if (const auto* h = std::get_if<wire::HistogramValue>(&ev)) {
        ok = streams.named(h->stream) && known(h->key);
      } else if (const auto* m = std::get_if<wire::MediaValue>(&ev)) {
        ok = streams.named(m->stream) && known(m->key);
      } else if (const auto* st = std::get_if<wire::Stream>(&ev)) {
        ok = streams.name(*st);
      } else if (const auto* d = std::get_if<wire::Define>(&ev)) {
        ok = known(d->key);
      } else if (const auto* m = std::get_if<wire::MetricView>(&ev)) {
        ok = known(m->key) && (m->step_key == wire::no_step_metric || known(m->step_key));
      } else if (const auto* b = std::get_if<wire::Barrier>(&ev)) {
        ok = known(b->name_key);
      } else if (std::holds_alternative<wire::Finish>(ev)) {
        ends_rank_ = true;
      }
    }
    streams.checked(ok);
    if (!ok)
      for (std::uint32_t id : fresh_ids_) keys[id].gid = no_key;
    else
      rank_seq = seq;
    return ok;
  }

  /// The frame run() last checked holds its rank's end (a finish, of any kind).
  [[nodiscard]] bool ends_rank() const noexcept { return ends_rank_; }

private:
  bool ends_rank_ = false;
  std::vector<std::uint32_t> fresh_ids_;
  std::vector<std::string_view> fresh_names_;
};

} // namespace chorus::core::merging
