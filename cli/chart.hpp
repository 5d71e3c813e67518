// Terminal charts of a series: a line chart with labelled axes, drawn with
// Unicode braille dots (2x4 per character) or ASCII, and a one-line sparkline.
#pragma once

#include "cli/series.hpp"

#include <span>
#include <string>
#include <string_view>

namespace chorus::cli {

struct ChartStyle {
  int width = 80;  // columns in all, labels included
  int height = 10; // rows of the plot area
  bool ascii = false;
};

/// The chart's heading line, `note` (a line under it, where not empty: what
/// its x stands for, say), plot and x axis; every line ends in '\n'.
std::string render_chart(const Series& s, const ChartStyle& style, std::string_view note = {});

/// Runs one chart holds at most: each gets a marker of its own.
inline constexpr std::size_t max_overlay = 8;

/// The marker of the i-th run in an overlay ('*', 'o', '+', ...).
char overlay_marker(std::size_t i);

/// One chart of `key` over several runs, a series each (null: the run did
/// not log it), drawn with the runs' markers, and a legend line per run
/// naming it (`names`) with its points; `note` as render_chart's.
std::string render_overlay(const std::string& key, std::span<const Series* const> runs,
                           std::span<const std::string> names, const ChartStyle& style, std::string_view note = {});

/// `width` characters, one level per column (`▁`..`█`, or `_.-:=+*#` in ASCII),
/// from the series' min to its max, or from `lo` to `hi` (a percentage: 0 to 100).
std::string render_sparkline(const Series& s, int width, bool ascii);
std::string render_sparkline(const Series& s, int width, bool ascii, double lo, double hi);

/// "1000 points, steps 0..999, 3 NaN and 1 infinite skipped".
std::string describe_points(const Series& s);

} // namespace chorus::cli
