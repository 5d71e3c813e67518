// chorus — experiment tracking for distributed training, from C++.
//
// One header, one page: every type a trainer touches is declared here. It
// includes no CAF, Asio or CUDA header; the Asio interop lives in
// <chorus/asio.hpp>, and the coroutine plumbing (chorus::task, sync_wait)
// in <chorus/task.hpp>, which this header includes.
//
//   chorus::Options opt;
//   opt.project = "mnist";
//   opt.mode = chorus::Mode::shared;
//   chorus::Run run = chorus::init(opt);
//   run.define_metric("loss", chorus::Reduce::mean);
//   run.log({{"loss", l}, {"lr", lr}});          // non-blocking ticket
//   co_await run.log({{"acc", a}});               // durably committed
//   chorus::Writer w = run.writer();              // a producer thread's own ordered steps
//   w.log({{"tokens", n}}, {.step = s});
//   co_await run.barrier("epoch-3");
//   co_await run.log_artifact("model.pt", "/tmp/ckpt/model.pt", "model");  // copied, hashed, listed
//   chorus::FinishResult r = co_await run.finish();
#pragma once

#include <chorus/export.hpp>
#include <chorus/task.hpp>

#include <chrono>
#include <coroutine>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace chorus {

namespace core {
struct HistogramAccess; // runtime/core/histogram.hpp
} // namespace core

// ---------------------------------------------------------------------------
// Settings

/// How the ranks of a job map onto runs (Flyte's run_mode: auto|shared|new).
enum class Mode { automatic, shared, per_rank };
/// Which ranks a run spans (Flyte's rank_scope: global|worker).
enum class Scope { global, node };
/// Cross-rank reduction of a metric at each step. A declared key is one
/// column, `key`, with `_count`; an undeclared one (or `none`) is a column per
/// rank, `key/rank-N`, in a run of several ranks. `first` takes the value of
/// the lowest-numbered rank that logged the key at the step: how a value that
/// one rank logs (say rank 0's learning rate) keeps its plain name. `merge`
/// is for histograms (`Run::log_histogram`): the exact merge of the ranks'
/// histograms at the step; a key declared so takes no scalars. A histogram
/// key declared `sum`, `mean`, `min` or `max` is merged too; `first` keeps
/// the lowest rank's histogram.
enum class Reduce : std::uint8_t { none, mean, sum, min, max, first, merge };
/// What a metric's value in the run's summary is (summary.json, `chorus
/// show`): its last committed value (the default), or its smallest, largest
/// or mean value over the run's committed rows, NaN left out (W&B's
/// `define_metric(summary=...)`).
enum class Summary : std::uint8_t { last, min, max, mean };
/// What `Run::log` does when its queue is full.
enum class Overflow { block, drop_newest };

/// The final or current state of a run, or of one rank in it.
/// `inactive`: what an inactive handle's finish says (it logs into no run).
enum class RunState { running, finished, failed, crashed, killed, inactive };

/// What a run id that names an existing run means (W&B's words): `never`
/// refuses it (the default: two jobs given one id by mistake never mix),
/// `allow` continues that run or starts a new one, `must` continues it and
/// refuses to start afresh. A continued run appends after its last committed
/// step (see README, "Resuming a run").
enum class Resume { never, allow, must };

CHORUS_API std::string_view to_string(Mode) noexcept;
CHORUS_API std::string_view to_string(Scope) noexcept;
CHORUS_API std::string_view to_string(Reduce) noexcept;
CHORUS_API std::string_view to_string(Summary) noexcept;
CHORUS_API std::string_view to_string(RunState) noexcept;
CHORUS_API std::string_view to_string(Resume) noexcept;

// ---------------------------------------------------------------------------
// Errors are values.

enum class Errc : std::uint8_t {
  ok = 0,
  invalid_argument,  // a bad option value or call argument
  invalid_key,       // empty, too long, non-UTF-8 or reserved metric key
  bad_environment,   // a malformed or contradictory environment variable
  backwards_step,    // a step lower than its stream's last one (the rank's run.log, or a Writer)
  step_committed,    // a step at or below what a barrier already committed
  dropped,           // the queue was full under Overflow::drop_newest
  finished,          // the run has finished: nothing more is taken
  connect_failed,    // the run host could not be reached within init_timeout
  address_in_use,    // the run host could not listen on its port
  barrier_timeout,   // not every live rank reached the barrier in time
  barrier_mismatch,  // ranks reached barriers with different names
  host_lost,         // the run host went away
  timeout,           // a bounded wait ran out
  io_error,          // the run directory could not be written
  internal,          // a bug in chorus: please report it
  upload_incomplete, // finish left part of the upload in the run directory for `chorus sync`
};

CHORUS_API std::string_view to_string(Errc) noexcept;

