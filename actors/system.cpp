// Actor-system set-up: configuration, the run host's Run actor and port,
// dialling the run host, and this process's RankProxy.
#include "runtime/client/system.hpp"
#include "actors/links/local_link.hpp"
#include "actors/links/node_link.hpp"
#include "io/platform/posix.hpp"

#include "actors/group.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_proxy.hpp"
#include "actors/run.hpp"
#include "actors/system_monitor.hpp"
#include "io/platform/credentials.hpp"
#include "io/platform/files.hpp"
#include "io/sampling/system_metrics.hpp"
#include "io/store/run_record.hpp"
#include "io/store/wal.hpp"
#include "runtime/core/json.hpp"

#include <caf/openssl/all.hpp>
#include "runtime/client/run_impl.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <random>
#include <sstream>
#include <thread>

namespace chorus::detail {

using io::detail::unix_now_us;
using io::detail::this_host;

namespace {

using clock = std::chrono::steady_clock;

std::string new_run_id() {
  static constexpr char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::random_device rd;
  std::mt19937_64 gen((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(unix_now_us()));
  std::string id(8, '0');
  for (char& c : id) c = digits[gen() % 36];
  return id;
}

std::string identity_json(const Settings& s, const std::string& id, const std::string& dir, std::int64_t start_us) {
  io::RunRecord r;
  r.id = id;
  r.name = s.run_name.empty() ? id : s.run_name;
  r.project = s.opts.project;
  r.group = s.opts.group;
  r.job_type = s.opts.job_type;
  r.notes = s.opts.notes;
  r.mode = to_string(s.opts.mode);
  r.scope = to_string(s.opts.scope);
  r.host = this_host();
  r.pid = ::getpid();
  r.dir = dir;
  r.launcher = s.topo.launcher;
  r.job_id = s.topo.job_id;
  r.nodes = s.topo.num_nodes;
  r.start_us = start_us;
  if (s.group_size > 0) {
    // Its place in the job's group, the global rank of its first place, its node.
    r.group_index = s.group_index;
    r.rank = s.topo.rank;
    r.node = s.topo.node_rank;
  }
  return r.identity_json();
}

/// Under `chorus launch`, tells it where this run lives (one line appended to
/// the file CHORUS_LAUNCH_RUNS names), so that it can add the ranks' exit
/// codes to run.json once they have exited. The line is "RANK<TAB>DIR": a
/// per-rank run takes its own rank's code only, "*" every rank launch started.
void note_run_for_launcher(const Settings& s, const std::string& run_dir) {
  const char* file = s.opts.read_env ? std::getenv("CHORUS_LAUNCH_RUNS") : nullptr;
  if (file == nullptr || *file == '\0') return;
  const int fd = ::open(file, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return; // launch is gone or made none: nothing to tell
  std::string line = s.opts.mode == Mode::per_rank ? std::to_string(s.topo.rank) : std::string("*");
  line.append("\t").append(run_dir).append("\n");
  const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  (void)written; // best effort: without the line, launch reports the codes as missing
}

// SIGINT and SIGTERM make the run host's WAL durable before the process
// goes: appends are already in the kernel, fdatasync puts them on disk. Only
// a default disposition is replaced, so a trainer's own handlers stay in
// charge; the handler restores the previous disposition and re-raises.
std::atomic<int> signal_wal_fd{-1};
struct sigaction previous_sigint, previous_sigterm;

extern "C" void sync_wal_and_reraise(int sig) {
  const int saved_errno = errno;
  if (int fd = signal_wal_fd.load(std::memory_order_relaxed); fd >= 0) ::fdatasync(fd);
  ::sigaction(sig, sig == SIGINT ? &previous_sigint : &previous_sigterm, nullptr);
  ::raise(sig);
  errno = saved_errno;
}

void sync_wal_on_signals(int fd) {
  signal_wal_fd.store(fd, std::memory_order_relaxed);
  for (auto [sig, previous] : {std::pair{SIGINT, &previous_sigint}, std::pair{SIGTERM, &previous_sigterm}}) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
        (current.sa_flags & SA_SIGINFO) != 0)
      continue;
    struct sigaction ours {};
    ours.sa_handler = sync_wal_and_reraise;
    sigemptyset(&ours.sa_mask);
    ::sigaction(sig, &ours, previous);
  }
}

void stop_syncing_wal_on_signals() { signal_wal_fd.store(-1, std::memory_order_relaxed); }

/// Whether a run directory that exists (or not) may be used under
/// Options::resume; marks `host` resumed where its run goes on.
Error check_resume(const Options& o, RunHost& host) {
  if (o.resume == Resume::must && o.run_id.empty())
    return {Errc::invalid_argument, "CHORUS_RESUME=must continues a run named by its id, and no run id is set: set "
                                    "CHORUS_RUN_ID (Options::run_id) to the id of the run to resume"};
  std::error_code ec;
  const bool exists = std::filesystem::exists(host.run_dir, ec);
  if (exists && o.resume == Resume::never)
    return {Errc::invalid_argument, "run directory " + host.run_dir +
                                        " already exists: run ids must be unique; choose another run_id "
                                        "(CHORUS_RUN_ID) or leave it unset, or set CHORUS_RESUME=allow "
                                        "(Options::resume) to continue that run"};
  if (!exists && o.resume == Resume::must)
    return {Errc::invalid_argument, "CHORUS_RESUME=must, but there is no run " + host.run_id + " to resume (no " +
                                        host.run_dir + "): check CHORUS_RUN_ID, CHORUS_DIR, CHORUS_PROJECT and "
                                        "CHORUS_GROUP, or set CHORUS_RESUME=allow to start the run if it is new"};
  host.resumed = exists;
  return {};
}

/// Where `chorus launch` started this rank: why the run host's process is
/// known to have exited (its rank is in the launch's CHORUS_LAUNCH_EXITS
/// file, "RANK CODE" a line), else "".
std::string launched_host_exit(const Settings& s) {
  const char* file = s.opts.read_env ? std::getenv("CHORUS_LAUNCH_EXITS") : nullptr;
  if (file == nullptr || *file == '\0') return {};
  const Result<std::string> text = io::detail::read_text(file, true, 1 << 20);
  if (!text) return {};
  // The run's places are consecutive global ranks; its host holds the first.
  const int host = s.topo.rank - s.run_rank;
  std::istringstream lines(*text);
  for (int rank = 0, code = 0; lines >> rank >> code;)
    if (rank == host)
      return "the run host (rank " + std::to_string(host) + ") exited with code " + std::to_string(code) +
             " before this rank joined, as chorus launch saw: see that rank's output for why";
  return {};
}

/// Whether the run's ranks are on several nodes (scope global across nodes).
bool spans_nodes(const Settings& s) { return s.topo.num_nodes > 1 && s.opts.scope == Scope::global; }

/// How a link between two of the job's processes travels: a Unix socket
/// private to this user (processes of one node), or TCP between nodes (TLS
/// with the job's credentials, plain where CHORUS_INSECURE allows it: one
/// process has one kind, actors/links/node_link.hpp).
enum class Link { local, node };

/// How this process's links to the job's other processes are secured.
struct LinkPlan {
  bool across_nodes = false; // the run's ranks are on several nodes
  bool tls = false;          // links between the run's nodes are mutual TLS
  bool group_tls = false;    // so are the links of the job's run hosts to its group
  io::Credentials creds;     // the job's, where either is
  [[nodiscard]] bool tls_or_group() const { return tls || group_tls; }
};

class SystemImpl final : public System {
public:
  /// `creds`: the job's credentials when links between nodes are
  /// authenticated (mutual TLS against the job's CA), null otherwise.
  /// `group_tls`: the links of the job's run hosts to its group are.
  /// `actors`: the orchestrator's actor system (<chorus/caf.hpp>), configured
  /// by System::configure; null: the System makes its own.
  SystemImpl(const Settings& s, const LinkPlan& plan, std::string socket_dir, caf::actor_system* actors)
      : group_tls_(plan.group_tls),
        own_(actors != nullptr ? nullptr : std::make_unique<caf::actor_system>(configure_own(cfg_, s, plan))),
        sys_(actors != nullptr ? *actors : *own_), socket_dir_(std::move(socket_dir)) {
    if (!socket_dir_.empty()) local_ = spawn_local_links(sys_, socket_dir_);
    node_tls_ = plan.tls_or_group();
    connection_timeout_ = s.opts.connection_timeout;
    if (s.topo.num_nodes > 1) node_ = spawn_node_links(sys_, node_tls_, connection_timeout_);
  }

