// A foreign process that speaks chorus's protocol: it reaches a run host the
// way its ranks do and sends it every message a rank, a monitor, the host's
// own process or a group may send, anonymously and with a sender of its own,
// and prints what came back. With --as-nobody it first drops to user nobody
// (where run as root) and only tries to get in: the Unix socket and the TCP
// port of the run.
//
// With --forge it speaks BASP itself, byte by byte (CAF's serializer makes
// the bytes), and tries what a peer of CAF 0.17 could do to a run host: a
// routed message that claims the host's own node or rank RANK1_PID's as its
// source (a finish timer to the Run actor, a batch as rank 1's RankProxy, an
// ack the host would forward to rank 1), a proxy's down or monitor message
// in rank 1's name, a handshake in the host's or rank 1's name, messages
// before a handshake, a forwarding stack, a link message naming the host's
// own actor, headers claiming 1 GiB, and connections that stay silent. Each
// attack goes on a connection of its own and prints "ATTACK <name>: cut"
// where the host closed that connection, else "ATTACK <name>: open". The
// host's memory (VmRSS before, VmHWM after, from /proc/HOST_PID/status) is
// printed as "MEMORY <before kB> <peak kB>".
//
//   chorus_hostile_peer SOCKET_DIR PORT [--as-nobody]
//   chorus_hostile_peer SOCKET_DIR PORT --forge HOST_PID RANK1_PID [--tcp ADDRESS] [--silent N] [--only PREFIX]
#include "actors/links/local_link.hpp"
#include "actors/protocol.hpp"
#include "runtime/core/wire.hpp"

#include <caf/io/basp/header.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

using namespace chorus::core;
using namespace chorus::actors;
namespace wire = chorus::core::wire;
namespace basp = caf::io::basp;

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

// -- BASP by hand -------------------------------------------------------------

using Bytes = std::vector<char>;

/// Where the run host listens: its Unix socket, or a TCP address.
struct Target {
  std::string socket_path; // "" for TCP
  std::string address;
  std::uint16_t port = 0;
};

/// A connection to the host, -1 where it cannot be made.
int dial(const Target& t) {
  if (!t.socket_path.empty()) {
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::memcpy(un.sun_path, t.socket_path.c_str(), t.socket_path.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&un), sizeof un) == 0) return fd;
    ::close(fd);
    return -1;
  }
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(t.port);
  if (::inet_pton(AF_INET, t.address.c_str(), &in.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&in), sizeof in) == 0) return fd;
  ::close(fd);
  return -1;
}