/// An error code and a message that names the cause and the fix.
class CHORUS_API Error {
public:
  Error() noexcept = default;
  Error(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

  [[nodiscard]] Errc code() const noexcept { return code_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }
  explicit operator bool() const noexcept { return code_ != Errc::ok; }

private:
  Errc code_ = Errc::ok;
  std::string message_;
};

/// Thrown by the throwing form of `init` only.
class CHORUS_API InitError : public std::runtime_error {
public:
  explicit InitError(Error e) : std::runtime_error(e.message()), error_(std::move(e)) {}
  [[nodiscard]] const Error& error() const noexcept { return error_; }

private:
  Error error_;
};

// ---------------------------------------------------------------------------
// Values

/// One scalar for `Run::log`. Trivially destructible on purpose: braced lists
/// of metrics may live across a `co_await`.
struct Metric {
  std::string_view key;
  double value;
};
static_assert(std::is_trivially_destructible_v<Metric>);

/// A float that lives in GPU memory, for `Run::log_device` and
/// `Run::reduce_device`. `value` is a device (or managed) pointer.
struct DeviceMetric {
  std::string_view key;
  const float* value;
};
static_assert(std::is_trivially_destructible_v<DeviceMetric>);

/// A `cudaStream_t`, without CUDA's headers: the stream that computes the
/// values (a cudaStream_t converts to it); nullptr is the legacy default stream.
using CudaStream = void*;

/// The element type of values in GPU memory for `Run::log_histogram`.
enum class DeviceDtype : std::uint8_t { float32 = 0, float16 = 1, bfloat16 = 2 };

namespace detail {
/// A braced list of up to 16 entries, `run.log({{"loss", l}, {"lr", lr}})`,
/// held inline. It stands in for std::initializer_list on purpose: GCC 12
/// cannot keep an initializer_list's array alive across a `co_await` ("array
/// used as initializer"), while this is a plain trivially destructible
/// object. For more values, pass a span (a vector or array you refill).
/// One constructor per length: a call writes the entries it has and no
/// more (a list of one value is 24 bytes on the caller's stack, not 384).
template <class T>
class BracedList {
public:
  static constexpr std::size_t capacity = 16;
  BracedList(T m0) noexcept { fill(m0); }
  BracedList(T m0, T m1) noexcept { fill(m0, m1); }
  BracedList(T m0, T m1, T m2) noexcept { fill(m0, m1, m2); }
  BracedList(T m0, T m1, T m2, T m3) noexcept { fill(m0, m1, m2, m3); }
  BracedList(T m0, T m1, T m2, T m3, T m4) noexcept { fill(m0, m1, m2, m3, m4); }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5) noexcept { fill(m0, m1, m2, m3, m4, m5); }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6) noexcept { fill(m0, m1, m2, m3, m4, m5, m6); }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7) noexcept { fill(m0, m1, m2, m3, m4, m5, m6, m7); }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7, T m8) noexcept {
    fill(m0, m1, m2, m3, m4, m5, m6, m7, m8);
  }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7, T m8, T m9) noexcept {
    fill(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9);
  }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7, T m8, T m9, T m10) noexcept {
    fill(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10);
  }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7, T m8, T m9, T m10, T m11) noexcept {
    fill(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11);
  }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7, T m8, T m9, T m10, T m11, T m12) noexcept {
    fill(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12);
  }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7, T m8, T m9, T m10, T m11, T m12, T m13) noexcept {
    fill(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13);
  }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7, T m8, T m9, T m10, T m11, T m12, T m13, T m14) noexcept {
    fill(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14);
  }
  BracedList(T m0, T m1, T m2, T m3, T m4, T m5, T m6, T m7, T m8, T m9, T m10, T m11, T m12, T m13, T m14,
             T m15) noexcept {
    fill(m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15);
  }
  operator std::span<const T>() const noexcept { return {items_, size_}; }

private:
  template <class... M>
  void fill(M... m) noexcept {
    std::size_t i = 0;
    ((items_[i++] = m), ...);
    size_ = sizeof...(M);
  }
  union { // left unwritten past size_
    T items_[capacity];
  };
  std::size_t size_;
};
} // namespace detail

/// `run.log({{"loss", l}, {"lr", lr}})`: up to 16 host values.
using Metrics = detail::BracedList<Metric>;
/// `run.log_device({{"loss", d_loss}, {"gnorm", d_gnorm}}, stream)`: up to 16 device values.
using DeviceMetrics = detail::BracedList<DeviceMetric>;
static_assert(std::is_trivially_destructible_v<Metrics> && std::is_trivially_destructible_v<DeviceMetrics>);

/// A config or summary value: null, bool, integer, number or string.
class CHORUS_API Value {
public:
  Value() noexcept = default;
  Value(bool b) noexcept : v_(b) {}
  template <class I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool>)
  Value(I i) noexcept : v_(static_cast<std::int64_t>(i)) {}
  Value(double d) noexcept : v_(d) {}
  Value(float f) noexcept : v_(static_cast<double>(f)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(std::string s) : v_(std::move(s)) {}

  using variant_type = std::variant<std::monostate, bool, std::int64_t, double, std::string>;
  [[nodiscard]] const variant_type& get() const noexcept { return v_; }

private:
  variant_type v_;
};

/// A distribution of values in chorus's one bucket layout, the same on every
/// rank and step, so that histograms merge by adding counts, exactly
/// (README, "Histograms"). A finite value x with 2^-126 <= |x| lands in the
/// bucket of its sign, its binary exponent e and the 7 bits of its
/// significand after the leading one: [2^e (1 + m/128), 2^e (1 + (m+1)/128))
/// for x > 0 (mirrored for x < 0), so a bucket is 1/128 of its lower bound
/// wide; |x| < 2^-126 (zero, and values too small for a float) lands in the
/// zero bucket. NaN, +Inf and -Inf are counted apart and never reach sum,
/// min or max. count, min and max are exact, sum is taken in double;
/// quantiles are within `relative_error` of the value they estimate.
///
/// Bulk `add` of floats costs about a nanosecond a value (a table of 64 Ki
/// counters per thread, 256 KiB, made on a thread's first bulk call).
class CHORUS_API Histogram {
public:
  /// A bucket's bounds and count. Positive buckets hold [lo, hi), negative
  /// ones (lo, hi], the zero bucket (lo, hi) = (-2^-126, 2^-126).
  struct Bucket {
    double lo;
    double hi;
    std::uint64_t count;
  };
  /// How far (relative to its magnitude) `quantile` may be from the value it
  /// estimates: half a bucket's width over its lower bound, 1/256 (0.39 %).
  static constexpr double relative_error = 1.0 / 256;

