#include "io/platform/procfs.hpp"

#include "io/platform/posix.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace chorus::platform {
namespace {

// Big enough for /proc/stat of a few hundred CPUs, so that buffers grow
// (allocate) only on machines larger than that.
constexpr std::size_t host_buffer = 16 * 1024;
constexpr std::size_t process_buffer = 4 * 1024;
constexpr std::uint64_t sector_bytes = 512;

// The next complete line of `rest`, without its '\n'; nullopt when what is
// left has no '\n' (the end of a truncated text).
std::optional<std::string_view> take_line(std::string_view& rest) {
  const auto nl = rest.find('\n');
  if (nl == std::string_view::npos) return std::nullopt;
  const auto line = rest.substr(0, nl);
  rest.remove_prefix(nl + 1);
  return line;
}

bool is_blank(char c) { return c == ' ' || c == '\t'; }
bool is_octal(char c) { return c >= '0' && c <= '7'; }

// The next blank-separated token of `line`; empty when none is left.
std::string_view take_token(std::string_view& line) {
  std::size_t i = 0;
  while (i < line.size() && is_blank(line[i])) ++i;
  std::size_t j = i;
  while (j < line.size() && !is_blank(line[j])) ++j;
  const auto token = line.substr(i, j - i);
  line.remove_prefix(j);
  return token;
}

bool to_u64(std::string_view token, std::uint64_t& v) {
  const char* end = token.data() + token.size();
  const auto [p, ec] = std::from_chars(token.data(), end, v);
  return !token.empty() && ec == std::errc{} && p == end;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string join(std::string_view root, std::string_view rest) {
  std::string s;
  s.reserve(root.size() + rest.size());
  s.append(root).append(rest);
  return s;
}

Error read_error(std::string_view path, int errnum, std::string_view hint) {
  std::string m = "cannot read ";
  m.append(path).append(": ").append(std::strerror(errnum)).append(" (").append(hint).append(")");
  return Error{Errc::io_error, std::move(m)};
}

Error format_error(std::string_view path, std::string_view what) {
  std::string m = "unexpected content in ";
  m.append(path).append(": ").append(what);
  m.append(". This kernel writes a format chorus does not know: please report it with a copy of the file.");
  return Error{Errc::io_error, std::move(m)};
}

constexpr std::string_view proc_hint = "is /proc mounted?";

// Reads `path` whole with one open/read/close into `buf`, which grows (and
// never shrinks) to the largest file seen, and points `text` at it. procfs
// hands a large file over in page-sized reads, hence the loop to EOF.
Error read_whole(const std::string& path, std::string& buf, std::string_view& text, std::string_view hint) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return read_error(path, errno, hint);
  std::size_t n = 0;
  for (;;) {
    if (n == buf.size()) buf.resize(std::max<std::size_t>(buf.size() * 2, process_buffer));
    const ssize_t r = ::read(fd, buf.data() + n, buf.size() - n);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int errnum = errno;
      close_fd(fd);
      return read_error(path, errnum, hint);
    }
    if (r == 0) break;
    n += static_cast<std::size_t>(r);
  }
  close_fd(fd);
  text = std::string_view(buf.data(), n);
  return {};
}

std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Bytes per second between two readings of a counter; none when it went
// backwards (a wrap or a reset) or no time passed.
std::optional<double> rate(std::uint64_t before, std::uint64_t after, double seconds) {
  if (after < before || !(seconds > 0)) return std::nullopt;
  return static_cast<double>(after - before) / seconds;
}

// mountinfo escapes blanks, newlines and backslashes in paths as \ooo.
std::string unescape_mount_path(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && is_octal(s[i + 1]) && is_octal(s[i + 2]) && is_octal(s[i + 3])) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool path_is_under(std::string_view path, std::string_view mount_point) {
  if (mount_point == "/") return true;
  return path.starts_with(mount_point) && (path.size() == mount_point.size() || path[mount_point.size()] == '/');
}

