// The EventWatch's rules (event_watch.hpp states them); what the header
// leaves open is settled here:
//
// - A rank is live from its join (rank_joined, or the rank_state that says
//   it runs) to its end; a rank that never joined is never stalled, lags
//   nobody and is nobody's "other rank".
// - stalled: the stall's clock starts at the later of the rank's last move
//   and the onset of "another live rank stands higher, or a live rank waits
//   at the open barrier". A move is a higher step from progress(), its join,
//   reaching a barrier and being released from one (a rank released after
//   a long wait starts afresh). The onset of "stands higher" is exact: the
//   watch keeps the climbs of the highest step reported since the last tick
//   (one entry each time it rises) and tick() finds the first past the
//   rank's step; the onset of a barrier wait is the first live rank's
//   arrival. tick() decides (a rank whose condition ends at a tick starts
//   afresh at the next onset). The event's seconds, and "for N s" in its
//   message, are how long the rank's step has stood still; `resumed` gives
//   how long it stood still before it moved (or reached the barrier).
// - nonfinite: a column is its key id and its rank (-1 for a reduced
//   column, and for every column of a run of one rank, whose event names
//   rank 0 in `ranks`). A reduced value that is not finite although every
//   rank's was (a sum that overflowed) names no rank.
// - rank_failed, rank_killed, rank_lost: at most one of them per rank and
//   attempt (a rank ends once; a finished rank whose process then exits
//   non-zero turns failed, and that is told).
// - barrier_timeout: a release with an error and missing ranks (a timeout,
//   or the run's end before they came); a mismatch of names misses nobody.
// - threshold above/below: `value > limit` / `value < limit` fires, and a
//   value within (`<=` / `>=`) re-arms; NaN is neither (nonfinite tells it).
//   The same kind and limit twice on a key is one rule. A rule whose limit
//   is not finite, or a no_change whose seconds are not positive, is ignored.
// - threshold no_change: at a tick at `now`, a column fires when the run is
//   live, its committed value has not changed since `since` with
//   now - since >= limit, and the run went on within the rule's time: a row
//   committed, or a live rank's step moved, after now - limit (so a run that
//   pauses as a whole, an evaluation or a checkpoint, is not alarmed about).
//   `since` is the column's last change (its first value counts as one), or,
//   for a key that has not committed in this attempt, the later of the
//   attempt's start and the rule's arrival (the latest time the watch saw);
//   that case is one column, rank -1. NaN repeated is no change. Once it has
//   fired, a column fires again only after its value changed.
// - straggler by barriers: at each release the watch notes the last rank to
//   arrive and how long every other rank waited for it alone (its arrival
//   minus the one before it); a release that missed ranks, or had fewer
//   than two waiters, has no last rank. Once the last straggler_window
//   releases are known, a live rank that was last, with a wait of at least
//   straggler_floor, at ceil(straggler_share x window) of them or more is a
//   straggler; it is told again only after a release at which it no longer
//   is (straggler_window 0: off). The event's barrier is the latest one's.
// - straggler by steps: at each tick, a live rank whose step is more than
//   lag_steps below the lower median of the live ranks' steps lags; it is a
//   straggler once it has lagged at every tick for lag_for (measured from
//   the first tick that saw it lag), and again only after a tick at which
//   it did not lag.
// - Messages: what happened, then what to do; one or two sentences, no
//   newline (a rank's reason has its line breaks turned into spaces).
#include "runtime/core/event_watch.hpp"

#include "runtime/core/strings.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_set>
#include <utility>

