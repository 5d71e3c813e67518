// A run's history.jsonl (or system.jsonl) indexed for `chorus serve`: one
// pass over the file keeps, per key, a summary of every 32 points (the
// smallest and largest value and the rows they are on) and, for keys of at
// most 65,536 points, the points themselves. A chart's series is then drawn
// from memory for any range and width; where a range holds few enough points
// to show them all, they are read back from the file itself, from the byte
// offset of the row where the range starts. The index grows with the file:
// each refresh reads only the complete lines appended since the last one.
//
// A long history opened for the first time is indexed in the background:
// until the index is whole, an overview of lines read at evenly spaced
// offsets of the file (each taken from the newline after its offset) answers
// for the whole run, and a range asked for is read from the file between the
// overview's lines around it, so every answer is right before the index is.
// system.jsonl takes the same path, its samples' line numbers (their "step")
// estimated from the lines' lengths until the index is whole.
//
// The index of a long file is kept on disk once built (cli/serve/index_store.hpp),
// so that a server opening it again reads only what was appended since.
//
// The index itself (its keys, rows, refresh and memory) is in
// lines_index.cpp; the reading of the file (its lines, on several threads,
// and the overview) in lines_read.cpp; the answers (x ranges, series, keys)
// in lines_series.cpp, downsampled by lines_collector.cpp; the kept file's
// format in lines_store.cpp; what they share in lines_detail.hpp.
#pragma once

#include "io/store/metric_specs.hpp"
#include "runtime/core/result.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace chorus::cli::serve {

class IndexStore;

/// What a series is drawn against: the row's `_step`, its `_timestamp` (unix
/// seconds) or its `_runtime` (seconds into the run).
enum class XAxis { step, wall, rel };
[[nodiscard]] std::optional<XAxis> parse_x_axis(std::string_view s);

/// A line of a run file without the '\r' and spaces that may end it.
[[nodiscard]] std::string_view trim_line_end(std::string_view line);

/// A history (rows with a whole `_step`) or system samples (one line per
/// rank and interval: `_timestamp`, `_runtime`, `_node`, `_rank`; their
/// "step" is the sample's line number).
enum class FileKind { history, system };

/// What a chart asks for: keys, the x it is drawn against, the x range
/// (the whole file where unset) and its width in pixels.
struct SeriesRequest {
  std::vector<std::string> keys;
  XAxis x = XAxis::step;
  std::optional<double> from, to;
  std::size_t width = 1000;
  /// Set: x is this key's value on the same row instead (a declared step
  /// metric, such as `epoch`; `x` is then not used), and a point is drawn
  /// only on the rows that have both.
  std::string x_key;
  /// While the index is built: the whole run read from the file for these
  /// keys (each line read for them only), not drawn from the overview.
  bool exact = false;
};

/// Where the index stands.
struct IndexState {
  std::uint64_t rows = 0;     // rows taken
  std::uint64_t skipped = 0;  // complete lines that are not rows
  std::string first_skipped;  // why the first of them was not
  std::uint64_t bytes = 0;    // the file's bytes read (complete lines)
  std::size_t keys = 0;
  std::int64_t last_step = -1;
  bool unfinished = false;    // the last line has no newline yet
  bool missing = true;        // there is no such file (yet)
  Error problem;              // the file could not be read on
  bool indexing = false;      // the index is being built: rows, keys and their points are
                              // estimates from an overview, bytes is 0, nothing is skipped yet
};

class LinesIndex {
public:
  /// Points a block sums up.
  static constexpr std::uint32_t block_points = 32;
  /// Keys of at most this many points keep them all.
  static constexpr std::size_t exact_points = 65536;
  /// A stretch of the file at least this long is read by several threads.
  static constexpr std::uint64_t parallel_bytes = 32u << 20;
  /// A file at least this long, opened for the first time, is indexed in
  /// the background, an overview of this many lines answering meanwhile.
  static constexpr std::uint64_t overview_bytes = 32u << 20;
  static constexpr std::size_t overview_lines = 4096;
  /// The fewest blocks of the writer's summary a pixel for it to stand for
  /// a whole history's rows (read_blocks).
  static constexpr std::uint64_t blocks_a_pixel = 4;

