// Runs the real `chorus` binary for the command's tests: its stdout and
// stderr captured apart, its exit code, and signals sent while it runs.
#pragma once

#include "tests/temp_dir.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <grp.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <poll.h>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace chorus::test {

inline const std::string chorus_binary = CHORUS_BINARY_DIR "/bin/chorus";

struct Output {
  std::string out;
  std::string err;
  int code = -1; // exit status, 128 + signal, or -1 if it had to be killed for running too long
  std::string left; // where it ran too long: the processes it left, as ps showed them before they were killed
  long max_rss_kb = -1; // the process's peak resident memory (getrusage's ru_maxrss, of it alone)
};

/// The processes of group `pgid` and every descendant of it, as ps shows
/// them, their ids added to `pids`: what a command that did not end left running.
inline std::string processes_of(pid_t pgid, std::vector<pid_t>& pids) {
  struct Proc {
    long pid, ppid, group;
    std::string line;
  };
  std::vector<Proc> all;
  std::map<long, long> parent;
  if (FILE* p = ::popen("ps -e -o pid=,ppid=,pgid=,stat=,etime=,args=", "r")) {
    char line[1024];
    Proc proc{};
    while (std::fgets(line, sizeof line, p))
      if (std::sscanf(line, "%ld %ld %ld", &proc.pid, &proc.ppid, &proc.group) == 3) {
        proc.line = line;
        parent[proc.pid] = proc.ppid;
        all.push_back(proc);
      }
    ::pclose(p);
  }
  auto descends = [&](long pid) {
    for (auto it = parent.find(pid); it != parent.end() && it->second > 1; it = parent.find(it->second))
      if (it->second == pgid) return true;
    return false;
  };
  std::string table;
  for (const Proc& proc : all)
    if (proc.group == pgid || descends(proc.pid)) {
      pids.push_back(static_cast<pid_t>(proc.pid));
      table += "    " + proc.line;
    }
  return table;
}

/// One running process: `chorus`, or a program of the test's choosing.
class Child {
public:
  /// `chorus ARGS...`. `as_user` >= 0: the process runs as that user and group (the test must be root).
  explicit Child(const std::vector<std::string>& args, const std::vector<std::string>& env = {}, int as_user = -1)
      : Child(with_chorus(args), env, as_user, 0) {}
  /// `argv` as given: argv[0] is the program's path.
  static std::unique_ptr<Child> program(std::vector<std::string> argv, const std::vector<std::string>& env = {}) {
    return std::unique_ptr<Child>(new Child(std::move(argv), env, -1, 0));
  }

private:
  static std::vector<std::string> with_chorus(const std::vector<std::string>& args) {
    std::vector<std::string> words{chorus_binary};
    words.insert(words.end(), args.begin(), args.end());
    return words;
  }
  Child(std::vector<std::string> words, const std::vector<std::string>& env, int as_user, int) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_words = env;
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    for (std::string& e : env_words) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      // Own process group, so that a test that times out takes all of it down.
      ::setpgid(0, 0);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::signal(SIGPIPE, SIG_DFL);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      const int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, STDIN_FILENO);
      if (as_user >= 0 && (::setgroups(0, nullptr) != 0 || ::setgid(static_cast<gid_t>(as_user)) != 0 ||
                           ::setuid(static_cast<uid_t>(as_user)) != 0))
        ::_exit(125);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(126);
    }
    ::setpgid(pid_, pid_);
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

public:
  ~Child() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {out_fd_, err_fd_})
      if (fd >= 0) ::close(fd);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  [[nodiscard]] pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }

  /// Reads output until `done(out, err)` holds or `timeout` passes.
  bool wait_for(const std::function<bool(const std::string&, const std::string&)>& done,
                std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!done(o_.out, o_.err)) {
      if (std::chrono::steady_clock::now() >= until) return false;
      if (!read_some(100)) {
        if (out_fd_ < 0 && err_fd_ < 0) return done(o_.out, o_.err);
      }
    }
    return true;
  }

  /// Reads everything and waits for the exit. After `timeout`, kills the
  /// process group and every descendant (a process that left the group still
  /// holds the output), saying in Output::left which they were.
  Output finish(std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    bool timed_out = false;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      if (std::chrono::steady_clock::now() >= until) {
        std::vector<pid_t> pids;
        o_.left = processes_of(pid_, pids);
        ::kill(-pid_, SIGKILL);
        for (pid_t pid : pids) ::kill(pid, SIGKILL);
        timed_out = true;
        until_eof();
        break;
      }
      read_some(100);
    }
    int status = 0;
    rusage use{};
    if (::wait4(pid_, &status, 0, &use) == pid_) o_.max_rss_kb = use.ru_maxrss;
    pid_ = -1;
    o_.code = timed_out ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return o_;
  }

private:
  void until_eof() {
    while (out_fd_ >= 0 || err_fd_ >= 0) read_some(1000);
  }
  // False when nothing came within `ms`.
  bool read_some(int ms) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    const int n = ::poll(fds, 2, ms);
    if (n <= 0) return false;
    char buf[1 << 16];
    for (int i = 0; i < 2; ++i) {
      if (fds[i].revents == 0) continue;
      int& fd = i == 0 ? out_fd_ : err_fd_;
      const ssize_t r = ::read(fd, buf, sizeof buf);
      if (r > 0) {
        (i == 0 ? o_.out : o_.err).append(buf, static_cast<std::size_t>(r));
      } else if (r == 0 || errno != EINTR) {
        ::close(fd);
        fd = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  Output o_;
};

/// Runs `chorus ARGS...` to the end (as the user `as_user`, where >= 0: the test must be root).
inline Output run_chorus(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                         int as_user = -1) {
  Child c(args, env, as_user);
  return c.finish();
}

/// How much more memory at its peak a command that meets a line of 20 MiB
/// may take than it takes without that line, where it holds no more of a
/// line than the readers' bound (16 MiB: its buffer, grown from 4 MiB, and
/// the smaller ones it replaced). Read whole, the line takes several times
/// its size (the buffer grown past it, a copy, a parse). AddressSanitizer
/// keeps freed buffers aside for a while, so that its builds hold more.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr long line_bound_slack_kb = 96L << 10;
#else
inline constexpr long line_bound_slack_kb = 48L << 10;
#endif

/// The user tests take for "another user of this machine": nobody.
inline constexpr int other_uid = 65534;

/// What `ask` returns, asked in a child process that dropped root for the
/// user and group `uid` (no other groups): another user of the machine,
/// whose every access the kernel checks. The test must be root.
inline std::string as_other_user(int uid, const std::function<std::string()>& ask) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork");
  if (pid == 0) {
    ::close(p[0]);
    const std::string said = ::setgroups(0, nullptr) != 0 || ::setgid(static_cast<gid_t>(uid)) != 0 ||
                                     ::setuid(static_cast<uid_t>(uid)) != 0
                                 ? std::string("could not become uid ") + std::to_string(uid)
                                 : ask();
    for (std::size_t at = 0; at < said.size();) {
      const ssize_t n = ::write(p[1], said.data() + at, said.size() - at);
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(p[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(p[0]);
  ::waitpid(pid, nullptr, 0);
  return out;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

inline bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

inline std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}


inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

} // namespace chorus::test
