// A chorus run as TensorBoard runs: the event files of one run directory's
// history, system metrics, config and summary, laid out so that
// TensorBoard's run selector tells the ranks and nodes apart.
//
//   DIR/                  the run's own keys (plain and reduced), config and
//                         summary as text
//   DIR/rank-N/           its per-rank columns: `loss/rank-3` is tag `loss`
//                         of run `DIR/rank-3`, so every rank's curve of a key
//                         shares one chart; and rank N's system metrics
//   DIR/node-N/           node N's system metrics
//
// A histogram (histograms.jsonl) goes where a scalar of its column would:
// a merged key's, or the run of one rank's, in DIR as tag `key`; a rank's
// own column (`act/rank-1`) as tag `act` of DIR/rank-1/. An image, text or
// table (media.jsonl) is always its rank's: in a run of one rank in DIR,
// in a run of several in DIR/rank-N/, as tag `key`.
//
// History scalars and histograms carry their line's _step and _timestamp;
// system samples have no step, so each series counts its samples (0, 1, ...)
// and carries its sample's _timestamp (TensorBoard's "wall" and "relative"
// axes show time). Scalars are TensorBoard's 32-bit floats (docs/TENSORBOARD.md).
//
// Nothing is written twice: a history scalar, a histogram or a media at or
// below the step its series already reached, or a system sample no later than its
// series' last, is left out. resume() reads how far the files already in the directory
// go, so that a writer started again (a restarted upload, values sent again
// after a lost answer) goes on where the earlier one stopped.
#pragma once

#include "io/store/histogram_log.hpp"
#include "io/store/history_row.hpp"
#include "io/store/media_log.hpp"
#include "io/upload/tfevents.hpp"

#include <simdjson.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::upload {

/// Which keys to take; null takes every key.
using KeyPicker = std::function<bool(std::string_view)>;

class TensorBoardRun {
public:
  /// `dir`: where this run's event files go (made where missing).
  explicit TensorBoardRun(std::string dir);
  ~TensorBoardRun();
  TensorBoardRun(const TensorBoardRun&) = delete;
  TensorBoardRun& operator=(const TensorBoardRun&) = delete;

  /// Reads the event files already in the directory (written by an earlier
  /// TensorBoardRun), so that what they hold is not written again. An error
  /// where one cannot be read; a torn tail counts up to its last whole record.
  [[nodiscard]] Error resume();

  /// A history.jsonl row (store::HistoryRow): each metric value whose key
  /// `wanted` takes, a scalar at the row's _step and _timestamp. Why the
  /// line is no row (nothing is written), or "".
  std::string_view history_row(const simdjson::dom::object& row, const KeyPicker& wanted);
  /// A histograms.jsonl line (store::read_histogram_line), where `wanted`
  /// takes its column (`key` or `key/rank-N`): a HistogramProto at its _step
  /// and _timestamp, as tag `key` of the run's own files or of rank-N/.
  void histogram(const store::HistogramLine& line, const KeyPicker& wanted);
  /// The run's ranks (run.json's world_size): a run of one keeps its media
  /// in its own files, beside its scalars and histograms; a run of several
  /// keeps rank N's in rank-N/, whichever ranks log the key. One until set.
  void world_size(std::int64_t ranks) noexcept { one_rank_ = ranks == 1; }
  /// A media.jsonl line (store::read_media_line) whose column (`key`; in a run
  /// of several ranks `key/rank-N`) `wanted` takes: its file, read from
  /// `run_dir`, at the line's _step and _timestamp as tag `key`, an image as
  /// Summary.Image, a text as the text plugin's string, a table as the text
  /// plugin's 2-D string tensor (table_cells). An error names the file where
  /// it cannot be read or is not what its line says: nothing is written.
  [[nodiscard]] Error media(const store::MediaLine& line, const std::string& run_dir, const KeyPicker& wanted);
  /// A system.jsonl row: `KEY/node-N` goes to node-N/, `KEY/rank-N` to
  /// rank-N/, each at its series' next sample.
  void system_row(const simdjson::dom::object& row, const KeyPicker& wanted);
  /// A text summary in the run's own files (TensorBoard's text plugin
  /// renders it as markdown), at step 0 for the first of its tag, 1 for the
  /// next (a config that changed), and so on.
  void text(std::string_view tag, std::string_view markdown, double wall_time_s);
  /// The run's config: as text (`config`, a markdown table) each time, and
  /// once, its top-level keys as the hyperparameters of TensorBoard's HParams
  /// plugin (hparams_of), the session starting at `wall_time_s`.
  void config(const simdjson::dom::object& config, double wall_time_s);

