#include "io/store/event_log.hpp"

#include "io/store/run_record.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <array>
#include <cmath>

namespace chorus::store {
namespace {

using simdjson::SUCCESS;

/// The furthest unix seconds an event's time may be, either way (below
/// system_clock's 64-bit nanoseconds, about 9.2e9 s).
constexpr double max_event_seconds = 9e9;

constexpr std::array<EventKind, 10> kinds = {
    EventKind::stalled,        EventKind::resumed,      EventKind::nonfinite, EventKind::rank_failed,
    EventKind::rank_killed,    EventKind::rank_lost,    EventKind::barrier_timeout, EventKind::run_finished,
    EventKind::threshold,      EventKind::straggler};

} // namespace

bool event_has_state(EventKind k) noexcept {
  return k == EventKind::run_finished || k == EventKind::rank_failed || k == EventKind::rank_killed ||
         k == EventKind::rank_lost;
}

std::optional<EventKind> event_kind(std::string_view name) noexcept {
  for (EventKind k : kinds)
    if (to_string(k) == name) return k;
  return std::nullopt;
}

std::string event_line(const chorus::core::EventDraft& d, std::uint64_t seq) {
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("seq").uinteger(seq).key("kind").string(to_string(d.kind)).key("time").seconds(d.ts_us);
  w.key("rank");
  if (d.rank >= 0) w.integer(d.rank);
  else w.null();
  w.key("step");
  if (d.step >= 0) w.integer(d.step);
  else w.null();
  w.key("key");
  if (!d.key.empty()) w.string(d.key);
  else w.null();
  w.key("message").string(d.message);
  w.key("ranks").begin_array();
  for (const std::int32_t r : d.ranks) w.integer(r);
  w.end_array();
  w.key("state");
  if (event_has_state(d.kind)) w.string(to_string(d.state));
  else w.null();
  if (!d.host.empty()) w.key("host").string(d.host);
  if (d.pid >= 0) w.key("pid").integer(d.pid);
  if (d.others_step >= 0) w.key("others_step").integer(d.others_step);
  if (d.seconds_us >= 0) w.key("seconds").seconds(d.seconds_us);
  if (d.has_value) w.key("value").number(d.value);
  if (!d.rule.empty()) w.key("rule").string(d.rule).key("limit").number(d.limit);
  if (!d.barrier.empty()) w.key("barrier").string(d.barrier);
  if (d.index >= 0) w.key("index").integer(d.index);
  if (!d.reason.empty()) w.key("reason").string(d.reason);
  w.end_object();
  return out;
}

Result<EventLine> parse_event_line(std::string_view line) {
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  if (auto e = parser.parse(line.data(), line.size()).get(o))
    return Error(Errc::invalid_argument, std::string("not JSON (") + simdjson::error_message(e) + ")");
  EventLine l;
  std::string_view text;
  if (o["seq"].get(l.seq) != SUCCESS) return Error(Errc::invalid_argument, "no \"seq\" number");
  if (o["kind"].get(text) != SUCCESS) return Error(Errc::invalid_argument, "no \"kind\" string");
  const auto kind = event_kind(text);
  if (!kind) return Error(Errc::invalid_argument, "an unknown kind \"" + std::string(text) + "\"");
  Event& ev = l.event;
  ev.kind = *kind;
  double time = 0;
  if (o["time"].get(time) != SUCCESS || !std::isfinite(time))
    return Error(Errc::invalid_argument, "no \"time\" number");
  // Unix seconds a clock can hold (system_clock counts nanoseconds in 64 bits: up to the year 2262).
  if (std::fabs(time) > max_event_seconds)
    return Error(Errc::invalid_argument, "a \"time\" out of range (" + std::to_string(time) + " s)");
  ev.time = std::chrono::system_clock::time_point(std::chrono::microseconds(std::llround(time * 1e6)));
  std::int64_t n = 0;
  if (o["rank"].get(n) == SUCCESS && n >= 0 && n <= INT32_MAX) ev.rank = static_cast<int>(n);
  if (o["step"].get(n) == SUCCESS && n >= 0) ev.step = n;
  if (o["key"].get(text) == SUCCESS) ev.key = std::string(text);
  if (o["message"].get(text) != SUCCESS) return Error(Errc::invalid_argument, "no \"message\" string");
  ev.message = std::string(text);
  simdjson::dom::array ranks;
  if (o["ranks"].get(ranks) == SUCCESS)
    for (simdjson::dom::element r : ranks)
      if (r.get(n) == SUCCESS && n >= 0 && n <= INT32_MAX) ev.ranks.push_back(static_cast<int>(n));
  if (o["state"].get(text) == SUCCESS)
    if (auto s = run_state_named(text)) ev.state = *s;
  if (o["host"].get(text) == SUCCESS) l.host = std::string(text);
  if (o["pid"].get(n) == SUCCESS) l.pid = n;
  if (o["others_step"].get(n) == SUCCESS) l.others_step = n;
  double secs = 0;
  if (o["seconds"].get(secs) == SUCCESS) l.seconds = secs;
  ev.json = std::string(line);
  return l;
}

} // namespace chorus::store