namespace chorus::core {
namespace {

constexpr std::int64_t never = std::numeric_limits<std::int64_t>::min();
constexpr std::size_t max_world = 1u << 16;

struct RankWatch {
  bool joined = false;
  bool live = false; // joined and running
  bool parked = false;
  bool stalled = false;
  bool end_told = false;
  bool finished = false; // it ended finished: a later exit status may still fail it
  bool straggling_barriers = false;
  bool straggling_steps = false;
  std::int64_t step = -1;
  std::int64_t moved_us = 0;
  std::int64_t behind_since = never; // the stall's clock, once a tick saw its condition
  std::int64_t lag_since = never;
  std::int64_t pid = -1;
  std::string host;
};

/// The highest step reported since the last tick rose to `step` at `us`.
struct Rise {
  std::int64_t step;
  std::int64_t us;
};

struct Release {
  int last; // -1: no rank was last
  std::int64_t wait_us;
};

struct LastCount {
  int rank;
  std::size_t n;
  std::int64_t least_wait_us;
};

/// A rule's state for one column (indexed by rank + 1).
struct Column {
  bool seen = false;
  bool fired = false;
  double value = 0;
  std::int64_t step = -1;
  std::int64_t since_us = 0;
};

struct Rule {
  AlertRule rule;
  std::int64_t limit_us = 0; // no_change
  bool any_seen = false;     // no_change: the key committed in this attempt
  bool unseen_fired = false;
  std::int64_t since_us = 0; // no_change: since when no value of the key committed
  std::vector<Column> cols;
};

struct KeyRules {
  std::uint32_t key = 0;
  std::string name;
  std::vector<Rule> rules;
};

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

/// "301 s", "2.5 s", "250 ms".
std::string duration(std::int64_t us) {
  us = std::max<std::int64_t>(us, 0);
  if (us >= 10'000'000) return std::to_string(us / 1'000'000) + " s";
  if (us >= 1'000'000) {
    const std::int64_t tenths = us / 100'000;
    return std::to_string(tenths / 10) + (tenths % 10 ? std::string(".").append(std::to_string(tenths % 10)) : std::string()) + " s";
  }
  return std::to_string(us / 1000) + " ms";
}

// Appended, not `"\"" + std::string(s)`: GCC 12 at -O3 takes that form for an
// overlapping copy (-Wrestrict, a false positive).
std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  out.append(s);
  out.push_back('"');
  return out;
}

std::string who(int rank, const RankWatch& r) {
  std::string s = "rank " + std::to_string(rank);
  if (r.pid >= 0 && !r.host.empty())
    s += " (process " + std::to_string(r.pid) + " on " + r.host + ")";
  else if (r.pid >= 0)
    s += " (process " + std::to_string(r.pid) + ")";
  else if (!r.host.empty())
    s += " (on " + r.host + ")";
  return s;
}

/// A reason as a message's clause: one line, without a closing period.
std::string clause(std::string_view reason) {
  std::string s(reason);
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  while (!s.empty() && (s.back() == ' ' || s.back() == '.')) s.pop_back();
  return s;
}

std::string at_step(std::int64_t step) {
  return step >= 0 ? "at step " + std::to_string(step) : std::string("before it logged a step");
}

constexpr std::string_view slow_advice =
    "look at what slows it (its node's load, I/O, a slower GPU or link) or give it less work";

} // namespace

struct EventWatch::State {
  WatchSettings set;
  bool live = false; // between run_start and run_end
  std::optional<RunState> ended; // after run_end: the end state told
  std::vector<RankWatch> ranks;
  std::int64_t clock_us = never;        // the latest time any call gave
  std::int64_t last_tick_us = never;
  std::int64_t last_activity_us = never; // a committed row, or a live rank's step moved

  // The highest step reported since the last tick, and each time it rose.
  std::int64_t window_top = never;
  std::vector<Rise> rises;

  // The open barrier.
  bool open = false;
  std::uint64_t open_index = 0;
  std::string open_name;
  int parked_live = 0;
  std::int64_t waiting_since = never; // since when a live rank waits there
  int arrivals = 0;
  int last_arrival = -1;
  std::int64_t last_arrival_us = 0;
  std::int64_t prev_arrival_us = 0;

  // The last straggler_window releases (a ring), and who was last.
  std::vector<Release> releases;
  std::size_t releases_head = 0;
  std::vector<LastCount> counts;       // scratch
  std::vector<int> barrier_stragglers; // ranks told, not yet re-armed

  std::vector<std::int64_t> steps; // scratch: live ranks' steps

  std::unordered_set<std::uint64_t> nonfinite_cols; // key << 32 | (rank + 1)

  std::vector<std::int32_t> rules_of_key; // key id -> index into keyed, -1: none
  std::vector<KeyRules> keyed;

