// The state behind a Run handle: the ring the trainer fills, the channel that
// completes its tickets, and the actor side (System), which is the only part
// that knows CAF.
#pragma once

#include "runtime/client/artifact_copier.hpp"
#include "runtime/client/channel.hpp"
#include "runtime/client/device.hpp"
#include "runtime/client/events.hpp"
#include "runtime/client/ingest.hpp"
#include "runtime/client/log_clock.hpp"
#include "runtime/client/media_encoder.hpp"
#include "runtime/core/options.hpp"

#include <chorus/chorus.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace caf {
class actor_system;
}

namespace chorus::client {

class System;

/// How many times this process has been the child of a fork(); bumped by a
/// pthread_atfork child handler (run.cpp).
extern std::atomic<unsigned> fork_count;

/// A log call's values share one head slot, which counts them in 16 bits.
inline constexpr std::size_t max_values_per_call = 0xffff;
/// How far ahead of the slots it writes a log call asks for slots (Ring::prefetch):
/// 1 KiB, a few calls' worth.
inline constexpr std::uint32_t prefetch_ahead = 32;

/// A log call's error where the key `bad_key` (its first bad one) was
/// refused and its `logged` other values were logged (log, and log_device
/// with host values beside).
[[nodiscard]] Error partly_logged(std::string_view bad_key, std::size_t logged);

/// One value a call refused, as rejected.jsonl shows it (record_refusal).
struct RefusedValue {
  /// The key as text (a key that is not text: its repr). Cut to 256 bytes,
  /// and bytes that are not UTF-8 replaced, where it is written.
  std::string key;
  /// The value as JSON text: a number, null, or a JSON string (a repr).
  std::string value_json;
};

/// How a call waits for room in the ring.
enum class Room : std::uint8_t {
  configured, // as Options::overflow says: wait (block) or drop the values (drop_newest)
  force,      // control calls: wait, never drop
  now,        // the RankProxy's own calls (it drains the ring): never wait; no room, no call
};

class RunImpl {
public:
  explicit RunImpl(core::Settings settings);
  ~RunImpl();

  /// Starts the actors and joins the run; bounded by init_timeout. They run
  /// in `actors` where given (<chorus/caf.hpp>), else in chorus's own system.
  Error start(caf::actor_system* actors = nullptr);
  /// The actor side (null before start).
  System* system() const noexcept { return system_.get(); }

