#define BOOST_TEST_MODULE upload_tracking_server
#include <boost/test/unit_test.hpp>

#include "tests/temp_dir.hpp"
#include "tests/upload/tracking_server.hpp"

#include <curl/curl.h>
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <latch>
#include <limits>
#include <map>
#include <stdexcept>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

using chorus::test::TempDir;
using namespace chorus::test;
using namespace std::chrono_literals;

namespace {

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
  ~CurlGlobal() { curl_global_cleanup(); }
};

// ------------------------------------------------------------ a plain libcurl client

struct Call {
  std::string method = "GET";
  std::string url;
  std::string body;
  std::vector<std::string> headers;
  std::string userpwd;     // "user:password" for HTTP Basic
  std::string cainfo;      // the CA to trust for https
  bool chunked = false;    // send the body with Transfer-Encoding: chunked
  long timeout_ms = 20'000;
  long expect_timeout_ms = 0; // CURLOPT_EXPECT_100_TIMEOUT_MS when set
};

struct Reply {
  CURLcode code = CURLE_OK;
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers; // names lower-cased
};

std::ostream& operator<<(std::ostream& os, const Reply& r) {
  return os << "curl " << r.code << " (" << curl_easy_strerror(r.code) << "), HTTP " << r.status << ": "
            << r.body.substr(0, 300);
}

