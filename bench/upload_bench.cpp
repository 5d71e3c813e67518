// bench_upload: the upload path (README's uploads; BENCHMARKS.md's targets).
//
// 1. Throughput. A run directory written by hand (200 000 history rows of
//    10 keys: 2 M points) is delivered by upload::Uploader to the loopback
//    tracking server of the upload tests (tests/upload/tracking_server.hpp),
//    in this process: MLflow (log-batch, 999 metrics a request) and W&B
//    (file_stream, CHORUS_WANDB_INTERVAL=0). Timed from open() until caught
//    up; points, requests, bytes and connections counted. The reference,
//    measured in the same run: the very request bodies the Uploader sent
//    (captured once, before the timed runs), posted by a bare libcurl loop
//    on one keep-alive handle to a fresh server: no reading, no JSON
//    building, the floor of the server and HTTP. CPU time is split into the
//    client's thread and the rest of the process (the server's threads).
//    Median of the repetitions, ours and the reference taking turns. The
//    server thinks `--think` ms (default 10) before it answers each request,
//    as a real MLflow with its SQL store does: the reference then waits that
//    long a request, one at a time; the Uploader keeps 4 log-batches in flight.
// 2. Memory with the server down. A real single-process run (this binary
//    again, `--log`), logging 10 scalars a call flat out, uploading to the
//    tracking server, which goes down (an outage: connections refused) once
//    it has taken the first log-batches (the Uploader holds its slices) and
//    stays down to the end of the run; the process's RSS sampled every second. The reference: the same run with no upload
//    target. Then the server comes back and upload::Uploader (what `chorus sync`
//    runs) catches up on the run directory for a while: points/s.
//
//   bench_upload [--think MS]                     the benchmark
//   bench_upload --throughput | --memory [--think MS]  one part of it
//   bench_upload --log DIR SECONDS [URL]          one run (what it starts)
#include "bench.hpp"

#include "io/platform/files.hpp"
#include "io/platform/posix.hpp"
#include "io/store/run_record.hpp"
#include "io/upload/upload.hpp"
#include "runtime/core/json.hpp"
#include "tests/upload/tracking_server.hpp"

#include <chorus/chorus.hpp>

#include <curl/curl.h>
#include <time.h>

#include <array>
#include <atomic>
#include <cmath>
#include <functional>
#include <string>
#include <thread>

