// bench_serve: how fast `chorus serve` answers the requests a page makes.
// Two directories are written first: one run of 1 M rows x 20 metrics (four
// of them reduced, with _count, and four per-rank columns), written by
// chorus's own writer (store::RunWriter: history.jsonl and its block
// summary, history_blocks.jsonl), and 1,000 small runs. A server in this process (cli/serve/server.hpp, on a free loopback
// port, asking for its token as `chorus serve` does) is then asked over
// HTTP, as the page asks (the token in its cookie, and the Accept-Encoding
// a browser sends: gzip, deflate, br; each row says the Content-Encoding the
// answer came in and its size as sent):
//  - the run's page: /api/run (the first one reads an overview and starts
//    indexing the history in the background) and the series of its charts
//    at 700 pixels (first paint); while the index is built, a zoom into 1%
//    read from the file, and the two charts in view at full resolution
//    (exact=1: from the block summary, and the rows after its last block);
//    the time until the index is whole; then the page again,
//    warm;
//  - a zoom into 1% and 0.1% of the steps (points read back from the file),
//    and 10% (from the index);
//  - 1,000 rows appended, then the charts again (only the new lines read);
//  - the runs list of 1,000 runs, cold and warm.
// The files are in the page cache (just written), as a live run's are.
//
//   bench_serve [ROWS]              (default 1000000)
//   bench_serve --write DIR [ROWS]  only writes the two directories, as
//                                   DIR/big and DIR/many, and exits (the data
//                                   of bench/serve_browser_bench.py)
#include "bench.hpp"

#include "cli/serve/index_store.hpp"
#include "cli/serve/server.hpp"
#include "io/store/run_writer.hpp"
#include "runtime/core/history.hpp"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <thread>