  /// `parallel_from`: the stretch from which several threads read, `pieces`
  /// of them (0: one a core, at most 4); `overview_from`: the length of a
  /// file from which its first reading is done in the background. Tests
  /// change them to compare the ways of reading.
  LinesIndex(std::string path, FileKind kind, std::uint64_t parallel_from = parallel_bytes, unsigned pieces = 0,
             std::uint64_t overview_from = overview_bytes);
  ~LinesIndex();
  LinesIndex(const LinesIndex&) = delete;
  LinesIndex& operator=(const LinesIndex&) = delete;

  /// Holds a background indexing started from now on before it reads
  /// (true) or lets it go (false): tests look at the answers before the
  /// index is whole.
  void hold_indexing(bool hold);

  /// Takes in the complete lines appended since the last call (all of the
  /// file the first time, or an overview of it while it is indexed in the
  /// background; the index once it is built); starts over where the file
  /// was replaced or cut. Returns whether anything changed.
  bool refresh();

  [[nodiscard]] IndexState state() const;
  /// Appends the keys as a JSON array: key, points, nan, inf (+Inf and -Inf
  /// together), min, max, last, first and last step (system.jsonl: first and
  /// last time). While the index is built: the overview's, `estimated`, its
  /// nan and inf those met on the overview's lines.
  void keys_json(std::string& out) const;
  /// Appends the answer to `r` as a JSON object: the range drawn, then
  /// per key its points (`x`, `y`), how many points the range holds (`n`),
  /// and whether every one of them is there (`full`). A key with more than
  /// two points per pixel gets the smallest and largest of each pixel, and
  /// the range's first and last point. Where the range has NaN or
  /// infinities of a key: `"nonfinite": {"nan": [x, ...], "inf": [x, ...],
  /// "-inf": [x, ...]}`, each kind only where it has some, sorted, at most
  /// one x a pixel (the first).
  void series_json(const SeriesRequest& r, std::string& out) const;
  /// The keys that start with `prefix`, each with the last step it has a
  /// finite value at (from the overview while the index is built).
  [[nodiscard]] std::vector<std::pair<std::string, std::int64_t>> last_steps(std::string_view prefix) const;
  /// The bytes the index holds, with those of an index being built for it
  /// (in the background, or in pieces on threads) as they grow. Takes no
  /// lock: it answers while the index is refreshed.
  [[nodiscard]] std::size_t memory() const;
  /// Keys that keep every point, however many (the x of other keys' charts:
  /// a point's x is looked up by its row). Where one of them already gave
  /// its points up, the index starts over at the next refresh.
  void keep_points(std::vector<std::string> keys);
  /// The run's declarations (metrics.json; none where it could not be
  /// read): `_count/min` leaves out the keys declared `first`, whose value is
  /// one rank's by design (rank 0's `lr`), so that their count of 1 is no
  /// sign of missing ranks. Where they change, the index starts over at the
  /// next refresh.
  void count_ranks(const Result<store::MetricSpecs>& specs);
  /// Keeps the index of a long file (one indexed in the background) in
  /// `store` once it is built, and again as the file grows by as much; a
  /// long file opened for the first time takes its kept index instead of
  /// being indexed afresh, where it is still that file's
  /// (cli/serve/index_store.hpp). Set before the first refresh.
  void keep_in(std::shared_ptr<IndexStore> store) { store_ = std::move(store); }
  /// Calls `built` (from the builder's thread) once an index built in the
  /// background is whole, so that the live pages are told at once rather
  /// than at their next look. Set before the first refresh.
  void when_built(std::function<void()> built) { on_built_ = std::move(built); }
  /// Whether this server may show the file at a path (cli/serve/api.hpp's
  /// not_shown), asked of a file beside the indexed one before it is read:
  /// the writer's block summary (read_blocks). Unset: every one. Set before
  /// the first refresh.
  void shown_by(std::function<bool(const std::string& path)> shown) { shown_ = std::move(shown); }

private:
  struct Block {
    std::uint32_t first_row = 0, last_row = 0, min_row = 0, max_row = 0, n = 0;
    double min = 0, max = 0;
  };
  struct Key {
    std::string name;
    std::vector<Block> blocks;
    std::vector<std::uint32_t> exact_rows; // while `exact`: every finite point
    std::vector<double> exact_values;
    bool exact = true;
    bool keep = false; // exact however many points (keep_points)
    std::uint64_t points = 0, nans = 0, infs = 0;
    // The rows of its NaN, +Inf and -Inf values (rare: kept one by one).
    std::vector<std::uint32_t> nan_rows, inf_rows, ninf_rows;
    double min = 0, max = 0, last = 0;
    std::uint32_t first_row = 0, last_row = 0;
  };
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  class RowReader;
  class Collector;
  struct Overview;