// One easy handle for all its requests, so that connections are kept alive.
class Client {
public:
  // No Boost.Test check here: clients are made on threads of their own, and Boost.Test is not thread-safe.
  Client() : h_(curl_easy_init()) {
    if (h_ == nullptr) throw std::runtime_error("curl_easy_init failed");
  }
  ~Client() { curl_easy_cleanup(h_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  Reply perform(const Call& c) {
    Reply r;
    Upload up{c.body};
    curl_easy_reset(h_);
    curl_easy_setopt(h_, CURLOPT_URL, c.url.c_str());
    curl_easy_setopt(h_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h_, CURLOPT_TIMEOUT_MS, c.timeout_ms);
    curl_easy_setopt(h_, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(h_, CURLOPT_WRITEFUNCTION, &Client::on_body);
    curl_easy_setopt(h_, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(h_, CURLOPT_HEADERFUNCTION, &Client::on_header);
    curl_easy_setopt(h_, CURLOPT_HEADERDATA, &r.headers);
    if (c.expect_timeout_ms > 0) curl_easy_setopt(h_, CURLOPT_EXPECT_100_TIMEOUT_MS, c.expect_timeout_ms);
    curl_slist* headers = nullptr;
    for (const auto& h : c.headers) headers = curl_slist_append(headers, h.c_str());
    if (c.method == "POST") {
      curl_easy_setopt(h_, CURLOPT_POST, 1L);
      if (c.chunked) {
        curl_easy_setopt(h_, CURLOPT_READFUNCTION, &Client::on_read);
        curl_easy_setopt(h_, CURLOPT_READDATA, &up);
        headers = curl_slist_append(headers, "Transfer-Encoding: chunked");
      } else {
        curl_easy_setopt(h_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(c.body.size()));
        curl_easy_setopt(h_, CURLOPT_POSTFIELDS, c.body.data());
      }
    } else if (c.method == "PUT") {
      curl_easy_setopt(h_, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h_, CURLOPT_READFUNCTION, &Client::on_read);
      curl_easy_setopt(h_, CURLOPT_READDATA, &up);
      if (!c.chunked) curl_easy_setopt(h_, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(c.body.size()));
    } else if (c.method != "GET") {
      curl_easy_setopt(h_, CURLOPT_CUSTOMREQUEST, c.method.c_str());
    }
    curl_easy_setopt(h_, CURLOPT_HTTPHEADER, headers);
    if (!c.userpwd.empty()) {
      curl_easy_setopt(h_, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(h_, CURLOPT_USERPWD, c.userpwd.c_str());
    }
    if (!c.cainfo.empty()) {
      curl_easy_setopt(h_, CURLOPT_CAINFO, c.cainfo.c_str());
      curl_easy_setopt(h_, CURLOPT_SSL_VERIFYPEER, 1L);
      curl_easy_setopt(h_, CURLOPT_SSL_VERIFYHOST, 2L);
    }
    r.code = curl_easy_perform(h_);
    curl_easy_getinfo(h_, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(headers);
    return r;
  }

private:
  struct Upload {
    std::string_view left;
  };
  static size_t on_body(char* p, size_t size, size_t n, void* out) {
    static_cast<std::string*>(out)->append(p, size * n);
    return size * n;
  }
  static size_t on_header(char* p, size_t size, size_t n, void* out) {
    const std::string line(p, size * n);
    const auto colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      std::string value = line.substr(colon + 1);
      while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.pop_back();
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      (*static_cast<std::map<std::string, std::string>*>(out))[name] = value;
    }
    return size * n;
  }
  // Hands the body over in small pieces, so that chunked bodies have several chunks.
  static size_t on_read(char* p, size_t size, size_t n, void* in) {
    auto* up = static_cast<Upload*>(in);
    const size_t k = std::min({size * n, up->left.size(), size_t{7000}});
    std::memcpy(p, up->left.data(), k);
    up->left.remove_prefix(k);
    return k;
  }

  CURL* h_;
};

// ------------------------------------------------------------ JSON answers

struct Doc {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  explicit Doc(const std::string& json) {
    const auto err = parser.parse(json).get(root);
    BOOST_TEST_REQUIRE(!err, "invalid JSON (" << simdjson::error_message(err) << "): " << json);
  }
  [[nodiscard]] simdjson::dom::element at(std::string_view pointer) const {
    simdjson::dom::element e;
    const auto err = root.at_pointer(pointer).get(e);
    BOOST_TEST_REQUIRE(!err, "no " << pointer << " in " << simdjson::minify(root));
    return e;
  }
  [[nodiscard]] bool has(std::string_view pointer) const {
    simdjson::dom::element e;
    return root.at_pointer(pointer).get(e) == simdjson::SUCCESS;
  }
  [[nodiscard]] std::string str(std::string_view pointer) const {
    std::string_view s;
    BOOST_TEST_REQUIRE(!at(pointer).get_string().get(s), pointer << " is not a string");
    return std::string(s);
  }
  [[nodiscard]] std::int64_t integer(std::string_view pointer) const {
    std::int64_t v = 0;
    BOOST_TEST_REQUIRE(!at(pointer).get_int64().get(v), pointer << " is not an integer");
    return v;
  }
};

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

// [{"key": "<prefix>0", "value": 0.5, "timestamp": 1000, "step": 0}, ...]
std::string metrics_json(int n, const std::string& prefix) {
  std::string out = "[";
  for (int i = 0; i < n; ++i)
    out += (i ? ", " : "") + std::string(R"({"key": )") + quote(prefix + std::to_string(i)) +
           R"(, "value": 0.5, "timestamp": 1000, "step": )" + std::to_string(i) + "}";
  return out + "]";
}

std::string pairs_json(int n, const std::string& prefix, const std::string& value = "v") {
  std::string out = "[";
  for (int i = 0; i < n; ++i)
    out += (i ? ", " : "") + std::string(R"({"key": )") + quote(prefix + std::to_string(i)) + R"(, "value": )" +
           quote(value) + "}";
  return out + "]";
}

// ------------------------------------------------------------ MLflow fixture

struct Mlflow {
  TrackingServer server;
  Client client;
  std::string run_id;

  explicit Mlflow(TrackingServer::Options options = {}) : server(std::move(options)) {
    const Reply r = post("runs/create", R"({"experiment_id": "0", "run_name": "base", "start_time": 1700000000000})");
    BOOST_TEST_REQUIRE(r.status == 200, r);
    run_id = Doc(r.body).str("/run/info/run_id");
  }

  std::string url(std::string_view call) const { return server.base_url() + "/api/2.0/mlflow/" + std::string(call); }
  Reply post(std::string_view call, const std::string& body) {
    return client.perform({.method = "POST", .url = url(call), .body = body, .headers = {"Content-Type: application/json"}});
  }
  Reply get(std::string_view call_and_query) { return client.perform({.url = url(call_and_query)}); }
  Reply batch(const std::string& metrics, const std::string& params = "[]", const std::string& tags = "[]") {
    return post("runs/log-batch", R"({"run_id": ")" + run_id + R"(", "metrics": )" + metrics + R"(, "params": )" +
                                      params + R"(, "tags": )" + tags + "}");
  }
};

void require_refused(const Reply& r, long status, const std::string& code) {
  BOOST_TEST(r.status == status, r);
  if (r.status == status) BOOST_TEST(Doc(r.body).str("/error_code") == code, r);
}

// ------------------------------------------------------------ W&B

const std::string upsert_query =
    "mutation UpsertBucket($id: String, $name: String, $project: String, $entity: String, $groupName: String, "
    "$displayName: String, $notes: String, $config: JSONString, $jobType: String, $state: String, $host: String, "
    "$tags: [String!], $summaryMetrics: JSONString) { upsertBucket(input: {id: $id, name: $name, modelName: "
    "$project, entityName: $entity, groupName: $groupName, displayName: $displayName, notes: $notes, config: "
    "$config, jobType: $jobType, state: $state, host: $host, tags: $tags, summaryMetrics: $summaryMetrics}) { "
    "bucket { id name displayName project { name entity { name } } historyLineCount } inserted } }";

struct Wandb {
  TrackingServer server;
  Client client;
  std::string auth = "api:chorus-test-key";

  explicit Wandb(TrackingServer::Options options = {}) : server(std::move(options)) {}

  Reply graphql(const std::string& variables, const std::string& query = upsert_query) {
    return client.perform({.method = "POST",
                           .url = server.base_url() + "/graphql",
                           .body = R"({"query": )" + quote(query) + R"(, "variables": )" + variables + "}",
                           .headers = {"Content-Type: application/json"},
                           .userpwd = auth});
  }
  Reply stream(const std::string& run_path, const std::string& body) {
    return client.perform({.method = "POST",
                           .url = server.base_url() + "/files/" + run_path + "/file_stream",
                           .body = body,
                           .headers = {"Content-Type: application/json"},
                           .userpwd = auth});
  }
  // Creates chorus-user/proj/<name>.
  void upsert(const std::string& name) {
    const Reply r = graphql(R"({"name": )" + quote(name) + R"(, "project": "proj"})");
    BOOST_TEST_REQUIRE(r.status == 200, r);
    BOOST_TEST_REQUIRE(!Doc(r.body).has("/errors"), r);
  }
  WandbRun run(const std::string& name) {
    const auto r = server.wandb_run("chorus-user", "proj", name);
    BOOST_TEST_REQUIRE(r.has_value(), "no W&B run " << name);
    return *r;
  }
};

// {"files": {"<file>": {"offset": N, "content": [lines...]}}}
std::string file_json(const std::string& file, int offset, const std::vector<std::string>& lines,
                      const std::string& extra = "") {
  std::string content = "[";
  for (std::size_t i = 0; i < lines.size(); ++i) content += (i ? ", " : "") + quote(lines[i]);
  return R"({"files": {)" + quote(file) + R"(: {"offset": )" + std::to_string(offset) + R"(, "content": )" + content +
         "]}}" + extra + "}";
}

} // namespace

BOOST_GLOBAL_FIXTURE(CurlGlobal);

// ================================================================ MLflow

BOOST_AUTO_TEST_CASE(mlflow_experiments) {
  Mlflow m;
  require_refused(m.get("experiments/get-by-name?experiment_name=exp%201"), 404, "RESOURCE_DOES_NOT_EXIST");
  const Reply def = m.get("experiments/get-by-name?experiment_name=Default");
  BOOST_TEST_REQUIRE(def.status == 200, def);
  BOOST_TEST(Doc(def.body).str("/experiment/experiment_id") == "0");

  const Reply created = m.post("experiments/create", R"({"name": "exp 1"})");
  BOOST_TEST_REQUIRE(created.status == 200, created);
  const std::string id = Doc(created.body).str("/experiment_id");
  BOOST_TEST(id == "1");
  const Reply found = m.get("experiments/get-by-name?experiment_name=exp%201");
  BOOST_TEST_REQUIRE(found.status == 200, found);
  const Doc d(found.body);
  BOOST_TEST(d.str("/experiment/experiment_id") == id);
  BOOST_TEST(d.str("/experiment/name") == "exp 1");
  BOOST_TEST(d.str("/experiment/artifact_location") == "mlflow-artifacts:/1");
  BOOST_TEST(d.str("/experiment/lifecycle_stage") == "active");

  require_refused(m.post("experiments/create", R"({"name": "exp 1"})"), 400, "RESOURCE_ALREADY_EXISTS");
  require_refused(m.post("experiments/create", R"({"artifact_location": "x"})"), 400, "INVALID_PARAMETER_VALUE");
  require_refused(m.get("experiments/get-by-name"), 400, "INVALID_PARAMETER_VALUE");
  BOOST_TEST(m.server.experiments().size() == 2u);
}

BOOST_AUTO_TEST_CASE(mlflow_post_needs_json_content_type) {
  Mlflow m;
  // libcurl's default for POSTFIELDS is application/x-www-form-urlencoded.
  const Reply form = m.client.perform({.method = "POST", .url = m.url("experiments/create"), .body = R"({"name": "e"})"});
  require_refused(form, 400, "INVALID_PARAMETER_VALUE");
  BOOST_TEST(form.body.find("Content-Type") != std::string::npos, form);
  const Reply none = m.client.perform(
      {.method = "POST", .url = m.url("experiments/create"), .body = R"({"name": "e"})", .headers = {"Content-Type:"}});
  require_refused(none, 400, "INVALID_PARAMETER_VALUE");
  const Reply charset = m.client.perform({.method = "POST",
                                          .url = m.url("experiments/create"),
                                          .body = R"({"name": "e"})",
                                          .headers = {"Content-Type: application/json; charset=utf-8"}});
  BOOST_TEST(charset.status == 200, charset);
  BOOST_TEST(m.server.experiments().size() == 2u);
}

BOOST_AUTO_TEST_CASE(mlflow_concurrent_experiment_creation_has_one_winner) {
  TrackingServer server;
  constexpr int threads = 8;
  for (int round = 0; round < 5; ++round) {
    const std::string name = "race-" + std::to_string(round);
    std::latch start(threads);
    std::vector<Reply> replies(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        Client c;
        start.arrive_and_wait();
        replies[t] = c.perform({.method = "POST",
                                .url = server.base_url() + "/api/2.0/mlflow/experiments/create",
                                .body = R"({"name": )" + quote(name) + "}",
                                .headers = {"Content-Type: application/json"}});
      });
    for (auto& t : pool) t.join();
    int won = 0;
    for (const Reply& r : replies) {
      if (r.status == 200) {
        ++won;
      } else {
        require_refused(r, 400, "RESOURCE_ALREADY_EXISTS");
      }
    }
    BOOST_TEST(won == 1);
    int named = 0;
    for (const auto& e : server.experiments()) named += e.name == name ? 1 : 0;
    BOOST_TEST(named == 1);
  }
}

BOOST_AUTO_TEST_CASE(mlflow_runs_create_get_update) {
  Mlflow m;
  const Reply exp = m.post("experiments/create", R"({"name": "e"})");
  const std::string exp_id = Doc(exp.body).str("/experiment_id");
  const Reply created = m.post("runs/create", R"({"experiment_id": )" + quote(exp_id) +
                                                  R"(, "run_name": "trial", "start_time": 1700000000123, "tags": [{"key": "team", "value": "ml"}]})");
  BOOST_TEST_REQUIRE(created.status == 200, created);
  const Doc d(created.body);
  const std::string id = d.str("/run/info/run_id");
  BOOST_TEST(id.size() == 32u);
  BOOST_TEST(id.find_first_not_of("0123456789abcdef") == std::string::npos);
  BOOST_TEST(d.str("/run/info/experiment_id") == exp_id);
  BOOST_TEST(d.str("/run/info/status") == "RUNNING");
  BOOST_TEST(d.str("/run/info/run_name") == "trial");
  BOOST_TEST(d.str("/run/info/artifact_uri") == "mlflow-artifacts:/" + exp_id + "/" + id + "/artifacts");
  BOOST_TEST(d.integer("/run/info/start_time") == 1700000000123);

  const Reply got = m.get("runs/get?run_id=" + id);
  BOOST_TEST_REQUIRE(got.status == 200, got);
  const std::string body = got.body;
  BOOST_TEST(body.find(R"({"key": "team", "value": "ml"})") != std::string::npos, body);
  BOOST_TEST(body.find(R"({"key": "mlflow.runName", "value": "trial"})") != std::string::npos, body);

  const Reply updated =
      m.post("runs/update", R"({"run_id": )" + quote(id) + R"(, "status": "FINISHED", "end_time": "1700000009999"})");
  BOOST_TEST_REQUIRE(updated.status == 200, updated);
  BOOST_TEST(Doc(updated.body).str("/run_info/status") == "FINISHED");
  BOOST_TEST(Doc(updated.body).integer("/run_info/end_time") == 1700000009999);
  const auto run = m.server.mlflow_run(id);
  BOOST_TEST_REQUIRE(run.has_value());
  BOOST_TEST(run->status == "FINISHED");
  BOOST_TEST(run->end_time.value_or(0) == 1700000009999);
  BOOST_TEST(run->tags.at("team") == "ml");

  require_refused(m.post("runs/update", R"({"run_id": )" + quote(id) + R"(, "status": "DONE"})"), 400,
                  "INVALID_PARAMETER_VALUE");
  const std::string unknown = "0123456789abcdef0123456789abcdef";
  require_refused(m.get("runs/get?run_id=" + unknown), 404, "RESOURCE_DOES_NOT_EXIST");
  require_refused(m.post("runs/update", R"({"run_id": ")" + unknown + R"(", "status": "FAILED"})"), 404,
                  "RESOURCE_DOES_NOT_EXIST");
  require_refused(m.post("runs/create", R"({"experiment_id": "77"})"), 404, "RESOURCE_DOES_NOT_EXIST");
  m.run_id = unknown;
  require_refused(m.batch(metrics_json(1, "a")), 404, "RESOURCE_DOES_NOT_EXIST");
}

BOOST_AUTO_TEST_CASE(mlflow_runs_search_by_tag) {
  // As MLflow 2.10: POST runs/search {experiment_ids, filter, max_results,
  // page_token} -> {runs: [...], next_page_token?}, newest first; {} for none.
  Mlflow m;
  const std::string exp = Doc(m.post("experiments/create", R"({"name": "e"})").body).str("/experiment_id");
  auto create = [&](std::int64_t start, const std::string& id) {
    const Reply r = m.post("runs/create", R"({"experiment_id": )" + quote(exp) + R"(, "start_time": )" +
                                              std::to_string(start) + R"(, "tags": [{"key": "chorus.run_id", "value": )" +
                                              quote(id) + "}]}");
    BOOST_TEST_REQUIRE(r.status == 200, r);
    return Doc(r.body).str("/run/info/run_id");
  };
  const std::string older = create(1000, "abc");
  const std::string newer = create(2000, "abc");
  create(3000, "other");
  auto search = [&](const std::string& filter, int max_results = 100, const std::string& token = "") {
    std::string body = R"({"experiment_ids": [)" + quote(exp) + R"(], "filter": )" + quote(filter) +
                       R"(, "max_results": )" + std::to_string(max_results);
    if (!token.empty()) body += R"(, "page_token": )" + quote(token);
    return m.post("runs/search", body + "}");
  };
  const Reply both = search(R"(tags."chorus.run_id" = 'abc')");
  BOOST_TEST_REQUIRE(both.status == 200, both);
  BOOST_TEST(Doc(both.body).str("/runs/0/info/run_id") == newer);
  BOOST_TEST(Doc(both.body).str("/runs/1/info/run_id") == older);
  BOOST_TEST(!Doc(both.body).has("/runs/2"));
  BOOST_TEST(!Doc(both.body).has("/next_page_token"));
  BOOST_TEST(Doc(search("tags.`chorus.run_id` = \"abc\"").body).str("/runs/1/info/run_id") == older);
  const Reply page = search(R"(tags."chorus.run_id" = 'abc')", 1);
  BOOST_TEST(Doc(page.body).str("/runs/0/info/run_id") == newer);
  const std::string token = Doc(page.body).str("/next_page_token");
  BOOST_TEST(Doc(search(R"(tags."chorus.run_id" = 'abc')", 1, token).body).str("/runs/0/info/run_id") == older);
  const Reply none = search(R"(tags."chorus.run_id" = 'zzz')");
  BOOST_TEST(none.status == 200, none);
  BOOST_TEST(none.body == "{}", none);
  // Not in the searched experiment: not found.
  const Reply elsewhere = m.post("runs/search", R"({"experiment_ids": ["0"], "filter": "tags.\"chorus.run_id\" = 'abc'"})");
  BOOST_TEST(elsewhere.body == "{}", elsewhere);
  require_refused(search("tags.x ~ 'a'"), 400, "INVALID_PARAMETER_VALUE");
  require_refused(search(R"(tags."chorus.run_id" = 'abc')", 50001), 400, "INVALID_PARAMETER_VALUE");
}

BOOST_AUTO_TEST_CASE(mlflow_log_batch_limits) {
  Mlflow m;
  BOOST_TEST(m.batch(metrics_json(1000, "a")).status == 200);
  BOOST_TEST(m.server.metric_history(m.run_id, "a999").size() == 1u);
  require_refused(m.batch(metrics_json(1001, "b")), 400, "INVALID_PARAMETER_VALUE");
  BOOST_TEST(m.server.metric_history(m.run_id, "b0").empty()); // nothing of a refused batch

  BOOST_TEST(m.batch("[]", pairs_json(100, "p")).status == 200);
  require_refused(m.batch("[]", pairs_json(101, "q")), 400, "INVALID_PARAMETER_VALUE");
  BOOST_TEST(m.batch("[]", "[]", pairs_json(100, "t")).status == 200);
  require_refused(m.batch("[]", "[]", pairs_json(101, "u")), 400, "INVALID_PARAMETER_VALUE");

  BOOST_TEST(m.batch(metrics_json(800, "c"), pairs_json(100, "pc"), pairs_json(100, "tc")).status == 200);
  require_refused(m.batch(metrics_json(801, "d"), pairs_json(100, "pd"), pairs_json(100, "td")), 400,
                  "INVALID_PARAMETER_VALUE");
  require_refused(m.batch(metrics_json(901, "e"), pairs_json(100, "pe")), 400, "INVALID_PARAMETER_VALUE");

  const auto run = m.server.mlflow_run(m.run_id);
  BOOST_TEST_REQUIRE(run.has_value());
  BOOST_TEST(run->params.size() == 200u);
  BOOST_TEST(run->params.count("q0") == 0u);
  BOOST_TEST(run->params.count("pd0") == 0u);
  BOOST_TEST(run->tags.count("u0") == 0u);
  BOOST_TEST(run->metrics.size() == 1800u);
}

BOOST_AUTO_TEST_CASE(mlflow_keys) {
  Mlflow m;
  const std::vector<std::string> good = {"a", "Ab-5_", "a/b/c", "a.b.c", ".a", "b.", "a..a/._./o_O/.e.", "a b/c d",
                                         std::string(250, 'k')};
  const std::vector<std::string> bad = {"",   "a/../b", "a//b", "/abs", "a/",  "./a", "..a", "a/.", "..",
                                        "a:b", "a\\tb",  "a*",   "x\"y", std::string(251, 'k')};
  for (const auto& k : good) {
    const std::string metric = R"([{"key": )" + quote(k) + R"(, "value": 1, "timestamp": 5}])";
    BOOST_TEST(m.batch(metric).status == 200, "good key '" << k << "'");
  }
  for (const auto& k : bad) {
    const std::string metric = R"([{"key": )" + quote(k) + R"(, "value": 1, "timestamp": 5}])";
    const Reply r = m.batch(metric);
    BOOST_TEST(r.status == 400, "bad key '" << k << "': " << r);
    const Reply p = m.batch("[]", R"([{"key": )" + quote(k) + R"(, "value": "v"}])");
    BOOST_TEST(p.status == 400, "bad param key '" << k << "': " << p);
  }
  BOOST_TEST(m.server.mlflow_run(m.run_id)->metrics.size() == good.size());
}

BOOST_AUTO_TEST_CASE(mlflow_metric_fields) {
  Mlflow m;
  // timestamp and step may be strings holding integers; step defaults to 0.
  BOOST_TEST(m.batch(R"([{"key": "s", "value": 1, "timestamp": "1700000000000", "step": "7"},
                         {"key": "s", "value": 2, "timestamp": 1700000000001}])")
                 .status == 200);
  const auto h = m.server.metric_history(m.run_id, "s");
  BOOST_TEST_REQUIRE(h.size() == 2u);
  BOOST_TEST(h[0].timestamp == 1700000000000);
  BOOST_TEST(h[0].step == 7);
  BOOST_TEST(h[1].step == 0);

  for (const std::string metric : {R"({"key": "x", "value": 1})",                         // no timestamp
                                   R"({"key": "x", "value": 1, "timestamp": null})",      // null timestamp
                                   R"({"key": "x", "value": 1, "timestamp": -1})",        // negative
                                   R"({"key": "x", "value": 1, "timestamp": 1.5})",       // not an integer
                                   R"({"key": "x", "value": 1, "timestamp": "soon"})",    // not an integer
                                   R"({"key": "x", "timestamp": 1})",                     // no value
                                   R"({"key": "x", "value": true, "timestamp": 1})",      // not a number
                                   R"({"key": "x", "value": "abc", "timestamp": 1})",     // not a number
                                   R"({"key": "x", "value": 1, "timestamp": 1, "step": "one"})", // bad step
                                   R"({"value": 1, "timestamp": 1})"}) {                  // no key
    require_refused(m.batch("[" + metric + "]"), 400, "INVALID_PARAMETER_VALUE");
  }
  BOOST_TEST(m.server.metric_history(m.run_id, "x").empty());

  // log-metric takes the same fields
  BOOST_TEST(m.post("runs/log-metric", R"({"run_id": ")" + m.run_id + R"(", "key": "single", "value": 3, "timestamp": 9})")
                 .status == 200);
  require_refused(m.post("runs/log-metric", R"({"run_id": ")" + m.run_id + R"(", "key": "single", "value": 3})"), 400,
                  "INVALID_PARAMETER_VALUE");
  BOOST_TEST(m.server.metric_history(m.run_id, "single").size() == 1u);
}

BOOST_AUTO_TEST_CASE(mlflow_nan_and_infinities) {
  Mlflow m;
  BOOST_TEST_REQUIRE(m.batch(R"([{"key": "v", "value": "NaN", "timestamp": 1, "step": 0},
                                 {"key": "v", "value": "Infinity", "timestamp": 1, "step": 1},
                                 {"key": "v", "value": "-Infinity", "timestamp": 1, "step": 2},
                                 {"key": "v", "value": 1.25, "timestamp": 1, "step": 3},
                                 {"key": "v", "value": "2.5", "timestamp": 1, "step": 4}])")
                         .status == 200);
  const auto h = m.server.metric_history(m.run_id, "v");
  BOOST_TEST_REQUIRE(h.size() == 5u);
  const double max = std::numeric_limits<double>::max();
  BOOST_TEST(std::isnan(h[0].value));
  BOOST_TEST(h[1].value == max);
  BOOST_TEST(h[2].value == -max);
  BOOST_TEST(h[3].value == 1.25);
  BOOST_TEST(h[4].value == 2.5);

