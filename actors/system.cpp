// A process's actors, wired: its actor system (chorus's own, or an
// orchestrator's), the run host's Run actor and its port, the rank's dial to
// the run host, its RankProxy and SystemMonitor, and the job's Group. How
// links travel is actors/links/links.hpp; the run's directory and WAL before
// its Run actor exists, actors/run_host_setup.hpp.
#include "actors/system.hpp"
#include "actors/group.hpp"
#include "actors/job_secret.hpp"
#include "actors/links/links.hpp"
#include "actors/links/local_link.hpp"
#include "actors/protocol.hpp"
#include "actors/rank_proxy.hpp"
#include "actors/run.hpp"
#include "actors/run_host_setup.hpp"
#include "actors/sync_rounds.hpp"
#include "actors/system_monitor.hpp"
#include "actors/wal_syncers.hpp"
#include "io/platform/posix.hpp"
#include "io/sampling/system_metrics.hpp"
#include "io/store/wal.hpp"
#include "runtime/client/endings.hpp"
#include "runtime/client/run_impl.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <new>
#include <thread>

#include <pthread.h>
#include <unistd.h>

namespace chorus::actors {

using platform::unix_now_us;

namespace {

using clock = std::chrono::steady_clock;

/// Whether the job's group takes runs of other nodes: over authenticated
/// links, or where CHORUS_INSECURE allows plain ones.
bool group_spans_nodes(const core::Settings& s, bool group_tls) {
  return s.topo.num_nodes > 1 && (group_tls || s.opts.insecure);
}

/// How the ranks of a run reach its host.
Link run_link(const core::Settings& s) { return spans_nodes(s) ? Link::node : Link::local; }

/// How the job's run hosts reach its group: across nodes (where allowed)
/// over the network, else through this node's socket.
Link group_link(bool other_nodes) { return other_nodes ? Link::node : Link::local; }

/// Whether `chorus launch` hears where the run lives as soon as its
/// directory is made (start_system): a fresh run of one rank. A run of
/// several ranks is told once its port is open, a resumed one once its Run
/// actor took the earlier attempts' (SystemImpl::start_host): a run that
/// fails there is not launch's to add exit codes to.
bool launch_told_at_once(const core::Settings& s, const RunHost& host) { return s.run_world == 1 && !host.resumed; }

/// A run whose actors failed after init returned (a run of this process
/// alone starts them behind init: start_system): its calls, and its end, get `e`.
void fail_run(client::RunImpl& run, Error e) {
  {
    std::lock_guard lock(run.finish_state().mu);
    FinishResult& r = run.finish_state().result;
    if (!r.error) r.error = e;
    r.state = RunState::failed;
  }
  run.channel().fail(std::move(e));
}

/// The WAL syncers of the actor system this process keeps for its runs
/// (kept_system), where `sys` is that system; else null.
std::shared_ptr<WalSyncers> kept_syncers(const caf::actor_system& sys);

/// Returns once every actor of `actors` has ended (its state destroyed, as
/// a monitor's down message would say). Each tells as it ends, and the
/// caller wakes once, at the last: no actor of its own is made to wait (a
/// scoped actor's monitors wake it at each down message, and its end wakes
/// the system's clock, each a cross-thread wake-up that costs some virtual
/// machines 0.1 ms).
void wait_terminated(const std::vector<caf::actor>& actors) {
  if (actors.empty()) return;
  auto left = std::make_shared<std::atomic<std::size_t>>(actors.size());
  for (const caf::actor& a : actors)
    caf::actor_cast<caf::abstract_actor*>(a)->attach_functor([left] {
      if (left->fetch_sub(1, std::memory_order_acq_rel) == 1) left->notify_all();
    });
  for (std::size_t n = left->load(std::memory_order_acquire); n != 0; n = left->load(std::memory_order_acquire))
    left->wait(n, std::memory_order_acquire);
}

class SystemImpl final : public client::System {
public:
  /// `plan`: how this process links to the job's others; `socket_dir`: this
  /// user's socket directory, where anything links within the node.
  /// `actors`: an actor system that outlives the run (an orchestrator's,
  /// <chorus/caf.hpp>, configured by configure_system; or the one this
  /// process keeps for its runs that link nothing, kept_system); null: the
  /// System makes its own.
  SystemImpl(const core::Settings& s, const LinkPlan& plan, std::string socket_dir, std::string secret,
             std::string group_secret, caf::actor_system* actors)
      : group_tls_(plan.group_tls), secret_(std::move(secret)), group_secret_(std::move(group_secret)),
        own_(actors != nullptr ? nullptr : std::make_unique<caf::actor_system>(configure_own(cfg_, s))),
        sys_(actors != nullptr ? *actors : *own_),
        links_(sys_, plan, std::move(socket_dir), links_anything(s) && s.topo.num_nodes > 1, s.opts.connection_timeout) {}

