#include "io/store/artifacts.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/store/run_record.hpp"
#include "runtime/core/json.hpp"

#include <openssl/evp.h>
#include <simdjson.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace chorus::store {

using platform::os_error;

namespace {

Error bad_name(std::string_view name, std::string_view rule) {
  std::string m = "artifact name ";
  core::append_json_string(m, name.substr(0, 64));
  if (name.size() > 64) m.append("...");
  m.push_back(' ');
  m.append(rule);
  return {Errc::invalid_argument, std::move(m)};
}

bool name_char(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-' || c == ' ' || c == '/';
}

/// The source could not be used: a caller's mistake (a wrong path, a
/// directory) unless the disk itself failed.
Error source_error(const std::string& source, std::string_view why, std::string_view fix, bool callers = true) {
  std::string m = "artifact source ";
  core::append_json_string(m, source);
  m.append(" ").append(why).append(": ").append(fix);
  return {callers ? Errc::invalid_argument : Errc::io_error, std::move(m)};
}

Error cannot_open_source(const std::string& source, int errnum) {
  std::string why = "cannot be opened (";
  why.append(std::strerror(errnum)).append(")");
  if (errnum == ENOENT || errnum == ENOTDIR)
    return source_error(source, why,
                        "check the path; the file is read when its copy starts, in the background, so keep it in "
                        "place until the ticket completes");
  if (errnum == EACCES || errnum == EPERM) return source_error(source, why, "make it readable by this process");
  return source_error(source, why, "check the file and the filesystem it is on", false);
}

/// fsync of a directory, so that a rename or a new file in it survives a crash.
Error sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error("open", dir, errno);
  Error err;
  while (::fsync(fd) != 0) {
    // Some filesystems cannot sync a directory (EINVAL): nothing more to do there.
    if (errno != EINTR) {
      if (errno != EINVAL) err = os_error("fsync", dir, errno);
      break;
    }
  }
  platform::close_fd(fd);
  return err;
}

struct Fd {
  int fd = -1;
  ~Fd() { platform::close_fd(fd); }
};

struct DigestFree {
  void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
};

std::string hex(const unsigned char* p, unsigned n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(2 * std::size_t(n), '0');
  for (unsigned i = 0; i < n; ++i) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  return out;
}

/// Streams `in` into `out`, hashing: one chunk of memory whatever the size.
Error stream(int in, const std::string& source, int out, const std::string& tmp, std::uint64_t& size,
             std::string& sha256, const std::atomic<bool>* stop) {
  std::unique_ptr<EVP_MD_CTX, DigestFree> ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    return {Errc::internal, "OpenSSL could not start a SHA-256 digest"};
  std::vector<char> buf(artifact_chunk);
  size = 0;
  for (;;) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed))
      return {Errc::timeout, std::string("the copy was abandoned after ")
                                 .append(std::to_string(size))
                                 .append(" bytes: the run finished (finish_timeout ran out) or was destroyed first; "
                                         "wait for the ticket before finishing, or raise CHORUS_FINISH_TIMEOUT")};
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string why = "could not be read (";
      why.append(std::strerror(errno)).append(")");
      return source_error(source, why, "check the disk it is on", false);
    }
    if (n == 0) break;
    if (EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(n)) != 1)
      return {Errc::internal, "OpenSSL failed to hash a chunk with SHA-256"};
    if (Error e = platform::write_all(out, std::string_view(buf.data(), static_cast<std::size_t>(n)), tmp)) return e;
    size += static_cast<std::uint64_t>(n);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return {Errc::internal, "OpenSSL failed to end a SHA-256 digest"};
  sha256 = hex(md, len);
  return {};
}

} // namespace