  std::vector<EventDraft> drafts;

  explicit State(WatchSettings s) : set(s) { rises.reserve(1024); }

  void advance(std::int64_t now) { clock_us = std::max(clock_us, now); }

  RankWatch* rank_at(int rank) {
    return rank >= 0 && static_cast<std::size_t>(rank) < ranks.size() ? &ranks[static_cast<std::size_t>(rank)]
                                                                       : nullptr;
  }

  EventDraft& draft(EventKind kind, std::int64_t now) {
    EventDraft& d = drafts.emplace_back();
    d.kind = kind;
    d.ts_us = now;
    return d;
  }

  EventDraft& about(EventKind kind, int rank, const RankWatch& r, std::int64_t now) {
    EventDraft& d = draft(kind, now);
    d.rank = rank;
    d.step = r.step;
    d.host = r.host;
    d.pid = r.pid;
    return d;
  }

  // ---- ranks --------------------------------------------------------------

  void join(RankWatch& r, std::int64_t now) {
    if (r.joined) return;
    r.joined = true;
    r.live = true;
    r.moved_us = now;
    r.behind_since = never;
  }

  /// The rank no longer runs: it leaves every rule of the living.
  void leave(RankWatch& r) {
    if (!r.live) return;
    r.live = false;
    r.stalled = false; // its end's event says the rest
    r.behind_since = never;
    r.lag_since = never;
    r.straggling_steps = false;
    r.straggling_barriers = false;
    if (r.parked && --parked_live == 0) waiting_since = never;
  }

  void resumed(int rank, RankWatch& r, std::int64_t stood_us, std::string_view how, std::int64_t now) {
    r.stalled = false;
    EventDraft& d = about(EventKind::resumed, rank, r, now);
    d.seconds_us = stood_us;
    d.message = who(rank, r) + " " + std::string(how) + " after " + duration(stood_us) +
                " without progress; nothing to do unless it stalls again";
  }

  void told_end(int rank, RankWatch& r, RunState state, std::int64_t last_step, std::string_view reason,
                std::int64_t now) {
    EventKind kind;
    std::string what, advice;
    switch (state) {
    case RunState::failed:
      kind = EventKind::rank_failed;
      what = "failed";
      advice = "Look at its log for the error (a traceback, or what made its process exit)";
      break;
    case RunState::killed:
      kind = EventKind::rank_killed;
      what = "was killed";
      advice = "Look at who stopped it: the scheduler (a time or memory limit), the kernel's OOM killer (dmesg" +
               (r.host.empty() ? std::string() : " on " + r.host) + ") or a user";
      break;
    case RunState::crashed:
      kind = EventKind::rank_lost;
      what = "was lost";
      advice = r.joined ? "Look at its node and its log: its process may have crashed, or its node or the "
                          "network gone down"
                        : "Look at whether its process started (the launcher's log) and can reach the run host";
      break;
    default: return;
    }
    if (r.end_told) return;
    r.end_told = true;
    EventDraft& d = about(kind, rank, r, now);
    d.step = std::max(r.step, last_step);
    d.state = state;
    d.reason = std::string(reason);
    const std::string why = clause(reason);
    d.message = who(rank, r) + " " + what + " " +
                (r.joined ? at_step(d.step) : std::string("before it joined the run")) +
                (why.empty() ? std::string() : ": " + why) + ". " + advice;
  }

  // ---- stalls -------------------------------------------------------------

  /// When another rank first stood higher than `step` since the last tick.
  std::int64_t first_rise_past(std::int64_t step) const {
    const auto it = std::upper_bound(rises.begin(), rises.end(), step,
                                     [](std::int64_t s, const Rise& r) { return s < r.step; });
    return it == rises.end() ? never : it->us;
  }