  /// Where a stretch of at least 64 rows starts (its first row and that
  /// row's byte offset), and the smallest and largest step, wall and run
  /// time of its rows (NaN: none).
  struct Mark {
    std::uint32_t row = 0;
    std::uint64_t byte = 0;
    std::pair<double, double> range[3] = {{nan(), nan()}, {nan(), nan()}, {nan(), nan()}};
    void take(XAxis x, double v);
    static constexpr double nan() { return std::numeric_limits<double>::quiet_NaN(); }
  };

  void reset();
  /// The bytes this index holds (its own, not those of one it builds).
  [[nodiscard]] std::size_t bytes_held() const;
  /// Makes memory() know what this index holds now: its own count, or, for
  /// an index being built for another (`meter_`), the other's count of
  /// what is being built.
  void account();
  /// Reads the complete lines of `fd` (which it closes) from state_.bytes up to `end`.
  void read_lines(int fd, std::uint64_t end);
  /// Reads [state_.bytes, end) in pieces, one thread each, then takes them in
  /// order; false (nothing changed) where a piece could not be read cleanly.
  bool read_in_parallel(std::uint64_t end, unsigned threads);
  /// Appends what `part` read, the piece of the file right after this one's.
  void merge(LinesIndex&& part);
  Key& key(std::string_view name);
  void add(Key& k, std::uint32_t row, double v);
  [[nodiscard]] double x_of(XAxis x, std::size_t row) const;
  /// Key `k`'s value on `row` (NaN: none, or `k` keeps no points).
  [[nodiscard]] static double value_at(const Key& k, std::size_t row);
  /// The rows whose x lies in [lo, hi], as [first, last); rows are in step
  /// order, and times nearly so (a margin takes those a little out of it).
  [[nodiscard]] std::pair<std::size_t, std::size_t> rows_in(XAxis x, double lo, double hi) const;
  /// The same where x is key `k`'s value: the first and last row it has one in [lo, hi].
  [[nodiscard]] static std::pair<std::size_t, std::size_t> rows_in(const Key& k, double lo, double hi);
  /// The smallest and largest x of the file (NaN where no row has one).
  [[nodiscard]] std::pair<double, double> x_range(XAxis x) const;
  /// Reads rows [first, last) from the file again, handing each key's values
  /// to `into`, at `x` (or, where `x_key` is set, at that key's value on the line).
  Error scan(std::size_t first, std::size_t last, const std::vector<std::string_view>& keys,
             const std::vector<Collector*>& into, XAxis x, std::string_view x_key, double lo, double hi) const;
  /// The same from byte `from` (a line's start, of row `row`) up to byte
  /// `end`, `uncounted` in place of the index's own (count_ranks): it reads
  /// nothing the index's lock guards, so that a long reading can let the
  /// lock go and hold no other request up.
  Error read_range(const std::vector<std::string>& uncounted, std::uint64_t from, std::uint64_t end, std::size_t row,
                   std::size_t first, std::size_t last, const std::vector<std::string_view>& keys,
                   const std::vector<Collector*>& into, XAxis x, std::string_view x_key, double lo, double hi) const;
  /// Every line of history bytes [from, end) read in pieces_ pieces side by
  /// side into `into` (one collector per key, `width` wide), as read_range
  /// would in one.
  Error read_pieces(const std::vector<std::string>& uncounted, std::uint64_t from, std::uint64_t end,
                    const std::vector<std::string_view>& keys, std::vector<Collector>& into, std::size_t width,
                    XAxis x, std::string_view x_key, double lo, double hi) const;

  /// read_pieces of a whole history from its start to `end` against the
  /// step, for metric keys alone, with the writer's block summary
  /// (io/store/history_blocks.hpp) standing for the rows it covers: each
  /// block's smallest and largest value, its first and last, and the first
  /// and last step of each kind of non-finite value, where there are
  /// blocks_a_pixel blocks a pixel or more; the rows after the last block
  /// are read. Nothing where the summary cannot serve (none, too few rows,
  /// another x): the caller reads the file.
  std::optional<Error> read_blocks(const std::vector<std::string>& uncounted, std::uint64_t end,
                                   const std::vector<std::string_view>& keys, std::vector<Collector>& into,
                                   std::size_t width, XAxis x, std::string_view x_key, double lo, double hi) const;

