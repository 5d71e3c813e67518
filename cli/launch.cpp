// `chorus launch`: the ranks of one node, started as torchrun starts them.
//
// One thread, one poll() loop over the ranks' output pipes and a signalfd
// (SIGCHLD and the signals to forward), so nothing spins and no signal
// handler races the bookkeeping. Each rank runs in its own process group:
// a Ctrl-C at the terminal reaches launch only, which forwards it once to
// each rank and its children, instead of every process getting it twice.
// With --on-stall=kill the loop also wakes five times a second to read the
// events of the runs the ranks host (cli/run_events.hpp).
#include "cli/launch.hpp"
#include "cli/cli.hpp"
#include "cli/run_events.hpp"
#include "cli/serve/followed_file.hpp"
#include "io/platform/posix.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

namespace chorus::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t max_line = 64 * 1024; // a longer line is cut into pieces of this size
constexpr auto drain_after_exit = std::chrono::milliseconds(500);
constexpr auto stall_look_interval = std::chrono::milliseconds(200); // --on-stall=kill reads the runs' events

void write_all(int fd, std::string_view data, bool& broken) {
  while (!data.empty() && !broken) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (errno != EINTR) {
      broken = true; // a closed reader: keep draining the ranks, drop their output
    }
  }
}

// Launch's own stdout or stderr: whole lines gathered, written in one go.
struct Sink {
  int fd;
  std::string buf;
  bool broken = false;
  void flush() {
    write_all(fd, buf, broken);
    buf.clear();
  }
};

// One rank's stdout or stderr pipe, cut into lines.
struct Stream {
  int fd = -1;
  Sink* sink = nullptr;
  const std::string* prefix = nullptr;
  std::string partial;

