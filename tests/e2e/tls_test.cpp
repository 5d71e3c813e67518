// Links between nodes are authenticated: `chorus certs` makes a job's
// credentials, a run that spans nodes does not start without them (unless
// CHORUS_INSECURE=1), and a peer with another CA's credentials, or with none,
// can neither join the run nor put a record into it. Two nodes of two ranks
// each run on this machine, as two `chorus launch --nnodes 2`.
#define BOOST_TEST_MODULE e2e_tls
#include "harness.hpp"
#include "netns.hpp"
#include "slow_link.hpp"

#include "io/platform/credentials.hpp"

#include <boost/test/unit_test.hpp>

#include <sys/stat.h>

#include <fstream>
#include <future>

using namespace e2e;

namespace {

/// The command of node `k` (of two, `ranks` each) of a shared run whose
/// host listens on test_port(salt) + 1.
std::string node_command(const TempDir& dir, int salt, int k, const std::string& env, const std::string& worker_args,
                         int init_timeout_s, int ranks = 2) {
  return "env " + env + " CHORUS_DIR=" + (dir.path / ("node" + std::to_string(k))).string() +
         " CHORUS_MODE=shared CHORUS_INIT_TIMEOUT=" + std::to_string(init_timeout_s * sanitizer_slowdown) + " " +
         bin("chorus") + " launch -n " + std::to_string(ranks) + " --nnodes 2 --node-rank " + std::to_string(k) +
         " --master-addr 127.0.0.1 --master-port " + std::to_string(test_port(salt)) + " --run-id tls" +
         std::to_string(salt) + " -- " + bin("chorus_e2e_worker") + " " + worker_args;
}

/// Both nodes of a 2 x 2 shared run at once, each with its own environment.
/// The run host listens on test_port(salt) + 1.
std::pair<Output, Output> two_nodes(const TempDir& dir, int salt, const std::string& env0, const std::string& env1,
                                    const std::string& worker_args = "--steps 30", int init_timeout_s = 3) {
  auto second = std::async(std::launch::async,
                           [&] { return run(node_command(dir, salt, 1, env1, worker_args, init_timeout_s)); });
  Output first = run(node_command(dir, salt, 0, env0, worker_args, init_timeout_s));
  return {first, second.get()};
}

std::string certs(const fs::path& dir) {
  Output o = run(bin("chorus") + " certs " + dir.string());
  BOOST_REQUIRE_MESSAGE(o.status == 0, o.text);
  return "CHORUS_TLS_DIR=" + dir.string();
}

/// The ranks' states of the one run under node 0's directory, and its history.
std::vector<std::string> rank_states(const fs::path& root, std::vector<Row>& rows) {
  std::vector<std::string> states;
  for (const auto& run_dir : find_runs(root)) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    BOOST_REQUIRE(!parser.load((run_dir / "run.json").string()).get(doc));
    for (auto r : doc["ranks"].get_array()) states.emplace_back(std::string_view(r["state"].get_string()));
    rows = read_history(run_dir);
  }
  return states;
}

/// Both nodes succeeded, and node 0 holds the whole run: 4 ranks finished, `steps` rows of 4 losses.
void check_whole_run(const TempDir& dir, const Output& n0, const Output& n1, std::size_t steps = 30) {
  BOOST_TEST_CONTEXT(n0.text << n1.text) {
    BOOST_REQUIRE_EQUAL(n0.status, 0);
    BOOST_REQUIRE_EQUAL(n1.status, 0);
  }
  std::vector<Row> rows;
  auto states = rank_states(dir.path / "node0", rows);
  BOOST_TEST(states == std::vector<std::string>(4, "finished"), boost::test_tools::per_element());
  BOOST_REQUIRE_EQUAL(rows.size(), steps);
  for (const Row& row : rows) BOOST_TEST(row.count.at("loss") == 4);
}

} // namespace

