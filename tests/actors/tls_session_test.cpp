// A link's TLS (actors/links/tls_session.hpp) on both ends of a non-blocking
// socket pair, driven by hand as a multiplexer would: the job's credentials
// (`chorus certs`) admit each other and carry bytes both ways; another job's
// are refused, saying why; a peer that goes away is the link's error and
// never a SIGPIPE; credentials that do not load name the file and the fix.
// And the handshake threads (actors/links/tls_handshakes.hpp) that make an
// accepted connection's handshake: each comes back once, established; a
// silent one, or one with another job's credentials, is closed; a
// connection still in its handshake when they stop is closed, never handed
// back.
#define BOOST_TEST_MODULE actors_tls_session
#include <boost/test/unit_test.hpp>

#include "actors/links/tls_handshakes.hpp"
#include "actors/links/tls_session.hpp"
#include "tests/temp_dir.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace chorus;
using namespace chorus::actors;
using Io = TlsSession::Io;

namespace {

std::shared_ptr<const TlsContext> context(const std::string& dir) {
  BOOST_REQUIRE(!platform::make_credentials(dir, 1, false));
  Result<std::shared_ptr<const TlsContext>> ctx =
      TlsContext::load({dir + "/ca.pem", dir + "/cert.pem", dir + "/key.pem"});
  BOOST_REQUIRE_MESSAGE(ctx, (ctx ? std::string() : ctx.error().message()));
  return *ctx;
}

/// Two connected non-blocking sockets; closed at the end.
struct Pair {
  int fd[2] = {-1, -1};
  Pair() {
    BOOST_REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fd) == 0);
  }
  ~Pair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};

/// Moves both handshakes on, as a multiplexer's events would, until both
/// are over or one side fails (its Io), for at most `rounds`.
Io handshake(TlsSession& client, TlsSession& server, int rounds = 100) {
  for (int i = 0; i < rounds && !(client.established() && server.established()); ++i) {
    std::size_t n = 0;
    for (TlsSession* s : {&client, &server}) {
      const Io io = s->established() ? Io::done : s->write(nullptr, 0, n);
      if (io == Io::failed || io == Io::closed) return io;
    }
  }
  return client.established() && server.established() ? Io::done : Io::wait;
}

/// Writes `data` through `from` while `to` reads it, alternately (a socket
/// pair holds far less than a MiB); what `to` read.
std::string carry(TlsSession& from, TlsSession& to, const std::string& data) {
  std::string got;
  std::size_t sent = 0;
  std::vector<char> buf(16384);
  for (int i = 0; i < 100000 && got.size() < data.size(); ++i) {
    std::size_t n = 0;
    if (sent < data.size()) {
      const Io io = from.write(data.data() + sent, data.size() - sent, n);
      BOOST_REQUIRE(io == Io::done || io == Io::wait);
      sent += n;
    }
    // Read until the socket is empty, then what the session still holds.
    for (;;) {
      const Io io = to.read(buf.data(), buf.size(), n);
      BOOST_REQUIRE(io == Io::done || io == Io::wait);
      if (n == 0) break;
      got.append(buf.data(), n);
    }
  }
  return got;
}

} // namespace

BOOST_AUTO_TEST_CASE(the_jobs_credentials_admit_each_other_and_carry_bytes_both_ways) {
  test::TempDir dir;
  const auto ctx = context((dir.path / "creds").string());
  Pair p;
  auto client = TlsSession::make(ctx, p.fd[0], false);
  auto server = TlsSession::make(ctx, p.fd[1], true);
  BOOST_REQUIRE(client && server);
  BOOST_TEST(!client->established());
  BOOST_TEST(static_cast<int>(handshake(*client, *server)) == static_cast<int>(Io::done));

  std::string big(1 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + i / 251);
  BOOST_TEST((carry(*client, *server, big) == big));
  BOOST_TEST((carry(*server, *client, "an answer") == "an answer"));

  // A record read in part leaves the rest decrypted in the session, where
  // the socket no longer shows it: buffered() says so.
  std::size_t n = 0;
  BOOST_TEST(static_cast<int>(client->write("0123456789", 10, n)) == static_cast<int>(Io::done));
  char four[4];
  BOOST_TEST(static_cast<int>(server->read(four, sizeof four, n)) == static_cast<int>(Io::done));
  BOOST_TEST(n == 4u);
  BOOST_TEST(server->buffered() == 6u);
}

