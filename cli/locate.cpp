// What a command's RUN|GROUP argument names: see cli/locate.hpp.
#include "cli/locate.hpp"
#include "cli/cli.hpp"
#include "cli/group_info.hpp"
#include "cli/run_info.hpp"

#include <filesystem>

namespace chorus::cli {
namespace fs = std::filesystem;
namespace {

/// A name under `root` that is a group's and no run's (exactly): the group's
/// directory; "" where it names no group.
Result<std::string> group_named(const std::string& name, const std::string& root) {
  if (name.find('/') != std::string::npos) return std::string();
  const std::vector<std::string> groups = find_group_by_name(root, name);
  if (groups.empty()) return std::string();
  for (const std::string& d : find_run_by_id(root, name))
    if (fs::path(d).filename() == name) return std::string();
  if (groups.size() == 1) return groups.front();
  std::string list = "'" + name + "' names " + std::to_string(groups.size()) + " groups; pass one's directory:";
  for (const std::string& g : groups) list += "\n  " + g;
  return invalid(std::move(list));
}

} // namespace

Result<Located> locate(const std::string& arg, const std::string& dir_option) {
  std::error_code ec;
  if (fs::is_regular_file(arg, ec) && fs::path(arg).filename() == "run.json")
    return Located{.run = fs::path(arg).parent_path().string(), .group = {}};
  if (fs::is_directory(arg, ec)) {
    if (is_run_dir(arg)) return Located{.run = arg, .group = {}};
    if (is_group_dir(arg)) return Located{.run = {}, .group = arg};
    return invalid(arg + " is not a run directory (no run.json, no wal): pass a run's directory or id");
  }
  const std::string root = dir_option.empty() ? default_runs_dir() : dir_option;
  Result<std::string> group = group_named(arg, root);
  if (!group) return group.error();
  if (!group->empty()) return Located{.run = {}, .group = std::move(*group)};
  Result<std::string> run = locate_run(arg, root);
  if (!run) return run.error();
  return Located{.run = std::move(*run), .group = {}};
}


} // namespace chorus::cli
