// Real jobs under `chorus launch` uploading to the loopback tracking server
// (which runs in this process): live to MLflow and W&B, through faults, with
// the server down, with the uploading host killed, and afterwards through
// `chorus sync`. The run directory is the truth: the server must hold every
// value of history.jsonl (and system.jsonl) once, in step order, with the
// run's end state, also when a rank ends its run by exit() over HTTPS.
#define BOOST_TEST_MODULE upload_e2e
#include "tests/cli/process.hpp"
#include "tests/e2e/harness.hpp"
#include "tests/upload/tracking_server.hpp"

#include <boost/test/unit_test.hpp>

#include <simdjson.h>

#include <csignal>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using chorus::test::Child;
using chorus::test::MetricPoint;
using chorus::test::MlflowRun;
using chorus::test::TrackingServer;
using Clock = std::chrono::steady_clock;

const std::string worker_binary = CHORUS_BINARY_DIR "/bin/chorus_e2e_worker";

/// Nothing from the caller's environment steers the jobs or `chorus sync`.
struct QuietEnvironment {
  QuietEnvironment() {
    std::vector<std::string> names;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry = *e;
      const std::string_view name = entry.substr(0, entry.find('='));
      if (name.starts_with("CHORUS_") || name.starts_with("WANDB_") || name.starts_with("MLFLOW_"))
        names.emplace_back(name);
    }
    for (const std::string& n : names) ::unsetenv(n.c_str());
  }
};
BOOST_TEST_GLOBAL_FIXTURE(QuietEnvironment);

std::string mlflow_url(std::uint16_t port) { return "mlflow://127.0.0.1:" + std::to_string(port); }
std::string mlflow_id(std::uint16_t port) { return "mlflow-127.0.0.1-" + std::to_string(port); }

/// `chorus launch -n RANKS OPTIONS -- chorus_e2e_worker ARGS`, its runs under `dir`, with `env` added.
std::unique_ptr<Child> launch(const fs::path& dir, int ranks, const std::vector<std::string>& args,
                              std::vector<std::string> env, const std::vector<std::string>& options = {}) {
  std::vector<std::string> words{"launch", "-n", std::to_string(ranks)};
  words.insert(words.end(), options.begin(), options.end());
  words.insert(words.end(), {"--", worker_binary});
  words.insert(words.end(), args.begin(), args.end());
  env.push_back("CHORUS_DIR=" + dir.string());
  return std::make_unique<Child>(words, env);
}

chorus::test::Output chorus_cmd(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  return chorus::test::run_chorus(args, env);
}

/// Polls `done` every 10 ms for up to `limit`.
bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::uint64_t requests_of(const TrackingServer& s, const std::string& kind) {
  const auto stats = s.stats();
  auto it = stats.by_kind.find(kind);
  return it == stats.by_kind.end() ? 0 : it->second;
}
std::uint64_t log_batches(const TrackingServer& s) { return requests_of(s, "mlflow/runs/log-batch"); }

/// Every metric point the server holds, over all its runs.
std::size_t points_on(const TrackingServer& s) {
  std::size_t n = 0;
  for (const MlflowRun& r : s.mlflow_runs())
    for (const auto& [key, points] : r.metrics) n += points.size();
  return n;
}

/// The one run directory under `root`.
fs::path only_run_dir(const fs::path& root) {
  const auto runs = e2e::find_runs(root);
  BOOST_REQUIRE_EQUAL(runs.size(), 1u);
  return runs.front();
}

std::int64_t to_ms(double seconds) { return std::llround(seconds * 1000.0); }

struct RunJson {
  std::string id, name, group, mode, host, state;
  std::int64_t start_ms = 0, end_ms = 0, pid = 0;
};

RunJson read_run_json(const fs::path& run_dir) {
  simdjson::dom::parser parser;
  const simdjson::dom::element doc = e2e::read_run_json(parser, run_dir);
  RunJson r;
  auto str = [&](const char* k, std::string& out) {
    std::string_view v;
    if (doc[k].get(v) == simdjson::SUCCESS) out = v;
  };
  str("id", r.id);
  str("name", r.name);
  str("group", r.group);
  str("mode", r.mode);
  str("host", r.host);
  str("state", r.state);
  double t = 0;
  if (doc["start_time"].get(t) == simdjson::SUCCESS) r.start_ms = to_ms(t);
  r.end_ms = doc["end_time"].get(t) == simdjson::SUCCESS ? to_ms(t) : r.start_ms;
  if (doc["pid"].get(r.pid) != simdjson::SUCCESS) r.pid = 0;
  return r;
}

/// The target's offsets in the run directory (upload/<id>.json).
struct Offsets {
  std::string remote_run, final_sent, last_error;
  std::uint64_t points = 0;
};

Offsets read_offsets(const fs::path& run_dir, const std::string& target_id) {
  const fs::path path = run_dir / "upload" / (target_id + ".json");
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  BOOST_REQUIRE_MESSAGE(parser.load(path.string()).get(doc) == simdjson::SUCCESS, path << " is missing or not JSON");
  Offsets o;
  std::string_view v;
  if (doc["remote_run"].get(v) == simdjson::SUCCESS) o.remote_run = v;
  if (doc["final_sent"].get(v) == simdjson::SUCCESS) o.final_sent = v;
  if (doc["last_error"].get(v) == simdjson::SUCCESS) o.last_error = v;
  if (doc["points"].get(o.points) != simdjson::SUCCESS) o.points = 0;
  return o;
}

