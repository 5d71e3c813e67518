// tcp_connect: how a rank reaches its host across nodes, bounded, without
// ever keeping the host from listening.
#define BOOST_TEST_MODULE io_probe
#include <boost/test/unit_test.hpp>

#include "io/platform/posix.hpp"
#include "tests/socket.hpp"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

using namespace chorus;
using chorus::test::bound_socket;
using chorus::test::port_of;
using namespace std::chrono_literals;

namespace {
/// Opens and closes a connection: whether it opened, or why not.
Error probe(const std::string& host, std::uint16_t port) {
  int fd = -1;
  Error e = platform::tcp_connect(host, port, 1000ms, fd);
  BOOST_TEST((e ? fd == -1 : fd >= 0));
  platform::close_fd(fd);
  return e;
}
} // namespace


BOOST_AUTO_TEST_CASE(a_listening_port_answers_and_a_closed_one_says_why_not) {
  const int listener = bound_socket(0, 8);
  BOOST_REQUIRE(listener >= 0);
  const std::uint16_t port = port_of(listener);
  const Error open = probe("127.0.0.1", port);
  BOOST_TEST(!open, open.message());
  ::close(listener);
  const Error closed = probe("127.0.0.1", port);
  BOOST_TEST((closed.code() == Errc::connect_failed));
  BOOST_TEST(closed.message() == "Connection refused");
  const Error unknown = probe("no-such-host.invalid", port);
  BOOST_TEST((unknown.code() == Errc::connect_failed));
  BOOST_TEST(unknown.message().find("cannot resolve no-such-host.invalid") == 0u, unknown.message());
}

// Ranks probe their host's port again and again until it listens. Where that
// port lies in the kernel's ephemeral range, a probe may be given the port
// itself as its own end and connect to itself (TCP's simultaneous open). Such
// a probe must not count as the host, nor leave the port in TIME_WAIT, which
// would keep the host, starting a moment later, from listening on it.
BOOST_AUTO_TEST_CASE(a_probe_that_meets_itself_finds_nothing_and_leaves_the_port_free) {
  const auto [low, high] = chorus::test::ephemeral_range();
  BOOST_REQUIRE_LT(low + 64, high);
  // A free port of the range with the parity the kernel tries first (that of its low end).
  int port = low + 2 * static_cast<int>((::getpid() * 37) % ((high - low) / 2));
  for (int tries = 0; tries < 100; ++tries, port = low + (port - low + 2 * 101) % (high - low)) {
    if (const int fd = bound_socket(static_cast<std::uint16_t>(port), 0); fd >= 0) {
      ::close(fd);
      break;
    }
  }
  // The kernel walks the range for each new connection to one address: enough
  // probes meet the port itself many times over (on Linux 6, within about
  // 10,000 probes for a range of 28,000 ports).
  const int probes = 4 * (high - low);
  int answered = 0;
  for (int i = 0; i < probes; ++i)
    if (!probe("127.0.0.1", static_cast<std::uint16_t>(port))) ++answered;
  BOOST_TEST(answered == 0, answered << " of " << probes << " probes of port " << port
                                     << ", where nothing listens, counted as answered");
  const int host = bound_socket(static_cast<std::uint16_t>(port), 8);
  BOOST_TEST(host >= 0, "after the probes, port " << port << " cannot be listened on: " << std::strerror(errno));
  if (host >= 0) ::close(host);
}

// The limit on open files a run host raises for its ranks' connections. Run
// in a child: lowering a hard limit cannot be undone.
BOOST_AUTO_TEST_CASE(a_run_host_raises_its_open_file_limit_as_far_as_the_hard_limit_lets_it) {
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    int failed = 0;
    rlimit low{256, 4096};
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) ::_exit(77);
    // Within the hard limit: raised, and nothing to say.
    if (chorus::platform::raise_open_files(3000)) failed |= 1;
    rlimit now{};
    ::getrlimit(RLIMIT_NOFILE, &now);
    if (now.rlim_cur != 3000) failed |= 2;
    // Already enough: left as it is.
    if (chorus::platform::raise_open_files(100)) failed |= 4;
    ::getrlimit(RLIMIT_NOFILE, &now);
    if (now.rlim_cur != 3000) failed |= 8;
    // Beyond it: raised to the hard limit, and the sentence names both limits, the need and the fix.
    const chorus::Error error = chorus::platform::raise_open_files(10'256);
    if (error.code() != chorus::Errc::bad_environment) failed |= 64;
    const std::string why = error.message();
    ::getrlimit(RLIMIT_NOFILE, &now);
    if (now.rlim_cur != 4096) failed |= 16;
    for (const char* part : {"at most 4096 files open", "hard limit is 4096", "about 10256", "ulimit -n 10256"})
      if (why.find(part) == std::string::npos) failed |= 32;
    ::_exit(failed);
  }
  int status = 0;
  BOOST_REQUIRE(::waitpid(child, &status, 0) == child);
  BOOST_REQUIRE(WIFEXITED(status));
  BOOST_TEST(WEXITSTATUS(status) == 0, "failed checks (bits): " << WEXITSTATUS(status));
}