  const Reply r = m.get("metrics/get-history?run_id=" + m.run_id + "&metric_key=v");
  BOOST_TEST_REQUIRE(r.status == 200, r);
  const Doc d(r.body);
  BOOST_TEST(d.str("/metrics/0/value") == "NaN");
  double v = 0;
  BOOST_TEST_REQUIRE(!d.at("/metrics/1/value").get_double().get(v));
  BOOST_TEST(v == max);
  BOOST_TEST(r.body.find("1.7976931348623157e+308") != std::string::npos, r.body);
  BOOST_TEST_REQUIRE(!d.at("/metrics/2/value").get_double().get(v));
  BOOST_TEST(v == -max);
}

BOOST_AUTO_TEST_CASE(mlflow_params_and_tags) {
  Mlflow m;
  const std::string run = quote(m.run_id);
  BOOST_TEST(m.post("runs/log-parameter", R"({"run_id": )" + run + R"(, "key": "lr", "value": "0.1"})").status == 200);
  BOOST_TEST(m.post("runs/log-parameter", R"({"run_id": )" + run + R"(, "key": "lr", "value": "0.1"})").status == 200);
  const Reply changed = m.post("runs/log-parameter", R"({"run_id": )" + run + R"(, "key": "lr", "value": "0.2"})");
  require_refused(changed, 400, "INVALID_PARAMETER_VALUE");
  BOOST_TEST(changed.body.find("Changing param values is not allowed") != std::string::npos, changed);
  const Reply in_batch = m.batch(metrics_json(1, "m"), R"([{"key": "lr", "value": "0.3"}])");
  require_refused(in_batch, 400, "INVALID_PARAMETER_VALUE");
  BOOST_TEST(m.server.metric_history(m.run_id, "m0").empty()); // the batch's metrics were not applied either
  require_refused(m.batch("[]", R"([{"key": "d", "value": "1"}, {"key": "d", "value": "1"}])"), 400,
                  "INVALID_PARAMETER_VALUE");

  BOOST_TEST(m.batch("[]", R"([{"key": "long", "value": )" + quote(std::string(6000, 'x')) + "}]").status == 200);
  require_refused(m.batch("[]", R"([{"key": "longer", "value": )" + quote(std::string(6001, 'x')) + "}]"), 400,
                  "INVALID_PARAMETER_VALUE");
  BOOST_TEST(m.batch("[]", "[]", R"([{"key": "t", "value": )" + quote(std::string(5000, 'y')) + "}]").status == 200);
  require_refused(m.batch("[]", "[]", R"([{"key": "t2", "value": )" + quote(std::string(5001, 'y')) + "}]"), 400,
                  "INVALID_PARAMETER_VALUE");
  BOOST_TEST(m.post("runs/set-tag", R"({"run_id": )" + run + R"(, "key": "note", "value": "hi \"there\""})").status == 200);
  BOOST_TEST(m.post("runs/set-tag", R"({"run_id": )" + run + R"(, "key": "note", "value": "again"})").status == 200);

  const auto r = m.server.mlflow_run(m.run_id);
  BOOST_TEST_REQUIRE(r.has_value());
  BOOST_TEST(r->params.at("lr") == "0.1");
  BOOST_TEST(r->params.at("long").size() == 6000u);
  BOOST_TEST(r->params.count("longer") == 0u);
  BOOST_TEST(r->tags.at("note") == "again");
  BOOST_TEST(r->tags.count("t2") == 0u);

  // runs/get: params, tags, and each metric's latest point (greatest step, then timestamp)
  BOOST_TEST(m.batch(R"([{"key": "loss", "value": 4, "timestamp": 1, "step": 4},
                         {"key": "loss", "value": 9, "timestamp": 2, "step": 2}])")
                 .status == 200);
  const Reply got = m.get("runs/get?run_id=" + m.run_id);
  BOOST_TEST_REQUIRE(got.status == 200, got);
  BOOST_TEST(got.body.find(R"({"key": "loss", "value": 4, "timestamp": 1, "step": 4})") != std::string::npos, got.body);
  BOOST_TEST(got.body.find(R"({"key": "lr", "value": "0.1"})") != std::string::npos, got.body);
}

