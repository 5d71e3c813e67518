// A group's manifest (README, "Groups: `group.json`"): group.json in the group
// directory, `$CHORUS_DIR/<project>/<group>/group.json`. The Group actor on
// global rank 0 writes it as its member runs report; `chorus launch` adds the
// ranks' exit codes; `chorus ls` and `chorus show` read it. A member's
// report crosses the network as the same JSON object group.json keeps for
// it, so one checked reader takes both.
#pragma once

#include "runtime/core/result.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::store {

/// One rank of a member run: its global rank and how far it got.
struct GroupRank {
  std::int64_t rank = 0; // global rank
  std::string state;     // running | finished | failed | crashed | killed
  std::int64_t last_step = -1;
};

/// The largest summary a member carries into group.json; a larger one
/// stays in its run's summary.json only.
inline constexpr std::size_t max_member_summary = 1u << 20;

/// One run of a group, as its run host reports it.
struct GroupMember {
  /// Its place in the group: the global rank of a per-rank run, the node of a per-node run.
  std::int64_t index = 0;
  std::string id, name, dir, host;
  std::int64_t pid = 0;
  std::int64_t node = 0;
  /// A run state's name, or what the group saw instead: "missing" (never
  /// registered), "unknown" (no final report when the group stopped waiting).
  std::string state = "running";
  std::string message; // why it is not "finished", where known
  std::optional<double> start_time, end_time; // unix seconds
  std::int64_t rows = 0;
  std::vector<GroupRank> ranks;
  std::string summary = "{}"; // summary.json's object, as JSON text (at most max_member_summary bytes)

  /// The run has ended, one way or another: no later report changes it.
  [[nodiscard]] bool ended() const { return state != "running"; }
};

struct GroupManifest {
  std::string group, project, mode, scope, launcher, job_id;
  std::string host; // global rank 0's, which keeps the manifest
  std::int64_t size = 0; // runs the job has
  std::string state = "running"; // running | finished | killed | failed
  std::optional<double> start_time, end_time;
  std::vector<GroupMember> members; // by index
  /// Global rank -> exit code, as `chorus launch` recorded them.
  std::map<std::int64_t, std::int64_t> exit_codes;

  /// The member at `index`, or null.
  [[nodiscard]] GroupMember* member(std::int64_t index);
  [[nodiscard]] const GroupMember* member(std::int64_t index) const;
  /// The exit codes of a member's ranks that launch recorded.
  [[nodiscard]] std::map<std::int64_t, std::int64_t> exit_codes_of(const GroupMember& m) const;
  /// Sorts the members by place; the start is the earliest member's. Once
  /// every one of the `size` runs has ended: the state "finished" when all
  /// of them finished, "killed" when the others were killed, else "failed",
  /// and the end is the last member's end.
  void settle();
};

/// One member as a JSON object (its report, and its entry in group.json).
[[nodiscard]] std::string member_json(const GroupMember& m);
/// Reads a member object; Errc::invalid_argument, naming the field, for
/// anything malformed (wrong types, a summary that is not an object,
/// oversized fields).
[[nodiscard]] Result<GroupMember> parse_member(std::string_view json);

/// The whole manifest as group.json's text.
[[nodiscard]] std::string group_json(const GroupManifest& g);
/// Reads DIR/group.json. Errc::io_error if it is missing or unreadable,
/// invalid_argument if it is not a manifest.
[[nodiscard]] Result<GroupManifest> read_group_file(const std::string& group_dir);

/// Rewrites DIR/group.json (0600, atomically) while holding the group
/// directory's lock, so that the Group actor and the `chorus launch` of
/// every node of a shared filesystem never lose each other's changes.
/// `update` gets the manifest there (`exists` false: none or unreadable)
/// and returns whether to write it.
[[nodiscard]] Error update_group_file(const std::string& group_dir,
                                      const std::function<bool(GroupManifest& g, bool exists)>& update);

} // namespace chorus::store
