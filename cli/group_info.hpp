// A group directory as `chorus ls`, `chorus show` and `chorus launch` read
// it: its group.json (io/store/group_file.hpp) and the member runs that lie there.
#pragma once

#include "cli/run_info.hpp"
#include "io/store/group_file.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace chorus::cli {

/// One run of a group: what group.json says of it, its run directory where
/// that is on this machine, or both.
struct GroupMemberView {
  std::string label; // a short column heading: "rank-2", "node-1", else the run id
  std::optional<store::GroupMember> member;
  std::optional<RunInfo> run;

  [[nodiscard]] std::string id() const;
  /// The state to show: run.json's where the run is here, else group.json's.
  [[nodiscard]] std::string state() const;
  /// Its global ranks, as "2" or "0-3" or "0,2"; "" where unknown.
  [[nodiscard]] std::string ranks() const;
  /// Its ranks' exit codes that launch recorded (run.json's, else group.json's).
  [[nodiscard]] std::map<std::int64_t, std::int64_t> exit_codes(const store::GroupManifest* g) const;
};

struct GroupInfo {
  std::string dir, project, name;
  std::optional<store::GroupManifest> manifest; // none: no group.json (or `problem`)
  Error problem;                             // why group.json could not be read
  /// group.json's members by place, then the other runs under the directory by start time.
  std::vector<GroupMemberView> members;
};

/// Reads DIR/group.json and the runs under DIR; never fails.
GroupInfo read_group(const std::string& dir);

/// Exit codes as one cell: "0" when all are 0, else "rank=code" pairs.
std::string exit_codes_cell(const std::map<std::int64_t, std::int64_t>& codes);

/// Takes a member's state, end and ranks from its run's run.json, where that
/// says more than the member's last report (the run ended after its group did,
/// or launch rebuilt it after a signal). For `chorus launch`, once the run's
/// host has exited: a run.json that still says running means it crashed.
void refresh_member(store::GroupMember& m, const RunInfo& run);

/// A member as its run.json describes it (a run of a group records its place
/// there), or nothing for a run outside any group.
std::optional<store::GroupMember> member_from_run(const RunInfo& run);

/// Adds exit codes (global rank -> code) to DIR/group.json and refreshes the
/// members whose run directories are `run_dirs` from their run.json (adding
/// those whose report never reached it). Nothing
/// is done where there is no group.json (a job of one run, or another node's
/// disk). An error where group.json cannot be read or written.
[[nodiscard]] Error record_group_exit_codes(const std::string& group_dir,
                                           const std::map<std::int64_t, std::int64_t>& codes,
                                           const std::vector<std::string>& run_dirs);

/// The group directories under `root` (ROOT/PROJECT/NAME) named `name`.
std::vector<std::string> find_group_by_name(const std::string& root, const std::string& name);

/// Whether `dir` holds a group: a group.json, or run directories.
bool is_group_dir(const std::string& dir);

/// `chorus show GROUP`: identity, the members, and their config differences,
/// summaries and final values side by side, in `width` columns; `history`
/// false leaves the members' history.jsonl unread (final values then come
/// from their summaries).
std::string render_group(const GroupInfo& g, int width, bool history);

} // namespace chorus::cli
