#include "runtime/core/upload_url.hpp"

namespace chorus::detail {

UploadUrl::Problem UploadUrl::parse(std::string_view url, UploadUrl& out) {
  out = {};
  const std::size_t sep = url.find("://");
  if (sep == std::string_view::npos) return Problem::no_scheme;
  out.scheme = url.substr(0, sep);
  if (out.scheme == "mlflow" || out.scheme == "mlflow+http" || out.scheme == "mlflow+https") {
    out.kind = Kind::mlflow;
    out.https = out.scheme == "mlflow+https";
  } else if (out.scheme == "wandb" || out.scheme == "wandb+https" || out.scheme == "wandb+http") {
    out.kind = Kind::wandb;
    out.https = out.scheme != "wandb+http";
  } else {
    return Problem::unknown_scheme;
  }
  const std::string_view rest = url.substr(sep + 3);
  if (rest.empty()) return Problem::empty;
  const std::size_t slash = rest.find('/');
  out.authority = rest.substr(0, slash);
  out.path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  while (!out.path.empty() && out.path.back() == '/') out.path.remove_suffix(1);
  if (out.authority.find('@') != std::string_view::npos) return Problem::credentials;
  if (out.authority.empty()) return Problem::no_host;
  if (out.kind == Kind::mlflow && !out.path.empty()) return Problem::mlflow_path;
  if (out.path.find('/') != std::string_view::npos) return Problem::deep_path;
  return Problem::none;
}

std::string UploadUrl::masked() const {
  std::string out(scheme);
  out += "://***";
  if (const std::size_t at = authority.rfind('@'); at != std::string_view::npos) out.append(authority.substr(at));
  return out;
}

} // namespace chorus::detail