BOOST_AUTO_TEST_CASE(mlflow_metric_history_pages) {
  Mlflow m;
  std::string points = "[";
  for (int i = 0; i < 25; ++i)
    points += (i ? ", " : "") + std::string(R"({"key": "h", "value": )") + std::to_string(i) +
              R"(, "timestamp": 100, "step": )" + std::to_string(i) + "}";
  BOOST_TEST_REQUIRE(m.batch(points + "]").status == 200);

  std::vector<std::int64_t> steps;
  std::string token;
  int pages = 0;
  do {
    std::string q = "metrics/get-history?run_id=" + m.run_id + "&metric_key=h&max_results=10";
    if (!token.empty()) q += "&page_token=" + token;
    const Reply r = m.get(q);
    BOOST_TEST_REQUIRE(r.status == 200, r);
    const Doc d(r.body);
    simdjson::dom::array a;
    BOOST_TEST_REQUIRE(!d.at("/metrics").get_array().get(a));
    BOOST_TEST(a.size() <= 10u);
    for (const auto e : a) {
      std::int64_t s = 0;
      BOOST_TEST_REQUIRE(!e.at_key("step").get_int64().get(s));
      steps.push_back(s);
    }
    token = d.has("/next_page_token") ? d.str("/next_page_token") : "";
    ++pages;
  } while (!token.empty() && pages < 10);
  BOOST_TEST(pages == 3);
  BOOST_TEST_REQUIRE(steps.size() == 25u);
  for (int i = 0; i < 25; ++i) BOOST_TEST(steps[i] == i);

  const Reply all = m.get("metrics/get-history?run_id=" + m.run_id + "&metric_key=h");
  BOOST_TEST(!Doc(all.body).has("/next_page_token"));
  require_refused(m.get("metrics/get-history?run_id=" + m.run_id + "&metric_key=h&page_token=zzz"), 400,
                  "INVALID_PARAMETER_VALUE");
  const Reply none = m.get("metrics/get-history?run_id=" + m.run_id + "&metric_key=nothing");
  BOOST_TEST(none.status == 200);
  BOOST_TEST(!Doc(none.body).has("/metrics"));
}