  void find_stalls(std::int64_t top, std::int64_t now) {
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      RankWatch& r = ranks[i];
      if (!r.live || r.parked) continue;
      const bool ahead = top > r.step; // only another rank stands above its own step
      const bool waited = parked_live > 0;
      if (!ahead && !waited) {
        r.behind_since = never;
        continue;
      }
      if (r.behind_since == never) {
        std::int64_t onset = std::numeric_limits<std::int64_t>::max();
        if (ahead) {
          // Not in this tick's climbs: the rank ahead was there before, and
          // this rank only now counts (it moved, joined or left a barrier since).
          const std::int64_t rise = first_rise_past(r.step);
          onset = rise != never ? rise : last_tick_us != never ? last_tick_us : r.moved_us;
        }
        if (waited) onset = std::min(onset, waiting_since);
        r.behind_since = std::max(r.moved_us, onset);
      }
      if (r.stalled || now - r.behind_since < set.stall_after_us) continue;
      r.stalled = true;
      const int rank = static_cast<int>(i);
      EventDraft& d = about(EventKind::stalled, rank, r, now);
      d.others_step = top;
      d.seconds_us = now - r.moved_us;
      std::string others;
      if (ahead) others = "other ranks reached step " + std::to_string(top);
      if (waited) others += (ahead ? " and wait" : "other ranks wait") + std::string(" for it at barrier ") + quoted(open_name);
      d.message = who(rank, r) + " has " +
                  (r.step >= 0 ? "not logged past step " + std::to_string(r.step) : std::string("logged nothing")) +
                  " for " + duration(d.seconds_us) + " while " + others +
                  "; it may hang (a deadlock, a stuck collective or I/O): look at its stack (" +
                  (r.pid >= 0 ? "py-spy dump --pid " + std::to_string(r.pid) + ", or gdb -p " + std::to_string(r.pid)
                              : std::string("py-spy dump or gdb on its process")) +
                  ")";
    }
  }

  // ---- stragglers ---------------------------------------------------------

  void find_laggards(std::int64_t now) {
    steps.clear();
    for (const RankWatch& r : ranks)
      if (r.live) steps.push_back(r.step);
    if (steps.size() < 2) {
      for (RankWatch& r : ranks) {
        r.lag_since = never;
        r.straggling_steps = false;
      }
      return;
    }
    const auto mid = steps.begin() + static_cast<std::ptrdiff_t>((steps.size() - 1) / 2); // the lower median
    std::nth_element(steps.begin(), mid, steps.end());
    const std::int64_t median = *mid;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      RankWatch& r = ranks[i];
      if (!r.live || median - r.step <= set.lag_steps) {
        r.lag_since = never;
        r.straggling_steps = false;
        continue;
      }
      if (r.lag_since == never) r.lag_since = now;
      if (r.straggling_steps || now - r.lag_since < set.lag_for_us) continue;
      r.straggling_steps = true;
      const int rank = static_cast<int>(i);
      EventDraft& d = about(EventKind::straggler, rank, r, now);
      d.others_step = median;
      d.reason = "steps";
      d.message = who(rank, r) + " is " + std::to_string(median - r.step) + " steps behind the median rank (" +
                  (r.step >= 0 ? "at step " + std::to_string(r.step) : std::string("it logged no step yet")) +
                  ", the median at step " + std::to_string(median) + ") for " + duration(now - r.lag_since) + "; " +
                  std::string(slow_advice);
    }
  }

  void note_release(Release rel, std::string_view name, std::int64_t now) {
    const std::size_t window = set.straggler_window;
    if (window == 0) return;
    if (releases.size() < window) {
      releases.push_back(rel);
    } else {
      releases[releases_head] = rel;
      releases_head = (releases_head + 1) % window;
    }
    if (releases.size() < window) return;
    const double share = std::ceil(set.straggler_share * static_cast<double>(window) - 1e-9);
    const std::size_t need = share <= 1 ? 1 : static_cast<std::size_t>(std::min(share, 1e18));
    counts.clear();
    for (const Release& x : releases) {
      if (x.last < 0 || x.wait_us < set.straggler_floor_us) continue;
      auto it = std::find_if(counts.begin(), counts.end(), [&](const LastCount& c) { return c.rank == x.last; });
      if (it == counts.end()) {
        counts.push_back({x.last, 1, x.wait_us});
      } else {
        ++it->n;
        it->least_wait_us = std::min(it->least_wait_us, x.wait_us);
      }
    }
    std::sort(counts.begin(), counts.end(), [](const LastCount& a, const LastCount& b) { return a.rank < b.rank; });
    // Re-armed: told before, no longer last often enough.
    std::erase_if(barrier_stragglers, [&](int rank) {
      auto it = std::find_if(counts.begin(), counts.end(), [&](const LastCount& c) { return c.rank == rank; });
      if (it != counts.end() && it->n >= need) return false;
      if (RankWatch* r = rank_at(rank)) r->straggling_barriers = false;
      return true;
    });
    for (const LastCount& c : counts) {
      RankWatch* r = rank_at(c.rank);
      if (c.n < need || !r || !r->live || r->straggling_barriers) continue;
      r->straggling_barriers = true;
      barrier_stragglers.push_back(c.rank);
      EventDraft& d = about(EventKind::straggler, c.rank, *r, now);
      d.reason = "barriers";
      d.barrier = std::string(name);
      d.message = who(c.rank, *r) + " was the last to reach " + std::to_string(c.n) + " of the last " +
                  std::to_string(window) + " barriers (the latest " + quoted(name) + "), each time keeping the others waiting " +
                  duration(c.least_wait_us) + " or more; " + std::string(slow_advice);
    }
  }

  // ---- values -------------------------------------------------------------

  void nonfinite(const Row& row, std::size_t i, const std::function<std::string_view(std::uint32_t)>& key_name,
                 std::int64_t now) {
    const RowValue& v = row.values[i];
    const std::uint64_t col = (std::uint64_t{v.key} << 32) | static_cast<std::uint32_t>(v.rank + 1);
    if (!nonfinite_cols.insert(col).second) return;
    EventDraft& d = draft(EventKind::nonfinite, now);
    d.key = std::string(key_name(v.key));
    d.step = row.step;
    d.rank = v.rank;
    d.value = v.value;
    d.has_value = true;
    if (v.rank >= 0) {
      d.ranks.push_back(v.rank);
    } else {
      const auto it = std::find_if(row.nonfinite.begin(), row.nonfinite.end(),
                                   [&](const RowNonfinite& n) { return n.value == i; });
      if (it != row.nonfinite.end()) d.ranks = it->ranks;
      else if (ranks.size() == 1) d.ranks.push_back(0);
    }
    std::string whose;
    if (d.ranks.empty())
      whose = "every rank's value was finite: their reduction overflowed";
    else if (v.rank >= 0 || ranks.size() == 1)
      whose = "rank " + std::to_string(d.ranks.front()) + " logged it";
    else {
      const std::vector<int> list(d.ranks.begin(), d.ranks.end());
      whose = rank_list(list) + (list.size() == 1 ? " logged a non-finite value" : " logged non-finite values");
    }
    d.message = d.key + " is " + number(v.value) + " at step " + std::to_string(row.step) + " (" + whose +
                "); look for a diverging loss or bad input " + (d.ranks.size() > 1 ? "on those ranks" : "there") +
                " (lower the learning rate, clip gradients, check the data)";
  }

  static std::string column_name(const KeyRules& k, std::int32_t rank) {
    return rank >= 0 ? k.name + " of rank " + std::to_string(rank) : k.name;
  }

  void apply_rules(KeyRules& k, const RowValue& v, std::int64_t step, std::int64_t now) {
    const std::size_t c = static_cast<std::size_t>(v.rank + 1);
    for (Rule& rule : k.rules) {
      if (rule.cols.size() <= c) rule.cols.resize(c + 1);
      Column& col = rule.cols[c];
      if (rule.rule.kind == AlertRule::Kind::no_change) {
        const bool same = col.seen && (col.value == v.value || (std::isnan(col.value) && std::isnan(v.value)));
        if (!same) {
          col.value = v.value;
          col.since_us = now;
          col.fired = false;
        }
        col.seen = true;
        col.step = step;
        rule.any_seen = true;
        continue;
      }
      const bool above = rule.rule.kind == AlertRule::Kind::above;
      const bool beyond = above ? v.value > rule.rule.limit : v.value < rule.rule.limit;
      const bool within = above ? v.value <= rule.rule.limit : v.value >= rule.rule.limit;
      if (within) col.fired = false;
      if (!beyond || col.fired) continue;
      col.fired = true;
      EventDraft& d = draft(EventKind::threshold, now);
      d.key = k.name;
      d.rank = v.rank;
      d.step = step;
      d.value = v.value;
      d.has_value = true;
      d.rule = above ? "above" : "below";
      d.limit = rule.rule.limit;
      d.message = column_name(k, v.rank) + " is " + number(v.value) + " at step " + std::to_string(step) + ", " +
                  d.rule + " " + number(rule.rule.limit) +
                  " (an alert_when rule); look at what changed around that step, or stop the run if it diverged";
    }
  }

  void no_change_fired(const KeyRules& k, const Rule& rule, std::int32_t rank, const Column* col, std::int64_t now) {
    EventDraft& d = draft(EventKind::threshold, now);
    d.key = k.name;
    d.rank = rank;
    d.rule = "no_change";
    d.limit = rule.rule.limit;
    d.seconds_us = rule.limit_us;
    if (col) {
      d.step = col->step;
      d.value = col->value;
      d.has_value = true;
      d.message = column_name(k, rank) + " has stayed " + number(col->value) + " for " + duration(now - col->since_us) +
                  " (last committed at step " + std::to_string(col->step) +
                  ") while the run went on (an alert_when rule); look at whether it still learns (a frozen model, "
                  "a stuck data loader, a learning rate of 0)";
    } else {
      d.message = k.name + " has not been logged for " + duration(now - rule.since_us) +
                  " while the run went on (an alert_when rule); look at whether the code that logs it still runs";
    }
  }

  void find_unchanged(std::int64_t now) {
    for (KeyRules& k : keyed)
      for (Rule& rule : k.rules) {
        if (rule.rule.kind != AlertRule::Kind::no_change) continue;
        // The run went on within the rule's time: a row, or a rank's step.
        if (last_activity_us == never || last_activity_us <= now - rule.limit_us) continue;
        if (!rule.any_seen) {
          if (!rule.unseen_fired && now - rule.since_us >= rule.limit_us) {
            rule.unseen_fired = true;
            no_change_fired(k, rule, -1, nullptr, now);
          }
          continue;
        }
        for (std::size_t c = 0; c < rule.cols.size(); ++c) {
          Column& col = rule.cols[c];
          if (!col.seen || col.fired || now - col.since_us < rule.limit_us) continue;
          col.fired = true;
          no_change_fired(k, rule, static_cast<std::int32_t>(c) - 1, &col, now);
        }
      }
  }

  void restart_rules(std::int64_t now) {
    for (KeyRules& k : keyed)
      for (Rule& rule : k.rules) {
        rule.cols.clear();
        rule.any_seen = false;
        rule.unseen_fired = false;
        rule.since_us = now;
      }
  }
};

