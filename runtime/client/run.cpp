// Run: the trainer-facing handle. log() is the hot path: read a stamp, intern
// the keys (known ones without a lock), reserve slots with one CAS, fill and
// publish them.
#include "runtime/client/endings.hpp"
#include "runtime/client/run_impl.hpp"
#include "runtime/client/system.hpp"
#include "runtime/core/immortal.hpp"
#include "runtime/core/wire.hpp"

#include "io/platform/posix.hpp"
#include "io/store/artifacts.hpp"
#include "runtime/core/json.hpp"

#include <pthread.h>

#include <cmath>
#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

namespace chorus {
namespace client {

namespace {
/// The JSON of one config or summary call: a frame must fit a link (actors/links/link_framing.hpp).
constexpr std::size_t max_text_bytes = std::size_t{16} << 20;
void count_fork_in_child() { fork_count.fetch_add(1, std::memory_order_relaxed); }
} // namespace

std::atomic<unsigned> fork_count{0};

RunImpl::RunImpl(core::Settings settings) : settings_(std::move(settings)), ring_(settings_.opts.queue_capacity) {
  // Once per process: a fork's child must know that its inherited runs are not its own.
  static const int registered = ::pthread_atfork(nullptr, nullptr, count_fork_in_child);
  (void)registered;
}

RunImpl::~RunImpl() {
  endings::unwatch(*this);
  system_.reset();
  media_encoder_.reset(); // it may be encoding a job of the ring: stop it first
  // Texts still in the ring were never consumed: free them.
  for (std::uint64_t pos = ring_.tail(); pos < ring_.head(); ++pos) {
    Slot& s = ring_.at(pos);
    if (!ring_.published(s.ready.load(), pos)) continue;
    if (s.kind == SlotKind::config || s.kind == SlotKind::summary || s.kind == SlotKind::finish) delete s.text;
    if (s.kind == SlotKind::refused) delete s.refusal;
    if (s.kind == SlotKind::histogram) delete s.histogram;
    if (s.kind == SlotKind::media) delete s.media;
  }
}

namespace {
std::atomic<SystemFactory> the_system_factory{nullptr};
} // namespace

void set_system_factory(SystemFactory factory) noexcept { the_system_factory.store(factory); }
SystemFactory system_factory() noexcept { return the_system_factory.load(); }

Error RunImpl::start(caf::actor_system* actors) {
  const SystemFactory start_system = system_factory();
  if (start_system == nullptr)
    return {Errc::internal, "no actor layer is linked into this program, so no run can start: link chorus::chorus "
                            "(libchorus), not the runtime's parts alone"};
  Result<std::unique_ptr<System>> started = start_system(*this, actors);
  const Error err = started.error();
  if (started) {
    system_ = std::move(*started);
    endings::watch(*this);
    // Artifacts are copied later, whatever the current directory is then.
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::absolute(std::filesystem::path(run_dir), ec);
    artifact_run_dir_ = ec ? run_dir : dir.string();
  }
  return err;
}

Pending RunImpl::refuse(Error e) noexcept {
  try {
    return Pending(&channel_, channel_.immediate(std::move(e)), true);
  } catch (...) {
    return Pending(&channel_, immediate_bit, true);
  }
}

bool RunImpl::reserve_slow(std::uint32_t n, std::uint64_t& pos, Room room) noexcept {
  if (ring_.try_reserve(n, pos)) return true;
  if (room == Room::now) return false;
  if (room == Room::configured && settings_.opts.overflow == Overflow::drop_newest) {
    dropped_.fetch_add(n, std::memory_order_relaxed);
    return false;
  }
  // Overflow::block: wait for the RankProxy to drain, spinning briefly, then
  // yielding, then asleep until it frees slots (at most a millisecond at a
  // time: a proxy that parked is woken again); give up only if the run host
  // is gone.
  for (unsigned i = 0;; ++i) {
    if (i % 256 == 0) channel_.nudge();
    if (i < 64) {
      cpu_pause();
    } else if (i < 128) {
      std::this_thread::yield();
    } else {
      channel_.wake();
      ring_.wait_for_room(n, std::chrono::milliseconds(1));
    }
    if (ring_.try_reserve(n, pos)) return true;
    if (channel_.failed()) return false;
  }
}

Pending RunImpl::host_gone() noexcept {
  try {
    return refuse({Errc::host_lost, channel_.failure().message() +
                                        " (this process's queue is full: the call was refused at once)"});
  } catch (...) {
    return refuse({});
  }
}

Error partly_logged(std::string_view bad_key, std::size_t logged) {
  Error e = validate_metric_key(bad_key);
  const std::string rest = logged == 1 ? "the call's one valid value was logged"
                                       : "the call's " + std::to_string(logged) + " valid values were logged";
  return Error(e.code(), e.message() + " (" + rest + ")");
}


// One body for both streams, compiled twice and inlined into each caller:
// the default stream's hot path keeps none of a writer's branches, nor a call
// more than it had.
template <bool ToWriter, Room R>
[[gnu::always_inline]] inline Pending RunImpl::log_into(std::uint32_t stream, std::span<const Metric> values,
                                                        const LogOptions& opts, bool* no_room) noexcept {
  if (closed_.load(std::memory_order_relaxed)) {
    note_after_finish("log");
    return refuse({Errc::finished, "log after finish: this run has finished and takes no more values; log before "
                                   "calling finish()"});
  }
  const std::size_t n = values.size();
  if (n == 0) return {};
  if (n > max_values_per_call || n > ring_.capacity() || (opts.step && *opts.step < 0)) [[unlikely]]
    return refuse_call(values, opts.step, R);

  if (n > stack_ids) [[unlikely]]
    return log_large<ToWriter, R>(stream, values, opts, no_room);
  std::uint32_t ids[stack_ids];
  return log_with<ToWriter, R>(stream, values, opts, no_room, ids);
}

template <bool ToWriter, Room R>
[[gnu::cold, gnu::noinline]] Pending RunImpl::log_large(std::uint32_t stream, std::span<const Metric> values,
                                                        const LogOptions& opts, bool* no_room) noexcept {
  thread_local std::vector<std::uint32_t> heap_ids;
  try {
    heap_ids.resize(values.size());
  } catch (...) {
    return refuse({Errc::internal, "out of memory"});
  }
  return log_with<ToWriter, R>(stream, values, opts, no_room, heap_ids.data());
}

template <bool ToWriter, Room R>
[[gnu::always_inline]] inline Pending RunImpl::log_with(std::uint32_t stream, std::span<const Metric> values,
                                                        const LogOptions& opts, bool* no_room,
                                                        std::uint32_t* ids) noexcept {
  // Read first: the counter's read overlaps the work below.
  const std::uint64_t stamp = clock_.now();
  const std::size_t n = values.size();
  const std::uint32_t good = KeyTable::intern_metrics(values, ids);
  std::size_t first_bad = n;
  if (good != n) [[unlikely]] {
    first_bad = static_cast<std::size_t>(std::find(ids, ids + n, KeyTable::invalid) - ids);
    if (good == 0) {
      note_refused_keys(values, ids, opts.step, R);
      return refuse(validate_metric_key(values[first_bad].key));
    }
  }

  // A writer's call starts with a slot that names its stream (SlotKind::stream_head).
  constexpr std::uint32_t head = ToWriter ? 1 : 0;
  std::uint64_t pos;
  if (!reserve(good + head, pos, R)) {
    if constexpr (R == Room::now) {
      if (!channel_.failed()) {
        *no_room = true;
        return {};
      }
    }
    return channel_.failed() ? host_gone() : Pending(&channel_, immediate_bit, false);
  }
  const std::int64_t step = opts.step ? *opts.step : core::wire::auto_step;
  if (!ToWriter || opts.step) note_step(opts.step); // a writer's automatic steps are its own
  if constexpr (ToWriter) {
    Slot& s = ring_.at(pos);
    s.key = stream;
    s.kind = SlotKind::stream_head;
    s.count = static_cast<std::uint16_t>(good);
    s.step = step;
    ring_.publish(s, pos, stamp);
  }
  // The head slot carries the call's count, step and stamp; a value slot
  // only its key and value (the RankProxy reads the rest from the head).
  // Each slot asks for the one `prefetch_ahead` further on, so that the next
  // calls find their slots in this core's cache.
  std::uint32_t j = head;
  for (std::size_t i = 0; i < n; ++i) {
    if (ids[i] == KeyTable::invalid) continue;
    Slot& s = ring_.at(pos + j);
    ring_.prefetch(pos + j + prefetch_ahead);
    s.key = ids[i];
    s.value = values[i].value;
    if (!ToWriter && j == 0) {
      s.kind = SlotKind::values_head;
      s.count = static_cast<std::uint16_t>(good);
      s.step = step;
      ring_.publish(s, pos, stamp);
    } else {
      s.kind = SlotKind::value;
      ring_.publish(s, pos + j);
    }
    ++j;
  }
  channel_.wake();
  const std::uint64_t seq = pos + head + good;
  if (first_bad != n) [[unlikely]] {
    note_refused_keys(values, ids, opts.step, R); // after the values: a call that did not fit is not noted twice
    try {
      // good >= 1 here: a call with no valid key was refused whole above.
      channel_.set_error(seq, partly_logged(values[first_bad].key, good));
    } catch (...) {
    }
    return Pending(&channel_, seq, true);
  }
  return Pending(&channel_, seq, false);
}

Pending RunImpl::log_default(std::span<const Metric> values, const LogOptions& opts) noexcept {
  return log_into<false>(0, values, opts);
}

[[gnu::always_inline]] inline Pending RunImpl::log_one(const Metric& value, const LogOptions& opts) noexcept {
  const std::uint64_t stamp = clock_.now();
  std::uint64_t hash;
  std::uint32_t id;
  std::uint64_t pos;
  if (closed_.load(std::memory_order_relaxed) || (opts.step && *opts.step < 0) ||
      !KeyTable::known_metric(value.key, hash, id) || id == KeyTable::invalid || !ring_.try_reserve_owned(1, pos))
      [[unlikely]]
    return log_default({&value, 1}, opts);
  // As log_with's first slot, for a call of one value.
  Slot& s = ring_.at(pos);
  ring_.prefetch(pos + prefetch_ahead);
  s.key = id;
  s.value = value.value;
  s.kind = SlotKind::values_head;
  s.count = 1;
  s.step = opts.step ? *opts.step : core::wire::auto_step;
  note_step(opts.step);
  ring_.publish(s, pos, stamp);
  channel_.wake();
  return Pending(&channel_, pos + 1, false);
}

Pending RunImpl::log(std::span<const Metric> values, const LogOptions& opts) noexcept {
  if (values.size() == 1) [[likely]]
    return log_one(values[0], opts);
  return log_default(values, opts);
}

std::uint32_t RunImpl::take_stream_id() noexcept {
  if (!free_streams_.empty()) {
    const std::uint32_t id = free_streams_.back();
    free_streams_.pop_back();
    return id;
  }
  return next_stream_ <= core::wire::max_streams ? next_stream_++ : 0;
}

std::uint32_t RunImpl::open_stream() noexcept {
  std::uint32_t id = 0;
  (void)open_stream_in(Room::force, id);
  return id;
}

bool RunImpl::offer_open(std::uint32_t& stream) noexcept { return open_stream_in(Room::now, stream); }

bool RunImpl::open_stream_in(Room room, std::uint32_t& stream) noexcept {
  stream = 0;
  if (closed_.load(std::memory_order_relaxed)) return true; // its calls say the run finished
  std::lock_guard lock(streams_mu_);
  const std::uint32_t id = take_stream_id();
  if (id == 0) return true; // its calls say no stream is left
  // Pushed under the lock: an id freed by a close is reopened only after that close in the ring.
  bool no_room = false;
  (void)push_control(SlotKind::stream_open, [&](Slot& s) { s.key = id; }, room, &no_room);
  if (no_room) {
    try {
      free_streams_.push_back(id);
    } catch (...) {
      // Out of memory: the id stays used, one fewer writer can open.
    }
    return false;
  }
  stream = id;
  return true;
}

Pending RunImpl::refuse_no_stream(const char* what) noexcept {
  try {
    return refuse({Errc::invalid_argument,
                   std::string(what) + " could not open: " + std::to_string(core::wire::max_streams) +
                       " writers of this process are open at once, the most a rank may have; close() the writers "
                       "of producers that are done (or let them go out of scope), and let actors that are done "
                       "logging leave"});
  } catch (...) {
    return refuse({});
  }
}

Pending RunImpl::log_stream(std::uint32_t stream, std::span<const Metric> values, const LogOptions& opts) noexcept {
  if (stream == 0 && !closed_.load(std::memory_order_relaxed)) {
    Pending p = refuse_no_stream("this writer");
    note_refused_call(values, opts.step, p.await_resume());
    return p;
  }
  return log_into<true>(stream, values, opts); // stream 0 here only after finish, which it reports
}

Pending RunImpl::refuse_call(std::span<const Metric> values, const std::optional<std::int64_t>& step, Room room) noexcept {
  const std::size_t n = values.size();
  Error why;
  try {
    if (step && *step < 0)
      why = Error(Errc::invalid_argument, "step " + std::to_string(*step) + " is negative: steps start at 0");
    else
      why = Error(Errc::invalid_argument, "log of " + std::to_string(n) + " values in one call: at most " +
                                              std::to_string(std::min(max_values_per_call, ring_.capacity())) +
                                              " fit; split the call or raise Options::queue_capacity");
  } catch (...) {
    return refuse({});
  }
  if (room == Room::now) {
    // The RankProxy's own call: no wait for room (the refusal then has the warning alone).
    std::vector<RefusedValue> none;
    (void)refuse_values(step, why, none, n, Room::now);
  } else {
    note_refused_call(values, step, why);
  }
  return refuse(std::move(why));
}

bool RunImpl::offer_log(std::uint32_t stream, std::span<const Metric> values, const LogOptions& opts,
                        Pending& out) noexcept {
  if (stream == 0 && !closed_.load(std::memory_order_relaxed)) {
    out = refuse_no_stream("this actor's stream");
    std::vector<RefusedValue> none;
    (void)refuse_values(opts.step, out.await_resume(), none, values.size(), Room::now);
    return true;
  }
  bool no_room = false;
  out = log_into<true, Room::now>(stream, values, opts, &no_room);
  return !no_room;
}

Pending RunImpl::close_stream(std::uint32_t stream) noexcept {
  Pending p;
  (void)close_stream_in(stream, Room::force, p);
  return p;
}

bool RunImpl::offer_close(std::uint32_t stream, Pending& out) noexcept { return close_stream_in(stream, Room::now, out); }

bool RunImpl::close_stream_in(std::uint32_t stream, Room room, Pending& out) noexcept {
  out = {};
  if (stream == 0) return true;
  std::lock_guard lock(streams_mu_);
  // After finish the run ends every stream: nothing more goes into the ring.
  if (!closed_.load(std::memory_order_relaxed)) {
    bool no_room = false;
    out = push_control(SlotKind::stream_close, [&](Slot& s) { s.key = stream; }, room, &no_room);
    if (no_room) return false;
  }
  try {
    free_streams_.push_back(stream);
  } catch (...) {
    // Out of memory: the id stays used, one fewer writer can open.
  }
  return true;
}

Pending RunImpl::define_metric(std::string_view key, Reduce reduce) noexcept {
  MetricOptions opts;
  opts.reduce = reduce;
  return define_metric(key, opts);
}

Pending RunImpl::define_metric(std::string_view key, const MetricOptions& opts) noexcept {
  if (closed_.load(std::memory_order_relaxed))
    return refuse({Errc::finished, "define_metric after finish: define metrics before calling finish()"});
  const std::uint32_t id = KeyTable::instance().intern_metric(key);
  if (id == KeyTable::invalid) return refuse(validate_metric_key(key));
  if (opts.reduce && !core::wire::known(*opts.reduce))
    return refuse({Errc::invalid_argument, "unknown Reduce value " + std::to_string(static_cast<int>(*opts.reduce)) +
                                               ": use none, mean, sum, min, max, first or merge (histograms)"});
  if (opts.summary && !core::wire::known(*opts.summary))
    return refuse({Errc::invalid_argument, "unknown Summary value " + std::to_string(static_cast<int>(*opts.summary)) +
                                               ": use last, min, max or mean"});
  std::uint32_t step_id = core::wire::no_step_metric;
  if (!opts.step_metric.empty()) {
    step_id = KeyTable::instance().intern_metric(opts.step_metric);
    if (step_id == KeyTable::invalid) {
      const Error e = validate_metric_key(opts.step_metric);
      return refuse({e.code(), "define_metric(" + quoted(key) + ")'s step_metric: " + e.message()});
    }
  }
  Pending p;
  if (opts.reduce)
    p = push_control(SlotKind::define, [&](Slot& s) {
      s.key = id;
      s.reduce = *opts.reduce;
    });
  if (opts.summary || step_id != core::wire::no_step_metric)
    p = push_control(SlotKind::metric_view, [&](Slot& s) {
      s.key = id;
      s.count = opts.summary ? static_cast<std::uint16_t>(*opts.summary) : core::wire::unchanged_summary;
      s.step = step_id == core::wire::no_step_metric ? std::int64_t{-1} : std::int64_t{step_id};
    });
  return p;
}

Pending RunImpl::alert_when(std::string_view key, AlertRule rule) noexcept {
  if (closed_.load(std::memory_order_relaxed))
    return refuse({Errc::finished, "alert_when after finish: declare rules before calling finish()"});
  const std::uint32_t id = KeyTable::instance().intern_metric(key);
  if (id == KeyTable::invalid) return refuse(validate_metric_key(key));
  const auto kind = static_cast<std::uint8_t>(rule.kind);
  if (kind < 1 || kind > 3)
    return refuse({Errc::invalid_argument, "alert_when(" + quoted(key) + ") has an unknown rule kind " +
                                               std::to_string(kind) + ": use chorus::above, below or no_change"});
  if (!std::isfinite(rule.limit))
    return refuse({Errc::invalid_argument, "alert_when(" + quoted(key) + ")'s bound is not a finite number: give "
                                           "chorus::above(x) or below(x) a finite x"});
  if (rule.kind == AlertRule::Kind::no_change && !(rule.limit > 0))
    return refuse({Errc::invalid_argument, "alert_when(" + quoted(key) + ", chorus::no_change(...)) needs a time "
                                           "above 0 seconds"});
  return push_control(SlotKind::alert_rule, [&](Slot& s) {
    s.key = id;
    s.count = kind;
    s.value = rule.limit;
  });
}

Pending RunImpl::text(SlotKind kind, std::span<const Field> fields) {
  const char* what = kind == SlotKind::config ? "config" : "summary";
  if (closed_.load(std::memory_order_relaxed))
    return refuse({Errc::finished, std::string(what) + " after finish: set it before calling finish()"});
  for (const Field& f : fields)
    if (f.key.empty() || !core::valid_utf8(f.key))
      return refuse({Errc::invalid_key, std::string(what) + " key " + quoted(f.key) +
                                            " is empty or not UTF-8: use a non-empty UTF-8 key"});
  auto json = std::make_unique<std::string>(core::fields_to_json(fields));
  if (json->size() > max_text_bytes)
    return refuse({Errc::invalid_argument, std::string(what) + " of " + std::to_string(json->size() >> 20) +
                                               " MiB is over the 16 MiB a call takes: split it over several calls, "
                                               "or log large objects as artifacts (log_artifact)"});
  return push_control(kind, [&](Slot& s) { s.text = json.release(); }); // the RankProxy frees it
}

Pending RunImpl::barrier(std::string_view name, std::chrono::milliseconds timeout) noexcept {
  if (closed_.load(std::memory_order_relaxed))
    return refuse({Errc::finished, "barrier after finish: reach barriers before calling finish()"});
  if (name.empty() || name.size() > KeyTable::max_key_bytes || !core::valid_utf8(name))
    return refuse({Errc::invalid_argument, "barrier name must be non-empty UTF-8 of at most 250 bytes, such as "
                                           "\"epoch-3\""});
  if (timeout.count() < 0) return refuse({Errc::invalid_argument, "barrier timeout is negative"});
  std::uint32_t id;
  try {
    id = KeyTable::instance().intern(name);
  } catch (...) {
    return refuse({Errc::internal, "out of memory"});
  }
  return push_control(SlotKind::barrier, [&](Slot& s) {
    s.key = id;
    s.step = timeout.count() > 0 ? timeout.count() : settings_.opts.barrier_timeout.count();
  });
}

Pending RunImpl::log_artifact(std::string_view name, std::string_view path, std::string_view type) noexcept {
  try {
    if (Error e = store::validate_artifact_name(name)) return refuse(std::move(e));
    if (type.empty() || type.size() > KeyTable::max_key_bytes || !core::valid_utf8(type))
      return refuse({Errc::invalid_argument,
                     std::string("artifact type ")
                         .append(quoted(type))
                         .append(" must be non-empty UTF-8 of at most 250 bytes, such as \"model\" or \"file\"")});
    if (path.empty())
      return refuse({Errc::invalid_argument, "log_artifact without a source path: pass the file to copy, such as "
                                             "\"/tmp/ckpt/model.pt\""});
    ArtifactCopier::Job job;
    job.name = name;
    job.type = type;
    // Made absolute now: the copy starts later, and the trainer may change directory meanwhile.
    std::error_code ec;
    const std::filesystem::path source = std::filesystem::absolute(std::filesystem::path(path), ec);
    job.source = ec ? std::string(path) : source.string();
    job.run_dir = artifact_run_dir_;
    job.rank = settings_.topo.rank;
    job.step = step_.load(std::memory_order_relaxed);
    job.ts_us = platform::unix_now_us();
    job.check_here = !settings_.is_host;
    return artifacts_.push(std::move(job));
  } catch (...) {
    return refuse({Errc::internal, "out of memory, or no thread could be started for the artifact copy"});
  }
}

FinishPending RunImpl::finish(const FinishOptions& opts) noexcept {
  std::lock_guard lock(finish_mu_);
  if (finishing_) return *finishing_;
  closed_.store(true, std::memory_order_relaxed);
  // Copies queued before this still run: the RankProxy holds the finish for them.
  artifacts_.close();
  const RunState state = opts.signal != 0 ? RunState::killed : opts.exit_code != 0 ? RunState::failed : RunState::finished;
  std::string* why = nullptr;
  if (state != RunState::finished && !opts.message.empty()) {
    try {
      why = new std::string(opts.message.substr(0, core::wire::max_end_message));
    } catch (...) {
      // Out of memory: the rank still ends as it should, without its message.
    }
  }
  finishing_.emplace(push_control(SlotKind::finish,
                                  [&](Slot& s) {
                                    s.count = static_cast<std::uint16_t>(state);
                                    s.step = state == RunState::killed ? opts.signal : opts.exit_code;
                                    s.text = why;
                                  }),
                     &finish_);
  channel_.nudge();
  return *finishing_;
}

void RunImpl::report_exit(int status) noexcept {
  if (status == 0 || forked() || !system_) return;
  system_->report_exit(status);
}

Result<Run> RunAccess::start(const Options& opts, caf::actor_system* actors) noexcept {
  try {
    Result<core::Settings> resolved = core::resolve(opts, core::process_env());
    if (!resolved) return resolved.error();
    core::Settings& s = *resolved;
    if (!s.active) {
      // Logs nothing, but knows where this process sits.
      Run inactive;
      inactive.inactive_topology_ = std::make_unique<const Topology>(s.topo);
      return inactive;
    }
    auto impl = std::make_unique<RunImpl>(std::move(s));
    if (Error e = impl->start(actors)) return e;
    std::vector<Field> config;
    for (const auto& [k, v] : impl->settings().opts.config) config.push_back(Field{k, v});
    if (!config.empty()) (void)impl->text(SlotKind::config, config);
    return Run(std::move(impl));
  } catch (const std::exception& e) {
    return Error(Errc::internal, std::string("init failed: ") + e.what());
  }
}

} // namespace client

// ---------------------------------------------------------------------------
// Run

namespace {

/// Ends the run a handle holds, bounded by finish_timeout. A forked child's
/// copy is let go unfreed instead: freeing it would join actor threads that
/// do not exist in the child, and its finish belongs to the parent. A handle
/// destroyed by an exception's unwinding ends its rank failed.
void close(std::unique_ptr<client::RunImpl>& impl, bool unwinding = false) noexcept {
  if (!impl) return;
  if (impl->forked()) {
    (void)impl.release();
    return;
  }
  FinishOptions opts;
  if (unwinding) {
    opts.exit_code = 1;
    opts.message = "an exception left the scope of the chorus::Run (it was destroyed while the stack unwound)";
  }
  (void)impl->finish(opts).wait();
  impl.reset();
}

} // namespace

Run::Run() noexcept = default;
Run::Run(std::unique_ptr<client::RunImpl> impl) noexcept : impl_(std::move(impl)) {}
Run::Run(Run&&) noexcept = default;
Run& Run::operator=(Run&& o) noexcept {
  if (this != &o) {
    close(impl_);
    impl_ = std::move(o.impl_);
    inactive_topology_ = std::move(o.inactive_topology_);
  }
  return *this;
}
Run::~Run() { close(impl_, std::uncaught_exceptions() > uncaught_at_start_); }

Run::operator bool() const noexcept { return client::live(impl_) != nullptr; }

Pending Run::log(std::span<const Metric> values, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log(values, opts) : Pending{};
}
Writer Run::writer() noexcept {
  auto* impl = client::live(impl_);
  return impl ? Writer(impl, impl->open_stream()) : Writer{};
}
Pending Writer::log(std::span<const Metric> values, const LogOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_stream(id_, values, opts) : Pending{};
}
Pending Writer::close() noexcept {
  auto* impl = client::live(std::exchange(impl_, nullptr));
  return impl ? impl->close_stream(std::exchange(id_, 0)) : Pending{};
}
Pending Run::define_metric(std::string_view key, Reduce reduce) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->define_metric(key, reduce) : Pending{};
}
Pending Run::define_metric(std::string_view key, const MetricOptions& opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->define_metric(key, opts) : Pending{};
}
Pending Run::alert_when(std::string_view key, AlertRule rule) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->alert_when(key, rule) : Pending{};
}
void Run::on_event(std::function<void(const Event&)> fn, Executor& executor) {
  if (auto* impl = client::live(impl_)) impl->events().on_event(std::move(fn), executor);
}
EventPending Run::next_event() noexcept {
  auto* impl = client::live(impl_);
  return EventPending(impl ? &impl->events() : nullptr);
}
Pending Run::config(std::span<const Field> fields) {
  auto* impl = client::live(impl_);
  return impl ? impl->text(client::SlotKind::config, fields) : Pending{};
}
Pending Run::summary(std::span<const Field> fields) {
  auto* impl = client::live(impl_);
  return impl ? impl->text(client::SlotKind::summary, fields) : Pending{};
}
Pending Run::barrier(std::string_view name, std::chrono::milliseconds timeout) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->barrier(name, timeout) : Pending{};
}
Pending Run::log_artifact(std::string_view name, std::string_view path, std::string_view type) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->log_artifact(name, path, type) : Pending{};
}
FinishPending Run::finish(FinishOptions opts) noexcept {
  auto* impl = client::live(impl_);
  return impl ? impl->finish(opts) : FinishPending{};
}

const Topology& Run::topology() const noexcept {
  if (impl_) return impl_->settings().topo;
  if (inactive_topology_) return *inactive_topology_;
  // A handle init did not make: the launcher's view of this process.
  static const core::Immortal<Topology> detected([] {
    Error ignored;
    Topology t = detect_topology(ignored);
    return ignored ? Topology{} : t;
  }());
  return *detected;
}
std::string_view Run::id() const noexcept { return impl_ ? std::string_view(impl_->run_id) : std::string_view(); }
std::string_view Run::dir() const noexcept { return impl_ ? std::string_view(impl_->run_dir) : std::string_view(); }
bool Run::is_host() const noexcept { return impl_ && impl_->settings().is_host; }
std::uint64_t Run::dropped() const noexcept { return impl_ ? impl_->dropped() : 0; }

Run init(const Options& opts, Error& error) noexcept { return client::RunAccess::init(opts, error, nullptr); }

Run init(const Options& opts) {
  Error error;
  Run run = init(opts, error);
  if (error) throw InitError(std::move(error));
  return run;
}

} // namespace chorus
