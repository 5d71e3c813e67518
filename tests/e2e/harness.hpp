// Shared by the end-to-end tests: temporary run directories, running real
// processes, and reading what a run wrote.
#pragma once

#include <simdjson.h>

#include <boost/test/unit_test.hpp>

#include "tests/cli/process.hpp"
#include "tests/socket.hpp"
#include "tests/temp_dir.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace e2e {

namespace fs = std::filesystem;

using chorus::test::slurp;
using chorus::test::TempDir;

struct Output {
  int status = -1; // exit code, or 128 + signal
  std::string text;
};

/// How many times slower a sanitizer build runs the processes a test starts.
/// Timeouts a test gives those processes (not bounds on their speed) grow by
/// it: under ThreadSanitizer, a dozen ranks on two cores can leave a process
/// silent for seconds.
#if defined(__SANITIZE_THREAD__)
inline constexpr int sanitizer_slowdown = 4;
#elif defined(__SANITIZE_ADDRESS__)
inline constexpr int sanitizer_slowdown = 2;
#else
inline constexpr int sanitizer_slowdown = 1;
#endif

/// How long one command a test runs may take before it is reported hung:
/// far beyond what any takes on a loaded machine, and below ctest's limit for
/// a test, so that a hang fails its own case with what it printed.
inline constexpr std::chrono::seconds run_limit{120 * sanitizer_slowdown};

/// Runs `cmd` through sh with stderr merged into stdout, in a process group
/// of its own. A command still running after `limit` fails the test case
/// that ran it, naming the processes it left, which are then killed
/// (chorus::test::Child::finish): a hung child never stalls the whole test
/// silently until ctest's timeout. Its status is then 124.
inline Output run(const std::string& cmd, std::chrono::seconds limit = run_limit) {
  const auto child = chorus::test::Child::program({"/bin/sh", "-c", cmd + " 2>&1"});
  const chorus::test::Output o = child->finish(limit);
  if (o.code == -1)
    BOOST_ERROR("still running after " << limit.count() << " s, killed: " << cmd << "\n  what it left running:\n"
                                       << o.left << "  what it printed:\n"
                                       << o.out << o.err);
  return {o.code == -1 ? 124 : o.code, o.out + o.err};
}

/// Whether ports [first, first + count) can be listened on now (on every
/// address, as a multi-node run host does).
inline bool ports_free(int first, int count) {
  for (int port = first; port < first + count; ++port) {
    const int fd = chorus::test::bound_socket(static_cast<std::uint16_t>(port), 0, true);
    if (fd < 0) return false;
    ::close(fd);
  }
  return true;
}

/// A base port for a test's job, whose processes listen on it and the few
/// after it: free when chosen, different for each test process and salt, and
/// outside the kernel's ephemeral range (net.ipv4.ip_local_port_range), where
/// the local end of any connection on the machine, or the TIME_WAIT it
/// leaves, could hold it when the job starts listening. The same salt gives
/// the same port throughout a test process.
inline int test_port(int salt) {
  static std::mutex lock;
  static std::map<int, int> chosen;
  const std::lock_guard hold(lock);
  if (auto it = chosen.find(salt); it != chosen.end()) return it->second;
  constexpr int span = 8;
  const auto [low, high] = chorus::test::ephemeral_range();
  int first = 20000, last = low - span; // below the range, else above it
  if (last - first < 4096) {
    first = high + 1;
    last = 65535 - span;
  }
  if (last - first < 4096) { // a range over nearly all ports: take the old span
    first = 20000;
    last = 40000;
  }
  const int count = std::max(last - first, 1);
  const int start = static_cast<int>((::getpid() * 7 + salt * 131) % count);
  int port = first + start;
  for (int k = 0; k < 64; ++k)
    if (const int candidate = first + (start + k * 977) % count; ports_free(candidate, span)) {
      port = candidate;
      break;
    }
  return chosen[salt] = port;
}

/// A socket directory of the test's own under `dir` (mode 0700, as chorus
/// wants it): the processes of its jobs link there, apart from other tests'.
inline fs::path own_socket_dir(const TempDir& dir) {
  const fs::path sockets = dir.path / "sockets";
  fs::create_directory(sockets);
  fs::permissions(sockets, fs::perms::owner_all);
  return sockets;
}

inline std::string bin(const std::string& name) { return std::string(CHORUS_BINARY_DIR) + "/bin/" + name; }

/// A shell command that runs `ranks` workers of this node under `chorus
/// launch`, their runs under `dir`; `launch_options` go to launch (e.g.
/// "--nnodes 2 --node-rank 1 --run-id J"), `worker_args` to each worker.
inline std::string launch_worker(const fs::path& dir, int ranks, int master_port, const std::string& worker_args,
                                 const std::string& launch_options = {}) {
  return "CHORUS_DIR=" + dir.string() + " " + bin("chorus") + " launch -n " + std::to_string(ranks) +
         " --master-port " + std::to_string(master_port) + " " + launch_options + " -- " + bin("chorus_e2e_worker") +
         " " + worker_args;
}

/// A history row: every numeric field, and the strings ("NaN", ...) apart.
struct Row {
  std::map<std::string, double> num;
  std::map<std::string, std::string> str;
  std::map<std::string, double> count;
  std::int64_t step() const { return static_cast<std::int64_t>(num.at("_step")); }
};