  ~SystemImpl() override {
    leave_group();
    if (run_actor_) stop_syncing_wal_on_signals();
    if (monitor_) caf::anon_send_exit(monitor_, caf::exit_reason::user_shutdown);
    if (proxy_) caf::anon_send_exit(proxy_, caf::exit_reason::user_shutdown);
    if (run_actor_) caf::anon_send_exit(run_actor_, caf::exit_reason::user_shutdown);
    if (group_) caf::anon_send_exit(group_, caf::exit_reason::user_shutdown);
    if (local_) caf::anon_send_exit(local_, caf::exit_reason::kill);
    if (node_) caf::anon_send_exit(node_, caf::exit_reason::kill);
    for (const auto& d : dialers_) caf::anon_send_exit(d, caf::exit_reason::kill);
    // Our own system's destructor waits for every actor and stops the
    // middleman. An orchestrator's lives on: wait for the actors that hold
    // the Run's state (the proxy, the Run actor) and the rest we spawned.
    if (!own_) {
      std::vector<caf::actor> ours;
      auto add = [&](const auto& a) {
        if (a) ours.push_back(caf::actor_cast<caf::actor>(a));
      };
      add(monitor_);
      add(proxy_);
      add(run_actor_);
      add(group_);
      add(local_);
      add(node_);
      for (const auto& d : dialers_) add(d);
      caf::scoped_actor self{sys_};
      self->wait_for(ours);
    }
  }

