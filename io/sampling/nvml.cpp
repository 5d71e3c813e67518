#include "io/sampling/nvml.hpp"
#include "io/platform/posix.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <dlfcn.h>
#include <utility>

namespace chorus::sampling {
namespace {

// The part of NVML's C ABI used here, declared by hand so that chorus builds
// without NVML's header or library. nvmlReturn_t and the enums are C enums,
// passed as int.
struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque*; // nvmlDevice_t
using NvmlReturn = int;               // nvmlReturn_t

constexpr NvmlReturn nvml_success = 0;
constexpr NvmlReturn nvml_error_not_supported = 3;
constexpr int nvml_temperature_gpu = 0; // nvmlTemperatureSensors_t
constexpr int nvml_clock_sm = 1;        // nvmlClockType_t
constexpr int nvml_clock_mem = 2;
// NVML_DEVICE_NAME_V2_BUFFER_SIZE and NVML_DEVICE_UUID_V2_BUFFER_SIZE.
constexpr unsigned nvml_name_size = 96;
constexpr unsigned nvml_uuid_size = 96;

struct NvmlMemory { // nvmlMemory_t, bytes
  unsigned long long total, free, used;
};
struct NvmlUtilization { // nvmlUtilization_t, percent
  unsigned int gpu, memory;
};
static_assert(sizeof(NvmlMemory) == 24 && sizeof(NvmlUtilization) == 8);

constexpr std::string_view no_metrics = ": no GPU metrics";

std::string_view trim(std::string_view s) {
  constexpr std::string_view space = " \t\n\r\f\v";
  const auto b = s.find_first_not_of(space);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}

template <class Pred>
bool all_chars(std::string_view s, Pred pred) {
  return std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); });
}

/// A device index, if `s` is one that fits in unsigned.
std::optional<unsigned> as_index(std::string_view s) {
  if (s.empty() || !all_chars(s, [](unsigned char c) { return std::isdigit(c) != 0; })) return std::nullopt;
  unsigned v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

bool valid_entry(std::string_view e) {
  if (as_index(e)) return true;
  if (e.size() > 4 && e.starts_with("GPU-"))
    return all_chars(e.substr(4), [](unsigned char c) { return std::isxdigit(c) || c == '-'; });
  if (e.size() > 4 && e.starts_with("MIG-"))
    return all_chars(e.substr(4), [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '/'; });
  return false;
}

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), s.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
         });
}

/// dlerror(), or `fallback`, on one line.
std::string dl_error(std::string_view fallback) {
  const char* e = ::dlerror();
  std::string s(e ? std::string_view(e) : fallback);
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}


} // namespace

struct Nvml::Api {
  void* lib = nullptr;
  bool started = false; // nvmlInit_v2 succeeded: shut down on the way out
  std::vector<NvmlDevice> devices;

  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*count)(unsigned*) = nullptr;
  NvmlReturn (*by_index)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*by_uuid)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*get_uuid)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*get_name)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*power)(NvmlDevice, unsigned*) = nullptr; // milliwatts
  NvmlReturn (*clock)(NvmlDevice, int, unsigned*) = nullptr;
  // MIG (R450 and later): optional, only find() uses them.
  NvmlReturn (*mig_parent)(NvmlDevice, NvmlDevice*) = nullptr;
  NvmlReturn (*mig_count)(NvmlDevice, unsigned*) = nullptr;
  NvmlReturn (*mig_by_index)(NvmlDevice, unsigned, NvmlDevice*) = nullptr;

  Api() = default;
  Api(const Api&) = delete;
  Api& operator=(const Api&) = delete;
  ~Api() {
    if (started) shutdown();
    if (lib) ::dlclose(lib);
  }

  std::string_view describe(NvmlReturn r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return s ? std::string_view(s) : std::string_view("unknown NVML error");
  }

  std::string uuid_of(NvmlDevice d) const {
    char buf[nvml_uuid_size] = {};
    if (!d || get_uuid(d, buf, sizeof buf) != nvml_success) return {};
    return std::string(buf, ::strnlen(buf, sizeof buf));
  }

  /// The index of GPU `d` (not a MIG device), if NVML enumerates it.
  std::optional<unsigned> index_of(NvmlDevice d) const {
    for (unsigned i = 0; i < devices.size(); ++i)
      if (devices[i] == d) return i;
    // Handles are stable pointers in practice; the UUID settles it otherwise.
    const auto u = uuid_of(d);
    for (unsigned i = 0; !u.empty() && i < devices.size(); ++i)
      if (uuid_of(devices[i]) == u) return i;
    return std::nullopt;
  }

  /// (UUID, index of the GPU) for every GPU, or for every MIG device.
  std::vector<std::pair<std::string, unsigned>> uuids(bool mig) const {
    std::vector<std::pair<std::string, unsigned>> out;
    for (unsigned i = 0; i < devices.size(); ++i) {
      if (!mig) {
        if (auto u = uuid_of(devices[i]); !u.empty()) out.emplace_back(std::move(u), i);
        continue;
      }
      unsigned n = 0;
      if (!mig_count || !mig_by_index || !devices[i] || mig_count(devices[i], &n) != nvml_success) continue;
      for (unsigned j = 0; j < n; ++j) {
        NvmlDevice m = nullptr;
        if (mig_by_index(devices[i], j, &m) != nvml_success) continue; // an empty slot
        if (auto u = uuid_of(m); !u.empty()) out.emplace_back(std::move(u), i);
      }
    }
    return out;
  }
};

