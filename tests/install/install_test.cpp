// `cmake --install` gives what a user builds against: the CMake package
// (find_package(chorus) -> chorus::chorus), the pkg-config file and the
// chorus command. Installs into a temporary prefix and builds a project
// outside the tree both ways.
#define BOOST_TEST_MODULE install
#include <boost/test/unit_test.hpp>

#include "tests/e2e/harness.hpp"

#include <sstream>

using e2e::fs::path;
namespace fs = e2e::fs;
using e2e::TempDir;

namespace {

struct Result {
  int status;
  std::string out;
};

Result sh(const std::string& cmd) {
  e2e::Output o = e2e::run(cmd);
  return {o.status, o.text};
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

struct Installed {
  TempDir tmp;
  fs::path prefix = tmp.path / "prefix";
  Installed() {
    Result r = sh("cmake --install " + q(CHORUS_BINARY_DIR) + " --prefix " + q(prefix));
    BOOST_TEST_INFO(r.out);
    BOOST_REQUIRE_EQUAL(r.status, 0);
  }
};

/// Runs the consumer and checks that it logged three rows into a run under runs/.
void check_consumer(const fs::path& exe, const fs::path& runs, const std::string& env = "") {
  Result r = sh(env + q(exe) + " " + q(runs));
  BOOST_TEST_INFO(r.out);
  BOOST_REQUIRE_EQUAL(r.status, 0);
  // The consumer prints "<run dir> <rows>"; chorus's own notes ("chorus: ...") may come too.
  std::istringstream lines(r.out);
  std::string line, dir;
  unsigned long long rows = 0;
  while (std::getline(lines, line))
    if (!line.starts_with("chorus:")) std::istringstream(line) >> dir >> rows;
  BOOST_TEST(rows == 3u);
  BOOST_TEST(fs::exists(fs::path(dir) / "history.jsonl"));
  BOOST_TEST(fs::path(dir).string().rfind(runs.string(), 0) == 0u);
}

} // namespace

BOOST_FIXTURE_TEST_SUITE(installed, Installed)

BOOST_AUTO_TEST_CASE(installs_header_library_package_pkgconfig_and_command) {
  BOOST_TEST(fs::exists(prefix / "include/chorus/chorus.hpp"));
  BOOST_TEST(fs::exists(prefix / "include/chorus/asio.hpp"));
  BOOST_TEST(fs::exists(prefix / "bin/chorus"));
  bool lib = false, package = false, pc = false;
  for (auto& e : fs::recursive_directory_iterator(prefix)) {
    const auto name = e.path().filename().string();
    lib = lib || name == "libchorus.so";
    package = package || name == "chorusConfig.cmake";
    pc = pc || name == "chorus.pc";
  }
  BOOST_TEST(lib);
  BOOST_TEST(package);
  BOOST_TEST(pc);
  Result r = sh(q(prefix / "bin/chorus") + " --help");
  BOOST_TEST(r.status == 0);
  BOOST_TEST(r.out.find("launch") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(the_public_header_needs_no_caf_asio_or_cuda) {
  // Preprocess the installed header alone: it must not reach any of them.
  Result r = sh("echo '#include <chorus/chorus.hpp>' | c++ -std=c++20 -x c++ -E -H -I" + q(prefix / "include") +
                " - -o /dev/null");
  BOOST_TEST_INFO(r.out);
  BOOST_REQUIRE_EQUAL(r.status, 0);
  BOOST_TEST(r.out.find("caf/") == std::string::npos);
  BOOST_TEST(r.out.find("asio") == std::string::npos);
  BOOST_TEST(r.out.find("cuda") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(find_package_builds_and_links_a_project_outside_the_tree) {
  const fs::path build = tmp.path / "consumer-cmake";
  Result r = sh("cmake -S " + q(fs::path(CHORUS_SOURCE_DIR) / "tests/install/consumer") + " -B " + q(build) +
                " -DCMAKE_PREFIX_PATH=" + q(prefix) + " -DCMAKE_CXX_FLAGS='" CHORUS_TEST_CXX_FLAGS "' && cmake --build " +
                q(build));
  BOOST_TEST_INFO(r.out);
  BOOST_REQUIRE_EQUAL(r.status, 0);
  check_consumer(build / "consumer", tmp.path / "runs-cmake");
}

BOOST_AUTO_TEST_CASE(pkg_config_builds_and_links_a_program) {
  const fs::path exe = tmp.path / "consumer-pc";
  fs::path pcdir;
  for (auto& e : fs::recursive_directory_iterator(prefix))
    if (e.path().filename() == "chorus.pc") pcdir = e.path().parent_path();
  const std::string pc = "PKG_CONFIG_PATH=" + q(pcdir) + " pkg-config";
  Result r = sh("c++ " CHORUS_TEST_CXX_FLAGS " " + q(fs::path(CHORUS_SOURCE_DIR) / "tests/install/consumer/main.cpp") +
                " -o " + q(exe) + " $(" + pc + " --cflags chorus) $(" + pc + " --libs chorus)");
  BOOST_TEST_INFO(r.out);
  BOOST_REQUIRE_EQUAL(r.status, 0);
  // The .pc file's rpath finds the library in a prefix the loader does not search.
  check_consumer(exe, tmp.path / "runs-pc");
}

BOOST_AUTO_TEST_SUITE_END()