  caf::actor proxy() const override { return caf::actor_cast<caf::actor>(proxy_); }

  /// Chorus's own actor system: what links need, and its scheduler.
  static caf::actor_system_config& configure_own(caf::actor_system_config& cfg, const Settings& s,
                                                 const LinkPlan& plan) {
    configure_links(cfg, s, plan);
    cfg.set("scheduler.max-threads", 2);
    // An actor yields its worker thread after this many messages (CAF's
    // default is unbounded): a Run actor with a long mailbox would otherwise
    // keep the keepalive pings of its ranks and group (actors/keepalive.hpp)
    // waiting behind it.
    cfg.set("scheduler.max-throughput", size_t{256});
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    cfg.set("logger.console-verbosity", caf::atom("quiet"));
    // CAF's idle scheduler threads poll every 50 us for 500 rounds (25 ms)
    // before they sleep on a condition variable (which an enqueue wakes):
    // after every timer an idle process would spin for 25 ms. 1 ms of it is
    // enough to catch the next message of a busy stream.
    cfg.set("work-stealing.moderate-poll-attempts", size_t{20});
    return cfg;
  }

  /// What the links between the job's processes need, in any actor system.
  static void configure_links(caf::actor_system_config& cfg, const Settings& s, const LinkPlan& plan) {
    cfg.load<caf::io::middleman>();
    register_wire_types(cfg);
    if (plan.tls_or_group()) {
      // CAF checks no host name: a peer is admitted by holding a certificate
      // of the job's own CA, which only the job's nodes have.
      cfg.load<caf::openssl::manager>();
      cfg.openssl_certificate = plan.creds.cert_file;
      cfg.openssl_key = plan.creds.key_file;
      cfg.openssl_cafile = plan.creds.ca_file;
    }
    // Messages from the network are deserialized on the multiplexer thread,
    // in arrival order: CAF 0.17's worker threads can hand a message over
    // before its connection's node is known (a lost sender, a dropped link).
    cfg.set("middleman.workers", size_t{0});
    // Heartbeats are off by default in CAF, where a silent peer is never
    // noticed. But CAF's heartbeat ticks close, besides silent links, any link this
    // process dialled whose handshake is still unanswered at the tick (CAF
    // 0.17 sets its "last seen" only once bytes come back): under load, or
    // on a slow link, every attempt to reach the run host would be closed
    // again. They run only where links are accepted (a run host with other
    // ranks, the job's group), to notice ranks that went silent; a process
    // that only dials keeps its links alive and watched itself
    // (actors/keepalive.hpp), and so do members of a remote group.
    const bool accepts = s.is_host && (s.run_world > 1 || (s.topo.rank == 0 && s.group_size > 0));
    cfg.set("middleman.heartbeat-interval", caf::timespan(accepts ? s.opts.heartbeat_interval : std::chrono::milliseconds(0)));
    cfg.set("middleman.connection-timeout", caf::timespan(s.opts.connection_timeout));
  }

