#include "cli/chart.hpp"

#include "cli/cli.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

// Spreads the buckets over `columns` columns by step.
std::vector<Column> columns_of(const Series& s, int columns) {
  std::vector<Column> cols(static_cast<std::size_t>(std::max(columns, 1)));
  const double x0 = static_cast<double>(s.first_step());
  const double span = static_cast<double>(s.last_step()) - x0;
  auto col = [&](std::int64_t step) {
    if (span <= 0) return std::size_t{0};
    const double at = (static_cast<double>(step) - x0) / span * static_cast<double>(cols.size() - 1);
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

} // namespace

std::string describe_points(const Series& s) {
  std::string d = std::to_string(s.points()) + (s.points() == 1 ? " point" : " points");
  if (s.points() > 0)
    d += ", steps " + std::to_string(s.first_step()) + ".." + std::to_string(s.last_step()) + ", last " +
         format_number(s.last());
  if (s.nans() > 0 || s.infs() > 0) {
    d += ", skipped ";
    if (s.nans() > 0) d += std::to_string(s.nans()) + " NaN";
    if (s.nans() > 0 && s.infs() > 0) d += " and ";
    if (s.infs() > 0) d += std::to_string(s.infs()) + " infinite";
  }
  return d;
}

std::string render_chart(const Series& s, const ChartStyle& st) {
  std::string out = s.key() + "  (" + describe_points(s) + ")\n";
  if (s.points() == 0) return out + "  (nothing to plot)\n";
  double y0 = s.min(), y1 = s.max();
  if (y1 - y0 <= std::fabs(y0) * 1e-12) { // flat: centre the line
    const double pad = y0 == 0 ? 1 : std::fabs(y0) * 0.1;
    y0 -= pad;
    y1 += pad;
  }
  const std::string top = label(s.max()), bottom = label(s.min());
  const int lw = static_cast<int>(std::max(top.size(), bottom.size()));
  const int plot_w = std::max(8, st.width - lw - 3);
  const int plot_h = std::max(2, st.height);
  const int dx = st.ascii ? 1 : 2, dy = st.ascii ? 1 : 4;
  const int dots_w = plot_w * dx, dots_h = plot_h * dy;
  const std::vector<Column> cols = columns_of(s, dots_w);

  // dots[row][col], row 0 at the bottom.
  std::vector<std::vector<bool>> dots(static_cast<std::size_t>(dots_h), std::vector<bool>(static_cast<std::size_t>(dots_w)));
  auto row_of = [&](double v) {
    const double at = (v - y0) / (y1 - y0) * (dots_h - 1);
    return static_cast<int>(std::clamp(std::lround(at), 0L, static_cast<long>(dots_h - 1)));
  };
  std::optional<double> prev;
  for (int c = 0; c < dots_w; ++c) {
    const Column& k = cols[static_cast<std::size_t>(c)];
    if (!k.any) continue;
    double lo = k.min, hi = k.max;
    if (prev) { // join to the previous column, so the line has no gaps
      lo = std::min(lo, *prev);
      hi = std::max(hi, *prev);
    }
    for (int r = row_of(lo); r <= row_of(hi); ++r) dots[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)] = true;
    prev = k.last;
  }

  const char* tick = st.ascii ? "+" : "┤";
  const char* bar = st.ascii ? "|" : "│";
  for (int line = 0; line < plot_h; ++line) {
    std::string lab;
    if (line == 0) lab = top;
    if (line == plot_h - 1) lab = bottom;
    std::string row = "  " + std::string(static_cast<std::size_t>(lw) - lab.size(), ' ') + lab;
    row += lab.empty() ? bar : tick;
    const int r_top = (plot_h - 1 - line) * dy + dy - 1; // highest dot row in this line
    for (int cell = 0; cell < plot_w; ++cell) {
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
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row + "\n";
  }
  std::string axis = "  " + std::string(static_cast<std::size_t>(lw), ' ') + (st.ascii ? "+" : "└");
  for (int i = 0; i < plot_w; ++i) axis += st.ascii ? "-" : "─";
  out += axis + "\n";
  const std::string x0 = std::to_string(s.first_step()), x1 = std::to_string(s.last_step()) + " _step";
  std::string xl = "  " + std::string(static_cast<std::size_t>(lw) + 1, ' ') + x0;
  const std::size_t end = static_cast<std::size_t>(lw) + 3 + static_cast<std::size_t>(plot_w);
  xl += std::string(end > xl.size() + x1.size() ? end - xl.size() - x1.size() : 1, ' ') + x1;
  out += xl + "\n";
  return out;
}

std::string render_sparkline(const Series& s, int width, bool ascii) {
  return render_sparkline(s, width, ascii, s.min(), s.max());
}

std::string render_sparkline(const Series& s, int width, bool ascii, double lo, double hi) {
  static constexpr const char* blocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  static constexpr char levels[] = "_.-:=+*#";
  const std::vector<Column> cols = columns_of(s, width);
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