BOOST_AUTO_TEST_CASE(mlflow_dedup_metrics_option) {
  for (const bool dedup : {false, true}) {
    Mlflow m({.mlflow_dedup_metrics = dedup});
    const std::string batch = R"([{"key": "k", "value": 1, "timestamp": 5, "step": 1}])";
    BOOST_TEST(m.batch(batch).status == 200);
    BOOST_TEST(m.batch(batch).status == 200);
    BOOST_TEST(m.server.metric_history(m.run_id, "k").size() == (dedup ? 1u : 2u));
  }
}

BOOST_AUTO_TEST_CASE(mlflow_artifacts) {
  Mlflow m({.record_requests = true});
  const auto run = m.server.mlflow_run(m.run_id);
  const std::string base =
      m.server.base_url() + "/api/2.0/mlflow-artifacts/artifacts/0/" + m.run_id + "/artifacts/";
  std::string weights(100'000, '\0');
  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<char>(i * 7);
  BOOST_TEST(m.client.perform({.method = "PUT", .url = base + "model/weights.bin", .body = weights}).status == 200);
  const std::string log(3'000'000, 'L'); // large and chunked: libcurl sends Expect: 100-continue
  const Reply chunked = m.client.perform(
      {.method = "PUT", .url = base + "logs/a%20b.txt", .body = log, .chunked = true, .expect_timeout_ms = 60'000});
  BOOST_TEST(chunked.status == 200, chunked);
  BOOST_TEST(m.client.perform({.method = "PUT", .url = base + "readme.txt", .body = "hello"}).status == 200);

  const Reply w = m.client.perform({.url = base + "model/weights.bin"});
  BOOST_TEST(w.status == 200);
  BOOST_TEST((w.body == weights));
  BOOST_TEST((m.client.perform({.url = base + "logs/a%20b.txt"}).body == log));
  require_refused(m.client.perform({.url = base + "missing.txt"}), 404, "RESOURCE_DOES_NOT_EXIST");
  BOOST_TEST(m.client.perform({.method = "PUT", .url = base + "%2E%2E/%2E%2E/escape", .body = "x"}).status == 400);

  const Reply root = m.get("artifacts/list?run_id=" + m.run_id);
  BOOST_TEST_REQUIRE(root.status == 200, root);
  const Doc d(root.body);
  BOOST_TEST(d.str("/root_uri") == run->artifact_uri);
  BOOST_TEST(d.str("/files/0/path") == "logs");
  BOOST_TEST(d.at("/files/0/is_dir").get_bool().value_unsafe());
  BOOST_TEST(d.str("/files/1/path") == "model");
  BOOST_TEST(d.str("/files/2/path") == "readme.txt");
  BOOST_TEST(d.integer("/files/2/file_size") == 5);
  const Reply sub = m.get("artifacts/list?run_id=" + m.run_id + "&path=model");
  BOOST_TEST(Doc(sub.body).str("/files/0/path") == "model/weights.bin");
  BOOST_TEST(Doc(sub.body).integer("/files/0/file_size") == 100'000);

  const auto files = m.server.artifacts(m.run_id);
  BOOST_TEST(files.size() == 3u);
  BOOST_TEST(files.count("logs/a b.txt") == 1u);
  bool expected = false;
  for (const auto& req : m.server.requests())
    for (const auto& [k, v] : req.headers) expected |= k == "expect" && v == "100-continue";
  BOOST_TEST(expected); // the 100 Continue path was taken (and answered: the PUT did not wait 60 s)
}

BOOST_AUTO_TEST_CASE(mlflow_chunked_post_and_unknown_paths) {
  Mlflow m;
  const Reply chunked = m.client.perform({.method = "POST",
                                          .url = m.url("runs/log-batch"),
                                          .body = R"({"run_id": ")" + m.run_id + R"(", "metrics": )" +
                                                  metrics_json(300, "c") + "}",
                                          .headers = {"Content-Type: application/json"},
                                          .chunked = true});
  BOOST_TEST(chunked.status == 200, chunked);
  BOOST_TEST(m.server.mlflow_run(m.run_id)->metrics.size() == 300u);
  BOOST_TEST(m.get("no/such/call").status == 404);
  BOOST_TEST(m.client.perform({.url = m.server.base_url() + "/nothing"}).status == 404);
  BOOST_TEST(m.get("runs/create").status == 405);
}

// ================================================================ W&B

BOOST_AUTO_TEST_CASE(wandb_auth) {
  Wandb w;
  w.upsert("r");
  const std::string vars = R"({"name": "r", "project": "proj"})";
  for (const std::string auth : {"", "api:wrong", "bob:chorus-test-key", "api:"}) {
    w.auth = auth;
    BOOST_TEST(w.graphql(vars).status == 401, "auth '" << auth << "'");
    BOOST_TEST(w.stream("chorus-user/proj/r", file_json("output.log", 0, {"x"})).status == 401);
  }
  w.auth = "api:chorus-test-key";
  BOOST_TEST(w.graphql(vars).status == 200);
  BOOST_TEST(w.stream("chorus-user/proj/r", file_json("output.log", 0, {"x"})).status == 200);
  const auto seen = w.server.authorization_headers();
  BOOST_TEST_REQUIRE(!seen.empty());
  BOOST_TEST(seen.back() == "Basic YXBpOmNob3J1cy10ZXN0LWtleQ=="); // api:chorus-test-key
}

BOOST_AUTO_TEST_CASE(wandb_upsert) {
  Wandb w({.wandb_entity = "me"});
  const Reply first = w.graphql(
      R"({"name": "run1", "project": "proj", "displayName": "first try", "groupName": "g", "jobType": "train",
          "config": "{\"lr\": {\"value\": 0.1}}", "tags": ["a", "b"], "host": "node0", "notes": null})");
  BOOST_TEST_REQUIRE(first.status == 200, first);
  const Doc d(first.body);
  BOOST_TEST(d.str("/data/upsertBucket/bucket/name") == "run1");
  BOOST_TEST(d.str("/data/upsertBucket/bucket/displayName") == "first try");
  BOOST_TEST(d.str("/data/upsertBucket/bucket/project/name") == "proj");
  BOOST_TEST(d.str("/data/upsertBucket/bucket/project/entity/name") == "me"); // the key's entity
  BOOST_TEST(d.integer("/data/upsertBucket/bucket/historyLineCount") == 0);
  BOOST_TEST(d.at("/data/upsertBucket/inserted").get_bool().value_unsafe());
  const std::string id = d.str("/data/upsertBucket/bucket/id");
  BOOST_TEST(!id.empty());
  BOOST_TEST(w.server.wandb_run("me", "proj", "run1")->state == "running"); // a new run runs

  const Reply again = w.graphql(R"({"name": "run1", "project": "proj", "entity": "me", "state": "finished",
                                    "summaryMetrics": "{\"loss\": 0.5}"})");
  const Doc a(again.body);
  BOOST_TEST(!a.at("/data/upsertBucket/inserted").get_bool().value_unsafe());
  BOOST_TEST(a.str("/data/upsertBucket/bucket/id") == id);
  BOOST_TEST(a.str("/data/upsertBucket/bucket/displayName") == "first try"); // kept: not sent

  const auto run = w.server.wandb_run("me", "proj", "run1");
  BOOST_TEST_REQUIRE(run.has_value());
  BOOST_TEST(run->group == "g");
  BOOST_TEST(run->job_type == "train");
  BOOST_TEST(run->host == "node0");
  BOOST_TEST(run->state == "finished");
  BOOST_TEST(run->config == R"({"lr": {"value": 0.1}})");
  BOOST_TEST(run->summary_metrics == R"({"loss": 0.5})");
  BOOST_TEST((run->tags == std::vector<std::string>{"a", "b"}));
  BOOST_TEST(run->upserts == 2u);
  BOOST_TEST(w.server.wandb_runs().size() == 1u);

  // another entity is another run; a config not shaped {"key": {"value": v}} is an error
  BOOST_TEST(Doc(w.graphql(R"({"name": "run1", "project": "proj", "entity": "team"})").body)
                 .at("/data/upsertBucket/inserted")
                 .get_bool()
                 .value_unsafe());
  const Reply bad_config = w.graphql(R"({"name": "run2", "project": "proj", "config": "{\"lr\": 0.1}"})");
  BOOST_TEST(bad_config.status == 200);
  BOOST_TEST(Doc(bad_config.body).has("/errors/0/message"));
  BOOST_TEST(!w.server.wandb_run("me", "proj", "run2").has_value());
  const Reply bad_tags = w.graphql(R"({"name": "run2", "project": "proj", "tags": "a"})");
  BOOST_TEST(Doc(bad_tags.body).has("/errors/0/message"));
  const Reply other = w.graphql("{}", "query Viewer { viewer { entity } }");
  BOOST_TEST(other.status == 200);
  BOOST_TEST(Doc(other.body).has("/errors/0/message"));
  BOOST_TEST(w.server.wandb_runs().size() == 2u);
}

BOOST_AUTO_TEST_CASE(wandb_file_stream_offsets) {
  Wandb w;
  BOOST_TEST(w.stream("chorus-user/proj/r", file_json("wandb-history.jsonl", 0, {"{}"})).status == 404);
  w.upsert("r");
  const std::string path = "chorus-user/proj/r";
  const std::vector<std::string> three = {R"({"_step": 0})", R"({"_step": 1})", R"({"_step": 2})"};
  const Reply first = w.stream(path, file_json("wandb-history.jsonl", 0, three));
  BOOST_TEST_REQUIRE(first.status == 200, first);
  BOOST_TEST(Doc(first.body).has("/limits"));
  BOOST_TEST(Doc(first.body).at("/exitcode").is_null());
  BOOST_TEST(!Doc(first.body).has("/stopped"));
  BOOST_TEST(w.stream(path, file_json("wandb-history.jsonl", 0, three)).status == 200); // a resend
  BOOST_TEST(w.run("r").history.size() == 3u);
  BOOST_TEST(w.stream(path, file_json("wandb-history.jsonl", 3, {R"({"_step": 3})", R"({"_step": 4})"})).status == 200);
  BOOST_TEST(w.run("r").history.size() == 5u);
  BOOST_TEST(w.stream(path, file_json("wandb-history.jsonl", 7, {R"({"_step": 7})"})).status == 400); // a gap
  // one bad line refuses the whole request, the other file's lines included
  const std::string mixed = R"({"files": {"wandb-events.jsonl": {"offset": 0, "content": ["{\"cpu\": 1}"]},
                                          "wandb-history.jsonl": {"offset": 5, "content": ["not json"]}}})";
  BOOST_TEST(w.stream(path, mixed).status == 400);
  BOOST_TEST(w.run("r").events.empty());
  BOOST_TEST(w.stream(path, file_json("wandb-history.jsonl", 5, {"[1, 2]"})).status == 400);
  // lines from the offset on are replaced
  BOOST_TEST(w.stream(path, file_json("wandb-history.jsonl", 4, {R"({"_step": 40})"})).status == 200);
  const auto h = w.run("r").history;
  BOOST_TEST_REQUIRE(h.size() == 5u);
  BOOST_TEST(h[4] == R"({"_step": 40})");

  BOOST_TEST(w.stream(path, file_json("wandb-events.jsonl", 0, {R"({"cpu": 1})"})).status == 200);
  BOOST_TEST(w.stream(path, file_json("output.log", 0, {"line one", "line two"})).status == 200);
  BOOST_TEST(w.stream(path, file_json("wandb-summary.json", 0, {R"({"loss": 1})"})).status == 200);
  BOOST_TEST(w.stream(path, file_json("wandb-summary.json", 0, {R"({"loss": 0.5})"})).status == 200);
  WandbRun r = w.run("r");
  BOOST_TEST(r.events.size() == 1u);
  BOOST_TEST(r.output.size() == 2u);
  BOOST_TEST(r.summary == R"({"loss": 0.5})");
  BOOST_TEST(!r.complete);

  const Reply up = w.graphql(R"({"name": "r", "project": "proj"})");
  BOOST_TEST(Doc(up.body).integer("/data/upsertBucket/bucket/historyLineCount") == 5);
  BOOST_TEST(!Doc(up.body).at("/data/upsertBucket/inserted").get_bool().value_unsafe());

  BOOST_TEST(r.state == "running");
  BOOST_TEST(w.stream(path, R"({"complete": true, "exitcode": 3})").status == 200);
  r = w.run("r");
  BOOST_TEST(r.complete);
  BOOST_TEST(r.exitcode.value_or(-1) == 3);
  BOOST_TEST(r.state == "failed");
  BOOST_TEST(r.file_stream_requests == 9u); // the 200s
  // A resumed run is upserted back to running; its next end sets the state again.
  BOOST_TEST(w.graphql(R"({"name": "r", "project": "proj", "state": "running"})").status == 200);
  BOOST_TEST(w.run("r").state == "running");
  BOOST_TEST(w.stream(path, R"({"complete": true, "exitcode": 0})").status == 200);
  BOOST_TEST(w.run("r").state == "finished");

  BOOST_TEST(w.server.stop_wandb_run("chorus-user", "proj", "r"));
  BOOST_TEST(!w.server.stop_wandb_run("chorus-user", "proj", "nobody"));
  const Reply stopped = w.stream(path, file_json("output.log", 2, {"more"}));
  BOOST_TEST(stopped.status == 200);
  BOOST_TEST(Doc(stopped.body).at("/stopped").get_bool().value_unsafe());
}

