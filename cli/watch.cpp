// `chorus watch`: a run's events (events.jsonl, io/store/event_log.hpp) as
// they happen, read through cli/run_events.hpp, until the run ends; for a
// group, every member run's until all have ended. How a run ended comes
// from its run_finished event, else from run.json as every reader reports it
// (cli/run_info.hpp: a run whose host is gone reads crashed), so that a
// watch never outlives its run.
#include "cli/cli.hpp"
#include "cli/group_info.hpp"
#include "cli/locate.hpp"
#include "cli/run_events.hpp"
#include "cli/run_info.hpp"
#include "io/store/lease.hpp"
#include "runtime/core/json.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <thread>
#include <unistd.h>

namespace chorus::cli {
int watch_main(std::span<char* const> args); // below

const Command watch_command{
    .name = "watch",
    .summary = "print a run's events (a rank stalled or lost, values not finite, its end) as they happen, and exit "
               "with how the run ended",
    .usage = "[OPTIONS] RUN|GROUP",
    .help = R"(Prints the events the run host tells while a run goes on (the run's
events.jsonl: stalled, resumed, nonfinite, rank_failed, rank_killed, rank_lost,
barrier_timeout, run_finished, threshold, straggler), one line each: first
those told already, then each new one as it comes (the file is looked at five
times a second), until the run ends. A run's last event is run_finished, with
its end state. A run whose host is gone (its lease expired, or on its machine
no process holds its WAL) ends the watch as crashed, as `chorus ls` and `show`
report it; a run.json that says the run ended, where no run_finished was told,
ends it in run.json's state.

For a GROUP, every member run in its directory is watched, those that start
later too, until all have ended: each line names its run. A member whose run
is not on this machine ends as group.json says; where group.json counts runs
that never report, the watch ends 30 s after the others did, counting them
crashed; a run whose run.json stays unreadable for 30 s counts as crashed too.

RUN|GROUP: a run's directory (or its run.json), a group's directory, or a run
id or a group's name under --dir.

each line: TIME  [RUN]  KIND  rank R  step S  MESSAGE
  TIME in local time; "-" where the event concerns no one rank or step; the
  kind in colour where stdout is a terminal.

options:
  --json              each event's line of events.jsonl as it is, nothing
                      else (for a GROUP, the run's id added first, as "run")
  --kinds K[,K...]    print only these kinds (the run's end still ends the watch)
  --no-follow         print the events there are, and exit with the run's state
                      so far (6 while it runs)
  --dir DIR           where to look up a run id or a group's name (default
                      $CHORUS_DIR, else ./chorus-runs)
  -h, --help          this text

exit codes (for scripts):
  0  the run finished (a GROUP: every run of it finished)
  3  it failed
  4  it was killed (a signal stopped it)
  5  it crashed: its host was lost (for a GROUP also: a run that never started)
  6  it is still running (--no-follow only)
  1  no such run or group, or it cannot be read
  2  a wrong command line
A GROUP exits with its worst run's code: failed over crashed over killed.
Ctrl-C stops the watch (status 130).

examples:
  chorus watch chorus-runs/mnist/torchrun-20250301-142233-3fa9c1/7goccjs3
  chorus watch torchrun-20250301-142233-3fa9c1 --kinds stalled,rank_lost
  chorus watch RUN --no-follow; echo "state: $?"
)",
    .main = watch_main,
};

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto poll_interval = 200ms; // events.jsonl looked at
constexpr auto look_interval = 1s;    // run.json and the host's lease, group.json

struct WatchArgs {
  std::string target, dir;
  bool json = false;
  bool follow = true;
  std::vector<EventKind> kinds; // empty: every kind
};

/// Every kind of event, as events.jsonl names them.
std::vector<EventKind> all_kinds() {
  std::vector<EventKind> out;
  for (int i = 1; i < 256; ++i) {
    const auto k = static_cast<EventKind>(i);
    if (store::event_kind(to_string(k)) == k) out.push_back(k);
  }
  return out;
}

