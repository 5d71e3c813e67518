// The GPU path end to end (ctest label `gpu`): device values captured
// without a stream synchronisation and landing at their steps, errors for
// bad pointers, and NCCL reductions on chorus's own communicator. Skips where
// there is no CUDA device.
#define BOOST_TEST_MODULE e2e_device
#include "local_run.hpp"
#include "tests/e2e/histogram_lines.hpp"
#include "tests/e2e/histogram_values.hpp"
#include "tests/gpu.hpp"

#include "runtime/client/cuda_api.hpp"

#include <chorus/chorus.hpp>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <bit>
#include <cmath>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

using namespace e2e;
namespace cuda = chorus::client::cuda;

namespace {

const cuda::Runtime& rt() {
  static const cuda::Runtime* r = [] {
    const chorus::Result<const cuda::Runtime*> loaded = cuda::runtime();
    if (!loaded) chorus::test::skip_test("no CUDA runtime here: " + loaded.error().message());
    const cuda::Runtime* r = *loaded;
    int n = 0;
    if (int rc = r->GetDeviceCount(&n); rc != cuda::success || n == 0)
      chorus::test::skip_test("no CUDA device here (" + (rc != cuda::success ? r->describe(rc) : "0 devices") + ")");
    return r;
  }();
  return *r;
}

#define CUDA_OK(call) BOOST_REQUIRE_EQUAL((call), cuda::success)

chorus::Options local_options(const TempDir& dir) {
  chorus::Options opt = e2e::local_options(dir, "device");
  opt.system_interval = 0;
  return opt;
}

/// Holds a stream at a point until opened: a host function the stream runs,
/// spinning on a flag. Opens by itself after a minute so a broken test ends.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> timed_out{false};
  static void wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (!g->open.load()) {
      if (std::chrono::steady_clock::now() > limit) {
        g->timed_out = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

struct DeviceBuffer {
  float* p = nullptr;
  explicit DeviceBuffer(std::size_t n) {
    void* v = nullptr;
    BOOST_REQUIRE_EQUAL(rt().Malloc(&v, n * sizeof(float)), cuda::success);
    p = static_cast<float*>(v);
  }
  ~DeviceBuffer() { rt().Free(p); }
};

struct PinnedBuffer {
  float* p = nullptr;
  explicit PinnedBuffer(std::size_t n) {
    void* v = nullptr;
    BOOST_REQUIRE_EQUAL(rt().HostAlloc(&v, n * sizeof(float), 0), cuda::success);
    p = static_cast<float*>(v);
  }
  ~PinnedBuffer() { rt().FreeHost(p); }
};

} // namespace

BOOST_AUTO_TEST_CASE(device_values_land_at_their_steps_without_a_stream_sync) {
  constexpr int steps = 200;
  TempDir dir;
  cuda::Stream stream = nullptr;
  CUDA_OK(rt().StreamCreateWithFlags(&stream, cuda::stream_non_blocking));
  DeviceBuffer dev(steps);
  PinnedBuffer src(steps);
  for (int s = 0; s < steps; ++s) src.p[s] = 1.0f + 0.25f * static_cast<float>(s);
  Gate gate;
  fs::path rd;
  {
    chorus::Run run = chorus::init(local_options(dir));
    // The stream stops here until the test opens the gate: nothing below
    // can have run on the GPU while the log calls return.
    CUDA_OK(rt().LaunchHostFunc(stream, &Gate::wait, &gate));
    std::vector<chorus::Pending> tickets;
    for (int s = 0; s < steps; ++s) {
      CUDA_OK(rt().MemcpyAsync(dev.p + s, src.p + s, sizeof(float), cuda::host_to_device, stream));
      tickets.push_back(run.log_device("dev/x", dev.p + s, stream, {.step = s}));
      run.log({{"host/y", static_cast<double>(s)}}, {.step = s});
    }
    // Every call returned with the stream still held: chorus never waited on it.
    BOOST_TEST(rt().StreamQuery(stream) == cuda::not_ready);
    BOOST_TEST(!tickets.front().ready());
    gate.open = true;
    for (auto& t : tickets) BOOST_TEST(!t.wait(), t.wait().message());
    BOOST_TEST(!gate.timed_out.load());
    auto r = run.finish().wait();
    BOOST_TEST(!r.error, r.error.message());
    rd = r.run_dir;
  }
  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    BOOST_TEST(rows[s].step() == s);
    BOOST_TEST(rows[s].num.at("dev/x") == 1.0 + 0.25 * s); // exact: 0.25 steps are floats
    BOOST_TEST(rows[s].num.at("host/y") == s);
  }
  rt().StreamDestroy(stream);
}

BOOST_AUTO_TEST_CASE(automatic_steps_count_device_calls_in_order) {
  TempDir dir;
  DeviceBuffer dev(64);
  PinnedBuffer src(64);
  for (int i = 0; i < 64; ++i) src.p[i] = static_cast<float>(i) * 2;
  CUDA_OK(rt().Memcpy(dev.p, src.p, 64 * sizeof(float), cuda::host_to_device));
  fs::path rd;
  {
    chorus::Run run = chorus::init(local_options(dir));
    for (int i = 0; i < 64; ++i) {
      run.log({{"host", static_cast<double>(i)}});      // step 2i
      run.log_device("dev", dev.p + i, nullptr);          // step 2i + 1
    }
    rd = run.finish().wait().run_dir;
  }
  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), 128u);
  for (int i = 0; i < 64; ++i) {
    BOOST_TEST(rows[2 * i].num.at("host") == i);
    BOOST_TEST(rows[2 * i + 1].num.at("dev") == i * 2);
    BOOST_TEST(rows[2 * i + 1].step() == 2 * i + 1);
  }
}

