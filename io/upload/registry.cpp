// Upload targets from URLs, and their backends from the registry
// (io/upload/registry.hpp): the one place that turns a scheme's name into a
// backend, for every backend alike.
#include "io/upload/registry.hpp"
#include "runtime/core/fnv.hpp"
#include "runtime/core/upload_url.hpp"

#include <openssl/evp.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace chorus::upload {
namespace {

Error bad_url(std::string_view url, std::string_view why) {
  std::string m = "upload target '";
  m.append(url);
  m += "' ";
  m.append(why);
  m += ": use " + chorus::core::upload_url_forms(true);
  return Error(Errc::invalid_argument, std::move(m));
}

/// The longest target id: upload/ID.refused.jsonl stays well within a file name's 255 bytes.
constexpr std::size_t max_id = 160;

/// `part` as a file name takes it: letters, digits and '.' kept, the rest '-'.
void append_id(std::string& id, std::string_view part) {
  for (char c : part) id.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '.' ? c : '-');
}

/// The first 16 hex digits of the SHA-256 of `s`: a secret path's part of a
/// target id, which tells two paths apart and says nothing of either.
std::string path_hash(std::string_view s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(s.data(), s.size(), md, &n, EVP_sha256(), nullptr) != 1) n = 0;
  std::string out;
  static constexpr char digits[] = "0123456789abcdef";
  for (unsigned int i = 0; i < n && out.size() < 16; ++i) {
    out.push_back(digits[md[i] >> 4]);
    out.push_back(digits[md[i] & 15]);
  }
  return out;
}

/// The target of a backend whose URL's path is a secret (BackendSpec::secret_path):
/// NAME://HOST[:PORT][/PATH][?QUERY], the path and query whatever they are.
/// Its errors show the URL without them.
Result<UploadTarget> secret_path_target(std::string_view url, const chorus::core::UploadUrl& u) {
  // The host ends at the first '/', '?' or '#' (UploadUrl looks for '/' only).
  const std::string_view rest = url.substr(u.scheme.size() + 3);
  const std::size_t cut = rest.find_first_of("/?#");
  const std::string_view authority = rest.substr(0, cut);
  std::string_view path = cut == std::string_view::npos ? std::string_view() : rest.substr(cut);
  path = path.substr(0, path.find('#')); // a fragment is the browser's, never sent
  UploadTarget t;
  t.backend = std::string(u.backend->name);
  t.url = chorus::core::shown_upload_url(url); // credentials masked, the path cut
  if (authority.find('@') != std::string_view::npos)
    return Error(Errc::invalid_argument, "upload target '" + t.url +
                                             "' has credentials before its host: they would be written into the "
                                             "run's files. Give the URL as its server gave it, without them");
  if (authority.empty()) return bad_url(t.url, "has no host");
  for (const char c : path)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return bad_url(t.url, "has a space, a control character or a character beyond ASCII in its path: give the "
                            "URL as its server gave it, those characters percent-encoded (a space as %20)");
  // Built into fresh strings: GCC 12 at -O3 takes "lit" + std::string, and
  // a short literal assigned before an append, for an overlapping copy (-Wrestrict).
  std::string full_path;
  full_path.reserve(path.size() + 1);
  if (path.empty() || path.front() != '/') full_path.push_back('/');
  full_path.append(path.data(), path.size());
  t.path = std::move(full_path);
  std::string base(u.https ? "https://" : "http://");
  base.append(authority.data(), authority.size());
  t.base_url = std::move(base);
  t.id = t.backend + "-";
  append_id(t.id, authority);
  if (!path.empty()) t.id.append("-").append(path_hash(t.path));
  return t;
}

} // namespace

std::optional<BackendSpec> find_backend(std::string_view name) {
  for (const detail::RegisteredBackend& b : detail::registered_backends())
    if (b.name == name) return b.spec();
  return std::nullopt;
}

Result<UploadTarget> UploadTarget::parse(std::string_view url) {
  chorus::core::UploadUrl u;
  using Problem = chorus::core::UploadUrl::Problem;
  const Problem problem = chorus::core::UploadUrl::parse(url, u);
  const std::optional<BackendSpec> spec = u.backend ? find_backend(u.backend->name) : std::nullopt;
  if (spec && spec->secret_path) return secret_path_target(url, u);
  switch (problem) {
  case Problem::none: break;
  // A URL whose scheme is mistyped may be a webhook's: its path is not shown.
  case Problem::no_scheme: return bad_url(chorus::core::shown_upload_url(url), "has no scheme");
  case Problem::unknown_scheme: return bad_url(chorus::core::shown_upload_url(url), "has an unknown scheme");
  case Problem::credentials:
    return Error(Errc::invalid_argument, "upload target '" + u.masked() +
                                             "' has credentials in it: they would be written into the run's files. "
                                             "Put the key where its backend reads it: " +
                                             chorus::core::upload_credentials());
  case Problem::empty:
    return bad_url(url, u.backend && u.backend->local ? "names no directory" : "has no host");
  case Problem::no_host: return bad_url(url, "has no host");
  }
  if (!spec) return bad_url(chorus::core::shown_upload_url(url), "has an unknown scheme");
  if (u.backend->local) {
    // A directory: made absolute here, so that a rank and a later `chorus
    // sync` from another working directory name the same target.
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::absolute(std::string(u.path), ec).lexically_normal();
    if (ec) return bad_url(url, "names a directory that cannot be resolved (" + ec.message() + ")");
    UploadTarget t;
    t.backend = std::string(u.backend->name);
    t.url = std::string(url);
    t.dir = dir.string();
    while (t.dir.size() > 1 && t.dir.back() == '/') t.dir.pop_back();
    t.id = t.backend + "-";
    append_id(t.id, t.dir);
    if (t.id.size() > max_id) {
      // A deep directory: its end, and a hash of the whole, keep the file names short and apart.
      char hash[17];
      std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(chorus::core::fnv1a64(t.dir)));
      t.id = t.backend + "-" + hash + "-" + t.id.substr(t.id.size() - (max_id - t.backend.size() - 18));
    }
    return t;
  }
  if (!u.path.empty() && spec->path.empty())
    return bad_url(url, "has a path (" + std::string(u.backend->title) + "'s API is at the server's root)");
  if (u.path.find('/') != std::string_view::npos)
    return bad_url(url, "has a path of more than one part (only " + std::string(spec->path) + " may follow the host)");
  UploadTarget t;
  t.backend = std::string(u.backend->name);
  t.url = std::string(url);
  t.base_url = (u.https ? "https://" : "http://") + std::string(u.authority);
  t.entity = std::string(u.path);
  if (t.entity.empty() && !spec->path_variable.empty())
    if (const char* e = std::getenv(std::string(spec->path_variable).c_str()); e && *e) t.entity = e;
  t.id = t.backend + "-";
  append_id(t.id, u.authority);
  if (!t.entity.empty()) {
    t.id += '-';
    append_id(t.id, t.entity);
  }
  return t;
}

} // namespace chorus::upload
