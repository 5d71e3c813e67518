// The frames that cross from a rank to its run host and land, byte for byte,
// in the run's write-ahead log. One codec serves the RankProxy (encode), the
// Run actor and `chorus recover` (decode), so a replay of the WAL sees exactly
// what the live run saw.
//
// All integers little-endian, no padding. A frame is:
//   u8 FrameType, then
//   rank_batch: u32 rank, u32 event count, events...
//   host_event: u8 HostEvent, fields...
#pragma once

#include <chorus/chorus.hpp>
#include "runtime/core/bytes.hpp"
#include "runtime/core/histogram.hpp"
#include "runtime/core/media.hpp"

#include <bit>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

static_assert(std::endian::native == std::endian::little, "chorus frames assume little-endian hosts");

namespace chorus::core::wire {

enum class FrameType : std::uint8_t { rank_batch = 1, host_event = 2 };

/// A Reduce value this build knows. Values only ever get added at the end, so
/// a WAL written before one was added still decodes.
constexpr bool known(Reduce r) noexcept {
  return static_cast<std::uint8_t>(r) <= static_cast<std::uint8_t>(Reduce::merge);
}

/// Events inside a rank batch, in the rank's own order.
enum class Tag : std::uint8_t {
  key = 1,     // u32 id, u32 len, bytes: a key or barrier name first seen
  values = 2,  // u64 seq, i64 step (auto_step: next), i64 ts_us, u32 n, n x {u32 key, f64}
  define = 3,  // u64 seq, u32 key, u8 Reduce (0 none, 1 mean, 2 sum, 3 min, 4 max, 5 first)
  barrier = 4, // u64 seq, u32 name key, i64 timeout_ms
  config = 5,  // u64 seq, u32 len, JSON object bytes
  summary = 6, // u64 seq, u32 len, JSON object bytes
  finish = 7,  // u64 seq
  finish_failed = 8, // u64 seq, i32 exit code (non-zero): the trainer ended its rank as failed
  // A rank's further ordered streams (Run::writer): the untagged events above
  // are its default stream, so a WAL written before these existed decodes as before.
  stream_open = 9,    // u64 seq, u32 stream (1..max_streams)
  stream_values = 10, // u64 seq, u32 stream, then as `values` from the step on
  stream_close = 11,  // u64 seq, u32 stream
  // How a rank ended other than `finish`: u64 seq, u8 RunState (failed or
  // killed), i32 code (the exit code, or the signal's number), u32 len,
  // message bytes (why: an exception's text).
  finish_ended = 12,
  // Values the rank refused before they reached its ring (a bad key, a value
  // that is no number), for rejected.jsonl: u64 seq, i64 step (auto_step:
  // none given), u8 Errc, u32 n (values refused), u32 len, message bytes,
  // u32 len, a JSON object of the values (key -> value as JSON).
  refused = 13,
  // How a metric shows (Run::define_metric's summary and step_metric): u64
  // seq, u32 key, u8 Summary (unchanged_summary: as it was), u32 step
  // metric's key (no_step_metric: as it was).
  metric_view = 14,
  // A rule of Run::alert_when: u64 seq, u32 key, u8 AlertRule::Kind, f64
  // limit (the bound, or the seconds of no_change).
  alert_rule = 17,
  // A histogram (Run::log_histogram): u64 seq, u32 stream (0: the default
  // stream), i64 step (auto_step: next; same_step: the stream's last), i64
  // ts_us, u32 key, u32 len, the histogram's encoding
  // (runtime/core/histogram.hpp).
  histogram = 15,
  // An image, text or table (Run::log_image, log_text, log_table): as
  // `histogram`, with the media's encoding (runtime/core/media.hpp).
  media = 16,
};

/// In a histogram event: the step the stream logged at last (its first
/// automatic step if none), so that a histogram joins the values of the
/// same call (the Python module's dict that mixes them).
inline constexpr std::int64_t same_step = std::numeric_limits<std::int64_t>::min() + 1;

/// In a metric_view event: what a define_metric call left as it was.
inline constexpr std::uint8_t unchanged_summary = 0xff;
inline constexpr std::uint32_t no_step_metric = 0xffffffffu;

/// A Summary value this build knows.
constexpr bool known(chorus::Summary s) noexcept {
  return static_cast<std::uint8_t>(s) <= static_cast<std::uint8_t>(chorus::Summary::mean);
}

/// The most writer streams one rank may have open at once; their ids are
/// 1..max_streams (0 is the default stream). Bounds what a frame may make the
/// run host keep per rank.
inline constexpr std::uint32_t max_streams = 4096;

/// Decisions the run host took that depend on time or on the network; they
/// are logged so that a replay takes the same ones.
enum class HostEvent : std::uint8_t {
  run_start = 1,       // i64 ts_us, u32 world_size, u32 len, run.json bytes
  rank_joined = 2,     // u32 rank, i64 ts_us, i64 pid, u32 len, host bytes
  rank_dead = 3,       // u32 rank, i64 ts_us, u32 len, reason bytes
  barrier_timeout = 4, // u32 barrier index, i64 ts_us
  finish_timeout = 5,  // i64 ts_us
  run_end = 6,         // u8 RunState, i64 ts_us
  // A rank's process exited with a status other than 0 after the rank had
  // finished (even after the run ended): it fails the rank, and the run.
  rank_exit = 7,       // u32 rank, i64 ts_us, i32 status
  // An event the run host told (chorus::Event, events.jsonl): u8 EventKind,
  // i64 ts_us, i32 rank, i64 step, u8 RunState, u32 len, key bytes, u32 len,
  // message bytes, u32 n, n x i32 ranks, u32 len, its events.jsonl line.
  // It changes nothing in the merge: a replay writes the line again.
  event = 8,
};

/// The most bytes of a rank's end message (FinishOptions::message) kept.
inline constexpr std::size_t max_end_message = 4096;

inline constexpr std::int64_t auto_step = std::numeric_limits<std::int64_t>::min();
inline constexpr std::size_t value_size = 12; // u32 key + f64

// ---------------------------------------------------------------------------
// Encoding

namespace detail {
using chorus::core::bytes::put;
using chorus::core::bytes::put_bytes;
} // namespace detail

/// Appends one rank_batch frame to `out` (which may already hold bytes).
class BatchWriter {
public:
  BatchWriter(std::vector<char>& out, std::uint32_t rank) : out_(out) {
    detail::put(out_, FrameType::rank_batch);
    detail::put(out_, rank);
    count_at_ = out_.size();
    detail::put<std::uint32_t>(out_, 0);
  }

