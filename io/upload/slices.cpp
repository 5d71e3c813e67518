// Reading a run's append-only files a bounded slice at a time
// (read_lines, io/upload/upload.hpp), keeping a slice across requests, and
// artifacts.jsonl's entries (io/upload/slices.hpp).
#include "io/upload/slices.hpp"

#include "io/platform/posix.hpp"
#include "io/store/artifacts.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>

namespace chorus::io {

Error read_lines(const std::string& path, Cursor from, std::size_t max_bytes, LineSlice& out) {
  out.buf.clear();
  out.lines.clear();
  out.after.clear();
  // Never blocks on a FIFO planted there; a file not yet made has no lines.
  const Result<int> opened = detail::open_regular(path, O_RDONLY, /*missing_ok=*/true);
  if (!opened) return opened.error();
  const int fd = *opened;
  if (fd < 0) return {};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    detail::close_fd(fd);
    return detail::os_error("cannot stat", path, e);
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < from.bytes) {
    detail::close_fd(fd);
    return Error(Errc::io_error, path + " is shorter (" + std::to_string(size) + " bytes) than what was already uploaded (" +
                                     std::to_string(from.bytes) +
                                     " bytes): it was rewritten. Remove the target's file in upload/ to upload the run "
                                     "again as a new remote run");
  }
  // Whole lines, read max_bytes (at least 64 KiB) at a time: those of the
  // first read that holds a newline, and of the reads before it.
  LineReader lines(fd, path, from, {.chunk = std::max<std::size_t>(max_bytes, 1u << 16), .max_line = 0, .end = size});
  std::vector<std::size_t> starts;
  for (std::string_view line;;) {
    if (lines.cursor() != from && lines.read_to() - from.bytes >= max_bytes && !lines.holds_line()) break;
    const LineReader::Next next = lines.next(line);
    if (next == LineReader::Next::failed) {
      out.buf.clear();
      out.after.clear();
      return lines.error();
    }
    if (next != LineReader::Next::line) break;
    if (line.empty()) continue; // not a record (and not counted as one by anybody)
    starts.push_back(out.buf.size());
    out.buf.append(line).push_back('\n');
    out.after.push_back(lines.cursor());
  }
  for (std::size_t i = 0; i < starts.size(); ++i)
    out.lines.emplace_back(out.buf.data() + starts[i], (i + 1 < starts.size() ? starts[i + 1] : out.buf.size()) - starts[i] - 1);
  // Blank lines at the end still move the cursor past them.
  if (!out.after.empty()) out.after.back() = lines.cursor();
  return {};
}

Error detail::KeptSlice::refresh(const std::string& path, Cursor at, std::size_t read_bytes) {
  if (!slice.lines.empty()) {
    const auto& after = slice.after;
    std::size_t i = 0;
    if (at != from) {
      const auto it = std::lower_bound(after.begin(), after.end(), at.bytes,
                                       [](const Cursor& c, std::uint64_t b) { return c.bytes < b; });
      i = it == after.end() || *it != at ? after.size() + 1 : static_cast<std::size_t>(it - after.begin()) + 1;
    }
    if (i <= after.size() && after.back().bytes - at.bytes >= read_bytes / 2) {
      next = i;
      return {};
    }
  }
  from = at;
  next = 0;
  return read_lines(path, at, read_bytes, slice);
}

void detail::read_artifacts(std::span<const std::string_view> lines, std::vector<ArtifactEntry>& out) {
  out.clear();
  simdjson::dom::parser parser;
  for (std::string_view line : lines) {
    ArtifactEntry a;
    simdjson::dom::object doc;
    if (parser.parse(line.data(), line.size()).get(doc) == simdjson::SUCCESS) {
      if (std::optional<ArtifactRecord> r = artifact_record(doc)) {
        a.name = std::move(r->name);
        a.type = std::move(r->type);
        a.sha256 = std::move(r->sha256);
        a.size = r->size;
      }
    }
    out.push_back(std::move(a));
  }
}

} // namespace chorus::io
