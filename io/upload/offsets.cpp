// The offsets file of a target (io/upload/upload.hpp's UploadState): its JSON,
// read and written, how often it is made durable (io/upload/offsets.hpp),
// and what a run holds beyond it (points_pending, upload_targets).
#include "io/upload/offsets.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/store/history_row.hpp"
#include "runtime/core/fnv.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

namespace chorus::upload {
namespace {

using platform::os_error;

// FNV-1a 64 from a basis one digit short of the standard one: upload/<id>.json
// keeps these digests of what went up, so changing it would send config.json
// and summary.json again to every target a run already reached.
constexpr std::uint64_t digest_basis = 1469598103934665603ull;

void write_cursor(core::JsonWriter& w, std::string_view name, const store::Cursor& c) {
  w.key(name).begin_object().key("lines").uinteger(c.lines).key("bytes").uinteger(c.bytes).end_object();
}

bool read_cursor(simdjson::dom::element doc, const char* name, store::Cursor& c) {
  simdjson::dom::element e;
  if (doc[name].get(e) != simdjson::SUCCESS) return true;
  std::uint64_t lines = 0, bytes = 0;
  if (e["lines"].get(lines) != simdjson::SUCCESS || e["bytes"].get(bytes) != simdjson::SUCCESS) return false;
  c = {lines, bytes};
  return true;
}

std::string render_state(const UploadState& s) {
  std::string out;
  core::JsonWriter w(out);
  w.begin_object();
  w.key("url").string(s.url).key("remote_run").string(s.remote_run).key("experiment").string(s.experiment);
  w.key("entity").string(s.entity).key("project").string(s.project);
  write_cursor(w, "history", s.history);
  w.key("history_part").uinteger(s.history_part);
  write_cursor(w, "system", s.system);
  w.key("system_part").uinteger(s.system_part);
  write_cursor(w, "artifacts", s.artifacts);
  write_cursor(w, "histograms", s.histograms);
  write_cursor(w, "media", s.media);
  write_cursor(w, "events", s.events);
  w.key("histogram_rows").uinteger(s.histogram_rows);
  w.key("config_sent").string(s.config_sent).key("summary_sent").string(s.summary_sent);
  w.key("final_sent").string(s.final_sent).key("final_attempt").uinteger(s.final_attempt);
  w.key("points").uinteger(s.points).key("refused").uinteger(s.refused);
  w.key("last_error").string(s.last_error);
  w.end_object();
  out.push_back('\n');
  return out;
}

/// Replaces `path` with `content` through a rename, without the fsync of
/// write_file_atomic: a crash of the process leaves the old or the new file,
/// a crash of the machine may lose the latest replacements.
Error replace_file(const std::string& path, std::string_view content) {
  const auto slash = path.rfind('/') + 1; // hidden, as write_file_atomic's
  const std::string tmp = path.substr(0, slash) + "." + path.substr(slash) + ".tmp." + std::to_string(::getpid());
  const Result<int> opened = platform::open_private(tmp, O_WRONLY | O_CREAT | O_TRUNC);
  if (!opened) return opened.error();
  const int fd = *opened;
  Error err = platform::write_all(fd, content, tmp);
  platform::close_fd(fd);
  if (!err && ::rename(tmp.c_str(), path.c_str()) != 0) err = os_error("rename to " + path, tmp, errno);
  if (err) ::unlink(tmp.c_str());
  return err;
}

} // namespace

std::string delivered_digest(std::string_view s) {
  const std::uint64_t h = chorus::core::fnv1a64(s, digest_basis);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Error UploadState::load(const std::string& path) {
  const Result<std::string> read = platform::read_text(path, true);
  if (!read) return read.error();
  const std::string& text = *read;
  if (text.empty()) return {};
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  auto bad = [&] {
    return Error(Errc::io_error, path + " is not a valid upload offsets file: remove it to upload the run again "
                                        "from the start (as a new remote run)");
  };
  if (parser.parse(text).get(doc) != simdjson::SUCCESS || !doc.is_object()) return bad();
  auto str = [&](const char* k, std::string& out) {
    std::string_view v;
    if (doc[k].get(v) == simdjson::SUCCESS) out = std::string(v);
  };
  auto num = [&](const char* k, std::uint64_t& out) {
    std::uint64_t v = 0;
    if (doc[k].get(v) == simdjson::SUCCESS) out = v;
  };
  str("url", url);
  str("remote_run", remote_run);
  str("experiment", experiment);
  str("entity", entity);
  str("project", project);
  str("config_sent", config_sent);
  str("summary_sent", summary_sent);
  str("final_sent", final_sent);
  str("last_error", last_error);
  num("points", points);
  num("refused", refused);
  num("history_part", history_part);
  num("system_part", system_part);
  num("histogram_rows", histogram_rows);
  num("final_attempt", final_attempt);
  if (!final_sent.empty() && final_attempt == 0) final_attempt = 1; // written before final_attempt
  if (!read_cursor(doc, "history", history) || !read_cursor(doc, "system", system) ||
      !read_cursor(doc, "artifacts", artifacts) || !read_cursor(doc, "histograms", histograms) ||
      !read_cursor(doc, "media", media) || !read_cursor(doc, "events", events))
    return bad();
  return {};
}

Error UploadState::save(const std::string& path) const { return platform::write_file_atomic(path, render_state(*this)); }

Error OffsetsWriter::save(const UploadState& st) {
  const auto now = std::chrono::steady_clock::now();
  const bool durable = now - durable_at_ >= durable_every || st.remote_run != durable_run_ ||
                       st.final_sent != durable_final_ || st.events != durable_events_;
  if (!durable) {
    pending_durable_ = true;
    return replace_file(path_, render_state(st));
  }
  if (Error e = st.save(path_)) return e;
  durable_at_ = now;
  durable_run_ = st.remote_run;
  durable_final_ = st.final_sent;
  durable_events_ = st.events;
  pending_durable_ = false;
  return {};
}

Error OffsetsWriter::flush(const UploadState& st) { return pending_durable_ ? st.save(path_) : Error(); }

std::uint64_t points_pending(const std::string& run_dir, const UploadState& state) {
  std::uint64_t n = 0;
  simdjson::dom::parser parser;
  auto count = [&](const std::string& path, bool history, store::Cursor from, std::uint64_t part) {
    LineSlice slice;
    for (;;) {
      if (read_lines(path, from, 4u << 20, slice) || slice.lines.empty()) return;
      for (std::string_view line : slice.lines) {
        simdjson::dom::object obj;
        if (parser.parse(line.data(), line.size()).get(obj) != simdjson::SUCCESS) continue;
        const auto values = static_cast<std::uint64_t>(std::ranges::distance(store::line_values(obj, history)));
        n += values - std::min(values, part);
        part = 0;
      }
      from = slice.after.back();
    }
  };
  count(run_dir + "/history.jsonl", true, state.history, state.history_part);
  count(run_dir + "/system.jsonl", false, state.system, state.system_part);
  return n;
}

std::vector<std::pair<std::string, std::string>> upload_targets(const std::string& run_dir) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string dir = run_dir + "/upload";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.ends_with(".json") || name.ends_with(".keys.json")) continue;
    out.emplace_back(std::string(name.substr(0, name.size() - 5)), dir + "/" + std::string(name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

} // namespace chorus::upload
