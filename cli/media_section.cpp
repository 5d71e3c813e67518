#include "cli/media_section.hpp"

#include "cli/cli.hpp"
#include "cli/histogram_lines.hpp"

#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace chorus::cli {
namespace {

/// One rank's files of one key.
struct Files {
  std::string kind;
  std::uint64_t files = 0, bytes = 0;
  std::int64_t first_step = 0, last_step = 0;
  std::string last_path;
};

/// "3" or "0..120" (the steps go up in the file).
std::string steps_cell(const Files& f) {
  return f.first_step == f.last_step ? std::to_string(f.first_step)
                                     : std::to_string(f.first_step) + ".." + std::to_string(f.last_step);
}

} // namespace

std::string media_section(const RunInfo& r, const KeyFilter& wanted, int width) {
  const std::string path = r.dir + "/media.jsonl";
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return {};
  // Keys in the order they first appear, each its ranks' files.
  std::vector<std::pair<std::string, std::map<int, Files>>> keys;
  std::map<std::string, std::size_t, std::less<>> index;
  const store::JsonLines lines = read_media_lines(path, [&](const store::MediaLine& m) {
    auto it = index.find(m.key);
    if (it == index.end()) {
      it = index.emplace(std::string(m.key), keys.size()).first;
      keys.emplace_back(std::string(m.key), std::map<int, Files>{});
    }
    Files& f = keys[it->second].second[m.rank];
    if (f.files++ == 0) f.first_step = m.step, f.kind = m.kind;
    f.bytes += m.size;
    f.last_step = m.step;
    f.last_path = m.path;
  });
  if (lines.problem) return "media\n  unreadable: " + lines.problem.message() + "\n";
  Table t;
  t.add({"MEDIA", "KIND", "FILES", "STEPS", "SIZE", "LAST FILE"});
  std::uint64_t files = 0, bytes = 0;
  std::size_t columns = 0;
  for (const auto& [key, ranks] : keys)
    for (const auto& [rank, f] : ranks) {
      // A key one rank logs reads under its plain name, as its histograms and scalars do.
      std::string column = ranks.size() == 1 ? key : key + "/rank-" + std::to_string(rank);
      if (wanted && !wanted(column)) continue;
      ++columns, files += f.files, bytes += f.bytes;
      t.add({std::move(column), f.kind, std::to_string(f.files), steps_cell(f), format_bytes(f.bytes), f.last_path});
    }
  if (columns == 0 && lines.skipped == 0) return {};
  std::string out = "media (" + std::to_string(columns) + (columns == 1 ? " column, " : " columns, ") +
                    std::to_string(files) + (files == 1 ? " file, " : " files, ") + format_bytes(bytes) +
                    ", under " + r.dir + "/)\n";
  if (lines.skipped > 0)
    out += clip("  " + std::to_string(lines.skipped) + " unreadable lines skipped (first: line " +
                    std::to_string(lines.first_skipped_line) + ": " + lines.first_skipped_why + ")",
                width) + "\n";
  if (columns == 0) return out;
  for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
  return out;
}

} // namespace chorus::cli