  /// Writes what is buffered; the first problem since the last flush (a
  /// directory that cannot be made, a full disk), naming the file.
  [[nodiscard]] Error flush();
  /// flush(), then every file is synced (fdatasync): all given so far is on disk.
  [[nodiscard]] Error sync();
  /// flush(), then every file is synced and closed.
  [[nodiscard]] Error close();

  [[nodiscard]] std::uint64_t scalars() const noexcept { return scalars_; }
  [[nodiscard]] std::uint64_t histograms() const noexcept { return histograms_; }
  /// Images, texts and tables written.
  [[nodiscard]] std::uint64_t media_files() const noexcept { return media_; }
  /// The event files written, in the order they were opened.
  [[nodiscard]] std::vector<std::string> files() const;

private:
  /// The writer of `sub` ("" for the run's own files), made at its first
  /// event's wall time; null where it could not be made (see failed_).
  TfEventsWriter* writer(std::string_view sub, double wall_time_s);
  /// `op` on every writer; the first problem since the last call.
  Error each_writer(Error (TfEventsWriter::*op)());
  /// How far the series `tag` of `sub` goes.
  TagExtent& extent(std::string_view sub, std::string_view tag);
  /// `e` reaches one more event, at `step` and `wall_time`.
  static void extend(TagExtent& e, std::int64_t step, double wall_time);
  /// Each of `values` that `wanted` takes, to the subdirectory and tag its
  /// key names, at the step `step(extent)` gives (nothing where it gives -1).
  template <class Step>
  void scalars_of(const store::RowValues& values, const KeyPicker& wanted, double wall_time, bool history, const Step& step);

  std::string dir_;
  std::map<std::string, std::unique_ptr<TfEventsWriter>, std::less<>> writers_;
  std::vector<std::string> opened_;
  std::map<std::string, TagExtent, std::less<>> extents_; // "SUB\nTAG" -> how far written
  std::uint64_t scalars_ = 0;
  std::uint64_t histograms_ = 0;
  std::uint64_t media_ = 0;
  bool one_rank_ = true;
  simdjson::dom::parser parser_; // a table's JSON
  Error failed_; // the first writer that could not be made since the last flush
};

/// A JSON object (config.json, summary.json) as a markdown table of its
/// top-level keys and their values (compact JSON), for a text summary.
[[nodiscard]] std::string markdown_table(const simdjson::dom::object& object);

/// A table file's JSON, {"columns": [...], "data": [[...], ...]}, as the
/// cells of the text plugin's 2-D string tensor: the columns, then each row
/// of data, `columns` cells each, `rows` counting the columns' row. A cell
/// is its string, a number as chorus's JSON writes it, true or false, ""
/// for null, an array or object as its compact JSON. An error says what is
/// wrong with the JSON (no cells then).
[[nodiscard]] Error table_cells(const simdjson::dom::element& table, StringTensor& cells, std::uint64_t& rows,
                                std::uint64_t& columns);

/// A config's top-level keys as hyperparameters: numbers, booleans and
/// strings as they are, an object or array as its compact JSON text; a null
/// is left out (the HParams plugin takes scalars only).
[[nodiscard]] std::vector<HParam> hparams_of(const simdjson::dom::object& config);

} // namespace chorus::upload