BOOST_AUTO_TEST_CASE(wandb_body_limit_and_rate_limit) {
  Wandb w({.wandb_max_body = 1u << 20});
  w.upsert("r");
  const std::string path = "chorus-user/proj/r";
  const std::string big = std::string(1u << 20, 'x');
  BOOST_TEST(w.stream(path, file_json("output.log", 0, {big})).status == 413);
  BOOST_TEST(w.stream(path, file_json("output.log", 0, {"small"})).status == 200); // the connection goes on

  // per run: a fresh one, with nothing in its last second
  w.upsert("limited");
  const std::string lpath = "chorus-user/proj/limited";
  w.server.set_wandb_rate_limit(2);
  BOOST_TEST(w.stream(lpath, file_json("output.log", 0, {"a"})).status == 200);
  BOOST_TEST(w.stream(lpath, file_json("output.log", 1, {"b"})).status == 200);
  // two requests in the last second at most: of the next ones (sent at once) some are refused
  int limited = 0;
  for (int i = 0; i < 10 && limited == 0; ++i) {
    const Reply r = w.stream(lpath, file_json("output.log", 2, {"c"}));
    if (r.status == 429) {
      ++limited;
      BOOST_TEST(r.headers.count("retry-after") == 1u);
    }
  }
  BOOST_TEST(limited == 1);
  w.server.set_wandb_rate_limit(0);
}