  void emit(const std::string& prefix, std::string_view piece) {
    sink->buf += prefix;
    sink->buf += partial;
    sink->buf += piece;
    sink->buf += '\n';
    partial.clear();
  }
  void take(const std::string& prefix, std::string_view chunk) {
    for (std::size_t nl; (nl = chunk.find('\n')) != std::string_view::npos;) {
      emit(prefix, chunk.substr(0, nl));
      chunk.remove_prefix(nl + 1);
    }
    partial += chunk;
    while (partial.size() >= max_line) {
      std::string rest = partial.substr(max_line);
      partial.resize(max_line);
      emit(prefix, {});
      partial = std::move(rest);
    }
  }
  // Reads what is there now; at end of file the partial last line goes out.
  void pump() {
    char buf[64 * 1024];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        take(*prefix, std::string_view(buf, static_cast<std::size_t>(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      if (!partial.empty()) emit(*prefix, {});
      ::close(fd);
      fd = -1;
      return;
    }
  }
};

struct Rank {
  int rank = 0; // global
  pid_t pid = -1;
  bool running = false;
  int code = 0; // exit code, or 128 + signal
  int signal = 0;
  bool killed = false;  // launch sent it SIGKILL
  const char* stopped_by = nullptr; // the option for which launch stopped it: --fail-fast, --on-stall=kill
  std::string prefix;
  Stream out, err;
};

int status_code(int status, int& sig) {
  if (WIFSIGNALED(status)) {
    sig = WTERMSIG(status);
    return 128 + sig;
  }
  sig = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

// What each rank's child process needs, prepared before fork so the child
// only calls async-signal-safe functions.
struct ChildPlan {
  std::vector<std::string> env_storage;
  std::vector<char*> env;
  std::vector<char*> argv;
  sigset_t mask;
  struct sigaction pipe_action;
  int stdin_fd = -1; // -1: inherit
  pid_t parent = 0;
};

[[noreturn]] void exec_child(const ChildPlan& plan, int out_w, int err_w) {
  ::sigprocmask(SIG_SETMASK, &plan.mask, nullptr);
  ::sigaction(SIGPIPE, &plan.pipe_action, nullptr);
  ::setpgid(0, 0);
  // A launch killed with SIGKILL cannot forward anything: let its ranks hear of it.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != plan.parent) ::_exit(128 + SIGTERM);
  if (out_w >= 0 && ::dup2(out_w, STDOUT_FILENO) < 0) ::_exit(127);
  if (err_w >= 0 && ::dup2(err_w, STDERR_FILENO) < 0) ::_exit(127);
  if (plan.stdin_fd >= 0) ::dup2(plan.stdin_fd, STDIN_FILENO);
  ::execvpe(plan.argv[0], plan.argv.data(), plan.env.data());
  const int e = errno;
  for (const char* piece : {"chorus launch: cannot run ", static_cast<const char*>(plan.argv[0]), ": ",
                            static_cast<const char*>(::strerror(e)), "\n"})
    if (::write(STDERR_FILENO, piece, std::strlen(piece)) < 0) break;
  ::_exit(127);
}

/// --on-stall=kill: the runs the ranks host, as their hosts note them in
/// the launch's runs file (CHORUS_LAUNCH_RUNS, "RANK<TAB>DIR" a line), each
/// one's events.jsonl followed. A rank stands stalled from its `stalled`
/// until it moves again or ends (`resumed`, `rank_*`, the run's end); events
/// from before the launch (an earlier attempt of a resumed run) do not count.
class StallWatch {
public:
  StallWatch(const std::string& runs_file, std::chrono::system_clock::time_point since)
      : runs_file_(runs_file), since_(since) {}

  /// Reads what is new: a stalled rank's event, if one stands.
  std::optional<store::EventLine> look() {
    runs_file_.follow(
        1u << 20, [] {},
        [&](std::string_view line, std::uint64_t) -> std::string {
          const auto tab = line.find('\t');
          if (tab == std::string_view::npos) return "no tab";
          const std::string dir(line.substr(tab + 1));
          if (std::none_of(runs_.begin(), runs_.end(), [&](const Run& r) { return r.dir == dir; }))
            runs_.push_back({dir, std::make_unique<RunEvents>(dir), {}});
          return {};
        });
    for (Run& r : runs_) {
      for (const RunEvents::Read& read : r.events->poll()) {
        const Event& e = read.event.event;
        if (e.time < since_) continue;
        switch (e.kind) {
        case EventKind::stalled: r.stalled[e.rank] = read.event; break;
        case EventKind::resumed:
        case EventKind::rank_failed:
        case EventKind::rank_killed:
        case EventKind::rank_lost: r.stalled.erase(e.rank); break;
        case EventKind::run_finished: r.stalled.clear(); break;
        default: break;
        }
      }
      if (!r.stalled.empty()) return r.stalled.begin()->second;
    }
    return std::nullopt;
  }

private:
  struct Run {
    std::string dir;
    std::unique_ptr<RunEvents> events;
    std::map<int, store::EventLine> stalled; // by rank
  };
  serve::FollowedFile runs_file_;
  std::chrono::system_clock::time_point since_;
  std::vector<Run> runs_;
};

/// "rank 3 (process 4242 on node-a) stalled at step 12 for 300 s".
std::string stall_text(const store::EventLine& l) {
  std::string s = "rank " + std::to_string(l.event.rank);
  if (l.pid >= 0 || !l.host.empty()) {
    s += " (";
    if (l.pid >= 0) s += "process " + std::to_string(l.pid) + (l.host.empty() ? "" : " ");
    if (!l.host.empty()) s += "on " + l.host;
    s += ")";
  }
  s += " stalled";
  if (l.event.step >= 0) s += " at step " + std::to_string(l.event.step);
  if (l.seconds) s += " for " + std::to_string(std::llround(*l.seconds)) + " s";
  for (char& ch : s)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
  return s;
}

class Launcher {
public:
  explicit Launcher(const LaunchArgs& a) : args_(a) {
    if (a.on_stall == OnStall::kill && !a.runs_file.empty())
      stalls_ = std::make_unique<StallWatch>(a.runs_file, std::chrono::system_clock::now());
  }

  int run() {
    sigset_t mask;
    sigemptyset(&mask);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&mask, s);
    ChildPlan plan;
    ::sigprocmask(SIG_BLOCK, &mask, &plan.mask);
    sigfd_ = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd_ < 0) return failure("launch", std::string("signalfd: ") + std::strerror(errno));
    struct sigaction ignore{};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &plan.pipe_action);
    plan.parent = ::getpid();
    // A rank in its own process group cannot read the terminal (SIGTTIN
    // would stop it): give it /dev/null there; a pipe or file is shared.
    if (::isatty(STDIN_FILENO)) plan.stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (const std::string& w : args_.program) plan.argv.push_back(const_cast<char*>(w.c_str()));
    plan.argv.push_back(nullptr);

    ranks_.resize(static_cast<std::size_t>(args_.nproc));
    for (int i = 0; i < args_.nproc; ++i) {
      if (!spawn(plan, i)) {
        const int e = errno;
        stop_all(SIGKILL);
        loop();
        return failure("launch", "cannot start local rank " + std::to_string(i) + ": " + std::strerror(e) +
                                     ". Lower -n or raise the process limit (ulimit -u)");
      }
    }
    loop();
    return finish();
  }

private:
  bool spawn(ChildPlan& plan, int i) {
    Rank& r = ranks_[static_cast<std::size_t>(i)];
    r.rank = args_.node_rank * args_.nproc + i;
    r.prefix = "[rank " + std::to_string(r.rank) + "] ";
    plan.env_storage = rank_environment(args_, i);
    plan.env.clear();
    for (std::string& s : plan.env_storage) plan.env.push_back(s.data());
    plan.env.push_back(nullptr);

    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (args_.prefix) {
      if (::pipe2(out, O_CLOEXEC) != 0) return false;
      if (::pipe2(err, O_CLOEXEC) != 0) {
        ::close(out[0]);
        ::close(out[1]);
        return false;
      }
    }
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(plan, out[1], err[1]);
    for (int fd : {out[1], err[1]})
      if (fd >= 0) ::close(fd);
    if (pid < 0) {
      for (int fd : {out[0], err[0]})
        if (fd >= 0) ::close(fd);
      return false;
    }
    ::setpgid(pid, pid); // also here: a signal forwarded before the child ran must find its group
    r.pid = pid;
    r.running = true;
    if (args_.prefix) {
      ::fcntl(out[0], F_SETFL, O_NONBLOCK);
      ::fcntl(err[0], F_SETFL, O_NONBLOCK);
      r.out = Stream{out[0], &out_, &r.prefix, {}};
      r.err = Stream{err[0], &err_, &r.prefix, {}};
    }
    return true;
  }