// btrfs, overlayfs, NFS and the like give their files an anonymous device
// (major 0): look up the mount that holds `dir` in mountinfo, and take its
// source if that is a block device. Returns why not, empty on success.
std::string block_device_of_mount(const std::string& dir, const std::string& proc_root, std::string& buf,
                                  dev_t& dev) {
  char* real = ::realpath(dir.c_str(), nullptr);
  if (real == nullptr) return join("cannot resolve the run directory ", dir);
  const std::string path = real;
  std::free(real);

  const std::string mountinfo = join(proc_root, "/self/mountinfo");
  std::string_view text;
  if (auto err = read_whole(mountinfo, buf, text, proc_hint)) return err.message();
  std::string best_point, fstype, source;
  while (auto line = take_line(text)) {
    auto rest = *line;
    for (int i = 0; i < 4; ++i) take_token(rest); // id, parent, major:minor, root
    std::string point = unescape_mount_path(take_token(rest));
    // Optional fields run up to a lone "-"; then come type and source.
    auto t = take_token(rest);
    while (!t.empty() && t != "-") t = take_token(rest);
    const auto type = take_token(rest), src = take_token(rest);
    // Ties go to the later line: the mount on top.
    if (!src.empty() && path_is_under(path, point) && point.size() >= best_point.size()) {
      best_point = std::move(point);
      fstype = type;
      source = unescape_mount_path(src);
    }
  }
  if (fstype.empty()) return join("no mount holds the run directory in ", mountinfo);
  struct stat st {};
  if (source.starts_with("/dev/") && ::stat(source.c_str(), &st) == 0 && S_ISBLK(st.st_mode)) {
    dev = st.st_rdev;
    return {};
  }
  std::string why = "the run directory ";
  why.append(dir).append(" is on ").append(fstype).append(" (").append(source).append(
      "), which has no block device of its own");
  return why;
}

} // namespace

// ---------------------------------------------------------------------------
// Parsers

std::optional<CpuTimes> parse_proc_stat(std::string_view text) {
  while (auto line = take_line(text)) {
    auto rest = *line;
    if (take_token(rest) != "cpu") continue;
    // user nice system idle iowait irq softirq steal guest guest_nice
    std::uint64_t v[10] = {};
    int n = 0;
    for (auto t = take_token(rest); !t.empty(); t = take_token(rest)) {
      std::uint64_t x;
      if (!to_u64(t, x)) return std::nullopt;
      if (n < 10) v[n++] = x;
    }
    if (n < 4) return std::nullopt;
    CpuTimes c;
    c.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    c.total = c.busy + v[3] + v[4];
    return c;
  }
  return std::nullopt;
}

std::optional<unsigned> parse_cpu_count(std::string_view proc_stat) {
  unsigned count = 0;
  while (auto line = take_line(proc_stat)) {
    auto rest = *line;
    const auto name = take_token(rest);
    if (name.starts_with("cpu") && all_digits(name.substr(3))) {
      ++count;
    } else if (count > 0) {
      return count;
    }
  }
  return std::nullopt;
}

std::optional<MemInfo> parse_meminfo(std::string_view text) {
  std::optional<std::uint64_t> total, available, free, buffers, cached;
  while (auto line = take_line(text)) {
    const auto colon = line->find(':');
    if (colon == std::string_view::npos) continue;
    const auto key = line->substr(0, colon);
    std::optional<std::uint64_t>* slot = key == "MemTotal"       ? &total
                                         : key == "MemAvailable" ? &available
                                         : key == "MemFree"      ? &free
                                         : key == "Buffers"      ? &buffers
                                         : key == "Cached"       ? &cached
                                                                 : nullptr;
    if (slot == nullptr) continue;
    auto rest = line->substr(colon + 1);
    std::uint64_t kb;
    if (!to_u64(take_token(rest), kb) || take_token(rest) != "kB" || !take_token(rest).empty()) return std::nullopt;
    if (kb > UINT64_MAX / 1024) return std::nullopt;
    *slot = kb * 1024;
  }
  if (!total) return std::nullopt;
  if (available) return MemInfo{*total, *available};
  if (free && buffers && cached) return MemInfo{*total, *free + *buffers + *cached};
  return std::nullopt;
}

std::optional<std::string_view> parse_pid_stat_name(std::string_view text) {
  const auto open = text.find('(');
  const auto close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
  auto head = text.substr(0, open);
  std::uint64_t pid;
  if (!to_u64(take_token(head), pid) || !take_token(head).empty()) return std::nullopt;
  return text.substr(open + 1, close - open - 1);
}

