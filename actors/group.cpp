#include "actors/group.hpp"

#include "actors/job_secret.hpp"
#include "actors/run.hpp"
#include "io/platform/posix.hpp"
#include "runtime/core/merger.hpp"

#include <cstdio>
#include <filesystem>
#include <map>
#include <utility>
#include <unistd.h>

namespace chorus::actors {

using platform::unix_now_us;

namespace {

constexpr auto write_interval = std::chrono::milliseconds(500);
constexpr auto retry_interval = std::chrono::milliseconds(250);

double now_s() { return static_cast<double>(unix_now_us()) / 1e6; }

struct GroupState {
  GroupHost host;
  std::map<caf::actor_addr, std::int64_t> index_of; // a member run's actor -> its place
  std::map<std::int64_t, std::int64_t> seq_of;      // the latest report taken, per place
  bool refused_secret = false;                      // a report without the job's secret was refused (said once)
  bool dirty = false;       // group.json lags behind
  bool write_armed = false; // a write timer is set
  bool done = false;        // every member has ended; group.json says so
  bool warned = false;
  std::vector<caf::response_promise> finish_waiters;
  static inline const char* name = "chorus.group";

  /// Writes group.json, keeping what `chorus launch` put there: the exit
  /// codes, a run it marked killed (its host died of the signal it passed
  /// on), and a run it filled in from its run.json where no report of that
  /// run reached the group.
  void write() {
    store::GroupManifest& mine = host.manifest;
    Error e = store::update_group_file(host.dir, [&](store::GroupManifest& there, bool exists) {
      if (exists) {
        for (const auto& [rank, code] : there.exit_codes) mine.exit_codes.insert_or_assign(rank, code);
        for (const store::GroupMember& t : there.members) {
          store::GroupMember* m = mine.member(t.index);
          const bool killed = m != nullptr && t.state == "killed" && m->id == t.id && m->state != "finished";
          const bool filled_in = t.state != "missing" && !t.id.empty() && (m == nullptr || m->state == "missing");
          if (m != nullptr && (killed || filled_in))
            *m = t;
          else if (m == nullptr && filled_in && t.index < mine.size)
            mine.members.push_back(t);
        }
      }
      mine.settle();
      there = mine;
      return true;
    });
    dirty = false;
    if (e && !warned) {
      warned = true;
      std::fprintf(stderr, "chorus: cannot write the group's manifest: %s\n", e.message().c_str());
    }
  }

  ~GroupState() {
    if (dirty) write();
  }
};

using group_ptr = group_self::stateful_pointer<GroupState>;

void mark_dirty(group_ptr self) {
  auto& st = self->state;
  st.dirty = true;
  if (st.write_armed) return;
  st.write_armed = true;
  self->delayed_send(self, write_interval, flush_atom::value);
}

/// Once every place has a run that ended (or is recorded missing): writes
/// the final manifest and answers whoever waits for the group to finish.
void check_done(group_ptr self) {
  auto& st = self->state;
  store::GroupManifest& g = st.host.manifest;
  g.settle();
  if (st.done || g.state == "running") return;
  st.done = true;
  st.write();
  for (auto& rp : st.finish_waiters) rp.deliver(caf::ok_atom::value);
  st.finish_waiters.clear();
}

/// Records a run for each place that none has reported for.
void record_missing(group_ptr self, std::string_view why) {
  auto& st = self->state;
  store::GroupManifest& g = st.host.manifest;
  for (std::int64_t i = 0; i < g.size; ++i) {
    if (g.member(i) != nullptr) continue;
    store::GroupMember m;
    m.index = i;
    m.state = "missing";
    m.message = std::string(why);
    if (static_cast<std::size_t>(i) < st.host.expected_ranks.size())
      for (std::int64_t r : st.host.expected_ranks[static_cast<std::size_t>(i)]) m.ranks.push_back({r, "missing", -1});
    g.members.push_back(std::move(m));
  }
  mark_dirty(self);
}

/// A member that can no longer report: what it last said, ended as `state`.
void end_member(store::GroupMember& m, std::string_view state, std::string message) {
  m.state = std::string(state);
  m.message = std::move(message);
  if (!m.end_time) m.end_time = now_s();
  for (store::GroupRank& r : m.ranks)
    if (r.state == "running") r.state = std::string(state);
}

group_self::behavior_type group_actor_fn(group_ptr self, GroupHost host) {
  auto& st = self->state;
  st.host = std::move(host);
  st.write();
  self->delayed_send(self, st.host.join_timeout, join_tmo_atom::value);

  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.index_of.find(dm.source);
    if (it == st.index_of.end()) return;
    store::GroupMember* m = st.host.manifest.member(it->second);
    st.index_of.erase(it);
    if (m == nullptr || m->ended()) return;
    end_member(*m, "crashed",
               "its run host exited or its connection was lost (" + caf::to_string(dm.reason) + ") before the run ended");
    mark_dirty(self);
    check_done(self);
  });

