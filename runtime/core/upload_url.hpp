// The grammar of an upload target's URL, parsed here only: Options checks
// CHORUS_UPLOAD (Options::upload) with it when a process starts
// (runtime/core/options.cpp), and the Uploader takes its target from it
// (io/upload/upload.cpp), each with its own words for what is wrong.
//
//   mlflow://HOST:PORT          MLflow over http    mlflow+https://HOST:PORT  over https
//   wandb://HOST[/ENTITY]       W&B over https      wandb+http://HOST:PORT[/ENTITY]  over http
//
// (mlflow+http:// and wandb+https:// spell the defaults out.)
#pragma once

#include <string>
#include <string_view>

namespace chorus::detail {

struct UploadUrl {
  enum class Kind { mlflow, wandb };
  Kind kind = Kind::mlflow;
  bool https = false;
  std::string_view scheme;    // as written: "mlflow", "wandb+http", ...
  std::string_view authority; // HOST[:PORT], with the credentials where the URL holds some
  std::string_view path;      // what follows the host, without the slashes around it (a W&B entity)

  /// What makes a text no upload target, in the order parse() looks.
  enum class Problem {
    none,
    no_scheme,      // no "://"
    unknown_scheme, // not one of the schemes above
    empty,          // nothing after "://"
    credentials,    // USER[:PASSWORD]@ before the host: they would be written into the run's files
    no_host,        // nothing between "://" and the path
    mlflow_path,    // a path after an MLflow host (its API is at the server's root)
    deep_path,      // a path of more than one part (only a W&B entity may follow the host)
  };

  /// Parses `url` into `out` (views into `url`); returns its first problem.
  /// `out` holds what was read up to it.
  [[nodiscard]] static Problem parse(std::string_view url, UploadUrl& out);

  /// The URL as an error may show it where it holds credentials:
  /// "SCHEME://***@HOST...".
  [[nodiscard]] std::string masked() const;
};

} // namespace chorus::detail
