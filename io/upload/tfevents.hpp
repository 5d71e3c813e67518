// TensorBoard's event files, written by chorus: one file of records, each a
// serialized tensorflow.Event (docs/TENSORBOARD.md has the record format and
// the field numbers).
#pragma once

#include "runtime/core/result.hpp"

#include <chorus/chorus.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace chorus::upload {

/// One hyperparameter of a session, as TensorBoard's HParams plugin shows it:
/// a number, a boolean or a string.
struct HParam {
  std::string name;
  std::variant<double, bool, std::string> value;
};

/// CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`, extending
/// `crc`, the CRC of what came before: crc32c(b, crc32c(a)) is the CRC of a
/// followed by b. crc32c("123456789") == 0xE3069283. The span form of
/// io/platform/crc32c.hpp's crc32c (its tables, and SSE4.2 where the CPU has it).
[[nodiscard]] std::uint32_t crc32c(std::span<const char> data, std::uint32_t crc = 0) noexcept;

/// The CRC32C of `data`, masked as TensorBoard's records store it:
/// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
[[nodiscard]] std::uint32_t masked_crc32c(std::span<const char> data) noexcept;

/// The cells of a DT_STRING tensor, row by row, kept as the tensor will
/// hold them (each a TensorProto.string_val): a table of many small cells
/// costs its bytes, not a std::string each.
class StringTensor {
public:
  void add(std::string_view cell);
  [[nodiscard]] std::uint64_t size() const noexcept { return cells_; }

private:
  friend class TfEventsWriter;
  std::string encoded_;
  std::uint64_t cells_ = 0;
};

/// Summary.Image.colorspace of a PNG or JPEG file, as TensorFlow's image
/// summaries give it: 1 grey, 2 grey and alpha, 3 RGB, 4 RGBA. A PNG's from
/// its colour type (a palette is RGB; a tRNS chunk adds alpha); a JPEG's
/// from its frame header's components (1 grey, else 3); 3 where neither says.
[[nodiscard]] int image_colorspace(std::string_view file) noexcept;

/// One TensorBoard events file, written record by record. Each record is
/// the data's length (uint64, little-endian), the masked CRC32C of those 8
/// bytes (uint32 LE), the data, and the masked CRC32C of the data (uint32 LE);
/// the data is a tensorflow.Event.
///
/// Scalars are Summary.Value.simple_value, a 32-bit float: a double loses its
/// precision beyond about 7 significant digits, and a magnitude above
/// 3.4e38 becomes infinity. That is the format's limit; TensorBoard shows
/// what it reads. NaN and the infinities are written as they are.
///
/// Steps are >= 0 in chorus: an event with a negative step is not written,
/// and the next flush() or close() says how many were left out.
///
/// Records gather in memory and go out in one write once about 1 MiB has
/// gathered, or at flush(). A write that fails (a full disk, say) is undone
/// to the last whole record, so the file never ends inside one; its records
/// stay buffered and the next flush() tries again, unless 16 MiB have
/// gathered, when they are dropped (flush() says how many). The directory
/// is made 0700 and the file 0600, as everything else chorus writes.
///
/// One thread at a time.
class TfEventsWriter {
public:
  /// Records gather up to this many bytes before they are written.
  static constexpr std::size_t buffer_limit = std::size_t{1} << 20;
  /// While writes fail, records are kept for the next try up to this many bytes.
  static constexpr std::size_t pending_limit = std::size_t{16} << 20;
  /// The largest record written (and read back by scan_events): room for a
  /// 64 MiB image, text or table, the most chorus takes as one. A larger
  /// event is left out, and the next flush() says so.
  static constexpr std::size_t max_record = std::size_t{128} << 20;

  /// Creates DIR (and parents) and a new file DIR/events.out.tfevents.<unix
  /// seconds>.<hostname>.<pid>.<n> (n counts writers of this process, so two
  /// in one second do not collide), and writes the first event: file_version
  /// "brain.Event:2" at `wall_time_s`. The seconds are those of `wall_time_s`
  /// (the current time where it is negative or not finite), so the files of
  /// a run sort by its start, as TensorBoard reads them. An error names the
  /// path and the fix.
  [[nodiscard]] static Result<std::unique_ptr<TfEventsWriter>> create(const std::string& dir, double wall_time_s);

  /// Flushes, best-effort (call close() to see an error), and closes the file.
  ~TfEventsWriter();
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;

  /// A scalar: Summary.Value{tag, simple_value} at step and wall time
  /// (seconds since the epoch).
  void scalar(std::string_view tag, std::int64_t step, double wall_time_s, double value);

  /// A histogram: Summary.Value{tag, histo: HistogramProto} (TensorBoard's
  /// histograms and distributions views). Its buckets are the histogram's
  /// non-empty ones (a gap between them a bucket of 0), the infinities
  /// buckets at -DBL_MAX and DBL_MAX; NaN is left out; sum_squares is not
  /// kept (the views do not read it).
  void histogram(std::string_view tag, std::int64_t step, double wall_time_s, const Histogram& h);