EventWatch::EventWatch(WatchSettings settings) : s_(std::make_unique<State>(settings)) {}
EventWatch::~EventWatch() = default;

void EventWatch::run_start(int world_size, std::int64_t now_us) {
  State& s = *s_;
  s.advance(now_us);
  const std::size_t world = static_cast<std::size_t>(std::clamp<int>(world_size, 0, static_cast<int>(max_world)));
  s.live = true;
  s.ended.reset();
  s.ranks.assign(world, RankWatch{});
  s.steps.reserve(world);
  s.last_tick_us = never;
  s.last_activity_us = never;
  s.window_top = never;
  s.rises.clear();
  s.open = false;
  s.open_name.clear();
  s.parked_live = 0;
  s.waiting_since = never;
  s.arrivals = 0;
  s.last_arrival = -1;
  s.releases.clear();
  s.releases_head = 0;
  s.barrier_stragglers.clear();
  s.nonfinite_cols.clear();
  s.restart_rules(now_us);
}

void EventWatch::rank_joined(int rank, std::string_view host, std::int64_t pid, std::int64_t now_us) {
  State& s = *s_;
  RankWatch* r = s.rank_at(rank);
  if (!s.live || !r) return;
  s.advance(now_us);
  if (r->joined) return;
  r->host = std::string(host);
  r->pid = pid;
  s.join(*r, now_us);
}

