// Images, text and tables for W&B (io/upload/wandb_media.hpp): each media
// line as the file W&B's client would write for it (wandb.Image,
// wandb.Table) and the value naming it in its step's row, and the upload of
// those files.
//
//   image  media/images/<column>_<step>_<sha256[:20]>.<png|jpg>, the file's
//          own bytes: {"_type": "image-file", "path", "sha256", "size",
//          "format", "width", "height"[, "caption"]}
//   table  media/table/<column>_<step>_<sha256[:20]>.table.json, the file's
//          own bytes (chorus's table file is W&B's table JSON):
//          {"_type": "table-file", "path", "sha256", "size", "ncols", "nrows"}
//   text   W&B has no type for text: a table of one column "text" and one
//          row, {"columns": ["text"], "data": [["<the text>"]]}, as a table.
//
// A name holds the file's digest, so a file sent again replaces itself.
#include "io/upload/wandb_media.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/upload/media_lines.hpp"
#include "runtime/core/json.hpp"

#include <openssl/evp.h>

#include <cerrno>
#include <fcntl.h>
#include <memory>
#include <unistd.h>

namespace chorus::upload {
namespace {

constexpr std::chrono::milliseconds graphql_cap{30'000}, file_cap{600'000};

constexpr const char* create_run_files_query =
    "mutation CreateRunFiles($entity: String!, $project: String!, $run: String!, $files: [String!]!) { "
    "createRunFiles(input: {entityName: $entity, projectName: $project, runName: $run, files: $files}) { runID "
    "uploadHeaders files { name uploadUrl } } }";

struct DigestFree {
  void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
};

/// SHA-256 of `bytes`, or of the file at `path` where `bytes` is null, in
/// hex; `size` is set to the bytes hashed.
Result<std::string> sha256_hex(const std::string* bytes, const std::string& path, std::uint64_t& size) {
  size = 0;
  std::unique_ptr<EVP_MD_CTX, DigestFree> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    return Error(Errc::internal, "OpenSSL could not start a SHA-256 digest");
  if (bytes) {
    if (EVP_DigestUpdate(ctx.get(), bytes->data(), bytes->size()) != 1)
      return Error(Errc::internal, "OpenSSL failed a SHA-256 digest");
    size = bytes->size();
  } else {
    const Result<int> opened = platform::open_regular(path, O_RDONLY, /*missing_ok=*/false);
    if (!opened) return opened.error();
    std::string buf(1u << 20, '\0');
    for (;;) {
      const ssize_t n = ::read(*opened, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        platform::close_fd(*opened);
        return platform::os_error("cannot read", path, e);
      }
      if (n == 0) break;
      size += static_cast<std::uint64_t>(n);
      if (EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(n)) != 1) {
        platform::close_fd(*opened);
        return Error(Errc::internal, "OpenSSL failed a SHA-256 digest");
      }
    }
    platform::close_fd(*opened);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return Error(Errc::internal, "OpenSSL failed a SHA-256 digest");
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) out.push_back(hex[md[i] >> 4]), out.push_back(hex[md[i] & 15]);
  return out;
}

/// A key as W&B's client makes it a path under media/ (its
/// make_file_path_upload_safe): no leading '/', ".." as '_'.
std::string upload_safe(std::string_view column) {
  while (column.starts_with('/')) column.remove_prefix(1);
  std::string out;
  for (std::size_t i = 0; i < column.size(); ++i) {
    if (column.substr(i, 2) == "..") {
      out.push_back('_');
      ++i;
    } else {
      out.push_back(column[i]);
    }
  }
  return out;
}

/// A table's columns and rows, from its JSON; nothing where it is not {"columns": [...], "data": [...]}.
std::optional<std::pair<std::size_t, std::size_t>> table_shape(simdjson::dom::parser& parser, const std::string& path) {
  const Result<std::string> text = platform::read_text(path, false, core::max_media_bytes);
  simdjson::dom::array columns, data;
  simdjson::dom::element doc;
  if (!text || parser.parse(*text).get(doc) != simdjson::SUCCESS || doc["columns"].get(columns) != simdjson::SUCCESS ||
      doc["data"].get(data) != simdjson::SUCCESS)
    return std::nullopt;
  return std::pair{columns.size(), data.size()};
}

} // namespace

