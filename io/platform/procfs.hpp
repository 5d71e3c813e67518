// Host and process figures for the system monitor, read from Linux /proc:
// pure parsers for each file (every byte from outside goes through one
// checked path) and two samplers that turn counters into rates.
//
// A sample reads each file with one open/read/close into a buffer the
// sampler keeps, so that the steady state allocates nothing and a sample
// costs a few tens of microseconds.
#pragma once

#include <chorus/chorus.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace chorus::platform {

// ---------------------------------------------------------------------------
// Parsers. Each takes a whole file's text and returns std::nullopt when the
// text is malformed or truncated: a line counts only once its '\n' is there,
// so a cut-off file never yields a half-read number.

/// Clock ticks from the "cpu " line of /proc/stat.
struct CpuTimes {
  std::uint64_t busy = 0;  // user + nice + system + irq + softirq + steal (guest is already inside user)
  std::uint64_t total = 0; // busy + idle + iowait
  bool operator==(const CpuTimes&) const = default;
};
/// Takes kernels from 2.6 on (4 to 10 values on the line; those missing count as 0).
[[nodiscard]] std::optional<CpuTimes> parse_proc_stat(std::string_view text);

/// The number of "cpuN" lines of /proc/stat: the online CPUs. std::nullopt
/// if the text ends before the line that follows them.
[[nodiscard]] std::optional<unsigned> parse_cpu_count(std::string_view proc_stat);

/// MemTotal and MemAvailable of /proc/meminfo, in bytes.
struct MemInfo {
  std::uint64_t total_bytes = 0;
  std::uint64_t available_bytes = 0;
  bool operator==(const MemInfo&) const = default;
};
/// Kernels before 3.14 have no MemAvailable: available is then
/// MemFree + Buffers + Cached, what free(1) showed on them.
[[nodiscard]] std::optional<MemInfo> parse_meminfo(std::string_view text);

/// Fields of /proc/<pid>/stat.
struct ProcessStat {
  std::uint64_t utime = 0, stime = 0; // clock ticks
  std::uint64_t rss_pages = 0;
  std::uint64_t threads = 0;
  std::uint64_t start_ticks = 0; // clock ticks after boot: tells a reused pid apart
  std::uint64_t ppid = 0;        // the parent's pid; 0 where the parent is outside this pid namespace
  bool operator==(const ProcessStat&) const = default;
};
/// The command name may hold spaces, parentheses and newlines: fields are
/// counted from the last ')'.
[[nodiscard]] std::optional<ProcessStat> parse_pid_stat(std::string_view text);

/// The command name of /proc/<pid>/stat: what lies between the first '('
/// and the last ')', as /proc/<pid>/comm holds it (at most 15 bytes, the
/// base name of the file the process was started from).
[[nodiscard]] std::optional<std::string_view> parse_pid_stat_name(std::string_view text);

/// Bytes read and written.
struct IoBytes {
  std::uint64_t read = 0, written = 0;
  bool operator==(const IoBytes&) const = default;
};
/// The /proc/diskstats row of device `major`:`minor` (rows of 14, 18 or 20
/// fields, and 2.6's 7-field partition rows). Sectors are 512 bytes whatever
/// the device's sector size. std::nullopt if there is no such row.
[[nodiscard]] std::optional<IoBytes> parse_diskstats(std::string_view text, unsigned major, unsigned minor);

/// Bytes received and sent.
struct NetBytes {
  std::uint64_t rx = 0, tx = 0;
  bool operator==(const NetBytes&) const = default;
};
/// The sum over the interfaces of /proc/net/dev except "lo". Bridges, bonds
/// and veth pairs count again what their members carry, as the kernel lists them.
[[nodiscard]] std::optional<NetBytes> parse_net_dev(std::string_view text);

/// Seconds since boot, the first figure of /proc/uptime.
[[nodiscard]] std::optional<double> parse_uptime(std::string_view text);

// ---------------------------------------------------------------------------
// Ancestry.

/// A process, told apart from a later one given the same pid by its start time.
struct ProcessId {
  std::uint64_t pid = 0;
  std::uint64_t start_ticks = 0;
  bool operator==(const ProcessId&) const = default;
};

