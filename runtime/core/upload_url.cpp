#include "runtime/core/upload_url.hpp"

#include <vector>

namespace chorus::core {

std::string UploadScheme::usage(bool other_protocol) const {
  std::string out(name);
  if (local) return out.append(":").append(address);
  if (other_protocol) out += https ? "+http" : "+https";
  out += "://";
  out.append(address);
  return out;
}

const UploadScheme* find_upload_scheme(std::string_view name) noexcept {
  for (const UploadScheme& s : upload_schemes())
    if (s.name == name) return &s;
  return nullptr;
}

namespace {

/// The parts joined as a sentence lists them: "a, b or c".
std::string listed(const std::vector<std::string>& parts, std::string_view last) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.append(i + 1 == parts.size() ? last : std::string_view(", "));
    out += parts[i];
  }
  return out;
}

} // namespace

std::string upload_url_forms(bool both_protocols) {
  std::vector<std::string> parts;
  for (const UploadScheme& s : upload_schemes()) {
    parts.push_back(s.usage(false));
    if (both_protocols && !s.local) parts.push_back(s.usage(true));
  }
  return listed(parts, " or ");
}

std::string upload_other_protocols() {
  std::vector<std::string> parts;
  for (const UploadScheme& s : upload_schemes())
    if (!s.local) parts.push_back(std::string(s.name) + (s.https ? "+http://" : "+https://"));
  return listed(parts, ", ");
}

std::string upload_credentials() {
  std::vector<std::string> parts;
  for (const UploadScheme& s : upload_schemes())
    if (!s.credentials.empty()) parts.push_back(std::string(s.title) + "'s in " + std::string(s.credentials));
  return listed(parts, ", ");
}

UploadUrl::Problem UploadUrl::parse(std::string_view url, UploadUrl& out) {
  out = {};
  const std::size_t sep = url.find("://");
  if (sep == std::string_view::npos) {
    // NAME:DIR, for a backend that writes files.
    const std::size_t colon = url.find(':');
    const UploadScheme* local = colon == std::string_view::npos ? nullptr : find_upload_scheme(url.substr(0, colon));
    if (local == nullptr || !local->local) return Problem::no_scheme;
    out.scheme = url.substr(0, colon);
    out.backend = local;
    out.path = url.substr(colon + 1);
    return out.path.empty() ? Problem::empty : Problem::none;
  }
  out.scheme = url.substr(0, sep);
  std::string_view name = out.scheme;
  std::string_view protocol;
  if (const std::size_t plus = name.find('+'); plus != std::string_view::npos) {
    protocol = name.substr(plus + 1);
    name = name.substr(0, plus);
  }
  out.backend = find_upload_scheme(name);
  if (!out.backend || !(protocol.empty() || protocol == "http" || protocol == "https")) {
    out.backend = nullptr;
    return Problem::unknown_scheme;
  }
  out.https = protocol.empty() ? out.backend->https : protocol == "https";
  const std::string_view rest = url.substr(sep + 3);
  if (rest.empty()) return Problem::empty;
  if (out.backend->local) {
    if (!protocol.empty()) {
      out.backend = nullptr;
      return Problem::unknown_scheme; // a directory has no protocol
    }
    out.path = rest; // NAME://DIR: DIR as written ("tensorboard:///abs" is /abs)
    return Problem::none;
  }
  const std::size_t slash = rest.find('/');
  out.authority = rest.substr(0, slash);
  out.path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  while (!out.path.empty() && out.path.back() == '/') out.path.remove_suffix(1);
  if (out.authority.find('@') != std::string_view::npos) return Problem::credentials;
  if (out.authority.empty()) return Problem::no_host;
  return Problem::none;
}

std::string shown_upload_url(std::string_view url) {
  const std::size_t sep = url.find("://");
  const std::size_t host = sep == std::string_view::npos ? 0 : sep + 3;
  std::string_view authority = url.substr(host);
  const std::size_t slash = authority.find_first_of("/?#");
  const bool cut = slash != std::string_view::npos;
  if (cut) authority = authority.substr(0, slash);
  std::string out(url.substr(0, host));
  if (const std::size_t at = authority.rfind('@'); at != std::string_view::npos) {
    out += "***";
    authority = authority.substr(at);
  }
  out.append(authority);
  if (cut) out += "/\u2026";
  return out;
}

std::string UploadUrl::masked() const {
  std::string out(scheme);
  out += "://***";
  if (const std::size_t at = authority.rfind('@'); at != std::string_view::npos) out.append(authority.substr(at));
  return out;
}

} // namespace chorus::core
