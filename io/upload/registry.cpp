// Upload targets from URLs, and their backends from the registry
// (io/upload/registry.hpp): the one place that turns a scheme's name into a
// backend, for every backend alike.
#include "io/upload/registry.hpp"

#include "runtime/core/upload_url.hpp"

#include <cctype>
#include <cstdlib>

namespace chorus::io {
namespace {

Error bad_url(std::string_view url, std::string_view why) {
  std::string m = "upload target '";
  m.append(url);
  m += "' ";
  m.append(why);
  m += ": use " + chorus::detail::upload_url_forms(true);
  return Error(Errc::invalid_argument, std::move(m));
}

/// `part` as a file name takes it: letters, digits and '.' kept, the rest '-'.
void append_id(std::string& id, std::string_view part) {
  for (char c : part) id.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '.' ? c : '-');
}

} // namespace

std::optional<BackendSpec> find_backend(std::string_view name) {
  for (const detail::RegisteredBackend& b : detail::registered_backends())
    if (b.name == name) return b.spec();
  return std::nullopt;
}

Result<UploadTarget> UploadTarget::parse(std::string_view url) {
  chorus::detail::UploadUrl u;
  using Problem = chorus::detail::UploadUrl::Problem;
  switch (chorus::detail::UploadUrl::parse(url, u)) {
  case Problem::none: break;
  case Problem::no_scheme: return bad_url(url, "has no scheme");
  case Problem::unknown_scheme: return bad_url(url, "has an unknown scheme");
  case Problem::credentials:
    return Error(Errc::invalid_argument, "upload target '" + u.masked() +
                                             "' has credentials in it: they would be written into the run's files. "
                                             "Put the key where its backend reads it: " +
                                             chorus::detail::upload_credentials());
  case Problem::empty:
  case Problem::no_host: return bad_url(url, "has no host");
  }
  const std::optional<BackendSpec> spec = find_backend(u.backend->name);
  if (!spec)
    return bad_url(url, "has an unknown scheme");
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

} // namespace chorus::io
