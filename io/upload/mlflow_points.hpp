// History and system values → MLflow log-batch requests: several in flight
// at once, each on a connection of its own, every value once (the spans and
// slots of io/upload/mlflow_spans.hpp), a refused value found by halving its batch.
#pragma once

#include "io/upload/backends.hpp"
#include "io/upload/mlflow_spans.hpp"

#include <simdjson.h>

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::io::detail {

/// MLflow log-batch requests in flight at once, each on a connection of its
/// own: enough to keep a server's workers busy (MLflow's default gunicorn
/// has 4), few enough to leave it room for other clients.
inline constexpr std::size_t mlflow_window = 4;
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

  /// Sends a window of log-batches at once, each on its own connection, and
  /// moves each file's offsets over the contiguous prefix of what the server
  /// acknowledged (or refused, value by value).
  Sent send(const Batch& b, UploadState& st);

private:
  struct Point;
  struct Planned;

  void gather(const Batch& b, const UploadState& st, std::size_t limit, std::vector<Point>& points,
              std::vector<std::string>& bad);
  static Place after_point(const Batch& b, const Point& p);
  std::uint64_t count_values(std::string_view line, bool history);
  std::uint64_t values_between(const std::string& path, bool history, Cursor from, std::uint64_t from_part, Cursor to,
                               std::uint64_t to_part);
  void read_span_tags(simdjson::dom::element doc, std::vector<Span>& spans, std::optional<Prefix>& prefix);
  Sent reconcile(const Batch& b, UploadState& st);
  void plan(const Batch& b, const std::vector<Point>& points, std::size_t lo, std::size_t hi, bool history, Place at,
            std::array<bool, mlflow_window>& busy, std::vector<Planned>& out);
  HttpRequest log_batch(const std::vector<Point>& points, std::size_t lo, std::size_t hi, std::size_t slot,
                        const Span& span, const UploadState& st);
  std::optional<Sent> find_refused(const Batch& b, const std::vector<Point>& points, const Planned& p,
                                   const HttpResponse& refusal, const UploadState& st, Sent& s, Place& at);

  MlflowApi& api_;
  HttpClient& http_;
  std::string target_id_;
  simdjson::dom::parser parser_;
  bool uncertain_ = false; // a log-batch's fate is unknown: read the tags back first
  std::array<std::optional<Span>, mlflow_window> slots_; // the span each slot's tag names, as far as known
  std::vector<Span> ahead_; // spans the server holds beyond a gap in a file's offsets
};

} // namespace chorus::io::detail