inline std::vector<Row> read_history(const fs::path& run_dir) {
  std::vector<Row> rows;
  std::ifstream in(run_dir / "history.jsonl");
  std::string line;
  simdjson::dom::parser parser;
  while (std::getline(in, line)) {
    simdjson::dom::element doc;
    if (parser.parse(line).get(doc)) throw std::runtime_error("history line is not JSON: " + line);
    Row r;
    for (auto [k, v] : doc.get_object()) {
      std::string key(k);
      if (key == "_count") {
        for (auto [ck, cv] : v.get_object()) r.count[std::string(ck)] = double(cv.get_double());
      } else if (v.is_string()) {
        r.str[key] = std::string(std::string_view(v.get_string()));
      } else {
        r.num[key] = double(v.get_double());
      }
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

/// A run's run.json, as `parser` holds it until its next parse.
inline simdjson::dom::element read_run_json(simdjson::dom::parser& parser, const fs::path& run_dir) {
  simdjson::dom::element doc;
  if (parser.load((run_dir / "run.json").string()).get(doc))
    throw std::runtime_error((run_dir / "run.json").string() + " is missing or not JSON");
  return doc;
}

/// The last step each rank printed as acknowledged (chorus_e2e_worker's
/// --ack-each, "[rank R] ACKED S" under `chorus launch`).
inline std::map<int, long> acked_steps(const std::string& log) {
  std::map<int, long> acked;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    int r = -1;
    long s = -1;
    if (std::sscanf(line.c_str(), "[rank %d] ACKED %ld", &r, &s) == 2) acked[r] = std::max(acked[r], s);
  }
  return acked;
}

/// The run directories under `root`: those holding `marker`, sorted.
inline std::vector<fs::path> find_runs(const fs::path& root, const std::string& marker = "run.json") {
  std::vector<fs::path> runs;
  for (auto& p : fs::recursive_directory_iterator(root))
    if (p.path().filename() == marker) runs.push_back(p.path().parent_path());
  std::sort(runs.begin(), runs.end());
  return runs;
}

/// The one run under a test's directory, and its run.json.
struct Ended {
  fs::path dir;
  simdjson::dom::parser parser;
  simdjson::dom::element json;
  explicit Ended(const TempDir& root) {
    const auto runs = find_runs(root.path);
    BOOST_REQUIRE_EQUAL(runs.size(), 1u);
    dir = runs.front();
    json = read_run_json(parser, dir);
  }
  /// A text member of run.json, or "(no FIELD)".
  std::string text(const char* field) {
    std::string_view v;
    return json[field].get(v) == simdjson::SUCCESS ? std::string(v) : std::string("(no ") + field + ")";
  }
  std::string state() { return text("state"); }
  std::string rank_field(int rank, const char* field) {
    for (auto r : json["ranks"].get_array())
      if (std::int64_t(r["rank"]) == rank) return std::string(std::string_view(r[field].get_string()));
    return "(no rank " + std::to_string(rank) + ")";
  }
  std::int64_t exit_code(int rank) { return std::int64_t(json["exit_codes"][std::to_string(rank)]); }
};

/// Every row of a run of chorus_e2e_worker whose places hold the global
/// `ranks`: the reductions over exactly the ranks that logged the row's step
/// (a place logs steps up to its `last_step`, by default every step), one
/// unreduced column per such place, and one row per step, in order.
inline void check_worker_history(const fs::path& run_dir, const std::vector<int>& ranks, int steps,
                                 std::vector<std::int64_t> last_step = {}) {
  if (last_step.empty()) last_step.assign(ranks.size(), steps - 1);
  const auto rows = read_history(run_dir);
  BOOST_REQUIRE_EQUAL(rows.size(), static_cast<std::size_t>(steps));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const double s = static_cast<double>(i);
    std::vector<std::size_t> places;
    for (std::size_t p = 0; p < ranks.size(); ++p)
      if (last_step[p] >= static_cast<std::int64_t>(i)) places.push_back(p);
    BOOST_TEST_CONTEXT("step " << i) {
      BOOST_TEST(row.step() == static_cast<std::int64_t>(i));
      BOOST_REQUIRE(!places.empty());
      const auto k = static_cast<double>(places.size());
      double loss = 0, tokens = 0;
      int top = 0;
      bool has0 = false;
      for (std::size_t p : places) {
        const int r = ranks[p];
        loss += r + s * 0.5;
        tokens += 100.0 + r;
        top = std::max(top, r);
        has0 = has0 || r == 0;
      }
      BOOST_TEST(row.num.at("loss") == loss / k);
      BOOST_TEST(row.num.at("tokens") == tokens);
      BOOST_TEST(row.num.at("lo") == s - top);
      BOOST_TEST(row.num.at("hi") == s + top);
      for (const char* key : {"loss", "tokens", "lo", "hi"}) BOOST_TEST(row.count.at(key) == k, key);
      // A run of one rank has its plain key; of several, a column per place.
      if (ranks.size() == 1) {
        BOOST_TEST(row.num.at("per_rank") == ranks[0] * 1000 + s);
      } else {
        for (std::size_t p : places)
          BOOST_TEST(row.num.at("per_rank/rank-" + std::to_string(p)) == ranks[p] * 1000 + s);
      }
      BOOST_TEST(row.num.count("only0") == (has0 ? 1u : 0u)); // declared first: its plain name
      if (has0) BOOST_TEST(row.num.at("only0") == s);
      if (has0) BOOST_TEST(row.count.at("only0") == 1);
      // Nothing else: _step, _timestamp, _runtime, four reductions, the unreduced columns, only0.
      BOOST_TEST(row.num.size() == 7u + places.size() + (has0 ? 1u : 0u));
    }
  }
}

/// The first line "RUN_DIR=..." of a worker's output.
inline fs::path run_dir_of(const std::string& text) {
  auto at = text.find("RUN_DIR=");
  if (at == std::string::npos) return {};
  auto end = text.find('\n', at);
  return text.substr(at + 8, end - at - 8);
}

} // namespace e2e