BOOST_AUTO_TEST_CASE(another_jobs_credentials_are_refused_saying_why) {
  test::TempDir dir;
  const auto ours = context((dir.path / "ours").string());
  const auto theirs = context((dir.path / "theirs").string());
  for (const bool intruder_dials : {true, false}) {
    BOOST_TEST_CONTEXT((intruder_dials ? "the intruder dials" : "the intruder accepts")) {
      Pair p;
      auto client = TlsSession::make(intruder_dials ? theirs : ours, p.fd[0], false);
      auto server = TlsSession::make(intruder_dials ? ours : theirs, p.fd[1], true);
      BOOST_TEST(static_cast<int>(handshake(*client, *server)) == static_cast<int>(Io::failed));
      // Each side checks the other's certificate; the dialling side checks
      // first (the server's comes first), and names the reason.
      BOOST_TEST(client->why().find("the certificate did not verify") != std::string::npos, client->why());
      BOOST_TEST(!client->established());
      BOOST_TEST(!server->established());
    }
  }
}

BOOST_AUTO_TEST_CASE(a_peer_that_goes_away_is_an_error_of_the_link_not_a_sigpipe) {
  // SIGPIPE at its default would end this process at the first write.
  struct sigaction old {};
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, &old);
  test::TempDir dir;
  const auto ctx = context((dir.path / "creds").string());
  Pair p;
  auto client = TlsSession::make(ctx, p.fd[0], false);
  auto server = TlsSession::make(ctx, p.fd[1], true);
  BOOST_REQUIRE(static_cast<int>(handshake(*client, *server)) == static_cast<int>(Io::done));
  server.reset();
  ::close(p.fd[1]);
  p.fd[1] = -1;
  const std::string chunk(4096, 'x');
  Io io = Io::done;
  std::size_t n = 0;
  for (int i = 0; i < 100 && io == Io::done; ++i) io = client->write(chunk.data(), chunk.size(), n);
  BOOST_TEST((io == Io::failed || io == Io::closed));
  BOOST_TEST(!client->why().empty());
  ::sigaction(SIGPIPE, &old, nullptr);

  // Closed during the handshake: the other side learns it, as closed.
  Pair q;
  auto lone = TlsSession::make(ctx, q.fd[1], true);
  ::close(q.fd[0]);
  q.fd[0] = -1;
  std::vector<char> buf(64);
  BOOST_TEST(static_cast<int>(lone->read(buf.data(), buf.size(), n)) == static_cast<int>(Io::closed));
  BOOST_TEST(lone->why() == "the peer closed the connection");
}

BOOST_AUTO_TEST_CASE(credentials_that_do_not_load_name_the_file_and_the_fix) {
  test::TempDir dir;
  const std::string d = (dir.path / "creds").string();
  context(d);
  std::ofstream(d + "/key.pem", std::ios::trunc) << "-----BEGIN PRIVATE KEY-----\ntruncated\n";
  Result<std::shared_ptr<const TlsContext>> ctx = TlsContext::load({d + "/ca.pem", d + "/cert.pem", d + "/key.pem"});
  BOOST_REQUIRE(!ctx);
  BOOST_TEST(ctx.error().message().find(d + "/key.pem") != std::string::npos, ctx.error().message());
  BOOST_TEST(ctx.error().message().find("chorus certs") != std::string::npos, ctx.error().message());
}

namespace {

/// What the handshake threads handed back, by socket.
struct Returned {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<int, std::unique_ptr<TlsSession>> sessions;
  int calls = 0;

  TlsHandshakes::Done done() {
    return [this](int fd, std::unique_ptr<TlsSession> s) {
      std::lock_guard lock(mutex);
      ++calls;
      sessions[fd] = std::move(s);
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t n, std::chrono::seconds limit) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, limit, [&] { return sessions.size() >= n; });
  }
};

/// The dialling side's handshake, driven until it is over or fails (the
/// accepting side runs on a handshake thread).
Io dial(TlsSession& client, int fd, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    std::size_t n = 0;
    const Io io = client.write(nullptr, 0, n);
    if (io == Io::failed || io == Io::closed) return io;
    if (client.established()) return Io::done;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, 100);
  }
  return Io::wait;
}

