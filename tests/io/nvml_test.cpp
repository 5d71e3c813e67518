// What needs no GPU: reading CUDA_VISIBLE_DEVICES, choosing a rank's device,
// and loading NVML where it is missing or is not NVML at all.
#define BOOST_TEST_MODULE io_nvml
#include <boost/test/unit_test.hpp>

#include "io/sampling/nvml.hpp"

#include <optional>
#include <string>
#include <vector>

using namespace chorus::sampling;
BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)
using Ids = std::vector<std::string>;

namespace {

std::string or_none(const std::optional<std::string>& id) { return id ? *id : std::string("<none>"); }

VisibleDevices visible(Ids ids) { return VisibleDevices{false, std::move(ids)}; }

} // namespace

BOOST_AUTO_TEST_CASE(unset_means_every_device) {
  const auto v = parse_cuda_visible_devices(nullptr);
  BOOST_TEST(v.all);
  BOOST_TEST(v.ids.empty());
}

BOOST_AUTO_TEST_CASE(set_but_naming_nothing_means_no_device) {
  for (const char* value : {"", " ", "-1", "NoDevFiles", ",0", "x,0", "GPU-", "GPU-xyz", "99999999999999999999"}) {
    const auto v = parse_cuda_visible_devices(value);
    BOOST_TEST(!v.all, value);
    BOOST_TEST(v.ids.empty(), value);
  }
}

BOOST_AUTO_TEST_CASE(entries_are_comma_separated_and_trimmed) {
  BOOST_TEST(parse_cuda_visible_devices("0,1").ids == (Ids{"0", "1"}));
  BOOST_TEST(parse_cuda_visible_devices(" 2 , 3 ").ids == (Ids{"2", "3"}));
  BOOST_TEST(parse_cuda_visible_devices("\t7\t").ids == (Ids{"7"}));
  BOOST_TEST(parse_cuda_visible_devices("GPU-abc,1").ids == (Ids{"GPU-abc", "1"}));
  BOOST_TEST(parse_cuda_visible_devices("GPU-8f1a2b3c-0d4e-5f60-7182-93a4b5c6d7e8").ids ==
             (Ids{"GPU-8f1a2b3c-0d4e-5f60-7182-93a4b5c6d7e8"}));
  BOOST_TEST(parse_cuda_visible_devices("MIG-5c8a1b2d-3e4f-5061-7283-94a5b6c7d8e9,MIG-GPU-8f1a2b3c/1/0").ids ==
             (Ids{"MIG-5c8a1b2d-3e4f-5061-7283-94a5b6c7d8e9", "MIG-GPU-8f1a2b3c/1/0"}));
  BOOST_TEST(parse_cuda_visible_devices("0,1,").ids == (Ids{"0", "1"}));
}

BOOST_AUTO_TEST_CASE(parsing_stops_at_the_first_invalid_entry) {
  BOOST_TEST(parse_cuda_visible_devices("0,x,1").ids == (Ids{"0"}));
  BOOST_TEST(parse_cuda_visible_devices("1,-1,0").ids == (Ids{"1"}));
  BOOST_TEST(parse_cuda_visible_devices("0,,1").ids == (Ids{"0"}));
  BOOST_TEST(parse_cuda_visible_devices("2,1 0,3").ids == (Ids{"2"}));
  BOOST_TEST(parse_cuda_visible_devices("3,GPU-zz,1").ids == (Ids{"3"}));
  BOOST_TEST(parse_cuda_visible_devices("GPU-abc,NoDevFiles").ids == (Ids{"GPU-abc"}));
}

BOOST_AUTO_TEST_CASE(every_device_visible_takes_local_rank_modulo_count) {
  const VisibleDevices all;
  BOOST_TEST(or_none(rank_gpu_id(all, 0, 4)) == "0");
  BOOST_TEST(or_none(rank_gpu_id(all, 3, 4)) == "3");
  BOOST_TEST(or_none(rank_gpu_id(all, 5, 4)) == "1");
  BOOST_TEST(or_none(rank_gpu_id(all, 7, 1)) == "0");
  BOOST_TEST(or_none(rank_gpu_id(all, 0, 0)) == "<none>");
}