BOOST_AUTO_TEST_CASE(a_host_pointer_is_refused_with_the_fix) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  float on_host = 1.0f;
  chorus::Error e = run.log_device("x", &on_host, nullptr).wait();
  BOOST_TEST((e.code() == chorus::Errc::invalid_argument));
  BOOST_TEST(e.message().find("not device memory") != std::string::npos, e.message());
  chorus::Error null = run.log_device("x", nullptr, nullptr).wait();
  BOOST_TEST(null.message().find("null") != std::string::npos, null.message());
  // The run goes on.
  DeviceBuffer dev(1);
  CUDA_OK(rt().Memcpy(dev.p, &on_host, sizeof(float), cuda::host_to_device));
  BOOST_TEST(!run.log_device("x", dev.p, nullptr).wait());
  BOOST_TEST(!run.finish().wait().error);
}

BOOST_AUTO_TEST_CASE(nccl_reduction_of_one_rank_is_exact) {
  if (const auto nccl = cuda::nccl(); !nccl) chorus::test::skip_test("no NCCL here: " + nccl.error().message());
  TempDir dir;
  cuda::Stream stream = nullptr;
  CUDA_OK(rt().StreamCreateWithFlags(&stream, cuda::stream_non_blocking));
  DeviceBuffer dev(3 * 50);
  PinnedBuffer src(3 * 50);
  for (int i = 0; i < 3 * 50; ++i) src.p[i] = 0.5f * static_cast<float>(i) - 7.0f;
  CUDA_OK(rt().Memcpy(dev.p, src.p, 3 * 50 * sizeof(float), cuda::host_to_device));
  fs::path rd;
  {
    chorus::Run run = chorus::init(local_options(dir));
    for (int s = 0; s < 50; ++s) {
      const chorus::DeviceMetric m[] = {{"loss", dev.p + 3 * s}, {"acc", dev.p + 3 * s + 1}, {"gnorm", dev.p + 3 * s + 2}};
      chorus::Pending p = run.reduce_device(m, chorus::Reduce::mean, stream);
      if (s == 0) BOOST_TEST(!p.wait(), p.wait().message());
    }
    auto r = run.finish().wait();
    BOOST_TEST(!r.error, r.error.message());
    rd = r.run_dir;
  }
  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), 50u);
  for (int s = 0; s < 50; ++s) {
    BOOST_TEST(rows[s].num.at("loss") == src.p[3 * s]);
    BOOST_TEST(rows[s].num.at("acc") == src.p[3 * s + 1]);
    BOOST_TEST(rows[s].num.at("gnorm") == src.p[3 * s + 2]);
  }
  rt().StreamDestroy(stream);
}

BOOST_AUTO_TEST_CASE(reduce_device_without_a_reduction_is_refused) {
  TempDir dir;
  chorus::Run run = chorus::init(local_options(dir));
  DeviceBuffer dev(1);
  const chorus::DeviceMetric m[] = {{"loss", dev.p}};
  chorus::Error e = run.reduce_device(m, chorus::Reduce::none, nullptr).wait();
  BOOST_TEST(e.message().find("mean, sum, min or max") != std::string::npos, e.message());
}