  ~SystemImpl() override {
    leave_group();
    if (run_actor_) client::endings::forget_wal(wal_fd_);
    {
      // Sent by an actor of this process in its own name: the only exits
      // chorus's actors obey besides their links' (actors/guard.hpp).
      caf::scoped_actor stopper{sys_};
      if (monitor_) stopper->send_exit(monitor_, caf::exit_reason::user_shutdown);
      if (proxy_) stopper->send_exit(proxy_, caf::exit_reason::user_shutdown);
      if (run_actor_) stopper->send_exit(run_actor_, caf::exit_reason::user_shutdown);
      if (group_) stopper->send_exit(group_, caf::exit_reason::user_shutdown);
    }
    links_.stop();
    // Our own system's destructor waits for every actor and stops the
    // middleman. One that outlives the run lives on: wait for the actors
    // that hold the Run's state (the proxy, the Run actor), the rest we
    // spawned, and the Run actor's helpers.
    if (!own_) {
      std::vector<caf::actor> ours;
      auto add = [&](const auto& a) {
        if (a) ours.push_back(caf::actor_cast<caf::actor>(a));
      };
      add(monitor_);
      add(proxy_);
      add(run_actor_);
      add(group_);
      for (const auto& m : links_.actors()) add(m);
      wait_terminated(ours);
      // They stop with the Run actor, which has ended: its list is whole.
      if (helpers_) wait_terminated(helpers_->take());
    }
  }

  caf::actor proxy() const override { return caf::actor_cast<caf::actor>(proxy_); }

  /// Chorus's own actor system: what links need, and its scheduler.
  static caf::actor_system_config& configure_own(caf::actor_system_config& cfg, const core::Settings& s) {
    // A run of this process alone starts no middleman (its threads, its
    // multiplexer, its look at the network interfaces): nothing links.
    if (links_anything(s))
      configure_links(cfg, s);
    else
      register_wire_types(cfg);
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
    // after every timer an idle process would spin for 25 ms. On the host
    // of ranks in other processes, 1 ms of it is enough to catch the next
    // message of a busy stream; another rank's own work comes from its
    // trainer (which wakes it) and its host's acks, and hundreds of such
    // ranks polling after every message would take a small machine's cores
    // from the host. A run of one process polls not at all: its messages
    // come from its own trainer's proxy, which wakes a worker, and a worker
    // polling beside them took a core from the trainer and the proxy
    // (BENCHMARKS.md, 2026-11-30: one producer thread 1.15x as fast).
    cfg.set("work-stealing.moderate-poll-attempts",
            s.is_host && links_anything(s) ? size_t{20} : size_t{0});
    // ... and, asleep, wake every 10 ms to steal work (an enqueue from
    // outside wakes them at once): 200 wake-ups a second, about 1 % of a
    // core in every process that waits, which hundreds of ranks on one
    // machine turn into all of its cores. Every 100 ms is enough to steal.
    cfg.set("work-stealing.relaxed-sleep-duration", caf::timespan(std::chrono::milliseconds(100)));
    return cfg;
  }