BOOST_AUTO_TEST_CASE(a_visible_list_takes_local_rank_modulo_its_length) {
  const auto two = visible({"2", "3"});
  BOOST_TEST(or_none(rank_gpu_id(two, 0, 4)) == "2");
  BOOST_TEST(or_none(rank_gpu_id(two, 1, 4)) == "3");
  BOOST_TEST(or_none(rank_gpu_id(two, 2, 4)) == "2");
  const auto mixed = visible({"GPU-abc", "1"});
  BOOST_TEST(or_none(rank_gpu_id(mixed, 0, 2)) == "GPU-abc");
  BOOST_TEST(or_none(rank_gpu_id(mixed, 1, 2)) == "1");
  BOOST_TEST(or_none(rank_gpu_id(parse_cuda_visible_devices(" 1 , 0 "), 0, 2)) == "1");
}

BOOST_AUTO_TEST_CASE(no_visible_or_present_device_means_no_gpu) {
  BOOST_TEST(or_none(rank_gpu_id(visible({}), 0, 8)) == "<none>");
  BOOST_TEST(or_none(rank_gpu_id(parse_cuda_visible_devices("-1"), 0, 8)) == "<none>");
  BOOST_TEST(or_none(rank_gpu_id(parse_cuda_visible_devices(""), 3, 8)) == "<none>");
  BOOST_TEST(or_none(rank_gpu_id(visible({"0", "1"}), 0, 0)) == "<none>");
}

BOOST_AUTO_TEST_CASE(an_index_past_the_device_count_ends_the_list) {
  // As for CUDA: "0,5,1" on a 4-GPU machine makes device 0 the only one.
  const auto v = visible({"0", "5", "1"});
  BOOST_TEST(or_none(rank_gpu_id(v, 0, 4)) == "0");
  BOOST_TEST(or_none(rank_gpu_id(v, 1, 4)) == "0");
  BOOST_TEST(or_none(rank_gpu_id(visible({"3"}), 0, 2)) == "<none>");
  BOOST_TEST(or_none(rank_gpu_id(visible({"1", "0"}), 1, 2)) == "0");
}

BOOST_AUTO_TEST_CASE(a_missing_library_is_one_line_naming_it) {
  for (const char* lib : {"libchorus-no-such-nvml.so.1", "/nonexistent/dir/libnvidia-ml.so.1"}) {
    const auto nvml = Nvml::load(lib);
    BOOST_TEST(!nvml);
    const std::string why = nvml.error().message();
    BOOST_TEST_MESSAGE(why);
    BOOST_TEST(why.starts_with("NVML not found ("), why);
    BOOST_TEST(why.find(lib) != std::string::npos, why);
    BOOST_TEST(why.ends_with(": no GPU metrics"), why);
    BOOST_TEST(why.find('\n') == std::string::npos, why);
  }
}

BOOST_AUTO_TEST_CASE(a_library_without_nvml_is_refused_cleanly) {
  const auto nvml = Nvml::load("libm.so.6");
  BOOST_TEST(!nvml);
  const std::string why = nvml.error().message();
  BOOST_TEST_MESSAGE(why);
  BOOST_TEST(why.starts_with("libm.so.6 is not a usable NVML ("), why);
  BOOST_TEST(why.find("nvmlInit_v2") != std::string::npos, why);
  BOOST_TEST(why.ends_with(": no GPU metrics"), why);
  BOOST_TEST(why.find('\n') == std::string::npos, why);
}

BOOST_AUTO_TEST_CASE(the_default_library_loads_or_says_why_not) {
  // Either outcome is right, depending on the machine; each must be clean.
  const auto loaded = Nvml::load();
  if (!loaded) {
    const std::string why = loaded.error().message();
    BOOST_TEST_MESSAGE(why);
    BOOST_TEST(why.ends_with(": no GPU metrics"), why);
    return;
  }
  const auto& nvml = *loaded;
  const auto not_found = nvml->find("not-a-device");
  BOOST_TEST(!not_found);
  BOOST_TEST(!not_found.error().message().empty());
  chorus::sampling::GpuSample s;
  BOOST_TEST(nvml->sample(nvml->device_count(), s).code() == chorus::Errc::invalid_argument);
}