Nvml::Nvml(std::unique_ptr<Api> api) noexcept : api_(std::move(api)) {}

Nvml::~Nvml() = default;

Result<std::unique_ptr<Nvml>> Nvml::load(const char* library) try {
  std::string why_not;
  auto not_loaded = [&why_not] { return Error(Errc::io_error, why_not); };
  auto api = std::make_unique<Api>();
  const std::string_view lib_name = library ? library : "(null)";
  ::dlerror();
  api->lib = library ? ::dlopen(library, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!api->lib) {
    const auto e = dl_error("no library named");
    why_not.assign("NVML not found (");
    if (e.find(lib_name) == std::string::npos) why_not.append(lib_name).append(": ");
    why_not.append(e).append(")").append(no_metrics);
    return not_loaded();
  }

  // The _v2 entry points are what NVML's own header maps the plain names to;
  // the plain symbols remain for old binaries.
  bool missing = false;
  auto need = [&]<class F>(F& fn, const char* symbol) {
    if (missing) return;
    fn = platform::dl_symbol<F>(api->lib, symbol);
    if (fn) return;
    missing = true;
    why_not.assign(lib_name).append(" is not a usable NVML (").append(dl_error(symbol)).append(")");
    why_not.append(no_metrics);
  };
  need(api->init, "nvmlInit_v2");
  need(api->shutdown, "nvmlShutdown");
  need(api->error_string, "nvmlErrorString");
  need(api->count, "nvmlDeviceGetCount_v2");
  need(api->by_index, "nvmlDeviceGetHandleByIndex_v2");
  need(api->by_uuid, "nvmlDeviceGetHandleByUUID");
  need(api->get_uuid, "nvmlDeviceGetUUID");
  need(api->get_name, "nvmlDeviceGetName");
  need(api->utilization, "nvmlDeviceGetUtilizationRates");
  need(api->memory, "nvmlDeviceGetMemoryInfo");
  need(api->temperature, "nvmlDeviceGetTemperature");
  need(api->power, "nvmlDeviceGetPowerUsage");
  need(api->clock, "nvmlDeviceGetClockInfo");
  if (missing) return not_loaded();
  using MigParent = decltype(api->mig_parent);
  using MigCount = decltype(api->mig_count);
  using MigByIndex = decltype(api->mig_by_index);
  api->mig_parent = platform::dl_symbol<MigParent>(api->lib, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
  api->mig_count = platform::dl_symbol<MigCount>(api->lib, "nvmlDeviceGetMaxMigDeviceCount");
  api->mig_by_index = platform::dl_symbol<MigByIndex>(api->lib, "nvmlDeviceGetMigDeviceHandleByIndex");

  if (const auto r = api->init(); r != nvml_success) {
    why_not.assign("NVML could not start (").append(api->describe(r)).append(")").append(no_metrics);
    return not_loaded();
  }
  api->started = true;
  unsigned n = 0;
  if (const auto r = api->count(&n); r != nvml_success) {
    why_not.assign("NVML could not count the GPUs (").append(api->describe(r)).append(")").append(no_metrics);
    return not_loaded();
  }
  // A GPU NVML cannot open keeps its index (so indices match nvidia-smi's) and
  // a null handle: sample() reports it.
  api->devices.assign(n, nullptr);
  for (unsigned i = 0; i < n; ++i)
    if (api->by_index(i, &api->devices[i]) != nvml_success) api->devices[i] = nullptr;
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
} catch (const std::exception& e) {
  return Error(Errc::io_error, std::string("NVML could not be loaded (").append(e.what()).append(")").append(no_metrics));
}

unsigned Nvml::device_count() const noexcept { return static_cast<unsigned>(api_->devices.size()); }

std::string Nvml::name(unsigned index) const {
  char buf[nvml_name_size] = {};
  if (index >= api_->devices.size() || !api_->devices[index] ||
      api_->get_name(api_->devices[index], buf, sizeof buf) != nvml_success)
    return {};
  return std::string(buf, ::strnlen(buf, sizeof buf));
}

std::string Nvml::uuid(unsigned index) const {
  return index < api_->devices.size() ? api_->uuid_of(api_->devices[index]) : std::string();
}

Result<unsigned> Nvml::find(std::string_view id) const {
  std::string why_not;
  auto none = [&why_not] { return Error(Errc::invalid_argument, why_not); };
  id = trim(id);
  const auto count = std::to_string(api_->devices.size());
  if (const auto i = as_index(id)) {
    if (*i < api_->devices.size()) return *i;
    why_not.assign("no GPU with index ").append(id).append(": NVML sees ").append(count);
    return none();
  }
  // CUDA's older MIG form, MIG-GPU-<uuid>/<gi>/<ci>, names the GPU by its UUID.
  if (id.starts_with("MIG-GPU-")) id = id.substr(4, id.find('/') - 4);
  const bool mig = id.starts_with("MIG-");
  if (!mig && !id.starts_with("GPU-")) {
    why_not.assign("not a GPU index, GPU-<uuid> or MIG-<uuid>: ").append(id);
    return none();
  }

  const std::string full(id);
  NvmlDevice d = nullptr;
  if (api_->by_uuid(full.c_str(), &d) == nvml_success) {
    NvmlDevice parent = nullptr;
    if (mig && api_->mig_parent && api_->mig_parent(d, &parent) == nvml_success) d = parent;
    if (auto i = api_->index_of(d)) return *i;
  }
  // CUDA also takes a prefix of a UUID, if only one device has it.
  std::optional<unsigned> found;
  unsigned matches = 0;
  for (const auto& [u, i] : api_->uuids(mig)) {
    if (!starts_with_nocase(u, id)) continue;
    ++matches;
    found = i;
  }
  if (matches == 1) return *found;
  why_not.assign(matches == 0 ? "no " : "more than one ").append(mig ? "MIG device" : "GPU");
  why_not.append(" has a UUID starting with ").append(id).append("; NVML sees ").append(count);
  return none();
}

Error Nvml::sample(unsigned index, GpuSample& out) const {
  out = GpuSample{};
  if (index >= api_->devices.size()) {
    std::string m("no GPU with index ");
    m.append(std::to_string(index)).append(": NVML sees ").append(std::to_string(api_->devices.size()));
    return Error{Errc::invalid_argument, std::move(m)};
  }
  const NvmlDevice d = api_->devices[index];
  const char* failed_call = d ? nullptr : "nvmlDeviceGetHandleByIndex_v2";
  NvmlReturn failure = nvml_success;
  // NOT_SUPPORTED is how a device says it lacks a field, not a failure.
  auto ok = [&](NvmlReturn r, const char* call) {
    if (r == nvml_success) return true;
    if (r != nvml_error_not_supported && !failed_call) {
      failed_call = call;
      failure = r;
    }
    return false;
  };
  if (d) {
    NvmlUtilization u{};
    if (ok(api_->utilization(d, &u), "nvmlDeviceGetUtilizationRates")) {
      out.utilization_percent = u.gpu;
      out.memory_utilization_percent = u.memory;
    }
    NvmlMemory m{};
    if (ok(api_->memory(d, &m), "nvmlDeviceGetMemoryInfo")) {
      out.memory_used_bytes = static_cast<double>(m.used);
      out.memory_total_bytes = static_cast<double>(m.total);
    }
    unsigned v = 0;
    if (ok(api_->temperature(d, nvml_temperature_gpu, &v), "nvmlDeviceGetTemperature")) out.temperature_c = v;
    if (ok(api_->power(d, &v), "nvmlDeviceGetPowerUsage")) out.power_w = v / 1000.0;
    if (ok(api_->clock(d, nvml_clock_sm, &v), "nvmlDeviceGetClockInfo(SM)")) out.sm_clock_mhz = v;
    if (ok(api_->clock(d, nvml_clock_mem, &v), "nvmlDeviceGetClockInfo(MEM)")) out.memory_clock_mhz = v;
  }
  if (!failed_call) return {};
  std::string m(failed_call);
  m.append(" on GPU ").append(std::to_string(index)).append(": ");
  m.append(d ? api_->describe(failure) : std::string_view("NVML could not open it"));
  m.append(". Check the GPU with nvidia-smi.");
  return Error{Errc::io_error, std::move(m)};
}

VisibleDevices parse_cuda_visible_devices(const char* value) {
  VisibleDevices v;
  if (!value) return v;
  v.all = false;
  std::string_view rest(value);
  while (true) {
    const auto comma = rest.find(',');
    const auto entry = trim(rest.substr(0, comma));
    if (!valid_entry(entry)) break;
    v.ids.emplace_back(entry);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return v;
}

std::optional<std::string> rank_gpu_id(const VisibleDevices& visible, unsigned local_rank, unsigned device_count) {
  if (device_count == 0) return std::nullopt;
  if (visible.all) return std::to_string(local_rank % device_count);
  std::size_t usable = 0;
  for (; usable < visible.ids.size(); ++usable) {
    const auto& e = visible.ids[usable];
    const bool is_number = !e.empty() && std::isdigit(static_cast<unsigned char>(e.front()));
    if (is_number) {
      const auto i = as_index(e);
      if (!i || *i >= device_count) break;
    }
  }
  if (usable == 0) return std::nullopt;
  return visible.ids[local_rank % usable];
}

} // namespace chorus::sampling