  Error start(RunImpl& run) {
    const Settings& s = run.settings();
    run_actor host;
    std::string label = s.host_address + ":" + std::to_string(s.port);
    if (s.is_host) {
      if (Error e = start_host(run, host)) return e;
      label = "this process";
    } else {
      if (Error e = dial_run_host(s, host)) return e;
    }
    host_ = host;
    init_timeout_ = s.opts.init_timeout;
    auto joined = std::make_shared<std::promise<JoinResult>>();
    auto future = joined->get_future();
    proxy_ = spawn_rank_proxy(sys_, run, host, label, [joined](JoinResult r) { joined->set_value(std::move(r)); });
    run.channel().nudge = [p = proxy_] { caf::anon_send(p, nudge_atom::value); };
    if (future.wait_for(s.opts.init_timeout + std::chrono::seconds(1)) != std::future_status::ready)
      return {Errc::connect_failed, "the run host at " + label + " accepted the connection but did not answer the "
                                    "join within init_timeout; check the host rank's output"};
    JoinResult r = future.get();
    if (r.error) return r.error;
    // The host's own rank has joined its run first: the group may take up to
    // init_timeout to reach, and the run host refuses ranks later than that.
    if (s.is_host && s.group_size > 0) join_group(run);
    if (s.opts.system_interval > 0) start_monitor(run, host);
    return {};
  }

  Error exchange_nccl_id(bool provide, std::vector<char>& id) override {
    if (!host_) return {Errc::host_lost, "the run host is not connected: no NCCL id to exchange"};
    if (provide) {
      // Sent with a sender: the Run actor takes the id from its own process only.
      caf::scoped_actor self{sys_};
      self->send(host_, nccl_id_atom::value, id);
      return {};
    }
    Error err;
    caf::scoped_actor self{sys_};
    self->request(host_, init_timeout_, nccl_id_atom::value)
        .receive([&](const std::vector<char>& got) { id = got; },
                 [&](caf::error& e) {
                   err = {Errc::timeout, "the run host did not hand out the NCCL id within init_timeout (" +
                                             std::to_string(init_timeout_.count()) + " ms; " + sys_.render(e) +
                                             "): the run host (rank 0) must call reduce_device too"};
                 });
    return err;
  }

private:
  /// The rank's SystemMonitor: its process and GPU, and its node on the
  /// node's local rank 0 (which also tells, once, what cannot be sampled).
  void start_monitor(const RunImpl& run, const run_actor& host) {
    const Settings& s = run.settings();
    io::SystemLabels labels;
    labels.node = s.topo.node_rank;
    labels.rank = s.topo.rank;
    labels.local_rank = static_cast<unsigned>(std::max(0, s.topo.local_rank));
    labels.node_figures = s.topo.local_rank == 0;
    std::error_code ec;
    // Disk figures are for the run directory where it is on this node, else
    // for the directory runs go to.
    std::string watched = s.is_host ? run.run_dir : (std::filesystem::is_directory(s.opts.dir, ec) ? s.opts.dir : ".");
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string visible_copy = visible ? visible : "";
    auto make = [labels, watched, has_visible = visible != nullptr, visible_copy] {
      return std::make_unique<io::SystemSampler>(labels, watched, "libnvidia-ml.so.1",
                                                 has_visible ? visible_copy.c_str() : nullptr);
    };
    const auto interval = std::chrono::microseconds(std::llround(s.opts.system_interval * 1e6));
    monitor_ = spawn_system_monitor(sys_, host, std::move(make), interval, static_cast<std::uint32_t>(s.run_rank),
                                    unix_now_us(), labels.node_figures);
  }

