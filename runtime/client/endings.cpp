// How a process's runs end when the process does: see endings.hpp.
#include "runtime/client/endings.hpp"
#include "runtime/client/run_impl.hpp"

#include "io/platform/credentials.hpp"

#include <cxxabi.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <typeinfo>
#include <vector>

namespace chorus::client::endings {
namespace {

/// The signals that stop a job: launchers (torchrun, Slurm, mpirun, chorus
/// launch) send SIGTERM, a terminal SIGINT or SIGHUP.
constexpr int stop_signals[] = {SIGTERM, SIGINT, SIGHUP};
/// WALs a second signal makes durable (a process hosts a run or two).
constexpr int max_wals = 8;

struct Registry {
  std::mutex mu;
  std::vector<RunImpl*> live;                 // every run of this process
  std::vector<std::unique_ptr<RunImpl>> kept; // let go by an interpreter's finalization: never freed
  bool installed = false;
};

/// Leaked on purpose: signals and the exit come after static destructors may have run.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

// What the signal handler reaches: async-signal-safe only.
std::atomic<int> wal_fds[max_wals] = {-1, -1, -1, -1, -1, -1, -1, -1};
static_assert(max_wals == 8);
std::atomic<int> ending{0}; // the signal whose finish is under way
int signal_pipe[2] = {-1, -1};
std::atomic<bool> exit_registered{false}; // on_process_exit is registered (register_exit_again)
pid_t installed_in = 0; // a fork's child inherits the handlers, not the thread that serves them

/// Ends the process with `sig`'s usual status (143 for SIGTERM): its default
/// disposition, unblocked, raised again.
[[noreturn]] void die_by(int sig) noexcept {
  ::signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(sig);
  ::_exit(128 + sig); // not reached: the default disposition of a stop signal ends the process
}

void sync_wals() noexcept {
  for (auto& fd : wal_fds)
    if (const int f = fd.load(std::memory_order_relaxed); f >= 0) ::fdatasync(f);
}

extern "C" void on_stop_signal(int sig) {
  const int saved_errno = errno;
  // A fork's child (a data loader's worker) ends at once. So does a second
  // signal like the first (Ctrl-C twice), making the WALs durable first: what
  // the first one's finish had not committed is in the kernel already. Another
  // signal (torchrun's SIGTERM after the terminal's SIGINT) lets the finish
  // under way go on.
  if (::getpid() != installed_in) die_by(sig);
  int first = 0;
  if (!ending.compare_exchange_strong(first, sig)) {
    if (first == sig) {
      sync_wals();
      die_by(sig);
    }
    errno = saved_errno;
    return;
  }
  const char c = static_cast<char>(sig);
  if (::write(signal_pipe[1], &c, 1) != 1) {
    sync_wals();
    die_by(sig);
  }
  errno = saved_errno;
}

/// How long one run's finish may take, past which its waiter gives up: the
/// RankProxy bounds it itself; this only guards against a proxy that is gone.
std::chrono::milliseconds finish_bound(const RunImpl& run) {
  const auto& o = run.settings().opts;
  return o.finish_timeout + (run.settings().is_host ? o.upload_timeout : std::chrono::milliseconds(0)) +
         std::chrono::seconds(10);
}

/// Finishes every live run of the process as `opts` says and waits for
/// them (bounded); runs that finished already keep how they ended. Under
/// the registry's lock: a run is not freed meanwhile.
void end_all(const FinishOptions& opts) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::pair<FinishPending, std::chrono::milliseconds>> finishing;
  for (RunImpl* run : r.live)
    if (!run->forked()) finishing.emplace_back(run->finish(opts), finish_bound(*run));
  for (const auto& [pending, bound] : finishing) (void)pending.wait_for(bound);
}

/// The signal thread: the first stop signal finishes every run as killed by
/// it, then ends the process with it.
void serve_signals() {
  for (;;) {
    char c = 0;
    const ssize_t n = ::read(signal_pipe[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) return;
    const int sig = static_cast<unsigned char>(c);
    FinishOptions opts;
    opts.signal = sig;
    end_all(opts);
    std::fflush(stdout);
    std::fflush(stderr);
    die_by(sig);
  }
}

/// "std::runtime_error: boom" for the exception in flight, if any.
std::string current_exception_text() {
  const std::exception_ptr e = std::current_exception();
  if (!e) return "std::terminate was called without an exception in flight";
  std::string type = "an exception";
  if (const std::type_info* t = abi::__cxa_current_exception_type()) {
    int status = 0;
    char* name = abi::__cxa_demangle(t->name(), nullptr, nullptr, &status);
    type = status == 0 && name ? name : t->name();
    std::free(name);
  }
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return "terminate called after throwing " + type + ": " + x.what();
  } catch (...) {
  }
  return "terminate called after throwing " + type;
}

std::terminate_handler previous_terminate = nullptr;

void on_terminate() {
  static std::atomic<bool> once{false};
  if (!once.exchange(true)) {
    try {
      const std::string why = current_exception_text();
      FinishOptions opts;
      opts.exit_code = 128 + SIGABRT; // the status abort() gives the process
      opts.message = why;
      end_all(opts);
    } catch (...) {
    }
  }
  if (previous_terminate != nullptr) previous_terminate();
  std::abort();
}

/// exit(status), or a return from main: live runs end as the status says,
/// and finished ones learn it. Nothing is freed here: an actor system cannot
/// be stopped from an exit handler (the exiting thread's thread-locals are
/// gone), so runs still held when the process exits go with it.
void on_process_exit(int status, void*) {
  if (::getpid() != installed_in) return; // a fork's child: its runs are its parent's
  // Registered more than once (register_exit_again): the latest, which runs first, does the work.
  static std::atomic<bool> ran{false};
  if (ran.exchange(true)) return;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::string why;
  if (status != 0) why = "the process exited with status " + std::to_string(status);
  FinishOptions opts;
  opts.exit_code = status;
  opts.message = why;
  std::vector<std::pair<FinishPending, std::chrono::milliseconds>> finishing;
  std::vector<RunImpl*> finished_before;
  for (RunImpl* run : r.live) {
    if (run->forked()) continue;
    if (run->finishing())
      finished_before.push_back(run);
    else
      finishing.emplace_back(run->finish(opts), finish_bound(*run));
  }
  for (const auto& [pending, bound] : finishing) (void)pending.wait_for(bound);
  for (RunImpl* run : finished_before) run->report_exit(status);
}

void install(Registry& r) {
  if (r.installed) return;
  r.installed = true;
  installed_in = ::getpid();
  // OpenSSL's own exit handler, where a later use would register it, would
  // run before this one and free what the finish below still uses (an upload
  // over HTTPS): it is never registered (io/platform/credentials.hpp).
  platform::keep_tls_library_until_exit();
  ::on_exit(on_process_exit, nullptr);
  exit_registered.store(true, std::memory_order_release);
  previous_terminate = std::set_terminate(on_terminate);
  if (::pipe2(signal_pipe, O_CLOEXEC) != 0) return; // no signal thread: the signals keep their default
  // The thread takes no signal itself, so that a handler never waits on it.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    std::thread(serve_signals).detach();
  } catch (...) {
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return;
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  for (int sig : stop_signals) {
    // Only a default disposition is replaced: a trainer's own handler (or
    // Python's for SIGINT, which raises KeyboardInterrupt) stays in charge.
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) != 0 ||
        current.sa_handler != SIG_DFL)
      continue;
    struct sigaction ours {};
    ours.sa_handler = on_stop_signal;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_RESTART;
    ::sigaction(sig, &ours, nullptr);
  }
}

} // namespace