std::optional<ProcessStat> parse_pid_stat(std::string_view text) {
  const auto name = parse_pid_stat_name(text);
  if (!name) return std::nullopt;
  auto after = text.substr(static_cast<std::size_t>(name->data() - text.data()) + name->size() + 1);
  auto rest = take_line(after);
  if (!rest) return std::nullopt;
  ProcessStat s;
  // Fields as proc(5) numbers them, from 3 (state) to 24 (rss).
  for (int field = 3; field <= 24; ++field) {
    const auto t = take_token(*rest);
    if (t.empty()) return std::nullopt;
    std::uint64_t* slot = field == 4    ? &s.ppid
                          : field == 14 ? &s.utime
                          : field == 15 ? &s.stime
                          : field == 20 ? &s.threads
                          : field == 22 ? &s.start_ticks
                          : field == 24 ? &s.rss_pages
                                        : nullptr;
    if (slot != nullptr && !to_u64(t, *slot)) return std::nullopt;
  }
  return s;
}

std::optional<IoBytes> parse_diskstats(std::string_view text, unsigned major, unsigned minor) {
  while (auto line = take_line(text)) {
    auto rest = *line;
    std::uint64_t maj, min;
    if (!to_u64(take_token(rest), maj) || !to_u64(take_token(rest), min)) continue;
    if (maj != major || min != minor) continue;
    if (take_token(rest).empty()) return std::nullopt; // the name
    std::uint64_t v[7] = {};
    int n = 0;
    for (auto t = take_token(rest); !t.empty(); t = take_token(rest)) {
      std::uint64_t x;
      if (!to_u64(t, x)) return std::nullopt;
      if (n < 7) v[n] = x;
      ++n;
    }
    // 2.6 partitions: reads, sectors read, writes, sectors written.
    if (n == 4) return IoBytes{v[1] * sector_bytes, v[3] * sector_bytes};
    if (n >= 11) return IoBytes{v[2] * sector_bytes, v[6] * sector_bytes};
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<NetBytes> parse_net_dev(std::string_view text) {
  NetBytes sum;
  bool any = false;
  while (auto line = take_line(text)) {
    const auto colon = line->find(':');
    if (colon == std::string_view::npos) continue; // the two header lines
    auto name_part = line->substr(0, colon);
    const auto name = take_token(name_part);
    // Old kernels print "eth0:1234567890" with no blank after the colon.
    auto rest = line->substr(colon + 1);
    std::uint64_t v[16];
    for (auto& x : v)
      if (!to_u64(take_token(rest), x)) return std::nullopt;
    any = true;
    if (name == "lo") continue;
    sum.rx += v[0];
    sum.tx += v[8];
  }
  if (!text.empty() || !any) return std::nullopt; // a cut-off last line, or no interfaces
  return sum;
}

std::optional<double> parse_uptime(std::string_view text) {
  auto line = take_line(text);
  if (!line) return std::nullopt;
  const auto t = take_token(*line);
  double v = 0;
  const auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc{} || p != t.data() + t.size() || !std::isfinite(v) || v < 0) return std::nullopt;
  return v;
}

// ---------------------------------------------------------------------------
// HostSampler

HostSampler::HostSampler(std::string watched_dir, std::string proc_root)
    : watched_dir_(std::move(watched_dir)), stat_path_(join(proc_root, "/stat")),
      meminfo_path_(join(proc_root, "/meminfo")), diskstats_path_(join(proc_root, "/diskstats")),
      net_dev_path_(join(proc_root, "/net/dev")) {
  buf_.resize(host_buffer);
  auto add_limitation = [this](std::string_view what, std::string_view why) {
    if (!limitations_.empty()) limitations_.append("; ");
    limitations_.append(what).append(": ").append(why);
  };

  struct statvfs vfs {};
  if (::statvfs(watched_dir_.c_str(), &vfs) != 0) {
    std::string why = "statvfs ";
    why.append(watched_dir_).append(": ").append(std::strerror(errno));
    add_limitation("no disk usage", why);
  }

  std::string why_no_disk;
  struct stat st {};
  if (::stat(watched_dir_.c_str(), &st) != 0) {
    why_no_disk.append("stat ").append(watched_dir_).append(": ").append(std::strerror(errno));
  } else {
    dev_t dev = st.st_dev;
    if (major(dev) == 0) why_no_disk = block_device_of_mount(watched_dir_, proc_root, buf_, dev);
    if (why_no_disk.empty()) {
      disk_major_ = major(dev);
      disk_minor_ = minor(dev);
      std::string_view text;
      if (auto err = read_whole(diskstats_path_, buf_, text, proc_hint)) {
        why_no_disk = err.message();
      } else if (!parse_diskstats(text, disk_major_, disk_minor_)) {
        why_no_disk.append(diskstats_path_).append(" has no row for device ");
        why_no_disk.append(std::to_string(disk_major_)).append(":").append(std::to_string(disk_minor_));
        why_no_disk.append(" of ").append(watched_dir_);
      } else {
        has_disk_ = true;
      }
    }
  }
  if (!has_disk_) add_limitation("no disk I/O rates", why_no_disk);

  std::string_view text;
  if (auto err = read_whole(net_dev_path_, buf_, text, proc_hint)) {
    add_limitation("no network rates", err.message());
  } else if (!parse_net_dev(text)) {
    add_limitation("no network rates", join(net_dev_path_, " is not in a format chorus knows"));
  }
}

Error HostSampler::sample(HostSample& out) {
  const auto now = monotonic_ns();
  auto err = sample(out, static_cast<double>(now - last_ns_) * 1e-9);
  if (!err) last_ns_ = now;
  return err;
}

Error HostSampler::sample(HostSample& out, double elapsed_seconds) {
  std::string_view text;
  if (auto err = read_whole(stat_path_, buf_, text, proc_hint)) return err;
  const auto cpu = parse_proc_stat(text);
  const auto cpus = parse_cpu_count(text);
  if (!cpu || !cpus) return format_error(stat_path_, "no \"cpu\" line with 4 to 10 counts, or no \"cpuN\" lines");
  if (auto err = read_whole(meminfo_path_, buf_, text, proc_hint)) return err;
  const auto mem = parse_meminfo(text);
  if (!mem) return format_error(meminfo_path_, "no MemTotal, or neither MemAvailable nor MemFree, Buffers and Cached");

  HostSample s;
  s.cpu_count = *cpus;
  if (!has_prev_) {
    s.cpu_percent = cpu->total > 0 ? 100.0 * static_cast<double>(cpu->busy) / static_cast<double>(cpu->total) : 0;
  } else if (cpu->busy >= prev_cpu_.busy && cpu->total > prev_cpu_.total &&
             cpu->busy - prev_cpu_.busy <= cpu->total - prev_cpu_.total) {
    s.cpu_percent = 100.0 * static_cast<double>(cpu->busy - prev_cpu_.busy) /
                    static_cast<double>(cpu->total - prev_cpu_.total);
  } else {
    s.cpu_percent = cpu_percent_;
  }

  const auto available = std::min(mem->available_bytes, mem->total_bytes);
  s.memory_total_bytes = static_cast<double>(mem->total_bytes);
  s.memory_used_bytes = static_cast<double>(mem->total_bytes - available);
  s.memory_percent = mem->total_bytes > 0 ? 100.0 * s.memory_used_bytes / s.memory_total_bytes : 0;

  struct statvfs vfs {};
  if (::statvfs(watched_dir_.c_str(), &vfs) == 0 && vfs.f_blocks > 0) {
    const double unit = static_cast<double>(vfs.f_frsize);
    const double used = static_cast<double>(vfs.f_blocks - std::min(vfs.f_bfree, vfs.f_blocks)) * unit;
    const double usable = used + static_cast<double>(vfs.f_bavail) * unit;
    s.disk_total_bytes = static_cast<double>(vfs.f_blocks) * unit;
    s.disk_used_bytes = used;
    s.disk_percent = usable > 0 ? 100.0 * used / usable : 0.0;
  }

  std::optional<IoBytes> disk;
  if (has_disk_ && !read_whole(diskstats_path_, buf_, text, proc_hint))
    disk = parse_diskstats(text, disk_major_, disk_minor_);
  if (has_prev_ && disk && prev_disk_) {
    s.disk_read_bytes_per_s = rate(prev_disk_->read, disk->read, elapsed_seconds);
    s.disk_write_bytes_per_s = rate(prev_disk_->written, disk->written, elapsed_seconds);
  }

  std::optional<NetBytes> net;
  if (!read_whole(net_dev_path_, buf_, text, proc_hint)) net = parse_net_dev(text);
  if (has_prev_ && net && prev_net_) {
    s.net_rx_bytes_per_s = rate(prev_net_->rx, net->rx, elapsed_seconds);
    s.net_tx_bytes_per_s = rate(prev_net_->tx, net->tx, elapsed_seconds);
  }

  has_prev_ = true;
  prev_cpu_ = *cpu;
  prev_disk_ = disk;
  prev_net_ = net;
  cpu_percent_ = s.cpu_percent;
  out = s;
  return {};
}

// ---------------------------------------------------------------------------
// Ancestry

std::optional<ProcessId> find_ancestor(std::string_view name, std::string_view proc_root, int max_generations) {
  std::string buf, path = join(proc_root, "/self/stat");
  std::string_view text;
  if (read_whole(path, buf, text, proc_hint)) return std::nullopt;
  std::optional<ProcessStat> st = parse_pid_stat(text);
  for (int generation = 0; st && st->ppid > 1 && generation < max_generations; ++generation) {
    const std::uint64_t pid = st->ppid, child_start = st->start_ticks;
    path.assign(proc_root).append("/").append(std::to_string(pid)).append("/stat");
    if (read_whole(path, buf, text, proc_hint)) return std::nullopt;
    st = parse_pid_stat(text);
    // A parent that started after its child is a later process given the pid.
    if (!st || st->start_ticks > child_start) return std::nullopt;
    if (parse_pid_stat_name(text) == name) return ProcessId{pid, st->start_ticks};
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// ProcessSampler

ProcessSampler::ProcessSampler(int pid, std::string proc_root)
    : pid_(pid), uptime_path_(join(proc_root, "/uptime")) {
  if (pid == 0) {
    stat_path_ = join(proc_root, "/self/stat");
    hint_ = proc_hint;
  } else {
    stat_path_.append(proc_root).append("/").append(std::to_string(pid)).append("/stat");
    hint_.append("has process ").append(std::to_string(pid)).append(" exited? ").append(proc_hint);
  }
  buf_.resize(process_buffer);
  const long tck = ::sysconf(_SC_CLK_TCK);
  const long page = ::sysconf(_SC_PAGESIZE);
  ticks_per_s_ = static_cast<double>(tck > 0 ? tck : 100);
  page_size_ = static_cast<double>(page > 0 ? page : 4096);
}

Error ProcessSampler::sample(ProcessSample& out) {
  const auto now = monotonic_ns();
  auto err = sample(out, static_cast<double>(now - last_ns_) * 1e-9);
  if (!err) last_ns_ = now;
  return err;
}

Error ProcessSampler::sample(ProcessSample& out, double elapsed_seconds) {
  std::string_view text;
  if (auto err = read_whole(stat_path_, buf_, text, hint_)) return err;
  const auto st = parse_pid_stat(text);
  if (!st) return format_error(stat_path_, "fewer than 24 fields after the command name");
  if (has_prev_ && st->start_ticks != start_ticks_) {
    std::string m = "process ";
    m.append(std::to_string(pid_)).append(" has exited: ").append(stat_path_);
    m.append(" now belongs to another process with the same pid");
    return Error{Errc::io_error, std::move(m)};
  }

  const std::uint64_t ticks = st->utime + st->stime;
  double cpu_percent = cpu_percent_;
  if (!has_prev_) {
    if (auto err = read_whole(uptime_path_, buf_, text, proc_hint)) return err;
    const auto uptime = parse_uptime(text);
    if (!uptime) return format_error(uptime_path_, "no seconds since boot");
    const double alive = *uptime - static_cast<double>(st->start_ticks) / ticks_per_s_;
    cpu_percent = alive > 0 ? 100.0 * static_cast<double>(ticks) / ticks_per_s_ / alive : 0;
  } else if (ticks >= prev_ticks_ && elapsed_seconds > 0) {
    cpu_percent = 100.0 * static_cast<double>(ticks - prev_ticks_) / ticks_per_s_ / elapsed_seconds;
  }

  has_prev_ = true;
  prev_ticks_ = ticks;
  start_ticks_ = st->start_ticks;
  cpu_percent_ = cpu_percent;
  out.cpu_percent = cpu_percent;
  out.rss_bytes = static_cast<double>(st->rss_pages) * page_size_;
  out.threads = static_cast<double>(st->threads);
  return {};
}

} // namespace chorus::platform