  Error start_host(RunImpl& run, run_actor& out) {
    const Settings& s = run.settings();
    auto host = std::make_shared<RunHost>();
    host->settings = s;
    host->run_id = s.opts.run_id.empty() ? new_run_id() : s.opts.run_id;
    host->run_dir = (std::filesystem::path(s.opts.dir) / s.opts.project / s.opts.group / host->run_id).string();
    host->start_us = unix_now_us();
    if (Error e = check_resume(s.opts, *host)) return e;
    if (Error e = io::make_dirs(host->run_dir)) return e;
    if (Error e = io::make_dirs(host->run_dir + "/artifacts")) return e;
    Result<std::unique_ptr<io::WalWriter>> wal = io::WalWriter::open(host->run_dir + "/wal");
    if (!wal) return wal.error();
    host->wal = std::move(*wal);
    host->run_json = identity_json(s, host->run_id, host->run_dir, host->start_us);
    host->job = job_identity(s);
    host->finish = &run.finish_state();
    run.run_id = host->run_id;
    run.run_dir = host->run_dir;
    sync_wal_on_signals(host->wal->fd());
    run_actor_ = spawn_run_actor(sys_, host);
    if (host->resumed) {
      std::string refusal;
      caf::scoped_actor self{sys_};
      self->request(run_actor_, caf::infinite, resume_atom::value)
          .receive([&](std::string& r) { refusal = std::move(r); }, [&](caf::error& e) { refusal = sys_.render(e); });
      if (!refusal.empty()) {
        stop_run_actor(); // the run's directory stays: it is the earlier attempts'
        return {Errc::invalid_argument, refusal};
      }
    }
    if (s.run_world > 1) {
      // Only a run that spans nodes listens on the network: a node-scope
      // run's ranks are all on its host's node, and link through its socket.
      const Link link = run_link(s);
      auto port = publish(run_actor{run_actor_}, s.port, link);
      if (!port) {
        Error e{Errc::address_in_use,
                "the run host cannot listen on " + where(s, s.port, link) + ": " + sys_.render(port.error()) +
                    ". Another job may hold it: set CHORUS_PORT to a free port on every rank." +
                    (link == Link::local ? std::string() : io::detail::ephemeral_port_note(s.port))};
        discard_run(host->run_dir);
        return e;
      }
    }
    note_run_for_launcher(s, host->run_dir);
    out = run_actor_;
    return {};
  }