Result<WandbMedia> wandb_media(const std::string& run_dir, std::int64_t world_size, const store::MediaLine& m,
                               simdjson::dom::parser& parser) {
  WandbMedia out;
  out.column = media_column(m, world_size);
  const std::string path = run_dir + "/" + std::string(m.path);
  std::size_t ncols = 1, nrows = 1;
  if (m.kind == "text") {
    const Result<std::string> text = platform::read_text(path, false, core::max_media_bytes);
    if (!text) return text.error();
    // As Python's json.dump writes W&B's own table files.
    out.body = "{\"columns\": [\"text\"], \"data\": [[";
    core::append_json_string(out.body, *text);
    out.body += "]]}";
  } else if (m.kind == "table") {
    const auto shape = table_shape(parser, path);
    if (!shape) return Error(Errc::invalid_argument, path + " is not a table's JSON {\"columns\", \"data\"}");
    std::tie(ncols, nrows) = *shape;
  }
  if (m.kind != "text") out.file = path;
  std::uint64_t size = 0;
  const Result<std::string> sha = sha256_hex(m.kind == "text" ? &out.body : nullptr, path, size);
  if (!sha) return sha.error();
  const std::string ext = m.path.substr(m.path.rfind('.') + 1) == "jpg" ? "jpg" : "png";
  const std::string stem = upload_safe(out.column) + "_" + std::to_string(m.step) + "_" + sha->substr(0, 20);
  out.name = m.kind == "image" ? "media/images/" + stem + "." + ext : "media/table/" + stem + ".table.json";
  core::JsonWriter w(out.value);
  w.begin_object().key("_type").string(m.kind == "image" ? "image-file" : "table-file");
  w.key("path").string(out.name).key("sha256").string(*sha).key("size").uinteger(size);
  if (m.kind == "image") {
    w.key("format").string(ext).key("width").uinteger(m.width).key("height").uinteger(m.height);
    if (!m.caption.empty()) w.key("caption").string(m.caption);
  } else {
    w.key("ncols").uinteger(ncols).key("nrows").uinteger(nrows);
  }
  w.end_object();
  return out;
}

Sent upload_wandb_files(HttpClient& http, const UploadTarget& target, const std::string& api_key,
                        const UploadState& st, std::span<const WandbMedia> media, simdjson::dom::parser& parser) {
  if (media.empty()) return {};
  const auto failed = [](const HttpResponse& r, const std::string& what) {
    return not_delivered(r, "W&B", what, "check WANDB_API_KEY");
  };
  HttpRequest req;
  req.method = "POST";
  req.url = target.base_url + "/graphql";
  req.headers.emplace_back("Content-Type: application/json");
  req.user = "api";
  req.password = api_key;
  core::JsonWriter w(req.body);
  w.begin_object().key("query").string(create_run_files_query).key("variables").begin_object();
  w.key("entity").string(st.entity).key("project").string(st.project).key("run").string(st.remote_run);
  w.key("files").begin_array();
  for (const WandbMedia& m : media) w.string(m.name);
  w.end_array().end_object().end_object();
  const HttpResponse r = perform_capped(http, req, graphql_cap);
  if (!r.ok()) return failed(r, "createRunFiles");
  simdjson::dom::element doc, result;
  simdjson::dom::array errors, headers, files;
  if (parser.parse(r.body).get(doc) != simdjson::SUCCESS || doc["data"]["createRunFiles"].get(result) != simdjson::SUCCESS) {
    Sent s;
    const bool said = doc.is_object() && doc["errors"].get(errors) == simdjson::SUCCESS && errors.size() > 0;
    s.delivery = said ? Delivery::refused : Delivery::retry;
    s.stop = said;
    s.message = "W&B createRunFiles: " + (said ? describe(r) : std::string("answered without upload URLs"));
    return s;
  }
  std::vector<std::string> upload_headers; // "Name:value" as the server gives them, as "Name: value"
  if (result["uploadHeaders"].get(headers) == simdjson::SUCCESS) {
    for (auto h : headers) {
      std::string_view text;
      if (h.get(text) != simdjson::SUCCESS || text.find(':') == std::string_view::npos) continue;
      const std::size_t colon = text.find(':');
      upload_headers.push_back(std::string(text.substr(0, colon)) + ": " + std::string(text.substr(colon + 1)));
    }
  }
  std::vector<std::pair<std::string, std::string>> urls; // name, uploadUrl
  if (result["files"].get(files) == simdjson::SUCCESS) {
    for (auto f : files) {
      std::string_view name, url;
      if (f["name"].get(name) == simdjson::SUCCESS && f["uploadUrl"].get(url) == simdjson::SUCCESS)
        urls.emplace_back(name, url);
    }
  }
  for (const WandbMedia& m : media) {
    const auto at = std::find_if(urls.begin(), urls.end(), [&](const auto& u) { return u.first == m.name; });
    if (at == urls.end()) {
      Sent s;
      s.delivery = Delivery::retry;
      s.message = "W&B createRunFiles gave no upload URL for " + m.name;
      return s;
    }
    HttpRequest put;
    put.method = "PUT";
    put.url = at->second;
    put.headers = upload_headers;
    if (m.file.empty()) put.body = m.body;
    else put.upload_file = m.file;
    const HttpResponse answer = perform_capped(http, put, file_cap);
    if (answer.ok()) continue;
    Sent f = not_delivered(answer, "W&B storage", "uploading " + m.name, "a signed upload URL that expired");
    if (answer.status == 401 || answer.status == 403) f.delivery = Delivery::retry, f.stop = false; // asked for anew
    return f;
  }
  return {};
}

} // namespace chorus::upload
