// The reading of a history.jsonl or system.jsonl into its index
// (cli/serve/lines_index.hpp): its complete lines read in order
// (read_lines), a long stretch read in pieces on several threads and the
// pieces merged in order (read_in_parallel, merge), and the overview of a
// long file read at evenly spaced offsets while the index is built on a
// thread of its own (start_overview). An index being built says as it
// grows what it holds (account()), so that it counts towards the bound
// on the indexes' memory before it is whole.
#include "cli/serve/lines_detail.hpp"

#include "io/platform/posix.hpp"
#include "io/store/json_lines.hpp"
#include "io/store/line_reader.hpp"

#include <cstring>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

namespace chorus::cli::serve {
namespace lines {

std::string_view read_at(int fd, std::uint64_t at, std::size_t n, std::string& buf) {
  buf.resize(n);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(at + got));
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  return {buf.data(), got};
}

} // namespace lines

namespace {

using lines::blank;
using lines::read_at;
using lines::room;

constexpr std::uint64_t never_overview = std::numeric_limits<std::uint64_t>::max();
/// The nice value of the threads that build an index in the background.
constexpr int background_nice = 10;
/// Rows read between two accounts of an index being built.
constexpr std::uint64_t account_every = 4096;

/// The whole line that starts first at or after byte `at` (just after a
/// newline, or at 0) and ends before `end`: its start and text, or nothing
/// where none does within a line's greatest length.
std::optional<std::pair<std::uint64_t, std::string_view>> line_after(int fd, std::uint64_t at, std::uint64_t end,
                                                                     std::string& buf) {
  std::uint64_t start = at;
  if (at > 0) { // the newline at or after at - 1 ends the line `at` falls in
    std::uint64_t from = at - 1;
    for (;;) {
      if (from >= end || from - (at - 1) > store::max_line_bytes) return std::nullopt;
      const std::string_view b =
          read_at(fd, from, static_cast<std::size_t>(std::min<std::uint64_t>(8192, end - from)), buf);
      if (b.empty()) return std::nullopt;
      if (const auto nl = b.find('\n'); nl != std::string_view::npos) {
        start = from + nl + 1;
        break;
      }
      from += b.size();
    }
  }
  for (std::size_t n = 8192;; n *= 4) {
    if (start >= end) return std::nullopt;
    const std::string_view b =
        read_at(fd, start, static_cast<std::size_t>(std::min<std::uint64_t>(n, end - start)), buf);
    if (const auto nl = b.find('\n'); nl != std::string_view::npos) return std::pair{start, b.substr(0, nl)};
    if (b.size() < n || n > store::max_line_bytes) return std::nullopt; // the line runs past `end`, or too long
  }
}

} // namespace

