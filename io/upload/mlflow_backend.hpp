// The MLflow backend's class, whose parts are defined by concern:
//   io/upload/mlflow.cpp                  requests, credentials, send(), the registration
//   io/upload/mlflow_runs.cpp      the experiment and the run: made, found, taken up, ended
//   io/upload/mlflow_keys.cpp      keys MLflow would refuse, mapped (upload/<id>.keys.json)
//   io/upload/mlflow_params.cpp    config.json → params, summary.json → tags
//   io/upload/mlflow_artifacts.cpp artifacts and histograms → the server's artifact store, histograms' quantiles → log-batch
//   io/upload/mlflow_media.cpp     images, text and tables → the artifact store as MLflow's own client lays them out
//   io/upload/mlflow_points.cpp           history and system values → log-batch
#pragma once

#include "io/upload/mlflow_points.hpp"

#include <map>
#include <unordered_map>

namespace chorus::upload {

inline constexpr std::size_t mlflow_max_params = 100, mlflow_max_tags = 100;
inline constexpr std::size_t mlflow_max_key = 250, mlflow_max_param_value = 6000, mlflow_max_tag_value = 5000;
/// What one artifact PUT of a file may take: a checkpoint or a 64 MiB image.
inline constexpr std::chrono::milliseconds mlflow_file_cap{600'000};

/// "<lines>.<bytes>": how far a file is delivered, as a run tag keeps it.
[[nodiscard]] std::string encode_cursor(const store::Cursor& c);
/// The value of the run's tag `tag` (`run` a runs/get answer), if it has one.
[[nodiscard]] std::optional<std::string_view> run_tag(simdjson::dom::element run, std::string_view tag);
/// The cursor the run's tag `tag` holds, if it holds one.
[[nodiscard]] std::optional<store::Cursor> cursor_tag(simdjson::dom::element run, std::string_view tag);
/// How many of a Batch's lines (from `from`, each ending at `after[i]`) the
/// run's cursor tag `tag` says the server holds: 0 unless it names one's end.
[[nodiscard]] std::size_t lines_stored(simdjson::dom::element run, std::string_view tag, store::Cursor from,
                                       std::span<const store::Cursor> after);

/// The key as MLflow takes it: unchanged if valid, else cleaned and suffixed
/// with a hash of the original (so two keys never meet).
[[nodiscard]] std::string mlflow_clean_key(std::string_view key);

class MlflowBackend final : public Backend, MlflowApi {
public:
  MlflowBackend(const UploadTarget& target, HttpClient& http);

  [[nodiscard]] bool live_summary() const noexcept override { return false; }
  [[nodiscard]] HistogramUse histograms() const noexcept override { return HistogramUse::apart; }
  [[nodiscard]] bool media() const noexcept override { return true; }
  Sent open(const RunSnapshot& run, UploadState& st) override;
  Sent send(const RunSnapshot& run, const Batch& b, UploadState& st) override;

private:
  using Pairs = std::vector<std::pair<std::string, std::string>>;

  // Requests (io/upload/mlflow.cpp).
  HttpResponse call(const std::string& method, const std::string& path, std::string body);
  HttpRequest request(const std::string& method, const std::string& path, std::string body) const override;
  void add_credentials(HttpRequest& req) const;
  static Sent failed(const HttpResponse& r, const std::string& what) { return mlflow_failed(r, what); }
  static Sent refused(std::string why);

  // The run (io/upload/mlflow_runs.cpp).
  Sent find_experiment(const std::string& name, std::string& id);
  Sent create_run(const RunSnapshot& run, const std::string& experiment, UploadState& st);
  Sent find_run(const RunSnapshot& run, const std::string& experiment, std::string& found);
  Sent reopen(const RunSnapshot& run, UploadState& st);
  Sent send_end(const RunSnapshot& run, const UploadState& st);

  // Keys (io/upload/mlflow_keys.cpp).
  const std::string& map_key(std::string_view key) override;
  void load_keys();
  void save_keys() override;

  // Params and tags (io/upload/mlflow_params.cpp).
  Sent send_config(const std::string& config, UploadState& st);
  Sent send_summary(const std::string& summary, UploadState& st);
  /// log-batch requests of at most 100 params (none without `params`) and 100 tags each.
  Sent log_params_and_tags(const UploadState& st, const Pairs* params, const Pairs& tags, const std::string& what);

  // Artifacts and histograms (io/upload/mlflow_artifacts.cpp).
  Sent send_artifact(const RunSnapshot& run, const ArtifactEntry& a, UploadState& st);
  /// The URL that stores `name` (a path under the run's artifact root).
  [[nodiscard]] std::string artifact_url(const UploadState& st, std::string_view name) const;
  /// A PUT of `name`, with the credentials, its body or file still to set.
  [[nodiscard]] HttpRequest artifact_put(const UploadState& st, const std::string& name) const;
  /// What an artifact PUT's answer means: ok, or the failure to report.
  static Sent stored_artifact(const HttpResponse& r, const std::string& name);
  /// PUTs `puts` (of the artifacts `names`) mlflow_window at a time, each
  /// within `cap`: ok, or the first failure.
  Sent put_artifacts(std::vector<HttpRequest>& puts, const std::vector<std::string>& names,
                     std::chrono::milliseconds cap);
  /// The run as the server holds it now (runs/get), parsed into `run`.
  Sent read_run(const UploadState& st, simdjson::dom::element& run);
  /// A few histograms.jsonl lines: each one's artifact, then their quantiles in one log-batch.
  Sent send_histograms(const Batch& b, UploadState& st);
  /// Moves `st` over the histograms the run's tags (a runs/get answer) say the server holds.
  void take_up_histograms(simdjson::dom::element run, UploadState& st);

  // Images, text and tables (io/upload/mlflow_media.cpp).
  /// A few media.jsonl lines: each one's artifacts, then one log-batch of
  /// the tags that record them (chorus.upload.media among them).
  Sent send_media(const RunSnapshot& run, const Batch& b, UploadState& st);
  /// Moves `st` over the media the run's tags (a runs/get answer) say the
  /// server holds, and takes its mlflow.loggedArtifacts.
  void take_up_media(simdjson::dom::element run, UploadState& st);
  void read_logged_artifacts(simdjson::dom::element run);

  UploadTarget target_;
  HttpClient& http_;
  std::string auth_header_, user_, password_;
  simdjson::dom::parser parser_;
  std::string artifact_uri_;
  std::string keys_file_;
  std::map<std::string, std::string, std::less<>> keys_;
  Pairs mapped_;
  bool keys_dirty_ = false;
  MlflowPoints points_{*this, http_, target_.id};
  std::unordered_map<std::string, std::string> params_sent_;
  bool histograms_uncertain_ = false; // a histograms log-batch's fate is unknown: read the tags back first
  store::Cursor one_by_one_until_;          // histograms go one a call up to here (a log-batch of them was refused)
  bool media_uncertain_ = false;     // a media log-batch's fate is unknown: read the tags back first
  /// mlflow.loggedArtifacts as the server holds it: (path, type) entries.
  std::vector<std::pair<std::string, std::string>> logged_artifacts_;
  int turn_ = 0; // with several waiting, values (0), histograms (1) and media (2) take turns
};

} // namespace chorus::upload
