// The upload backends, found by the name of their URL scheme. A backend is
// its own source file, which defines chorus::upload::backends::NAME() (its
// BackendSpec below), and its chorus_upload_backend line in
// io/CMakeLists.txt, from which the tables of backends are generated: the
// factory, the URL grammar, `chorus sync --help` and the Uploader name no
// backend.
#pragma once

#include "io/upload/upload.hpp"

#include <optional>
#include <span>
#include <string_view>

namespace chorus::upload {

/// What a backend is made from.
struct BackendContext {
  const UploadTarget& target;
  /// The upload's HTTP connections (BackendSpec::connections of them); null
  /// for a backend that asked for none (one that writes files).
  HttpClient* http = nullptr;
};

/// How a backend is made, and what it needs.
struct BackendSpec {
  /// HTTP requests the backend has in flight at once; 0: it speaks no HTTP.
  std::size_t connections = 0;
  /// What the one path part the URL may have after the host names ("a W&B
  /// entity": UploadTarget::entity), and the variable read where the URL
  /// has none ("WANDB_ENTITY"); an empty `path`: the URL takes no path.
  std::string_view path, path_variable;
  /// The URL's path (and query) is a secret, a webhook's (Slack's
  /// /services/T/B/SECRET): it may be anything, and goes in
  /// UploadTarget::path only; messages, the offsets file and the files'
  /// names show the URL as NAME://HOST/… (UploadTarget::parse).
  bool secret_path = false;
  /// The backend for `context.target`, or why there is none (a missing key, say).
  Result<std::unique_ptr<Backend>> (*make)(const BackendContext& context) = nullptr;
};

/// The backend named `name` (UploadTarget::backend), if there is one.
[[nodiscard]] std::optional<BackendSpec> find_backend(std::string_view name);

namespace detail {

struct RegisteredBackend {
  std::string_view name;
  BackendSpec (*spec)();
};

/// Every backend, in the order of io/CMakeLists.txt (generated there).
[[nodiscard]] std::span<const RegisteredBackend> registered_backends() noexcept;

} // namespace detail
} // namespace chorus::upload