void EventWatch::progress(int rank, std::int64_t step, std::int64_t now_us) {
  State& s = *s_;
  RankWatch* r = s.rank_at(rank);
  if (!s.live || !r || !r->live) return;
  s.advance(now_us);
  if (step <= r->step) return;
  const std::int64_t stood_us = now_us - r->moved_us;
  r->step = step;
  r->moved_us = now_us;
  r->behind_since = never;
  s.last_activity_us = now_us;
  if (step > s.window_top) {
    s.window_top = step;
    s.rises.push_back({step, now_us});
  }
  if (r->stalled) [[unlikely]]
    s.resumed(rank, *r, stood_us, "moved on to step " + std::to_string(step), now_us);
}

void EventWatch::rank_state(int rank, RunState state, std::int64_t last_step, std::string_view reason,
                            std::int64_t now_us) {
  State& s = *s_;
  RankWatch* r = s.rank_at(rank);
  if (!r) return;
  if (!s.live) {
    // After the run's end only a finished rank's process that exits non-zero changes a rank: it failed.
    if (s.ended && r->finished && state == RunState::failed) {
      s.advance(now_us);
      r->finished = false;
      s.told_end(rank, *r, state, last_step, reason, now_us);
    }
    return;
  }
  s.advance(now_us);
  if (state == RunState::running) {
    s.join(*r, now_us); // the join itself, where rank_joined did not come first
    return;
  }
  s.leave(*r);
  r->finished = state == RunState::finished;
  s.told_end(rank, *r, state, last_step, reason, now_us);
}