std::vector<std::string> file_lines(const fs::path& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// ---------------------------------------------------------------- MLflow

using Metrics = std::map<std::string, std::vector<MetricPoint>>;

/// What MLflow must hold for a run directory: each value of history.jsonl
/// under its key at its row's step, each of system.jsonl under system/...
/// at its line's index, with the line's time in ms, in file order.
Metrics expected_metrics(const fs::path& run_dir, std::uint64_t& values) {
  Metrics m;
  values = 0;
  simdjson::dom::parser parser;
  for (const bool history : {true, false}) {
    const fs::path file = run_dir / (history ? "history.jsonl" : "system.jsonl");
    const auto lines = file_lines(file);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      simdjson::dom::object obj;
      BOOST_REQUIRE_MESSAGE(parser.parse(lines[i]).get(obj) == simdjson::SUCCESS,
                            file << " line " << i << " is not a JSON object: " << lines[i]);
      double ts = 0;
      if (obj["_timestamp"].get(ts) != simdjson::SUCCESS) ts = 0;
      auto step = static_cast<std::int64_t>(i);
      if (history) BOOST_REQUIRE(obj["_step"].get(step) == simdjson::SUCCESS);
      for (auto f : obj) {
        std::string key(f.key);
        if (key.starts_with("_")) continue;
        double v = 0;
        std::string_view s;
        if (f.value.get(v) != simdjson::SUCCESS) {
          if (f.value.get(s) != simdjson::SUCCESS) continue;
          if (s == "NaN") v = std::nan("");
          else if (s == "Infinity") v = 1.7976931348623157e308;
          else if (s == "-Infinity") v = -1.7976931348623157e308;
          else continue;
        }
        if (!history && key.starts_with("system.")) key = "system/" + key.substr(7);
        m[key].push_back(MetricPoint{v, to_ms(ts), step});
        ++values;
      }
    }
  }
  return m;
}

bool same_point(const MetricPoint& a, const MetricPoint& b) {
  return a.step == b.step && a.timestamp == b.timestamp &&
         (a.value == b.value || (std::isnan(a.value) && std::isnan(b.value)));
}

std::string show(const MetricPoint& p) {
  std::ostringstream s;
  s << "{step " << p.step << ", value " << p.value << ", ts " << p.timestamp << "}";
  return s.str();
}

std::string show(const std::map<std::string, std::string>& m) {
  std::string s = "{";
  for (const auto& [k, v] : m) s += (s.size() > 1 ? ", " : "") + k + "=" + v;
  return s + "}";
}

/// The server's points equal the expected ones key by key: none missing,
/// none twice, none extra, in step order (several log-batches are in flight
/// at once: the server may store them in another order). Reports the first
/// difference per key.
void check_metrics(const MlflowRun& r, const Metrics& want) {
  std::set<std::string> have_keys, want_keys;
  for (const auto& [k, v] : r.metrics) have_keys.insert(k);
  for (const auto& [k, v] : want) want_keys.insert(k);
  BOOST_TEST(have_keys == want_keys, boost::test_tools::per_element());
  for (const auto& [key, points] : want) {
    auto it = r.metrics.find(key);
    if (it == r.metrics.end()) continue; // reported above
    auto got = it->second;
    auto by_step = [](const MetricPoint& a, const MetricPoint& b) { return a.step < b.step; };
    std::stable_sort(got.begin(), got.end(), by_step);
    auto sorted = points;
    std::stable_sort(sorted.begin(), sorted.end(), by_step);
    BOOST_TEST_CONTEXT("key " << key) {
      BOOST_TEST(got.size() == points.size());
      for (std::size_t i = 0; i < std::min(got.size(), points.size()); ++i)
        if (!same_point(got[i], sorted[i])) {
          BOOST_ERROR("point " << i << ": the server has " << show(got[i]) << ", the run directory " << show(sorted[i]));
          break;
        }
    }
  }
}

std::string mlflow_status(const std::string& state) {
  return state == "finished" ? "FINISHED" : state == "killed" ? "KILLED" : "FAILED";
}

/// config.json flattened as MLflow params: "a.b" for nested keys, strings as
/// they are, anything else as its JSON.
std::map<std::string, std::string> expected_params(const fs::path& run_dir) {
  std::map<std::string, std::string> out;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.load((run_dir / "config.json").string()).get(doc) != simdjson::SUCCESS) return out;
  std::function<void(const std::string&, simdjson::dom::element)> flatten = [&](const std::string& prefix,
                                                                               simdjson::dom::element e) {
    simdjson::dom::object obj;
    if (e.get(obj) == simdjson::SUCCESS) {
      for (auto f : obj) flatten(prefix.empty() ? std::string(f.key) : prefix + "." + std::string(f.key), f.value);
      return;
    }
    std::string_view s;
    out[prefix] = e.get(s) == simdjson::SUCCESS ? std::string(s) : simdjson::minify(e);
  };
  flatten({}, doc);
  return out;
}

/// The one MLflow run made for the run directory's run (by its chorus.run_id tag).
MlflowRun remote_run(const TrackingServer& server, const std::string& run_id) {
  std::vector<MlflowRun> found;
  for (MlflowRun& r : server.mlflow_runs())
    if (auto t = r.tags.find("chorus.run_id"); t != r.tags.end() && t->second == run_id) found.push_back(std::move(r));
  BOOST_REQUIRE_EQUAL(found.size(), 1u);
  return found.front();
}

