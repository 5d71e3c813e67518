// The TensorBoard backend (CHORUS_UPLOAD=tensorboard:DIR, `chorus sync RUN
// --to tensorboard:DIR`): a live run's history, histograms, images, texts,
// tables, system metrics, config and summary as event files in
// DIR/RUN-ID/, laid out as `chorus export --tensorboard` lays them
// (io/upload/tensorboard_run.hpp), so that `tensorboard --logdir DIR`
// follows a running job.
//
//   open    reads how far the event files already in DIR/RUN-ID go (an
//           earlier upload's, killed or not);
//   send    writes the batch's rows, histograms (HistogramUse::apart: as
//           they come, each at its step), media (as they come, each file
//           read from the run directory, up to about media_bytes a call),
//           config and, with the end, summary, and syncs the files before
//           it answers: the Uploader advances its offsets (histograms.jsonl's
//           and media.jsonl's among them) only over what is on disk.
//
// Exactly once: the offsets say where the run's files were read up to, and
// what the event files hold says what was written; a row, a histogram or a
// media sent again (the process killed between the write and the offsets'
// save) finds its steps written already and is left out (tensorboard_run.hpp).
// A write that fails drops what this process holds of the files, and the
// next call reads them again: what a failed write did not put there is
// written again, and nothing twice.
// Artifacts have no place in TensorBoard: they are passed over, and stay in
// the run directory.
#include "io/upload/backends.hpp"
#include "io/upload/media_lines.hpp"
#include "io/upload/tensorboard_run.hpp"

#include <simdjson.h>

#include <filesystem>

namespace chorus::upload {
namespace {

class TensorBoardBackend final : public Backend {
public:
  explicit TensorBoardBackend(const UploadTarget& target) : target_(target) {}

  Sent open(const RunSnapshot& run, UploadState& st) override {
    st.remote_run = run_id(run);
    Sent s;
    if (Error e = reopen(run)) return failed(e, s);
    start_wall_ = static_cast<double>(run.start_ms) / 1000.0;
    return s;
  }

  Sent send(const RunSnapshot& run, const Batch& b, UploadState&) override {
    Sent s;
    if (!tb_)
      if (Error e = reopen(run)) return failed(e, s);
    const std::uint64_t before = tb_->scalars() + tb_->histograms() + tb_->media_files();
    // A line that is no JSON object (damaged in the run's file), a history
    // line that is no row, or a histogram or media line that its reader
    // refuses, is passed over, as `chorus show` and `chorus export` pass it over.
    simdjson::dom::object row;
    for (const std::string_view line : b.history)
      if (!parser_.parse(line.data(), line.size()).get(row)) tb_->history_row(row, nullptr);
    for (const std::string_view line : b.system)
      if (!parser_.parse(line.data(), line.size()).get(row)) tb_->system_row(row, nullptr);
    simdjson::dom::element line;
    for (const std::string_view text : b.histograms) {
      if (parser_.parse(text.data(), text.size()).get(line)) continue;
      if (const Result<store::HistogramLine> h = store::read_histogram_line(line)) tb_->histogram(*h, nullptr);
    }
    // Media files are read whole: a call takes the lines of about
    // media_bytes of them (one at least), and the next call the rest. A
    // line that cannot be read, or whose file is left out, is listed in
    // upload/<id>.refused.jsonl.
    std::uint64_t media_read = 0;
    for (; s.media < b.media.size() && (s.media == 0 || media_read < media_bytes); ++s.media) {
      const std::optional<store::MediaLine> m = read_media(parser_, b, s.media, s.refused);
      if (!m) continue;
      media_read += m->size;
      if (Error e = tb_->media(*m, run.dir, nullptr)) s.refused.push_back(refused_media(*m, e.message()));
    }
    if (b.config != nullptr) {
      simdjson::dom::object object;
      if (!parser_.parse(*b.config).get(object)) tb_->config(object, start_wall_); // damaged: left out
    }
    if (b.final && b.summary != nullptr)
      text("summary", *b.summary, run.end_ms > 0 ? static_cast<double>(run.end_ms) / 1000.0 : start_wall_);
    if (Error e = tb_->sync()) return failed(e, s);
    s.history = b.history.size();
    s.system = b.system.size();
    s.histograms = b.histograms.size();
    s.artifacts = b.artifacts.size();
    s.config = b.config != nullptr;
    s.summary = b.final && b.summary != nullptr;
    s.final = b.final;
    s.points = tb_->scalars() + tb_->histograms() + tb_->media_files() - before;
    if (!s.refused.empty())
      s.message = "TensorBoard: media.jsonl lines were left out; they are listed in upload/" + target_.id +
                  ".refused.jsonl";
    return s;
  }

  /// The summary goes with the end state, as one text.
  [[nodiscard]] bool live_summary() const noexcept override { return false; }
  /// histograms.jsonl's lines as they come: each is an event of its own.
  [[nodiscard]] HistogramUse histograms() const noexcept override { return HistogramUse::apart; }
  /// media.jsonl's lines too, apart from the rows.
  [[nodiscard]] bool media() const noexcept override { return true; }

private:
  /// About this many bytes of media files are read and written a call.
  static constexpr std::uint64_t media_bytes = std::uint64_t{32} << 20;

  static std::string run_id(const RunSnapshot& run) {
    return run.id.empty() ? std::filesystem::path(run.dir).filename().string() : run.id;
  }

  /// A TensorBoardRun of DIR/RUN-ID that knows what its files hold.
  Error reopen(const RunSnapshot& run) {
    tb_ = std::make_unique<TensorBoardRun>(target_.dir + "/" + run_id(run));
    tb_->world_size(run.world_size);
    if (Error e = tb_->resume()) {
      tb_.reset();
      return e;
    }
    return {};
  }

  void text(std::string_view tag, const std::string& json, double wall) {
    simdjson::dom::object object;
    if (parser_.parse(json).get(object)) return; // config.json or summary.json damaged: left out
    tb_->text(tag, markdown_table(object), wall);
  }

  /// A write that failed (a full disk, a directory that cannot be made):
  /// nothing counts as delivered, and the Uploader tries again later. What
  /// the writers still hold is written if it can be, and the next call
  /// reads what the files hold (reopen): a failed write may have dropped
  /// events that this process counted as written.
  Sent failed(const Error& e, Sent& s) {
    tb_.reset();
    s = Sent{};
    s.delivery = Delivery::retry;
    s.message = "TensorBoard: " + e.message();
    return s;
  }

  const UploadTarget& target_;
  std::unique_ptr<TensorBoardRun> tb_;
  simdjson::dom::parser parser_;
  double start_wall_ = 0;
};

Result<std::unique_ptr<Backend>> make_tensorboard_backend(const BackendContext& context) {
  return std::unique_ptr<Backend>(std::make_unique<TensorBoardBackend>(context.target));
}

} // namespace
} // namespace chorus::upload

namespace chorus::upload::backends {

BackendSpec tensorboard() {
  return {.connections = 0, .path = {}, .path_variable = {}, .make = make_tensorboard_backend};
}

} // namespace chorus::upload::backends