void EventWatch::barrier_reached(int rank, std::uint64_t index, std::string_view name, std::int64_t now_us) {
  State& s = *s_;
  RankWatch* r = s.rank_at(rank);
  if (!s.live || !r) return;
  s.advance(now_us);
  if (!s.open || s.open_index != index) {
    s.open = true;
    s.open_index = index;
    s.open_name = std::string(name);
    s.arrivals = 0;
    s.last_arrival = -1;
  }
  if (r->parked) return;
  r->parked = true;
  ++s.arrivals;
  s.prev_arrival_us = s.last_arrival_us;
  s.last_arrival_us = now_us;
  s.last_arrival = rank;
  if (!r->live) return;
  if (s.parked_live++ == 0) s.waiting_since = now_us;
  const std::int64_t stood_us = now_us - r->moved_us;
  r->moved_us = now_us;
  r->behind_since = never;
  if (r->stalled) s.resumed(rank, *r, stood_us, "reached barrier " + quoted(name), now_us);
}

void EventWatch::barrier_released(std::uint64_t index, std::string_view name, std::span<const int> waiters,
                                  std::span<const int> missing, const Error* err, std::int64_t now_us) {
  State& s = *s_;
  if (!s.live) return;
  s.advance(now_us);
  if (err && !missing.empty()) {
    EventDraft& d = s.draft(EventKind::barrier_timeout, now_us);
    d.ranks.assign(missing.begin(), missing.end());
    d.barrier = std::string(name);
    d.index = static_cast<std::int64_t>(index);
    const std::vector<int> list(missing.begin(), missing.end());
    const std::string why = clause(err->message());
    d.message = "barrier " + quoted(name) + " (#" + std::to_string(index) + ") went on without " + rank_list(list) +
                (why.empty() ? "; look for a hang or a missing barrier() call there" : ": " + why);
  }
  const bool tracked = s.open && s.open_index == index;
  Release rel{-1, 0};
  if (tracked && missing.empty() && waiters.size() >= 2 && s.arrivals >= 2)
    rel = {s.last_arrival, s.last_arrival_us - s.prev_arrival_us};
  for (const int w : waiters)
    if (RankWatch* r = s.rank_at(w)) {
      r->parked = false;
      r->moved_us = now_us; // it starts afresh after its wait
      r->behind_since = never;
    }
  s.open = false;
  s.parked_live = 0;
  s.waiting_since = never;
  s.arrivals = 0;
  s.last_arrival = -1;
  s.note_release(rel, name, now_us);
}