Error validate_artifact_name(std::string_view name) {
  if (name.empty())
    return bad_name(name, "is empty: name the file as it should appear under the run's artifacts/, such as "
                          "\"model.pt\" or \"ckpt/step-100/model.pt\"");
  if (name.size() > max_artifact_name_bytes) {
    std::string rule = "is ";
    rule.append(std::to_string(name.size())).append(" bytes long: artifact names take at most ");
    rule.append(std::to_string(max_artifact_name_bytes)).append(" bytes; shorten it");
    return bad_name(name, rule);
  }
  for (char c : name) {
    if (name_char(c)) continue;
    static constexpr char digits[] = "0123456789abcdef";
    const auto b = static_cast<unsigned char>(c);
    std::string rule = "holds the byte 0x";
    rule.push_back(digits[b >> 4]);
    rule.push_back(digits[b & 15]);
    rule.append(": artifact names take ASCII letters, digits, '_', '.', '-', ' ' and '/' only (MLflow's artifact "
                "path rule ^[/\\w.\\- ]*$, so that they upload as they are); rename it");
    return bad_name(name, rule);
  }
  if (name.front() == '/')
    return bad_name(name, "starts with '/': it must be a path relative to the run's artifacts/ directory, such as "
                          "\"ckpt/model.pt\"");
  // No ".." at all, not only as a segment: the uploader refuses any name holding it.
  if (name.find("..") != std::string_view::npos)
    return bad_name(name, "holds \"..\": it must be a normalized path that stays inside the run's artifacts/ "
                          "directory, without \"..\" anywhere");
  for (std::size_t at = 0; at <= name.size();) {
    const std::size_t end = std::min(name.find('/', at), name.size());
    const std::string_view seg = name.substr(at, end - at);
    if (seg.empty())
      return bad_name(name, "has an empty segment (\"//\" or a trailing '/'): it must name a file, with one '/' "
                            "between directories");
    if (seg == ".")
      return bad_name(name, "has a \".\" segment: it must be a normalized path, such as \"ckpt/model.pt\" for "
                            "\"ckpt/./model.pt\"");
    at = end + 1;
  }
  return {};
}

std::string artifact_line(const ArtifactRecord& r) {
  std::string out;
  core::JsonWriter w(out);
  w.begin_object();
  w.key("name").string(r.name);
  w.key("type").string(r.type);
  w.key("size").uinteger(r.size);
  w.key("sha256").string(r.sha256);
  w.key("rank").integer(r.rank);
  w.key("step").integer(r.step);
  w.key("timestamp").number(static_cast<double>(r.ts_us) / 1e6);
  w.end_object();
  out.push_back('\n');
  return out;
}

std::optional<ArtifactRecord> artifact_record(const simdjson::dom::object& line) {
  ArtifactRecord r;
  std::string_view text;
  if (line["name"].get(text) != simdjson::SUCCESS) return std::nullopt;
  r.name = std::string(text);
  if (line["type"].get(text) == simdjson::SUCCESS) r.type = std::string(text);
  if (line["sha256"].get(text) == simdjson::SUCCESS) r.sha256 = std::string(text);
  if (line["size"].get(r.size) != simdjson::SUCCESS) r.size = 0;
  if (line["rank"].get(r.rank) != simdjson::SUCCESS) r.rank = 0;
  if (line["step"].get(r.step) != simdjson::SUCCESS) r.step = -1;
  // Written as Unix seconds to the microsecond (artifact_line).
  double seconds = 0;
  if (line["timestamp"].get_double().get(seconds) == simdjson::SUCCESS && std::isfinite(seconds) &&
      std::abs(seconds) < 9e12)
    r.ts_us = std::llround(seconds * 1e6);
  return r;
}

