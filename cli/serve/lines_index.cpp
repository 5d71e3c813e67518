// The index of a history.jsonl or system.jsonl itself (cli/serve/lines_index.hpp):
// its keys and what it keeps of each value, its rows, its refresh as the
// file grows (afresh where the file is replaced or cut, an overview first for
// a long one, the index built in the background taking its place once whole),
// the keys it keeps whole or leaves out of `_count/min`, its state and the
// memory it holds. Reading the file is lines_read.cpp's, answering
// lines_series.cpp's.
#include "cli/serve/index_store.hpp"
#include "cli/serve/lines_detail.hpp"

#include "io/platform/posix.hpp"

#include <fcntl.h>
#include <sys/stat.h>

namespace chorus::cli::serve {

using lines::release;
using lines::room;

std::string_view trim_line_end(std::string_view line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  return line;
}

std::optional<XAxis> parse_x_axis(std::string_view s) {
  if (s == "step") return XAxis::step;
  if (s == "wall") return XAxis::wall;
  if (s == "rel") return XAxis::rel;
  return std::nullopt;
}

LinesIndex::LinesIndex(std::string path, FileKind kind, std::uint64_t parallel_from, unsigned pieces,
                       std::uint64_t overview_from)
    : path_(std::move(path)), kind_(kind), parallel_from_(parallel_from),
      pieces_(pieces != 0 ? pieces : std::min(4u, std::thread::hardware_concurrency())), overview_from_(overview_from) {}

LinesIndex::~LinesIndex() {
  stop_building();
  if (meter_) meter_->fetch_sub(reported_, std::memory_order_relaxed);
}

void LinesIndex::hold_indexing(bool hold) {
  {
    std::lock_guard lock(gate_mutex_);
    hold_ = hold;
  }
  gate_.notify_all();
}

void LinesIndex::stop_building() {
  if (builder_.joinable()) {
    {
      std::lock_guard lock(gate_mutex_);
      stop_ = true; // a held building lets go, a running one stops at its next line
    }
    gate_.notify_all();
    builder_.join();
    stop_ = false;
  }
  next_.reset();
  built_ = false;
  overview_.reset();
  state_.indexing = false;
}

void LinesIndex::adopt(LinesIndex& built) {
  step_ = std::move(built.step_);
  wall_ = std::move(built.wall_);
  rel_ = std::move(built.rel_);
  marks_ = std::move(built.marks_);
  keys_ = std::move(built.keys_);
  by_name_ = std::move(built.by_name_);
  guess_ = std::move(built.guess_);
  pseudo_ = std::move(built.pseudo_);
  lines_ = built.lines_;
  first_skipped_line_ = built.first_skipped_line_;
  stuck_size_ = built.stuck_size_;
  kept_at_ = built.kept_at_;
  state_ = built.state_;
  state_.keys = keys_.size();
  state_.missing = false;
  state_.indexing = false;
}

void LinesIndex::reset() {
  stop_building();
  release(step_);
  release(wall_);
  release(rel_);
  release(marks_);
  release(keys_);
  release(by_name_);
  release(guess_);
  release(pseudo_);
  lines_ = 0;
  first_skipped_line_ = 0;
  stuck_size_ = 0;
  kept_at_ = 0;
  state_ = IndexState{};
  account();
}

LinesIndex::Key& LinesIndex::key(std::string_view name) {
  if (auto it = by_name_.find(name); it != by_name_.end()) return keys_[it->second];
  by_name_.emplace(std::string(name), static_cast<std::uint32_t>(keys_.size()));
  keys_.push_back(Key{.name = std::string(name)});
  keys_.back().keep = std::find(keep_.begin(), keep_.end(), name) != keep_.end();
  return keys_.back();
}

void LinesIndex::add(Key& k, std::uint32_t row, double v) {
  if (std::isnan(v)) {
    ++k.nans;
    k.nan_rows.push_back(row);
    return;
  }
  if (std::isinf(v)) {
    ++k.infs;
    (v > 0 ? k.inf_rows : k.ninf_rows).push_back(row);
    return;
  }
  if (k.points == 0) {
    k.min = k.max = v;
    k.first_row = row;
  } else {
    k.min = std::min(k.min, v);
    k.max = std::max(k.max, v);
  }
  k.last = v;
  k.last_row = row;
  ++k.points;
  if (k.blocks.empty() || k.blocks.back().n == block_points) {
    room(k.blocks);
    k.blocks.push_back({row, row, row, row, 0, v, v});
  }
  Block& b = k.blocks.back();
  if (v < b.min) b.min = v, b.min_row = row;
  if (v > b.max) b.max = v, b.max_row = row;
  b.last_row = row;
  ++b.n;
  if (!k.exact) return;
  if (k.exact_rows.size() < exact_points || k.keep) {
    k.exact_rows.push_back(row);
    k.exact_values.push_back(v);
    return;
  }
  k.exact = false;
  release(k.exact_rows);
  release(k.exact_values);
}

bool LinesIndex::refresh() {
  std::unique_lock lock(mutex_);
  // However it returns, memory() then knows what the index holds.
  struct Accounted {
    LinesIndex& index;
    ~Accounted() { index.account(); }
  } accounted{*this};
  const Result<int> fd = platform::open_regular(path_, O_RDONLY, true);
  if (!fd) {
    const bool changed = state_.problem.message() != fd.error().message();
    state_.problem = fd.error();
    return changed;
  }
  if (*fd < 0) {
    if (state_.missing && !state_.problem) return false;
    reset();
    return true;
  }
  struct stat st {};
  if (::fstat(*fd, &st) != 0) {
    platform::close_fd(*fd);
    return false;
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  bool changed = false;
  if (overview_ && built_.load(std::memory_order_acquire)) {
    // The index built in the background is whole: it takes the overview's place.
    builder_.join();
    std::unique_ptr<LinesIndex> built = std::move(next_);
    overview_.reset();
    built_ = false;
    adopt(*built);
    changed = true;
  }
  if (overview_) {
    // Still being built: the overview stands, unless the file was replaced or cut.
    if (st.st_dev == dev_ && st.st_ino == ino_ && size >= overview_->end) {
      platform::close_fd(*fd);
      return changed;
    }
    reset(); // stops the building; the file is read afresh below
  }
  if (state_.missing || st.st_dev != dev_ || st.st_ino != ino_ || size < state_.bytes) {
    // A new file, or one replaced (chorus recover rewrites it) or cut: read it afresh.
    reset();
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    state_.missing = false;
    changed = true;
  }
  if (size == state_.bytes || (stuck_size_ != 0 && size == stuck_size_)) {
    platform::close_fd(*fd);
    if (state_.unfinished && size == state_.bytes) {
      state_.unfinished = false;
      changed = true;
    }
    return changed;
  }
  const std::uint64_t rows_before = state_.rows;
  state_.problem = {};
  // A long file opened for the first time: its kept index, where it has one
  // (what was appended since is read below); else an overview now, the
  // index in the background.
  if (state_.bytes == 0 && size >= overview_from_) {
    const IndexStore::Mapped kept = store_ ? store_->read(store_->file_for(path_, kind_)) : IndexStore::Mapped();
    if (!kept.bytes().empty() && !take_kept(kept.bytes(), *fd, st.st_dev, st.st_ino, size)) {
      changed = true;
    } else if (start_overview(*fd, size)) {
      platform::close_fd(*fd);
      return true;
    }
  }
  // A long stretch to read (a run opened for the first time) is read by
  // several threads, a piece each.
  if (size - state_.bytes >= parallel_from_ && pieces_ > 1 && read_in_parallel(size, pieces_)) {
    platform::close_fd(*fd);
  } else {
    read_lines(*fd, size);
  }
  state_.keys = keys_.size();
  // A kept index of a file that grew by as much as a long file: kept again.
  if (kept_at_ != 0 && !state_.problem && state_.bytes >= kept_at_ + overview_from_) {
    keep();
    kept_at_ = state_.bytes;
  }
  return changed || state_.rows != rows_before || state_.problem;
}

IndexState LinesIndex::state() const {
  std::shared_lock lock(mutex_);
  IndexState s = state_;
  if (s.skipped > 0) s.first_skipped = "line " + std::to_string(first_skipped_line_) + ": " + s.first_skipped;
  return s;
}

std::vector<std::pair<std::string, std::int64_t>> LinesIndex::last_steps(std::string_view prefix) const {
  std::shared_lock lock(mutex_);
  std::vector<std::pair<std::string, std::int64_t>> out;
  if (overview_) {
    for (const Overview::Series& k : overview_->keys)
      if (k.name.starts_with(prefix) && !k.points.empty())
        out.emplace_back(k.name, overview_->lines[k.points.back().first].step);
    return out;
  }
  for (const Key& k : keys_)
    if (k.name.starts_with(prefix) && k.points > 0) out.emplace_back(k.name, step_[k.last_row]);
  return out;
}

void LinesIndex::keep_points(std::vector<std::string> keys) {
  std::unique_lock lock(mutex_);
  if (keys == keep_) return;
  keep_ = std::move(keys);
  bool lost = false;
  for (Key& k : keys_) {
    k.keep = std::find(keep_.begin(), keep_.end(), k.name) != keep_.end();
    lost = lost || (k.keep && !k.exact);
  }
  // An index built in the background meanwhile was told the keys of before.
  if (lost || overview_) reset();
}

void LinesIndex::count_ranks(const Result<store::MetricSpecs>& specs) {
  std::vector<std::string> uncounted;
  if (specs)
    for (const auto& [key, spec] : specs->specs)
      if (spec.reduce == Reduce::first) uncounted.push_back(key);
  std::sort(uncounted.begin(), uncounted.end());
  uncounted.erase(std::unique(uncounted.begin(), uncounted.end()), uncounted.end());
  std::unique_lock lock(mutex_);
  if (uncounted == uncounted_) return;
  uncounted_ = std::move(uncounted);
  // `_count/min` of the rows read (or being read) counted other keys: read afresh.
  if (state_.rows > 0 || state_.skipped > 0 || overview_) reset();
}

std::size_t LinesIndex::bytes_held() const {
  std::size_t n = step_.capacity() * sizeof(std::int64_t) + (wall_.capacity() + rel_.capacity()) * sizeof(double) +
                  marks_.capacity() * sizeof(Mark) + keys_.capacity() * sizeof(Key);
  for (const Key& k : keys_)
    n += k.name.capacity() * 2 + k.blocks.capacity() * sizeof(Block) +
         k.exact_rows.capacity() * sizeof(std::uint32_t) + k.exact_values.capacity() * sizeof(double) +
         (k.nan_rows.capacity() + k.inf_rows.capacity() + k.ninf_rows.capacity()) * sizeof(std::uint32_t) + 64;
  if (overview_) n += overview_->memory();
  return n;
}

void LinesIndex::account() {
  const std::size_t now = bytes_held();
  if (meter_ == nullptr) {
    held_.store(now, std::memory_order_relaxed);
    return;
  }
  meter_->fetch_add(static_cast<std::int64_t>(now) - reported_, std::memory_order_relaxed);
  reported_ = static_cast<std::int64_t>(now);
}

std::size_t LinesIndex::memory() const {
  const std::int64_t building = building_.load(std::memory_order_relaxed);
  return held_.load(std::memory_order_relaxed) + static_cast<std::size_t>(std::max<std::int64_t>(building, 0));
}

} // namespace chorus::cli::serve