void EventWatch::row(const Row& row, const std::function<std::string_view(std::uint32_t)>& key_name,
                     std::int64_t now_us) {
  State& s = *s_;
  if (!s.live) return;
  s.advance(now_us);
  s.last_activity_us = now_us;
  const std::size_t n = row.values.size();
  for (std::size_t i = 0; i < n; ++i) {
    const RowValue& v = row.values[i];
    if (!std::isfinite(v.value)) [[unlikely]]
      s.nonfinite(row, i, key_name, now_us);
    else if (!s.nonfinite_cols.empty()) [[unlikely]]
      s.nonfinite_cols.erase((std::uint64_t{v.key} << 32) | static_cast<std::uint32_t>(v.rank + 1));
    if (v.key < s.rules_of_key.size()) {
      const std::int32_t k = s.rules_of_key[v.key];
      if (k >= 0) s.apply_rules(s.keyed[static_cast<std::size_t>(k)], v, row.step, now_us);
    }
  }
}

void EventWatch::rule(std::uint32_t key, std::string_view key_name, AlertRule rule) {
  State& s = *s_;
  const bool no_change = rule.kind == AlertRule::Kind::no_change;
  if (!std::isfinite(rule.limit) || (no_change && !(rule.limit > 0))) return;
  if (rule.kind != AlertRule::Kind::above && rule.kind != AlertRule::Kind::below && !no_change) return;
  if (s.rules_of_key.size() <= key) s.rules_of_key.resize(std::size_t{key} + 1, -1);
  std::int32_t& k = s.rules_of_key[key];
  if (k < 0) {
    k = static_cast<std::int32_t>(s.keyed.size());
    s.keyed.push_back({key, std::string(key_name), {}});
  }
  KeyRules& kr = s.keyed[static_cast<std::size_t>(k)];
  for (const Rule& r : kr.rules)
    if (r.rule.kind == rule.kind && r.rule.limit == rule.limit) return;
  Rule& r = kr.rules.emplace_back();
  r.rule = rule;
  r.limit_us = no_change ? static_cast<std::int64_t>(std::llround(std::min(rule.limit, 1e12) * 1e6)) : 0;
  r.since_us = s.clock_us == never ? 0 : s.clock_us;
}

void EventWatch::run_end(RunState state, std::int64_t now_us) {
  State& s = *s_;
  // Again after the end: the end changed (a finished rank's process exited non-zero), and is told again.
  const bool again = !s.live && s.ended && *s.ended != state;
  if (!s.live && !again) return;
  s.advance(now_us);
  s.live = false;
  s.ended = state;
  EventDraft& d = s.draft(EventKind::run_finished, now_us);
  d.state = state;
  d.message = "the run ended " + std::string(to_string(state));
  if (again) {
    d.message += " after all: a rank's process exited with an error after the run's end (the event before this "
                 "one names it)";
    return;
  }
  switch (state) {
  case RunState::failed: d.message += "; the events before this one and the failed ranks' logs say why"; break;
  case RunState::crashed: d.message += "; look at the lost ranks' nodes and logs (the events before this one name them)"; break;
  case RunState::killed: d.message += "; look at who stopped it (the scheduler's limits, a user)"; break;
  default: break;
  }
}

void EventWatch::tick(std::int64_t now_us) {
  State& s = *s_;
  if (!s.live) return;
  s.advance(now_us);
  std::int64_t top = never;
  for (const RankWatch& r : s.ranks)
    if (r.live) top = std::max(top, r.step);
  if (s.set.stall_after_us > 0) s.find_stalls(top, now_us);
  s.find_laggards(now_us);
  s.find_unchanged(now_us);
  s.rises.clear();
  s.window_top = never;
  s.last_tick_us = now_us;
}

std::vector<EventDraft> EventWatch::take() {
  // Every event of a rank names where it runs, as it joined (not only those drafted about() it).
  for (EventDraft& d : s_->drafts)
    if (const RankWatch* r = s_->rank_at(d.rank)) {
      if (d.host.empty()) d.host = r->host;
      if (d.pid < 0) d.pid = r->pid;
    }
  return std::exchange(s_->drafts, {});
}

bool EventWatch::has_drafts() const noexcept { return !s_->drafts.empty(); }

} // namespace chorus::core