void parse_kinds(ArgCursor& c, const std::string& value, std::vector<EventKind>& out) {
  std::string names;
  for (EventKind k : all_kinds()) names.append(names.empty() ? "" : ", ").append(to_string(k));
  std::string_view rest = value;
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view word = rest.substr(0, comma);
    if (const auto k = store::event_kind(word)) {
      if (std::find(out.begin(), out.end(), *k) == out.end()) out.push_back(*k);
    } else {
      c.fail("--kinds takes event kinds separated by commas (" + names + "), not '" + std::string(word) + "'");
      return;
    }
    if (comma == std::string_view::npos) return;
    rest.remove_prefix(comma + 1);
  }
}

Error parse(std::span<char* const> words, WatchArgs& a, bool& help) {
  ArgCursor c(words);
  std::string v;
  while (!c.done() && c.error().empty()) {
    if (c.flag({"-h", "--help"})) {
      help = true;
      return {};
    }
    if (c.flag({"--json"})) {
      a.json = true;
    } else if (c.flag({"--no-follow"})) {
      a.follow = false;
    } else if (c.option({"--kinds"}, v)) {
      parse_kinds(c, v, a.kinds);
    } else if (c.option({"--dir"}, v)) {
      a.dir = v;
      if (v.empty()) c.fail("--dir is empty: give the directory the runs are under");
    } else {
      c.operand(a.target, "run or group");
    }
  }
  if (!c.error().empty()) return invalid(c.error());
  if (a.target.empty()) return invalid("missing RUN|GROUP: a run's directory or id, or a group's directory or name");
  return {};
}

/// The exit code of a run, or a group's member, that ended in `state`.
int code_of(std::string_view state) {
  if (state == "finished") return exit_ok;
  if (state == "failed") return exit_run_failed;
  if (state == "killed") return exit_run_killed;
  if (state == "running") return exit_run_running;
  return exit_run_crashed; // crashed; a group's "missing" or "unknown" run
}

/// Which of two ends a group reports: failed over crashed over killed over finished.
int worse(int a, int b) {
  const auto weight = [](int code) {
    switch (code) {
    case exit_run_running: return 4;
    case exit_run_failed: return 3;
    case exit_run_crashed: return 2;
    case exit_run_killed: return 1;
    default: return 0;
    }
  };
  return weight(b) > weight(a) ? b : a;
}

/// One run followed: its events and how it ended, once it has.
struct WatchedRun {
  WatchedRun(std::string d, std::string l) : dir(std::move(d)), label(std::move(l)), events(dir) {}

  std::string dir, label;
  RunEvents events;
  RunInfo info;                   // run.json as last read
  std::optional<std::string> end; // how it ended
  bool by_event = false;          // a run_finished said so
  std::uint64_t skipped_told = 0; // lines that are no event, warned of
  bool end_told = false;          // an end without run_finished, said on stderr
  // Since when run.json cannot be read (max: it can).
  Clock::time_point unreadable_since = Clock::time_point::max();
};

/// Whether the last event read ends the run: a run_finished of its current
/// attempt (one of an earlier attempt, before the run was resumed, does not).
bool finished_by_event(const WatchedRun& w) {
  const std::optional<Event>& f = w.events.last_finish();
  if (!f) return false;
  if (w.info.readable() && w.info.segments.size() > 1) {
    const std::optional<double> started = w.info.segments.back().start_time;
    const double at = std::chrono::duration<double>(f->time.time_since_epoch()).count();
    if (started && at < *started) return false;
  }
  return true;
}

