// A line index kept on disk (cli/serve/index_store.hpp keeps the files): its
// format, written by kept_bytes() and read back by take_kept(). One file
// holds, in this machine's byte order:
//
//   "chorusLX" u32 version u32 0x01020304 (the byte order) u8 kind
//   u64 device u64 inode u64 bytes (the complete lines indexed)
//   u64 hash of the data file's first 4 KiB, u64 hash of its last 4 KiB before `bytes`
//   u64 lines u64 first_skipped_line u64 rows u64 skipped str first_skipped
//   i64 last_step u8 unfinished
//   strs keep_points strs count_ranks (the index is one of those only)
//   rows x (i64 step) rows x (f64 wall) rows x (f64 run time)
//   u64 n, n x mark (u32 row u64 byte 6 x f64 ranges)
//   u64 n, n x key (str name u8 exact u8 keep u64 points nans infs
//     f64 min max last u32 first_row last_row
//     u64 n, n x block (5 x u32, 2 x f64), u32s exact rows, f64s exact values,
//     u32s NaN rows, u32s +Inf rows, u32s -Inf rows)
//   u64 word_hash of everything before it
//
// (str: u64 length and bytes; strs, u32s, f64s: u64 count and elements.)
// Reading checks every count against what is left, every row against the
// rows, the hash, and the file's identity and ends: a damaged, foreign or
// stale file is refused with the reason, and the index is then built afresh.
#include "cli/serve/index_store.hpp"
#include "cli/serve/lines_detail.hpp"

#include "io/platform/posix.hpp"
#include "runtime/core/fnv.hpp"

#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <type_traits>
#include <unistd.h>

