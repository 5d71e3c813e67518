// TensorBoard 2.13's own Python package, where it is at hand beside the
// checkout (peers/tensorboard-2.13.0 of the shared folder) and imports with
// /usr/bin/python3: the tests run a script of theirs through it to read the
// event files chorus wrote as TensorBoard reads them.
#pragma once

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace chorus::test::tfevents {

/// The package's folder; where it is missing or does not import, nothing,
/// and the test's log says that it is skipped and why.
inline std::optional<std::filesystem::path> tensorboard_peer() {
  namespace fs = std::filesystem;
  for (const fs::path& d : {fs::path(CHORUS_SOURCE_DIR) / "shared/peers/tensorboard-2.13.0",
                            fs::path(CHORUS_SOURCE_DIR) / "../shared/peers/tensorboard-2.13.0"}) {
    if (!fs::is_directory(d)) continue;
    const std::string cmd = "PYTHONPATH=" + d.string() +
                            " /usr/bin/python3 -c 'from tensorboard.backend.event_processing import event_accumulator'"
                            " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return d;
    break;
  }
  BOOST_TEST_MESSAGE("skipped: TensorBoard 2.13's package is not in ../shared/peers/tensorboard-2.13.0, or does not "
                     "import with /usr/bin/python3 (it needs python3-protobuf, python3-absl, python3-numpy)");
  return std::nullopt;
}

/// The standard output and error of the Python script at `script` run with
/// `args` (words for the shell) through the package at `peer`; a script
/// that fails fails the test.
inline std::string run_with_tensorboard(const std::filesystem::path& peer, const std::filesystem::path& script,
                                        const std::string& args) {
  const std::string cmd = "PYTHONPATH=" + peer.string() + " /usr/bin/python3 " + script.string() + " " + args + " 2>&1";
  std::string said;
  if (std::FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) said.append(buf, n);
    BOOST_TEST(::pclose(p) == 0, said);
  } else {
    BOOST_TEST(false, "cannot run " << cmd);
  }
  return said;
}

} // namespace chorus::test::tfevents