  /// Logs into the default stream. Inlined into Run::log, its one caller
  /// (run.cpp, where it is defined): the trainer's call is one call deep.
  [[gnu::always_inline]] inline Pending log(std::span<const Metric> values, const LogOptions& opts) noexcept;
  /// Opens a writer stream: its id, or 0 (the writer's calls then say why)
  /// after finish or with core::wire::max_streams open already.
  std::uint32_t open_stream() noexcept;
  /// A Writer's log call: as log(), or the reason stream 0 was handed out.
  Pending log_stream(std::uint32_t stream, std::span<const Metric> values, const LogOptions& opts) noexcept;
  /// Closes a writer stream (it leaves the rank's minimum) and frees its id.
  Pending close_stream(std::uint32_t stream) noexcept;
  // The streams of actors that log by message (<chorus/caf.hpp>), one per
  // sending actor: as open_stream, log_stream and close_stream, but made on
  // the RankProxy's thread, which drains the ring, so they never wait for
  // room in it: false when the call does not fit now (nothing was done).
  bool offer_open(std::uint32_t& stream) noexcept;
  bool offer_log(std::uint32_t stream, std::span<const Metric> values, const LogOptions& opts, Pending& out) noexcept;
  bool offer_close(std::uint32_t stream, Pending& out) noexcept;
  Pending define_metric(std::string_view key, Reduce reduce) noexcept;
  Pending define_metric(std::string_view key, const MetricOptions& opts) noexcept;
  Pending text(SlotKind kind, std::span<const Field> fields);
  /// Run::alert_when: the rule travels in the rank's stream to the run host.
  Pending alert_when(std::string_view key, AlertRule rule) noexcept;
  /// The events the run host tells this rank (the RankProxy delivers them).
  EventHub& events() noexcept { return events_; }
  Pending barrier(std::string_view name, std::chrono::milliseconds timeout) noexcept;
  /// Ends this rank as `opts` says (finished, failed with its exit code, or
  /// killed by its signal); the first call's options count.
  FinishPending finish(const FinishOptions& opts = {}) noexcept;
  /// Whether finish() was called (by the trainer or by endings.hpp).
  [[nodiscard]] bool finishing() const noexcept { return closed_.load(std::memory_order_relaxed); }
  /// Values refused before they reached the ring (a bad key, a value that is
  /// not a number, Python's too): they go to rejected.jsonl through the run
  /// host with `why`, counted in the run's `rejected`, and the first refusal
  /// of each key prints one warning. `step`: the call's explicit step.
  void record_refusal(std::optional<std::int64_t> step, const Error& why,
                      std::span<const RefusedValue> values) noexcept;
  /// The process exited with `status` after this rank's finish: its run host
  /// records the rank failed where `status` is not 0 (bounded: a host that
  /// is gone is not waited for).
  void report_exit(int status) noexcept;
  /// log_device (no `reduce`) and reduce_device (run_device.cpp). `host`:
  /// values already on the host, logged in the same call as the device
  /// values and so at the same step (the Python module's dict that mixes a
  /// CUDA tensor with numbers); a host value with a bad key is refused alone,
  /// as log() does. Not with `reduce`.
  Pending log_device(std::span<const DeviceMetric> values, CudaStream stream, const LogOptions& opts,
                     std::optional<Reduce> reduce, std::span<const Metric> host = {}) noexcept;
  Pending log_artifact(std::string_view name, std::string_view path, std::string_view type) noexcept;
  /// Run::log_histogram and Writer::log_histogram (run_kinds.cpp):
  /// `writer` says the call is a Writer's (whose stream 0 means it could
  /// not open); `same_step` puts the histogram at the step the stream's
  /// last call took, where `opts` gives none (the Python module's dict that
  /// mixes histograms with numbers).
  Pending log_histogram(std::uint32_t stream, bool writer, std::string_view key, std::unique_ptr<Histogram> h,
                        const LogOptions& opts, bool same_step = false) noexcept;
  /// Run::log_histogram's device overload (run_kinds.cpp): counted on the
  /// GPU (device_histogram.hpp), sent once the counts have landed.
  Pending log_histogram_device(std::uint32_t stream, bool writer, std::string_view key, const void* values,
                               std::size_t n, DeviceDtype dtype, CudaStream cuda_stream, const LogOptions& opts,
                               bool same_step = false) noexcept;
  /// Run::log_image, log_text and log_table (run_kinds.cpp): `job` is
  /// ready, failed (refused on this thread: nothing goes to the run but the
  /// refusal), or pending (pixels the MediaEncoder turns into a PNG).
  Pending log_media(std::uint32_t stream, bool writer, std::string_view key, std::unique_ptr<MediaJob> job,
                    const LogOptions& opts, bool same_step = false) noexcept;

  const core::Settings& settings() const noexcept { return settings_; }
  Ring& ring() noexcept { return ring_; }
  /// Where this run's stamps come from (the RankProxy converts them).
  LogClock clock() const noexcept { return clock_; }
  Channel& channel() noexcept { return channel_; }
  FinishState& finish_state() noexcept { return finish_; }
  std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }
  /// Whether this process is a fork of the one that made the run (a
  /// DataLoader worker, say). Only the forking thread lives on in the child:
  /// the actors, the RankProxy draining the ring and any lock holder are
  /// gone, so there every call is a no-op and the state is never freed.
  bool forked() const noexcept { return fork_count.load(std::memory_order_relaxed) != forks_at_start_; }
  /// The device capture, once a device call has made it (read by the RankProxy).
  DeviceCapture* device() const noexcept { return device_ptr_.load(std::memory_order_acquire); }
  /// The artifact copies in flight (the RankProxy holds the finish for them).
  ArtifactCopier& artifacts() noexcept { return artifacts_; }