  /// Reads the overview of the file open as `fd`, `size` bytes long, and
  /// starts the index's building in the background; false where there is
  /// no overview to be had (the file is then read the plain way).
  bool start_overview(int fd, std::uint64_t size);
  /// Takes the index built in the background in place of the overview.
  void adopt(LinesIndex& built);
  /// The index as a kept file's bytes (cli/serve/lines_store.cpp); "" where
  /// the file it indexes cannot be read or is no longer the one indexed.
  [[nodiscard]] std::string kept_bytes() const;
  /// Takes the kept index `kept` of the file open as `fd` (its device,
  /// inode and size given) in place of this one's; where it is not that
  /// file's (replaced, cut or rewritten since), was made with other
  /// declarations, or is damaged: an error saying so, and nothing changed.
  Error take_kept(std::string_view kept, int fd, std::uint64_t dev, std::uint64_t ino, std::uint64_t size);
  /// Keeps the index (kept_bytes) in store_, from the builder's thread or under the lock.
  void keep() const;
  /// Stops a background indexing and forgets it and the overview.
  void stop_building();
  /// The answer to `r` while the index is built (series_json's JSON).
  /// (`lock`: the index's, held; let go for a reading of the file.)
  void overview_json(const SeriesRequest& r, std::string& out, std::shared_lock<std::shared_mutex>& lock) const;
  /// Key `k`'s NaN and infinities on rows [first, last) whose x (`x_at`) lies in [lo, hi], to `c`.
  template <class X>
  static void mark_nonfinite(const Key& k, std::size_t first, std::size_t last, double lo, double hi, X&& x_at,
                             Collector& c);

  const std::string path_;
  const FileKind kind_;
  const std::uint64_t parallel_from_;
  const unsigned pieces_;
  mutable std::shared_mutex mutex_;

  // Per row: its step and times.
  std::vector<std::int64_t> step_;
  std::vector<double> wall_, rel_;
  // A mark every 64 rows or so.
  std::vector<Mark> marks_;
  static constexpr std::uint32_t mark_every = 64;
  std::vector<Key> keys_;
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> by_name_;
  std::vector<std::uint32_t> guess_; // the key at each place of the previous row
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> pseudo_; // the keys the index adds
  std::vector<double> values_;       // the row being read
  std::vector<std::string> keep_;    // keep_points
  std::vector<std::string> uncounted_; // count_ranks: the keys _count/min leaves out, sorted

  std::uint64_t dev_ = 0, ino_ = 0;
  std::uint64_t lines_ = 0; // complete lines read, rows or not
  std::uint64_t first_skipped_line_ = 0;
  std::uint64_t stuck_size_ = 0; // the size at which a line too long stopped the reading
  IndexState state_;

  // While the index is built in the background: the overview that answers
  // meanwhile, the thread, and the index it builds (handed over by `built_`).
  std::unique_ptr<Overview> overview_;
  std::thread builder_;
  std::unique_ptr<LinesIndex> next_;
  std::atomic<bool> built_{false}, stop_{false};
  const std::atomic<bool>* stopped_ = &stop_; // what a piece read for another index looks at
  // memory(): what this index holds, as of its last account(), and what the
  // indexes being built for it (next_, and the pieces read on threads)
  // hold, each adding what it grew by since it last said.
  std::atomic<std::size_t> held_{0};
  std::atomic<std::int64_t> building_{0};
  std::atomic<std::int64_t>* meter_ = nullptr; // being built for another: its building_
  std::int64_t reported_ = 0;                  // what this one last added to *meter_
  const std::uint64_t overview_from_;
  std::shared_ptr<IndexStore> store_; // keep_in
  std::function<bool(const std::string&)> shown_; // shown_by
  std::function<void()> on_built_;    // when_built
  std::uint64_t kept_at_ = 0;         // the bytes indexed when the index was last kept (or taken from the store)
  std::mutex gate_mutex_;
  std::condition_variable gate_;
  bool hold_ = false;
};

} // namespace chorus::cli::serve