  void stop_all(int sig) {
    for (Rank& r : ranks_)
      if (r.running) {
        ::kill(-r.pid, sig);
        if (sig == SIGKILL) r.killed = true;
      }
  }

  void start_grace() {
    if (!deadline_) deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(args_.grace_s));
  }

  [[nodiscard]] int running() const {
    return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }));
  }

  void note(const std::string& line) {
    out_.flush();
    err_.buf += "chorus launch: " + line + "\n";
    err_.flush();
  }

  void note_exit(const Rank& r) const {
    if (args_.exits_file.empty()) return;
    if (std::FILE* f = std::fopen(args_.exits_file.c_str(), "a")) {
      std::fprintf(f, "%d %d\n", r.rank, r.code);
      std::fclose(f);
    }
  }

  void reap() {
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (Rank& r : ranks_) {
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        r.code = status_code(status, r.signal);
        note_exit(r);
        if (r.code != 0 && running() > 0 && !stopping_) {
          if (args_.fail_fast) {
            note("rank " + std::to_string(r.rank) + " failed (" + describe(r) + "); stopping the other ranks (--fail-fast)");
            stop_for("--fail-fast");
          } else {
            const int left = running();
            note("rank " + std::to_string(r.rank) + " failed (" + describe(r) + "); waiting for the " +
                 std::to_string(left) + (left == 1 ? " other rank" : " other ranks") + " (--fail-fast stops them)");
          }
        }
      }
    }
  }

  /// Stops the ranks still running, as a SIGTERM to launch would, for `option`.
  void stop_for(const char* option) {
    stopping_ = true;
    for (Rank& r : ranks_)
      if (r.running) r.stopped_by = option;
    stop_all(SIGTERM);
    start_grace();
  }

  /// --on-stall=kill: the job is stopped at the first rank that stands stalled.
  void look_for_stalls() {
    if (!stalls_ || stopping_ || Clock::now() < next_stall_look_) return;
    next_stall_look_ = Clock::now() + stall_look_interval;
    const std::optional<store::EventLine> stalled = stalls_->look();
    if (!stalled) return;
    const std::string what = stall_text(*stalled);
    note(what + "; stopping the job (--on-stall=kill)");
    stall_ = "stopped by chorus launch --on-stall=kill: " + what;
    stall_at_us_ = platform::unix_now_us();
    stop_for("--on-stall=kill");
  }

  void on_signal(int sig) {
    if (sig == SIGCHLD) return reap();
    if (sig == SIGUSR1 || sig == SIGUSR2) return stop_all(sig); // passed on, not a stop
    if (sig == SIGINT && signal_ != 0) {
      note("second interrupt: killing every rank");
      return stop_all(SIGKILL);
    }
    if (signal_ == 0) {
      signal_ = sig;
      signal_at_us_ = platform::unix_now_us();
    }
    stopping_ = true;
    stop_all(sig);
    start_grace();
  }

  void loop() {
    std::optional<Clock::time_point> drain_until;
    for (;;) {
      std::vector<pollfd> fds{{sigfd_, POLLIN, 0}};
      std::vector<Stream*> streams{nullptr};
      for (Rank& r : ranks_)
        for (Stream* s : {&r.out, &r.err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            streams.push_back(s);
          }
      if (running() == 0) {
        // Output still buffered in the pipes comes out; a grandchild that
        // keeps a pipe open does not hold launch past a short drain.
        if (streams.size() == 1) return;
        if (!drain_until) drain_until = Clock::now() + drain_after_exit;
        if (Clock::now() >= *drain_until) return;
      }
      int timeout = -1;
      auto until = deadline_;
      if (drain_until && (!until || *drain_until < *until)) until = drain_until;
      if (stalls_ && !stopping_ && (!until || next_stall_look_ < *until)) until = next_stall_look_;
      if (until) {
        const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*until - Clock::now()).count();
        timeout = static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
      }
      const int n = ::poll(fds.data(), fds.size(), timeout);
      if (n < 0 && errno != EINTR) return;
      for (std::size_t i = 1; n > 0 && i < fds.size(); ++i)
        if (fds[i].revents != 0) streams[i]->pump();
      out_.flush();
      err_.flush();
      signalfd_siginfo si;
      while (::read(sigfd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) on_signal(static_cast<int>(si.ssi_signo));
      look_for_stalls();
      if (deadline_ && Clock::now() >= *deadline_) {
        deadline_.reset();
        if (running() > 0) {
          note("ranks still running after the " + format_number(args_.grace_s) + " s grace period: killing them");
          stop_all(SIGKILL);
        }
      }
    }
  }

  static std::string describe(const Rank& r) {
    if (r.signal != 0) {
      const char* name = ::strsignal(r.signal);
      return "exited with signal " + std::to_string(r.signal) + " (" + (name ? name : "unknown") + ")" +
             (r.killed && r.signal == SIGKILL ? ", sent by chorus launch" : "") + stopped(r);
    }
    return "exited with code " + std::to_string(r.code) + stopped(r);
  }

  static std::string stopped(const Rank& r) {
    return r.stopped_by != nullptr ? std::string(", stopped by ") + r.stopped_by : std::string();
  }

  int finish() {
    // A grandchild that outlived its rank may hold a pipe open: what it sent so far still goes out.
    for (Rank& r : ranks_)
      for (Stream* st : {&r.out, &r.err})
        if (st->fd >= 0) {
          if (!st->partial.empty()) st->emit(r.prefix, {});
          ::close(st->fd);
          st->fd = -1;
        }
    out_.flush();
    err_.flush();
    int worst = 0;
    for (const Rank& r : ranks_) {
      // A rank stopped for --fail-fast ends because of the failure: it does not hide its code.
      if (r.stopped_by == nullptr) worst = std::max(worst, r.code);
      if (r.code != 0) note("rank " + std::to_string(r.rank) + " " + describe(r));
    }
    ::close(sigfd_);
    // A job stopped at a stall says so, whatever its ranks' codes.
    if (!stall_.empty()) return exit_stalled;
    // An interrupted job is not a success even if every rank exited cleanly.
    if (worst == 0 && signal_ != 0) return 128 + signal_;
    return worst;
  }

public:
  std::vector<int> codes() const {
    std::vector<int> out;
    for (const Rank& r : ranks_) out.push_back(r.code);
    return out;
  }
  StopSignal stop_signal() const {
    if (!stall_.empty() && signal_ == 0) return {SIGTERM, stall_at_us_, stall_};
    return {signal_, signal_at_us_, {}};
  }

private:
  const LaunchArgs& args_;
  std::vector<Rank> ranks_;
  Sink out_{STDOUT_FILENO, {}};
  Sink err_{STDERR_FILENO, {}};
  int sigfd_ = -1;
  int signal_ = 0;       // the first stop signal launch received
  std::int64_t signal_at_us_ = 0;
  bool stopping_ = false; // ranks were told to stop (signal, --fail-fast or --on-stall=kill)
  std::optional<Clock::time_point> deadline_; // when stopping ranks get SIGKILL
  std::unique_ptr<StallWatch> stalls_;        // --on-stall=kill
  Clock::time_point next_stall_look_{};
  std::string stall_;                         // why launch stopped the job at a stall ("": it did not)
  std::int64_t stall_at_us_ = 0;
};

} // namespace

int run_ranks(const LaunchArgs& args, std::vector<int>* codes, StopSignal* stop_signal) {
  Launcher launcher(args);
  const int worst = launcher.run();
  if (codes) *codes = launcher.codes();
  if (stop_signal) *stop_signal = launcher.stop_signal();
  return worst;
}

} // namespace chorus::cli