/// The server holds the ended run exactly as its directory does, and the
/// target's offsets say it is done.
void check_mlflow(const TrackingServer& server, const fs::path& run_dir) {
  BOOST_TEST_CONTEXT("run " << run_dir) {
    const RunJson rj = read_run_json(run_dir);
    BOOST_REQUIRE_NE(rj.state, "running");
    MlflowRun r = remote_run(server, rj.id);
    std::uint64_t values = 0;
    const Metrics want = expected_metrics(run_dir, values);
    BOOST_TEST(values > 0u);
    check_metrics(r, want);
    BOOST_TEST(r.status == mlflow_status(rj.state));
    BOOST_TEST(r.name == rj.name);
    BOOST_TEST(r.start_time == rj.start_ms);
    BOOST_TEST(r.end_time.value_or(-1) == rj.end_ms);
    BOOST_TEST(r.tags["chorus.group"] == rj.group);
    BOOST_TEST(r.tags["chorus.mode"] == rj.mode);
    BOOST_TEST(r.tags["chorus.host"] == rj.host);
    const auto params = expected_params(run_dir);
    BOOST_TEST(!params.empty());
    BOOST_TEST((r.params == params), "params " << show(r.params) << ", config.json " << show(params));
    const Offsets o = read_offsets(run_dir, mlflow_id(server.port()));
    BOOST_TEST(o.final_sent == rj.state);
    BOOST_TEST(o.remote_run == r.id);
    BOOST_TEST(o.points == values);
  }
}

// ---------------------------------------------------------------- W&B

/// `got` holds the file's lines, each once, in order.
void check_lines(const std::vector<std::string>& got, const fs::path& file) {
  const auto want = file_lines(file);
  BOOST_TEST_CONTEXT(file.filename()) {
    BOOST_TEST(got.size() == want.size());
    for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
      if (got[i] != want[i]) {
        BOOST_ERROR("line " << i << ": the server has " << got[i] << ", the run directory " << want[i]);
        break;
      }
  }
}

/// Every file under `root` and the given output is free of `secret`.
void check_secret_kept(const std::string& secret, const fs::path& root, const std::vector<std::string>& outputs) {
  std::size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    ++files;
    BOOST_TEST(chorus::test::read_text(e.path()).find(secret) == std::string::npos, e.path() << " holds the key");
  }
  BOOST_TEST(files > 0u);
  for (const std::string& text : outputs) BOOST_TEST(text.find(secret) == std::string::npos, "the output holds the key");
}

// ---------------------------------------------------------------- jobs