Error copy_hashed(const std::string& source, const std::string& dest, std::uint64_t& size, std::string& sha256,
                  const std::atomic<bool>* stop) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  Fd in{::open(source.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (in.fd < 0) return cannot_open_source(source, errno);
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) return cannot_open_source(source, errno);
  if (S_ISDIR(st.st_mode))
    return source_error(source, "is a directory",
                        "log_artifact copies one file; log each file of the directory under its own name");
  if (!S_ISREG(st.st_mode))
    return source_error(source, "is not a regular file", "log a regular file (not a device, FIFO or socket)");
  if (::fcntl(in.fd, F_SETFL, 0) != 0) return cannot_open_source(source, errno);

  const auto slash = dest.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string(".") : dest.substr(0, slash);
  const std::string base = slash == std::string::npos ? dest : dest.substr(slash + 1);
  if (Error e = platform::make_dirs(dir)) return e;
  static std::atomic<std::uint64_t> counter{0};
  // Hidden and unique per process and copy: concurrent copies and readers
  // listing the directory never trip over it.
  std::string tmp = dir;
  tmp.append("/.").append(base).append(".tmp.").append(std::to_string(::getpid())).append(".");
  tmp.append(std::to_string(counter.fetch_add(1, std::memory_order_relaxed)));
  const Result<int> opened = platform::open_private(tmp, O_RDWR | O_CREAT | O_EXCL | O_TRUNC);
  if (!opened) return opened.error();
  Fd out{*opened};
  Error err = stream(in.fd, source, out.fd, tmp, size, sha256, stop);
  if (!err) err = platform::sync_file(out.fd, tmp);
  platform::close_fd(std::exchange(out.fd, -1));
  if (!err && ::rename(tmp.c_str(), dest.c_str()) != 0) {
    std::string what = "rename to ";
    what.append(dest);
    err = os_error(what, tmp, errno);
  }
  if (err) {
    ::unlink(tmp.c_str());
    return err;
  }
  return sync_dir(dir);
}

Error store_artifact(const std::string& run_dir, const std::string& source, ArtifactRecord& rec,
                     const std::atomic<bool>* stop) {
  if (Error e = validate_artifact_name(rec.name)) return e;
  // The copy makes the directories of the name, never the run directory itself.
  struct stat st {};
  if (::stat(run_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return os_error(std::string("artifact ").append(rec.name).append(": the run directory is missing"), run_dir, ENOENT);
  const std::string artifacts = run_dir + "/artifacts";
  const std::string dest = artifacts + "/" + rec.name;
  if (Error e = copy_hashed(source, dest, rec.size, rec.sha256, stop)) {
    std::string m = "artifact ";
    core::append_json_string(m, rec.name);
    m.append(" was not stored: ").append(e.message());
    return {e.code(), std::move(m)};
  }
  // Directories the copy made are durable too: each parent holds the entry of
  // the one below (the copy synced the file's own directory, and the run
  // directory is synced last).
  for (std::string dir = dest.substr(0, dest.rfind('/')); dir.size() > artifacts.size();) {
    dir.resize(dir.rfind('/'));
    if (Error e = sync_dir(dir)) return e;
  }
  const std::string manifest = run_dir + "/artifacts.jsonl";
  const Result<int> opened = platform::open_private(manifest, O_RDWR | O_CREAT | O_APPEND);
  if (!opened) return opened.error();
  Fd fd{*opened};
  // One write(2) of a whole line: O_APPEND keeps lines of several processes apart.
  if (Error e = platform::write_all(fd.fd, artifact_line(rec), manifest)) return e;
  if (Error e = platform::sync_file(fd.fd, manifest, true)) return e;
  return sync_dir(run_dir);
}

Error check_run_dir_is_here(const std::string& run_dir) {
  auto not_here = [&](std::string detail) {
    std::string m = "log_artifact needs the run directory on this machine: call it on the run host's node (rank 0 "
                    "in shared global mode); ";
    m.append(detail);
    return Error{Errc::invalid_argument, std::move(m)};
  };
  struct stat st {};
  if (run_dir.empty() || ::stat(run_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return not_here(std::string("the run directory ").append(run_dir).append(" does not exist here"));
  const std::string run_json = run_dir + "/run.json";
  const Result<RunRecord> run = RunRecord::read(run_json);
  if (!run) return not_here(run.error().message());
  const std::string here = platform::this_host();
  const std::string& host = run->host;
  if (host.empty() && !here.empty()) return not_here(run_json + " names no host");
  if (host != here)
    return not_here(std::string("the run is hosted by ")
                        .append(host)
                        .append(", and this machine is ")
                        .append(here.empty() ? std::string_view("unnamed") : std::string_view(here)));
  return {};
}

} // namespace chorus::store
