#include "cli/chart.hpp"

#include "cli/cli.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <vector>

namespace chorus::cli {
namespace {

// What falls into one column of dots: its range, and where the line leaves it.
struct Column {
  bool any = false;
  double min = 0, max = 0, sum = 0, last = 0;
  std::uint64_t n = 0;
};

// Spreads the buckets over `columns` columns by step, steps x0..x1 across.
std::vector<Column> columns_of(const Series& s, int columns, std::int64_t x0, std::int64_t x1) {
  std::vector<Column> cols(static_cast<std::size_t>(std::max(columns, 1)));
  const double span = static_cast<double>(x1) - static_cast<double>(x0);
  auto col = [&](std::int64_t step) {
    if (span <= 0) return std::size_t{0};
    const double at = (static_cast<double>(step) - static_cast<double>(x0)) / span * static_cast<double>(cols.size() - 1);
    return static_cast<std::size_t>(std::clamp(std::lround(at), 0L, static_cast<long>(cols.size() - 1)));
  };
  for (const Bucket& b : s.buckets()) {
    const std::size_t lo = col(b.step_lo), hi = col(b.step_hi);
    for (std::size_t c = lo; c <= hi; ++c) {
      Column& k = cols[c];
      k.min = k.any ? std::min(k.min, b.min) : b.min;
      k.max = k.any ? std::max(k.max, b.max) : b.max;
      k.any = true;
      // A bucket over several columns adds its mean to each, so each column's mean stays a mean.
      k.sum += b.sum / static_cast<double>(b.n);
      ++k.n;
      k.last = b.last;
    }
  }
  return cols;
}

std::string label(double v) {
  if (v == 0) return "0";
  char buf[32];
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.3e", v);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

void append_braille(std::string& out, unsigned bits) {
  const unsigned cp = 0x2800 + bits;
  out += static_cast<char>(0xE0 | (cp >> 12));
  out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  out += static_cast<char>(0x80 | (cp & 0x3F));
}

// What a chart spans (steps x0..x1, values lo..hi, drawn over y0..y1: a flat
// line is centred) and how it is laid out in the style's columns.
struct Frame {
  std::int64_t x0 = 0, x1 = 0;
  XAxis x = XAxis::step; // what x0 and x1 are
  double lo = 0, hi = 0, y0 = 0, y1 = 0;
  int label_w = 0, plot_w = 0, plot_h = 0;
};

// The frame of every series with points in `series` (at least one has).
Frame frame_of(std::span<const Series* const> series, const ChartStyle& st) {
  Frame f;
  bool first = true;
  for (const Series* s : series) {
    if (!s || s->points() == 0) continue;
    f.x0 = first ? s->first_step() : std::min(f.x0, s->first_step());
    f.x1 = first ? s->last_step() : std::max(f.x1, s->last_step());
    f.x = s->x_axis();
    f.lo = first ? s->min() : std::min(f.lo, s->min());
    f.hi = first ? s->max() : std::max(f.hi, s->max());
    first = false;
  }
  f.y0 = f.lo;
  f.y1 = f.hi;
  if (f.y1 - f.y0 <= std::fabs(f.y0) * 1e-12) { // flat: centre the line
    const double pad = f.y0 == 0 ? 1 : std::fabs(f.y0) * 0.1;
    f.y0 -= pad;
    f.y1 += pad;
  }
  f.label_w = static_cast<int>(std::max(label(f.hi).size(), label(f.lo).size()));
  f.plot_w = std::max(8, st.width - f.label_w - 3);
  f.plot_h = std::max(2, st.height);
  return f;
}

// Calls mark(row, column) for each dot of the series' line on a grid of
// `w` by `h` dots (row 0 at the bottom), each column joined to the previous
// one, so that the line has no gaps.
template <class Mark>
void trace(const Series& s, const Frame& f, int w, int h, Mark&& mark) {
  const std::vector<Column> cols = columns_of(s, w, f.x0, f.x1);
  auto row_of = [&](double v) {
    const double at = (v - f.y0) / (f.y1 - f.y0) * (h - 1);
    return static_cast<int>(std::clamp(std::lround(at), 0L, static_cast<long>(h - 1)));
  };
  std::optional<double> prev;
  for (int c = 0; c < w; ++c) {
    const Column& k = cols[static_cast<std::size_t>(c)];
    if (!k.any) continue;
    double lo = k.min, hi = k.max;
    if (prev) {
      lo = std::min(lo, *prev);
      hi = std::max(hi, *prev);
    }
    for (int r = row_of(lo); r <= row_of(hi); ++r) mark(r, c);
    prev = k.last;
  }
}

// The plot's lines, `cells(line)` drawing line 0 (the top) to plot_h - 1,
// with the value labels on the left, then the step axis and its labels.
std::string framed(const Frame& f, bool ascii, const std::function<std::string(int line)>& cells) {
  const std::string top = label(f.hi), bottom = label(f.lo);
  const auto lw = static_cast<std::size_t>(f.label_w);
  std::string out;
  for (int line = 0; line < f.plot_h; ++line) {
    const std::string lab = line == 0 ? top : line == f.plot_h - 1 ? bottom : std::string();
    std::string row = "  " + std::string(lw - lab.size(), ' ') + lab;
    row += lab.empty() ? (ascii ? "|" : "│") : (ascii ? "+" : "┤");
    row += cells(line);
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row + "\n";
  }
  std::string axis = "  " + std::string(lw, ' ') + (ascii ? "+" : "└");
  for (int i = 0; i < f.plot_w; ++i) axis += ascii ? "-" : "─";
  out += axis + "\n";
  const std::string x0 = x_text(f.x0, f.x), x1 = x_text(f.x1, f.x) + " " + std::string(x_unit(f.x));
  std::string xl = "  " + std::string(lw + 1, ' ') + x0;
  const std::size_t end = lw + 3 + static_cast<std::size_t>(f.plot_w);
  xl += std::string(end > xl.size() + x1.size() ? end - xl.size() - x1.size() : 1, ' ') + x1;
  return out + xl + "\n";
}

} // namespace

std::string describe_points(const Series& s) {
  std::string d = std::to_string(s.points()) + (s.points() == 1 ? " point" : " points");
  if (s.points() > 0)
    d += (s.x_axis() == XAxis::step ? ", steps " : ", ") + x_text(s.first_step(), s.x_axis()) + ".." +
         x_text(s.last_step(), s.x_axis()) + (s.x_axis() == XAxis::step ? "" : " into the run") + ", last " +
         format_number(s.last());
  if (s.nans() > 0 || s.infs() > 0) {
    d += ", skipped ";
    if (s.nans() > 0) d += std::to_string(s.nans()) + " NaN";
    if (s.nans() > 0 && s.infs() > 0) d += " and ";
    if (s.infs() > 0) d += std::to_string(s.infs()) + " infinite";
  }
  return d;
}

std::string render_chart(const Series& s, const ChartStyle& st, std::string_view note) {
  std::string out = s.key() + "  (" + describe_points(s) + ")\n";
  if (!note.empty()) out.append("  ").append(clip(std::string(note), st.width - 2)).append("\n");
  if (s.points() == 0) return out + "  (nothing to plot)\n";
  const Series* const one[] = {&s};
  const Frame f = frame_of(one, st);
  // Braille: 2 by 4 dots a character; ASCII: one.
  const int dx = st.ascii ? 1 : 2, dy = st.ascii ? 1 : 4;
  std::vector<std::vector<bool>> dots(static_cast<std::size_t>(f.plot_h * dy),
                                      std::vector<bool>(static_cast<std::size_t>(f.plot_w * dx)));
  trace(s, f, f.plot_w * dx, f.plot_h * dy,
        [&](int r, int c) { dots[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)] = true; });
  return out + framed(f, st.ascii, [&](int line) {
           const int r_top = (f.plot_h - 1 - line) * dy + dy - 1; // highest dot row in this line
           std::string row;
           for (int cell = 0; cell < f.plot_w; ++cell) {
             if (st.ascii) {
               row += dots[static_cast<std::size_t>(r_top)][static_cast<std::size_t>(cell)] ? '*' : ' ';
               continue;
             }
             static constexpr unsigned bit[4][2] = {{0x01, 0x08}, {0x02, 0x10}, {0x04, 0x20}, {0x40, 0x80}};
             unsigned bits = 0;
             for (int i = 0; i < 4; ++i)
               for (int j = 0; j < 2; ++j)
                 if (dots[static_cast<std::size_t>(r_top - i)][static_cast<std::size_t>(cell * 2 + j)]) bits |= bit[i][j];
             if (bits == 0)
               row += ' ';
             else
               append_braille(row, bits);
           }
           return row;
         });
}

char overlay_marker(std::size_t i) { return "*o+x#@%&"[i % max_overlay]; }

std::string render_overlay(const std::string& key, std::span<const Series* const> runs,
                           std::span<const std::string> names, const ChartStyle& st, std::string_view note) {
  const auto logged = static_cast<std::size_t>(std::count_if(runs.begin(), runs.end(), [](const Series* s) { return s; }));
  std::string out = key + "  (" + std::to_string(logged) + " of " + std::to_string(runs.size()) + " runs)\n";
  if (!note.empty()) out.append("  ").append(clip(std::string(note), st.width - 2)).append("\n");
  const bool any = std::any_of(runs.begin(), runs.end(), [](const Series* s) { return s && s->points() > 0; });
  if (!any) {
    out += "  (nothing to plot)\n";
  } else {
    // One character a cell, each run its marker: a later run's covers an earlier one's where they meet.
    const Frame f = frame_of(runs, st);
    std::vector<std::string> grid(static_cast<std::size_t>(f.plot_h), std::string(static_cast<std::size_t>(f.plot_w), ' '));
    for (std::size_t i = 0; i < runs.size(); ++i)
      if (runs[i])
        trace(*runs[i], f, f.plot_w, f.plot_h, [&](int r, int c) {
          grid[static_cast<std::size_t>(f.plot_h - 1 - r)][static_cast<std::size_t>(c)] = overlay_marker(i);
        });
    out += framed(f, st.ascii, [&](int line) { return grid[static_cast<std::size_t>(line)]; });
  }
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::string line = "  " + std::string(1, overlay_marker(i)) + " " + (i < names.size() ? names[i] : std::string());
    line += "  " + (runs[i] ? describe_points(*runs[i]) : std::string("(not logged)"));
    out += clip(line, st.width) + "\n";
  }
  return out;
}

std::string render_sparkline(const Series& s, int width, bool ascii) {
  return render_sparkline(s, width, ascii, s.min(), s.max());
}

std::string render_sparkline(const Series& s, int width, bool ascii, double lo, double hi) {
  static constexpr const char* blocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  static constexpr char levels[] = "_.-:=+*#";
  const std::vector<Column> cols = columns_of(s, width, s.first_step(), s.last_step());
  const double span = hi - lo;
  std::string out;
  for (const Column& k : cols) {
    if (!k.any) {
      out += ' ';
      continue;
    }
    const double mean = k.sum / static_cast<double>(k.n);
    const int level = span > 0 ? static_cast<int>(std::clamp(std::lround((mean - lo) / span * 7), 0L, 7L)) : 3;
    if (ascii)
      out += levels[level];
    else
      out += blocks[level];
  }
  return out;
}

} // namespace chorus::cli