/// The nearest ancestor of this process (its parent first) whose command
/// name is `name`, read from <proc_root>/<pid>/stat up the chain of parents:
/// at most `max_generations` up, never pid 1 (init, or a container's first
/// process). std::nullopt where there is none, or where a link of the chain
/// cannot be read or is no longer the ancestor (a process that started after
/// the one below it holds a reused pid).
[[nodiscard]] std::optional<ProcessId> find_ancestor(std::string_view name, std::string_view proc_root = "/proc",
                                                     int max_generations = 64);

// ---------------------------------------------------------------------------
// Samplers.

/// One node. CPU and memory are the whole host's, also inside a container.
struct HostSample {
  double cpu_percent = 0; // all CPUs busy = 100
  unsigned cpu_count = 0;
  double memory_used_bytes = 0, memory_total_bytes = 0, memory_percent = 0; // used = total - available
  // statvfs of the watched directory; percent as df shows it: used / (used + available to users).
  std::optional<double> disk_used_bytes, disk_total_bytes, disk_percent;
  // The watched directory's block device, if it has a diskstats row.
  std::optional<double> disk_read_bytes_per_s, disk_write_bytes_per_s;
  // This network namespace's interfaces except lo.
  std::optional<double> net_rx_bytes_per_s, net_tx_bytes_per_s;
};

/// One process.
struct ProcessSample {
  double cpu_percent = 0; // one core busy = 100 (like top): a process may pass 100
  double rss_bytes = 0;
  double threads = 0;
};

/// Samples the host. The first sample has no rates (std::nullopt) and
/// cpu_percent averaged since boot; later ones cover the interval since the
/// previous successful sample. A rate whose counter went backwards (a wrap, a
/// device reset) is absent for that interval; cpu_percent then repeats the
/// previous value, as it does when no tick passed between two samples.
class HostSampler {
public:
  /// `watched_dir`: the run directory; its device picks the diskstats row.
  /// `proc_root`: where /proc is (tests point it at a tree of their own).
  /// Probes what this machine can report: see limitations().
  explicit HostSampler(std::string watched_dir, std::string proc_root = "/proc");

  /// Elapsed time from CLOCK_MONOTONIC. Errc::io_error naming the file when
  /// /proc/stat or /proc/meminfo cannot be read or parsed; the optional
  /// figures are left absent without an error. `out` is untouched on error.
  [[nodiscard]] Error sample(HostSample& out);
  /// The same with the seconds since the previous successful sample given
  /// (tests, or a caller with its own clock); ignored on the first sample.
  /// Use one form or the other: the first does not see the second's calls.
  [[nodiscard]] Error sample(HostSample& out, double elapsed_seconds);

  /// One line for the log: what this machine cannot report and why (e.g. no
  /// disk I/O for a run directory on overlayfs); empty if everything is there.
  [[nodiscard]] const std::string& limitations() const noexcept { return limitations_; }

private:
  std::string watched_dir_;
  std::string stat_path_, meminfo_path_, diskstats_path_, net_dev_path_;
  std::string buf_;
  std::string limitations_;
  bool has_disk_ = false;
  unsigned disk_major_ = 0, disk_minor_ = 0;
  bool has_prev_ = false;
  CpuTimes prev_cpu_;
  std::optional<IoBytes> prev_disk_;
  std::optional<NetBytes> prev_net_;
  double cpu_percent_ = 0;
  std::int64_t last_ns_ = 0;
};

/// Samples one process. The first sample has cpu_percent averaged since the
/// process started (it reads /proc/uptime once for that); later ones cover
/// the interval since the previous successful sample.
class ProcessSampler {
public:
  /// `pid` 0 is this process.
  explicit ProcessSampler(int pid, std::string proc_root = "/proc");

  /// Elapsed time from CLOCK_MONOTONIC. Errc::io_error naming the file when
  /// it cannot be read or parsed, or once the pid belongs to another process.
  [[nodiscard]] Error sample(ProcessSample& out);
  /// The same with the seconds since the previous successful sample given;
  /// ignored on the first sample. Use one form or the other, as for HostSampler.
  [[nodiscard]] Error sample(ProcessSample& out, double elapsed_seconds);

private:
  int pid_;
  std::string stat_path_, uptime_path_;
  std::string hint_;
  std::string buf_;
  double ticks_per_s_;
  double page_size_;
  bool has_prev_ = false;
  std::uint64_t prev_ticks_ = 0, start_ticks_ = 0;
  double cpu_percent_ = 0;
  std::int64_t last_ns_ = 0;
};

} // namespace chorus::platform