  /// Starts this rank's actors and joins the run: on the run host, its Run
  /// actor over `prepared` (prepare_run_host's) and, for several ranks, its
  /// port; elsewhere, the dial to the host. Then the RankProxy, which joins.
  /// `await_join`: returns once the join is answered, with its refusal if
  /// any. Without it (a run of this process alone, whose own rank nothing
  /// refuses: start_system), the trainer logs into the ring meanwhile, and
  /// a join that fails anyway fails the run's calls.
  Error start(client::RunImpl& run, std::shared_ptr<RunHost> prepared, bool await_join) {
    const core::Settings& s = run.settings();
    run_actor host;
    std::string label = s.host_address + ":" + std::to_string(s.port);
    // One deadline for the whole of init: reaching the host, then the join.
    const auto deadline = clock::now() + s.opts.init_timeout;
    if (s.is_host) {
      if (Error e = start_host(run, std::move(prepared), host)) return e;
      label = "this process";
    } else {
      if (Error e = dial_run_host(s, host, deadline)) return e;
    }
    host_ = host;
    init_timeout_ = s.opts.init_timeout;
    // Awaited, the join's answer comes back through `joined`.
    auto joined = await_join ? std::make_shared<std::promise<JoinResult>>() : nullptr;
    std::future<JoinResult> future = joined ? joined->get_future() : std::future<JoinResult>();
    proxy_ = spawn_rank_proxy(sys_, run, host, label, secret_, deadline, [&run, joined](JoinResult r) {
      if (joined) return joined->set_value(std::move(r));
      // The statics that the actor system and the run's actors made as
      // they started (all made by the join's answer) are destroyed at exit
      // before an exit handler registered earlier, as init's was: the
      // process's first such run registers it again, after them, so that
      // the runs end at exit while those are whole.
      static std::once_flag once;
      std::call_once(once, [] { client::endings::register_exit_again(); });
      if (r.error) fail_run(run, std::move(r.error));
    });
    run.channel().set_nudge([p = proxy_] { caf::anon_send(p, nudge_atom::value); });
    if (joined) {
      // The proxy answers by the deadline; the margin is for a scheduler busy elsewhere.
      if (future.wait_until(deadline + std::chrono::milliseconds(500)) != std::future_status::ready)
        return {Errc::connect_failed, "the run host at " + label + " accepted the connection but did not answer the "
                                      "join within init_timeout; check the host rank's output"};
      JoinResult r = future.get();
      if (r.error) return r.error;
    }
    // The host's own rank has joined its run first (a run with a group
    // awaits its join): the group may take up to init_timeout to reach, and
    // the run host refuses ranks later than that.
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

  void report_exit(int status) override {
    if (!proxy_) return;
    // A host that is gone answers at once (its link is down); one that hangs
    // is not waited for long: the process is exiting.
    caf::scoped_actor self{sys_};
    self->request(proxy_, std::chrono::seconds(5), exited_atom::value, static_cast<std::int32_t>(status))
        .receive([](caf::ok_atom) {}, [](caf::error&) {});
  }

private:
  /// The rank's SystemMonitor: its process and GPU, and its node on the
  /// node's local rank 0 (which also tells, once, what cannot be sampled).
  void start_monitor(const client::RunImpl& run, const run_actor& host) {
    const core::Settings& s = run.settings();
    sampling::SystemLabels labels;
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
      return std::make_unique<sampling::SystemSampler>(labels, watched, "libnvidia-ml.so.1",
                                                 has_visible ? visible_copy.c_str() : nullptr);
    };
    const auto interval = std::chrono::microseconds(std::llround(s.opts.system_interval * 1e6));
    monitor_ = spawn_system_monitor(sys_, host, std::move(make), interval, static_cast<std::uint32_t>(s.run_rank),
                                    unix_now_us(), labels.node_figures);
  }