BOOST_AUTO_TEST_CASE(wandb_default_body_limit_is_ten_mib) {
  Wandb w;
  w.upsert("r");
  const std::string path = "chorus-user/proj/r";
  BOOST_TEST(w.stream(path, file_json("output.log", 0, {std::string((10u << 20) - 100, 'x')})).status == 200);
  BOOST_TEST(w.stream(path, file_json("output.log", 0, {std::string(10u << 20, 'x')})).status == 413);
}

// ================================================================ faults

BOOST_AUTO_TEST_CASE(fault_injected_answers) {
  Mlflow m;
  m.server.fail_next(2, {.status = 503});
  BOOST_TEST(m.get("runs/get?run_id=" + m.run_id).status == 503);
  BOOST_TEST(m.get("runs/get?run_id=" + m.run_id).status == 503);
  BOOST_TEST(m.get("runs/get?run_id=" + m.run_id).status == 200);

  m.server.fail_next(1, {.status = 429, .retry_after = "1", .path_contains = "log-batch"});
  BOOST_TEST(m.get("runs/get?run_id=" + m.run_id).status == 200); // not matched
  Reply limited = m.batch(metrics_json(3, "a"));
  BOOST_TEST(limited.status == 429);
  BOOST_TEST(limited.headers["retry-after"] == "1");
  BOOST_TEST(m.server.metric_history(m.run_id, "a0").empty()); // not handled
  BOOST_TEST(m.batch(metrics_json(3, "a")).status == 200);

  m.server.fail_next(1, {.status = 500, .body = "boom"});
  const Reply boom = m.get("runs/get?run_id=" + m.run_id);
  BOOST_TEST(boom.status == 500);
  BOOST_TEST(boom.body == "boom");
  m.server.fail_next(5, {.status = 502});
  m.server.clear_faults();
  BOOST_TEST(m.get("runs/get?run_id=" + m.run_id).status == 200);
}

BOOST_AUTO_TEST_CASE(fault_connection_reset) {
  Mlflow m;
  // Each on a new connection: on a kept-alive one libcurl sends again by itself (see below).
  for (const ResetPoint at : {ResetPoint::after_headers, ResetPoint::after_body}) {
    m.server.reset_next(1, at, "log-batch");
    Client fresh;
    const Reply r = fresh.perform({.method = "POST",
                                   .url = m.url("runs/log-batch"),
                                   .body = R"({"run_id": ")" + m.run_id + R"(", "metrics": )" + metrics_json(2, "r") + "}",
                                   .headers = {"Content-Type: application/json"}});
    BOOST_TEST(r.code != CURLE_OK, r);
    BOOST_TEST(r.status == 0);
    BOOST_TEST(m.server.metric_history(m.run_id, "r0").empty());
  }
  // applied, then the answer is lost
  m.server.reset_next(1, ResetPoint::after_handling);
  Client fresh;
  const Reply lost = fresh.perform({.method = "POST",
                                    .url = m.url("runs/log-batch"),
                                    .body = R"({"run_id": ")" + m.run_id + R"(", "metrics": )" + metrics_json(2, "r") + "}",
                                    .headers = {"Content-Type: application/json"}});
  BOOST_TEST(lost.code != CURLE_OK, lost);
  BOOST_TEST(m.server.metric_history(m.run_id, "r0").size() == 1u);
  BOOST_TEST(fresh.perform({.url = m.url("runs/get?run_id=" + m.run_id)}).status == 200); // the client goes on
}

