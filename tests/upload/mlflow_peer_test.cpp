// A run with histograms, and one with images, text and tables, uploaded to
// a real MLflow 2.10.2 tracking server (../shared/peers, started by its
// mlflow-server.sh), read back with MLflow's own Python client: the
// artifacts under histograms/ and the history of a quantile metric; every
// media artifact listed and downloaded through the server's artifact API,
// byte for byte, and the run's tags. Skipped (77) where the peer or the
// Debian packages it needs are missing.
#define BOOST_TEST_MODULE upload_mlflow_peer
#include <boost/test/unit_test.hpp>

#include "io/upload/upload.hpp"
#include "tests/upload/histogram_checks.hpp"
#include "tests/upload/media_checks.hpp"
#include "tests/upload/run_fixture.hpp"
#include "tests/upload/uploading.hpp"

#include <simdjson.h>

#include <arpa/inet.h>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace chorus;
using namespace std::chrono_literals;

namespace {

const std::string peers = CHORUS_SOURCE_DIR "/../shared/peers";

/// What `command` prints on stdout, and its exit status.
std::pair<std::string, int> run_command(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return {out, -1};
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  return {out, ::pclose(p)};
}

/// What MLflow's own Python client prints for `script` (run against the peer
/// at `url`, in `dir`), and its exit status.
std::pair<std::string, int> run_client(const std::string& dir, const std::string& url, const std::string& script) {
  const std::string prelude = "import json, mlflow\n"
                              "from mlflow.tracking import MlflowClient\n"
                              "mlflow.set_tracking_uri('" + url + "')\n"
                              "c = MlflowClient()\n";
  return run_command("cd " + dir + " && PYTHONPATH=" + peers + "/mlflow-2.10.2 /usr/bin/python3 -c \"$(cat <<'PY'\n" +
                     prelude + script + "PY\n)\" 2>&1");
}

/// A port nothing listens on now, on 127.0.0.1.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 0;
  ::close(fd);
  return ntohs(a.sin_port);
}