// Two ranks under `chorus launch`, the NCCL id handed from the run host to
// the other rank through the Run actor. With a GPU per rank the reductions
// are exact; on one GPU NCCL refuses two ranks on one device, and both ranks
// must say so promptly — which they can only do once the id has reached rank 1.
BOOST_AUTO_TEST_CASE(two_ranks_exchange_the_nccl_id_and_reduce) {
  if (const auto nccl = cuda::nccl(); !nccl) chorus::test::skip_test("no NCCL here: " + nccl.error().message());
  int devices = 0;
  rt().GetDeviceCount(&devices);
  TempDir dir;
  const int port = test_port(11);
  const int steps = 20;
  Output out = run("CHORUS_DIR=" + dir.path.string() + " CHORUS_PORT=" + std::to_string(port) + " " + bin("chorus") +
                   " launch -n 2 --master-port " + std::to_string(port + 1) + " -- " + bin("chorus_e2e_device_worker") +
                   " " + std::to_string(steps));
  BOOST_TEST_INFO(out.text);
  BOOST_TEST(out.text.find("did not hand out the NCCL id") == std::string::npos);
  BOOST_TEST(out.text.find("within init_timeout") == std::string::npos);
  if (devices < 2) {
    BOOST_TEST_MESSAGE("one GPU: checking that NCCL formed the communicator far enough to refuse it");
    BOOST_TEST(out.status != 0);
    BOOST_TEST(out.text.find("[rank 0] rank 0 reduce_device: NCCL failed forming the communicator") != std::string::npos);
    BOOST_TEST(out.text.find("[rank 1] rank 1 reduce_device: NCCL failed forming the communicator") != std::string::npos);
    return;
  }
  BOOST_REQUIRE_EQUAL(out.status, 0);
  auto rows = read_history(run_dir_of(out.text));
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(steps));
  for (int s = 0; s < steps; ++s) {
    BOOST_TEST(rows[s].num.at("loss") == 0.5 + 0.5 * s); // mean of s/2 and 1 + s/2
    BOOST_TEST(rows[s].num.at("tokens") == 201.0);
    BOOST_TEST(rows[s].num.at("peak") == s);
  }
}

BOOST_AUTO_TEST_CASE(adjacent_and_scattered_values_in_one_call) {
  TempDir dir;
  DeviceBuffer dev(8);
  const float host[8] = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f};
  CUDA_OK(rt().Memcpy(dev.p, host, sizeof host, cuda::host_to_device));
  fs::path rd;
  {
    chorus::Run run = chorus::init(local_options(dir));
    // Runs of neighbours go in one copy each; the order of the call is kept.
    const chorus::DeviceMetric m[] = {{"a", dev.p}, {"b", dev.p + 1}, {"c", dev.p + 5}, {"d", dev.p + 2},
                                      {"e", dev.p + 3}, {"f", dev.p + 7}, {"g", dev.p + 6}};
    chorus::Error e = run.log_device(m, nullptr).wait();
    BOOST_TEST(!e, e.message());
    rd = run.finish().wait().run_dir;
  }
  auto rows = read_history(rd);
  BOOST_REQUIRE_EQUAL(rows.size(), 1u);
  BOOST_TEST(rows[0].num.at("a") == 0.5);
  BOOST_TEST(rows[0].num.at("b") == 1.5);
  BOOST_TEST(rows[0].num.at("c") == 5.5);
  BOOST_TEST(rows[0].num.at("d") == 2.5);
  BOOST_TEST(rows[0].num.at("e") == 3.5);
  BOOST_TEST(rows[0].num.at("f") == 7.5);
  BOOST_TEST(rows[0].num.at("g") == 6.5);
}

namespace {

/// The float16 (IEEE half) bits nearest `f` (rounding to nearest even), for
/// test values that halves hold exactly.
std::uint16_t half_bits(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const int e = static_cast<int>((u >> 23) & 0xffu) - 127 + 15;
  if (((u >> 23) & 0xffu) == 0xffu) return static_cast<std::uint16_t>(sign | 0x7c00u | ((u & 0x7fffffu) ? 0x200u : 0));
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (e <= 0) return static_cast<std::uint16_t>(sign); // below the halves' normal range: 0 (not in the test values)
  return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(e) << 10 | ((u >> 13) & 0x3ffu));
}

/// The float a half's bits hold (exactly).
float half_value(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e == 0) return (sign ? -1.0f : 1.0f) * static_cast<float>(m) * 5.9604644775390625e-8f;
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

} // namespace