  /// The Run actor over `host` (the run's directory and WAL, made by
  /// prepare_run_host and noted by start_system), listening where ranks of
  /// other processes join.
  Error start_host(client::RunImpl& run, std::shared_ptr<RunHost> host, run_actor& out) {
    const core::Settings& s = run.settings();
    host->secret = secret_;
    host->group_secret = group_secret_;
    wal_fd_ = host->wal->fd();
    helpers_ = host->helpers;
    host->syncers = kept_syncers(sys_);
    client::endings::note_wal(wal_fd_);
    run_actor_ = spawn_run_actor(sys_, host);
    if (host->resumed) {
      Error refusal;
      caf::scoped_actor self{sys_};
      self->request(run_actor_, caf::infinite, resume_atom::value)
          .receive([&](const WireError& r) { refusal = r.error(); },
                   [&](caf::error& e) {
                     refusal = Error(Errc::internal, "the run host did not say whether the run resumed: " +
                                                         sys_.render(e));
                   });
      if (refusal) {
        stop_run_actor(); // the run's directory stays: it is the earlier attempts'
        return refusal;
      }
    }
    if (s.run_world > 1) {
      // A connection a rank, beside the run's files and the process's own.
      if (const Error short_of = platform::raise_open_files(static_cast<std::uint64_t>(s.run_world) + 256))
        std::fprintf(stderr, "chorus: WARNING: the run host of %d ranks: %s; ranks beyond the limit cannot join\n",
                     s.run_world, short_of.message().c_str());
      // Only a run that spans nodes listens on the network: a node-scope
      // run's ranks are all on its host's node, and link through its socket.
      const Link link = run_link(s);
      auto port = links_.publish(run_actor{run_actor_}, s.port, link);
      if (!port) {
        Error e{Errc::address_in_use,
                "the run host cannot listen on " + links_.where(s, s.port, link) + ": " + sys_.render(port.error()) +
                    ". Another job may hold it: set CHORUS_PORT to a free port on every rank." +
                    (link == Link::local ? std::string() : platform::ephemeral_port_note(s.port))};
        discard_run(host->run_dir);
        return e;
      }
    }
    if (!launch_told_at_once(s, *host)) note_run_for_launcher(s, host->run_dir);
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
    client::endings::forget_wal(wal_fd_);
    caf::scoped_actor self{sys_};
    self->send_exit(run_actor_, caf::exit_reason::kill);
    self->wait_for(run_actor_);
    run_actor_ = nullptr;
  }