void skip(const std::string& why) {
  std::printf("skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

/// The peer server, stopped (its process group) when it goes.
struct MlflowPeer {
  test::TempDir data{"chorus-mlflow-peer"};
  int port = 0;
  pid_t group = 0;
  std::string url;

  MlflowPeer() {
    if (!std::filesystem::exists(peers + "/mlflow-server.sh")) skip("no " + peers + "/mlflow-server.sh");
    port = free_port();
    const auto [out, status] =
        run_command(peers + "/mlflow-server.sh " + std::to_string(port) + " " + data.str() + " 2>&1");
    long pgid = 0;
    char at[256] = {};
    if (status != 0 || std::sscanf(out.c_str(), "%ld %255s", &pgid, at) != 2 || pgid <= 1)
      skip("the MLflow peer did not start: " + out);
    group = static_cast<pid_t>(pgid);
    url = at;
  }
  ~MlflowPeer() {
    if (group > 1) ::kill(-group, SIGTERM);
  }
};

} // namespace

BOOST_AUTO_TEST_CASE(mlflow_2_10_lists_the_histogram_artifacts_and_quantiles) {
  MlflowPeer peer;
  test::RunFixture run;
  test::ended_histogram_run(run);
  const std::string run_id = test::upload_all(run.dir(), "mlflow://127.0.0.1:" + std::to_string(peer.port), 120s).remote_run;

  const std::string script =
      "arts = sorted(f.path for f in c.list_artifacts('" + run_id + "', 'histograms/grad'))\n"
      "p50 = sorted((m.step, m.value) for m in c.get_metric_history('" + run_id + "', 'grad/p50'))\n"
      "path = c.download_artifacts('" + run_id + "', 'histograms/grad/step_4.json', '" + peer.data.str() + "')\n"
      "print(json.dumps({'artifacts': arts, 'p50': p50, 'step_4': json.load(open(path))}))\n";
  const auto [out, status] = run_client(peer.data.str(), peer.url, script);
  BOOST_TEST_INFO_SCOPE(out);
  BOOST_REQUIRE_EQUAL(status, 0);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  BOOST_REQUIRE(parser.parse(out).get(doc) == simdjson::SUCCESS);

  std::vector<std::string> want_artifacts;
  std::vector<std::pair<std::int64_t, double>> want_p50;
  for (const test::LoggedHistogram& h : test::read_histograms(run.dir())) {
    if (h.column != "grad") continue;
    want_artifacts.push_back("histograms/grad/step_" + std::to_string(h.step) + ".json");
    want_p50.emplace_back(h.step, h.value.quantile(0.5));
    if (h.step == 4) {
      BOOST_TEST(doc["step_4"]["count"].get_uint64().value() == h.value.count());
      BOOST_TEST(doc["step_4"]["nan"].get_uint64().value() == 1u);
      BOOST_TEST(doc["step_4"]["buckets"].get_array().value().size() == h.value.buckets().size());
    }
  }
  std::sort(want_artifacts.begin(), want_artifacts.end());
  std::sort(want_p50.begin(), want_p50.end());
  std::vector<std::string> artifacts;
  const simdjson::dom::array listed = doc["artifacts"].get_array().value();
  for (auto a : listed) artifacts.emplace_back(a.get_string().value());
  BOOST_TEST(artifacts == want_artifacts, boost::test_tools::per_element());
  std::vector<std::pair<std::int64_t, double>> p50;
  const simdjson::dom::array history = doc["p50"].get_array().value();
  for (auto m : history)
    p50.emplace_back(m.at(0).get_int64().value(), m.at(1).get_double().value());
  BOOST_TEST(p50.size() == want_p50.size()); // each step once
  BOOST_TEST((p50 == want_p50));
}

namespace {

std::string from_hex(std::string_view hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

} // namespace

// Images (a PNG per rank, a JPEG), text and tables of a run of two ranks:
// every artifact MLflow's client lists under images/, tables/ and text/,
// downloaded back through the server, is the run's file byte for byte, laid
// out as that client lays out its own (and as docs/UPLOADS.md says), with
// the tags it sets.
BOOST_AUTO_TEST_CASE(mlflow_2_10_lists_and_returns_every_image_text_and_table) {
  MlflowPeer peer;
  test::RunFixture run;
  test::ended_media_run(run, 2);
  const std::string run_id =
      test::upload_all(run.dir(), "mlflow://127.0.0.1:" + std::to_string(peer.port), 120s).remote_run;

  const std::string script =
      "run_id = '" + run_id + "'\n"
      "files = {}\n"
      "def walk(path):\n"
      "    for f in c.list_artifacts(run_id, path):\n"
      "        if f.is_dir:\n"
      "            walk(f.path)\n"
      "        else:\n"
      "            local = c.download_artifacts(run_id, f.path, '" + peer.data.str() + "/down')\n"
      "            files[f.path] = open(local, 'rb').read().hex()\n"
      "import os\n"
      "os.makedirs('" + peer.data.str() + "/down', exist_ok=True)\n"
      "for top in ('images', 'tables', 'text'):\n"
      "    walk(top)\n"
      "print(json.dumps({'files': files, 'tags': c.get_run(run_id).data.tags}))\n";
  const auto [out, status] = run_client(peer.data.str(), peer.url, script);
  BOOST_TEST_INFO_SCOPE(out.substr(0, 4000));
  BOOST_REQUIRE_EQUAL(status, 0);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  BOOST_REQUIRE(parser.parse(out).get(doc) == simdjson::SUCCESS);
  std::map<std::string, std::string> artifacts, tags;
  const simdjson::dom::object files = doc["files"].get_object().value(), run_tags = doc["tags"].get_object().value();
  for (auto f : files) artifacts[std::string(f.key)] = from_hex(f.value.get_string().value());
  for (auto t : run_tags) tags[std::string(t.key)] = std::string(t.value.get_string().value());
  BOOST_TEST(artifacts.size() > 50u);
  test::check_mlflow_media(artifacts, tags, run.dir(), 2);
  BOOST_TEST(artifacts.count("tables/preds/rank-0/step_3.json") == 1u);
  BOOST_TEST(artifacts.count("text/notes/rank-1/step_5.md") == 1u);
  std::string media = run.read("media.jsonl");
  BOOST_TEST(tags["chorus.upload.media"] ==
             std::to_string(std::count(media.begin(), media.end(), '\n')) + "." + std::to_string(media.size()));
}