namespace {

using bench::num;
namespace fs = std::filesystem;

constexpr int metrics = 20;
constexpr int world = 4;
constexpr int chart_width = 700;

/// The 20 keys: 16 of the run's own (the first four reduced over the ranks)
/// and a per-rank column for each of the 4 ranks.
std::vector<std::string> keys() {
  std::vector<std::string> k = {"train/loss", "train/acc", "train/grad_norm", "train/tokens_per_s",
                                "train/lr",   "train/loss_scale", "val/loss", "val/acc",
                                "opt/m1",     "opt/m2",     "opt/m3",    "opt/m4",
                                "opt/m5",     "opt/m6",     "data/wait_ms", "data/batch"};
  for (int r = 0; r < world; ++r) k.push_back("step_time/rank-" + std::to_string(r));
  return k;
}

void put(std::string& out, double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

std::string run_json(const std::string& id, double start, int rows) {
  std::string ranks;
  for (int r = 0; r < world; ++r)
    ranks += std::string(r ? "," : "") + R"({"rank":)" + std::to_string(r) +
             R"(,"state":"finished","last_step":)" + std::to_string(rows - 1) + R"(,"host":"bench","message":""})";
  return R"({"id":")" + id + R"(","name":")" + id + R"(","project":"bench","group":"g","mode":"shared","scope":"global",)" +
         R"("host":"bench","pid":1,"state":"finished","start_time":)" + std::to_string(start) +
         R"(,"end_time":)" + std::to_string(start + rows * 0.1) + R"(,"world_size":)" + std::to_string(world) +
         R"(,"rows":)" + std::to_string(rows) + R"(,"rejected":0,"ranks":[)" + ranks + "]}\n";
}

/// The value of key `i` at step `s` in the big run.
double value_of(int s, int i) { return std::sin(s * 1e-4 * (i + 1)) * (i + 1) + std::cos(s * 0.37 + i) * 0.05; }

/// Rows [first, last) of the big run's history.
std::string rows_text(int first, int last, const std::vector<std::string>& k) {
  std::string out;
  out.reserve(static_cast<std::size_t>(last - first) * 900);
  for (int s = first; s < last; ++s) {
    out += "{\"_step\":" + std::to_string(s) + ",\"_timestamp\":";
    put(out, 1'700'000'000.0 + s * 0.1 + 0.000123);
    out += ",\"_runtime\":";
    put(out, s * 0.1 + 0.000123);
    for (int i = 0; i < metrics; ++i) {
      out += ",\"" + k[static_cast<std::size_t>(i)] + "\":";
      put(out, value_of(s, i));
    }
    out += ",\"_count\":{";
    for (int i = 0; i < 4; ++i) out += std::string(i ? "," : "") + "\"" + k[static_cast<std::size_t>(i)] + "\":4";
    out += "}}\n";
  }
  return out;
}

/// The big run's files, as chorus's own writer writes them (store::RunWriter:
/// history.jsonl and, beside it, its block summary), rows [0, rows).
void write_big(const fs::path& run, int rows, const std::vector<std::string>& k) {
  chorus::store::RunWriter w(run.string(), [&](std::uint32_t id) { return std::string_view(k[id]); });
  constexpr std::int64_t t0 = 1'700'000'000'000'123; // unix µs
  w.run_start(run_json("big", 1'700'000'000.0, rows), t0, world);
  chorus::core::Row r;
  for (int s = 0; s < rows; ++s) {
    r.step = s;
    r.ts_us = t0 + std::int64_t{s} * 100'000;
    r.runtime_us = std::int64_t{s} * 100'000 + 123;
    r.values.clear();
    // In the keys' order, not by name as the Merger hands them over: the
    // page draws the charts in the order the history names its keys, and
    // the charts in view stay the ones of the figures before (train/...).
    for (std::uint32_t i = 0; i < k.size(); ++i)
      r.values.push_back({i, -1, value_of(s, static_cast<int>(i)), i < 4 ? 4u : 0u}); // the first four reduced
    w.row(r);
  }
  w.run_end(chorus::RunState::finished, t0 + std::int64_t{rows} * 100'000);
  if (w.error()) {
    std::fprintf(stderr, "bench_serve: %s\n", w.error().message().c_str());
    std::exit(1);
  }
}

void append(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::app);
  f << text;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

/// A server of this process on a free port, stopped at the end of its scope.
class InProcess {
public:
  /// `kept`: where indexes are kept between servers (none where empty).
  explicit InProcess(const fs::path& root, const fs::path& kept = {}) : server_(options(root, kept)) {
    if (chorus::Error e = server_.bind()) {
      std::fprintf(stderr, "bench_serve: %s\n", e.message().c_str());
      std::exit(1);
    }
    thread_ = std::thread([this] { (void)server_.run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_.port());
    client_->set_read_timeout(600, 0);
    // Every request carries the token as the page does, in the cookie it keeps,
    // and the codings a browser takes, so that the server compresses what it would for the page.
    client_->set_default_headers({{"Cookie", "chorus_token_" + std::to_string(server_.port()) + "=" + token_},
                                  {"Accept-Encoding", "gzip, deflate, br"}});
  }
  ~InProcess() {
    server_.stop();
    thread_.join();
  }
  /// GET `path`: milliseconds, and the answer's bytes as sent (compressed
  /// where it was; its Content-Length). The client decodes the body.
  std::pair<double, std::size_t> get(const std::string& path) {
    std::string body;
    return get(path, body);
  }
  std::pair<double, std::size_t> get(const std::string& path, std::string& body) {
    const auto t0 = bench::clock::now();
    const httplib::Result r = client_->Get(path);
    const double ms = std::chrono::duration<double, std::milli>(bench::clock::now() - t0).count();
    if (!r || r->status != 200) {
      std::fprintf(stderr, "bench_serve: %s answered %d %s\n", path.c_str(), r ? r->status : -1,
                   r ? r->body.substr(0, 300).c_str() : httplib::to_string(r.error()).c_str());
      std::exit(1);
    }
    body = r->body;
    const std::string coding = r->get_header_value("Content-Encoding");
    codings_.insert(coding.empty() ? "identity" : coding);
    const std::string length = r->get_header_value("Content-Length");
    return {ms, length.empty() ? r->body.size() : static_cast<std::size_t>(std::stoull(length))};
  }
  /// The Content-Encodings of the answers since the last call ("identity" for none), then forgets them.
  std::string codings() {
    std::string out;
    for (const std::string& c : codings_) out += (out.empty() ? "" : "+") + c;
    codings_.clear();
    return out;
  }

private:
  /// As `chorus serve` runs by default: on loopback, asking for a token.
  chorus::cli::serve::ServeOptions options(const fs::path& root, const fs::path& kept) {
    chorus::cli::serve::ServeOptions o;
    o.root = fs::canonical(root).string();
    o.port = 0;
    if (!kept.empty()) o.index_store = std::make_shared<chorus::cli::serve::IndexStore>(kept.string(), 1ull << 32);
    chorus::Result<std::string> token = chorus::cli::serve::random_token();
    if (!token) {
      std::fprintf(stderr, "bench_serve: %s\n", token.error().message().c_str());
      std::exit(1);
    }
    o.token = token_ = std::move(*token);
    return o;
  }
  std::string token_; // before server_, which options() fills it for
  chorus::cli::serve::Server server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
  std::set<std::string> codings_;
};

std::string encode(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '/') out += "%2F";
    else out += c;
  }
  return out;
}

/// The page's charts: one request each, a key and its per-rank columns together.
std::vector<std::string> chart_requests(const std::string& run, const std::vector<std::string>& k, const std::string& range) {
  std::vector<std::string> out;
  std::string per_rank;
  for (const std::string& key : k) {
    if (key.starts_with("step_time/")) {
      per_rank += "&key=" + encode(key);
      continue;
    }
    out.push_back("/api/series?run=" + run + "&key=" + encode(key) + "&width=" + std::to_string(chart_width) + range);
  }
  out.push_back("/api/series?run=" + run + per_rank + "&width=" + std::to_string(chart_width) + range);
  return out;
}

/// Asks the page's chart requests (chart_requests) one after another: the
/// milliseconds and bytes of them all.
template <class Server>
std::pair<double, std::size_t> charts(Server& s, const std::string& run, const std::vector<std::string>& k,
                                      const std::string& range) {
  double ms = 0;
  std::size_t bytes = 0;
  for (const std::string& q : chart_requests(run, k, range)) {
    auto [m, b] = s.get(q);
    ms += m;
    bytes += b;
  }
  return {ms, bytes};
}

std::string rss() {
  std::ifstream f("/proc/self/status");
  std::string line, out;
  while (std::getline(f, line))
    if (line.starts_with("VmRSS:") || line.starts_with("VmHWM:")) out += (out.empty() ? "" : ", ") + line;
  return out;
}

/// Writes the big run under `big_root` and the 1,000 small runs under
/// `many_root`; says what it wrote.
void write_data(const fs::path& big_root, const fs::path& many_root, int rows, const std::vector<std::string>& k) {
  // The big run.
  auto t0 = bench::clock::now();
  const fs::path run = big_root / "bench" / "g" / "big";
  fs::create_directories(run);
  write_big(run, rows, k);
  // The page as before the writer wrote the history: the bench's run.json
  // (each rank's state), and no summary table above the charts (the
  // browser bench's figures are of the charts in view at the page's top).
  write_file(run / "run.json", run_json("big", 1'700'000'000.0, rows));
  fs::remove(run / "summary.json");
  fs::remove(run / "config.json");
  const auto history_bytes = fs::file_size(run / "history.jsonl");
  const double gen_s = std::chrono::duration<double>(bench::clock::now() - t0).count();
  // 1,000 small runs of 100 rows, in 10 groups.
  t0 = bench::clock::now();
  for (int i = 0; i < 1000; ++i) {
    std::string id = std::to_string(i), group = std::to_string(i % 10);
    id.insert(0, 1, 'r');
    group.insert(0, 1, 'g');
    const fs::path d = many_root / "bench" / group / id;
    fs::create_directories(d);
    write_file(d / "run.json", run_json(id, 1'700'000'000.0 + i * 60, 100));
    write_file(d / "summary.json", R"({"_step":99,"train/loss":0.5,"train/acc":0.9})");
    write_file(d / "history.jsonl", rows_text(0, 100, k));
  }
  const double gen_many_s = std::chrono::duration<double>(bench::clock::now() - t0).count();
  std::printf("bench_serve: a run of %d rows x %d metrics (history.jsonl %.0f MiB, written in %.1f s); 1,000 runs "
              "(written in %.1f s)\n\n",
              rows, metrics, static_cast<double>(history_bytes) / (1 << 20), gen_s, gen_many_s);
}

} // namespace

int main(int argc, char** argv) {
  std::string write_to;
  int arg = 1;
  if (argc > 2 && std::string_view(argv[1]) == "--write") {
    write_to = argv[2];
    arg = 3;
  }
  const int rows = argc > arg ? std::atoi(argv[arg]) : 1'000'000;
  if (rows < 1000) {
    std::fprintf(stderr, "usage: bench_serve [ROWS of 1000 or more]\n"
                         "       bench_serve --write DIR [ROWS]   (writes DIR/big and DIR/many, and exits)\n");
    return 2;
  }
  const std::vector<std::string> k = keys();
  if (!write_to.empty()) {
    const fs::path dir(write_to);
    if (fs::exists(dir / "big") || fs::exists(dir / "many")) {
      std::fprintf(stderr, "bench_serve: %s already holds big/ or many/: remove them first\n", write_to.c_str());
      return 1;
    }
    write_data(dir / "big", dir / "many", rows, k);
    std::printf("written: %s (the run bench/g/big) and %s (1,000 runs)\n", (dir / "big").c_str(), (dir / "many").c_str());
    return 0;
  }
  bench::TempDir big_root("chorus-bench-serve"), many_root("chorus-bench-serve"), kept_root("chorus-bench-serve");
  write_data(big_root.path, many_root.path, rows, k);
  const fs::path run = big_root.path / "bench" / "g" / "big";

  bench::Table t({"request", "ms", "KiB sent", "coding", "what"});
  // A row of the table, with the codings of the answers `s` got since the last row.
  auto row = [&](InProcess& s, const std::string& what, double ms, std::size_t bytes, const std::string& note) {
    const std::string coding = s.codings();
    t.add({what, num(ms, 1), num(static_cast<double>(bytes) / 1024, 1), coding.empty() ? "-" : coding, note});
  };
  {
    InProcess s(big_root.path, kept_root.path / "kept");
    const std::string r = "bench%2Fg%2Fbig";
    const auto opened = bench::clock::now();
    auto [ms, bytes] = s.get("/api/run?run=" + r);
    row(s, "/api/run, cold", ms, bytes, "an overview; the index is built in the background");
    const auto [paint, paint_bytes] = charts(s, r, k, "");
    row(s, "17 charts, whole run", paint, paint_bytes, "first paint: one request a chart, 700 px");
    row(s, "first paint in all", ms + paint, bytes + paint_bytes, "cold /api/run + the charts");
    {
      const int from = rows / 3, to = from + rows / 100;
      std::string body;
      s.get("/api/run?run=" + r, body);
      const bool indexing = body.find("\"indexing\":true") != std::string::npos;
      const auto [z, zb] = charts(s, r, k, "&from=" + std::to_string(from) + "&to=" + std::to_string(to));
      row(s, "17 charts, zoom 1%, indexing", z, zb,
          indexing ? "read from the file while the index is built" : "the index was whole already");
      // The page's two charts in view, asked again at full resolution once
      // painted (one request for both: exact=1).
      s.get("/api/run?run=" + r, body);
      const bool still = body.find("\"indexing\":true") != std::string::npos;
      const auto [e, eb] = s.get("/api/series?run=" + r + "&key=" + encode(k[0]) + "&key=" + encode(k[1]) +
                                 "&width=" + std::to_string(chart_width) + "&exact=1");
      row(s, "2 charts in view, exact, indexing", e, eb,
          still ? "the whole file read for their keys while the index is built" : "the index was whole already");
    }
    for (std::string body;;) {
      s.get("/api/run?run=" + r, body);
      if (body.find("\"indexing\":true") == std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    row(s, "index whole", std::chrono::duration<double, std::milli>(bench::clock::now() - opened).count(), 0,
        "from the first request, asked every 5 ms");
    std::tie(ms, bytes) = s.get("/api/run?run=" + r);
    row(s, "/api/run, warm", ms, bytes, "");
    const auto [warm, warm_bytes] = charts(s, r, k, "");
    row(s, "17 charts, warm", warm, warm_bytes, "");
    for (const auto& [part, name] : {std::pair{0.10, "10%"}, std::pair{0.01, "1%"}, std::pair{0.001, "0.1%"}}) {
      const int from = rows / 3, to = from + static_cast<int>(rows * part);
      const auto [z, zb] = charts(s, r, k, "&from=" + std::to_string(from) + "&to=" + std::to_string(to));
      row(s, std::string("17 charts, zoom ") + name, z, zb,
          std::to_string(to - from) + " steps" + (to - from <= 32 * chart_width ? ", read from the file" : ", from the index"));
    }
    append(run / "history.jsonl", rows_text(rows, rows + 1000, k));
    std::tie(ms, bytes) = s.get("/api/run?run=" + r);
    row(s, "/api/run, 1,000 rows later", ms, bytes, "reads the new lines only");
    const auto [live, live_bytes] = charts(s, r, k, "");
    row(s, "17 charts, 1,000 rows later", live, live_bytes, "");
    std::string status;
    s.get("/api/status", status);
    std::printf("server status after the big run: %s\n", status.c_str());
  }
  {
    // A fresh server, the big run opened again: its index as kept by the server before.
    InProcess s(big_root.path, kept_root.path / "kept");
    const std::string r = "bench%2Fg%2Fbig";
    std::string body;
    auto [ms, bytes] = s.get("/api/run?run=" + r, body);
    row(s, "/api/run, opened again", ms, bytes,
        body.find("\"indexing\":false") != std::string::npos ? "a fresh server: the index kept, and 1,000 rows read on"
                                                              : "a fresh server: NO INDEX KEPT (an overview)");
    const auto [paint, paint_bytes] = charts(s, r, k, "");
    row(s, "17 charts, opened again", paint, paint_bytes, "full resolution at once");
    row(s, "first paint in all, opened again", ms + paint, bytes + paint_bytes, "");
  }
  {
    InProcess s(many_root.path);
    auto [ms, bytes] = s.get("/api/runs");
    row(s, "/api/runs of 1,000 runs, cold", ms, bytes, "reads every run.json and summary.json");
    std::tie(ms, bytes) = s.get("/api/runs");
    row(s, "/api/runs of 1,000 runs, warm", ms, bytes, "unchanged runs from memory");
    std::tie(ms, bytes) = s.get("/api/run?run=bench%2Fg7%2Fr517");
    row(s, "/api/run of one of them", ms, bytes, "");
  }
  std::printf("%s\n\n", rss().c_str());
  t.print();
  return 0;
}