  /// A text summary (TensorBoard's text plugin: metadata plugin_name "text",
  /// a scalar DT_STRING tensor).
  void text(std::string_view tag, std::int64_t step, double wall_time_s, std::string_view text);

  /// A table as the text plugin shows one: a 2-D DT_STRING tensor of shape
  /// [rows, columns], `cells` row by row (rows * columns of them; the
  /// caller's header row among them). Nothing is written where the count is
  /// not rows * columns.
  void table(std::string_view tag, std::int64_t step, double wall_time_s, std::uint64_t rows, std::uint64_t columns,
             const StringTensor& cells);

  /// An image: Summary.Value{tag, image: Summary.Image{height, width,
  /// colorspace, encoded_image_string}}, the PNG or JPEG file's bytes as
  /// they are (TensorBoard's images dashboard).
  void image(std::string_view tag, std::int64_t step, double wall_time_s, std::string_view file,
             std::uint32_t width, std::uint32_t height, int colorspace);

  /// The HParams plugin's session start (tag "_hparams_/session_start_info",
  /// step 0): the hyperparameters `values` in this order, and the session's
  /// start. TensorBoard takes this directory as one session, its scalars
  /// (and its subdirectories') as the session's metrics.
  void hparams(std::span<const HParam> values, double start_time_s, double wall_time_s);

  /// Writes what is buffered to the file (records are buffered, up to ~1
  /// MiB, then written); an error (disk full, say) names the file and the
  /// cause; nothing already written is damaged. Also reports what an earlier
  /// automatic write, or a negative step, left out.
  [[nodiscard]] Error flush();

  /// flush() and fdatasync: what was given so far is on disk.
  [[nodiscard]] Error sync();

  /// flush() and fsync; then the writer takes nothing more (events given
  /// after it are counted and reported by a later flush() or close()).
  [[nodiscard]] Error close();

  /// DIR/events.out.tfevents....
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// Bytes in the file: whole records, written out (not those still buffered).
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return written_; }

private:
  TfEventsWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  /// Whether an event of `tag` at `step` may be written; counts it where not.
  bool take(std::string_view tag, std::int64_t step);
  /// An Event of one Summary.Value of `tag`, serialized as the parts of
  /// `value` one after the other; one over max_record is counted instead.
  void add_summary(std::string_view tag, std::initializer_list<std::string_view> value, std::int64_t step,
                   double wall_time_s);
  /// A Summary.Value{tag, metadata: the text plugin's, tensor: DT_STRING of
  /// `dims` (none: a scalar)}, its string_vals encoded in `cells` and then
  /// `more_cells`.
  void string_tensor(std::string_view tag, std::int64_t step, double wall_time_s,
                     std::initializer_list<std::uint64_t> dims, std::string_view cells,
                     std::string_view more_cells = {});
  /// Frames `event_` as a record and buffers it; writes out past buffer_limit.
  void add_record();
  /// Writes the buffer; on failure, cuts the file back to its last whole record.
  Error write_out();
  /// What was left out since the last report (failed automatic writes,
  /// negative steps, events after close()), as one error; then forgets it.
  Error left_out();

  int fd_ = -1;
  std::string path_;
  std::string buf_;     // whole records not yet written
  std::size_t buffered_records_ = 0;
  std::size_t write_at_ = buffer_limit; // the buffer size that sends it out
  std::string event_;   // the Event being encoded
  std::uint64_t written_ = 0;
  Error failed_;                      // the first failed automatic write since the last flush()
  std::uint64_t dropped_ = 0;         // records dropped past pending_limit since then
  std::uint64_t negative_steps_ = 0;  // events left out for a negative step since then
  std::string first_negative_tag_;    // the first of them: its tag
  std::int64_t first_negative_step_ = 0; // and its step
  std::uint64_t after_close_ = 0;     // events given after close()
  std::uint64_t too_large_ = 0;       // events over max_record since the last report
  std::string first_too_large_tag_;   // the first of them: its tag
  bool closed_ = false;
};

/// What an events file already holds of one tag: for a writer that goes on
/// where an earlier one stopped, and writes nothing twice.
struct TagExtent {
  std::int64_t max_step = -1;   // the highest step written
  double max_wall_time = 0;     // the latest wall time written
  std::uint64_t events = 0;     // events of the tag
};

/// The tags of the events file at `path` and how far each goes, read record
/// by record with both CRCs checked. A torn or damaged tail (a writer that
/// stopped mid-record) ends the read: what precedes it counts. An error only
/// where the file cannot be read.
[[nodiscard]] Result<std::map<std::string, TagExtent, std::less<>>> scan_events(const std::string& path);

} // namespace chorus::upload
