// `chorus serve`: a web dashboard over a run directory, with no tracking
// server: the page, its API and its live updates come from cli/serve/.
#include "cli/cli.hpp"
#include "cli/serve/api.hpp"
#include "cli/serve/index_store.hpp"
#include "cli/serve/server.hpp"

#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sys/stat.h>
#include <thread>

namespace chorus::cli {
int serve_main(std::span<char* const> args); // below

const Command serve_command{
    .name = "serve",
    .summary = "a web dashboard of the runs under a directory: charts, ranks, live updates",
    .usage = "[DIR] [--port P] [--host H] [--token T | --no-token]",
    .help = R"(Serves a dashboard of the runs under DIR (default: $CHORUS_DIR, else
./chorus-runs) to a browser, with no tracking server: open the address it
prints. It reads the run directories as they are and writes nothing to them.

The runs page lists every run by project and group, the newest first, with
its state, ranks, start, duration and summary values; a box filters them by
name, id, group, job type, notes or host, and a list by state. A run's page
shows its identity, its ranks (state, last step, exit code, message), config,
summary and artifacts (to download), and a chart per metric, grouped by the
prefix of its key (train/, val/, ...): each rank's column (key/rank-N) is a
curve beside the key's own, shown or hidden by its name. The charts zoom (drag)
and pan (shift-drag), smooth (an exponential moving average, debiased as
TensorBoard does), draw against the step, the wall time or the time into the
run, and on a log scale; the values under the pointer are shown. The system
metrics of system.jsonl come per node and per rank, and the distributed view
draws each rank's progress over time, with rows some ranks did not contribute
to and ranks that crashed marked. A group's page puts its runs side by side,
and any runs picked in the runs list are laid over each other.

A live run's new rows, ranks' states and system samples reach an open page
within about two seconds. A history of any length is indexed once (then only
its new lines are read) and each chart gets at most two points per pixel,
every point once zoomed in far enough.

It listens on 127.0.0.1 only, unless --host says otherwise, and every request
must carry a token: a random one is made, and printed inside the address
(http://127.0.0.1:8600/?token=...; a page opened there keeps it as a cookie).
Loopback is no barrier between the users of one machine: without the token,
any of them could read the runs. It shows only runs the user it runs as may
read; run as root, only what each run's owner lets other users read. Paths in
requests must name runs inside DIR (no '..', no absolute path, no link out of
it); large or malformed requests are refused; a damaged run file is reported
on its run's page. Ctrl-C stops it.

options:
  --port P        the port to listen on (default 8600; 0 picks a free one)
  --host H        the address to listen on (default 127.0.0.1; 0.0.0.0 for
                  every address of this machine)
  --token T       the token to ask for (default: a random one); 16 or more
                  letters, digits, '-' or '_'
  --no-token      ask for no token (on loopback only): every user of this
                  machine can then read the runs shown
  --cache-mb N    memory the runs' indexes may take together, in MiB (default
                  1024; the run being looked at always keeps its index)
  --index-dir D   where the indexes of long histories (32 MiB or more) are
                  kept between runs of chorus serve, so that such a run opens
                  at full detail at once the next time, only its new lines
                  read (default $XDG_CACHE_HOME/chorus/serve-index, else
                  ~/.cache/chorus/serve-index; made mode 0700, and used only
                  while it is this user's and closed to others)
  --index-dir-mb N  what the kept indexes may take on disk together, in MiB
                  (default 4096; the least recently used go first)
  --no-index-dir  keep no index on disk
  -h, --help      this text

exit codes: 0 stopped by Ctrl-C or SIGTERM, 1 the directory or the port cannot
be used, 2 a wrong command line.
)",
    .main = serve_main,
};