  // Set by the actor layer as it starts the run (actors/system.hpp, start_system).
  std::string run_id;
  std::string run_dir;

private:
  /// Reserves n slots, as `room` says (reserve_slow waits or drops where the ring is full).
  [[gnu::always_inline]] bool reserve(std::uint32_t n, std::uint64_t& pos, Room room) noexcept {
    return ring_.try_reserve(n, pos) || reserve_slow(n, pos, room);
  }
  bool reserve_slow(std::uint32_t n, std::uint64_t& pos, Room room) noexcept;
  /// A log call's keys up to this many are interned into the stack.
  static constexpr std::size_t stack_ids = 32;
  /// `no_room` is set where R is Room::now and the call does not fit.
  template <bool ToWriter, Room R = Room::configured>
  [[gnu::always_inline]] Pending log_into(std::uint32_t stream, std::span<const Metric> values, const LogOptions& opts,
                                          bool* no_room = nullptr) noexcept;
  /// log_into's body, with room for the ids of the call's keys.
  template <bool ToWriter, Room R>
  [[gnu::always_inline]] Pending log_with(std::uint32_t stream, std::span<const Metric> values, const LogOptions& opts,
                                          bool* no_room, std::uint32_t* ids) noexcept;
  /// log()'s call of one value whose key is known, on a ring this thread
  /// owns with room: straight to its slot. Anything else (finished, a
  /// negative step, a key not yet known or refused, no room, a shared ring)
  /// is log_default's, which has every check and makes no change before them.
  [[gnu::always_inline]] Pending log_one(const Metric& value, const LogOptions& opts) noexcept;
  /// log() of the default stream, out of line.
  [[gnu::noinline]] Pending log_default(std::span<const Metric> values, const LogOptions& opts) noexcept;
  /// A call of more than stack_ids values: its ids on the heap, once a thread.
  template <bool ToWriter, Room R>
  [[gnu::cold, gnu::noinline]] Pending log_large(std::uint32_t stream, std::span<const Metric> values,
                                                 const LogOptions& opts, bool* no_room) noexcept;
  /// Takes a stream id for open_stream/offer_open: 0 when none is left (under streams_mu_).
  std::uint32_t take_stream_id() noexcept;
  /// open_stream and offer_open: false where `room` is Room::now and the open does not fit.
  bool open_stream_in(Room room, std::uint32_t& stream) noexcept;
  /// A writer's (or an actor's) call where no stream could open: `what` names it.
  Pending refuse_no_stream(const char* what) noexcept;
  /// close_stream and offer_close: false where `room` is Room::now and the close does not fit.
  bool close_stream_in(std::uint32_t stream, Room room, Pending& out) noexcept;
  Pending refuse(Error e) noexcept;
  Pending host_gone() noexcept;
  // Traces of values refused before the ring (refusals.cpp).
  /// Records `n` refused values (`values` lists them, or the first of them)
  /// and warns of their keys; false where `room` is Room::now and it did not fit.
  bool refuse_values(std::optional<std::int64_t> step, const Error& why, std::span<const RefusedValue> values,
                     std::size_t n, Room room) noexcept;
  /// The values of a log call whose key was refused (ids[i] is KeyTable::invalid), each with its own reason.
  [[gnu::cold, gnu::noinline]] void note_refused_keys(std::span<const Metric> values, const std::uint32_t* ids,
                                                     std::optional<std::int64_t> step, Room room) noexcept;
  /// Every value of a call refused whole, for `why`.
  [[gnu::cold, gnu::noinline]] void note_refused_call(std::span<const Metric> values, std::optional<std::int64_t> step,
                                                     const Error& why) noexcept;
  /// A log call refused whole (too many values, a step below 0): noted, and its ticket.
  Pending refuse_call(std::span<const Metric> values, const std::optional<std::int64_t>& step, Room room) noexcept;
  /// A call after finish: said once a process.
  [[gnu::cold, gnu::noinline]] void note_after_finish(const char* call) noexcept;
  /// Enqueues one control slot (define, barrier, config, summary, finish)
  /// that `fill` completes; force-reserved, as control never drops (under
  /// Room::now: `no_room` is set where it does not fit).
  template <class Fill>
  Pending push_control(SlotKind kind, Fill&& fill, Room room = Room::force, bool* no_room = nullptr) noexcept;
  /// One call of another kind (a histogram, an image, text, a table) into
  /// one slot that `fill` completes; `refused_json()` makes what
  /// rejected.jsonl shows of it, only where the call is refused here
  /// (run_kinds.cpp).
  template <class Describe, class Fill>
  Pending push_kind(SlotKind kind, std::uint32_t stream, bool writer, std::string_view key, const LogOptions& opts,
                    bool same_step, Describe&& refused_json, Fill&& fill) noexcept;
  /// Such a call refused on this thread: recorded for rejected.jsonl (and
  /// warned of once a key), and its ticket with `why`.
  Pending refuse_kind(std::string_view key, const LogOptions& opts, const Error& why, std::string refused_json) noexcept;
  MediaEncoder& media_encoder();
  /// Makes the device capture at the first device call (under device_mu_):
  /// the error that keeps this process from the GPU path, if any.
  Error make_device();
  /// Moves the rank's step as the run host will for a call that logs at
  /// `step` (automatic steps count calls), so log_artifact can name it.
  /// Approximate under concurrent calls (a plain load and store, to keep the
  /// hot path free of a second contended atomic): it only names the step
  /// log_artifact records.
  void note_step(const std::optional<std::int64_t>& step) noexcept {
    const std::int64_t last = step_.load(std::memory_order_relaxed);
    step_.store(step ? std::max(last, *step) : last + 1, std::memory_order_relaxed);
  }