BOOST_AUTO_TEST_CASE(certs_makes_private_credentials_once) {
  TempDir dir;
  const fs::path creds = dir.path / "creds";
  certs(creds);
  struct stat st {};
  BOOST_REQUIRE(::stat(creds.c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0700u);
  for (const char* f : {"ca.pem", "cert.pem", "key.pem"}) {
    BOOST_REQUIRE(::stat((creds / f).c_str(), &st) == 0);
    BOOST_TEST((st.st_mode & 0777) == 0600u, f);
  }
  chorus::platform::Credentials c;
  chorus::Error e = chorus::platform::check_credentials(creds.string(), c);
  BOOST_TEST(!e, e.message());
  // Not replaced without --force.
  Output again = run(bin("chorus") + " certs " + creds.string());
  BOOST_TEST(again.status == 1);
  BOOST_TEST(again.text.find("--force") != std::string::npos, again.text);
  // A key of another run of `chorus certs` does not belong to this certificate.
  const fs::path other = dir.path / "other";
  certs(other);
  fs::copy_file(other / "key.pem", creds / "key.pem", fs::copy_options::overwrite_existing);
  e = chorus::platform::check_credentials(creds.string(), c);
  BOOST_TEST(e.message().find("is not the key of") != std::string::npos, e.message());
  // A certificate of another CA does not verify.
  fs::copy_file(other / "key.pem", creds / "key.pem", fs::copy_options::overwrite_existing);
  fs::copy_file(other / "cert.pem", creds / "cert.pem", fs::copy_options::overwrite_existing);
  e = chorus::platform::check_credentials(creds.string(), c);
  BOOST_TEST(e.message().find("does not verify against") != std::string::npos, e.message());
  e = chorus::platform::check_credentials((dir.path / "none").string(), c);
  BOOST_TEST(e.message().find("chorus certs") != std::string::npos, e.message());
}

BOOST_AUTO_TEST_CASE(a_run_across_nodes_needs_credentials_or_the_insecure_switch) {
  TempDir dir;
  auto [n0, n1] = two_nodes(dir, 21, "", "");
  BOOST_TEST_INFO(n0.text << n1.text);
  BOOST_TEST(n0.status != 0);
  BOOST_TEST(n1.status != 0);
  BOOST_TEST(n0.text.find("CHORUS_TLS_DIR") != std::string::npos);
  BOOST_TEST(n0.text.find("chorus certs") != std::string::npos);
  BOOST_TEST(n1.text.find("CHORUS_INSECURE=1") != std::string::npos);

  TempDir open;
  auto [i0, i1] = two_nodes(open, 22, "CHORUS_INSECURE=1", "CHORUS_INSECURE=1");
  BOOST_TEST_INFO(i0.text << i1.text);
  BOOST_TEST(i0.status == 0);
  BOOST_TEST(i1.status == 0);
  BOOST_TEST(i0.text.find("WARNING: CHORUS_INSECURE=1") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(nodes_with_the_jobs_credentials_log_into_one_run) {
  TempDir dir;
  const std::string env = certs(dir.path / "creds");
  // Several links at once, opened and closed: each must survive the others'
  // handshakes and goodbyes (OpenSSL's error queue is per thread: platform::ssl_errors).
  for (int round = 0; round < 3; ++round) {
    TempDir runs;
    auto [n0, n1] = two_nodes(runs, 30 + round, env, env);
    check_whole_run(runs, n0, n1);
  }
}

BOOST_AUTO_TEST_CASE(ranks_join_across_a_link_slower_than_the_heartbeat) {
  // Node 1 reaches the run host through a link that takes 250 ms each way,
  // while heartbeats tick every 100 ms: every handshake (TCP, TLS, CAF's)
  // outlasts several ticks, and a rank must still join, log and finish.
  TempDir dir;
  const std::string env = certs(dir.path / "creds");
  constexpr int salt = 51;
  const int host_port = test_port(salt) + 1;
  const int relay_port = test_port(salt) + 2;
  SlowLink link(relay_port, host_port, std::chrono::milliseconds(250));
  const std::string liveness = env + " CHORUS_HEARTBEAT_INTERVAL=0.1 CHORUS_CONNECTION_TIMEOUT=5";
  auto [n0, n1] = two_nodes(dir, salt, liveness, liveness + " CHORUS_PORT=" + std::to_string(relay_port), "--steps 30", 30);
  check_whole_run(dir, n0, n1);
}

BOOST_AUTO_TEST_CASE(a_peer_with_another_ca_or_none_cannot_join_or_inject) {
  TempDir dir;
  const std::string ours = certs(dir.path / "creds");
  const std::string theirs = certs(dir.path / "other");
  for (const std::string& intruder : {theirs, std::string("CHORUS_INSECURE=1")}) {
    TempDir runs;
    auto [n0, n1] = two_nodes(runs, intruder == theirs ? 41 : 42, ours, intruder);
    BOOST_TEST_CONTEXT(intruder) {
      BOOST_TEST_INFO(n0.text << n1.text);
      BOOST_TEST(n0.status == 0); // the run host's own node is whole
      BOOST_TEST(n1.status != 0);
      BOOST_TEST(n1.text.find("could not reach the run host") != std::string::npos);
      BOOST_TEST(n1.text.find("CHORUS_TLS_DIR") != std::string::npos);
      // Each side says why the handshake failed, and the fix.
      BOOST_TEST(n0.text.find("the TLS handshake of a link with") != std::string::npos);
      BOOST_TEST(n0.text.find("(CHORUS_TLS_DIR, made by `chorus certs`)") != std::string::npos);
      if (intruder == theirs)
        BOOST_TEST(n1.text.find("the certificate did not verify") != std::string::npos);
      std::vector<Row> rows;
      auto states = rank_states(runs.path / "node0", rows);
      BOOST_TEST(states == (std::vector<std::string>{"finished", "finished", "crashed", "crashed"}),
                 boost::test_tools::per_element());
      BOOST_REQUIRE_EQUAL(rows.size(), 30u);
      for (const Row& row : rows) {
        BOOST_TEST(row.count.at("loss") == 2); // ranks 0 and 1 only
        BOOST_TEST(row.num.count("per_rank/rank-2") == 0u);
        BOOST_TEST(row.num.count("per_rank/rank-3") == 0u);
      }
    }
  }
}

namespace {

/// A TCP connection to 127.0.0.1:port once something listens there (within
/// `patience`), or -1.
int connect_when_listening(int port, std::chrono::seconds patience) {
  const auto until = std::chrono::steady_clock::now() + patience;
  while (std::chrono::steady_clock::now() < until) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

/// Whether the peer has closed `fd` (end of stream or an error), reading and
/// dropping whatever it sent first; waits at most `ms`.
bool closed_by_peer(int fd, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
}

/// Opens `silent` connections to the run host's port of a job that runs on
/// as `job`, and counts those the host closed while the job still ran.
/// `first_bytes`, when not empty, is sent on one more connection, which must
/// be closed too.
struct Intruders {
  int closed_while_running = 0;
  bool written_closed = false;
};

/// A connection timeout of 3 s (times the sanitizer's slowdown), the
/// deadline for an accepted connection to prove itself.
std::string slow_deadline_env() {
  return " CHORUS_HEARTBEAT_INTERVAL=0.5 CHORUS_CONNECTION_TIMEOUT=" + std::to_string(3 * sanitizer_slowdown);
}

/// A job that outlasts that deadline by four times: 60 steps of 200 ms each
/// (times the slowdown).
std::string long_job_args() { return "--steps 60 --step-us " + std::to_string(200000 * sanitizer_slowdown); }

Intruders intrude(int port, int silent, const std::string& first_bytes, std::future<std::pair<Output, Output>>& job) {
  Intruders out;
  std::vector<int> fds;
  const int first = connect_when_listening(port, std::chrono::seconds(30 * sanitizer_slowdown));
  if (first < 0) return out;
  fds.push_back(first);
  for (int i = 1; i < silent; ++i)
    if (const int fd = connect_when_listening(port, std::chrono::seconds(5)); fd >= 0) fds.push_back(fd);
  int written = -1;
  if (!first_bytes.empty() && (written = connect_when_listening(port, std::chrono::seconds(5))) >= 0)
    (void)!::write(written, first_bytes.data(), first_bytes.size());
  for (const int fd : fds) {
    // Closed by the host, not by its exit: the job must still be running.
    if (closed_by_peer(fd, 60'000) && job.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      ++out.closed_while_running;
    ::close(fd);
  }
  if (written >= 0) {
    out.written_closed = closed_by_peer(written, 60'000) && job.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
    ::close(written);
  }
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE(connections_that_never_finish_the_tls_handshake_are_closed) {
  // 30 connections to the TLS port that say nothing, and one that sends a
  // TLS client hello's first bytes and stops: each is closed once the
  // connection timeout (3 s) passes, while the job (about 12 s) goes on
  // whole. Before, they stayed open until the host exited. Under a
  // sanitizer both grow: the job's own ranks must finish their handshakes
  // within the same deadline on a loaded machine.
  TempDir dir;
  const std::string env = certs(dir.path / "creds") + slow_deadline_env();
  constexpr int salt = 61;
  auto job = std::async(std::launch::async, [&] { return two_nodes(dir, salt, env, env, long_job_args(), 10); });
  const std::string hello_start("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11);
  const Intruders got = intrude(test_port(salt) + 1, 30, hello_start, job);
  auto [n0, n1] = job.get();
  BOOST_TEST(got.closed_while_running == 30);
  BOOST_TEST(got.written_closed);
  check_whole_run(dir, n0, n1, 60);
}

BOOST_AUTO_TEST_CASE(a_header_claiming_4_gib_cuts_its_link_and_nothing_else) {
  // Plain links (CHORUS_INSECURE=1) take any peer, but not a BASP header
  // whose payload_len would have CAF allocate 4 GiB: the link is cut at the
  // header, the host says so, and the run is whole.
  TempDir dir;
  const std::string env = "CHORUS_INSECURE=1" + slow_deadline_env();
  constexpr int salt = 62;
  auto job = std::async(std::launch::async, [&] { return two_nodes(dir, salt, env, env, long_job_args(), 10); });
  std::string header(32, '\0');
  header[4] = header[5] = header[6] = '\xff';
  header[7] = '\xf0';
  const Intruders got = intrude(test_port(salt) + 1, 1, header, job);
  auto [n0, n1] = job.get();
  BOOST_TEST(got.written_closed);
  BOOST_TEST(got.closed_while_running == 1); // the silent one, by the deadline
  BOOST_TEST(n0.text.find("claiming 4294967280 bytes") != std::string::npos, n0.text);
  check_whole_run(dir, n0, n1, 60);
}

namespace {

/// SIGSTOP (or SIGCONT) to `pid` and every process under it: the ranks of a
/// `chorus launch` are in process groups of their own.
void signal_tree(pid_t pid, int sig) {
  std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (pid_t child = 0; children >> child;) signal_tree(child, sig);
  ::kill(pid, sig);
}

/// Waits until `log` holds `text`, at most `patience`.
bool wait_for_text(const fs::path& log, const std::string& text, std::chrono::seconds patience) {
  const auto until = std::chrono::steady_clock::now() + patience;
  while (slurp(log).find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

/// What node 1's rank did once the run host stopped mid-run.
struct AfterStop {
  std::optional<int> code; // node 1's launch's exit code, where it ended
  double waited = 0;       // seconds from the stop to its end (or to giving up on it)
  double cpu = 0;          // seconds of CPU node 1's launch and its rank used
  std::string out;         // node 1's output
};

/// A run of one rank on each of two nodes (worker `args`, with `env`):
/// once node 1's rank has joined, the run host stops (SIGSTOP), and node 1
/// is given a minute (times the sanitizer's slowdown) to end.
AfterStop stop_host_mid_run(const TempDir& dir, int salt, const std::string& env, const std::string& args) {
  const std::string worker = args + " --print-pid 1";
  Process host(node_command(dir, salt, 0, env, worker, 30, 1), dir.path / "node0.out");
  Process rank(node_command(dir, salt, 1, env, worker, 30, 1), dir.path / "node1.out");
  BOOST_REQUIRE_MESSAGE(wait_for_text(dir.path / "node1.out", "PID 1 ", std::chrono::seconds(60 * sanitizer_slowdown)),
                        slurp(dir.path / "node0.out") << slurp(dir.path / "node1.out"));
  signal_tree(host.pid(), SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  AfterStop after;
  after.code = rank.wait_for(std::chrono::seconds(60 * sanitizer_slowdown));
  after.waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  signal_tree(host.pid(), SIGCONT);
  after.cpu = cpu_seconds(rank.usage());
  after.out = slurp(dir.path / "node1.out");
  return after;
}

/// stop_host_mid_run with a connection_timeout of 3 s (times the sanitizer's
/// slowdown): node 1 must have ended, failed, and named the silent host.
AfterStop stop_host_until_lost(const TempDir& dir, int salt, const std::string& args) {
  const std::string env = certs(dir.path / "creds") + " CHORUS_CONNECTION_TIMEOUT=" + std::to_string(3 * sanitizer_slowdown);
  AfterStop after = stop_host_mid_run(dir, salt, env, args);
  BOOST_TEST_INFO(after.out);
  BOOST_REQUIRE_MESSAGE(after.code.has_value(), "node 1 was still running " << after.waited << " s after the host stopped");
  BOOST_TEST(*after.code != 0, after.out);
  BOOST_TEST(after.out.find("was not heard from for connection_timeout") != std::string::npos, after.out);
  return after;
}

} // namespace

BOOST_AUTO_TEST_CASE(a_rank_waiting_for_a_stopped_host_spends_no_cpu_and_gives_up_at_init_timeout) {
  // The run host (node 0) listens, then stops (SIGSTOP): the kernel still
  // takes node 1's connection, but nothing answers its TLS handshake. The
  // rank must wait without spinning (CAF's TLS session reports a handshake
  // that waits for the peer as a write that succeeded, and the link, ever
  // writable, was called again and again), fail its init at init_timeout,
  // and exit (the link's shutdown must not wait for the silent peer).
  TempDir dir;
  const std::string env = certs(dir.path / "creds");
  constexpr int salt = 63, init_s = 5;
  const int limit_s = init_s * sanitizer_slowdown;
  Process host(node_command(dir, salt, 0, env, "--steps 5", 60, 1), dir.path / "node0.out");
  const int fd = connect_when_listening(test_port(salt) + 1, std::chrono::seconds(30 * sanitizer_slowdown));
  BOOST_REQUIRE_MESSAGE(fd >= 0, slurp(dir.path / "node0.out"));
  ::close(fd);
  signal_tree(host.pid(), SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  Process rank(node_command(dir, salt, 1, env, "--steps 5", init_s, 1), dir.path / "node1.out");
  // Far past init_timeout: a launch still running then hangs.
  const std::optional<int> code = rank.wait_for(std::chrono::seconds(3 * limit_s + 10));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  signal_tree(host.pid(), SIGCONT);
  const std::string out = slurp(dir.path / "node1.out");
  BOOST_TEST_INFO(out);
  BOOST_REQUIRE_MESSAGE(code.has_value(), "node 1 was still running " << waited << " s after it started, with "
                                                                       "init_timeout " << limit_s << " s");
  BOOST_TEST(*code == 3); // the rank's init failed
  BOOST_TEST(out.find("could not reach the run host") != std::string::npos);
  BOOST_TEST(out.find("within init_timeout") != std::string::npos);
  // A spinning rank burns about as much CPU as the time it waits.
  const double cpu = cpu_seconds(rank.usage());
  BOOST_TEST(cpu < 0.2 * waited, "node 1 used " << cpu << " s of CPU in " << waited << " s of waiting");
}

BOOST_AUTO_TEST_CASE(a_host_stopped_mid_run_holds_no_rank_past_finish_timeout) {
  // Both nodes join, then the run host stops. Node 1's rank logs on into
  // its ring, and its finish gives up at finish_timeout (which must start
  // when the trainer finishes, not when a host that takes nothing more lets
  // the finish out), and its process exits: a link whose peer takes nothing
  // is cut after a moment, not waited on for ever.
  TempDir dir;
  // finish_timeout well below connection_timeout, which would end the wait otherwise (host_lost).
  const std::string env = certs(dir.path / "creds") + " CHORUS_FINISH_TIMEOUT=" + std::to_string(3 * sanitizer_slowdown) +
                          " CHORUS_CONNECTION_TIMEOUT=" + std::to_string(30 * sanitizer_slowdown);
  const AfterStop after = stop_host_mid_run(dir, 64, env, "--steps 20 --step-us 10000");
  BOOST_TEST_INFO(after.out);
  BOOST_REQUIRE_MESSAGE(after.code.has_value(), "node 1 was still running " << after.waited << " s after the host stopped");
  BOOST_TEST(*after.code != 0);
  BOOST_TEST(after.out.find("finish did not complete within finish_timeout") != std::string::npos);
  BOOST_TEST(after.cpu < 0.3 * after.waited, "node 1 used " << after.cpu << " s of CPU in " << after.waited << " s");
}

BOOST_AUTO_TEST_CASE(a_host_stopped_mid_run_ends_a_ranks_barrier_at_connection_timeout) {
  // The run host enforces barrier_timeout; a host that stops answering is
  // noticed by the rank's keepalive at connection_timeout: the barrier the
  // rank waits in ends there with host_lost, naming the host, and so does
  // everything after it, at once.
  TempDir dir;
  const AfterStop after = stop_host_until_lost(dir, 65, "--steps 20 --step-us 10000 --barrier-every 10");
  // b9 or b19: whichever the host had not answered yet when it stopped.
  BOOST_TEST(after.out.find("rank 1 barrier b") != std::string::npos, after.out);
}

BOOST_AUTO_TEST_CASE(a_rank_blocked_on_its_full_queue_by_a_stopped_host_sleeps_and_ends_at_connection_timeout) {
  // The run host stops while node 1's rank logs flat out into a queue of 1,024
  // slots: the queue fills, and the trainer waits for room (Overflow::block)
  // asleep, not spinning, until the rank's keepalive declares the host lost
  // at connection_timeout; then its calls are refused at once and it ends.
  TempDir dir;
  const AfterStop after = stop_host_until_lost(dir, 66, "--steps 100000000 --queue 1024 --stop-on-error 1");
  BOOST_TEST(after.cpu < 0.3 * after.waited, "node 1 used " << after.cpu << " s of CPU in " << after.waited << " s");
}