// libcurl itself sends a request again, once, when a reused connection
// closes before any byte of the answer: a reset after handling on a
// kept-alive connection reaches the caller as a 200, the batch applied twice.
BOOST_AUTO_TEST_CASE(fault_reset_on_a_reused_connection_is_resent_by_libcurl) {
  Mlflow m; // its client's connection is kept alive from runs/create
  m.server.reset_next(1, ResetPoint::after_handling, "log-batch");
  const Reply r = m.batch(metrics_json(1, "twice"));
  BOOST_TEST(r.status == 200, r);
  BOOST_TEST(m.server.metric_history(m.run_id, "twice0").size() == 2u);
  BOOST_TEST(m.server.stats().by_kind["mlflow/runs/log-batch"] == 2u);

  // the resend is a request of its own: a second reset reaches the caller
  m.server.reset_next(2, ResetPoint::after_body, "log-batch");
  const Reply twice = m.batch(metrics_json(1, "never"));
  BOOST_TEST(twice.code != CURLE_OK, twice);
  BOOST_TEST(m.server.metric_history(m.run_id, "never0").empty());
  BOOST_TEST(m.server.stats().by_kind["mlflow/runs/log-batch"] == 4u);
}

BOOST_AUTO_TEST_CASE(fault_slow_server) {
  Mlflow m;
  m.server.set_delay(1500ms, "runs/get");
  const Reply slow = m.client.perform({.url = m.url("runs/get?run_id=" + m.run_id), .timeout_ms = 200});
  BOOST_TEST(slow.code == CURLE_OPERATION_TIMEDOUT, slow);
  BOOST_TEST(m.get("experiments/get-by-name?experiment_name=Default").status == 200); // not matched
  m.server.set_delay(50ms);
  BOOST_TEST(m.get("runs/get?run_id=" + m.run_id).status == 200); // slow but within the client's patience
  m.server.set_delay(0ms);
  BOOST_TEST(m.client.perform({.url = m.url("runs/get?run_id=" + m.run_id), .timeout_ms = 10'000}).status == 200);
}

BOOST_AUTO_TEST_CASE(fault_outage) {
  Mlflow m; // its client holds a kept-alive connection from the fixture's runs/create
  const std::uint16_t port = m.server.port();
  m.server.outage(1500ms);
  BOOST_TEST(m.server.in_outage());
  const Reply down = m.get("runs/get?run_id=" + m.run_id);
  BOOST_TEST(down.code == CURLE_COULDNT_CONNECT, down);
  Client fresh;
  BOOST_TEST(fresh.perform({.url = m.url("runs/get?run_id=" + m.run_id)}).code == CURLE_COULDNT_CONNECT);

  const auto start = std::chrono::steady_clock::now();
  Reply back;
  while (std::chrono::steady_clock::now() - start < 30s) {
    back = m.get("runs/get?run_id=" + m.run_id);
    if (back.status == 200) break;
    std::this_thread::sleep_for(50ms);
  }
  BOOST_TEST(back.status == 200, "the outage did not end: " << back);
  BOOST_TEST(!m.server.in_outage());
  BOOST_TEST(m.server.port() == port);
  BOOST_TEST(m.server.mlflow_run(m.run_id).has_value()); // state survives
}

BOOST_AUTO_TEST_CASE(fault_refused_key) {
  Mlflow m;
  m.server.refuse_key("bad_metric");
  const Reply r = m.batch(R"([{"key": "good", "value": 1, "timestamp": 1}, {"key": "bad_metric", "value": 1, "timestamp": 1}])");
  require_refused(r, 400, "INVALID_PARAMETER_VALUE");
  BOOST_TEST(r.body.find("bad_metric") != std::string::npos, r);
  BOOST_TEST(m.server.metric_history(m.run_id, "good").empty());
  BOOST_TEST(m.batch(R"([{"key": "good", "value": 1, "timestamp": 1}])").status == 200);
  BOOST_TEST(m.server.metric_history(m.run_id, "good").size() == 1u);
}

// ================================================================ transport

BOOST_AUTO_TEST_CASE(keep_alive_and_stats) {
  Mlflow m; // one connection so far
  for (int i = 0; i < 10; ++i) BOOST_TEST(m.get("runs/get?run_id=" + m.run_id).status == 200);
  ServerStats s = m.server.stats();
  BOOST_TEST(s.connections == 1u);
  BOOST_TEST(s.requests == 11u);
  BOOST_TEST(s.by_kind["mlflow/runs/get"] == 10u);
  BOOST_TEST(s.by_kind["mlflow/runs/create"] == 1u);
  for (int i = 0; i < 3; ++i)
    BOOST_TEST(m.client.perform({.url = m.url("runs/get?run_id=" + m.run_id), .headers = {"Connection: close"}}).status ==
               200);
  s = m.server.stats();
  BOOST_TEST(s.connections == 3u); // the first closes the kept one; the next two open (and close) one each
}

BOOST_AUTO_TEST_CASE(recorded_requests) {
  Wandb w({.record_requests = true});
  w.upsert("r");
  BOOST_TEST(w.stream("chorus-user/proj/r", file_json("output.log", 0, {"hello"})).status == 200);
  const auto reqs = w.server.requests();
  BOOST_TEST_REQUIRE(reqs.size() == 2u);
  BOOST_TEST(reqs[1].method == "POST");
  BOOST_TEST(reqs[1].target == "/files/chorus-user/proj/r/file_stream");
  BOOST_TEST(reqs[1].body.find("hello") != std::string::npos);
  for (const auto& r : reqs) BOOST_TEST(r.body.find("chorus-test-key") == std::string::npos);
  BOOST_TEST(w.server.authorization_headers().size() == 2u);
}

BOOST_AUTO_TEST_CASE(tls_with_the_generated_ca) {
  TempDir dir, other;
  const TlsFiles files = write_test_certificates(dir.str());
  const TlsFiles foreign = write_test_certificates(other.str());
  TrackingServer server({.tls = files});
  BOOST_TEST(server.base_url().rfind("https://127.0.0.1:", 0) == 0u);
  Client c;
  const std::string path = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default";
  for (int i = 0; i < 3; ++i) {
    const Reply ok = c.perform({.url = server.base_url() + path, .cainfo = files.ca});
    BOOST_TEST(ok.status == 200, ok);
  }
  BOOST_TEST(server.stats().connections == 1u); // kept alive over TLS too
  const Reply by_name =
      c.perform({.url = "https://localhost:" + std::to_string(server.port()) + path, .cainfo = files.ca});
  BOOST_TEST(by_name.status == 200, by_name);
  const Reply put = c.perform({.method = "PUT",
                               .url = server.base_url() + "/api/2.0/mlflow-artifacts/artifacts/0/r/artifacts/x.bin",
                               .body = std::string(200'000, 'z'),
                               .cainfo = files.ca,
                               .chunked = true});
  BOOST_TEST(put.status == 200, put);

  Client stranger;
  const Reply refused = stranger.perform({.url = server.base_url() + path, .cainfo = foreign.ca});
  BOOST_TEST(refused.code == CURLE_PEER_FAILED_VERIFICATION, refused);
  BOOST_TEST(refused.status == 0);
  // and the server is still fine
  BOOST_TEST(c.perform({.url = server.base_url() + path, .cainfo = files.ca}).status == 200);
}