/// Whether `arrived(run)` held while the one run under `root` still said
/// running: the upload streamed as the job trained, not only at its end.
bool arrived_while_training(const fs::path& root, const std::function<bool(const RunJson&)>& arrived) {
  const auto until = Clock::now() + 60s;
  while (Clock::now() < until) {
    if (const auto runs = e2e::find_runs(root); runs.size() == 1) {
      const RunJson rj = read_run_json(runs.front());
      if (rj.state != "running") return false;
      if (arrived(rj)) return read_run_json(runs.front()).state == "running";
    }
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

/// A finished job's output, for the log of a failing check.
std::string both(const chorus::test::Output& o) { return "stdout:\n" + o.out + "\nstderr:\n" + o.err; }

} // namespace

// 1. Four ranks log one shared run; its host uploads it to MLflow, the rest at its end.
BOOST_AUTO_TEST_CASE(live_upload_to_mlflow_holds_every_point_once) {
  TrackingServer server;
  chorus::test::TempDir dir;
  auto job = launch(dir.path, 4, {"--steps", "300"},
                    {"CHORUS_UPLOAD=" + mlflow_url(server.port()), "CHORUS_SYSTEM_INTERVAL=0.2"});
  const auto out = job->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  const fs::path run_dir = only_run_dir(dir.path);
  e2e::check_worker_history(run_dir, {0, 1, 2, 3}, 300);
  check_mlflow(server, run_dir);
  BOOST_TEST(server.mlflow_runs().size() == 1u);
  // Keep-alive: a handful of connections, not one per request.
  BOOST_TEST(server.stats().connections < server.stats().requests);

  const auto status = chorus_cmd({"sync", "--status", run_dir.string()});
  BOOST_TEST_INFO_SCOPE(both(status));
  BOOST_TEST(status.code == 0);
  const RunJson rj = read_run_json(run_dir);
  bool listed = false;
  for (const std::string& line : chorus::test::lines_of(status.out))
    if (line.find(rj.id) != std::string::npos && line.find(mlflow_url(server.port())) != std::string::npos)
      listed = line.find("done (finished)") != std::string::npos;
  BOOST_TEST(listed);
}

// 1a. A rank that calls exit() before its finish, its run uploading over
// HTTPS: the exit ends the run (runtime/client/endings.hpp), and its last
// values and its end still reach the server, through a TLS library that
// exit() must not have cleaned up first. Memory freed at the exit is
// overwritten at once (glibc's perturb, no thread cache), so that a use of
// what was cleaned up fails.
BOOST_AUTO_TEST_CASE(a_run_ended_by_exit_sends_its_end_over_https) {
  chorus::test::TempDir certs;
  const chorus::test::TlsFiles files = chorus::test::write_test_certificates(certs.path.string());
  TrackingServer server({.tls = files});
  chorus::test::TempDir dir;
  // The job's environment is this process's, with the launch's added after
  // it: the CA is set here, so that it comes first.
  const char* had = std::getenv("CURL_CA_BUNDLE");
  const std::optional<std::string> kept = had ? std::optional<std::string>(had) : std::nullopt;
  ::setenv("CURL_CA_BUNDLE", files.ca.c_str(), 1);
  // A run of the process's own first, which uploads nothing: the process's
  // exit handler comes before anything the upload's libraries register.
  auto job = launch(dir.path, 1, {"--local-run-first", "1", "--steps", "100", "--exit-rank", "0", "--exit-step", "99", "--exit-now", "0"},
                    {"CHORUS_UPLOAD=mlflow+https://127.0.0.1:" + std::to_string(server.port()),
                     "CHORUS_UPLOAD_TIMEOUT=30",
                     "GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.perturb=165"});
  if (kept) ::setenv("CURL_CA_BUNDLE", kept->c_str(), 1);
  else ::unsetenv("CURL_CA_BUNDLE");
  const auto out = job->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  const fs::path run_dir = only_run_dir(dir.path / "e2e"); // not the local run (dir/local)
  BOOST_TEST(out.out.find("LOCAL_RUN finished") != std::string::npos);
  BOOST_TEST(read_run_json(run_dir).state == "finished");
  check_mlflow(server, run_dir); // every value once, FINISHED
}

// 1b. A server that takes longer to answer a log-batch (3.5 s) than the live
// upload's 3 s slice: the slice decides only when a request starts, so
// points arrive while the run trains, and no request is cut.
BOOST_AUTO_TEST_CASE(live_upload_to_a_slow_server_is_never_cut_by_its_slice) {
  TrackingServer server;
  server.set_delay(3500ms, "log-batch");
  chorus::test::TempDir dir;
  auto job = launch(dir.path, 1, {"--steps", "300", "--step-us", "40000"},
                    {"CHORUS_UPLOAD=" + mlflow_url(server.port()), "CHORUS_UPLOAD_TIMEOUT=60"});
  BOOST_TEST(arrived_while_training(dir.path, [&](const RunJson&) { return points_on(server) > 0; }));
  const auto out = job->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  BOOST_TEST(out.err.find("Timeout was reached") == std::string::npos);
  BOOST_TEST(out.err.find("ran out") == std::string::npos);
  check_mlflow(server, only_run_dir(dir.path));
}

// 2. The same to W&B: history and system lines streamed through file_stream.
BOOST_AUTO_TEST_CASE(live_upload_to_wandb_holds_every_line_once_and_never_the_key) {
  TrackingServer::Options so;
  std::random_device rd;
  so.wandb_api_key = "e2e-key-" + std::to_string(rd()) + std::to_string(rd());
  TrackingServer server(so);
  chorus::test::TempDir dir;
  const std::string url = "wandb+http://127.0.0.1:" + std::to_string(server.port()) + "/team";
  // About 2.5 s of training, so that lines go up before the end.
  auto job = launch(dir.path, 4, {"--steps", "300", "--step-us", "8000"},
                    {"CHORUS_UPLOAD=" + url, "WANDB_API_KEY=" + so.wandb_api_key, "CHORUS_WANDB_INTERVAL=0.2",
                     "CHORUS_SYSTEM_INTERVAL=0.2"});
  BOOST_TEST(arrived_while_training(dir.path, [&](const RunJson& rj) {
    const auto r = server.wandb_run("team", "e2e", rj.id);
    return r && !r->history.empty();
  }));
  const auto out = job->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  const fs::path run_dir = only_run_dir(dir.path);
  e2e::check_worker_history(run_dir, {0, 1, 2, 3}, 300);
  const RunJson rj = read_run_json(run_dir);
  const auto r = server.wandb_run("team", "e2e", rj.id);
  BOOST_REQUIRE(r);
  check_lines(r->history, run_dir / "history.jsonl");
  BOOST_TEST(!file_lines(run_dir / "system.jsonl").empty());
  check_lines(r->events, run_dir / "system.jsonl");
  BOOST_TEST(r->complete);
  BOOST_TEST(r->exitcode.value_or(-1) == 0);
  BOOST_TEST(r->group == rj.group);
  BOOST_TEST(r->display_name == rj.name);
  BOOST_TEST(r->config.find("\"optimizer\":{\"value\":\"sgd\"}") != std::string::npos, r->config);
  BOOST_TEST(r->summary.find("\"done\":true") != std::string::npos, r->summary);
  const Offsets o = read_offsets(run_dir, "wandb-127.0.0.1-" + std::to_string(server.port()) + "-team");
  BOOST_TEST(o.final_sent == "finished");
  check_secret_kept(so.wandb_api_key, dir.path, {out.out, out.err});
}

// 3. Nothing listens at the target while the job runs: the job ends in time,
// says how to upload later, and `chorus sync` does it once the server is up.
BOOST_AUTO_TEST_CASE(server_down_during_the_run_then_sync_uploads_it_all) {
  std::uint16_t port = 0;
  { port = TrackingServer().port(); } // a port that nothing listens on now
  chorus::test::TempDir dir;
  const std::string url = mlflow_url(port);
  const auto started = Clock::now();
  auto job = launch(dir.path, 2, {"--steps", "200"}, {"CHORUS_UPLOAD=" + url, "CHORUS_UPLOAD_TIMEOUT=2"});
  const auto out = job->finish(120s);
  const auto took = Clock::now() - started;
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  // Bounded by the 2 s upload timeout, not the default 30 s.
  BOOST_TEST(took < 25s);
  const fs::path run_dir = only_run_dir(dir.path);
  BOOST_TEST(out.err.find("`chorus sync " + run_dir.string() + " --to " + url + "`") != std::string::npos);
  const Offsets before = read_offsets(run_dir, mlflow_id(port));
  BOOST_TEST(before.final_sent.empty());
  BOOST_TEST(before.points == 0u);
  BOOST_TEST(!before.last_error.empty());

  TrackingServer::Options so;
  so.port = port;
  TrackingServer server(so);
  const RunJson rj = read_run_json(run_dir);
  // By id, looked up under --dir.
  const auto sync = chorus_cmd({"sync", rj.id, "--dir", dir.str(), "--to", url});
  BOOST_TEST_INFO_SCOPE(both(sync));
  BOOST_REQUIRE_EQUAL(sync.code, 0);
  BOOST_TEST(sync.out.find("uploaded to " + url) != std::string::npos);
  check_mlflow(server, run_dir);
  BOOST_TEST(server.mlflow_runs().size() == 1u);
}

namespace {

/// Case 4: a long run uploads slowly; its host (rank 0) is SIGKILLed while
/// batches are in flight. `chorus recover` gives it its end, `chorus sync`
/// the rest: every point of the recovered history once.
void kill_the_uploading_host(bool reset_before_kill) {
  TrackingServer server;
  server.set_delay(200ms, "log-batch");
  chorus::test::TempDir dir;
  const std::string url = mlflow_url(server.port());
  auto job = launch(dir.path, 2, {"--steps", "3000", "--step-us", "1000"}, {"CHORUS_UPLOAD=" + url});

  fs::path run_dir;
  BOOST_REQUIRE(eventually(
      [&] {
        const auto runs = e2e::find_runs(dir.path);
        if (runs.empty()) return false;
        run_dir = runs.front();
        return true;
      },
      60s));
  RunJson rj;
  BOOST_REQUIRE(eventually(
      [&] {
        rj = read_run_json(run_dir);
        return rj.pid > 0;
      },
      10s));
  // Some batches are on the server; the run goes on.
  BOOST_REQUIRE(eventually([&] { return log_batches(server) >= 3; }, 60s));
  if (reset_before_kill) {
    // The next batch is stored, then its answer is lost; the host dies
    // before it can ask the server what became of it.
    const std::size_t stored = points_on(server);
    const std::uint64_t sent = log_batches(server);
    server.reset_next(1, chorus::test::ResetPoint::after_handling, "log-batch");
    BOOST_REQUIRE(eventually([&] { return log_batches(server) > sent && points_on(server) > stored; }, 30s));
  }
  BOOST_REQUIRE_EQUAL(::kill(static_cast<pid_t>(rj.pid), SIGKILL), 0);
  const auto out = job->finish(90s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_TEST(out.code != 0);
  BOOST_TEST(out.code != -1); // the other rank did not hang
  // Ended by chorus launch from its WAL as crashed: the host died before the
  // run's end (else while it drained the upload, after run.json said finished).
  const bool killed_while_training = read_run_json(run_dir).state == "crashed";
  BOOST_TEST_MESSAGE("host killed " << (killed_while_training ? "while training" : "while draining"));

  // Cut off mid-stream: some points are on the server, not all, no end.
  BOOST_TEST(points_on(server) > 0u);
  BOOST_TEST(read_offsets(run_dir, mlflow_id(server.port())).final_sent.empty());
  BOOST_TEST(remote_run(server, rj.id).status == "RUNNING");

  const auto rec = chorus_cmd({"recover", run_dir.string()});
  BOOST_TEST_INFO_SCOPE(both(rec));
  BOOST_REQUIRE_EQUAL(rec.code, 0);
  const RunJson recovered = read_run_json(run_dir);
  if (killed_while_training)
    BOOST_TEST((recovered.state == "crashed" || recovered.state == "failed" || recovered.state == "killed"),
               recovered.state);
  else
    BOOST_TEST(recovered.state == "finished");
  std::uint64_t values = 0;
  (void)expected_metrics(run_dir, values);
  BOOST_TEST(points_on(server) < values); // something is left for sync

  server.set_delay(0ms);
  const auto sync = chorus_cmd({"sync", run_dir.string(), "--to", url});
  BOOST_TEST_INFO_SCOPE(both(sync));
  BOOST_REQUIRE_EQUAL(sync.code, 0);
  check_mlflow(server, run_dir);
  BOOST_TEST(server.mlflow_runs().size() == 1u); // resumed into the run the host made
}

} // namespace

// 4.
BOOST_AUTO_TEST_CASE(sigkill_of_the_uploading_host_then_recover_and_sync) { kill_the_uploading_host(false); }

// 4b. The killed host had a batch stored whose answer it never saw.
BOOST_AUTO_TEST_CASE(sigkill_after_a_stored_batch_lost_its_answer_then_sync_sends_it_not_again) {
  kill_the_uploading_host(true);
}

namespace {

struct ProcState {
  char state = 0; // 'Z' for a zombie
  pid_t ppid = 0;
};

/// /proc/PID/stat's state and parent, if the process is there.
std::optional<ProcState> proc_state(const fs::path& proc_dir) {
  const std::string stat = chorus::test::read_text(proc_dir / "stat");
  const auto close = stat.rfind(')'); // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= stat.size()) return std::nullopt;
  std::istringstream fields(stat.substr(close + 2));
  ProcState p;
  if (!(fields >> p.state >> p.ppid)) return std::nullopt;
  return p;
}

/// Whether any thread of process `pid` is still alive. A killed process's
/// leader shows 'Z' as soon as it has exited, while its other threads may
/// still be on their way out (one inside fdatasync finishes the call first),
/// and the files they share, the WAL's lock with them, close only with the
/// last of them; so every thread is looked at, not the leader alone.
bool has_a_live_thread(pid_t pid) {
  std::error_code ec;
  for (const auto& t : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    const auto s = proc_state(t.path());
    if (s && s->state != 'Z' && s->state != 'X') return true;
  }
  return false; // gone, or every thread of it exited
}

/// Kills a job for real, as a lost node's processes die: SIGKILL at once to
/// `chorus launch` and to each rank it started (each in a process group of
/// its own, which a signal to launch's group misses); returns once none is
/// alive, so that the run host's WAL lock is free.
void kill_job(pid_t launch) {
  std::vector<pid_t> pids{launch};
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (const auto p = proc_state(e.path()); p && p->ppid == launch) pids.push_back(std::stoi(name));
  }
  BOOST_REQUIRE_GT(pids.size(), 1u); // launch's ranks
  // launch stopped first, then killed last: its death sends its ranks
  // SIGTERM (PR_SET_PDEATHSIG), and a host that took it before its SIGKILL
  // would end the run `killed`; a launch alive when they die would record
  // their exit codes.
  ::kill(-launch, SIGSTOP);
  for (auto p = pids.rbegin(); p != pids.rend(); ++p) ::kill(-*p, SIGKILL);
  BOOST_REQUIRE(eventually([&] { return std::none_of(pids.begin(), pids.end(), has_a_live_thread); }, 60s));
}

/// Case 4c: a 4-rank job uploading live is killed for real (SIGKILL to
/// launch, the run host and the ranks) while parked at step 500, then
/// requeued under the same run id, restarting from its checkpoint at step
/// 400, and runs to step 999. With `sync_between`, the killed run was
/// recovered and synced before the requeue, so the server had its end
/// (crashed: FAILED) and must show it running again while the second attempt
/// trains. Either way the server holds one MLflow run for the chorus run, each
/// metric once per step 0..999, and ends FINISHED.
void resume_a_killed_uploading_job(bool sync_between) {
  constexpr int ranks = 4, steps = 1000, pause_at = 500, checkpoint = 400;
  TrackingServer server;
  chorus::test::TempDir dir;
  const std::string url = mlflow_url(server.port());
  const std::vector<std::string> env{"CHORUS_UPLOAD=" + url, "CHORUS_RUN_ID=requeued-1"};
  const std::vector<std::string> same_job{"--run-id", "job-7"}; // a requeued job keeps its id, hence its group
  {
    auto first = launch(dir.path, ranks, {"--steps", std::to_string(steps), "--pause-step", std::to_string(pause_at)},
                        env, same_job);
    const std::string paused = "PAUSED " + std::to_string(pause_at);
    const bool reached = first->wait_for([&](const std::string& out, const std::string&) {
      return out.find(paused) != std::string::npos;
    }, 120s);
    BOOST_REQUIRE_MESSAGE(reached, "the job never reported " << paused);
    // Some of it went up live; the rest waits for the next attempt (or sync).
    BOOST_REQUIRE(eventually([&] { return points_on(server) > 0; }, 60s));
    kill_job(first->pid());
    const auto out = first->finish(60s);
    BOOST_TEST_INFO_SCOPE(both(out));
  }
  const fs::path run_dir = only_run_dir(dir.path);
  const RunJson killed = read_run_json(run_dir);
  BOOST_TEST(killed.state == "running"); // nothing was left to end it
  BOOST_TEST(remote_run(server, killed.id).status == "RUNNING");
  if (sync_between) {
    const auto rec = chorus_cmd({"recover", run_dir.string()});
    BOOST_TEST_INFO_SCOPE(both(rec));
    BOOST_REQUIRE_EQUAL(rec.code, 0);
    const auto sync = chorus_cmd({"sync", run_dir.string(), "--to", url});
    BOOST_TEST_INFO_SCOPE(both(sync));
    BOOST_REQUIRE_EQUAL(sync.code, 0);
    check_mlflow(server, run_dir); // rows 0..499 once, and the end: FAILED
    BOOST_TEST(remote_run(server, killed.id).status == "FAILED");
  }

  // The requeued job holds before its last step until `go` exists, so that
  // the server can be looked at while the second attempt trains.
  const fs::path go = dir.path / "go";
  std::vector<std::string> resumed_env = env;
  resumed_env.push_back("CHORUS_RESUME=allow");
  auto second = launch(dir.path, ranks,
                       {"--steps", std::to_string(steps), "--start-step", std::to_string(checkpoint), "--hold-until",
                        go.string()},
                       resumed_env, same_job);
  // Rows up to 997 commit while the ranks hold at 999 (998 waits for them).
  const bool running_again = eventually(
      [&] {
        for (const MlflowRun& r : server.mlflow_runs()) {
          const auto loss = r.metrics.find("loss");
          if (loss == r.metrics.end()) continue;
          const bool late_rows = std::any_of(loss->second.begin(), loss->second.end(),
                                             [](const MetricPoint& p) { return p.step == steps - 3; });
          if (late_rows) return r.status == "RUNNING";
        }
        return false;
      },
      45s);
  BOOST_TEST(read_run_json(run_dir).state == "running");
  BOOST_TEST(running_again, "the server should show the run RUNNING while its second attempt trains, not "
                                << remote_run(server, killed.id).status);
  { std::ofstream touch(go); }
  const auto out = second->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  BOOST_REQUIRE_EQUAL(only_run_dir(dir.path), run_dir);
  e2e::check_worker_history(run_dir, {0, 1, 2, 3}, steps);
  check_mlflow(server, run_dir); // every value of history.jsonl once, FINISHED, the offsets done
  BOOST_TEST(server.mlflow_runs().size() == 1u);
  const MlflowRun r = remote_run(server, killed.id);
  BOOST_TEST(r.status == "FINISHED");
  // One continuous series per metric: steps 0..999, each once.
  for (const auto& [key, points] : r.metrics) {
    if (key.starts_with("system/")) continue;
    std::vector<std::int64_t> got;
    for (const MetricPoint& p : points) got.push_back(p.step);
    std::sort(got.begin(), got.end());
    std::vector<std::int64_t> want(steps);
    std::iota(want.begin(), want.end(), 0);
    BOOST_TEST((got == want), key << ": " << got.size() << " points, steps " << (got.empty() ? -1 : got.front())
                                  << ".." << (got.empty() ? -1 : got.back()));
  }
}

} // namespace

// 4c.
BOOST_AUTO_TEST_CASE(a_killed_job_requeued_under_its_run_id_uploads_one_run_once) {
  resume_a_killed_uploading_job(false);
}

// 4d. The killed run's end went up (recover, then sync) before the requeue.
BOOST_AUTO_TEST_CASE(a_requeued_run_whose_end_was_uploaded_runs_again_on_the_server_then_finishes) {
  resume_a_killed_uploading_job(true);
}

// 4e. A job made offline is killed for real while its rows 0..59 are
// committed, and its host had not yet written the last of them to
// history.jsonl (it flushes about once a second): only the WAL holds them.
// `chorus sync` of the run, whose host is gone, rebuilds its files from the
// WAL first: the server gets every committed row once, and the end, FAILED
// (crashed).
BOOST_AUTO_TEST_CASE(sync_of_a_run_whose_host_is_gone_uploads_the_rows_only_its_wal_holds) {
  constexpr int pause_at = 60, flushed = 40;
  TrackingServer server;
  chorus::test::TempDir dir;
  const std::string url = mlflow_url(server.port());
  {
    auto job = launch(dir.path, 2, {"--steps", "100", "--pause-step", std::to_string(pause_at)},
                      {"CHORUS_SYSTEM_INTERVAL=0"});
    const std::string paused = "PAUSED " + std::to_string(pause_at);
    BOOST_REQUIRE_MESSAGE(job->wait_for([&](const std::string& out, const std::string&) {
      return out.find(paused) != std::string::npos;
    }, 120s), "the job never reported " << paused);
    BOOST_REQUIRE(eventually(
        [&] { return file_lines(only_run_dir(dir.path) / "history.jsonl").size() == std::size_t{pause_at}; }, 30s));
    kill_job(job->pid());
    const auto out = job->finish(60s);
    BOOST_TEST_INFO_SCOPE(both(out));
  }
  const fs::path run_dir = only_run_dir(dir.path);
  const RunJson killed = read_run_json(run_dir);
  BOOST_REQUIRE_EQUAL(killed.state, "running"); // nothing was left to end it
  const auto lines = file_lines(run_dir / "history.jsonl");
  std::string first;
  for (int i = 0; i < flushed; ++i) first += lines[static_cast<std::size_t>(i)] + "\n";
  chorus::test::write_text(run_dir / "history.jsonl", first);
  BOOST_REQUIRE_EQUAL(file_lines(run_dir / "history.jsonl").size(), std::size_t{flushed});

  const auto sync = chorus_cmd({"sync", run_dir.string(), "--to", url});
  BOOST_TEST_INFO_SCOPE(both(sync));
  BOOST_REQUIRE_EQUAL(sync.code, 0);
  BOOST_TEST(sync.err.find("rebuilding its files from its write-ahead log") != std::string::npos);
  BOOST_TEST(file_lines(run_dir / "history.jsonl").size() == std::size_t{pause_at});
  BOOST_TEST(read_run_json(run_dir).state == "crashed");
  check_mlflow(server, run_dir); // every value of the rebuilt history once, and the end
  BOOST_TEST(remote_run(server, killed.id).status == "FAILED");
  BOOST_TEST(remote_run(server, killed.id).metrics["loss"].size() == std::size_t{pause_at});
}

// 5. The server misbehaves while the job trains; nothing is lost or doubled
// (an outage at the end: once `chorus sync` has sent the rest).
BOOST_AUTO_TEST_CASE(faults_during_a_live_run_every_point_once) {
  TrackingServer server;
  chorus::test::TempDir dir;
  server.fail_next(3, {500, "", "", "log-batch"});
  // About 8 s of training: two ranks, 200 rows (1400 values) a second, a log-batch or two a second.
  auto job = launch(dir.path, 2, {"--steps", "1600", "--step-us", "5000"}, {"CHORUS_UPLOAD=" + mlflow_url(server.port())});
  // Each fault once the previous one was used up.
  auto next_fault = [&](const char* what, const std::function<void()>& inject) {
    const std::uint64_t before = log_batches(server);
    inject();
    BOOST_TEST(eventually([&] { return log_batches(server) >= before + 2; }, 30s), what << " was used");
  };
  BOOST_TEST(eventually([&] { return log_batches(server) >= 4; }, 30s), "the 500s were used");
  next_fault("a 429 with Retry-After 1", [&] { server.fail_next(1, {429, "", "1", "log-batch"}); });
  next_fault("a reset mid-request", [&] { server.reset_next(1, chorus::test::ResetPoint::after_headers, "log-batch"); });
  next_fault("a reset after the batch was stored",
             [&] { server.reset_next(1, chorus::test::ResetPoint::after_handling, "log-batch"); });
  const std::size_t runs_before = e2e::find_runs(dir.path).size();
  BOOST_TEST(runs_before == 1u);
  const bool training = read_run_json(only_run_dir(dir.path)).state == "running";
  server.outage(3s);
  BOOST_TEST_MESSAGE("the outage began " << (training ? "while training" : "after training"));
  const auto out = job->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  const fs::path run_dir = only_run_dir(dir.path);
  e2e::check_worker_history(run_dir, {0, 1}, 1600);
  // An outage still on at the run's end leaves the rest to `chorus sync`:
  // the finish does not wait for a server that refuses connections.
  if (out.err.find("not uploaded yet") != std::string::npos) {
    BOOST_TEST_MESSAGE("the finish left the rest for chorus sync");
    BOOST_REQUIRE(eventually([&] { return !server.in_outage(); }, 30s));
    const auto sync = chorus_cmd({"sync", run_dir.string(), "--to", mlflow_url(server.port())});
    BOOST_TEST_INFO_SCOPE(both(sync));
    BOOST_REQUIRE_EQUAL(sync.code, 0);
  }
  check_mlflow(server, run_dir);
  BOOST_TEST(server.mlflow_runs().size() == 1u);
  BOOST_TEST(out.err.find("retrying") != std::string::npos);
}

// 6. A per-rank job made offline; `chorus sync GROUP` uploads both runs, and
// a second sync sends nothing.
BOOST_AUTO_TEST_CASE(sync_of_a_group_uploads_each_run_once) {
  chorus::test::TempDir dir;
  auto job = launch(dir.path, 2, {"--steps", "150"}, {"CHORUS_MODE=new"});
  const auto out = job->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  const auto runs = e2e::find_runs(dir.path);
  BOOST_REQUIRE_EQUAL(runs.size(), 2u);
  BOOST_REQUIRE_EQUAL(runs[0].parent_path(), runs[1].parent_path());
  for (const fs::path& r : runs) BOOST_TEST(!fs::exists(r / "upload"));

  TrackingServer server;
  const std::string url = mlflow_url(server.port());
  const auto sync = chorus_cmd({"sync", runs[0].parent_path().string(), "--to", url});
  BOOST_TEST_INFO_SCOPE(both(sync));
  BOOST_REQUIRE_EQUAL(sync.code, 0);
  BOOST_TEST(server.mlflow_runs().size() == 2u);
  for (const fs::path& r : runs) check_mlflow(server, r);

  const auto before = server.stats().requests;
  const auto again = chorus_cmd({"sync", runs[0].parent_path().string(), "--to", url});
  BOOST_TEST_INFO_SCOPE(both(again));
  BOOST_TEST(again.code == 0);
  BOOST_TEST(server.stats().requests == before);
  BOOST_TEST(server.mlflow_runs().size() == 2u);
}

// 7. What `chorus sync` refuses, and how it says so.
BOOST_AUTO_TEST_CASE(sync_refuses_bad_input_naming_the_fix) {
  chorus::test::TempDir dir;
  auto job = launch(dir.path, 1, {"--steps", "10"}, {});
  const auto out = job->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  const fs::path run_dir = only_run_dir(dir.path);
  TrackingServer server;
  const std::string port = std::to_string(server.port());

  {
    const auto o = chorus_cmd({"sync", run_dir.string(), "--to", "http://127.0.0.1:" + port});
    BOOST_TEST_INFO_SCOPE(both(o));
    BOOST_TEST(o.code == 2);
    BOOST_TEST(o.err.find("mlflow://HOST:PORT") != std::string::npos);
    BOOST_TEST(o.err.find("wandb://HOST") != std::string::npos);
  }
  {
    const auto o = chorus_cmd({"sync", run_dir.string(), "--to", "wandb+http://api:hunter2-e2e@127.0.0.1:" + port},
                              {"WANDB_API_KEY=" + TrackingServer::Options().wandb_api_key});
    BOOST_TEST_INFO_SCOPE(both(o));
    BOOST_TEST(o.code == 2);
    BOOST_TEST(o.err.find("credentials") != std::string::npos);
    BOOST_TEST(o.err.find("WANDB_API_KEY") != std::string::npos);
    BOOST_TEST(o.out.find("hunter2") == std::string::npos);
    BOOST_TEST(o.err.find("hunter2") == std::string::npos);
  }
  {
    const auto o = chorus_cmd({"sync", run_dir.string(), "--to", "wandb+http://127.0.0.1:" + port + "/team"});
    BOOST_TEST_INFO_SCOPE(both(o));
    BOOST_TEST(o.code == 1);
    BOOST_TEST(o.err.find("WANDB_API_KEY") != std::string::npos);
  }
  {
    const auto o = chorus_cmd({"sync", "nosuchrun", "--dir", dir.str(), "--to", mlflow_url(server.port())});
    BOOST_TEST_INFO_SCOPE(both(o));
    BOOST_TEST(o.code == 1);
    BOOST_TEST(o.err.find("nosuchrun") != std::string::npos);
  }
  // None of it reached the server.
  BOOST_TEST(server.stats().requests == 0u);
}

namespace {

/// A one-rank run of `steps` made under `dir` without uploading: its directory.
fs::path offline_run(const chorus::test::TempDir& dir, int steps) {
  auto job = launch(dir.path, 1, {"--steps", std::to_string(steps)}, {});
  const auto out = job->finish(120s);
  BOOST_TEST_INFO_SCOPE(both(out));
  BOOST_REQUIRE_EQUAL(out.code, 0);
  return only_run_dir(dir.path);
}

} // namespace

BOOST_AUTO_TEST_CASE(sync_against_a_slow_server_gives_each_request_its_own_time) {
  // Every answer takes 300 ms, more than the 250 ms sync waits between looks
  // at its progress: that slice never cuts a request in flight.
  chorus::test::TempDir dir;
  const fs::path run_dir = offline_run(dir, 300);
  TrackingServer server;
  server.set_delay(300ms);
  const auto sync = chorus_cmd({"sync", run_dir.string(), "--to", mlflow_url(server.port()), "--timeout", "120"});
  BOOST_TEST_INFO_SCOPE(both(sync));
  BOOST_REQUIRE_EQUAL(sync.code, 0);
  check_mlflow(server, run_dir);
  BOOST_TEST(server.mlflow_runs().size() == 1u);
}

BOOST_AUTO_TEST_CASE(sync_says_what_must_change_when_syncing_again_cannot_go_on) {
  chorus::test::TempDir dir;
  const fs::path run_dir = offline_run(dir, 10);
  TrackingServer server;
  server.fail_next(1, {400, R"({"error_code": "INVALID_PARAMETER_VALUE", "message": "end_time refused"})", "", "runs/update"});
  const auto sync = chorus_cmd({"sync", run_dir.string(), "--to", mlflow_url(server.port())});
  BOOST_TEST_INFO_SCOPE(both(sync));
  BOOST_TEST(sync.code == 1);
  BOOST_TEST(sync.err.find("end_time refused") != std::string::npos);
  BOOST_TEST(sync.err.find("once what is named here is changed") != std::string::npos);
  BOOST_TEST(sync.err.find("run `chorus sync` again") == std::string::npos);
  // Every point is there; the end state is not.
  const auto status = chorus_cmd({"sync", "--status", run_dir.string()});
  BOOST_TEST_INFO_SCOPE(both(status));
  BOOST_TEST(status.out.find("finished, end state not yet delivered") != std::string::npos);
  BOOST_TEST(status.out.find("no end state yet") == std::string::npos);
}