namespace chorus::cli::serve {
namespace {

constexpr char magic[8] = {'c', 'h', 'o', 'r', 'u', 's', 'L', 'X'};
constexpr std::uint32_t format_version = 1;
constexpr std::uint32_t byte_order = 0x01020304;
/// The bytes at each end of the indexed part of the data file that are checked.
constexpr std::uint64_t end_bytes = 4096;
constexpr std::uint64_t most_rows = std::numeric_limits<std::uint32_t>::max();

class Out {
public:
  explicit Out(std::string& s) : s_(s) {}
  template <class T>
  void put(T v) {
    static_assert(std::is_arithmetic_v<T>);
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(std::string_view v) {
    put<std::uint64_t>(v.size());
    s_.append(v);
  }
  template <class T>
  void list(const std::vector<T>& v) {
    static_assert(std::is_arithmetic_v<T>);
    put<std::uint64_t>(v.size());
    s_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void strs(const std::vector<std::string>& v) {
    put<std::uint64_t>(v.size());
    for (const std::string& s : v) str(s);
  }

private:
  std::string& s_;
};

class In {
public:
  explicit In(std::string_view s) : p_(s.data()), end_(s.data() + s.size()) {}
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] std::size_t left() const { return static_cast<std::size_t>(end_ - p_); }
  template <class T>
  T get() {
    T v{};
    if (left() < sizeof v) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  /// A count of elements of `size` bytes each that what is left can hold.
  std::size_t count(std::size_t size) {
    const auto n = get<std::uint64_t>();
    if (!ok_ || n > left() / size) {
      ok_ = false;
      return 0;
    }
    return static_cast<std::size_t>(n);
  }
  std::string str() {
    const std::size_t n = count(1);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  template <class T>
  void list(std::vector<T>& v) {
    const std::size_t n = count(sizeof(T));
    v.clear();
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i, p_ += sizeof(T)) { // memcpy each: the file's bytes need no alignment
      T x;
      std::memcpy(&x, p_, sizeof x);
      v.push_back(x);
    }
  }
  std::vector<std::string> strs() {
    const std::size_t n = count(8);
    std::vector<std::string> v;
    for (std::size_t i = 0; i < n && ok_; ++i) v.push_back(str());
    return v;
  }

private:
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

/// The hashes of the first `end_bytes` of the data file open as `fd` and of
/// the last before `bytes`; nothing where they cannot be read.
std::optional<std::pair<std::uint64_t, std::uint64_t>> end_hashes(int fd, std::uint64_t bytes) {
  std::string buf;
  const std::size_t n = static_cast<std::size_t>(std::min(bytes, end_bytes));
  if (lines::read_at(fd, 0, n, buf).size() != n) return std::nullopt;
  const std::uint64_t head = core::fnv1a64(buf);
  if (lines::read_at(fd, bytes - n, n, buf).size() != n) return std::nullopt;
  return std::pair{head, core::fnv1a64(buf)};
}

} // namespace

std::string LinesIndex::kept_bytes() const {
  const Result<int> fd = platform::open_regular(path_, O_RDONLY);
  if (!fd) return {};
  struct stat st {};
  const bool same = ::fstat(*fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_ &&
                    static_cast<std::uint64_t>(st.st_size) >= state_.bytes;
  const auto ends = same && state_.bytes > 0 ? end_hashes(*fd, state_.bytes) : std::nullopt;
  platform::close_fd(*fd);
  if (!ends) return {};
  std::size_t size = 256 + step_.size() * 24 + marks_.size() * 60;
  for (const Key& k : keys_)
    size += 128 + k.name.size() + k.blocks.size() * 36 + k.exact_rows.size() * 12 +
            (k.nan_rows.size() + k.inf_rows.size() + k.ninf_rows.size()) * 4;
  std::string s;
  s.reserve(size);
  Out o(s);
  s.append(magic, sizeof magic);
  o.put(format_version);
  o.put(byte_order);
  o.put(static_cast<std::uint8_t>(kind_));
  o.put(dev_), o.put(ino_), o.put(state_.bytes), o.put(ends->first), o.put(ends->second);
  o.put(lines_), o.put(first_skipped_line_), o.put(state_.rows), o.put(state_.skipped);
  o.str(state_.first_skipped);
  o.put(state_.last_step);
  o.put(static_cast<std::uint8_t>(state_.unfinished));
  o.strs(keep_);
  o.strs(uncounted_);
  o.list(step_), o.list(wall_), o.list(rel_);
  o.put<std::uint64_t>(marks_.size());
  for (const Mark& m : marks_) {
    o.put(m.row), o.put(m.byte);
    for (const auto& [lo, hi] : m.range) o.put(lo), o.put(hi);
  }
  o.put<std::uint64_t>(keys_.size());
  for (const Key& k : keys_) {
    o.str(k.name);
    o.put(static_cast<std::uint8_t>(k.exact)), o.put(static_cast<std::uint8_t>(k.keep));
    o.put(k.points), o.put(k.nans), o.put(k.infs), o.put(k.min), o.put(k.max), o.put(k.last);
    o.put(k.first_row), o.put(k.last_row);
    o.put<std::uint64_t>(k.blocks.size());
    for (const Block& b : k.blocks) {
      o.put(b.first_row), o.put(b.last_row), o.put(b.min_row), o.put(b.max_row), o.put(b.n);
      o.put(b.min), o.put(b.max);
    }
    o.list(k.exact_rows), o.list(k.exact_values), o.list(k.nan_rows), o.list(k.inf_rows), o.list(k.ninf_rows);
  }
  o.put(word_hash(s));
  return s;
}

Error LinesIndex::take_kept(std::string_view kept, int fd, std::uint64_t dev, std::uint64_t ino, std::uint64_t size) {
  auto refused = [&](std::string_view why) {
    return Error(Errc::io_error, "the kept index of " + path_ + " is not used: " + std::string(why));
  };
  if (kept.size() < sizeof magic + 8 || std::memcmp(kept.data(), magic, sizeof magic) != 0)
    return refused("not an index file");
  {
    std::uint64_t sum = 0;
    std::memcpy(&sum, kept.data() + kept.size() - 8, 8);
    if (word_hash(kept.substr(0, kept.size() - 8)) != sum) return refused("damaged (its hash differs)");
  }
  In in(kept.substr(sizeof magic, kept.size() - sizeof magic - 8));
  if (in.get<std::uint32_t>() != format_version || in.get<std::uint32_t>() != byte_order)
    return refused("written by another version of chorus, or another machine");
  if (in.get<std::uint8_t>() != static_cast<std::uint8_t>(kind_)) return refused("of another kind of file");
  const auto kdev = in.get<std::uint64_t>(), kino = in.get<std::uint64_t>(), bytes = in.get<std::uint64_t>();
  const auto head = in.get<std::uint64_t>(), tail = in.get<std::uint64_t>();
  if (!in.ok() || kdev != dev || kino != ino || bytes == 0 || bytes > size)
    return refused("the file was replaced or cut since");
  if (end_hashes(fd, bytes) != std::pair{head, tail}) return refused("the file was rewritten since");
  if (size - bytes >= overview_from_) return refused("the file grew by more than it is quicker to index afresh");

  // Read into an index of its own: this one changes only where all of it is right.
  LinesIndex t(path_, kind_);
  t.dev_ = dev, t.ino_ = ino;
  t.state_.missing = false;
  t.state_.bytes = bytes;
  t.lines_ = in.get<std::uint64_t>();
  t.first_skipped_line_ = in.get<std::uint64_t>();
  t.state_.rows = in.get<std::uint64_t>();
  t.state_.skipped = in.get<std::uint64_t>();
  t.state_.first_skipped = in.str();
  t.state_.last_step = in.get<std::int64_t>();
  t.state_.unfinished = in.get<std::uint8_t>() != 0;
  if (in.strs() != keep_ || in.strs() != uncounted_)
    return refused(in.ok() ? "made with other declarations (metrics.json)" : "cut short");
  in.list(t.step_), in.list(t.wall_), in.list(t.rel_);
  const std::uint64_t rows = t.state_.rows;
  if (!in.ok() || rows > most_rows || t.step_.size() != rows || t.wall_.size() != rows || t.rel_.size() != rows)
    return refused("its rows do not add up");
  const auto in_rows = [&](std::uint64_t r) { return r < rows; };
  t.marks_.resize(in.count(60));
  for (Mark& m : t.marks_) {
    m.row = in.get<std::uint32_t>(), m.byte = in.get<std::uint64_t>();
    for (auto& [lo, hi] : m.range) lo = in.get<double>(), hi = in.get<double>();
    if (!in_rows(m.row) || m.byte >= bytes) return refused("a mark out of the file");
  }
  const std::size_t keys = in.count(8 + 2 + 8 * 6 + 8 + 8 * 6);
  t.keys_.reserve(keys);
  for (std::size_t i = 0; i < keys && in.ok(); ++i) {
    Key k;
    k.name = in.str();
    if (k.name.empty() || t.by_name_.contains(k.name)) return refused("a key twice, or with no name");
    k.exact = in.get<std::uint8_t>() != 0, k.keep = in.get<std::uint8_t>() != 0;
    k.points = in.get<std::uint64_t>(), k.nans = in.get<std::uint64_t>(), k.infs = in.get<std::uint64_t>();
    k.min = in.get<double>(), k.max = in.get<double>(), k.last = in.get<double>();
    k.first_row = in.get<std::uint32_t>(), k.last_row = in.get<std::uint32_t>();
    k.blocks.resize(in.count(36));
    for (Block& b : k.blocks) {
      b.first_row = in.get<std::uint32_t>(), b.last_row = in.get<std::uint32_t>();
      b.min_row = in.get<std::uint32_t>(), b.max_row = in.get<std::uint32_t>(), b.n = in.get<std::uint32_t>();
      b.min = in.get<double>(), b.max = in.get<double>();
      if (!in_rows(b.first_row) || !in_rows(b.last_row) || !in_rows(b.min_row) || !in_rows(b.max_row))
        return refused("a block out of the rows");
    }
    in.list(k.exact_rows), in.list(k.exact_values), in.list(k.nan_rows), in.list(k.inf_rows), in.list(k.ninf_rows);
    if (!in.ok()) break;
    bool fits = k.exact_rows.size() == k.exact_values.size() && (k.points == 0 || (in_rows(k.first_row) && in_rows(k.last_row)));
    for (const auto* list : {&k.exact_rows, &k.nan_rows, &k.inf_rows, &k.ninf_rows})
      fits = fits && std::all_of(list->begin(), list->end(), in_rows);
    if (!fits) return refused("a key's rows out of the rows");
    k.keep = std::find(keep_.begin(), keep_.end(), k.name) != keep_.end();
    t.by_name_.emplace(k.name, static_cast<std::uint32_t>(t.keys_.size()));
    t.keys_.push_back(std::move(k));
  }
  if (!in.ok() || in.left() != 0) return refused("cut short, or longer than it says");
  // The keys the index adds to each row find their place again as rows are read.
  adopt(t);
  kept_at_ = bytes;
  return {};
}

void LinesIndex::keep() const {
  if (!store_ || !store_->usable()) return;
  if (std::string bytes = kept_bytes(); !bytes.empty()) store_->put(store_->file_for(path_, kind_), std::move(bytes));
}

} // namespace chorus::cli::serve