  void key(std::uint32_t id, std::string_view name) {
    begin(Tag::key);
    detail::put(out_, id);
    detail::put_bytes(out_, name);
  }
  /// Starts a values event of `stream` (0: the default stream); follow with
  /// exactly `n` calls of value().
  /// The event is sized at once, and its fields and values written in place.
  void values(std::uint64_t seq, std::int64_t step, std::int64_t ts_us, std::uint32_t n, std::uint32_t stream = 0) {
    begin(stream == 0 ? Tag::values : Tag::stream_values);
    at_ = out_.size();
    out_.resize(at_ + sizeof seq + (stream != 0 ? sizeof stream : 0) + sizeof step + sizeof ts_us + sizeof n +
                std::size_t{n} * value_size);
    place(seq);
    if (stream != 0) place(stream);
    place(step);
    place(ts_us);
    place(n);
  }
  void value(std::uint32_t key, double v) {
    place(key);
    place(v);
  }
  void define(std::uint64_t seq, std::uint32_t key, Reduce r) {
    begin(Tag::define);
    detail::put(out_, seq);
    detail::put(out_, key);
    detail::put(out_, r);
  }
  void barrier(std::uint64_t seq, std::uint32_t name_key, std::int64_t timeout_ms) {
    begin(Tag::barrier);
    detail::put(out_, seq);
    detail::put(out_, name_key);
    detail::put(out_, timeout_ms);
  }
  /// A writer stream opens (joins the rank's watermark) or closes (leaves it).
  void stream(std::uint64_t seq, std::uint32_t stream, bool open) {
    begin(open ? Tag::stream_open : Tag::stream_close);
    detail::put(out_, seq);
    detail::put(out_, stream);
  }
  void config(std::uint64_t seq, std::string_view json) { blob(Tag::config, seq, json); }
  void summary(std::uint64_t seq, std::string_view json) { blob(Tag::summary, seq, json); }
  /// A finish; with an exit code other than 0, the failed finish that WALs
  /// before finish_ended hold (finish_ended says more, and is what ranks send).
  void finish(std::uint64_t seq, std::int32_t exit_code = 0) {
    begin(exit_code == 0 ? Tag::finish : Tag::finish_failed);
    detail::put(out_, seq);
    if (exit_code != 0) detail::put(out_, exit_code);
  }
  /// The rank ended `state` (failed or killed) with `code` (its exit code, or
  /// its signal), and why; the message is cut at max_end_message bytes.
  void finish_ended(std::uint64_t seq, RunState state, std::int32_t code, std::string_view message) {
    begin(Tag::finish_ended);
    detail::put(out_, seq);
    detail::put(out_, static_cast<std::uint8_t>(state));
    detail::put(out_, code);
    detail::put_bytes(out_, message.substr(0, max_end_message));
  }
  /// `n` values refused before the ring (`values`: a JSON object of them).
  void refused(std::uint64_t seq, std::int64_t step, Errc code, std::uint32_t n, std::string_view message,
               std::string_view values) {
    begin(Tag::refused);
    detail::put(out_, seq);
    detail::put(out_, step);
    detail::put(out_, static_cast<std::uint8_t>(code));
    detail::put(out_, n);
    detail::put_bytes(out_, message);
    detail::put_bytes(out_, values);
  }
  void histogram(std::uint64_t seq, std::uint32_t stream, std::int64_t step, std::int64_t ts_us, std::uint32_t key,
                 const Histogram& h) {
    begin(Tag::histogram);
    detail::put(out_, seq);
    detail::put(out_, stream);
    detail::put(out_, step);
    detail::put(out_, ts_us);
    detail::put(out_, key);
    detail::put(out_, static_cast<std::uint32_t>(chorus::core::histogram::encoded_size(h)));
    chorus::core::histogram::encode(h, out_);
  }
  void media(std::uint64_t seq, std::uint32_t stream, std::int64_t step, std::int64_t ts_us, std::uint32_t key,
             const chorus::core::Media& m) {
    begin(Tag::media);
    detail::put(out_, seq);
    detail::put(out_, stream);
    detail::put(out_, step);
    detail::put(out_, ts_us);
    detail::put(out_, key);
    detail::put(out_, static_cast<std::uint32_t>(chorus::core::media::encoded_size(m)));
    chorus::core::media::encode(m, out_);
  }
  void metric_view(std::uint64_t seq, std::uint32_t key, std::uint8_t summary, std::uint32_t step_key) {
    begin(Tag::metric_view);
    detail::put(out_, seq);
    detail::put(out_, key);
    detail::put(out_, summary);
    detail::put(out_, step_key);
  }