  Histogram() noexcept = default;
  explicit Histogram(std::span<const float> values) { add(values); }
  explicit Histogram(std::span<const double> values) { add(values); }

  void add(double value);
  void add(std::span<const float> values);
  void add(std::span<const double> values);
  /// Adds `other`'s values: the result is the histogram of both sets of
  /// values (sum up to double rounding). Associative and commutative.
  void merge(const Histogram& other);

  /// Every value added, NaN and infinities included.
  [[nodiscard]] std::uint64_t count() const noexcept { return finite_ + nan_ + pos_inf_ + neg_inf_; }
  /// Of the finite values: their sum, smallest and largest (NaN when there are none).
  [[nodiscard]] double sum() const noexcept { return sum_; }
  [[nodiscard]] double min() const noexcept;
  [[nodiscard]] double max() const noexcept;
  [[nodiscard]] std::uint64_t finite_count() const noexcept { return finite_; }
  [[nodiscard]] std::uint64_t nan_count() const noexcept { return nan_; }
  [[nodiscard]] std::uint64_t pos_inf_count() const noexcept { return pos_inf_; }
  [[nodiscard]] std::uint64_t neg_inf_count() const noexcept { return neg_inf_; }
  /// The value of rank round(q (n - 1)) among the n values that are not
  /// NaN (infinities sort at the ends), within `relative_error` of its
  /// magnitude (a value in the zero bucket reads 0; the smallest and largest
  /// finite values are exact); NaN when there is none
  /// or q is outside [0, 1].
  [[nodiscard]] double quantile(double q) const noexcept;
  /// The non-empty buckets, ascending.
  [[nodiscard]] std::vector<Bucket> buckets() const;
  /// The bucket `value` (finite) lands in: its index in the layout (0 is
  /// the zero bucket, negative values have negative indexes) and bounds.
  [[nodiscard]] static std::int32_t bucket_index(double value) noexcept;
  [[nodiscard]] static Bucket bucket_bounds(std::int32_t index) noexcept;

  friend bool operator==(const Histogram&, const Histogram&) = default;

private:
  friend struct core::HistogramAccess;
  std::vector<std::pair<std::int32_t, std::uint64_t>> buckets_; // non-empty, by index
  std::uint64_t finite_ = 0;
  std::uint64_t nan_ = 0;
  std::uint64_t pos_inf_ = 0;
  std::uint64_t neg_inf_ = 0;
  double sum_ = 0;
  double min_ = 0; // meaningful while finite_ > 0
  double max_ = 0;
};

/// An image for `Run::log_image`: pixels, which chorus encodes to PNG off
/// the calling thread, or the bytes of a PNG or JPEG file, kept as they are;
/// and an optional caption. A view: `log_image` copies what it needs before
/// it returns, so the pixels or bytes need only live until then.
class CHORUS_API Image {
public:
  /// Pixels in rows, each pixel's channels together (HWC): 1 channel
  /// (grey), 3 (RGB) or 4 (RGBA); `pixels.size()` is height x width x
  /// channels. Floats are taken in [0, 1] (clamped; NaN reads 0).
  static Image from_pixels(std::span<const std::uint8_t> pixels, int height, int width, int channels,
                           std::string_view caption = {}) noexcept {
    Image i;
    i.u8_ = pixels;
    i.height_ = height;
    i.width_ = width;
    i.channels_ = channels;
    i.caption_ = caption;
    return i;
  }
  static Image from_pixels(std::span<const float> pixels, int height, int width, int channels,
                           std::string_view caption = {}) noexcept {
    Image i;
    i.f32_ = pixels;
    i.height_ = height;
    i.width_ = width;
    i.channels_ = channels;
    i.caption_ = caption;
    return i;
  }
  /// The whole of a PNG or JPEG file (its signature says which).
  static Image from_file_bytes(std::span<const char> bytes, std::string_view caption = {}) noexcept {
    Image i;
    i.file_ = bytes;
    i.caption_ = caption;
    return i;
  }

  [[nodiscard]] std::span<const std::uint8_t> u8() const noexcept { return u8_; }
  [[nodiscard]] std::span<const float> f32() const noexcept { return f32_; }
  [[nodiscard]] std::span<const char> file_bytes() const noexcept { return file_; }
  [[nodiscard]] int height() const noexcept { return height_; }
  [[nodiscard]] int width() const noexcept { return width_; }
  [[nodiscard]] int channels() const noexcept { return channels_; }
  [[nodiscard]] std::string_view caption() const noexcept { return caption_; }

private:
  std::span<const std::uint8_t> u8_;
  std::span<const float> f32_;
  std::span<const char> file_;
  int height_ = 0, width_ = 0, channels_ = 0;
  std::string_view caption_;
};

/// One key of a run's config or summary.
struct Field {
  std::string_view key;
  Value value;
};