bool LinesIndex::start_overview(int fd, std::uint64_t size) {
  auto o = std::make_unique<Overview>();
  std::string buf;
  // The complete lines end at the last newline.
  std::uint64_t end = size;
  for (std::uint64_t back = 0;;) {
    if (end == 0 || back > store::max_line_bytes) return false;
    const std::uint64_t from = end > 65536 ? end - 65536 : 0;
    const std::string_view b = read_at(fd, from, static_cast<std::size_t>(end - from), buf);
    if (b.size() != end - from) return false;
    if (const auto nl = b.rfind('\n'); nl != std::string_view::npos) {
      o->unfinished = !blank(b.substr(nl + 1)) || end != size;
      end = from + nl + 1;
      break;
    }
    back += end - from;
    end = from;
  }
  o->end = end;
  RowReader reader(kind_, &uncounted_);
  std::uint64_t sampled_bytes = 0, sampled = 0;
  auto take = [&](std::uint64_t start, std::string_view line) {
    if (!o->lines.empty() && start <= o->lines.back().byte) return;
    ++sampled;
    sampled_bytes += line.size() + 1;
    line = trim_line_end(line);
    if (line.empty()) return;
    const auto at = static_cast<std::uint32_t>(o->lines.size());
    std::vector<std::pair<std::uint32_t, double>> values;
    const std::string_view why = reader.read(line, at, [&](std::string_view name, double v, std::size_t) {
      auto it = o->by_name.find(name);
      if (it == o->by_name.end()) {
        it = o->by_name.emplace(std::string(name), static_cast<std::uint32_t>(o->keys.size())).first;
        o->keys.push_back({std::string(name), {}, {}});
      }
      values.emplace_back(it->second, v);
    });
    if (!why.empty()) return; // a damaged line: the index names it once it is built
    for (const auto& [k, v] : values) (std::isfinite(v) ? o->keys[k].points : o->keys[k].nonfinite).emplace_back(at, v);
    o->lines.push_back({start, reader.step, reader.wall, reader.rel});
  };
  const auto spot = [&](std::size_t i) { return end / overview_lines * i + end % overview_lines * i / overview_lines; };
  // Every spot asked of the disk at once, not one read after another: a
  // file out of the page cache is read many requests deep (the kernel
  // reads them in the background; the reads below wait for theirs only).
  for (std::size_t i = 0; i < overview_lines; ++i)
    ::posix_fadvise(fd, static_cast<off_t>(spot(i) > 0 ? spot(i) - 1 : 0), 16384, POSIX_FADV_WILLNEED);
  for (std::size_t i = 0; i < overview_lines; ++i)
    if (const auto line = line_after(fd, spot(i), end, buf)) take(line->first, line->second);
  // The last line: the run's end, as far as it has come.
  {
    const std::uint64_t from = end > 65536 ? end - 65536 : 0;
    const std::string_view b = read_at(fd, from, static_cast<std::size_t>(end - from), buf);
    const std::string_view body = b.substr(0, b.empty() ? 0 : b.size() - 1);
    const auto nl = body.rfind('\n');
    if (nl != std::string_view::npos || from == 0) {
      const std::uint64_t start = nl == std::string_view::npos ? 0 : from + nl + 1;
      const std::string last(body.substr(nl == std::string_view::npos ? 0 : nl + 1));
      take(start, last);
    }
  }
  if (o->lines.empty() || sampled == 0) return false;
  const double per_byte = static_cast<double>(sampled) / static_cast<double>(sampled_bytes);
  o->rows = static_cast<std::uint64_t>(std::llround(static_cast<double>(end) * per_byte));
  o->rows = std::max<std::uint64_t>(o->rows, o->lines.size());
  // A system sample's "step" is its line's number: estimated from where it
  // lies, the last line's the last.
  if (kind_ == FileKind::system) {
    for (Overview::Line& l : o->lines)
      l.step = std::min<std::int64_t>(static_cast<std::int64_t>(o->rows) - 1,
                                      std::llround(static_cast<double>(l.byte) * per_byte));
    o->lines.back().step = static_cast<std::int64_t>(o->rows) - 1;
  }
  state_.indexing = true;
  state_.rows = o->rows;
  state_.keys = o->keys.size();
  state_.last_step = o->lines.back().step;
  state_.unfinished = o->unfinished;
  overview_ = std::move(o);

  // The index itself, read on threads of its own up to the overview's end.
  auto next = std::make_unique<LinesIndex>(path_, kind_, parallel_from_, pieces_, never_overview);
  next->state_.missing = false;
  next->dev_ = dev_, next->ino_ = ino_;
  next->stopped_ = &stop_;
  next->keep_ = keep_;
  next->uncounted_ = uncounted_;
  next->meter_ = &building_;
  next->store_ = store_;
  next_ = std::move(next);
  builder_ = std::thread([this, end] {
    // Below the requests, and the browser on this machine that waits for
    // them: the index is built with the processor time they leave (its
    // pieces' threads, started from this one, inherit it).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), background_nice);
    {
      std::unique_lock lock(gate_mutex_);
      gate_.wait(lock, [this] { return !hold_ || stop_; });
    }
    LinesIndex& n = *next_;
    const Result<int> in = platform::open_regular(path_, O_RDONLY);
    if (!in) {
      n.state_.problem = in.error();
    } else if (end >= parallel_from_ && pieces_ > 1 && n.read_in_parallel(end, pieces_)) {
      platform::close_fd(*in);
    } else {
      n.read_lines(*in, end);
    }
    n.account();
    // Kept on disk (written by the store's own thread): a server opening the file again takes it.
    if (!n.state_.problem && n.store_) {
      n.keep();
      n.kept_at_ = n.state_.bytes;
    }
    built_.store(true, std::memory_order_release);
    if (on_built_) on_built_();
  });
  return true;
}