  void alert_rule(std::uint64_t seq, std::uint32_t key, AlertRule rule) {
    begin(Tag::alert_rule);
    detail::put(out_, seq);
    detail::put(out_, key);
    detail::put(out_, static_cast<std::uint8_t>(rule.kind));
    detail::put(out_, rule.limit);
  }

  [[nodiscard]] std::uint32_t events() const noexcept { return events_; }

private:
  void begin(Tag t) {
    detail::put(out_, t);
    ++events_;
    std::memcpy(out_.data() + count_at_, &events_, sizeof(events_));
  }
  void blob(Tag t, std::uint64_t seq, std::string_view json) {
    begin(t);
    detail::put(out_, seq);
    detail::put_bytes(out_, json);
  }

  std::vector<char>& out_;
  /// Writes `v` at at_, within what values() sized.
  template <class T>
  void place(T v) {
    assert(at_ + sizeof v <= out_.size()); // values() announced fewer values than were given
    std::memcpy(out_.data() + at_, &v, sizeof v);
    at_ += sizeof v;
  }

  std::size_t count_at_ = 0;
  std::uint32_t events_ = 0;
  std::size_t at_ = 0; // where a values event's next field goes
};

std::vector<char> run_start(std::int64_t ts_us, std::uint32_t world_size, std::string_view run_json);
std::vector<char> rank_joined(std::uint32_t rank, std::int64_t ts_us, std::int64_t pid, std::string_view host);
std::vector<char> rank_dead(std::uint32_t rank, std::int64_t ts_us, std::string_view reason);
std::vector<char> barrier_timeout(std::uint32_t index, std::int64_t ts_us);
std::vector<char> finish_timeout(std::int64_t ts_us);
std::vector<char> run_end(RunState state, std::int64_t ts_us);
std::vector<char> rank_exit(std::uint32_t rank, std::int64_t ts_us, std::int32_t status);
struct EventRecord;
std::vector<char> event(const EventRecord& e);

// ---------------------------------------------------------------------------
// Decoding: views into the frame's bytes, valid while the frame is.

struct KeyDef {
  std::uint32_t id;
  std::string_view name;
};
struct Values {
  std::uint64_t seq;
  std::int64_t step;
  std::int64_t ts_us;
  std::uint32_t n;
  const char* data; // n x {u32 key, f64 value}
  std::uint32_t stream = 0; // 0: the rank's default stream
  [[nodiscard]] std::uint32_t key(std::uint32_t i) const noexcept {
    std::uint32_t k;
    std::memcpy(&k, data + i * value_size, sizeof k);
    return k;
  }
  [[nodiscard]] double value(std::uint32_t i) const noexcept {
    double v;
    std::memcpy(&v, data + i * value_size + 4, sizeof v);
    return v;
  }
};
struct Define {
  std::uint64_t seq;
  std::uint32_t key;
  Reduce reduce;
};
struct Barrier {
  std::uint64_t seq;
  std::uint32_t name_key;
  std::int64_t timeout_ms;
};
struct Config {
  std::uint64_t seq;
  std::string_view json;
};
struct Summary {
  std::uint64_t seq;
  std::string_view json;
};
/// How a rank ends: finished, or failed with its exit code, or killed by
/// its signal (`code`), and why.
struct Finish {
  std::uint64_t seq;
  RunState state = RunState::finished;
  std::int32_t code = 0;
  std::string_view message;
};
struct Refused {
  std::uint64_t seq;
  std::int64_t step; // auto_step: the call gave none
  Errc code;
  std::uint32_t n;
  std::string_view message;
  std::string_view values; // a JSON object
};
struct MetricView {
  std::uint64_t seq;
  std::uint32_t key;
  std::uint8_t summary;  // a Summary, or unchanged_summary
  std::uint32_t step_key; // a key id, or no_step_metric
};
/// A histogram of one key; `body` is its encoding, checked.
struct HistogramValue {
  std::uint64_t seq;
  std::uint32_t stream; // 0: the rank's default stream
  std::int64_t step;
  std::int64_t ts_us;
  std::uint32_t key;
  std::span<const char> body;
};
/// An image, text or table of one key; `body` is its encoding, checked.
struct MediaValue {
  std::uint64_t seq;
  std::uint32_t stream;
  std::int64_t step;
  std::int64_t ts_us;
  std::uint32_t key;
  std::span<const char> body;
};
/// A writer stream opening (`open`) or closing.
struct Stream {
  std::uint64_t seq;
  std::uint32_t id;
  bool open;
};
/// A rule of Run::alert_when (kind and limit checked: a known kind, a finite
/// limit, and a positive one for no_change).
struct AlertRuleDef {
  std::uint64_t seq;
  std::uint32_t key;
  AlertRule rule;
};
using RankEvent =
    std::variant<KeyDef, Values, Define, Barrier, Config, Summary, Finish, Stream, Refused, MetricView, HistogramValue,
                 MediaValue, AlertRuleDef>;

struct RunStart {
  std::int64_t ts_us;
  std::uint32_t world_size;
  std::string_view run_json;
};
struct RankJoined {
  std::uint32_t rank;
  std::int64_t ts_us;
  std::int64_t pid;
  std::string_view host;
};
struct RankDead {
  std::uint32_t rank;
  std::int64_t ts_us;
  std::string_view reason;
};
struct BarrierTimeout {
  std::uint32_t index;
  std::int64_t ts_us;
};
struct FinishTimeout {
  std::int64_t ts_us;
};
struct RunEnd {
  RunState state;
  std::int64_t ts_us;
};
struct RankExit {
  std::uint32_t rank;
  std::int64_t ts_us;
  std::int32_t status;
};
/// An event the run host told (HostEvent::event). Decoded, its strings and
/// ranks view the frame; to encode, `ranks` is what counts.
struct EventRecord {
  EventKind kind = EventKind::run_finished;
  std::int64_t ts_us = 0;
  std::int32_t rank = -1;
  std::int64_t step = -1;
  RunState state = RunState::running;
  std::string_view key;
  std::string_view message;
  std::span<const std::int32_t> ranks; // encode
  std::span<const char> rank_bytes;    // decoded: n x i32
  std::string_view json;               // the events.jsonl line, no newline

