// Uploader actor: one per upload target on the run host. It wraps
// upload::Uploader (which reads the run directory and feeds a backend) on a
// thread of its own (a detached actor: HTTP requests block), so that a slow
// or absent server never holds up the Run actor or training.
//
// Its interface is actors/protocol.hpp's uploader_actor. A drain (the run
// ended) sends everything, the end state last, for at most `ms` (less where
// the target does not answer); what is left stays for `chorus sync`, which
// the answer's `why` names.
#pragma once

#include "actors/protocol.hpp"
#include "io/upload/upload.hpp"

#include <string>

namespace chorus::actors {

/// The Uploader of the run in `run_dir` to `url`, with `settings` (its
/// read_bytes: how much of each file it reads at a time); an invalid handle
/// (and a line on stderr naming the cause) if it cannot start, in which case
/// the run goes on locally. Its sender blocks on requests: see Blocking.
/// `sender`, where given, gets that sender's handle: it ends a moment after
/// the Uploader (its request in flight cut short).
uploader_actor spawn_uploader(caf::actor_system& sys, const std::string& run_dir, const std::string& url,
                          upload::UploadSettings settings, Blocking blocking, caf::actor_addr run = {},
                          caf::actor* sender = nullptr);

} // namespace chorus::actors
