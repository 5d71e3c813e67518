// The RunWriter: the readable files of a run directory (README, "The run
// directory"), written from the merged history.
#pragma once

#include "runtime/core/history.hpp"

#include <chorus/chorus.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace chorus::store {

struct BarrierRecord;

/// Writes the readable files of a run directory from what the Merger
/// produces: history.jsonl, config.json, summary.json, rejected.jsonl,
/// events.jsonl, metrics.json and run.json. It owns those files and starts them afresh, because it is fed
/// a run's whole stream (live, or replayed from the WAL by `chorus recover`).
/// rejected.jsonl, histograms.jsonl, media.jsonl and events.jsonl are made
/// by their first line: a run without such a line has no such file.
///
/// The sink interface returns nothing, so I/O errors are kept: error()
/// holds the first one, and writing goes on where it still can.
class RunWriter final : public chorus::core::HistorySink {
public:
  /// `key_name` maps the key ids of a Row to names (Merger::key_name).
  RunWriter(std::string dir, std::function<std::string_view(std::uint32_t)> key_name);
  /// Flushes.
  ~RunWriter() override;
  RunWriter(const RunWriter&) = delete;
  RunWriter& operator=(const RunWriter&) = delete;

  void run_start(std::string_view run_json, std::int64_t ts_us, std::uint32_t world_size) override;
  void row(const chorus::core::Row& row) override;
  void config(int rank, std::string_view json_object) override;
  void summary(int rank, std::string_view json_object) override;
  void rejected(int rank, std::uint64_t seq, std::int64_t step,
                std::span<const std::pair<std::string_view, double>> values, const Error& why) override;
  void refused(int rank, std::uint64_t seq, std::int64_t step, const Error& why, std::string_view values,
               std::uint32_t n) override;
  /// Kept for metrics.json, and the summary's value of the key.
  void metric(std::uint32_t key, Reduce reduce, Summary summary, std::uint32_t step_key) override;
  /// Kept for run.json's ranks ("joined"): the first of each rank in an attempt.
  void rank_joined(int rank, std::int64_t ts_us) override;
  void rank_state(int rank, RunState state, std::int64_t last_step, std::string_view host,
                  std::string_view reason) override;
  /// Acks are the Run actor's business: ignored.
  void completed(int rank, std::uint64_t seq, const Error* err) override;
  /// Appends the event's line to events.jsonl (io/store/event_log.hpp) and
  /// flushes it at once: its readers (`chorus watch`, the webhook) wait for it.
  void event(const core::wire::EventRecord& event) override;
  /// Flushes everything and rewrites summary.json and run.json with the end
  /// state and the lengths of what it wrote (end_backed_by_wal says which it syncs).
  void run_end(RunState state, std::int64_t ts_us) override;
  /// The first half of run_end(), which it makes unless called before:
  /// every file of the end but run.json (the line files out, the files the
  /// WAL does not hold synced, config.json, metrics.json and summary.json).
  /// The Run actor writes them while the WAL's sync runs, and run.json once
  /// it returned.
  void end_files();
  /// run_end()'s run.json made ahead, while the WAL's sync that makes the
  /// end durable runs: its text in a temporary file, its writes started, so
  /// that run_end() has only to rename it into place once the sync returned
  /// (where it is still the text run_end() would write; else it is dropped).
  /// Nothing where the WAL does not back the end.
  void stage_run_end(RunState state, std::int64_t ts_us);
  /// Frees the room held on the run's disk for its end (`.reserve`), once
  /// the end is written and answered; the writer's destructor frees it too.
  void release_room();

  /// Appends one line (a JSON object) to system.jsonl. System samples are
  /// not in the WAL: `chorus recover` leaves the file as it is.
  void system_line(std::string_view json_line);
  /// Appends a released barrier to barriers.jsonl (io/store/barrier_log.hpp).
  /// Timed by the Run actor, not in the WAL: `chorus recover` leaves the file
  /// as it is, and a replay writes none.
  void barrier(const BarrierRecord& record);

  /// Writes buffered history and rejected lines, and config.json,
  /// summary.json and run.json (rank states) if they changed. Each rewrite costs an fsync: call this
  /// on a timer or per batch, not per row.
  void flush();

  /// summary.json's object as it stands: each column's last value, with
  /// what run.summary set over them.
  [[nodiscard]] std::string summary_json() const;

  /// Takes from the run.json at `run_json_path`, which a replay of the WAL
  /// is about to rebuild, what the WAL lacks: the exit codes `chorus launch`
  /// added (its "segments" and its top-level "exit_codes", the last
  /// attempt's), so that each attempt keeps its own. Returns the state it
  /// records (launch marks a run it stopped killed), if it has one.
  std::optional<RunState> carry_over(const std::string& run_json_path);

  /// Records `e` as the run's error (its WAL failed, say): run.json says so.
  void note_error(const Error& e);

  /// Whether a sync of the run's WAL, made once the end is written, makes
  /// the end durable (the live run host; not `chorus recover`, whose WAL
  /// is not written, nor a host whose WAL failed). Then run_end() syncs only
  /// the files the WAL does not hold (system.jsonl, barriers.jsonl): the rest
  /// are written and their writeback started, and run.json records their
  /// lengths (RunRecord::lengths), so that a reader can tell a file that a
  /// crash of the machine cut short, and `chorus recover` rebuilds it.
  void end_backed_by_wal(bool backed) noexcept;

  /// The run's error as the run.json being rebuilt records it, where the
  /// WAL cannot give it: a host whose WAL could not be written ended the run
  /// failed with that error, and only run.json kept it. run.json keeps saying
  /// so (below an error of the rebuild's own files).
  void keep_error(std::string why);

  /// The first error met (Errc::io_error for the filesystem, invalid_argument
  /// for a config or summary that was not a JSON object); ok if none.
  [[nodiscard]] const Error& error() const noexcept;
  [[nodiscard]] const std::string& dir() const noexcept;
  [[nodiscard]] std::uint64_t rows() const noexcept;
  [[nodiscard]] std::uint64_t rejected_values() const noexcept;

  /// How far each file that the WAL backs is written (bytes in it, not what
  /// is still buffered); 0 where it is not open.
  struct LineEnds {
    std::uint64_t history = 0, histograms = 0, media = 0, events = 0;
  };
  [[nodiscard]] LineEnds written() const noexcept;

private:
  struct State;
  std::unique_ptr<State> s_;
};

} // namespace chorus::store