void warn_skipped(WatchedRun& w) {
  const std::uint64_t n = w.events.skipped();
  if (n <= w.skipped_told) {
    w.skipped_told = std::min(w.skipped_told, n); // a file read afresh counts again
    return;
  }
  if (w.skipped_told == 0)
    std::fprintf(stderr,
                 "chorus watch: %s: a line that is no event, passed over (%s): the file is damaged; chorus recover "
                 "%s rebuilds it from the WAL\n",
                 w.events.path().c_str(), w.events.first_skipped().c_str(), w.dir.c_str());
  w.skipped_told = n;
}

/// Reads what the run's events.jsonl holds since the last call and, where
/// `look`, run.json; sets `w.end` once the run has ended. The events to
/// print, or why the file cannot be read.
Result<std::vector<RunEvents::Read>> step(WatchedRun& w, bool look) {
  std::vector<RunEvents::Read> reads = w.events.poll();
  if (Error e = w.events.problem()) return Error(e.code(), e.message() + " (the run's events cannot be read on)");
  warn_skipped(w);
  if (w.end) return reads;
  if (!look) {
    if (finished_by_event(w)) {
      w.end = std::string(to_string(w.events.last_finish()->state));
      w.by_event = true;
    }
    return reads;
  }
  w.info = read_run(w.dir);
  if (!w.info.readable()) {
    // A run of a group whose run.json stays unreadable (its host died before
    // writing it, or it is damaged) is taken as crashed, so that the watch ends.
    if (w.unreadable_since == Clock::time_point::max()) {
      w.unreadable_since = Clock::now();
    } else if (Clock::now() - w.unreadable_since >= store::lease_expiry) {
      w.end = "crashed";
      w.info.error = "its run.json could not be read for " + std::to_string(store::lease_expiry.count()) +
                     " s: " + w.info.problem.message();
      return reads;
    }
  } else {
    w.unreadable_since = Clock::time_point::max();
  }
  if (finished_by_event(w)) {
    w.end = std::string(to_string(w.events.last_finish()->state));
    w.by_event = true;
    return reads;
  }
  if (!w.info.readable() || w.info.reported_state() == "running") return reads;
  // run.json says it ended: its run_finished, where there is one, was written before.
  std::vector<RunEvents::Read> more = w.events.poll();
  warn_skipped(w);
  std::move(more.begin(), more.end(), std::back_inserter(reads));
  w.by_event = finished_by_event(w);
  w.end = w.by_event ? std::string(to_string(w.events.last_finish()->state)) : w.info.reported_state();
  return reads;
}

/// Where a run ended without telling it, why (run.json's error, or its host lost).
void tell_silent_end(WatchedRun& w, bool group) {
  if (!w.end || w.by_event || w.end_told) return;
  w.end_told = true;
  std::string line = "chorus watch: ";
  line += group ? w.label + " (" + w.dir + ")" : w.info.id;
  line += " ended " + *w.end + " without a run_finished event";
  if (w.info.error && !w.info.error->empty()) line += ": " + *w.info.error;
  line += "\n";
  for (char& ch : line)
    if ((static_cast<unsigned char>(ch) < 0x20 && ch != '\n') || ch == 0x7f) ch = ' ';
  std::fputs(line.c_str(), stderr);
}

/// How events are printed.
struct Printer {
  const WatchArgs& args;
  bool colour = false;
  bool group = false;
  std::size_t label_width = 0;

  [[nodiscard]] bool wanted(EventKind k) const {
    return args.kinds.empty() || std::find(args.kinds.begin(), args.kinds.end(), k) != args.kinds.end();
  }

  static const char* colour_of(const Event& e) {
    switch (e.kind) {
    case EventKind::resumed: return "\x1b[32m";
    case EventKind::run_finished:
      return e.state == RunState::finished ? "\x1b[32m" : e.state == RunState::killed ? "\x1b[33m" : "\x1b[31m";
    case EventKind::stalled:
    case EventKind::straggler:
    case EventKind::threshold:
    case EventKind::rank_killed: return "\x1b[33m";
    default: return "\x1b[31m";
    }
  }