  /// Dials the run host until `deadline` (init's), or until `chorus launch` says the
  /// host's process exited (a host that dies before a rank joins would
  /// otherwise keep that rank dialing for the whole init_timeout).
  Error dial_run_host(const core::Settings& s, run_actor& out, clock::time_point deadline) {
    const Link link = run_link(s);
    bool host_exited = false;
    const Error dialed = links_.dial(s.host_address, s.port, link, deadline, out, [&] {
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
                links_.where(s, s.port, link, s.host_address) +
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
  void join_group(const client::RunImpl& run) {
    const core::Settings& s = run.settings();
    const bool other_nodes = group_spans_nodes(s, group_tls_);
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
        links_.dial(address, s.group_port, group_link(other_nodes), clock::now() + s.opts.init_timeout, group);
    if (!dialed)
      register_run(group, s.opts.init_timeout);
    else
      std::fprintf(stderr, "chorus: the run of rank %d could not reach the job's group at %s:%u within init_timeout "
                           "(%s): it goes on, and group.json will list it as missing\n",
                   s.topo.rank, address.c_str(), static_cast<unsigned>(s.group_port), dialed.message().c_str());
  }

  void start_group(const client::RunImpl& run, bool other_nodes) {
    const core::Settings& s = run.settings();
    GroupHost g = group_host(s);
    g.secret = group_secret_;
    group_ = spawn_group_actor(sys_, std::move(g));
    if (s.topo.num_nodes > 1 && !other_nodes)
      std::fprintf(stderr, "chorus: the runs on other nodes cannot report to the job's group without the job's "
                           "credentials (CHORUS_TLS_DIR, or CHORUS_INSECURE=1): group.json will list them as "
                           "missing\n");
    const Link link = group_link(other_nodes);
    if (auto port = links_.publish(group_, s.group_port, link); !port)
      std::fprintf(stderr, "chorus: the job's group cannot listen on %s (%s): the other processes' runs cannot "
                           "report to it; set CHORUS_PORT to a free port on every rank.%s\n",
                   links_.where(s, s.group_port, link).c_str(), sys_.render(port.error()).c_str(),
                   link == Link::local ? "" : platform::ephemeral_port_note(s.group_port).c_str());
    register_run(group_, s.opts.init_timeout);
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
  std::string secret_;       // the job's, for the run's joins (actors/job_secret.hpp)
  std::string group_secret_; // ... and for the reports to the job's group
  caf::actor_system_config cfg_;            // of own_ only
  std::unique_ptr<caf::actor_system> own_;  // null in an orchestrator's system
  caf::actor_system& sys_;
  Links links_; // publishes this process's actors, dials the job's others
  run_host_actor run_actor_;
  rank_proxy_actor proxy_;
  run_actor host_; // the Run actor, here or remote
  std::shared_ptr<Helpers> helpers_; // the Run actor's, where it is here
  system_monitor_actor monitor_;
  group_actor group_; // global rank 0's Group actor
  bool joined_group_ = false;
  int wal_fd_ = -1; // the run host's WAL, made durable by a second stop signal
  std::chrono::milliseconds finish_timeout_{0};
  std::chrono::milliseconds init_timeout_{0};
};

/// The actor system kept for this process's runs that link nothing (kept_system).
struct Kept {
  pid_t pid = 0;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
  std::shared_ptr<WalSyncers> syncers; // its runs' WAL syncers, kept as it is
  Kept* parent = nullptr; // in a fork's child, its parent's: left as it is, and reachable
};

/// The lock over the kept system. It is held while a system is made, which
/// a run's own thread may do after init returned (StartingSystem): a fork's
/// child, which would inherit it held, starts with it released.
std::mutex& kept_mutex() {
  static std::mutex* mu = [] {
    static std::mutex made;
    ::pthread_atfork(nullptr, nullptr, [] { new (&made) std::mutex; });
    return &made;
  }();
  return *mu;
}

Kept*& kept_slot() {
  static Kept* kept = nullptr; // leaked on purpose (above)
  return kept;
}

/// The actor system of this process's runs that link nothing (a run of
/// one process): made by the first such run with the configuration it
/// would have made for itself, and kept for the next, so that a run's start
/// and end make and join no scheduler threads, and its WAL's syncers with
/// it. Never freed: its threads stay asleep until the process ends, as a
/// run's still held at exit do (runtime/client/endings.hpp). A fork's child,
/// which has none of its threads, makes its own. `make`: false only looks
/// for it (null where it is not made yet).
caf::actor_system* kept_system(const core::Settings& s, bool make = true) {
  std::lock_guard lock(kept_mutex());
  Kept*& kept = kept_slot();
  if (kept == nullptr || kept->pid != ::getpid()) {
    if (!make) return nullptr;
    auto made = std::make_unique<Kept>();
    made->pid = ::getpid();
    made->system = std::make_unique<caf::actor_system>(SystemImpl::configure_own(made->cfg, s));
    made->syncers = std::make_shared<WalSyncers>(*made->system, Blocking::detached);
    made->parent = kept;
    kept = made.release();
  }
  return kept->system.get();
}

std::shared_ptr<WalSyncers> kept_syncers(const caf::actor_system& sys) {
  std::lock_guard lock(kept_mutex());
  const Kept* kept = kept_slot();
  if (kept == nullptr || kept->pid != ::getpid() || kept->system.get() != &sys) return nullptr;
  return kept->syncers;
}

/// The actor side of a run of this process alone in a process that has
/// not made its kept actor system yet: making it (its scheduler's threads)
/// is most of a first init, and nothing the run's calls need before the
/// RankProxy drains the ring. So a thread of its own makes it and starts
/// the run's actors (SystemImpl::start without awaiting the join) while
/// init returns and the trainer logs; the run's directory and WAL were made
/// before, by init itself, which reported their errors. Whatever needs the
/// actors (the end, an NCCL id, an exit status) waits for that thread first.
class StartingSystem final : public client::System {
public:
  StartingSystem(client::RunImpl& run, const LinkPlan& plan, std::string secret, std::shared_ptr<RunHost> host)
      : starter_([this, &run, plan, secret = std::move(secret), host = std::move(host)]() mutable {
          try {
            caf::actor_system* actors = kept_system(run.settings());
            auto sys = std::make_unique<SystemImpl>(run.settings(), plan, std::string(), std::move(secret),
                                                    std::string(), actors);
            Error e = sys->start(run, std::move(host), false);
            if (e) fail_run(run, std::move(e));
            started_ = std::move(sys);
            // The run's WAL syncers start here, beside its actors: not on the
            // Run actor's thread, as its first round comes (open_round).
            if (!e)
              if (const std::shared_ptr<WalSyncers> syncers = kept_syncers(*actors))
                syncers->fill(SyncRounds::syncers);
          } catch (const std::exception& e) {
            fail_run(run, Error(Errc::internal, std::string("the run's actors could not start (") + e.what() +
                                                    "): nothing logged since init reached the run; give the process "
                                                    "the threads and memory it lacks, and start the run again"));
          }
        }) {}

  ~StartingSystem() override {
    started();
    started_.reset(); // stops the actors, as a run's own System does
  }

  caf::actor proxy() const override {
    started();
    return started_ ? started_->proxy() : caf::actor();
  }
  Error exchange_nccl_id(bool provide, std::vector<char>& id) override {
    started();
    if (!started_) return {Errc::host_lost, "the run's actors did not start: no NCCL id to exchange"};
    return started_->exchange_nccl_id(provide, id);
  }
  void report_exit(int status) override {
    started();
    if (started_) started_->report_exit(status);
  }

private:
  /// Waits for the starter, once; started_ is whole after it.
  void started() const {
    std::call_once(joined_, [this] { starter_.join(); });
  }

  std::unique_ptr<SystemImpl> started_; // set by the starter: read after started()
  mutable std::thread starter_;
  mutable std::once_flag joined_;
};

} // namespace

Error configure_system(caf::actor_system_config& cfg, const core::Settings& s) {
  // The plan's checks (credentials, CHORUS_INSECURE) fail here, before the system exists.
  const Result<LinkPlan> plan = plan_links(s);
  if (!plan) return plan.error();
  configure_links(cfg, s);
  return {};
}

Result<std::unique_ptr<client::System>> start_system(client::RunImpl& run, caf::actor_system* actors) {
  const core::Settings& s = run.settings();
  Result<LinkPlan> planned = plan_links(s);
  if (!planned) return planned.error();
  if (Error e = load_tls(*planned)) return e;
  const LinkPlan& plan = *planned;
  if (actors != nullptr)
    if (Error e = check_orchestrator_system(*actors, s)) return e;
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
  // What the run's joins and its reports to the group carry (the links' kind says which secret).
  Result<std::string> secret = job_secret(s, run_link(s), socket_dir);
  if (!secret) return secret.error();
  Result<std::string> group_secret =
      s.group_size > 0 ? job_secret(s, group_link(group_spans_nodes(s, plan.group_tls)), socket_dir) : std::string();
  if (!group_secret) return group_secret.error();
  // The run host's directory and WAL: made here, where their errors are init's.
  std::shared_ptr<RunHost> host;
  if (s.is_host) {
    Result<std::shared_ptr<RunHost>> prepared = prepare_run_host(s, run.finish_state());
    if (!prepared) return prepared.error();
    host = std::move(*prepared);
    run.run_id = host->run_id;
    run.run_dir = host->run_dir;
    if (launch_told_at_once(s, *host)) note_run_for_launcher(s, host->run_dir);
  }
  // A run of this process alone: no other rank joins, and nothing refuses
  // its own rank's join, so init does not wait for it; a resumed one waits
  // for the Run actor's word on the run it resumes.
  const bool alone = actors == nullptr && !links_anything(s);
  const bool await_join = !alone || host->resumed;
  if (alone) {
    actors = kept_system(s, await_join);
    if (actors == nullptr)
      return std::unique_ptr<client::System>(std::make_unique<StartingSystem>(run, plan, std::move(*secret), host));
  }
  auto sys = std::make_unique<SystemImpl>(s, plan, socket_dir, std::move(*secret), std::move(*group_secret), actors);
  // A System that failed to start stops its actors here, while the run
  // they point to is still whole.
  if (Error e = sys->start(run, std::move(host), await_join)) return e;
  return std::unique_ptr<client::System>(std::move(sys));
}

namespace {
// A program that links the actors starts its runs' actor side here: the
// client asks for system_factory(), never for this layer by name.
[[maybe_unused]] const bool system_factory_registered = (client::set_system_factory(&start_system), true);
} // namespace

} // namespace chorus::actors