  [[nodiscard]] std::size_t rank_count() const noexcept { return rank_bytes.size() / 4; }
  [[nodiscard]] std::int32_t rank_at(std::size_t i) const noexcept {
    std::int32_t r;
    std::memcpy(&r, rank_bytes.data() + i * 4, 4);
    return r;
  }
  /// The public form (owning copies of the strings).
  [[nodiscard]] chorus::Event to_event() const;
};
/// Whether `k` is an EventKind this build knows.
constexpr bool known(EventKind k) noexcept {
  return static_cast<std::uint8_t>(k) >= 1 && static_cast<std::uint8_t>(k) <= static_cast<std::uint8_t>(EventKind::straggler);
}
using HostEventData =
    std::variant<RunStart, RankJoined, RankDead, BarrierTimeout, FinishTimeout, RunEnd, RankExit, EventRecord>;

/// A decoded frame: either a rank's batch (iterate with for_each_event) or one host event.
struct Frame {
  FrameType type;
  std::uint32_t rank = 0;       // rank_batch
  std::uint32_t events = 0;     // rank_batch
  std::span<const char> body;   // rank_batch: the encoded events
  HostEventData host;           // host_event
};

/// Checks the whole frame and decodes its header. False if malformed: a
/// truncated field, an unknown tag, a count that does not match.
[[nodiscard]] bool decode(std::span<const char> frame, Frame& out);

/// Calls f(RankEvent) for each event of a rank_batch frame that decode()
/// accepted (decode validated every event, so this cannot fail).
void for_each_event(const Frame& frame, const std::function<void(const RankEvent&)>& f);

/// Reads encoded events one at a time: a rank_batch body, or events copied
/// byte for byte out of such bodies (the Merger keeps a parked rank's later
/// events that way). Every read is bounds-checked.
class EventReader {
public:
  explicit EventReader(std::span<const char> events) noexcept : data_(events) {}
  /// Decodes the next event; false at the end or at malformed bytes.
  bool next(RankEvent& ev) noexcept;
  /// The offset of the first byte not yet read.
  [[nodiscard]] std::size_t offset() const noexcept { return pos_; }
  [[nodiscard]] bool done() const noexcept { return pos_ == data_.size(); }

private:
  std::span<const char> data_;
  std::size_t pos_ = 0;
};

} // namespace chorus::core::wire
