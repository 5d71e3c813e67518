// NVML on a real GPU (ctest label `gpu`): skipped where there is none.
#define BOOST_TEST_MODULE io_nvml_gpu
#include <boost/test/unit_test.hpp>

#include "io/sampling/nvml.hpp"
#include "tests/gpu.hpp"

#include <chrono>
#include <cstdlib>
#include <string>

using namespace chorus::sampling;

namespace {

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

// Loaded once; the whole program is skipped where there is no NVML or no GPU.
const Nvml& nvml() {
  static const std::unique_ptr<Nvml> loaded = [] {
    auto loaded = Nvml::load();
    std::unique_ptr<Nvml> n = loaded ? std::move(*loaded) : nullptr;
    if (!n || n->device_count() == 0) {
      std::string line("no NVIDIA GPU/NVML here: ");
      line.append(n ? "NVML sees no GPU" : loaded.error().message());
      chorus::test::skip_test(line);
    }
    return n;
  }();
  return *loaded;
}

// find() as a number, -1 for none, so that a failed check prints it.
long found(const Nvml& n, const std::string& id, std::string& why) {
  const auto i = n.find(id);
  why = i ? std::string() : i.error().message();
  return i ? static_cast<long>(*i) : -1L;
}

std::string show(const std::optional<double>& v) { return v ? std::to_string(*v) : std::string("absent"); }

// The shortest prefix of uuid(i), at least "GPU-" and 4 hex digits, that no
// other GPU's UUID starts with.
std::string unique_prefix(const Nvml& n, unsigned i) {
  const auto u = n.uuid(i);
  for (std::size_t len = 8; len < u.size(); ++len) {
    const auto p = u.substr(0, len);
    bool unique = true;
    for (unsigned j = 0; j < n.device_count(); ++j)
      if (j != i && n.uuid(j).starts_with(p)) unique = false;
    if (unique) return p;
  }
  return u;
}

} // namespace

BOOST_AUTO_TEST_CASE(every_device_reports_plausible_values) {
  const auto& n = nvml();
  for (unsigned i = 0; i < n.device_count(); ++i) {
    const auto name = n.name(i);
    const auto uuid = n.uuid(i);
    BOOST_TEST(!name.empty());
    BOOST_TEST(uuid.starts_with("GPU-"), uuid);
    GpuSample s;
    const auto err = n.sample(i, s);
    BOOST_TEST(!err, err.message());
    BOOST_TEST_MESSAGE("GPU " << i << " " << name << " " << uuid << ": utilization " << show(s.utilization_percent)
                              << " %, memory utilization " << show(s.memory_utilization_percent) << " %, memory "
                              << show(s.memory_used_bytes) << " / " << show(s.memory_total_bytes) << " B, "
                              << show(s.temperature_c) << " C, " << show(s.power_w) << " W, SM "
                              << show(s.sm_clock_mhz) << " MHz, memory " << show(s.memory_clock_mhz) << " MHz");
    // A MIG-mode GPU has no utilization, an old one may lack power or clocks:
    // absent fields are allowed, wrong ones are not. Memory every GPU reports.
    if (s.utilization_percent) BOOST_TEST((*s.utilization_percent >= 0 && *s.utilization_percent <= 100));
    if (s.memory_utilization_percent)
      BOOST_TEST((*s.memory_utilization_percent >= 0 && *s.memory_utilization_percent <= 100));
    BOOST_TEST_REQUIRE(s.memory_used_bytes.has_value());
    BOOST_TEST_REQUIRE(s.memory_total_bytes.has_value());
    BOOST_TEST(*s.memory_used_bytes > 0);
    BOOST_TEST(*s.memory_used_bytes <= *s.memory_total_bytes);
    BOOST_TEST(*s.memory_total_bytes > 1 * gib);
    if (s.temperature_c) BOOST_TEST((*s.temperature_c > 0 && *s.temperature_c < 120));
    if (s.power_w) BOOST_TEST((*s.power_w > 0 && *s.power_w < 2000));
    if (s.sm_clock_mhz) BOOST_TEST((*s.sm_clock_mhz > 0 && *s.sm_clock_mhz < 10000));
    if (s.memory_clock_mhz) BOOST_TEST((*s.memory_clock_mhz > 0 && *s.memory_clock_mhz < 10000));
  }
}

BOOST_AUTO_TEST_CASE(find_maps_indices_uuids_and_prefixes_back) {
  const auto& n = nvml();
  std::string why;
  BOOST_TEST(found(n, "0", why) == 0, why);
  for (unsigned i = 0; i < n.device_count(); ++i) {
    const auto uuid = n.uuid(i);
    const auto prefix = unique_prefix(n, i);
    BOOST_TEST_MESSAGE("GPU " << i << ": " << uuid << ", shortest unique prefix " << prefix);
    std::string padded(" ");
    padded.append(uuid).append(" ");
    BOOST_TEST(found(n, std::to_string(i), why) == i, why);
    BOOST_TEST(found(n, uuid, why) == i, why);
    BOOST_TEST(found(n, padded, why) == i, why);
    BOOST_TEST(found(n, prefix, why) == i, why);
  }
  for (const std::string& id : {std::to_string(n.device_count()), std::string("GPU-zz"), std::string("NoDevFiles")}) {
    BOOST_TEST(found(n, id, why) == -1L, id);
    BOOST_TEST_MESSAGE(why);
    BOOST_TEST(!why.empty());
  }
}

BOOST_AUTO_TEST_CASE(every_local_rank_finds_its_device_under_this_environment) {
  const auto& n = nvml();
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  BOOST_TEST_MESSAGE("CUDA_VISIBLE_DEVICES=" << (env ? env : "(unset)"));
  const auto visible = parse_cuda_visible_devices(env);
  for (unsigned rank = 0; rank < 2 * n.device_count(); ++rank) {
    const auto id = rank_gpu_id(visible, rank, n.device_count());
    if (!id) continue;
    const auto index = n.find(*id);
    BOOST_TEST(index.has_value(), "local rank " << rank << ", id " << *id << ": " << index.error().message());
    if (index) BOOST_TEST_MESSAGE("local rank " << rank << " -> " << *id << " -> GPU " << *index);
  }
}

BOOST_AUTO_TEST_CASE(sampling_is_cheap) {
  const auto& n = nvml();
  constexpr int samples = 1000;
  GpuSample s;
  int failures = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < samples; ++k)
    if (n.sample(0, s)) ++failures;
  const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
  BOOST_TEST(failures == 0);
  BOOST_TEST(s.memory_total_bytes.has_value());
  BOOST_TEST_MESSAGE("sample(): " << took.count() / samples << " us each, mean of " << samples);
}
