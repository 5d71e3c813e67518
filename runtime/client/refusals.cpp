// Values refused on the trainer's side (a bad key, a value that is no
// number, a step below 0, a call too big): nothing is refused without a
// trace. Each refusal goes through the ring to the run host, which writes it
// to rejected.jsonl and counts it in the run's `rejected`, whether or not
// anyone waits on the ticket; and the first refusal of each key prints one
// warning here, in the process that made the call (README, "Refused values").
#include "runtime/client/refusals.hpp"
#include "runtime/client/run_impl.hpp"
#include "runtime/core/json.hpp"
#include "runtime/core/wire.hpp"

#include <atomic>
#include <climits>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_set>

namespace chorus::client {

namespace {

/// Keys warned about at most, so that a run logging ever-new bad keys
/// neither floods stderr nor grows without bound; then one last line.
constexpr std::size_t max_warned = 10'000;
/// Values one rejected line lists (its count says how many there were).
constexpr std::size_t max_listed = 100;
/// Bytes of a key a line or a warning shows.
constexpr std::size_t max_key_text = 256;

struct Warned {
  std::mutex mu;
  std::unordered_set<std::string> keys;
  bool capped = false;
};

/// Leaked on purpose: a warning may come while the process exits.
Warned& warned() {
  static Warned* w = new Warned;
  return *w;
}

} // namespace

void print_refusal(int rank, const Error& why, bool once_per_key) {
  std::string line = "chorus: rank ";
  line.append(std::to_string(rank)).append(": a value was refused: ").append(why.message());
  if (once_per_key)
    line.append(". Later refusals of this key are not printed; every refused value is in the run's rejected.jsonl");
  line.push_back('\n');
  std::fputs(line.c_str(), stderr); // one call: lines of several threads do not mix
}

void warn_refusal(int rank, std::string_view key, const Error& why) noexcept {
  try {
    Warned& w = warned();
    {
      std::lock_guard lock(w.mu);
      if (w.keys.contains(std::string(key.substr(0, max_key_text)))) return;
      if (w.keys.size() >= max_warned) {
        if (w.capped) return;
        w.capped = true;
        std::fprintf(stderr, "chorus: rank %d: values of %zu keys were refused; refusals of further keys are not "
                             "printed (every refused value is in the run's rejected.jsonl)\n",
                     rank, max_warned);
        return;
      }
      w.keys.emplace(key.substr(0, max_key_text));
    }
    print_refusal(rank, why, true);
  } catch (...) {
    // Out of memory: the refusal still goes to rejected.jsonl where it can.
  }
}

std::string refused_values_json(std::span<const RefusedValue> values) {
  std::string out;
  core::JsonWriter w(out);
  w.begin_object();
  for (std::size_t i = 0; i < values.size() && i < max_listed; ++i) {
    w.key(std::string_view(values[i].key).substr(0, max_key_text));
    w.raw(values[i].value_json.empty() ? std::string_view("null") : std::string_view(values[i].value_json));
  }
  w.end_object();
  return out;
}

std::string number_json(double v) {
  std::string out;
  core::append_json_number(out, v);
  return out;
}

void RunImpl::record_refusal(std::optional<std::int64_t> step, const Error& why,
                             std::span<const RefusedValue> values) noexcept {
  refuse_values(step, why, values, values.size(), Room::force);
}

bool RunImpl::refuse_values(std::optional<std::int64_t> step, const Error& why, std::span<const RefusedValue> values,
                            std::size_t n, Room room) noexcept {
  if (n == 0 || !why) return true;
  try {
    for (const RefusedValue& v : values) warn_refusal(settings_.topo.rank, v.key, why);
    // After finish the run takes nothing more, this one's refusals included:
    // the warning above is their trace.
    if (closed_.load(std::memory_order_relaxed)) return true;
    auto refusal = std::make_unique<Refusal>(
        Refusal{why.code(), static_cast<std::uint32_t>(std::min<std::size_t>(n, UINT32_MAX)), why.message(),
                refused_values_json(values)});
    bool no_room = false;
    (void)push_control(
        SlotKind::refused,
        [&](Slot& s) {
          s.step = step ? *step : core::wire::auto_step;
          s.refusal = refusal.release();
        },
        room, &no_room);
    return !no_room;
  } catch (...) {
    return true; // out of memory: the warning, where it got out, is the trace
  }
}

void RunImpl::note_refused_keys(std::span<const Metric> values, const std::uint32_t* ids,
                                std::optional<std::int64_t> step, Room room) noexcept {
  try {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (ids[i] != KeyTable::invalid) continue;
      const RefusedValue v{std::string(values[i].key.substr(0, max_key_text)), number_json(values[i].value)};
      (void)refuse_values(step, validate_metric_key(values[i].key), std::span(&v, 1), 1, room);
    }
  } catch (...) {
  }
}

void RunImpl::note_refused_call(std::span<const Metric> values, std::optional<std::int64_t> step,
                                const Error& why) noexcept {
  try {
    std::vector<RefusedValue> listed;
    for (std::size_t i = 0; i < values.size() && i < max_listed; ++i)
      listed.push_back({std::string(values[i].key.substr(0, max_key_text)), number_json(values[i].value)});
    (void)refuse_values(step, why, listed, values.size(), Room::force);
  } catch (...) {
  }
}

void RunImpl::note_after_finish(const char* call) noexcept {
  // Once a process: a trainer that goes on logging after a signal ended its
  // run would otherwise print a line a step.
  static std::atomic<bool> told{false};
  if (told.exchange(true, std::memory_order_relaxed)) return;
  std::fprintf(stderr,
               "chorus: rank %d: %s after finish: the run has finished and takes no more values, so these are not "
               "in it (nor in rejected.jsonl); log before calling finish(). Where a signal or the process's exit "
               "ended the run, this is the trainer still logging meanwhile. (Printed once.)\n",
               settings_.topo.rank, call);
}

} // namespace chorus::client