void LinesIndex::read_lines(int fd, std::uint64_t end) {
  store::LineReader lines(fd, path_, {lines_, state_.bytes}, {.chunk = 4u << 20, .max_line = store::max_line_bytes, .end = end});
  RowReader reader(kind_, &uncounted_);
  std::vector<std::uint32_t> ids;
  for (std::string_view line;;) {
    if (stopped_->load(std::memory_order_relaxed)) {
      state_.problem = Error(Errc::io_error, path_ + ": indexing stopped");
      break;
    }
    const store::LineReader::Next next = lines.next(line);
    if (next == store::LineReader::Next::end) {
      state_.unfinished = !blank(lines.rest());
      break;
    }
    if (next == store::LineReader::Next::too_long) {
      stuck_size_ = end;
      state_.problem = lines.error(); // store::line_too_long: the lines after it are not read
      break;
    }
    if (next == store::LineReader::Next::failed) {
      state_.problem = lines.error();
      break;
    }
    const std::uint64_t line_start = lines.cursor().bytes - line.size() - 1;
    line = trim_line_end(line);
    if (line.empty()) continue;
    if (state_.rows >= std::numeric_limits<std::uint32_t>::max()) {
      state_.problem = Error(Errc::io_error, path_ + " holds more rows than chorus serve indexes (2^32)");
      break;
    }
    auto skip = [&](std::string_view why) {
      if (state_.skipped++ == 0) {
        first_skipped_line_ = lines.cursor().lines;
        state_.first_skipped = std::string(why);
      }
    };
    const auto row = static_cast<std::uint32_t>(state_.rows);
    ids.clear();
    const std::string_view why = reader.read(line, row, [&](std::string_view name, double v, std::size_t place) {
      // The keys of a row mostly come in the same order as in the row before.
      Key* k = nullptr;
      if (place != std::string_view::npos && place < guess_.size() && keys_[guess_[place]].name == name) {
        k = &keys_[guess_[place]];
      } else if (place == std::string_view::npos) {
        auto it = pseudo_.find(name);
        if (it == pseudo_.end()) {
          Key& made = key(name);
          it = pseudo_.emplace(made.name, static_cast<std::uint32_t>(&made - keys_.data())).first;
        }
        k = &keys_[it->second];
      } else {
        k = &key(name);
        if (place >= guess_.size()) guess_.resize(place + 1, 0);
        guess_[place] = static_cast<std::uint32_t>(k - keys_.data());
      }
      ids.push_back(static_cast<std::uint32_t>(k - keys_.data()));
      values_.push_back(v);
    });
    if (!why.empty()) {
      values_.clear();
      skip(why);
      continue;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) add(keys_[ids[i]], row, values_[i]);
    values_.clear();
    if (marks_.empty() || row - marks_.back().row >= mark_every) {
      room(marks_);
      marks_.push_back({.row = row, .byte = line_start});
    }
    Mark& m = marks_.back();
    m.take(XAxis::step, static_cast<double>(reader.step));
    m.take(XAxis::wall, reader.wall);
    m.take(XAxis::rel, reader.rel);
    room(step_);
    room(wall_);
    room(rel_);
    step_.push_back(reader.step);
    wall_.push_back(reader.wall);
    rel_.push_back(reader.rel);
    state_.last_step = reader.step;
    if (++state_.rows % account_every == 0) account(); // memory() sees a long reading grow
  }
  state_.bytes = lines.cursor().bytes;
  lines_ = lines.cursor().lines;
}

namespace lines {

std::vector<std::uint64_t> piece_starts(const std::string& path, std::uint64_t from, std::uint64_t end,
                                        unsigned pieces) {
  std::vector<std::uint64_t> starts{from};
  const Result<int> fd = platform::open_regular(path, O_RDONLY);
  if (!fd) return {};
  const std::uint64_t piece = (end - from) / pieces;
  char buf[1 << 16];
  for (unsigned i = 1; i < pieces; ++i) {
    std::uint64_t at = std::max(starts.back(), from + piece * i);
    for (bool found = false; !found;) {
      const ssize_t n = ::pread(*fd, buf, sizeof buf, static_cast<off_t>(at));
      if (n <= 0 || at >= end || at - (from + piece * i) > store::max_line_bytes) {
        platform::close_fd(*fd);
        return {};
      }
      if (const void* nl = std::memchr(buf, '\n', static_cast<std::size_t>(n))) {
        at += static_cast<std::uint64_t>(static_cast<const char*>(nl) - buf) + 1;
        found = true;
      } else {
        at += static_cast<std::uint64_t>(n);
      }
    }
    if (at >= end) break;
    starts.push_back(at);
  }
  platform::close_fd(*fd);
  starts.push_back(end);
  return starts;
}

} // namespace lines

