// upload/<target>.lock: one process at a time uploads a run to a target.
#pragma once

#include "runtime/core/result.hpp"

#include <string>

namespace chorus::upload {

/// Takes the lock `path` (flock) and writes this process's pid into it; the
/// descriptor holds it until closed. An error names the holder's pid, and
/// `what` ("RUN to URL") as the upload it is in the way of.
[[nodiscard]] Result<int> take_upload_lock(const std::string& path, const std::string& what);

} // namespace chorus::upload