/// How `Run::define_metric` declares a metric; what a call leaves unset
/// keeps what an earlier call declared. Trivially destructible, so that a
/// braced one may live across a `co_await`.
struct MetricOptions {
  /// Its reduction across ranks at each step, and so its column (see `Reduce`).
  std::optional<Reduce> reduce;
  /// Its value in the run's summary (see `Summary`).
  std::optional<Summary> summary;
  /// The metric its charts take as x instead of `_step` (W&B's
  /// `step_metric`), such as "epoch": `chorus serve` charts it against that
  /// metric's values at the same rows. Empty: leave it as declared.
  std::string_view step_metric;
};
static_assert(std::is_trivially_destructible_v<MetricOptions>);

/// Per-call options of `Run::log`.
struct LogOptions {
  /// The step this call logs at; without it, each call is the rank's next step.
  std::optional<std::int64_t> step;
};

// ---------------------------------------------------------------------------
// Where this process sits in the job, read from the launcher's environment.

struct Topology {
  int rank = 0;             // global rank
  int local_rank = 0;       // rank within its node
  int world_size = 1;       // ranks in the job
  int local_world_size = 1; // ranks on this node
  int node_rank = 0;        // this node's index
  int num_nodes = 1;
  std::string master_addr;  // where global rank 0 listens (empty: this host)
  int master_port = 0;      // the launcher's rendezvous port, 0 if none
  std::string launcher;     // "none", "torchrun", "slurm", "openmpi", "mpich"
  std::string job_id;       // the launcher's job identity, empty if none
  std::string job_step;     // the step of that job (Slurm's SLURM_STEP_ID), empty if none
};

/// Reads the launcher's environment (torchrun and Flyte Elastic, Slurm,
/// Open MPI, MPICH/PMI); no launcher means a single process. A malformed or
/// contradictory variable is an error that names it.
[[nodiscard]] CHORUS_API Topology detect_topology(Error& error);

struct Options {
  std::string project = "uncategorized";
  std::string name;     // display name; default: the run id
  std::string group;    // default: derived from the job, the same on all ranks
  std::string job_type;
  std::string run_id;   // default: generated on the run host
  std::string notes;
  Mode mode = Mode::automatic;
  Scope scope = Scope::global;
  /// A run_id (CHORUS_RUN_ID) whose run exists: refused, continued, or required.
  Resume resume = Resume::never;
  std::string dir;      // default: $CHORUS_DIR or ./chorus-runs
  std::string upload;   // "mlflow://host:port", "wandb://host" (empty: local only)
  std::vector<std::pair<std::string, Value>> config;

  /// The run host's address and port. Default: MASTER_ADDR (else this host)
  /// and CHORUS_PORT (else MASTER_PORT + 1, else a port in 20000..29396
  /// derived from the launcher's job id and step, else 29501).
  std::string host_address;
  std::uint16_t port = 0;