void watch(RunImpl& run) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  install(r);
  r.live.push_back(&run);
}

void register_exit_again() noexcept {
  // Not under the registry's lock: a stop signal's finish holds it while it
  // waits for the runs' actors, whose start calls this.
  if (exit_registered.load(std::memory_order_acquire)) ::on_exit(on_process_exit, nullptr);
}

void unwatch(RunImpl& run) noexcept {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::erase(r.live, &run);
}

void keep_until_exit(Run&& run) noexcept {
  std::unique_ptr<RunImpl> impl = RunAccess::release(run);
  if (!impl || impl->forked()) {
    (void)impl.release(); // a fork's child copy is never freed (see run.cpp)
    return;
  }
  Registry& r = registry();
  try {
    std::lock_guard lock(r.mu);
    r.kept.push_back(std::move(impl));
  } catch (...) {
    // Out of memory: freed now, which finishes it as its destructor does.
  }
}

void note_wal(int fd) noexcept {
  for (auto& slot : wal_fds) {
    int none = -1;
    if (slot.compare_exchange_strong(none, fd, std::memory_order_relaxed)) return;
  }
}

void forget_wal(int fd) noexcept {
  for (auto& slot : wal_fds) {
    int mine = fd;
    slot.compare_exchange_strong(mine, -1, std::memory_order_relaxed);
  }
}

} // namespace chorus::client::endings