  core::Settings settings_;
  const unsigned forks_at_start_ = fork_count.load(std::memory_order_relaxed);
  const LogClock clock_{LogClock::process_source()};
  Ring ring_;
  Channel channel_;
  FinishState finish_;
  EventHub events_;
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::int64_t> step_{-1}; // the rank's step; -1 before its first log call
  // Writer stream ids in use are 1..core::wire::max_streams; freed ids are reused.
  std::mutex streams_mu_;
  std::vector<std::uint32_t> free_streams_;
  std::uint32_t next_stream_ = 1;
  std::mutex finish_mu_;
  std::optional<FinishPending> finishing_;
  // The GPU path, made by the first device call. Declared before system_ so
  // that the actors (which read captures) stop first.
  std::mutex device_mu_;
  Error device_error_;
  std::unique_ptr<DeviceCapture> device_;
  std::atomic<DeviceCapture*> device_ptr_{nullptr};
  std::unique_ptr<DeviceReducer> reducer_;
  std::unordered_set<std::uint32_t> device_declared_; // keys reduce_device has declared first
  // Made by the first image from pixels; stopped in ~RunImpl before the
  // ring's leftover jobs are freed.
  std::mutex media_mu_;
  std::unique_ptr<MediaEncoder> media_encoder_;
  // After channel_, whose tickets it settles while it stops.
  ArtifactCopier artifacts_{channel_, settings_.opts.finish_timeout};
  std::string artifact_run_dir_; // run_dir, made absolute at start
  std::unique_ptr<System> system_;
};

/// What chorus's own code reaches behind a Run handle.
inline RunImpl* live(RunImpl* impl) noexcept;

/// The job of an image for RunImpl::log_media: pixels copied (floats to 8
/// bits) for the encoder, or a file's bytes checked and kept; failed with
/// why where refused; null where out of memory (run_kinds.cpp).
[[nodiscard]] std::unique_ptr<MediaJob> image_job(const Image& image) noexcept;
/// The jobs of text (markdown) and of a table (JSON), ready, or failed with
/// why (run_kinds.cpp).
[[nodiscard]] std::unique_ptr<MediaJob> text_job(std::string_view text) noexcept;
[[nodiscard]] std::unique_ptr<MediaJob> table_job(std::span<const std::string> columns,
                                                  std::span<const std::vector<Value>> rows) noexcept;

struct RunAccess {
  /// chorus::init, and <chorus/caf.hpp>'s init with the orchestrator's `actors`.
  [[nodiscard]] static Result<Run> start(const Options& opts, caf::actor_system* actors) noexcept;
  /// start() in the public API's form: the run, and the error beside it
  /// (an inactive handle where there is one).
  static Run init(const Options& opts, Error& error, caf::actor_system* actors) noexcept {
    Result<Run> run = start(opts, actors);
    error = run.error();
    return run ? std::move(*run) : Run();
  }
  static RunImpl* impl(const Run& run) noexcept { return run.impl_.get(); }
  /// A writer's run (null where inactive, or in a forked child) and stream id.
  static std::pair<RunImpl*, std::uint32_t> writer(const Writer& w) noexcept { return {live(w.impl_), w.id_}; }
  /// Takes the run out of its handle, which is then inactive.
  static std::unique_ptr<RunImpl> release(Run& run) noexcept { return std::move(run.impl_); }
};

/// The run behind a handle, or null where its calls are no-ops: an inactive
/// handle, or the copy a forked child inherited.
inline RunImpl* live(RunImpl* impl) noexcept { return impl && !impl->forked() ? impl : nullptr; }
inline RunImpl* live(const std::unique_ptr<RunImpl>& impl) noexcept { return live(impl.get()); }

template <class Fill>
Pending RunImpl::push_control(SlotKind kind, Fill&& fill, Room room, bool* no_room) noexcept {
  std::uint64_t pos;
  if (!reserve(1, pos, room)) {
    if (room != Room::now) return host_gone();
    *no_room = true;
    return {};
  }
  Slot& s = ring_.at(pos);
  s.kind = kind;
  s.count = 1;
  fill(s);
  ring_.publish(s, pos, clock_.now());
  channel_.wake();
  return Pending(&channel_, pos + 1, false);
}

} // namespace chorus::client