namespace {

struct ServeArgs {
  std::string dir, host = "127.0.0.1", token;
  bool no_token = false;
  std::string index_dir;
  bool no_index_dir = false;
  int port = 8600, cache_mb = 1024, index_dir_mb = 4096;
};

Error parse(std::span<char* const> words, ServeArgs& a, bool& help) {
  ArgCursor c(words);
  std::string v;
  while (!c.done() && c.error().empty()) {
    if (c.flag({"-h", "--help"})) {
      help = true;
      return {};
    }
    if (c.option({"--port"}, v)) {
      c.integer("--port", v, 0, 65535, a.port);
    } else if (c.option({"--host"}, v)) {
      if (v.empty()) c.fail("--host needs an address (127.0.0.1, 0.0.0.0, a name of this machine)");
      a.host = v;
    } else if (c.option({"--token"}, v)) {
      if (v.size() < 16 || v.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") !=
                               std::string::npos)
        c.fail("--token takes 16 or more letters, digits, '-' or '_'");
      a.token = v;
    } else if (c.flag({"--no-token"})) {
      a.no_token = true;
    } else if (c.option({"--cache-mb"}, v)) {
      c.integer("--cache-mb", v, 16, 1 << 20, a.cache_mb);
    } else if (c.option({"--index-dir"}, v)) {
      if (v.empty() || v[0] != '/') c.fail("--index-dir takes an absolute path (or --no-index-dir to keep none)");
      a.index_dir = v;
    } else if (c.option({"--index-dir-mb"}, v)) {
      c.integer("--index-dir-mb", v, 1, 1 << 24, a.index_dir_mb);
    } else if (c.flag({"--no-index-dir"})) {
      a.no_index_dir = true;
    } else {
      c.operand(a.dir, "directory");
    }
  }
  if (!c.error().empty()) return invalid(c.error());
  if (a.no_token && !a.token.empty()) return invalid("--no-token and --token: give one of them");
  if (a.no_index_dir && !a.index_dir.empty()) return invalid("--no-index-dir and --index-dir: give one of them");
  if (a.no_token && !serve::is_loopback(a.host))
    return invalid("--no-token listens on loopback only (127.0.0.1): off it every request needs the token");
  return {};
}

} // namespace

int serve_main(std::span<char* const> words) {
  ServeArgs a;
  if (std::optional<int> done = parse_words(serve_command, words, a, &parse)) return *done;

  const std::string dir = a.dir.empty() ? default_runs_dir() : a.dir;
  char real[PATH_MAX];
  struct stat st {};
  if (::realpath(dir.c_str(), real) == nullptr || ::stat(real, &st) != 0)
    return failure("serve", "no directory at " + dir + " (" + std::strerror(errno) +
                                "): give the directory the runs are under (chorus serve DIR), or set CHORUS_DIR");
  if (!S_ISDIR(st.st_mode))
    return failure("serve", dir + " is not a directory: give the directory the runs are under (chorus serve DIR)");
  // The user serve runs as must be let read the directory (root: by its owner).
  if (const std::string why = serve::not_shown(real); !why.empty()) return failure("serve", why);

  serve::ServeOptions o;
  o.root = real;
  o.host = a.host;
  o.port = a.port;
  o.cache_bytes = static_cast<std::size_t>(a.cache_mb) << 20;
  o.token = a.token;
  if (!a.no_index_dir) {
    const std::string kept = a.index_dir.empty() ? serve::IndexStore::default_dir() : a.index_dir;
    o.index_store = std::make_shared<serve::IndexStore>(kept, static_cast<std::uint64_t>(a.index_dir_mb) << 20);
    // Not fatal: the runs are indexed afresh each time, as without it.
    if (!o.index_store->usable())
      std::fprintf(stderr, "chorus serve: warning: no index is kept on disk (long histories are indexed afresh "
                           "each time): %s\n",
                   o.index_store->why().c_str());
  }
  // Every user of the machine reaches loopback: a token there too, unless --no-token.
  if (o.token.empty() && !a.no_token) {
    Result<std::string> token = serve::random_token();
    if (!token) return failure("serve", token.error().message());
    o.token = std::move(*token);
  }

  // SIGINT and SIGTERM are taken by one thread, which stops the server; the
  // server's threads, started after this, inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  serve::Server server(o);
  if (Error e = server.bind()) return failure("serve", e.message());
  std::printf("chorus serve: the runs under %s at\n  %s\n", o.root.c_str(), server.url().c_str());
  if (!o.token.empty())
    std::printf("(the address holds the token every request needs: give it only to whom may read these runs)\n");
  else
    std::fprintf(stderr,
                 "chorus serve: warning: --no-token: every user of this machine can read the runs shown here, at "
                 "this address, whatever the permissions of %s (loopback is open to all of them); leave --no-token "
                 "out to ask for a token\n",
                 o.root.c_str());
  std::printf("Ctrl-C stops it.\n");
  std::fflush(stdout);

  std::atomic<bool> done{false};
  std::thread signals([&] {
    const timespec tick{0, 200'000'000};
    while (!done) {
      if (::sigtimedwait(&stop_signals, nullptr, &tick) > 0) {
        server.stop();
        return;
      }
    }
  });
  const Error e = server.run();
  done = true;
  signals.join();
  if (e) return failure("serve", e.message());
  std::printf("chorus serve: stopped\n");
  return exit_ok;
}

} // namespace chorus::cli
