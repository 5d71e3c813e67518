// The grammar of an upload target's URL, parsed here only: Options checks
// CHORUS_UPLOAD (Options::upload) with it when a process starts
// (runtime/core/options.cpp), and the Uploader takes its target from it
// (io/upload/registry.cpp), each with its own words for what is wrong.
//
//   NAME://HOST[:PORT][/PATH]          the backend NAME over its usual protocol
//   NAME+http://..., NAME+https://...  over the protocol named
//   NAME:DIR (or NAME://DIR)           a backend that writes files (PROTOCOL
//                                      file in its line), into the directory DIR
//
// The names, and how each backend's URL reads, come from the backends
// themselves: each one's line in io/CMakeLists.txt (chorus_upload_backend)
// adds it to upload_schemes(), a table generated into chorus_core, so that
// this layer knows every backend without depending on the layer that holds
// them. What a path after the host means is the backend's to say
// (upload::UploadTarget::parse).
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace chorus::core {

/// One upload backend as a URL names it (generated from io/CMakeLists.txt).
struct UploadScheme {
  std::string_view name;        // "mlflow": the URL's scheme, before any "+http"/"+https"
  std::string_view title;       // "MLflow": how messages name the server
  std::string_view address;     // "HOST:PORT": what follows "NAME://" in the usage
  bool https = false;           // the protocol of NAME:// (NAME+http:// and NAME+https:// choose)
  std::string_view credentials; // where its key comes from ("WANDB_API_KEY"), "" for none
  bool local = false;           // writes files into a directory: "tensorboard:DIR"

  /// "mlflow://HOST:PORT", or with `other_protocol` "mlflow+https://HOST:PORT";
  /// "tensorboard:DIR" for a local one (which has no other protocol).
  [[nodiscard]] std::string usage(bool other_protocol) const;
};

/// Every backend, in the order io/CMakeLists.txt lists them.
[[nodiscard]] std::span<const UploadScheme> upload_schemes() noexcept;

/// The backend named `name`, or null.
[[nodiscard]] const UploadScheme* find_upload_scheme(std::string_view name) noexcept;

/// The URL forms, for an error or a help text: "mlflow://HOST:PORT or
/// wandb://HOST[/ENTITY]", and with `both_protocols` the other protocol's
/// spelling after each ("mlflow://HOST:PORT, mlflow+https://HOST:PORT, ...").
[[nodiscard]] std::string upload_url_forms(bool both_protocols);

/// "mlflow+https://, wandb+http://": each backend's other protocol.
[[nodiscard]] std::string upload_other_protocols();

/// Where each backend's key comes from: "MLflow's in X, W&B's in Y".
[[nodiscard]] std::string upload_credentials();

/// An upload URL as a message may show it, whatever it holds: its scheme and
/// host, with credentials masked and the path cut ("webhook://HOST/…"): a
/// webhook's path is its secret. Text with no scheme keeps what comes before
/// its first '/'.
[[nodiscard]] std::string shown_upload_url(std::string_view url);

struct UploadUrl {
  const UploadScheme* backend = nullptr; // the scheme's backend, once known
  bool https = false;
  std::string_view scheme;    // as written: "mlflow", "wandb+http", ...
  std::string_view authority; // HOST[:PORT], with the credentials where the URL holds some ("" for a local backend)
  std::string_view path;      // what follows the host, without the slashes around it (a W&B entity);
                              // a local backend's directory

  /// What makes a text no upload target, in the order parse() looks.
  enum class Problem {
    none,
    no_scheme,      // no "://", and no local backend's "NAME:"
    unknown_scheme, // no backend's name (with "+http" or "+https" or without)
    empty,          // nothing after "://" (or a local backend's "NAME:")
    credentials,    // USER[:PASSWORD]@ before the host: they would be written into the run's files
    no_host,        // nothing between "://" and the path
  };

  /// Parses `url` into `out` (views into `url`); returns its first problem.
  /// `out` holds what was read up to it.
  [[nodiscard]] static Problem parse(std::string_view url, UploadUrl& out);

  /// The URL as an error may show it where it holds credentials:
  /// "SCHEME://***@HOST...".
  [[nodiscard]] std::string masked() const;
};

} // namespace chorus::core
