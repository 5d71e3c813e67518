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
// own column (`act/rank-1`) as tag `act` of DIR/rank-1/.
//
// History scalars and histograms carry their line's _step and _timestamp;
// system samples have no step, so each series counts its samples (0, 1, ...)
// and carries its sample's _timestamp (TensorBoard's "wall" and "relative"
// axes show time). Scalars are TensorBoard's 32-bit floats (docs/TENSORBOARD.md).
//
// Nothing is written twice: a history scalar or a histogram at or below the
// step its series already reached, or a system sample no later than its
// series' last, is left out. resume() reads how far the files already in the directory
// go, so that a writer started again (a restarted upload, values sent again
// after a lost answer) goes on where the earlier one stopped.
#pragma once

#include "io/store/histogram_log.hpp"
#include "io/store/history_row.hpp"
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

namespace chorus::io {

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

  /// A history.jsonl row (io::HistoryRow): each metric value whose key
  /// `wanted` takes, a scalar at the row's _step and _timestamp. Why the
  /// line is no row (nothing is written), or "".
  std::string_view history_row(const simdjson::dom::object& row, const KeyPicker& wanted);
  /// A histograms.jsonl line (io::read_histogram_line), where `wanted`
  /// takes its column (`key` or `key/rank-N`): a HistogramProto at its _step
  /// and _timestamp, as tag `key` of the run's own files or of rank-N/.
  void histogram(const HistogramLine& line, const KeyPicker& wanted);
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
  void scalars_of(const RowValues& values, const KeyPicker& wanted, double wall_time, bool history, const Step& step);

  std::string dir_;
  std::map<std::string, std::unique_ptr<TfEventsWriter>, std::less<>> writers_;
  std::vector<std::string> opened_;
  std::map<std::string, TagExtent, std::less<>> extents_; // "SUB\nTAG" -> how far written
  std::uint64_t scalars_ = 0;
  std::uint64_t histograms_ = 0;
  Error failed_; // the first writer that could not be made since the last flush
};

/// A JSON object (config.json, summary.json) as a markdown table of its
/// top-level keys and their values (compact JSON), for a text summary.
[[nodiscard]] std::string markdown_table(const simdjson::dom::object& object);

/// A config's top-level keys as hyperparameters: numbers, booleans and
/// strings as they are, an object or array as its compact JSON text; a null
/// is left out (the HParams plugin takes scalars only).
[[nodiscard]] std::vector<HParam> hparams_of(const simdjson::dom::object& config);

} // namespace chorus::io