  return {
      [self](member_atom, std::int64_t seq, const std::string& json, const caf::actor& named, const std::string& secret) {
        auto& st = self->state;
        // A report comes from the run it describes; one whose sender CAF lost is repeated until acknowledged.
        caf::actor run = caf::actor_cast<caf::actor>(self->current_sender());
        if (!run || run != named) return;
        // Only the job's own run hosts take places in its group: another process is not answered.
        if (!same_secret(secret, st.host.secret)) {
          if (!std::exchange(st.refused_secret, true))
            std::fprintf(stderr, "chorus: the group refused a report without the job's secret (from actor %s): only "
                                 "the job's own run hosts take places in it; a run of the job sees another secret "
                                 "where CHORUS_JOB_SECRET or CHORUS_SOCKET_DIR differ between its processes (said "
                                 "once)\n",
                         caf::to_string(run.address()).c_str());
          return;
        }
        store::GroupManifest& g = st.host.manifest;
        Result<store::GroupMember> parsed = store::parse_member(json);
        self->send(caf::actor_cast<member_actor>(run), member_ok_atom::value, seq); // a refused report is not repeated
        if (!parsed || parsed->index >= g.size) {
          std::fprintf(stderr, "chorus: the group refused a member's report: %s\n",
                       parsed ? "its place is outside the group" : parsed.error().message().c_str());
          return;
        }
        store::GroupMember& m = *parsed;
        store::GroupMember* there = g.member(m.index);
        if (there != nullptr && there->state != "missing" && there->id != m.id) {
          std::fprintf(stderr, "chorus: runs %s and %s both claim place %lld of group %s: the second is left out "
                               "(two jobs share the group and its port?)\n",
                       there->id.c_str(), m.id.c_str(), static_cast<long long>(m.index), g.group.c_str());
          return;
        }
        auto& last = st.seq_of[m.index];
        if (there != nullptr && there->state != "missing" && (seq <= last || there->ended())) return;
        last = seq;
        if (m.ended() && !m.end_time) m.end_time = now_s();
        // A run's arrival and its end are written at once (its process may
        // be stopped any moment); what happens in between, within write_interval.
        const bool now = there == nullptr || there->state == "missing" || m.ended();
        if (there == nullptr) {
          g.members.push_back(std::move(m));
          there = &g.members.back();
        } else {
          *there = std::move(m);
        }
        if (run && !st.index_of.contains(run.address())) {
          st.index_of[run.address()] = there->index;
          self->monitor(run);
        }
        if (now)
          st.write();
        else
          mark_dirty(self);
        check_done(self);
      },
      [self](join_tmo_atom) {
        auto& st = self->state;
        if (!from_self(self) || st.done) return;
        record_missing(self, "never registered with the group within init_timeout: its run host did not start, or "
                             "could not reach global rank 0 (across nodes that takes CHORUS_TLS_DIR or "
                             "CHORUS_INSECURE=1)");
        check_done(self);
      },
      [self](flush_atom) {
        auto& st = self->state;
        if (!from_self(self)) return;
        st.write_armed = false;
        if (st.dirty) st.write();
      },
      [](ping_atom) { return caf::ok_atom::value; },
      [self](finish_atom) -> caf::delegated<caf::ok_atom> {
        auto& st = self->state;
        // Global rank 0's own System, as it exits.
        if (!from_this_process(self)) return drop_request<caf::ok_atom>(self);
        auto rp = self->make_response_promise();
        if (st.done) {
          rp.deliver(caf::ok_atom::value);
          return {};
        }
        st.finish_waiters.push_back(std::move(rp));
        self->delayed_send(self, st.host.finish_timeout, finish_tmo_atom::value);
        return {};
      },
      [self](finish_tmo_atom) {
        auto& st = self->state;
        if (!from_self(self) || st.done) return;
        for (store::GroupMember& m : st.host.manifest.members)
          if (!m.ended())
            end_member(m, "unknown",
                       "no final report: still running when global rank 0 stopped waiting for it (finish_timeout); "
                       "its run.json has its state");
        record_missing(self, "never registered with the group");
        check_done(self);
      },
  };
}

} // namespace