BOOST_AUTO_TEST_CASE(device_histograms_are_the_hosts_buckets_without_a_stream_sync) {
  (void)rt();
  constexpr std::size_t n = 1 << 20;
  TempDir dir;
  cuda::Stream stream = nullptr;
  CUDA_OK(rt().StreamCreateWithFlags(&stream, cuda::stream_non_blocking));
  // float32: a million values over many buckets of both signs, with NaN and
  // both infinities; float16 and bfloat16: the same values as those types
  // hold them (bfloat16: the top half of a float's bits, truncated).
  std::vector<float> f32;
  while (f32.size() < n) {
    const std::vector<float> more = histogram_values(static_cast<int>(f32.size() % 7), static_cast<long>(f32.size()));
    f32.insert(f32.end(), more.begin(), more.end());
  }
  f32.resize(n);
  f32[10] = std::numeric_limits<float>::quiet_NaN();
  f32[11] = std::numeric_limits<float>::infinity();
  f32[12] = -std::numeric_limits<float>::infinity();
  f32[13] = 0.0f;
  f32[14] = -0.0f;
  f32[15] = std::numeric_limits<float>::denorm_min();
  std::vector<std::uint16_t> f16(n), bf16(n);
  std::vector<float> f16_values(n), bf16_values(n);
  for (std::size_t i = 0; i < n; ++i) {
    f16[i] = half_bits(f32[i]);
    f16_values[i] = half_value(f16[i]);
    bf16[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f32[i]) >> 16);
    bf16_values[i] = std::bit_cast<float>(static_cast<std::uint32_t>(bf16[i]) << 16);
  }
  void* d32 = nullptr;
  void* d16 = nullptr;
  void* dbf = nullptr;
  CUDA_OK(rt().Malloc(&d32, n * 4));
  CUDA_OK(rt().Malloc(&d16, n * 2));
  CUDA_OK(rt().Malloc(&dbf, n * 2));
  CUDA_OK(rt().Memcpy(d32, f32.data(), n * 4, cuda::host_to_device));
  CUDA_OK(rt().Memcpy(d16, f16.data(), n * 2, cuda::host_to_device));
  CUDA_OK(rt().Memcpy(dbf, bf16.data(), n * 2, cuda::host_to_device));
  Gate gate;
  fs::path rd;
  {
    chorus::Run run = chorus::init(local_options(dir));
    // The first call compiles the kernel (NVRTC): made before the gate closes the stream.
    BOOST_TEST(!run.log_histogram("warm", d32, 16, chorus::DeviceDtype::float32, stream, {.step = 0}).wait());
    CUDA_OK(rt().LaunchHostFunc(stream, &Gate::wait, &gate));
    std::vector<chorus::Pending> tickets;
    for (int s = 1; s <= 3; ++s) {
      tickets.push_back(run.log_histogram("f32", d32, n, chorus::DeviceDtype::float32, stream, {.step = s}));
      tickets.push_back(run.log_histogram("f16", d16, n, chorus::DeviceDtype::float16, stream, {.step = s}));
      tickets.push_back(run.log_histogram("bf16", dbf, n, chorus::DeviceDtype::bfloat16, stream, {.step = s}));
      run.log({{"host/y", static_cast<double>(s)}}, {.step = s});
    }
    // Every call returned with the stream still held: chorus never waited on it.
    BOOST_TEST(rt().StreamQuery(stream) == cuda::not_ready);
    BOOST_TEST(!tickets.front().ready());
    gate.open = true;
    for (auto& t : tickets) BOOST_TEST(!t.wait(), t.wait().message());
    // A host pointer is refused with the fix; nothing of it is logged.
    chorus::Error host = run.log_histogram("bad", f32.data(), n, chorus::DeviceDtype::float32, stream, {.step = 4}).wait();
    BOOST_TEST(host.message().find("not GPU memory") != std::string::npos, host.message());
    auto r = run.finish().wait();
    BOOST_TEST(!r.error, r.error.message());
    rd = r.run_dir;
  }
  const chorus::Histogram want32{std::span<const float>(f32)};
  const chorus::Histogram want16{std::span<const float>(f16_values)};
  const chorus::Histogram wantbf{std::span<const float>(bf16_values)};
  std::size_t seen = 0;
  for (const auto& line : read_histograms(rd)) {
    if (line.column == "warm" || line.column == "bad") {
      BOOST_TEST(line.column == "warm");
      continue;
    }
    const chorus::Histogram& want = line.column == "f32" ? want32 : line.column == "f16" ? want16 : wantbf;
    BOOST_TEST_CONTEXT(line.column << " at step " << line.step) {
      ++seen;
      BOOST_TEST(line.value.count() == want.count());
      BOOST_TEST(line.value.nan_count() == want.nan_count());
      BOOST_TEST(line.value.pos_inf_count() == want.pos_inf_count());
      BOOST_TEST(line.value.neg_inf_count() == want.neg_inf_count());
      BOOST_TEST(line.value.min() == want.min());
      BOOST_TEST(line.value.max() == want.max());
      BOOST_TEST(std::fabs(line.value.sum() - want.sum()) <= 1e-9 * std::max(1.0, std::fabs(want.sum())));
      const auto a = line.value.buckets(), b = want.buckets();
      BOOST_REQUIRE_EQUAL(a.size(), b.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < a.size(); ++i) differ += a[i].lo != b[i].lo || a[i].count != b[i].count;
      BOOST_TEST(differ == 0u);
    }
  }
  BOOST_TEST(seen == 9u);
  rt().Free(d32);
  rt().Free(d16);
  rt().Free(dbf);
  rt().StreamDestroy(stream);
}