  /// A run that never started (its host could not listen) leaves no
  /// directory behind to be taken for a crashed run.
  void discard_run(const std::string& dir) {
    stop_run_actor();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  void stop_run_actor() {
    stop_syncing_wal_on_signals();
    caf::scoped_actor self{sys_};
    self->send_exit(run_actor_, caf::exit_reason::kill);
    self->wait_for(run_actor_);
    run_actor_ = nullptr;
  }

  /// How the ranks of this run reach its host.
  Link run_link(const Settings& s) const {
    return !spans_nodes(s) ? Link::local : Link::node;
  }

  /// Names the listener of `port` (at `address`, where it is another
  /// machine's) for an error, and the job it was derived from, if it was.
  std::string where(const Settings& s, std::uint16_t port, Link link, const std::string& address = {}) const {
    if (link == Link::local) return local_socket_path(socket_dir_, port) + " (" + port_name(s, port) + ")";
    return (address.empty() ? "port " : address + ":") + std::to_string(port) +
           (s.port_job.empty() ? std::string() : " (" + port_name(s, port) + ")");
  }

  /// The middleman actor that opens links of kind `link`.
  caf::io::middleman_actor connector(Link link) {
    return link == Link::local ? local_ : node_;
  }

  /// Another middleman actor for links of kind `link`, which dial() uses
  /// after an attempt went unanswered; stopped with the System.
  caf::io::middleman_actor fresh_connector(Link link) {
    dialers_.push_back(link == Link::local ? spawn_local_links(sys_, socket_dir_)
                                           : spawn_node_links(sys_, node_tls_, connection_timeout_));
    return dialers_.back();
  }

  /// Publishes `whom` on `port`: this user's socket for it (local), or every
  /// interface (TLS, or plain TCP between nodes); with its interface's
  /// signatures, which dial() checks.
  template <class Handle>
  caf::expected<std::uint16_t> publish(const Handle& whom, std::uint16_t port, Link link) {
    if (link == Link::local && !local_)
      return caf::make_error(caf::sec::cannot_open_port, "no socket directory for local links");
    if (link == Link::node && !node_)
      return caf::make_error(caf::sec::cannot_open_port, "no links between nodes in a job of one node");
    caf::expected<std::uint16_t> out{std::uint16_t{0}};
    caf::scoped_actor self{sys_};
    self->request(connector(link), caf::infinite, caf::publish_atom::value, port,
                  caf::actor_cast<caf::strong_actor_ptr>(whom), sys_.message_types(whom), std::string(), true)
        .receive([&](std::uint16_t actual) { out = actual; }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  /// Dials host:port until `deadline`: a bounded TCP probe, then CAF's
  /// handshake through the middleman actor, bounded by a request timeout.
  /// Returns "" with the actor published there in `out`, or the last reason
  /// it failed; at once where the actor there was published with another
  /// interface than Handle's (another program, or another chorus, holds the port).
  /// `gone`, where given, says why dialing is over before the deadline ("" while it is not).
  template <class Handle>
  Error dial(const std::string& address, std::uint16_t port, Link link, clock::time_point deadline, Handle& out,
             const std::function<std::string()>& gone = {}) {
    std::string why = "nothing tried";
    auto failed = [](std::string what) { return Error(Errc::connect_failed, std::move(what)); };
    // Ranks often start before the host listens: retry soon, then back off.
    auto pause = std::chrono::milliseconds(5);
    // CAF 0.17 answers no connect whose link its heartbeat tick closed during
    // the handshake (actors/keepalive.hpp), and its middleman actor makes any
    // later connect to that address wait on the lost one. An attempt is
    // bounded, and after one went unanswered the next goes through a
    // middleman actor of its own. It gets at least the time the host gives a
    // handshake (connection_timeout), so that a slow one (TLS on a loaded
    // machine) is not cut short only to start again.
    auto attempt_limit = std::max(std::chrono::milliseconds(3000), connection_timeout_);
    caf::io::middleman_actor via = connector(link);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      if (left.count() <= 0) break;
      // A Unix socket answers at once; a TCP host is probed first (see tcp_probe).
      Error probe;
      if (link == Link::node) probe = io::detail::tcp_probe(address, port, std::min(left, std::chrono::milliseconds(1000)));
      if (probe) why = probe.message();
      if (!probe) {
        caf::scoped_actor self{sys_};
        bool ok = false, unanswered = false, foreign = false;
        const auto waited = std::min(left, attempt_limit);
        self->request(via, waited, caf::connect_atom::value, address, port)
            .receive(
                [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>& ifs) {
                  if (!ptr) {
                    why = "nothing published on that port yet";
                  } else if (!sys_.assignable<Handle>(ifs)) {
                    foreign = true;
                    why = "what listens there does not take chorus's messages (another program, or a process "
                          "built against another chorus, holds the port)";
                  } else {
                    out = caf::actor_cast<Handle>(std::move(ptr));
                    ok = true;
                  }
                },
                [&](caf::error& e) {
                  unanswered = e == caf::sec::request_timeout;
                  why = unanswered ? "the handshake went unanswered for " + std::to_string(waited.count()) + " ms"
                                   : sys_.render(e);
                });
        if (ok) return {};
        if (foreign) return failed(why);
        if (unanswered) {
          via = fresh_connector(link);
          attempt_limit = std::min(attempt_limit * 2, std::max(std::chrono::milliseconds(12000), connection_timeout_));
        }
      }
      if (gone)
        if (std::string over = gone(); !over.empty()) return failed(std::move(over));
      std::this_thread::sleep_for(
          std::min(pause, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now())));
      pause = std::min(pause * 2, std::chrono::milliseconds(100));
    }
    return failed(why);
  }

  /// Dials the run host until init_timeout, or until `chorus launch` says the
  /// host's process exited (a host that dies before a rank joins would
  /// otherwise keep that rank dialing for the whole init_timeout).
  Error dial_run_host(const Settings& s, run_actor& out) {
    const Link link = run_link(s);
    bool host_exited = false;
    const Error dialed = dial(s.host_address, s.port, link, clock::now() + s.opts.init_timeout, out, [&] {
      std::string exited = launched_host_exit(s);
      host_exited = !exited.empty();
      return exited;
    });
    if (!dialed) return {};
    const std::string& why = dialed.message();
    if (host_exited)
      return {Errc::connect_failed, "rank " + std::to_string(s.topo.rank) + " could not reach the run host: " + why};
    return {Errc::connect_failed,
            "rank " + std::to_string(s.topo.rank) + " could not reach the run host at " +
                where(s, s.port, link, s.host_address) +
                " within init_timeout (" + std::to_string(s.opts.init_timeout.count()) +
                " ms; last attempt: " + why + (s.topo.num_nodes > 1 ? std::string(
                    "; across nodes, every rank needs the same CHORUS_TLS_DIR credentials as the run host") : std::string()) +
                "). Check that rank 0 is running, that MASTER_ADDR / CHORUS_PORT point to it on every rank, or raise "
                "CHORUS_INIT_TIMEOUT"};
  }

  /// The job's group: on global rank 0, the Group actor, which the run hosts
  /// of the other processes dial before their runs take values, so that a
  /// run that dies early is known to the group (up to init_timeout; a group
  /// out of reach costs the run nothing else). It takes other nodes' runs
  /// only over authenticated links, or where CHORUS_INSECURE allows plain ones.
  void join_group(const RunImpl& run) {
    const Settings& s = run.settings();
    const bool other_nodes = s.topo.num_nodes > 1 && (group_tls_ || s.opts.insecure);
    joined_group_ = true;
    finish_timeout_ = s.opts.finish_timeout;
    if (s.topo.rank == 0) {
      start_group(run, other_nodes);
      return;
    }
    // Node 0 shares global rank 0's machine; the others need its address.
    if (s.topo.node_rank != 0 && (!other_nodes || s.group_address.empty())) return;
    const std::string address = s.topo.node_rank == 0 ? std::string("127.0.0.1") : s.group_address;
    group_actor group;
    const Error dialed =
        dial(address, s.group_port, group_link(other_nodes), clock::now() + s.opts.init_timeout, group);
    if (!dialed)
      register_run(group, s.opts.init_timeout);
    else
      std::fprintf(stderr, "chorus: the run of rank %d could not reach the job's group at %s:%u within init_timeout "
                           "(%s): it goes on, and group.json will list it as missing\n",
                   s.topo.rank, address.c_str(), static_cast<unsigned>(s.group_port), dialed.message().c_str());
  }

  void start_group(const RunImpl& run, bool other_nodes) {
    const Settings& s = run.settings();
    group_ = spawn_group_actor(sys_, group_host(s));
    if (s.topo.num_nodes > 1 && !other_nodes)
      std::fprintf(stderr, "chorus: the runs on other nodes cannot report to the job's group without the job's "
                           "credentials (CHORUS_TLS_DIR, or CHORUS_INSECURE=1): group.json will list them as "
                           "missing\n");
    const Link link = group_link(other_nodes);
    if (auto port = publish(group_, s.group_port, link); !port)
      std::fprintf(stderr, "chorus: the job's group cannot listen on %s (%s): the other processes' runs cannot "
                           "report to it; set CHORUS_PORT to a free port on every rank.%s\n",
                   where(s, s.group_port, link).c_str(), sys_.render(port.error()).c_str(),
                   link == Link::local ? "" : io::detail::ephemeral_port_note(s.group_port).c_str());
    register_run(group_, s.opts.init_timeout);
  }

  /// How the job's run hosts reach its group: across nodes (where allowed)
  /// over the network, else through this node's socket.
  Link group_link(bool other_nodes) const {
    return !other_nodes ? Link::local : Link::node;
  }

  /// Hands the Group to the Run actor, which registers with it; returns once
  /// the Group has the run (or `limit` ran out).
  void register_run(const group_actor& group, std::chrono::milliseconds limit) {
    caf::scoped_actor self{sys_};
    self->request(run_actor_, limit, group_atom::value, group).receive([](caf::ok_atom) {}, [](caf::error&) {});
  }

  /// Before the actors stop: this run's last report reaches the group (a
  /// member), or the members' runs end (global rank 0), each bounded by
  /// finish_timeout.
  void leave_group() {
    const auto deadline = clock::now() + finish_timeout_;
    caf::scoped_actor self{sys_};
    auto wait = [&](const auto& whom, auto... msg) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
      self->request(whom, std::max(left, std::chrono::milliseconds(1)) + std::chrono::seconds(1), msg...)
          .receive([](caf::ok_atom) {}, [](caf::error&) {});
    };
    if (run_actor_ && joined_group_) wait(run_actor_, group_atom::value);
    if (group_) wait(group_, finish_atom::value);
  }

