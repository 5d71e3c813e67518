// Upload targets from URLs, and their backends from the registry
// (io/upload/registry.hpp): the one place that turns a scheme's name into a
// backend, for every backend alike.
#include "io/upload/registry.hpp"
#include "runtime/core/fnv.hpp"
#include "runtime/core/upload_url.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

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

/// The longest target id: upload/ID.refused.jsonl stays well within a file name's 255 bytes.
constexpr std::size_t max_id = 160;

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
    return bad_url(url, u.backend && u.backend->local ? "names no directory" : "has no host");
  case Problem::no_host: return bad_url(url, "has no host");
  }
  const std::optional<BackendSpec> spec = find_backend(u.backend->name);
  if (!spec)
    return bad_url(url, "has an unknown scheme");
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
      std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(chorus::detail::fnv1a64(t.dir)));
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

} // namespace chorus::io