  static void pad(std::string& s, std::size_t width) {
    const std::size_t w = display_width(s);
    if (w < width) s.append(width - w, ' ');
  }

  [[nodiscard]] std::string text(const store::EventLine& l, const std::string& label) const {
    const Event& e = l.event;
    std::string out = event_time(e) + "  ";
    if (group) {
      std::string run = label;
      pad(run, label_width);
      out += run + "  ";
    }
    std::string kind(to_string(e.kind));
    const std::size_t kind_width = std::string_view("barrier_timeout").size();
    const std::string gap(kind.size() < kind_width ? kind_width - kind.size() : 0, ' ');
    out += colour ? colour_of(e) + kind + "\x1b[0m" + gap : kind + gap;
    std::string rank = e.rank >= 0 ? "rank " + std::to_string(e.rank) : "-";
    pad(rank, 8);
    std::string step = e.step >= 0 ? "step " + std::to_string(e.step) : "-";
    pad(step, 10);
    out += "  " + rank + "  " + step + "  ";
    // The message comes from a file: a newline or an escape sequence in it must not wreck the screen.
    for (char ch : e.message) out += static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f ? ' ' : ch;
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  }

  [[nodiscard]] std::string json(const RunEvents::Read& r, const WatchedRun& w) const {
    if (!group) return r.line + "\n";
    // The run's id first, then the line's own fields.
    std::string id;
    core::JsonWriter(id).string(w.info.id.empty() ? w.label : w.info.id);
    const auto open = r.line.find('{');
    return r.line.substr(0, open + 1) + "\"run\":" + id + "," + r.line.substr(open + 1) + "\n";
  }

  void print(const std::vector<std::pair<const WatchedRun*, RunEvents::Read>>& batch) const {
    std::string out;
    for (const auto& [w, r] : batch) {
      if (!wanted(r.event.event.kind)) continue;
      out += args.json ? json(r, *w) : text(r.event, w->label);
    }
    if (out.empty()) return;
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }
};

/// Why the run at `w.dir` cannot be watched.
std::string unreadable(const WatchedRun& w) {
  std::string msg = "cannot read the run at " + w.dir + ": " + w.info.problem.message();
  std::error_code ec;
  if (std::filesystem::exists(w.dir + "/wal", ec) && msg.find("recover") == std::string::npos)
    msg += ". If its host crashed, 'chorus recover " + w.dir + "' rebuilds its files from the WAL";
  return msg;
}

int watch_run(const std::string& dir, const WatchArgs& a, Printer& printer) {
  WatchedRun w(dir, "");
  auto last_look = Clock::now() - look_interval;
  for (;;) {
    const bool look = Clock::now() - last_look >= look_interval;
    if (look) last_look = Clock::now();
    Result<std::vector<RunEvents::Read>> reads = step(w, look);
    if (!reads) return failure("watch", w.events.path() + ": " + reads.error().message());
    if (look && !w.info.readable()) return failure("watch", unreadable(w));
    std::vector<std::pair<const WatchedRun*, RunEvents::Read>> batch;
    for (RunEvents::Read& r : *reads) batch.emplace_back(&w, std::move(r));
    printer.print(batch);
    if (w.end) {
      tell_silent_end(w, false);
      return code_of(*w.end);
    }
    if (!a.follow) return exit_run_running;
    std::this_thread::sleep_for(poll_interval);
  }
}

/// A member of the group, watched where its run is on this machine.
struct Member {
  std::string label;
  std::optional<store::GroupMember> reported; // group.json's word
  WatchedRun* run = nullptr;
};