bool write_all(int fd, const Bytes& b) {
  std::size_t off = 0;
  while (off < b.size()) {
    const ssize_t n = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

/// Reads exactly `n` bytes within `patience`; false where the peer closed or was slow.
bool read_exactly(int fd, char* out, std::size_t n, std::chrono::milliseconds patience) {
  const auto until = std::chrono::steady_clock::now() + patience;
  std::size_t got = 0;
  while (got < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}

/// Whether the peer closes `fd` within `patience` (what it sends meanwhile is read and dropped).
bool closed_by_peer(int fd, std::chrono::milliseconds patience) {
  const auto until = std::chrono::steady_clock::now() + patience;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

class Forger {
public:
  Forger(caf::actor_system& sys, Target target, std::uint32_t rank1_pid)
      : sys_(sys), target_(std::move(target)), rank1_pid_(rank1_pid) {}

  /// A connection with the host's handshake read (its node and the Run
  /// actor's id kept), -1 where there is none.
  int connect_and_learn() {
    const int fd = dial(target_);
    if (fd < 0) return -1;
    Bytes head(basp::header_size);
    if (!read_exactly(fd, head.data(), head.size(), std::chrono::seconds(5))) return fail(fd);
    basp::header h;
    {
      caf::binary_deserializer in{sys_, head};
      if (in(h) || h.operation != basp::message_type::server_handshake) return fail(fd);
    }
    Bytes payload(h.payload_len);
    if (!read_exactly(fd, payload.data(), payload.size(), std::chrono::seconds(5))) return fail(fd);
    caf::binary_deserializer in{sys_, payload};
    std::vector<std::string> app_ids;
    std::set<std::string> sigs;
    if (in(host_, app_ids, run_aid_, sigs)) return fail(fd);
    rank1_ = caf::make_node_id(rank1_pid_, static_cast<const caf::node_id::default_data&>(*host_).host_id());
    return fd;
  }

  /// connect_and_learn, then a client handshake as a node of this process's own making.
  int handshaken() {
    const int fd = connect_and_learn();
    if (fd < 0) return -1;
    write_all(fd, client_handshake(stranger()));
    return fd;
  }

  Bytes client_handshake(const caf::node_id& as) {
    return message(basp::header{basp::message_type::client_handshake, 0, 0, 0, caf::invalid_actor_id,
                                caf::invalid_actor_id},
                   [&](caf::binary_serializer& s) { return s(as); });
  }

  /// A routed message from (src, src_aid) to (dst, dst_aid) carrying `msg`.
  Bytes routed(const caf::node_id& src, caf::actor_id src_aid, const caf::node_id& dst, caf::actor_id dst_aid,
               const caf::message& msg) {
    return message(basp::header{basp::message_type::routed_message, 0, 0, 0, src_aid, dst_aid},
                   [&](caf::binary_serializer& s) {
                     std::vector<caf::strong_actor_ptr> stages;
                     return s(src, dst, stages, msg);
                   });
  }

  /// A direct message to `dst_aid`: its forwarding stack and content as bytes.
  Bytes direct(caf::actor_id dst_aid, const Bytes& stages_and_content) {
    Bytes out = header_bytes(basp::header{basp::message_type::direct_message, 0,
                                          static_cast<std::uint32_t>(stages_and_content.size()), 0, 0, dst_aid});
    out.insert(out.end(), stages_and_content.begin(), stages_and_content.end());
    return out;
  }

  Bytes direct(caf::actor_id dst_aid, const caf::message& msg) {
    Bytes body;
    caf::binary_serializer s{sys_, body};
    std::vector<caf::strong_actor_ptr> stages;
    (void)s(stages, msg);
    return direct(dst_aid, body);
  }

  /// A proxy's down message (actor `aid` of node `src` is gone) or a monitor message.
  Bytes down(const caf::node_id& src, caf::actor_id aid) {
    return message(basp::header{basp::message_type::down_message, 0, 0, 0, aid, caf::invalid_actor_id},
                   [&](caf::binary_serializer& s) {
                     caf::error reason = caf::exit_reason::kill;
                     return s(src, host_, reason);
                   });
  }
  Bytes monitor(const caf::node_id& src, caf::actor_id aid) {
    return message(basp::header{basp::message_type::monitor_message, 0, 0, 0, caf::invalid_actor_id, aid},
                   [&](caf::binary_serializer& s) { return s(src, host_); });
  }

  /// A header of `op` claiming `len` payload bytes, and nothing after it.
  Bytes bare_header(basp::message_type op, std::uint32_t len) {
    return header_bytes(basp::header{op, 0, len, 0, 0, 0});
  }

  /// The bytes of an actor handle as CAF writes it: its id, then its node.
  Bytes handle_bytes(caf::actor_id aid, const caf::node_id& node) {
    Bytes out;
    caf::binary_serializer s{sys_, out};
    (void)s(aid, node);
    return out;
  }

  const caf::node_id& host() const { return host_; }
  const caf::node_id& rank1() const { return rank1_; }
  caf::actor_id run_aid() const { return run_aid_; }
  caf::actor_system& sys() { return sys_; }
  const Target& target() const { return target_; }

private:
  static int fail(int fd) {
    ::close(fd);
    return -1;
  }

  /// A node of this process's own making: its pid, and a host id of its own.
  caf::node_id stranger() {
    caf::node_id::default_data::host_id_type id{};
    id.fill(0x5a);
    id[0] = static_cast<std::uint8_t>(++strangers_);
    return caf::make_node_id(static_cast<std::uint32_t>(::getpid()), id);
  }

  Bytes header_bytes(basp::header h) {
    Bytes out;
    caf::binary_serializer s{sys_, out};
    (void)s(h);
    return out;
  }

  template <class F>
  Bytes message(basp::header h, F payload) {
    Bytes body;
    {
      caf::binary_serializer s{sys_, body};
      (void)payload(s);
    }
    h.payload_len = static_cast<std::uint32_t>(body.size());
    Bytes out = header_bytes(h);
    out.insert(out.end(), body.begin(), body.end());
    return out;
  }

  caf::actor_system& sys_;
  Target target_;
  std::uint32_t rank1_pid_;
  caf::node_id host_, rank1_;
  caf::actor_id run_aid_ = 0;
  int strangers_ = 0;
};

/// A figure of /proc/PID/status, in kB (0 where it cannot be read).
long status_kb(long pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  return 0;
}

/// The attacks to make: those whose name starts with this ("" for all).
std::string only;

/// Sends what `bytes` makes on the connection `open` makes, and reports
/// whether the host cut it.
template <class Open, class Make>
void attack(const char* name, Open open, Make bytes,
            std::chrono::milliseconds patience = std::chrono::milliseconds(1500)) {
  if (std::string(name).rfind(only, 0) != 0) return;
  const int fd = open();
  if (fd < 0) {
    std::printf("ATTACK %s: no connection\n", name);
    std::fflush(stdout);
    return;
  }
  write_all(fd, bytes());
  std::printf("ATTACK %s: %s\n", name, closed_by_peer(fd, patience) ? "cut" : "open");
  std::fflush(stdout);
  ::close(fd);
}

/// Appends `b` to `out`.
void repeat(Bytes& out, const Bytes& b) { out.insert(out.end(), b.begin(), b.end()); }

int forge(caf::actor_system& sys, const Target& target, long host_pid, std::uint32_t rank1_pid, int silent) {
  Forger f(sys, target, rank1_pid);
  int probe = -1;
  for (int i = 0; i < 200 && (probe = f.connect_and_learn()) < 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (probe < 0) {
    std::printf("no host\n");
    return 1;
  }
  ::close(probe);
  std::printf("connected\n");
  const caf::actor_id run = f.run_aid();
  auto handshaken = [&] { return f.handshaken(); };
  auto unshaken = [&] { return f.connect_and_learn(); };
  // (i) The Run actor's own finish timer, claiming the host's node and the Run actor as its sender.
  attack("routed fin_tmo as the run", handshaken,
         [&] { return f.routed(f.host(), run, f.host(), run, caf::make_message(finish_tmo_atom::value)); });
  // (ii) A batch in rank 1's name: its RankProxy's id is one of the first few of its process.
  attack("routed batch as rank 1", handshaken, [&] {
    Bytes all;
    for (caf::actor_id aid = 1; aid <= 64; ++aid)
      repeat(all, f.routed(f.rank1(), aid, f.host(), run,
                           caf::make_message(batch_atom::value, frame_at(1, std::uint64_t{1} << 40, 5, "evil"))));
    return all;
  });
  // (iii) An ack the host would route on to rank 1, in the Run actor's name.
  attack("routed ack to rank 1", handshaken, [&] {
    Bytes all;
    for (caf::actor_id aid = 1; aid <= 64; ++aid)
      repeat(all, f.routed(f.host(), run, f.rank1(), aid,
                           caf::make_message(ack_atom::value, std::uint32_t{64}, std::uint64_t{1} << 40, AckErrors{})));
    return all;
  });
  // Rank 1's actors gone, or watched, in the name of rank 1's node.
  attack("down as rank 1", handshaken, [&] {
    Bytes all;
    for (caf::actor_id aid = 1; aid <= 64; ++aid) repeat(all, f.down(f.rank1(), aid));
    return all;
  });
  attack("monitor as rank 1", handshaken, [&] {
    Bytes all;
    for (caf::actor_id aid = 1; aid <= 64; ++aid) repeat(all, f.monitor(f.rank1(), aid));
    return all;
  });
  // Handshakes in another's name: the host's own node, and rank 1's (which has its link).
  for (const auto& [name, as] : {std::pair{"handshake as the host", f.host()}, std::pair{"handshake as rank 1", f.rank1()}})
    attack(name, unshaken, [&] {
      Bytes b = f.client_handshake(as);
      repeat(b, f.direct(run, caf::make_message(finish_tmo_atom::value)));
      return b;
    });
  // A message before any handshake.
  attack("message before the handshake", unshaken,
         [&] { return f.direct(run, caf::make_message(finish_tmo_atom::value)); });
  // A forwarding stack naming the Run actor: an answer would go to it, from the host's own actor.
  attack("forwarding stack", handshaken, [&] {
    Bytes body{1}; // one stage
    repeat(body, f.handle_bytes(run, f.host()));
    caf::binary_serializer s{sys, body};
    (void)s(caf::make_message(nccl_id_atom::value));
    return f.direct(run, body);
  });
  // A link message naming the host's own Run actor, which CAF 0.17 takes for a proxy.
  attack("link to the run", handshaken, [&] {
    Bytes body{0}; // no stages
    caf::binary_serializer s{sys, body};
    const std::string types = "@<>+@atom+@strong_actor_ptr";
    (void)s(std::uint16_t{0}, types, caf::link_atom::value);
    repeat(body, f.handle_bytes(run, f.host()));
    return f.direct(run, body);
  });
  // Headers claiming 1 GiB, before and after a handshake.
  if (std::string("1 GiB").rfind(only, 0) == 0) {
    const long rss_before = status_kb(host_pid, "VmRSS");
    attack("1 GiB handshake", unshaken,
           [&] { return f.bare_header(basp::message_type::client_handshake, 1u << 30); });
    attack("1 GiB message", handshaken, [&] { return f.bare_header(basp::message_type::direct_message, 1u << 30); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::printf("MEMORY %ld %ld\n", rss_before, status_kb(host_pid, "VmHWM"));
  }
  // Connections that stay silent: before a handshake (many), and after one.
  if (silent > 0) {
    std::vector<int> fds;
    for (int i = 0; i < silent; ++i)
      if (const int fd = dial(target); fd >= 0) fds.push_back(fd);
    const int after = f.handshaken();
    int closed = 0;
    for (int fd : fds) closed += closed_by_peer(fd, std::chrono::seconds(15)) ? 1 : 0;
    std::printf("SILENT %d of %d closed\n", closed, silent);
    std::printf("ATTACK silent after the handshake: %s\n",
                after >= 0 && closed_by_peer(after, std::chrono::seconds(15)) ? "cut" : "open");
    for (int fd : fds) ::close(fd);
    if (after >= 0) ::close(after);
  }
  std::fflush(stdout);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string dir = argv[1];
  const auto port = static_cast<std::uint16_t>(std::stoi(argv[2]));
  if (argc > 3 && std::string(argv[3]) == "--as-nobody") return knock(dir, port);

  caf::actor_system_config cfg;
  cfg.load<caf::io::middleman>();
  register_wire_types(cfg);
  cfg.set("middleman.workers", size_t{0});
  cfg.set("logger.console-verbosity", caf::atom("quiet"));
  caf::actor_system sys{cfg};
  if (argc > 5 && std::string(argv[3]) == "--forge") {
    Target target{local_socket_path(dir, port), "", port};
    int silent = 0;
    for (int i = 6; i + 1 < argc; i += 2) {
      if (std::string(argv[i]) == "--tcp") target = {"", argv[i + 1], port};
      if (std::string(argv[i]) == "--silent") silent = std::stoi(argv[i + 1]);
      if (std::string(argv[i]) == "--only") only = argv[i + 1];
    }
    return forge(sys, target, std::stol(argv[4]), static_cast<std::uint32_t>(std::stoul(argv[5])), silent);
  }
  auto links = spawn_local_links(sys, dir, std::chrono::seconds(10));
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
             std::string("project other, group other-job, 2 ranks, mode shared, scope global"),
             std::string("not the job's secret"));
  self->receive(
      [](joined_atom, const WireError& refusal, const std::string&, const std::string&, const caf::actor&) {
        std::printf("join: %s %s\n", refusal ? "refused" : "accepted", refusal.message.c_str());
      },
      // Behind 64 MiB of junk on the link: a loaded machine takes seconds to get through it.
      caf::after(std::chrono::seconds(20)) >> [] { std::printf("join: no answer\n"); });
  std::fflush(stdout);
  caf::anon_send_exit(links, caf::exit_reason::kill);
  return 0;
}