namespace {

using bench::num;
using namespace std::chrono_literals;

constexpr int history_rows = 200'000;
constexpr int history_keys = 10;
constexpr int reps = 3;

constexpr double log_seconds = 20;   // each logging run
constexpr int live_batches = 20;     // the stalled run's log-batches the server takes before its outage
constexpr double warmup_s = 5;       // RSS growth is measured from here to the end
constexpr double catch_up_s = 5;     // the backlog delivered after the outage, at most this long
constexpr std::int64_t rss_budget = 64ll << 20; // BENCHMARKS.md's target: bounded by config, default <= 64 MiB

std::chrono::milliseconds think{10}; // the throughput servers' time per request before answering (--think)

/// A tracking server for the throughput part: it thinks before every answer.
struct ThinkingServer : chorus::test::TrackingServer {
  explicit ThinkingServer(chorus::test::TrackingServer::Options o = {}) : TrackingServer(std::move(o)) {
    if (think.count() > 0) set_delay(think);
  }
};

const char* const keys[history_keys] = {"train/loss",       "train/lr",        "train/grad_norm", "train/tokens_per_s",
                                        "train/step_time",  "eval/loss",       "eval/accuracy",   "gpu/mem_gb",
                                        "throughput/tflops", "loss_scale"};

std::int64_t cpu_ns(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

std::string with_commas(double v) {
  std::string digits = num(v, 0), out;
  const bool neg = !digits.empty() && digits[0] == '-';
  if (neg) digits.erase(0, 1);
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return neg ? "-" + out : out;
}

// ---------------------------------------------------------------------------
// A run directory, as the run host writes one.

struct HandRun {
  bench::fs::path dir;
  std::uint64_t history_bytes = 0;

  explicit HandRun(const bench::fs::path& root) {
    dir = root / "bench" / "grp" / "run-upload";
    bench::fs::create_directories(dir);
    chorus::store::RunRecord run;
    run.id = run.name = "run-upload";
    run.project = "bench";
    run.group = "grp";
    run.mode = "shared";
    run.scope = "global";
    run.host = "bench-host";
    run.state = "running";
    run.start_us = 1'700'000'000'000'000;
    run.world_size = 1;
    std::string out = run.json();
    out.push_back('\n');
    write("run.json", out);
    out.clear();
    chorus::core::JsonWriter(out).begin_object().key("lr").number(3e-4).key("batch_size").integer(256).end_object();
    out.push_back('\n');
    write("config.json", out);

    // Values as a trainer logs them: full-precision doubles.
    std::string rows;
    rows.reserve(std::size_t{history_rows} * 420);
    for (int s = 0; s < history_rows; ++s) {
      chorus::core::JsonWriter w(rows);
      const double t = 0.0125 * s;
      w.begin_object().key("_step").integer(s).key("_timestamp").number(1'700'000'000.0 + t).key("_runtime").number(t);
      const double decay = std::exp(-s / 60'000.0);
      for (int k = 0; k < history_keys; ++k)
        w.key(keys[k]).number((k + 1) * decay + 1e-3 * std::sin(s * 0.37 + k));
      w.end_object();
      rows.push_back('\n');
    }
    history_bytes = rows.size();
    write("history.jsonl", rows);
  }

  void write(const char* name, const std::string& text) const {
    if (chorus::Error e = chorus::platform::write_file_atomic((dir / name).string(), text)) {
      std::fprintf(stderr, "%s\n", e.message().c_str());
      std::exit(2);
    }
  }

  /// Forgets every upload (the offsets and the lock), so the next Uploader starts from the beginning.
  void forget_uploads() const {
    std::error_code ec;
    bench::fs::remove_all(dir / "upload", ec);
  }
};

chorus::upload::UploadTarget parse_target(const std::string& url) {
  auto t = chorus::upload::UploadTarget::parse(url);
  if (!t) {
    std::fprintf(stderr, "%s\n", t.error().message().c_str());
    std::exit(2);
  }
  return *t;
}

std::string mlflow_url(const chorus::test::TrackingServer& s) { return "mlflow://127.0.0.1:" + std::to_string(s.port()); }
std::string wandb_url(const chorus::test::TrackingServer& s) { return "wandb+http://127.0.0.1:" + std::to_string(s.port()); }

/// One timed delivery.
struct Timing {
  double wall_s = 0;
  double client_cpu_s = 0; // the thread that reads, builds and sends
  double process_cpu_s = 0; // everything: the client and the server's threads
  std::uint64_t points = 0, requests = 0, connections = 0, bytes = 0;
  bool ok = true;
  std::string error;
};

struct Clocks {
  std::int64_t wall = bench::now_ns(), thread = cpu_ns(CLOCK_THREAD_CPUTIME_ID), process = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
  void stop(Timing& t) const {
    t.wall_s = static_cast<double>(bench::now_ns() - wall) / 1e9;
    t.client_cpu_s = static_cast<double>(cpu_ns(CLOCK_THREAD_CPUTIME_ID) - thread) / 1e9;
    t.process_cpu_s = static_cast<double>(cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - process) / 1e9;
  }
};

/// upload::Uploader from the start of the run directory until caught up.
Timing upload_all(const HandRun& run, const std::string& url, chorus::test::TrackingServer& server) {
  Timing t;
  run.forget_uploads();
  const auto before = server.stats();
  Clocks c;
  chorus::upload::Uploader up(run.dir.string(), parse_target(url));
  if (chorus::Error e = up.open()) {
    t.ok = false;
    t.error = e.message();
    return t;
  }
  const auto limit = std::chrono::steady_clock::now() + 300s;
  for (;;) {
    const auto p = up.pump(limit);
    if (p.caught_up || p.done) break;
    if (p.stopped || std::chrono::steady_clock::now() >= limit) {
      t.ok = false;
      t.error = p.error.empty() ? "ran out of time" : p.error;
      break;
    }
    if (p.wait_until) std::this_thread::sleep_until(*p.wait_until);
  }
  c.stop(t);
  const auto after = server.stats();
  t.points = up.state().points;
  t.requests = after.requests - before.requests;
  t.connections = after.connections - before.connections;
  return t;
}

// ---------------------------------------------------------------------------
// The reference: recorded bodies, posted by a bare libcurl loop.

struct Recorded {
  std::string method, target, body;
};

/// Every request the Uploader makes for the run, recorded by a server that keeps them.
std::vector<Recorded> capture(const HandRun& run, bool wandb, Timing& t) {
  chorus::test::TrackingServer::Options o;
  o.record_requests = true;
  ThinkingServer server(o);
  t = upload_all(run, wandb ? wandb_url(server) : mlflow_url(server), server);
  std::vector<Recorded> out;
  for (auto& r : server.requests()) out.push_back({r.method, r.target, std::move(r.body)});
  return out;
}

class Curl {
public:
  explicit Curl(std::string base, std::string user_password = {})
      : base_(std::move(base)), userpwd_(std::move(user_password)) {
    h_ = curl_easy_init();
    headers_ = curl_slist_append(headers_, "Content-Type: application/json");
    headers_ = curl_slist_append(headers_, "Expect:");
    curl_easy_setopt(h_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h_, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h_, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(h_, CURLOPT_WRITEFUNCTION, &Curl::on_body);
    curl_easy_setopt(h_, CURLOPT_WRITEDATA, &answer_);
    if (!userpwd_.empty()) curl_easy_setopt(h_, CURLOPT_USERPWD, userpwd_.c_str());
  }
  ~Curl() {
    curl_slist_free_all(headers_);
    curl_easy_cleanup(h_);
  }
  Curl(const Curl&) = delete;
  Curl& operator=(const Curl&) = delete;

  /// The status, 0 if no answer; the answer's body in answer().
  long send(const std::string& method, const std::string& target, const std::string& body) {
    answer_.clear();
    url_ = base_;
    url_ += target;
    curl_easy_setopt(h_, CURLOPT_URL, url_.c_str());
    if (method == "POST") {
      curl_easy_setopt(h_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
      curl_easy_setopt(h_, CURLOPT_POSTFIELDS, body.data());
    } else {
      curl_easy_setopt(h_, CURLOPT_HTTPGET, 1L);
    }
    if (curl_easy_perform(h_) != CURLE_OK) return 0;
    long status = 0;
    curl_easy_getinfo(h_, CURLINFO_RESPONSE_CODE, &status);
    return status;
  }
  [[nodiscard]] const std::string& answer() const { return answer_; }

private:
  static std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
    static_cast<std::string*>(user)->append(data, size * n);
    return size * n;
  }
  CURL* h_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::string base_, userpwd_, url_, answer_;
};

std::string json_field(const std::string& json, const std::string& name) {
  const std::string pat = "\"" + name + "\"";
  std::size_t at = json.find(pat);
  if (at == std::string::npos) return {};
  at = json.find('"', json.find(':', at + pat.size()) + 1);
  const std::size_t end = json.find('"', at + 1);
  return json.substr(at + 1, end - at - 1);
}

/// The recorded log-batch (MLflow) or file_stream (W&B) bodies posted to a
/// fresh server; what sets up the remote run first is not timed.
Timing post_bare(const std::vector<Recorded>& recorded, bool wandb) {
  Timing t;
  ThinkingServer server;
  Curl curl(server.base_url(), wandb ? "api:chorus-test-key" : "");
  std::vector<const Recorded*> timed;
  std::string old_run, new_run;
  for (const Recorded& r : recorded) {
    const bool data = wandb ? r.target.find("/file_stream") != std::string::npos
                            : r.target.find("runs/log-batch") != std::string::npos &&
                                  r.body.find("\"metrics\"") != std::string::npos;
    if (data) {
      timed.push_back(&r);
      continue;
    }
    if (!timed.empty()) break; // the set-up comes before the points
    // As the Uploader did (experiments/get-by-name answers 404 on a fresh server, then it is created).
    const long status = curl.send(r.method, r.target, r.body);
    if (status == 0) {
      t.ok = false;
      t.error = "set-up request " + r.target + " had no answer";
      return t;
    }
    if (!wandb && r.target.find("runs/create") != std::string::npos) new_run = json_field(curl.answer(), "run_id");
  }
  if (!wandb && new_run.empty()) {
    t.ok = false;
    t.error = "the set-up made no run";
    return t;
  }
  // MLflow: the bodies name the run the capture made; this server made another (same length).
  std::vector<std::string> bodies;
  for (const Recorded* r : timed) {
    std::string b = r->body;
    if (!wandb) {
      if (old_run.empty()) old_run = json_field(b, "run_id");
      if (const std::size_t at = b.find(old_run); at != std::string::npos && !new_run.empty())
        b.replace(at, old_run.size(), new_run);
    }
    t.bytes += b.size();
    bodies.push_back(std::move(b));
  }
  const auto before = server.stats();
  Clocks c;
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    const long status = curl.send("POST", timed[i]->target, bodies[i]);
    if (status != 200) {
      t.ok = false;
      t.error = "request " + std::to_string(i) + " answered " + std::to_string(status) + ": " + curl.answer();
      break;
    }
  }
  c.stop(t);
  const auto after = server.stats();
  t.requests = after.requests - before.requests;
  t.connections = after.connections; // the set-up's included: one keep-alive connection for all
  return t;
}

/// Lines of history the server has for the run, for checking a W&B delivery.
std::size_t wandb_lines(const chorus::test::TrackingServer& server) {
  std::size_t n = 0;
  for (const auto& r : server.wandb_runs()) n += r.history.size();
  return n;
}

struct Series {
  std::vector<double> wall, client, process;
  void add(const Timing& t) {
    wall.push_back(t.wall_s);
    client.push_back(t.client_cpu_s);
    process.push_back(t.process_cpu_s);
  }
};

// Throughput of one backend; false if a delivery failed or lost points.
bool throughput(const HandRun& run, bool wandb, bench::Table& table, std::vector<std::string>& ratios) {
  const char* name = wandb ? "W&B file_stream" : "MLflow log-batch";
  const std::uint64_t points = std::uint64_t{history_rows} * history_keys;
  Timing cap;
  const auto recorded = capture(run, wandb, cap);
  std::uint64_t data_requests = 0, bytes = 0;
  for (const Recorded& r : recorded)
    if (wandb ? r.target.find("/file_stream") != std::string::npos : r.target.find("runs/log-batch") != std::string::npos) {
      ++data_requests;
      bytes += r.body.size();
    }
  if (!cap.ok || cap.points != points) {
    std::printf("%s: the capture run FAILED (%s; %llu points of %llu)\n", name, cap.error.c_str(),
                static_cast<unsigned long long>(cap.points), static_cast<unsigned long long>(points));
    return false;
  }
  Series ours, bare;
  Timing last_ours, last_bare;
  bool ok = true;
  for (int rep = 0; rep < reps; ++rep) {
    {
      ThinkingServer server;
      Timing t = upload_all(run, wandb ? wandb_url(server) : mlflow_url(server), server);
      // Every point arrived once.
      if (wandb) {
        if (wandb_lines(server) != static_cast<std::size_t>(history_rows)) t.ok = false, t.error = "lines missing";
      } else {
        const auto runs = server.mlflow_runs();
        if (runs.size() != 1 || runs[0].metrics.size() != history_keys) {
          t.ok = false, t.error = "keys missing";
        } else {
          for (const auto& [k, v] : runs[0].metrics)
            if (v.size() != static_cast<std::size_t>(history_rows)) t.ok = false, t.error = "points missing for " + k;
        }
      }
      if (!t.ok || t.points != points) {
        std::printf("%s: the upload FAILED (%s)\n", name, t.error.c_str());
        ok = false;
      }
      ours.add(t);
      last_ours = t;
    }
    Timing b = post_bare(recorded, wandb);
    if (!b.ok) {
      std::printf("%s: the reference FAILED (%s)\n", name, b.error.c_str());
      ok = false;
    }
    bare.add(b);
    last_bare = b;
  }
  const double wall = bench::median(ours.wall), bare_wall = bench::median(bare.wall);
  const double n_req = static_cast<double>(last_ours.requests);
  const double lines = history_rows;
  auto row = [&](const std::string& what, const Series& s, const Timing& last, double req) {
    const double w = bench::median(s.wall);
    table.add({std::string(name) + ", " + what, with_commas(static_cast<double>(points) / w),
               with_commas(lines / w), num(w, 3), num(bench::median(s.client) / req * 1e6, 1),
               num((bench::median(s.process) - bench::median(s.client)) / req * 1e6, 1), num(req, 0),
               num(mib(static_cast<double>(bytes)), 1), num(static_cast<double>(last.connections), 0),
               num(w / bare_wall, 2)});
  };
  row("upload::Uploader", ours, last_ours, n_req);
  row("reference (bare libcurl)", bare, last_bare, static_cast<double>(last_bare.requests));
  ratios.push_back(std::string(name) + ": " + num(bare_wall / wall * 100.0, 1) + " % of the floor's rate (" +
                   num(wall / bare_wall, 2) + "x its time); " + std::to_string(data_requests) + " data requests of " +
                   std::to_string(last_ours.requests) + "; runs " + [&] {
                     std::string s;
                     for (std::size_t i = 0; i < ours.wall.size(); ++i)
                       s += (i ? ", " : "") + num(ours.wall[i], 3) + "/" + num(bare.wall[i], 3);
                     return s + " s (ours/reference)";
                   }());
  bench::report(wandb ? "wandb_points_per_s" : "mlflow_points_per_s", static_cast<double>(points) / wall);
  return ok;
}

// ---------------------------------------------------------------------------
// Memory: one logging run (a child process).

std::int64_t rss_bytes() {
  std::ifstream in("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

std::int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

int log_main(const char* dir, double seconds, const char* url) {
  chorus::Options opt;
  opt.read_env = false;
  opt.topology = chorus::Topology{};
  opt.dir = dir;
  opt.project = "bench";
  opt.mode = chorus::Mode::shared;
  opt.system_interval = 0;
  if (url != nullptr) opt.upload = url;
  opt.upload_timeout = 1s; // the server is down at the end: the rest stays on disk
  chorus::Error err;
  chorus::Run run = chorus::init(opt, err);
  if (err) {
    std::fprintf(stderr, "init failed: %s\n", err.message().c_str());
    return 3;
  }
  std::vector<std::int64_t> rss{rss_bytes()};
  std::atomic<bool> stop{false};
  std::thread sampler([&] {
    auto next = std::chrono::steady_clock::now() + 1s;
    while (!stop.load()) {
      std::this_thread::sleep_until(next);
      next += 1s;
      if (!stop.load()) rss.push_back(rss_bytes());
    }
  });
  std::array<chorus::Metric, history_keys> m;
  for (int k = 0; k < history_keys; ++k) m[k] = {keys[k], 0.0};
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::uint64_t calls = 0;
  const std::int64_t t0 = bench::now_ns();
  while (true) {
    for (int i = 0; i < 256; ++i) {
      for (int k = 0; k < history_keys; ++k) m[k].value = static_cast<double>(calls) * 1e-3 + k;
      (void)run.log(m);
      ++calls;
    }
    if (std::chrono::steady_clock::now() >= end) break;
  }
  const std::int64_t t1 = bench::now_ns();
  stop = true;
  sampler.join();
  const std::int64_t f0 = bench::now_ns();
  chorus::FinishResult f = run.finish().wait();
  const std::int64_t f1 = bench::now_ns();
  if (f.error) {
    std::fprintf(stderr, "finish: %s\n", f.error.message().c_str());
    return 5;
  }
  for (std::size_t i = 0; i < rss.size(); ++i) bench::report(("rss_" + std::to_string(i)).c_str(), static_cast<double>(rss[i]));
  bench::report("rss_samples", static_cast<double>(rss.size()));
  bench::report("rss_after_finish", static_cast<double>(rss_bytes()));
  bench::report("peak_rss", static_cast<double>(peak_rss_bytes()));
  bench::report("values", static_cast<double>(calls * history_keys));
  bench::report("rows", static_cast<double>(f.rows));
  bench::report("dropped", static_cast<double>(f.dropped));
  bench::report("log_s", static_cast<double>(t1 - t0) / 1e9);
  bench::report("finish_s", static_cast<double>(f1 - f0) / 1e9);
  std::error_code ec;
  bench::report("history_bytes", static_cast<double>(bench::fs::file_size(bench::fs::path(f.run_dir) / "history.jsonl", ec)));
  std::printf("run_dir=%s\n", f.run_dir.c_str());
  return 0;
}

struct LogRun {
  bool ok = false;
  std::map<std::string, double> f;
  std::vector<double> rss;
  std::string output;
  [[nodiscard]] double at(double s) const { // the sample taken s seconds into the logging
    const auto i = static_cast<std::size_t>(std::lround(s));
    return rss.empty() ? 0 : rss[std::min(i, rss.size() - 1)];
  }
};

LogRun read_log_run(bench::Job& job) {
  LogRun r;
  r.ok = job.wait();
  r.f = job.figures(0);
  r.output = job.output(0);
  for (int i = 0; i < static_cast<int>(r.f["rss_samples"]); ++i) r.rss.push_back(r.f["rss_" + std::to_string(i)]);
  return r;
}

std::string run_dir_of(const std::string& output) {
  const auto at = output.find("run_dir=");
  if (at == std::string::npos) return {};
  return output.substr(at + 8, output.find('\n', at) - at - 8);
}

bool memory() {
  std::printf("\nmemory with the server down: one process logging %d scalars a call flat out for %.0f s "
              "(system_interval = 0); RSS from /proc/self/statm every second\n",
              history_keys, log_seconds);
  std::printf("  stalled: uploads to the tracking server, which goes down once it has taken %d log-batches "
              "(connections refused) and stays down past the run's end\n",
              live_batches);
  std::printf("  reference: the same run with no upload target\n\n");
  bool ok = true;

  bench::TempDir ref_dir;
  bench::Job ref_job(1, {"--log", (ref_dir.path / "runs").string(), num(log_seconds, 1)}, {}, ref_dir.path);
  LogRun ref = read_log_run(ref_job);
  {
    std::error_code ec;
    bench::fs::remove_all(ref_dir.path / "runs", ec); // gigabytes: gone before the next run writes as much
  }

  chorus::test::TrackingServer server;
  const std::string url = mlflow_url(server);
  bench::TempDir dir;
  bench::Job job(1, {"--log", (dir.path / "runs").string(), num(log_seconds, 1), url}, {}, dir.path);
  // The live Uploader has opened the remote run and reads its slices when the server goes.
  const auto started = std::chrono::steady_clock::now();
  auto batches = [&] {
    const auto k = server.stats().by_kind;
    const auto it = k.find("mlflow/runs/log-batch");
    return it == k.end() ? std::uint64_t{0} : it->second;
  };
  while (batches() < live_batches && std::chrono::steady_clock::now() - started < 15s)
    std::this_thread::sleep_for(10ms);
  const auto up_stats = server.stats();
  const double up_for = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // Down until after the run has finished (its finish waits 1 s for the upload).
  server.outage(std::chrono::milliseconds(static_cast<std::int64_t>((log_seconds - up_for + 4) * 1000)));
  const auto down_at = std::chrono::steady_clock::now();
  LogRun stalled = read_log_run(job);
  const double down_for = std::chrono::duration<double>(std::chrono::steady_clock::now() - down_at).count();
  if (!ref.ok || !stalled.ok || ref.rss.size() < 6 || stalled.rss.size() < 6) {
    std::printf("a logging run FAILED:\n%s\n%s\n", ref.output.c_str(), stalled.output.c_str());
    return false;
  }

  bench::Table t({"run", "values logged", "values/s", "history.jsonl MiB", "RSS start MiB", "at 5 s", "at end",
                  "growth 5 s -> end", "peak (VmHWM)", "finish s"});
  auto add = [&](const char* name, const LogRun& r) {
    const double end = r.rss.back();
    t.add({name, with_commas(r.f.at("values")), with_commas(r.f.at("values") / r.f.at("log_s")),
           num(mib(r.f.at("history_bytes")), 0), num(mib(r.rss.front()), 1), num(mib(r.at(warmup_s)), 1),
           num(mib(end), 1), num(mib(end - r.at(warmup_s)), 1), num(mib(r.f.at("peak_rss")), 1),
           num(r.f.at("finish_s"), 2)});
  };
  add("reference (no upload)", ref);
  add("stalled upload", stalled);
  t.print();
  std::string series = "  RSS every second, MiB (stalled): ";
  for (std::size_t i = 0; i < stalled.rss.size(); ++i) series += (i ? " " : "") + num(mib(stalled.rss[i]), 0);
  std::printf("%s\n", series.c_str());
  series = "  RSS every second, MiB (reference): ";
  for (std::size_t i = 0; i < ref.rss.size(); ++i) series += (i ? " " : "") + num(mib(ref.rss[i]), 0);
  std::printf("%s\n", series.c_str());

  const double held = stalled.rss.back() - ref.rss.back();
  const double growth = (stalled.rss.back() - stalled.at(warmup_s)) - (ref.rss.back() - ref.at(warmup_s));
  const bool bounded = held <= static_cast<double>(rss_budget);
  const bool flat = growth <= 2.0 * 1024 * 1024;
  std::printf("\nthe upload's share at the end (stalled - reference): %.1f MiB -> target <= %lld MiB: %s\n", mib(held),
              static_cast<long long>(rss_budget >> 20), bench::verdict(bounded).c_str());
  std::printf("growth after the warm-up beyond the reference's: %.1f MiB -> target: none (<= 2 MiB of noise): %s\n",
              mib(growth), bench::verdict(flat).c_str());
  ok = ok && bounded && flat;
  bench::report("stalled_rss_end_mib", mib(stalled.rss.back()));
  bench::report("upload_share_mib", mib(held));
  bench::report("growth_mib", mib(growth));

  // The server comes back; what the live upload left is caught up by
  // upload::Uploader on the directory (what `chorus sync` runs): the live
  // Uploader would wait for its next attempt, up to backoff_max (60 s).
  std::fflush(stdout);
  while (server.in_outage()) std::this_thread::sleep_for(50ms);
  const std::string run_dir = run_dir_of(stalled.output);
  chorus::upload::Uploader up(run_dir, parse_target(url));
  if (chorus::Error e = up.open()) {
    std::printf("catching up FAILED: %s\n", e.message().c_str());
    return false;
  }
  const double delivered_live = static_cast<double>(up.state().points);
  const double logged = stalled.f.at("values");
  Clocks c;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(catch_up_s);
  chorus::upload::Uploader::Progress p;
  while (std::chrono::steady_clock::now() < std::chrono::time_point_cast<std::chrono::steady_clock::duration>(deadline)) {
    p = up.pump(std::chrono::time_point_cast<std::chrono::steady_clock::duration>(deadline));
    if (p.done || p.stopped || p.caught_up) break;
    if (p.wait_until) std::this_thread::sleep_until(*p.wait_until);
  }
  Timing tc;
  c.stop(tc);
  const double caught = static_cast<double>(up.state().points) - delivered_live;
  const double rate = caught / tc.wall_s;
  const double left = logged - static_cast<double>(up.state().points);
  std::printf("\nbefore the outage the live upload delivered %s values (%llu requests in the first %.1f s); the "
              "server was down %.1f s\n",
              with_commas(delivered_live).c_str(), static_cast<unsigned long long>(up_stats.requests), up_for,
              down_for);
  if (delivered_live == 0) {
    std::printf("the live upload FAILED to start before the outage: the memory figures above are of an Uploader "
                "that held no slice\n");
    ok = false;
  }
  std::printf("after it (upload::Uploader on the run directory, as `chorus sync`, for up to %.0f s): %s values in %.2f s "
              "= %s values/s%s; %s values left (%.0f s more at that rate)\n",
              catch_up_s, with_commas(caught).c_str(), tc.wall_s, with_commas(rate).c_str(),
              p.stopped ? (" (STOPPED: " + p.error + ")").c_str() : "", with_commas(left).c_str(), left / rate);
  bench::report("catch_up_points_per_s", rate);
  return ok && !p.stopped;
}

} // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--log")
    return log_main(argv[2], std::strtod(argv[3], nullptr), argc >= 5 ? argv[4] : nullptr);

  ::setenv("WANDB_API_KEY", "chorus-test-key", 1); // the test server's
  ::setenv("CHORUS_WANDB_INTERVAL", "0", 1);
  std::printf("bench_upload: points per second delivered to the loopback tracking server, and the memory held while "
              "it is down\n\n");
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--think" && i + 1 < argc) think = std::chrono::milliseconds(std::atoi(argv[++i]));
    else only = a;
  }
  bool ok = true;
  if (only != "--memory") {
    bench::TempDir root;
    const std::int64_t w0 = bench::now_ns();
    HandRun run(root.path);
    std::printf("a run directory written by hand: %d history rows x %d keys = %s points, history.jsonl %.1f MiB "
                "(written in %.2f s)\n",
                history_rows, history_keys, with_commas(double{history_rows} * history_keys).c_str(),
                mib(static_cast<double>(run.history_bytes)), static_cast<double>(bench::now_ns() - w0) / 1e9);
    std::printf("upload::Uploader, default settings (read_bytes 4 MiB a file a slice), from open() until caught up; the "
                "reference posts the same bodies (captured in a run before) with a bare libcurl loop, one request at "
                "a time, to a fresh server; median of %d, taking turns; the server thinks %lld ms a request\n\n",
                reps, static_cast<long long>(think.count()));
    bench::Table t({"case", "points/s", "lines/s", "s", "client CPU us/req", "server CPU us/req", "requests",
                    "body MiB", "connections", "time / reference"});
    std::vector<std::string> ratios;
    ok = throughput(run, false, t, ratios) && ok;
    ok = throughput(run, true, t, ratios) && ok;
    t.print();
    std::printf("\n");
    for (const auto& r : ratios) std::printf("%s\n", r.c_str());
  }

  if (only != "--throughput") ok = memory() && ok;
  std::printf("\n%s\n", ok ? "every check passed" : "SOME CHECKS FAILED");
  return ok ? 0 : 1;
}