  bool group_tls_;
  caf::actor_system_config cfg_;            // of own_ only
  std::unique_ptr<caf::actor_system> own_;  // null in an orchestrator's system
  caf::actor_system& sys_;
  caf::io::middleman_actor local_; // links within this node (actors/links/local_link.hpp)
  caf::io::middleman_actor node_;  // links between nodes, TLS or plain (actors/links/node_link.hpp)
  bool node_tls_ = false;
  std::chrono::milliseconds connection_timeout_{0};
  std::vector<caf::io::middleman_actor> dialers_; // see fresh_connector
  std::string socket_dir_;
  run_host_actor run_actor_;
  rank_proxy_actor proxy_;
  run_actor host_; // the Run actor, here or remote
  system_monitor_actor monitor_;
  group_actor group_; // global rank 0's Group actor
  bool joined_group_ = false;
  std::chrono::milliseconds finish_timeout_{0};
  std::chrono::milliseconds init_timeout_{0};
};

Result<LinkPlan> plan_links(const Settings& s) {
  LinkPlan plan;
  // Links between nodes carry records from other machines: they are
  // authenticated with the job's credentials, or explicitly allowed not to be.
  plan.across_nodes = s.run_world > 1 && spans_nodes(s);
  // A job's run hosts report to its group on global rank 0, across nodes too.
  plan.group_tls = s.is_host && s.group_size > 0 && s.topo.num_nodes > 1 && !s.opts.tls_dir.empty();
  if ((plan.across_nodes && !s.opts.tls_dir.empty()) || plan.group_tls)
    if (Error e = io::check_credentials(s.opts.tls_dir, plan.creds)) return e;
  plan.tls = plan.across_nodes && !s.opts.tls_dir.empty();
  if (plan.across_nodes && !plan.tls && !s.opts.insecure)
    return {Errc::invalid_argument,
            "this run spans " + std::to_string(s.topo.num_nodes) +
                " nodes, and links between nodes need the job's credentials: run `chorus certs DIR` once, copy DIR "
                "to every node and set CHORUS_TLS_DIR=DIR on every rank (or set CHORUS_INSECURE=1 to accept "
                "unauthenticated links, on a network you trust)"};
  return plan;
}

/// Whether an orchestrator's actor system can carry the run's links; the
/// error names what is missing and the fix.
Error check_orchestrator_system(caf::actor_system& sys, const Settings& s, const LinkPlan& plan) {
  if (s.run_world <= 1 && s.group_size == 0) return {}; // nothing links
  const std::string fix = ": call chorus::actors::configure(cfg, opts) on the actor system's configuration before "
                          "constructing the system (<chorus/caf.hpp>)";
  if (!sys.has_middleman())
    return {Errc::invalid_argument, "this run links the job's processes, and the actor system has no middleman" + fix};
  if (plan.tls_or_group() && !sys.has_openssl_manager())
    return {Errc::invalid_argument, "this run links nodes with the job's credentials (CHORUS_TLS_DIR), and the actor "
                                    "system has no OpenSSL manager" + fix};
  if (caf::get_or(sys.config(), "middleman.workers", caf::defaults::middleman::workers) != 0)
    return {Errc::invalid_argument, "the actor system's middleman has worker threads (middleman.workers), which "
                                    "CAF 0.17 lets hand a message over before its link is known" + fix};
  return {};
}

} // namespace

Error System::configure(caf::actor_system_config& cfg, const Settings& s) {
  const Result<LinkPlan> plan = plan_links(s);
  if (!plan) return plan.error();
  SystemImpl::configure_links(cfg, s, *plan);
  return {};
}

Result<std::unique_ptr<System>> System::start(RunImpl& run, caf::actor_system* actors) {
  const Settings& s = run.settings();
  const Result<LinkPlan> planned = plan_links(s);
  if (!planned) return planned.error();
  const LinkPlan& plan = *planned;
  if (actors != nullptr)
    if (Error e = check_orchestrator_system(*actors, s, plan)) return e;
  if (plan.across_nodes && !plan.tls && s.topo.rank == 0)
    std::fprintf(stderr, "chorus: WARNING: CHORUS_INSECURE=1: the run host on port %u accepts records from any "
                         "peer that can reach it, unauthenticated; make credentials with `chorus certs DIR` and set "
                         "CHORUS_TLS_DIR instead\n",
                 static_cast<unsigned>(s.port));
  // Links within the node go through this user's socket directory.
  std::string socket_dir;
  if ((s.run_world > 1 && !plan.across_nodes) || s.group_size > 0) {
    Result<std::string> dir = local_socket_dir(s.opts.read_env);
    if (!dir) return dir.error();
    socket_dir = std::move(*dir);
  }
  auto sys = std::make_unique<SystemImpl>(s, plan, socket_dir, actors);
  // A System that failed to start stops its actors here, while the run
  // they point to is still whole.
  if (Error e = sys->start(run)) return e;
  return std::unique_ptr<System>(std::move(sys));
}

} // namespace chorus::detail