int watch_group(const std::string& dir, const WatchArgs& a, Printer& printer) {
  printer.group = true;
  std::vector<std::unique_ptr<WatchedRun>> runs;
  std::vector<Member> members;
  std::optional<store::GroupManifest> manifest;
  std::string manifest_problem;
  // Since when every run known has ended while group.json counts more (max: not so).
  Clock::time_point unsettled_since = Clock::time_point::max();
  auto last_look = Clock::now() - look_interval;
  for (;;) {
    const bool look = Clock::now() - last_look >= look_interval;
    if (look) {
      last_look = Clock::now();
      GroupInfo g = read_group(dir);
      if (g.problem && g.problem.message() != manifest_problem) {
        manifest_problem = g.problem.message();
        std::fprintf(stderr, "chorus watch: %s/group.json: %s; watching the runs in the directory\n", dir.c_str(),
                     manifest_problem.c_str());
      }
      manifest = std::move(g.manifest);
      members.clear();
      for (GroupMemberView& v : g.members) {
        Member m{v.label, v.member, nullptr};
        if (v.run) {
          auto it = std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r->dir == v.run->dir; });
          if (it == runs.end()) {
            runs.push_back(std::make_unique<WatchedRun>(v.run->dir, v.label));
            it = std::prev(runs.end());
            printer.label_width = std::max(printer.label_width, display_width(v.label));
          }
          m.run = it->get();
        }
        members.push_back(std::move(m));
      }
    }
    std::vector<std::pair<const WatchedRun*, RunEvents::Read>> batch;
    for (auto& w : runs) {
      Result<std::vector<RunEvents::Read>> reads = step(*w, look);
      if (!reads) return failure("watch", w->events.path() + ": " + reads.error().message());
      for (RunEvents::Read& r : *reads) batch.emplace_back(w.get(), std::move(r));
      if (w->end) tell_silent_end(*w, true);
    }
    // The runs' events in the order they happened.
    std::stable_sort(batch.begin(), batch.end(),
                     [](const auto& x, const auto& y) { return x.second.event.event.time < y.second.event.event.time; });
    printer.print(batch);

    // Where the group stands: each member's end, its run's where its run is
    // here (group.json's where that run cannot be read), else group.json's.
    int code = exit_ok;
    bool all_ended = true;
    for (const Member& m : members) {
      std::optional<std::string> end;
      if (m.run != nullptr && m.run->end)
        end = m.run->end;
      else if (m.reported && m.reported->ended() && (m.run == nullptr || !m.run->info.readable()))
        end = m.reported->state;
      if (!end) all_ended = false;
      code = worse(code, code_of(end.value_or("running")));
    }
    const std::size_t counted = manifest ? static_cast<std::size_t>(std::max<std::int64_t>(manifest->size, 0)) : 0;
    const bool complete = !manifest || manifest->state != "running" || manifest->members.size() >= counted;
    if (!a.follow) return complete ? code : worse(code, exit_run_running);
    if (all_ended && complete) return code;
    if (all_ended) {
      if (unsettled_since == Clock::time_point::max()) unsettled_since = Clock::now();
      if (Clock::now() - unsettled_since >= store::lease_expiry) {
        std::fprintf(stderr,
                     "chorus watch: %s/group.json counts %zu runs, of which %zu reported; the others never did in "
                     "%lld s after the rest ended: counted crashed\n",
                     dir.c_str(), counted, manifest ? manifest->members.size() : std::size_t{0},
                     static_cast<long long>(store::lease_expiry.count()));
        return worse(code, exit_run_crashed);
      }
    } else {
      unsettled_since = Clock::time_point::max();
    }
    std::this_thread::sleep_for(poll_interval);
  }
}

} // namespace

int watch_main(std::span<char* const> words) {
  WatchArgs a;
  if (std::optional<int> done = parse_words(watch_command, words, a, &parse)) return *done;
  const Result<Located> found = locate(a.target, a.dir);
  if (!found) return failure("watch", found.error().message());
  Printer printer{a};
  printer.colour = !a.json && ::isatty(STDOUT_FILENO) != 0;
  if (!found->group.empty()) return watch_group(found->group, a, printer);
  return watch_run(found->run, a, printer);
}

} // namespace chorus::cli
