// The W&B double: GraphQL's upsertBucket and createRunFiles, the
// file_stream endpoint, and the storage its upload URLs point at, with
// Basic credentials, a body limit and an optional rate limit, over runs held
// in memory (what it answers: tracking_server.hpp). Not thread-safe:
// TrackingServer serializes the calls.
#pragma once

#include "tests/upload/server/http.hpp"
#include "tests/upload/server/json.hpp"
#include "tests/upload/tracking_server.hpp"

#include <chrono>
#include <cstddef>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace chorus::test::server {

class WandbDouble {
public:
  /// As TrackingServer::Options' wandb_api_key, wandb_entity and wandb_max_body.
  WandbDouble(std::string api_key, std::string default_entity, std::size_t max_body);

  /// /graphql; upload URLs point under `base_url`.
  Answer graphql(const Request& req, Parsers& p, const std::string& base_url);
  /// /wandb-storage/<rest>: <entity>/<project>/<run>/<file name>?sig=..., a signed upload URL.
  Answer storage(const Request& req, std::string_view rest);
  /// /files/<entity>/<project>/<run>/file_stream.
  Answer file_stream(const Request& req, Parsers& p);

  /// File_stream requests a run may make in a second; 0: no limit.
  void set_rate_limit(unsigned requests_per_second) { rate_limit_ = requests_per_second; }
  /// The run's file_stream answers say "stopped": true from now on; false if there is no such run.
  bool stop(const std::string& entity, const std::string& project, const std::string& name);

  [[nodiscard]] std::vector<WandbRun> runs() const;
  /// Null for an unknown run.
  [[nodiscard]] const WandbRun* run(const std::string& entity, const std::string& project,
                                    const std::string& name) const;

private:
  using Clock = std::chrono::steady_clock;
  struct Run {
    WandbRun run;
    std::deque<Clock::time_point> recent; // accepted file_stream requests in the last second
    std::map<std::string, std::string> signatures; // file name -> the sig of its upload URL
  };
  using Key = std::tuple<std::string, std::string, std::string>; // entity, project, name

  [[nodiscard]] bool authorized(const Request& req) const;
  Run* find(const std::string& entity, const std::string& project, const std::string& name);
  std::string new_name();
  Answer upsert(simdjson::dom::object vars, Parsers& p);
  Answer create_run_files(simdjson::dom::object vars, const std::string& base_url);

  const std::string api_key_;
  const std::string default_entity_;
  const std::size_t max_body_;
  unsigned rate_limit_ = 0;
  std::map<Key, Run> runs_;
  std::mt19937_64 rng_{std::random_device{}()};
};

} // namespace chorus::test::server
