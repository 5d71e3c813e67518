// Group actor: one per job with several runs, on global rank 0. The hosts of
// the job's runs report to it (identity, ranks, states, the final state and
// summary); it keeps group.json in the group directory and finishes when
// every member has ended, gone silent or failed to show up.
//
// GroupLink is the member's side, held by each Run actor: the latest report,
// repeated until the Group acknowledges it.
#pragma once

#include "actors/keepalive.hpp"
#include "actors/protocol.hpp"
#include "io/store/group_file.hpp"
#include "runtime/core/options.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace chorus::core {
class Merger;
}

namespace chorus::actors {

struct GroupHost {
  std::string dir;           // the group directory
  store::GroupManifest manifest; // the group's identity, size and start; no members yet
  /// The global ranks of each place in the group, for the places whose run never reports.
  std::vector<std::vector<std::int64_t>> expected_ranks;
  /// A place whose run has not registered by then is recorded as missing.
  std::chrono::milliseconds join_timeout{30'000};
  /// How long global rank 0, on its way out, waits for the members still running.
  std::chrono::milliseconds finish_timeout{60'000};
  /// The job's secret every report must carry (actors/job_secret.hpp); "" asks none.
  std::string secret;
};

/// The group of the job `s` describes, kept by this process (global rank 0).
[[nodiscard]] GroupHost group_host(const core::Settings& s);

group_actor spawn_group_actor(caf::actor_system& sys, GroupHost host);

struct RunHost;

/// What the run `host` hosts reports: its identity, and its ranks (by global
/// rank) as `merger` has them; at the run's end, `end` and its summary.
[[nodiscard]] store::GroupMember member_report(const RunHost& host, const core::Merger& merger,
                                            std::optional<RunState> end = std::nullopt, std::string summary = "{}");

/// A member run's reports to its Group.
class GroupLink {
public:
  /// The Group's handle arrived: sends the latest report, if any, and
  /// answers `registered` once the Group has it (or is gone). A Group in
  /// another process is pinged every `interval` and counts as gone once not
  /// heard from for `limit` (actors/keepalive.hpp).
  void connect(run_self::pointer self, group_actor group, caf::response_promise registered,
               std::chrono::milliseconds interval, std::chrono::milliseconds limit);
  /// The job's secret the reports carry (actors/job_secret.hpp).
  void secret(std::string s) { secret_ = std::move(s); }
  /// Sends `m` as the run's latest state (now, or once connected).
  void report(run_self::pointer self, const store::GroupMember& m);
  void acked(std::int64_t seq);
  /// Whether `sender` is the Group this link reports to.
  [[nodiscard]] bool is(const caf::strong_actor_ptr& sender) const {
    return sender && group_ && caf::actor_cast<caf::actor_addr>(sender) == group_.address();
  }
  /// True if `dm` is about the Group: it is gone, nobody acknowledges now.
  bool down(const caf::down_msg& dm);
  /// The retry timer: the latest report again, if still unacknowledged.
  void retry(run_self::pointer self);
  /// The keepalive timer (keepalive_atom), while the run's last word is unacknowledged.
  void keepalive(run_self::pointer self);
  /// Answers `rp` once the final report is acknowledged, at once if there is
  /// no Group to wait for (none connected, or no final report to give).
  void when_settled(caf::response_promise rp);

private:
  void send(run_self::pointer self);
  /// Answers `rp` once report `seq` is acknowledged, or nobody is there to.
  void when_acked(std::int64_t seq, caf::response_promise rp);
  void answer_waiters();
  void lose();

  group_actor group_;
  std::optional<Keepalive> keepalive_; // a Group in another process
  bool lost_ = false; // the Group went away
  std::string secret_;     // the job's, which each report carries
  std::string latest_;     // the latest report
  std::int64_t seq_ = 0;   // its number
  std::int64_t acked_ = 0; // the highest acknowledged
  bool final_ = false;     // the latest report is the run's last
  bool retrying_ = false;  // a retry timer is set
  std::vector<std::pair<std::int64_t, caf::response_promise>> waiters_; // (report, who waits for its ack)
};

} // namespace chorus::actors
