// Options for a run of this process alone, for the tests that call the API
// directly (the harness itself needs no chorus headers: install_test uses it).
#pragma once

#include "harness.hpp"

#include <chorus/chorus.hpp>

#include <string>

namespace e2e {

/// A one-process run under `dir`, blind to the environment (the test's own
/// launcher variables must not place it).
inline chorus::Options local_options(const TempDir& dir, const std::string& project) {
  chorus::Options opt;
  opt.project = project;
  opt.dir = dir.path.string();
  opt.read_env = false;
  opt.topology = chorus::Topology{};
  return opt;
}

} // namespace e2e
