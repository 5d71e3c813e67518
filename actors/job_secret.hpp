// The job's secret: what a rank's join carries, so that a process outside
// the job cannot take a rank's place in its run (nor a run host its place in
// the job's group) by joining first.
//
//   - CHORUS_JOB_SECRET, where set (16 to 4096 bytes, the same on every
//     process of the job): `chorus launch` sets it for the ranks it starts.
//   - Else, for links within a node (a Unix socket): a secret the job's
//     first process on the node makes, in a file of the user's private
//     socket directory (job-<hash of the job's identity>.secret, mode 0600),
//     which the job's other processes on the node read.
//   - Else none: across nodes, mutual TLS with the job's credentials is what
//     proves a peer is of the job (with CHORUS_INSECURE=1, only a
//     CHORUS_JOB_SECRET does).
#pragma once

#include "actors/links/links.hpp"
#include "runtime/core/options.hpp"
#include "runtime/core/result.hpp"

#include <string>
#include <string_view>

namespace chorus::actors {

/// The secret the joins over links of kind `link` carry for the job of `s`
/// ("" where none is asked); `socket_dir`: the user's socket directory.
[[nodiscard]] Result<std::string> job_secret(const core::Settings& s, Link link, const std::string& socket_dir);

/// Compares two secrets in time that does not depend on where they differ.
[[nodiscard]] bool same_secret(std::string_view a, std::string_view b) noexcept;

} // namespace chorus::actors
