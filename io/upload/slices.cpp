// Reading a run's append-only files a bounded slice at a time
// (read_lines, io/upload/upload.hpp), keeping a slice across requests, the
// whole steps of a by-step backend, and artifacts.jsonl's entries
// (io/upload/slices.hpp).
#include "io/upload/slices.hpp"

#include "io/platform/posix.hpp"
#include "io/store/artifacts.hpp"
#include "io/store/histogram_log.hpp"
#include "io/store/history_row.hpp"
#include "io/store/media_log.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <limits>
#include <sys/stat.h>

namespace chorus::upload {

Error read_lines(const std::string& path, store::Cursor from, std::size_t max_bytes, LineSlice& out, std::uint64_t limit) {
  out.buf.clear();
  out.lines.clear();
  out.after.clear();
  out.damaged = {};
  // Never blocks on a FIFO planted there; a file not yet made has no lines.
  const Result<int> opened = platform::open_regular(path, O_RDONLY, /*missing_ok=*/true);
  if (!opened) return opened.error();
  const int fd = *opened;
  out.to_end = fd < 0;
  if (fd < 0) return {};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    platform::close_fd(fd);
    return platform::os_error("cannot stat", path, e);
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (limit < from.bytes) {
    // A live run's bound not yet past what was uploaded (a resumed run's first moments): nothing to read now.
    platform::close_fd(fd);
    out.to_end = true;
    return {};
  }
  if (size < from.bytes) {
    platform::close_fd(fd);
    return Error(Errc::io_error, path + " is shorter (" + std::to_string(size) + " bytes) than what was already uploaded (" +
                                     std::to_string(from.bytes) +
                                     " bytes): it was rewritten. Remove the target's file in upload/ to upload the run "
                                     "again as a new remote run");
  }
  // Whole lines, read max_bytes (at least 64 KiB) at a time: those of the
  // first read that holds a newline, and of the reads before it; none
  // longer than the bound every reader of a run's lines keeps.
  store::LineReader lines(fd, path, from,
                   {.chunk = std::max<std::size_t>(max_bytes, 1u << 16), .max_line = store::max_line_bytes,
                    .end = std::min(size, limit)});
  std::vector<std::size_t> starts;
  out.to_end = false;
  for (std::string_view line;;) {
    if (lines.cursor() != from && lines.read_to() - from.bytes >= max_bytes && !lines.holds_line()) break;
    const store::LineReader::Next next = lines.next(line);
    if (next == store::LineReader::Next::failed) {
      out.buf.clear();
      out.after.clear();
      return lines.error();
    }
    if (next == store::LineReader::Next::too_long) {
      // As at the file's end: the lines before it go, nothing after it is read.
      out.damaged = lines.error();
      out.to_end = true;
      break;
    }
    if (next != store::LineReader::Next::line) {
      out.to_end = true;
      break;
    }
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

Error KeptSlice::refresh(const std::string& path, store::Cursor at, std::size_t read_bytes, SteadyTime fresh_after,
                                 std::uint64_t limit) {
  // A slice that ends at a line too long holds all that can be read of
  // the file: it is kept while any of it is left, and read again only where
  // it must be fresh.
  if ((!slice.lines.empty() || slice.damaged) && read_at >= fresh_after) {
    const auto& after = slice.after;
    std::size_t i = 0;
    if (at != from) {
      const auto it = std::lower_bound(after.begin(), after.end(), at.bytes,
                                       [](const store::Cursor& c, std::uint64_t b) { return c.bytes < b; });
      i = it == after.end() || *it != at ? after.size() + 1 : static_cast<std::size_t>(it - after.begin()) + 1;
    }
    if (i <= after.size() && (slice.damaged || after.back().bytes - at.bytes >= read_bytes / 2)) {
      next = i;
      return {};
    }
  }
  from = at;
  next = 0;
  steps.clear();
  read_at = std::chrono::steady_clock::now();
  return read_lines(path, at, read_bytes, slice, limit);
}

void KeptSlice::index_steps(Lines kind) {
  if (steps.size() == slice.lines.size()) return;
  steps.clear();
  simdjson::dom::parser parser;
  for (const std::string_view line : slice.lines) {
    std::int64_t step = no_step;
    simdjson::dom::element doc;
    simdjson::dom::object row;
    if (parser.parse(line.data(), line.size()).get(doc) == simdjson::SUCCESS) {
      if (kind == Lines::histograms) {
        if (const Result<store::HistogramLine> h = store::read_histogram_line(doc)) step = h->step;
      } else if (kind == Lines::media) {
        if (const Result<store::MediaLine> m = store::read_media_line(doc)) step = m->step;
      } else if (doc.get(row) == simdjson::SUCCESS) {
        if (const store::HistoryRow r(row); r) step = r.step();
      }
    }
    steps.push_back(step);
  }
}

std::int64_t last_step(const KeptSlice& k) {
  for (std::size_t i = k.steps.size(); i-- > 0;)
    if (k.steps[i] != KeptSlice::no_step) return k.steps[i];
  return KeptSlice::no_step;
}

WholeSteps whole_steps(const KeptSlice& history, const KeptSlice& histograms, const KeptSlice* media,
                                       StepsBefore before, std::optional<SteadyTime> ended_at) {
  constexpr std::int64_t none = std::numeric_limits<std::int64_t>::min(), all = std::numeric_limits<std::int64_t>::max();
  const auto last = [](const KeptSlice& k) {
    const std::int64_t l = last_step(k);
    return l == KeptSlice::no_step ? none : l;
  };
  const auto below = [](std::int64_t step) { return step == KeptSlice::no_step ? none : step - 1; };
  const auto below_last = [&](const KeptSlice& k) {
    const std::int64_t l = last(k);
    return l == none ? none : l - 1;
  };
  // The steps before the last one in a file are whole in it (it is in step
  // order), and so is the last one of history.jsonl (a row a step); read to
  // the end after history.jsonl, histograms.jsonl and media.jsonl hold every
  // histogram and media of the rows read, and read to the end of a run that
  // ended, all there is. A step of histograms or media only has no row: the
  // steps before a line of theirs read before history.jsonl are whole in it.
  const auto in_part = [&](const KeptSlice& k) {
    if (k.slice.to_end) return all;
    // A step whose lines fill a whole slice goes in parts: no slice holds more of it.
    if (k.next == 0 && !k.steps.empty() && k.steps.front() == last(k)) return last(k);
    return below_last(k);
  };
  const bool history_whole = history.slice.to_end && ended_at && history.read_at >= *ended_at;
  std::int64_t in_history = history_whole ? all : std::max(last(history), below(before.histograms));
  std::int64_t through = in_part(histograms);
  if (media) {
    in_history = std::max(in_history, below(before.media));
    through = std::min(through, in_part(*media));
  }
  through = std::min(through, in_history);
  const auto prefix = [through](const KeptSlice& k) {
    std::size_t n = 0;
    for (std::size_t i = k.next; i < k.steps.size() && k.steps[i] <= through; ++i) ++n;
    return n;
  };
  return {prefix(history), prefix(histograms), media ? prefix(*media) : 0};
}

void read_artifacts(std::span<const std::string_view> lines, std::vector<ArtifactEntry>& out) {
  out.clear();
  simdjson::dom::parser parser;
  for (std::string_view line : lines) {
    ArtifactEntry a;
    simdjson::dom::object doc;
    if (parser.parse(line.data(), line.size()).get(doc) == simdjson::SUCCESS) {
      if (std::optional<store::ArtifactRecord> r = store::artifact_record(doc)) {
        a.name = std::move(r->name);
        a.type = std::move(r->type);
        a.sha256 = std::move(r->sha256);
        a.size = r->size;
      }
    }
    out.push_back(std::move(a));
  }
}

} // namespace chorus::upload