bool LinesIndex::read_in_parallel(std::uint64_t end, unsigned threads) {
  // Pieces start just after a newline, at about equal distances.
  const std::vector<std::uint64_t> starts = lines::piece_starts(path_, state_.bytes, end, threads);
  if (starts.empty()) return false;
  // Each piece says what it holds as it grows, to whatever this index says to.
  std::atomic<std::int64_t>* const meter = meter_ != nullptr ? meter_ : &building_;
  std::vector<std::unique_ptr<LinesIndex>> parts;
  for (std::size_t i = 0; i + 1 < starts.size(); ++i) {
    parts.push_back(std::make_unique<LinesIndex>(path_, kind_, parallel_from_, 1));
    parts.back()->state_.bytes = starts[i];
    parts.back()->state_.missing = false;
    parts.back()->stopped_ = stopped_;
    parts.back()->keep_ = keep_;
    parts.back()->uncounted_ = uncounted_;
    parts.back()->meter_ = meter;
  }
  std::vector<std::thread> workers;
  for (std::size_t i = 0; i < parts.size(); ++i)
    workers.emplace_back([&, i] {
      const Result<int> fd = platform::open_regular(path_, O_RDONLY);
      if (!fd) {
        parts[i]->state_.problem = fd.error();
        return;
      }
      parts[i]->read_lines(*fd, starts[i + 1]);
    });
  for (std::thread& t : workers) t.join();
  // Each piece but the last must have been read to its end (the last may end
  // in a line being written); anything else is read again the plain way.
  for (std::size_t i = 0; i < parts.size(); ++i)
    if (parts[i]->state_.problem || (i + 1 < parts.size() && parts[i]->state_.bytes != starts[i + 1])) return false;
  // Room for every piece at once, then each in turn, its memory given back.
  std::size_t rows = step_.size(), marks = marks_.size();
  for (const auto& p : parts) rows += p->step_.size(), marks += p->marks_.size();
  step_.reserve(rows);
  wall_.reserve(rows);
  rel_.reserve(rows);
  marks_.reserve(marks);
  for (auto& p : parts) {
    merge(std::move(*p));
    p.reset();
    account();
  }
  return true;
}

void LinesIndex::merge(LinesIndex&& part) {
  const auto base = static_cast<std::uint32_t>(state_.rows);
  const std::size_t had = step_.size();
  step_.insert(step_.end(), part.step_.begin(), part.step_.end());
  // System samples count their lines as their steps: the piece's count on.
  if (kind_ == FileKind::system)
    for (std::size_t i = had; i < step_.size(); ++i) step_[i] += base;
  wall_.insert(wall_.end(), part.wall_.begin(), part.wall_.end());
  rel_.insert(rel_.end(), part.rel_.begin(), part.rel_.end());
  for (Mark m : part.marks_) {
    m.row += base;
    if (kind_ == FileKind::system)
      for (double* v : {&m.range[0].first, &m.range[0].second}) *v += base;
    marks_.push_back(m);
  }
  for (Key& pk : part.keys_) {
    Key& k = key(pk.name);
    k.blocks.reserve(k.blocks.size() + pk.blocks.size());
    for (Block b : pk.blocks) {
      b.first_row += base, b.last_row += base, b.min_row += base, b.max_row += base;
      k.blocks.push_back(b);
    }
    if (k.exact && pk.exact && (k.keep || k.exact_rows.size() + pk.exact_rows.size() <= exact_points)) {
      for (const std::uint32_t r : pk.exact_rows) k.exact_rows.push_back(r + base);
      k.exact_values.insert(k.exact_values.end(), pk.exact_values.begin(), pk.exact_values.end());
    } else if (k.exact) {
      k.exact = false;
      lines::release(k.exact_rows);
      lines::release(k.exact_values);
    }
    for (const auto& [to, from] : {std::pair{&k.nan_rows, &pk.nan_rows}, std::pair{&k.inf_rows, &pk.inf_rows},
                                   std::pair{&k.ninf_rows, &pk.ninf_rows}})
      for (const std::uint32_t r : *from) to->push_back(r + base);
    if (pk.points > 0) {
      if (k.points == 0) {
        k.min = pk.min, k.max = pk.max, k.first_row = pk.first_row + base;
      } else {
        k.min = std::min(k.min, pk.min), k.max = std::max(k.max, pk.max);
      }
      k.last = pk.last, k.last_row = pk.last_row + base;
    }
    k.points += pk.points, k.nans += pk.nans, k.infs += pk.infs;
  }
  if (state_.skipped == 0 && part.state_.skipped > 0) {
    first_skipped_line_ = lines_ + part.first_skipped_line_;
    state_.first_skipped = part.state_.first_skipped;
  }
  state_.skipped += part.state_.skipped;
  state_.rows += part.state_.rows;
  if (part.state_.rows > 0) state_.last_step = step_.back();
  state_.bytes = part.state_.bytes;
  state_.unfinished = part.state_.unfinished;
  lines_ += part.lines_;
}

} // namespace chorus::cli::serve
