// History and system values → MLflow log-batch requests: a sliding window of
// them in flight, each on a connection of its own, each answer's connection
// given the next batch at once, the window sized from the server's answers
// (io/upload/request_window.hpp); every value once (the spans and slots of
// io/upload/mlflow_spans.hpp), a refused value found by halving its batch.
#pragma once

#include "io/upload/backends.hpp"
#include "io/upload/mlflow_spans.hpp"
#include "io/upload/request_window.hpp"

#include <simdjson.h>

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::upload {

/// MLflow log-batch requests in flight at once when an upload starts (and
/// artifact PUTs at once): MLflow's default gunicorn has 4 workers. From
/// there the window is sized from the server's answers (request_window.hpp),
/// up to mlflow_max_window.
inline constexpr std::size_t mlflow_window = 4;
inline constexpr std::size_t mlflow_max_window = 8;
/// The run's tags chorus.upload.batch.<n> (io/upload/mlflow_spans.hpp): one
/// per log-batch in flight or answered beyond the acknowledged offsets. More
/// than the window, so that a slow batch does not stop the ones after it
/// from being sent until as many are answered beyond it.
inline constexpr std::size_t mlflow_slots = 2 * mlflow_max_window;
/// A call sends no new log-batch after this long (those in flight are
/// answered first), so that the Uploader saves its offsets and sees the
/// rest of the run between calls. Each such drain leaves workers idle while
/// the last batches are answered, so it is not much shorter than the live
/// Uploader's 3 s slice (actors/uploader.cpp).
inline constexpr std::chrono::milliseconds mlflow_send_budget{3'000};
inline constexpr std::size_t mlflow_max_metrics = 999; // + a slot tag = MLflow's 1000 entries a log-batch
inline constexpr std::chrono::milliseconds mlflow_request_cap{30'000};

/// What the log-batch sender borrows from the MLflow backend.
class MlflowApi {
public:
  virtual ~MlflowApi() = default;
  /// A request to `path` under the tracking API, with the credentials; not sent.
  [[nodiscard]] virtual HttpRequest request(const std::string& method, const std::string& path, std::string body) const = 0;
  /// The key as the server takes it: mapped where MLflow would refuse it.
  virtual const std::string& map_key(std::string_view key) = 0;
  /// Keeps the key mapping in upload/<target>.keys.json, if it grew.
  virtual void save_keys() = 0;
};

/// An answer from MLflow that was not 2xx, as the backend reports it.
[[nodiscard]] Sent mlflow_failed(const HttpResponse& r, const std::string& what);

class MlflowPoints {
public:
  MlflowPoints(MlflowApi& api, HttpClient& http, std::string target_id)
      : api_(api), http_(http), target_id_(std::move(target_id)) {}

  /// Taking up a remote run again (`run` is its runs/get answer): moves
  /// `st` over the prefix the run's tags say the server holds, counting
  /// those values as delivered; the spans beyond are settled by the first send.
  void take_up(simdjson::dom::element run, const std::string& run_dir, UploadState& st);

  /// Sends the Batch's points as log-batches, a sliding window of them in
  /// flight, each on its own connection: each answer's slot is refilled at
  /// once. Moves each file's offsets over the contiguous prefix of what the
  /// server acknowledged (or refused, value by value).
  Sent send(const Batch& b, UploadState& st);

  /// Log-batches in flight at once now.
  [[nodiscard]] std::size_t window() const noexcept { return window_.size(); }

private:
  struct Point;
  struct Planned;
  using Points = std::shared_ptr<const std::vector<Point>>;
  /// Where gather() goes on in a Batch: per file (history, system), a line and values of it already taken.
  struct GatherAt {
    std::size_t line[2] = {0, 0};
    std::uint64_t part[2] = {0, 0};
  };

  bool gather(const Batch& b, GatherAt& at, std::size_t limit, std::vector<Point>& points,
              std::vector<std::string>& bad);
  static Place after_point(const Batch& b, const Point& p);
  std::uint64_t count_values(std::string_view line, bool history);
  std::uint64_t values_between(const std::string& path, bool history, store::Cursor from, std::uint64_t from_part, store::Cursor to,
                               std::uint64_t to_part);
  void read_span_tags(simdjson::dom::element doc, std::vector<Span>& spans, std::optional<Prefix>& prefix);
  Sent reconcile(const Batch& b, UploadState& st);
  bool plan(const Batch& b, const Points& points, std::size_t lo, std::size_t hi, bool history, Place& at,
            std::deque<Planned>& out);
  std::optional<std::size_t> free_slot(const Prefix& acked) const;
  HttpRequest log_batch(const std::vector<Point>& points, std::size_t lo, std::size_t hi, std::size_t slot,
                        const Span& span, const Prefix& acked, const UploadState& st);
  std::optional<Sent> find_refused(const Batch& b, const Planned& p, const HttpResponse& refusal,
                                   const Prefix& acked, const UploadState& st, Sent& s, Place& at);

  MlflowApi& api_;
  HttpClient& http_;
  std::string target_id_;
  simdjson::dom::parser parser_;
  bool uncertain_ = false; // a log-batch's fate is unknown: read the tags back first
  std::array<std::optional<Span>, mlflow_slots> slots_; // the span each slot's tag names, as far as known
  std::vector<Span> ahead_; // spans the server holds beyond a gap in a file's offsets
  RequestWindow window_{mlflow_window, mlflow_max_window};
};

} // namespace chorus::upload
