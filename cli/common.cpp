#include "cli/cli.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace chorus::cli {
namespace {

std::string prefix(std::string_view command) {
  std::string p = "chorus";
  if (!command.empty()) {
    p += ' ';
    p += command;
  }
  return p;
}

} // namespace

bool ArgCursor::flag(std::initializer_list<std::string_view> names) {
  if (done()) return false;
  for (std::string_view n : names)
    if (peek() == n) {
      next();
      return true;
    }
  return false;
}

bool ArgCursor::option(std::initializer_list<std::string_view> names, std::string& value) {
  if (done()) return false;
  const std::string_view w = peek();
  for (std::string_view n : names) {
    if (w == n) {
      next();
      if (done()) {
        fail(std::string(n) + " needs a value");
        return true;
      }
      value = peek();
      next();
      return true;
    }
    if (w.size() > n.size() && w.starts_with(n)) {
      const bool is_long = n.starts_with("--");
      if (is_long && w[n.size()] == '=') {
        value = w.substr(n.size() + 1);
        next();
        return true;
      }
      if (!is_long) { // -n4
        value = w.substr(n.size());
        next();
        return true;
      }
    }
  }
  return false;
}

void ArgCursor::integer(std::string_view opt, const std::string& value, std::int64_t lo, std::int64_t hi, int& out) {
  if (auto n = parse_int(value, lo, hi))
    out = static_cast<int>(*n);
  else
    fail(std::string(opt) + " takes a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) +
         ", not '" + value + "'");
}

void ArgCursor::operand(std::string& slot, std::string_view what) {
  const std::string word(peek());
  if (word.starts_with("-") && word != "-")
    fail("unknown option '" + word + "'");
  else if (!slot.empty())
    fail("one " + std::string(what) + " at a time, not '" + slot + "' and '" + word + "'");
  else
    slot = word;
  next();
}

void ArgCursor::smoothing(const std::string& value, double& out) {
  const std::optional<double> w = parse_double(value);
  if (w && *w >= 0 && *w < 1)
    out = *w;
  else
    fail("--smooth takes a weight from 0 (none) to below 1, as TensorBoard's slider (0.6 smooths some, 0.95 much), "
         "not '" + value + "'");
}

int usage_error(std::string_view command, std::string_view message) {
  const std::string p = prefix(command);
  std::fprintf(stderr, "%s: %.*s\nRun '%s --help' for usage.\n", p.c_str(), static_cast<int>(message.size()),
               message.data(), p.c_str());
  return exit_usage;
}

int failure(std::string_view command, std::string_view message) {
  std::fprintf(stderr, "%s: %.*s\n", prefix(command).c_str(), static_cast<int>(message.size()), message.data());
  return exit_failure;
}

std::optional<std::int64_t> parse_int(std::string_view s, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

std::optional<double> parse_double(std::string_view s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string format_time(double unix_s) {
  // Past 2^62 seconds no calendar holds it, and the cast below would overflow.
  if (!std::isfinite(unix_s) || unix_s <= 0 || unix_s >= 0x1p62) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  if (::localtime_r(&t, &tm) == nullptr) return "-";
  char buf[32];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return std::string(buf, n);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0 || s >= 0x1p62) return "-"; // beyond 2^62 s the casts below would overflow
  char buf[48];
  if (s < 1) {
    std::snprintf(buf, sizeof buf, "%.0fms", s * 1e3);
  } else if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    const auto t = static_cast<long long>(s);
    std::snprintf(buf, sizeof buf, "%lldm %02llds", t / 60, t % 60);
  } else if (s < 86400) {
    const auto t = static_cast<long long>(s);
    std::snprintf(buf, sizeof buf, "%lldh %02lldm", t / 3600, t / 60 % 60);
  } else {
    const auto t = static_cast<long long>(s);
    std::snprintf(buf, sizeof buf, "%lldd %02lldh", t / 86400, t / 3600 % 24);
  }
  return buf;
}

std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[40];
  if (v == std::trunc(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string format_bytes(std::uint64_t n) {
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return std::to_string(n) + " B";
  double v = static_cast<double>(n) / 1024;
  std::size_t k = 0;
  for (; k + 1 < std::size(units) && v >= 1024; ++k) v /= 1024;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*f %s", v < 99.95 ? 1 : 0, v, units[k]);
  return buf;
}

std::string default_runs_dir() {
  const char* d = std::getenv("CHORUS_DIR");
  return d != nullptr && *d != '\0' ? std::string(d) : std::string("./chorus-runs");
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    out.push_back(text.substr(start, nl - start));
  if (start < text.size()) out.push_back(text.substr(start));
  return out;
}

std::size_t display_width(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string clip(std::string s, int width) {
  if (static_cast<int>(display_width(s)) <= width) return s;
  std::size_t keep = 0, cols = 0;
  while (keep < s.size() && static_cast<int>(cols) < width - 1) {
    ++keep;
    while (keep < s.size() && (static_cast<unsigned char>(s[keep]) & 0xC0) == 0x80) ++keep;
    ++cols;
  }
  s.resize(keep);
  s.append("…");
  return s;
}

std::string Table::render(std::string_view indent) const {
  std::vector<std::size_t> widths;
  for (const auto& row : rows_)
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (widths.size() <= i) widths.push_back(0);
      widths[i] = std::max(widths[i], display_width(row[i]));
    }
  std::string out;
  for (const auto& row : rows_) {
    std::string line(indent);
    for (std::size_t i = 0; i < row.size(); ++i) {
      // Cells come from files: a newline or an escape sequence in one must not wreck the screen.
      for (char ch : row[i]) line += static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f ? ' ' : ch;
      if (i + 1 < row.size()) line.append(widths[i] - display_width(row[i]) + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  }
  return out;
}

} // namespace chorus::cli