  std::chrono::milliseconds init_timeout{30'000};
  std::chrono::milliseconds finish_timeout{60'000};
  /// How long the run host's finish may spend sending what is left to the
  /// upload target; the rest stays in the run directory for `chorus sync`.
  std::chrono::milliseconds upload_timeout{30'000};
  /// Bytes the Uploader reads from each run file at a time: what it holds in
  /// memory is bounded by about twice this, however far behind the server is.
  std::size_t upload_buffer = 4u << 20;
  std::chrono::milliseconds barrier_timeout{600'000};
  /// How often links between processes are probed, and how long a silent
  /// peer may stay silent before its ranks count as crashed.
  std::chrono::milliseconds heartbeat_interval{1'000};
  std::chrono::milliseconds connection_timeout{10'000};
  /// A live rank whose steps have not moved for this long while other ranks
  /// are ahead of it or wait for it at a barrier is reported `stalled`
  /// (EventKind::stalled; CHORUS_STALL_AFTER in seconds). 0 turns it off.
  std::chrono::milliseconds stall_after{300'000};

  std::size_t queue_capacity = 1u << 16; // values in flight per process
  Overflow overflow = Overflow::block;
  double system_interval = 10.0;         // seconds between system samples; 0 = off
  std::string tls_dir;                   // credentials made by `chorus certs`
  bool insecure = false;                 // allow unauthenticated links between nodes

  /// The environment (CHORUS_*) overrides the fields above unless false.
  bool read_env = true;
  /// Where this process sits; default: detect_topology().
  std::optional<Topology> topology;
};

// What the client layer (runtime/client) keeps behind these handles.
namespace client {
class Channel;
class RunImpl;
struct RunAccess;
struct FinishState;
} // namespace client

// ---------------------------------------------------------------------------
// Tickets

/// What `Run::log`, `barrier`, `config`, `summary`, `define_metric` and
/// `log_artifact` return: drop it, `co_await` it, or `.wait()` on it. It
/// completes once what it names is durably committed on the run host (or at
/// once with an error).
/// Trivially destructible; it must not outlive its Run.
class CHORUS_API Pending {
public:
  Pending() noexcept = default;
  Pending(client::Channel* ch, std::uint64_t seq, bool has_error) noexcept
      : ch_(ch), seq_(seq), has_error_(has_error) {}

  /// True once complete (never blocks).
  [[nodiscard]] bool ready() const noexcept;
  /// Blocks the calling thread until complete.
  Error wait() const;
  /// Blocks for at most `d`; Errc::timeout if still pending.
  Error wait_for(std::chrono::milliseconds d) const;
  /// Calls `fn` once complete, on a chorus completion thread (or at once).
  void on_done(std::function<void(Error)> fn) const;

  bool await_ready() const noexcept { return ready(); }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) const {
    suspend(h, detail::executor_of(h.promise()));
  }
  Error await_resume() const { return result(); }

  [[nodiscard]] std::uint64_t seq() const noexcept { return seq_; }

private:
  void suspend(std::coroutine_handle<> h, Executor* ex) const;
  Error result() const;

  client::Channel* ch_ = nullptr;
  std::uint64_t seq_ = 0;
  bool has_error_ = false;
};
static_assert(std::is_trivially_destructible_v<Pending>);

/// One rank as the run host saw it.
struct RankResult {
  int rank = 0;
  RunState state = RunState::running;
  std::int64_t last_step = -1;
  std::string host;
  std::string message; // why it crashed or did not finish, if it did not
};

/// How a rank ends its part of a run (`Run::finish`), as MLflow's
/// `end_run(status)` and W&B's `finish(exit_code)` let a trainer say.
/// chorus ends a rank itself where the trainer does not: a SIGTERM, SIGINT
/// or SIGHUP ends it `killed`, an uncaught exception (std::terminate) or a
/// non-zero exit status `failed` (README, "How a run ends").
/// Trivially destructible, so that a braced one may live across a `co_await`.
struct FinishOptions {
  /// Non-zero: this rank failed. The host records the rank `failed` with this
  /// code (run.json), and the run ends `failed`.
  int exit_code = 0;
  /// Non-zero: this rank was stopped by this signal (SIGTERM, say): it is
  /// recorded `killed`, naming the signal. Takes precedence over exit_code.
  int signal = 0;
  /// Why the rank failed or was stopped (an exception's text): kept in
  /// run.json beside its state and shown by `chorus show`; its first 4 KiB.
  std::string_view message;
};
static_assert(std::is_trivially_destructible_v<FinishOptions>);

struct FinishResult {
  Error error;               // set if the finish itself did not go cleanly
  RunState state = RunState::running;
  std::string run_id;
  std::string run_dir;       // on the run host
  std::uint64_t rows = 0;    // history rows committed (run host only)
  std::uint64_t dropped = 0; // values dropped by this process's queue
  std::uint64_t rejected = 0;// values the run host refused (see rejected.jsonl)
  std::vector<RankResult> ranks; // run host only
  /// The run host's upload (Options::upload) as finish left it: empty when
  /// the target has everything, else Errc::upload_incomplete naming what is
  /// left, why, and the `chorus sync` command that sends it. The run is
  /// complete on disk either way (see `state` and `error`); a target that
  /// refuses connections or does not answer is given up on at once rather
  /// than holding finish for `upload_timeout`.
  Error upload_error;
  std::uint64_t upload_left = 0; // bytes of history.jsonl and system.jsonl not uploaded (run host only)
};

/// What `Run::finish` returns: awaitable, `.wait()`-able, droppable.
class CHORUS_API FinishPending {
public:
  FinishPending() noexcept = default;
  FinishPending(Pending p, client::FinishState* st) noexcept : p_(p), st_(st) {}

  [[nodiscard]] bool ready() const noexcept { return p_.ready(); }
  FinishResult wait() const;
  /// Blocks for at most `d`; true once complete (then wait() returns at once).
  bool wait_for(std::chrono::milliseconds d) const {
    (void)p_.wait_for(d);
    return p_.ready();
  }
  bool await_ready() const noexcept { return p_.await_ready(); }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) const {
    p_.await_suspend(h);
  }
  FinishResult await_resume() const { return result(); }
  void on_done(std::function<void(FinishResult)> fn) const;

private:
  FinishResult result() const;
  Pending p_;
  client::FinishState* st_ = nullptr;
};
static_assert(std::is_trivially_destructible_v<FinishPending>);

// ---------------------------------------------------------------------------
// Events: what the run host tells while it happens (README, "When something
// goes wrong"). Each is a line of the run directory's events.jsonl too.

enum class EventKind : std::uint8_t {
  /// A live rank's steps have not moved for `Options::stall_after` while
  /// other ranks are ahead of it or wait for it at a barrier.
  stalled = 1,
  /// A stalled rank moved again.
  resumed = 2,
  /// A committed value is NaN or ±Inf (`ranks`: the ranks whose values were);
  /// once per column until it is finite again.
  nonfinite = 3,
  /// A rank ended failed (an exception, a non-zero exit), killed (a signal)
  /// or lost (its process or its connection vanished).
  rank_failed = 4,
  rank_killed = 5,
  rank_lost = 6,
  /// A barrier timed out (`ranks`: those that never reached it).
  barrier_timeout = 7,
  /// The run ended (`state`); the last event of a run.
  run_finished = 8,
  /// A rule of `Run::alert_when` fired.
  threshold = 9,
  /// A rank that holds the others back again and again: the last to reach
  /// most recent barriers, or far behind the median rank's step.
  straggler = 10,
};
CHORUS_API std::string_view to_string(EventKind) noexcept;

/// One event of a run, as every rank and every reader sees it.
struct Event {
  EventKind kind = EventKind::run_finished;
  std::int64_t step = -1; // the step it concerns; -1: none
  int rank = -1;          // the rank it concerns; -1: the run as a whole
  std::string key;        // the metric it concerns (nonfinite, threshold), else empty
  std::chrono::system_clock::time_point time; // when the run host saw it
  std::string message;    // one sentence that says what happened and what to do
  std::vector<int> ranks; // the ranks it names (non-finite values, missing at a barrier)
  RunState state = RunState::running; // run_finished: how the run ended
  std::string json;       // its line of events.jsonl, whole (every field, such as host and pid)
};

/// A rule of `Run::alert_when`.
struct AlertRule {
  enum class Kind : std::uint8_t { above = 1, below = 2, no_change = 3 };
  Kind kind = Kind::above;
  /// The bound (above, below), or the seconds (no_change).
  double limit = 0;
};
/// A committed value greater than `x`.
constexpr AlertRule above(double x) noexcept { return {AlertRule::Kind::above, x}; }
/// A committed value less than `x`.
constexpr AlertRule below(double x) noexcept { return {AlertRule::Kind::below, x}; }
/// The key's committed value the same (or not logged) for `d` while the run goes on.
constexpr AlertRule no_change(std::chrono::duration<double> d) noexcept {
  return {AlertRule::Kind::no_change, d.count()};
}

namespace client {
class EventHub;
}

/// What `Run::next_event` returns: `co_await` it (resumed on the awaiting
/// coroutine's executor, never on a chorus thread) or `.wait()` on it. It
/// gives the rank's next event not yet taken, or nothing once the run has
/// ended (after its run_finished) or this rank's part of it is over.
class CHORUS_API EventPending {
public:
  EventPending() noexcept = default;
  explicit EventPending(client::EventHub* hub) noexcept : hub_(hub) {}

  /// Blocks the calling thread until there is an event, or the end.
  std::optional<Event> wait() const;
  /// Blocks for at most `d`: nothing where none came meanwhile (or at the end).
  std::optional<Event> wait_for(std::chrono::milliseconds d) const;

  bool await_ready() const noexcept;
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) const {
    suspend(h, detail::executor_of(h.promise()));
  }
  std::optional<Event> await_resume() const;

private:
  void suspend(std::coroutine_handle<> h, Executor* ex) const;
  client::EventHub* hub_ = nullptr;
};

// ---------------------------------------------------------------------------
// The run

/// One producer's own ordered stream into the run (`Run::writer`): for a rank
/// that logs from several threads, actors or coroutines, each with its own
/// steps. A writer's steps are ordered on their own: a step lower than the
/// writer's last is rejected (backwards_step, naming the writer), whatever
/// the others log. The rank's watermark is the minimum over its live streams
/// (its writers and, once it has logged, the default stream of `Run::log`),
/// so a slow writer holds the rank's rows back and a fast one is not
/// rejected. A writer joins at the last committed step, when it is made:
/// make every writer before any of them logs far ahead. Closing it (or
/// destroying it) leaves the minimum.
///
/// One writer is one producer: use each from one thread (or coroutine chain)
/// at a time; many writers may log at once. It must not outlive its Run.
/// Move-only; a default-constructed or moved-from writer is inactive.
class CHORUS_API Writer {
public:
  Writer() noexcept = default;
  Writer(Writer&& o) noexcept : impl_(std::exchange(o.impl_, nullptr)), id_(std::exchange(o.id_, 0)) {}
  Writer& operator=(Writer&& o) noexcept {
    if (this != &o) {
      (void)close();
      impl_ = std::exchange(o.impl_, nullptr);
      id_ = std::exchange(o.id_, 0);
    }
    return *this;
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer() { (void)close(); }

  /// As `Run::log`, into this writer's stream: automatic steps count this
  /// writer's calls.
  Pending log(std::span<const Metric> values, const LogOptions& opts = {}) noexcept;
  Pending log(const Metrics& values, const LogOptions& opts = {}) noexcept {
    return log(std::span<const Metric>(values), opts);
  }
  /// As `Run::log_histogram`, into this writer's stream.
  Pending log_histogram(std::string_view key, std::span<const double> values, const LogOptions& opts = {}) noexcept;
  Pending log_histogram(std::string_view key, std::span<const float> values, const LogOptions& opts = {}) noexcept;
  Pending log_histogram(std::string_view key, const Histogram& histogram, const LogOptions& opts = {}) noexcept;
  /// Leaves the rank's minimum; the ticket completes once everything this
  /// writer logged is processed. Later calls are no-ops.
  Pending close() noexcept;

  /// False once closed, and on an inactive run.
  explicit operator bool() const noexcept { return impl_ != nullptr; }

private:
  friend class Run;
  friend struct client::RunAccess;
  Writer(client::RunImpl* impl, std::uint32_t id) noexcept : impl_(impl), id_(id) {}
  client::RunImpl* impl_ = nullptr;
  std::uint32_t id_ = 0; // 0: could not open (its calls say why)
};

/// A handle on the run this process logs into. An inactive handle (a rank
/// that does not log in this mode) is false and every call on it is a no-op.
///
/// Thread safety: every call may be made from many threads at once (log,
/// log_device, define_metric, config, summary, barrier, log_artifact,
/// writer, finish); the calls of one thread reach the run in the order made,
/// those of different threads in some interleaving. Steps are what need care:
/// `log` writes into the rank's one default stream, whose steps must not
/// decrease, so threads that log their own explicit steps each take a
/// `writer()`. `reduce_device` is a collective whose calls must come in the
/// same order on every rank: make them from one thread. Moving or assigning
/// the handle itself is not thread-safe, nor is destroying it while another
/// thread still calls it. No call is async-signal-safe: a signal handler
/// must not call the run (let it set a flag that the trainer's loop reads,
/// or use the stop signals chorus handles itself, README "How a run ends").
class CHORUS_API Run {
public:
  Run() noexcept;
  explicit Run(std::unique_ptr<client::RunImpl> impl) noexcept;
  Run(Run&&) noexcept;
  Run& operator=(Run&&) noexcept;
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  /// Finishes the run if `finish` was not called (bounded by finish_timeout):
  /// failed where an exception is unwinding the handle's scope.
  ~Run();

  /// False on an inactive handle, and in a forked child (where the run is the parent's).
  explicit operator bool() const noexcept;

  /// Enqueues values at once: never blocks (but under Overflow::block with a
  /// full queue), never allocates in the steady state, never throws.
  Pending log(std::span<const Metric> values, const LogOptions& opts = {}) noexcept;
  Pending log(const Metrics& values, const LogOptions& opts = {}) noexcept {
    return log(std::span<const Metric>(values), opts);
  }

  /// Logs the distribution of `values` (a gradient, an activation) as a
  /// histogram (`Histogram`) under `key`, at the step a `log` call with
  /// these options would take (without a step, the rank's next one). The
  /// values are bucketed on the calling thread (about 1 ns a float) and
  /// only the non-empty buckets travel. In a run of several ranks, a key
  /// declared `define_metric(key, Reduce::merge)` is, at each step, the
  /// exact merge of the ranks that logged it (`_count` of them); else it is
  /// a column per rank, `key/rank-N`, as scalars are. A key holds histograms
  /// or scalars, never both: the other kind is refused (invalid_argument).
  /// The histograms are in the run directory's histograms.jsonl.
  Pending log_histogram(std::string_view key, std::span<const double> values, const LogOptions& opts = {}) noexcept;
  Pending log_histogram(std::string_view key, std::span<const float> values, const LogOptions& opts = {}) noexcept;
  /// Logs a histogram built ahead (say over many batches, with `add` and `merge`).
  Pending log_histogram(std::string_view key, const Histogram& histogram, const LogOptions& opts = {}) noexcept;
  /// Logs the histogram of `count` values of type `dtype` in GPU memory
  /// (`device_values`, on any of the process's GPUs), counted on
  /// the GPU in `stream`'s order: the call never waits for the GPU (a few
  /// microseconds of CUDA calls), the counts are read back asynchronously and
  /// the histogram goes out, in order with the rank's other calls, once they
  /// have landed. Into the same buckets as the host's (half and bfloat16
  /// values widened exactly); `sum` is added in double in an order that may
  /// change its last bits from run to run. The kernel is compiled by NVRTC
  /// at the first call (a fraction of a second, once per process). The
  /// values must stay in place until `stream` has run past the call, as for
  /// a kernel of the caller's own.
  Pending log_histogram(std::string_view key, const void* device_values, std::size_t count, DeviceDtype dtype,
                        CudaStream stream, const LogOptions& opts = {}) noexcept;

  /// Logs an image under `key` at the step a `log` call with these options
  /// would take (README, "Images, text and tables"). Pixels are copied on
  /// the calling thread and encoded to PNG (libpng) on a chorus thread; PNG
  /// and JPEG bytes are kept as they are. The ticket completes once the
  /// image is durable in the run's WAL; the run directory holds it as a file
  /// under media/, listed in media.jsonl. A wrong shape, an empty image, a
  /// side over 16,384 pixels, a file over 64 MiB, bytes that are neither PNG
  /// nor JPEG, and a key that holds another kind are errors on the ticket,
  /// and nothing of the call is kept.
  Pending log_image(std::string_view key, const Image& image, const LogOptions& opts = {}) noexcept;
  /// Logs text (markdown) under `key`, at most 64 MiB, as log_image does.
  Pending log_text(std::string_view key, std::string_view text, const LogOptions& opts = {}) noexcept;
  /// Logs a table under `key`: named columns, rows of numbers, strings,
  /// booleans or nulls (W&B's Table), each row as long as `columns`; a
  /// ragged row is an error on the ticket. As log_image does.
  Pending log_table(std::string_view key, std::span<const std::string> columns,
                    std::span<const std::vector<Value>> rows, const LogOptions& opts = {}) noexcept;

  /// A new ordered stream for one producer of this rank (see `Writer`). At
  /// most 4096 writers are open at once in a process; past that (or after
  /// finish) the writer's calls return an error that says so.
  [[nodiscard]] Writer writer() noexcept;

  /// Logs floats that live in GPU memory without a host sync: each value is
  /// copied asynchronously on `stream` into pinned memory behind an event;
  /// chorus reads it once the event fires, and it lands at the step of this
  /// call. Costs microseconds (two CUDA calls per value), not a
  /// cudaStreamSynchronize. Needs the CUDA runtime at run time (chorus loads
  /// it); without it the ticket carries an error that says so.
  Pending log_device(std::span<const DeviceMetric> values, CudaStream stream, const LogOptions& opts = {}) noexcept;
  Pending log_device(const DeviceMetrics& values, CudaStream stream, const LogOptions& opts = {}) noexcept {
    return log_device(std::span<const DeviceMetric>(values), stream, opts);
  }
  Pending log_device(std::string_view key, const float* value, CudaStream stream,
                     const LogOptions& opts = {}) noexcept {
    const DeviceMetric m{key, value};
    return log_device(std::span<const DeviceMetric>(&m, 1), stream, opts);
  }

  /// Reduces floats in GPU memory across the run's ranks with NCCL, on
  /// chorus's own communicator and stream, and logs the result at this
  /// call's step; only the run host copies the result to the host. A
  /// collective: every rank of the run calls it with the same keys in the
  /// same order (the first call forms the communicator, within
  /// init_timeout), one GPU per rank. `stream` waits for chorus's copy of the
  /// values only, never for the reduction. `op` is mean, sum, min or max
  /// (NCCL has no `first`). The result is one value a step, the run host's:
  /// the first call for a key declares it `Reduce::first` there, so that it
  /// keeps the plain column `key`.
  Pending reduce_device(std::span<const DeviceMetric> values, Reduce op, CudaStream stream,
                        const LogOptions& opts = {}) noexcept;
  Pending reduce_device(const DeviceMetrics& values, Reduce op, CudaStream stream,
                        const LogOptions& opts = {}) noexcept {
    return reduce_device(std::span<const DeviceMetric>(values), op, stream, opts);
  }

  /// Declares how `key` is reduced across ranks at each step, and so its
  /// column (see `Reduce`). The declaration in force when a row commits
  /// decides for that row.
  Pending define_metric(std::string_view key, Reduce reduce) noexcept;
  /// Declares `key`'s reduction, its summary and its chart's x (see
  /// `MetricOptions`): `run.define_metric("loss", {.reduce = Reduce::mean,
  /// .summary = Summary::min})`. `step_metric` must be a valid metric key.
  Pending define_metric(std::string_view key, const MetricOptions& opts) noexcept;

  /// Sets config keys (merged; a later value for a key replaces the earlier).
  Pending config(std::span<const Field> fields);
  Pending config(std::initializer_list<Field> fields) {
    return config(std::span<const Field>(fields.begin(), fields.size()));
  }
  /// Sets summary keys (merged over the automatic last-value summary).
  Pending summary(std::span<const Field> fields);
  Pending summary(std::initializer_list<Field> fields) {
    return summary(std::span<const Field>(fields.begin(), fields.size()));
  }

  /// Completes when every live rank has reached this barrier: everything
  /// logged before it is committed before anything after it. On timeout
  /// (default Options::barrier_timeout) the error names the missing ranks.
  Pending barrier(std::string_view name, std::chrono::milliseconds timeout = {}) noexcept;

  /// Copies the file at `path` into the run directory as
  /// `artifacts/<name>` and lists it in `artifacts.jsonl` (name, type, size,
  /// SHA-256, rank, this rank's step, timestamp): a checkpoint, a model, a
  /// plot. The copy runs on a chorus thread, streamed in 1 MiB chunks, never
  /// on the caller's thread; the ticket completes once the file and its line
  /// are durable, so the caller may then delete or overwrite `path`.
  /// Logging a name again replaces the file (the manifest's last line wins).
  /// `name` is a relative path of ASCII letters, digits, '_', '.', '-', ' '
  /// and '/' (no "..", no leading '/', at most 250 bytes), as MLflow takes
  /// it; a bad name, a missing or unreadable file, a directory and a write
  /// error (a full disk) are errors that say so. The run directory must be
  /// on this machine: call it on the run host's node (in a shared global
  /// run, rank 0, typically after a barrier). finish() waits for copies in
  /// flight, at most finish_timeout.
  Pending log_artifact(std::string_view name, std::string_view path, std::string_view type = "file") noexcept;

  /// Declares a rule on `key`, evaluated by the run host on committed rows
  /// (so every rank sees the same events): `run.alert_when("loss",
  /// chorus::above(10.0))`, `chorus::below(x)`, `chorus::no_change(600s)`.
  /// A rule fires an EventKind::threshold event once, and again only after
  /// the value came back within it. A key without a reduction is checked in
  /// each rank's column (the event names the rank).
  Pending alert_when(std::string_view key, AlertRule rule) noexcept;

  /// Calls `fn` with each event of the run from now on, on `executor` (a
  /// coroutine posted per event: never on a chorus thread). Any rank may
  /// ask; every rank sees the same events. `fn` and `executor` must outlive
  /// the Run.
  void on_event(std::function<void(const Event&)> fn, Executor& executor);
  /// The next event of the run this rank has not taken (from its start, up
  /// to the last 4,096), or nothing once the run has ended.
  [[nodiscard]] EventPending next_event() noexcept;

  /// Finishes this rank's part of the run; on the run host, the run itself.
  /// Bounded by Options::finish_timeout; calling it twice returns the same
  /// result (the first call's options count). `{.exit_code = 3}` ends this
  /// rank, and so the run, as failed; `{.signal = SIGTERM}` as killed.
  FinishPending finish(FinishOptions opts = {}) noexcept;

  [[nodiscard]] const Topology& topology() const noexcept;
  [[nodiscard]] std::string_view id() const noexcept;
  /// The run directory (on the run host's filesystem).
  [[nodiscard]] std::string_view dir() const noexcept;
  [[nodiscard]] bool is_host() const noexcept;
  /// Values dropped so far under Overflow::drop_newest.
  [[nodiscard]] std::uint64_t dropped() const noexcept;

private:
  friend struct client::RunAccess;

  std::unique_ptr<client::RunImpl> impl_;
  std::unique_ptr<const Topology> inactive_topology_; // where an inactive handle's process sits
  /// Exceptions in flight when the handle was made: more at its destruction
  /// means an exception is unwinding its scope, which ends the rank failed.
  int uncaught_at_start_ = std::uncaught_exceptions();
};

/// Starts (or joins) the run this process logs into, as `opts` and the
/// environment say. Throws InitError on failure.
[[nodiscard]] CHORUS_API Run init(const Options& opts = {});
/// The same, reporting failure through `error` (the Run is then inactive).
[[nodiscard]] CHORUS_API Run init(const Options& opts, Error& error) noexcept;

} // namespace chorus