/// Whether the peer of `fd` closed it within `limit` (a read sees the end).
bool closed_by_peer(int fd, std::chrono::seconds limit) {
  pollfd p{fd, POLLIN, static_cast<short>(0)};
  if (::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(limit).count())) != 1) return false;
  char c;
  for (;;) {
    const ssize_t n = ::recv(fd, &c, 1, 0);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN;
    // TLS bytes (an alert) before the end: read on.
    if (::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(limit).count())) != 1) return false;
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(handshake_threads_hand_each_connection_back_once_established) {
  test::TempDir dir;
  const auto ctx = context((dir.path / "creds").string());
  Returned back;
  TlsHandshakes threads(2);
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<std::unique_ptr<TlsSession>> clients;
  for (int i = 0; i < 8; ++i) {
    pairs.push_back(std::make_unique<Pair>());
    clients.push_back(TlsSession::make(ctx, pairs.back()->fd[0], false));
    threads.start(pairs.back()->fd[1], TlsSession::make(ctx, pairs.back()->fd[1], true), "test peer",
                  std::chrono::steady_clock::now() + std::chrono::seconds(30), back.done());
  }
  for (int i = 0; i < 8; ++i)
    BOOST_TEST(static_cast<int>(dial(*clients[static_cast<std::size_t>(i)], pairs[static_cast<std::size_t>(i)]->fd[0],
                                     std::chrono::seconds(20))) == static_cast<int>(Io::done));
  BOOST_REQUIRE(back.wait_for(8, std::chrono::seconds(20)));
  std::lock_guard lock(back.mutex);
  BOOST_TEST(back.calls == 8);
  for (auto& p : pairs) {
    // The accepted end, established, carries the link's bytes.
    auto& server = back.sessions.at(p->fd[1]);
    BOOST_TEST(server->established());
  }
  std::size_t n = 0;
  BOOST_TEST(static_cast<int>(clients[3]->write("hello", 5, n)) == static_cast<int>(Io::done));
  BOOST_TEST((carry(*clients[3], *back.sessions.at(pairs[3]->fd[1]), " again") == "hello again"));
  // The sockets are the caller's now: Pair closes them.
}

BOOST_AUTO_TEST_CASE(handshake_threads_close_a_silent_connection_at_its_deadline_and_another_jobs_at_once) {
  test::TempDir dir;
  const auto ours = context((dir.path / "ours").string());
  const auto theirs = context((dir.path / "theirs").string());
  Returned back;
  TlsHandshakes threads(1);
  auto silent = std::make_unique<Pair>();
  auto intruder = std::make_unique<Pair>();
  threads.start(silent->fd[1], TlsSession::make(ours, silent->fd[1], true), "a silent peer",
                std::chrono::steady_clock::now() + std::chrono::milliseconds(300), back.done());
  threads.start(intruder->fd[1], TlsSession::make(ours, intruder->fd[1], true), "an intruder",
                std::chrono::steady_clock::now() + std::chrono::seconds(30), back.done());
  // The threads own (and close) the accepted ends now.
  silent->fd[1] = intruder->fd[1] = -1;
  auto client = TlsSession::make(theirs, intruder->fd[0], false);
  BOOST_TEST(static_cast<int>(dial(*client, intruder->fd[0], std::chrono::seconds(20))) == static_cast<int>(Io::failed));
  BOOST_TEST(closed_by_peer(intruder->fd[0], std::chrono::seconds(20)));
  BOOST_TEST(closed_by_peer(silent->fd[0], std::chrono::seconds(20)));
  std::lock_guard lock(back.mutex);
  BOOST_TEST(back.calls == 0);
}

BOOST_AUTO_TEST_CASE(handshake_threads_that_stop_close_what_is_still_in_its_handshake) {
  test::TempDir dir;
  const auto ctx = context((dir.path / "creds").string());
  Returned back;
  auto pending = std::make_unique<Pair>();
  {
    TlsHandshakes threads(1);
    threads.start(pending->fd[1], TlsSession::make(ctx, pending->fd[1], true), "a slow peer",
                  std::chrono::steady_clock::now() + std::chrono::seconds(60), back.done());
    pending->fd[1] = -1;
  }
  BOOST_TEST(closed_by_peer(pending->fd[0], std::chrono::seconds(5)));
  std::lock_guard lock(back.mutex);
  BOOST_TEST(back.calls == 0);
}
