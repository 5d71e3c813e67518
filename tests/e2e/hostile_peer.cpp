// A foreign process that speaks chorus's protocol: it reaches a run host the
// way its ranks do and sends it every message a rank, a monitor, the host's
// own process or a group may send, anonymously and with a sender of its own,
// and prints what came back. With --as-nobody it first drops to user nobody
// (where run as root) and only tries to get in: the Unix socket and the TCP
// port of the run.
//
//   chorus_hostile_peer SOCKET_DIR PORT [--as-nobody]
#include "actors/links/local_link.hpp"
#include "actors/protocol.hpp"
#include "runtime/core/wire.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

using namespace chorus::detail;
namespace wire = chorus::wire;

namespace {

/// Tries the run's doors as another user: neither may let it in.
int knock(const std::string& dir, std::uint16_t port) {
  if (::geteuid() == 0 && ::setuid(65534) != 0) {
    std::printf("setuid: %s\n", std::strerror(errno));
    return 2;
  }
  const std::string path = local_socket_path(dir, port);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  const int r = ::connect(fd, reinterpret_cast<const sockaddr*>(&un), sizeof un);
  std::printf("socket: %s\n", r == 0 ? "connected" : std::strerror(errno));
  ::close(fd);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&in), sizeof in) == 0) {
    // A BASP header claiming a 4 GiB payload: what a host must never parse unauthenticated.
    char header[32] = {};
    const std::uint32_t len = 0xFFFFFFF0u;
    std::memcpy(header + 4, &len, 4);
    (void)::write(fd, header, sizeof header);
    std::printf("tcp: connected\n");
  } else {
    std::printf("tcp: %s\n", std::strerror(errno));
  }
  ::close(fd);
  return 0;
}

std::vector<char> frame_at(std::uint32_t rank, std::uint64_t seq, std::int64_t step, const char* key) {
  std::vector<char> out;
  wire::BatchWriter w(out, rank);
  w.key(900, key);
  w.values(seq, step, 1, 1);
  w.value(900, 1e6);
  return out;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string dir = argv[1];
  const auto port = static_cast<std::uint16_t>(std::stoi(argv[2]));
  if (argc > 3 && std::string(argv[3]) == "--as-nobody") return knock(dir, port);

  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  cfg.set("middleman.workers", size_t{0});
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  auto links = spawn_local_links(sys, dir);
  caf::actor host;
  caf::scoped_actor self{sys};
  for (int i = 0; i < 200 && !host; ++i) {
    self->request(links, std::chrono::seconds(2), caf::connect_atom::value, std::string("local"), port)
        .receive([&](const caf::node_id&, caf::strong_actor_ptr& p, const std::set<std::string>&) {
                   host = caf::actor_cast<caf::actor>(p);
                 },
                 [&](caf::error&) {});
    if (!host) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!host) {
    std::printf("no host\n");
    caf::anon_send_exit(links, caf::exit_reason::kill);
    return 1;
  }
  std::printf("connected\n");
  // The host's own calls, and the messages of its ranks, monitors and group.
  for (bool anonymous : {true, false}) {
    auto send = [&](auto... xs) {
      if (anonymous)
        caf::anon_send(host, xs...);
      else
        self->send(host, xs...);
    };
    send(finish_atom::value);
    send(batch_atom::value, frame_at(1, 1, 1'000'000'000'000, "evil"));
    send(batch_atom::value, frame_at(0, std::uint64_t{1} << 62, 5, "evil"));
    send(system_atom::value, std::uint32_t{0}, std::string(R"({"injected":1})"));
    send(group_atom::value, caf::actor_cast<caf::actor>(self));
    send(group_atom::value);
    send(nccl_id_atom::value, std::vector<char>(128, 'x'));
    send(member_ok_atom::value, std::int64_t{1});
    send(sync_atom::value);
    send(flush_atom::value);
    send(join_tmo_atom::value);
    send(finish_tmo_atom::value);
    // Malformed frames of 32 MiB: nothing of them may reach the WAL.
    std::vector<char> junk(32u << 20, '\x01');
    send(batch_atom::value, junk);
  }
  self->request(host, std::chrono::seconds(1), nccl_id_atom::value)
      .receive([](const std::vector<char>& id) { std::printf("nccl id: given (%zu bytes)\n", id.size()); },
               [](caf::error&) { std::printf("nccl id: not given\n"); });
  // A rank of another job.
  self->send(host, join_atom::value, std::uint32_t{1}, std::string("elsewhere"), std::int64_t{1},
             std::string("project other, group other-job, 2 ranks, mode shared, scope global"));
  self->receive(
      [](joined_atom, bool ok, const std::string& why, const std::string&, const caf::actor&) {
        std::printf("join: %s %s\n", ok ? "accepted" : "refused", why.c_str());
      },
      caf::after(std::chrono::seconds(3)) >> [] { std::printf("join: no answer\n"); });
  std::fflush(stdout);
  caf::anon_send_exit(links, caf::exit_reason::kill);
  return 0;
}
