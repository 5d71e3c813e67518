#include "cli/histogram_section.hpp"

#include "cli/chart.hpp"
#include "cli/cli.hpp"
#include "cli/histogram_lines.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

namespace chorus::cli {
namespace {

/// One column's histograms over the steps: how many, the last one, and its
/// median and 5th to 95th percentile spread as series (downsampled as read).
struct Column {
  explicit Column(const std::string& name) : p50(name), spread(name) {}
  std::uint64_t steps = 0;
  std::int64_t last_step = 0;
  Histogram last;
  Series p50, spread;
};

/// A figure of a histogram: "-" where it has none (no finite value).
std::string figure(double v) { return std::isnan(v) ? "-" : format_number(v); }

/// The histogram's count, and of it the values that are NaN or infinite.
std::string count_cell(const Histogram& h) {
  std::string apart;
  const auto add = [&apart](std::uint64_t n, std::string_view what) {
    if (n > 0) apart.append(apart.empty() ? " (" : ", ").append(std::to_string(n)).append(what);
  };
  add(h.nan_count(), " NaN");
  add(h.pos_inf_count(), " inf");
  add(h.neg_inf_count(), " -inf");
  return std::to_string(h.count()) + (apart.empty() ? apart : apart + ")");
}

} // namespace

std::string histogram_section(const RunInfo& r, const KeyFilter& wanted, int width, bool ascii) {
  const std::string path = r.dir + "/histograms.jsonl";
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return {};
  std::vector<Column> columns; // in the order they first appear
  std::map<std::string, std::ptrdiff_t, std::less<>> index; // -1: not wanted
  std::uint64_t kept = 0;
  const store::JsonLines lines = read_histogram_lines(path, [&](store::HistogramLine& h) {
    const std::string name = h.column();
    auto it = index.find(name);
    if (it == index.end()) {
      const bool keep = !wanted || wanted(name);
      it = index.emplace(name, keep ? static_cast<std::ptrdiff_t>(columns.size()) : -1).first;
      if (keep) columns.emplace_back(name);
    }
    if (it->second < 0) return;
    Column& c = columns[static_cast<std::size_t>(it->second)];
    ++kept;
    ++c.steps;
    c.last_step = h.step;
    c.p50.add(h.step, h.value.quantile(0.5));
    c.spread.add(h.step, h.value.quantile(0.95) - h.value.quantile(0.05));
    c.last = std::move(h.value);
  });
  if (lines.problem) return "histograms\n  unreadable: " + lines.problem.message() + "\n";
  if (columns.empty() && lines.skipped == 0) return {};
  std::string out = "histograms (" + std::to_string(columns.size()) + (columns.size() == 1 ? " column, " : " columns, ") +
                    std::to_string(kept) + (kept == 1 ? " line)\n" : " lines)\n");
  if (lines.skipped > 0)
    out += clip("  " + std::to_string(lines.skipped) + " unreadable lines skipped (first: line " +
                    std::to_string(lines.first_skipped_line) + ": " + lines.first_skipped_why + ")",
                width) + "\n";
  if (columns.empty()) return out;
  Table t;
  t.add({"COLUMN", "STEPS", "LAST STEP", "COUNT", "MIN", "P50", "MAX", "P50 OVER STEPS", "P5-P95 SPREAD"});
  const int spark_w = std::clamp(width / 6, 8, 40);
  // As many characters as points, up to spark_w; "-" for fewer than two.
  const auto spark = [&](const Series& s, double lo, double hi) {
    const int w = static_cast<int>(std::min<std::uint64_t>(static_cast<std::uint64_t>(spark_w), s.points()));
    return s.points() < 2 ? std::string("-") : render_sparkline(s, w, ascii, lo, hi);
  };
  for (const Column& c : columns)
    t.add({c.p50.key(), std::to_string(c.steps), std::to_string(c.last_step), count_cell(c.last), figure(c.last.min()),
           figure(c.last.quantile(0.5)), figure(c.last.max()), spark(c.p50, c.p50.min(), c.p50.max()),
           // The spread from 0, so that a narrow one reads low (and none at all, at the bottom).
           spark(c.spread, 0, c.spread.max() > 0 ? c.spread.max() : 1)});
  for (const std::string& line : split_lines(t.render("  "))) out += clip(line, width) + "\n";
  return out;
}

} // namespace chorus::cli