GroupHost group_host(const core::Settings& s) {
  GroupHost g;
  g.dir = (std::filesystem::path(s.opts.dir) / s.opts.project / s.opts.group).string();
  store::GroupManifest& m = g.manifest;
  m.group = s.opts.group;
  m.project = s.opts.project;
  m.mode = to_string(s.opts.mode);
  m.scope = to_string(s.opts.scope);
  m.launcher = s.topo.launcher;
  m.job_id = s.topo.job_id;
  m.host = platform::this_host();
  m.size = s.group_size;
  m.start_time = now_s();
  // The ranks of each place: a per-rank run's own; a node's (the logging one
  // only, in automatic mode), ranks filling nodes in order.
  const int per_node = s.topo.local_world_size;
  for (int i = 0; i < s.group_size; ++i) {
    auto& ranks = g.expected_ranks.emplace_back();
    if (s.opts.mode == Mode::per_rank)
      ranks.push_back(i);
    else
      for (int r = 0; r < (s.opts.mode == Mode::shared ? per_node : 1); ++r) ranks.push_back(i * per_node + r);
  }
  // Members dial until their init_timeout runs out.
  g.join_timeout = s.opts.init_timeout + std::chrono::seconds(2);
  g.finish_timeout = s.opts.finish_timeout;
  return g;
}

group_actor spawn_group_actor(caf::actor_system& sys, GroupHost host) {
  // Scheduled, not detached, for the reason given at the Beacon
  // (actors/keepalive.hpp): it talks to the runs of other processes.
  return spawn_guarded(sys, group_actor_fn, std::move(host));
}

store::GroupMember member_report(const RunHost& host, const core::Merger& merger, std::optional<RunState> end,
                              std::string summary) {
  const core::Settings& s = host.settings;
  store::GroupMember m;
  m.index = s.group_index;
  m.id = host.run_id;
  m.name = s.run_name.empty() ? host.run_id : s.run_name;
  m.dir = host.run_dir;
  m.host = platform::this_host();
  m.pid = ::getpid();
  m.node = s.topo.node_rank;
  m.start_time = static_cast<double>(host.start_us) / 1e6;
  m.rows = static_cast<std::int64_t>(merger.rows_committed());
  // A run's places are its host's rank and those after it (a node's ranks fill it in order).
  for (int place = 0; place < merger.world_size(); ++place)
    m.ranks.push_back({s.topo.rank + place, std::string(to_string(merger.rank_state(place))), merger.rank_last_step(place)});
  if (end) {
    m.state = to_string(*end);
    m.end_time = now_s();
    if (summary.size() <= store::max_member_summary) m.summary = std::move(summary); // else only in summary.json
    if (*end != RunState::finished) {
      int down = 0;
      for (const store::GroupRank& r : m.ranks) down += r.state != "finished";
      m.message = std::to_string(down) + (down == 1 ? " rank" : " ranks") + " did not finish (see run.json)";
    }
  }
  return m;
}

// ---------------------------------------------------------------------------
// GroupLink

void GroupLink::connect(run_self::pointer self, group_actor group, caf::response_promise registered,
                        std::chrono::milliseconds interval, std::chrono::milliseconds limit) {
  if (!group_ && group) {
    group_ = std::move(group);
    self->monitor(group_);
    if (!latest_.empty()) send(self);
    if (is_remote(self, group_)) {
      keepalive_.emplace(interval, limit);
      self->send(self, keepalive_atom::value);
    }
  }
  when_acked(seq_, std::move(registered));
}

void GroupLink::report(run_self::pointer self, const store::GroupMember& m) {
  if (final_) return; // the run's last word is said
  latest_ = store::member_json(m);
  ++seq_;
  final_ = m.ended();
  if (group_ && !lost_) send(self);
}

void GroupLink::acked(std::int64_t seq) {
  acked_ = std::max(acked_, seq);
  if (keepalive_) keepalive_->heard();
  answer_waiters();
}

bool GroupLink::down(const caf::down_msg& dm) {
  if (!group_ || dm.source != group_.address()) return false;
  lose();
  return true;
}

void GroupLink::keepalive(run_self::pointer self) {
  if (!keepalive_ || lost_ || (final_ && acked_ >= seq_)) return;
  if (!keepalive_->tick(self, group_)) lose();
}

void GroupLink::lose() {
  lost_ = true;
  answer_waiters();
}

void GroupLink::retry(run_self::pointer self) {
  retrying_ = false;
  if (group_ && !lost_ && acked_ < seq_) send(self);
}

void GroupLink::when_settled(caf::response_promise rp) {
  // Without a final report there is nothing to wait for.
  when_acked(final_ ? seq_ : 0, std::move(rp));
}

void GroupLink::send(run_self::pointer self) {
  self->send(group_, member_atom::value, seq_, latest_, caf::actor_cast<caf::actor>(self), secret_);
  if (retrying_) return;
  retrying_ = true;
  self->delayed_send(self, retry_interval, member_retry_atom::value);
}

void GroupLink::when_acked(std::int64_t seq, caf::response_promise rp) {
  waiters_.emplace_back(seq, std::move(rp));
  answer_waiters();
}

void GroupLink::answer_waiters() {
  std::erase_if(waiters_, [&](auto& w) {
    if (group_ && !lost_ && w.first > acked_) return false;
    w.second.deliver(caf::ok_atom::value);
    return true;
  });
}

} // namespace chorus::actors
