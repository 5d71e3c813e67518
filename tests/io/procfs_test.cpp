#define BOOST_TEST_MODULE io_procfs
#include <boost/test/unit_test.hpp>

#include "io/platform/procfs.hpp"
#include "tests/temp_dir.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <vector>

using namespace chorus;
using namespace chorus::platform;
using chorus::test::TempDir;

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)

// Every allocation of the test binary is counted, to show that sampling
// allocates nothing once its buffers have grown. Not inlined: GCC 12 takes
// an inlined free() of what operator new returned for a mismatch.
namespace {
std::atomic<std::size_t> allocations{0};
}
[[gnu::noinline]] void* operator new(std::size_t n) {
  ++allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

const std::string fixture_dir = std::string(CHORUS_SOURCE_DIR) + "/tests/io/fixtures/proc/";

std::string fixture(const std::string& name) {
  std::ifstream in(fixture_dir + name, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "no fixture " << fixture_dir << name);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  BOOST_REQUIRE_MESSAGE(out, "cannot write " << path);
}

// Calls `check(len, parse(prefix))` for every prefix of `text`, each copied
// into a buffer of exactly its length so that a sanitizer sees a read past the end.
template <class Parse, class Check>
void for_each_truncation(const std::string& text, Parse parse, Check check) {
  for (std::size_t len = 0; len <= text.size(); ++len) {
    std::unique_ptr<char[]> copy(new char[len == 0 ? 1 : len]);
    std::memcpy(copy.get(), text.data(), len);
    check(len, parse(std::string_view(copy.get(), len)));
  }
}

// A truncated file parses to nothing or to what the whole file gives.
template <class Parse>
void truncations_give_nothing_or_all(const std::string& name, Parse parse) {
  const std::string text = fixture(name);
  const auto whole = parse(text);
  BOOST_REQUIRE_MESSAGE(whole, name << " does not parse");
  for_each_truncation(text, parse, [&](std::size_t len, const auto& r) {
    BOOST_TEST_INFO(name << " cut to " << len << " bytes");
    BOOST_TEST((!r || *r == *whole));
  });
}

double ticks_per_s() { return static_cast<double>(::sysconf(_SC_CLK_TCK)); }

} // namespace

// ---------------------------------------------------------------------------
// Parsers against captures

BOOST_AUTO_TEST_CASE(proc_stat_sums_busy_and_total_ticks) {
  // Linux 6.x, 10 values; user nice system idle iowait irq softirq steal guest guest_nice.
  auto c = parse_proc_stat(fixture("stat"));
  BOOST_REQUIRE(c);
  BOOST_TEST(c->busy == 1209274u + 12632 + 265635 + 0 + 2926 + 0);
  BOOST_TEST(c->total == c->busy + 437006 + 6348);
  BOOST_TEST((parse_cpu_count(fixture("stat")) == std::optional<unsigned>(2)));

  // 2.6.18: 8 values, and cpu2 offline (no line).
  c = parse_proc_stat(fixture("stat-2.6.18"));
  BOOST_REQUIRE(c);
  BOOST_TEST(c->busy == 2255u + 34 + 2290 + 127 + 456 + 0);
  BOOST_TEST(c->total == c->busy + 22625563 + 6290);
  BOOST_TEST((parse_cpu_count(fixture("stat-2.6.18")) == std::optional<unsigned>(3)));

  // A KVM host: guest time is already inside user, and not added again.
  c = parse_proc_stat(fixture("stat-kvm-host"));
  BOOST_REQUIRE(c);
  BOOST_TEST(c->busy == 8845211u + 2310 + 1207742 + 0 + 61211 + 1201);
  BOOST_TEST(c->total == c->busy + 91243012 + 40211);
  BOOST_TEST((parse_cpu_count(fixture("stat-kvm-host")) == std::optional<unsigned>(4)));
}

BOOST_AUTO_TEST_CASE(proc_stat_rejects_what_it_cannot_read) {
  BOOST_TEST(!parse_proc_stat(""));
  BOOST_TEST(!parse_proc_stat("cpu  1 2 3\n"));            // too few values
  BOOST_TEST(!parse_proc_stat("cpu  1 2 x 4\n"));          // not a number
  BOOST_TEST(!parse_proc_stat("cpu  -1 2 3 4\n"));         // negative
  BOOST_TEST(!parse_proc_stat("cpu  1 2 3 4"));            // no end of line
  BOOST_TEST(!parse_proc_stat("cpu  1 2 3 99999999999999999999\n")); // overflow
  BOOST_TEST(parse_proc_stat("cpu  1 2 3 4\n")->total == 10u);
  BOOST_TEST(parse_proc_stat("cpu  1 1 1 1 1 1 1 1 1 1 7 7\n")->busy == 6u); // later fields ignored
  BOOST_TEST(!parse_cpu_count("cpu  1 2 3 4\ncpu0 1 2 3 4\n")); // ends inside the cpu lines
  BOOST_TEST(!parse_cpu_count("cpu  1 2 3 4\nintr 5\n"));        // no cpuN line
  BOOST_TEST((parse_cpu_count("cpu  1 2 3 4\ncpu0 1 2 3 4\ncpux 1\n") == std::optional<unsigned>(1)));
}

BOOST_AUTO_TEST_CASE(meminfo_reads_total_and_available) {
  auto m = parse_meminfo(fixture("meminfo"));
  BOOST_REQUIRE(m);
  BOOST_TEST(m->total_bytes == 24683620ull * 1024);
  BOOST_TEST(m->available_bytes == 24296844ull * 1024);

  // Before 3.14 there is no MemAvailable: MemFree + Buffers + Cached.
  m = parse_meminfo(fixture("meminfo-3.10"));
  BOOST_REQUIRE(m);
  BOOST_TEST(m->total_bytes == 8061404ull * 1024);
  BOOST_TEST(m->available_bytes == (412332ull + 201800 + 3654120) * 1024);

  BOOST_TEST(!parse_meminfo(""));
  BOOST_TEST(!parse_meminfo("MemFree: 10 kB\nMemAvailable: 10 kB\n"));               // no MemTotal
  BOOST_TEST(!parse_meminfo("MemTotal: 100 kB\nMemFree: 10 kB\n"));                   // no fallback either
  BOOST_TEST(!parse_meminfo("MemTotal: 100 MB\nMemAvailable: 10 kB\n"));              // unknown unit
  BOOST_TEST(!parse_meminfo("MemTotal: 100 kB\nMemAvailable: 10\n"));                 // no unit
  BOOST_TEST(!parse_meminfo("MemTotal: 18446744073709551615 kB\nMemAvailable: 1 kB\n")); // overflows bytes
}

BOOST_AUTO_TEST_CASE(pid_stat_counts_fields_from_the_last_paren) {
  auto s = parse_pid_stat(fixture("pid-stat"));
  BOOST_REQUIRE(s);
  BOOST_TEST(s->utime == 884123u);
  BOOST_TEST(s->stime == 65231u);
  BOOST_TEST(s->threads == 97u);
  BOOST_TEST(s->start_ticks == 5123456u);
  BOOST_TEST(s->rss_pages == 2843221u);
  BOOST_TEST(s->ppid == 48100u);

  // comm "a b) c": spaces and a ')' inside the parentheses.
  s = parse_pid_stat(fixture("pid-stat-parens"));
  BOOST_REQUIRE(s);
  BOOST_TEST((*s == ProcessStat{7, 3, 2048, 4, 123456, 1}));

  // comm "x\n)y": a newline and a ')'.
  s = parse_pid_stat(fixture("pid-stat-newline"));
  BOOST_REQUIRE(s);
  BOOST_TEST((*s == ProcessStat{250, 125, 512, 2, 9000, 1}));

  // A real-time kernel thread: negative priority, tty -1, no rss.
  s = parse_pid_stat(fixture("pid-stat-rt"));
  BOOST_REQUIRE(s);
  BOOST_TEST((*s == ProcessStat{0, 12, 0, 1, 37, 2}));

  BOOST_TEST(!parse_pid_stat(""));
  BOOST_TEST(!parse_pid_stat("12 (x) S 1 2 3\n"));  // too few fields
  BOOST_TEST(!parse_pid_stat("(x) S 1 2 3\n"));     // no pid
  BOOST_TEST(!parse_pid_stat("12 x) S 1 2 3\n"));   // no '('
  BOOST_TEST(!parse_pid_stat("12 (x S 1 2 3\n"));   // no ')'
  BOOST_TEST(!parse_pid_stat(") 12 (x S 1 2 3\n")); // ')' before '('
}

BOOST_AUTO_TEST_CASE(pid_stat_name_is_between_the_first_and_the_last_paren) {
  BOOST_TEST((parse_pid_stat_name(fixture("pid-stat")) == "python3"));
  BOOST_TEST((parse_pid_stat_name(fixture("pid-stat-parens")) == "a b) c"));
  BOOST_TEST((parse_pid_stat_name(fixture("pid-stat-newline")) == "x\n)y"));
  BOOST_TEST((parse_pid_stat_name("12 () S 1\n") == ""));
  BOOST_TEST(!parse_pid_stat_name("(x) S 1\n"));   // no pid
  BOOST_TEST(!parse_pid_stat_name("12 x) S 1\n"));  // no '('
  BOOST_TEST(!parse_pid_stat_name(") 12 (x S 1\n")); // ')' before '('
}

BOOST_AUTO_TEST_CASE(diskstats_picks_the_row_and_counts_512_byte_sectors) {
  // Linux 5.5+: 20 fields (captured on a VM, vda 254:0).
  auto d = parse_diskstats(fixture("diskstats-20"), 254, 0);
  BOOST_REQUIRE(d);
  BOOST_TEST(d->read == 5900074ull * 512);
  BOOST_TEST(d->written == 105526256ull * 512);

  // 4.18 to 5.4: 18 fields.
  d = parse_diskstats(fixture("diskstats-18"), 8, 2);
  BOOST_REQUIRE(d);
  BOOST_TEST((*d == IoBytes{9329079ull * 512, 50331902ull * 512}));
  d = parse_diskstats(fixture("diskstats-18"), 259, 0);
  BOOST_REQUIRE(d);
  BOOST_TEST((*d == IoBytes{401230118ull * 512, 1730128840ull * 512}));

  // 4.x: 14 fields.
  d = parse_diskstats(fixture("diskstats-14"), 253, 0);
  BOOST_REQUIRE(d);
  BOOST_TEST((*d == IoBytes{178436630ull * 512, 421873224ull * 512}));

  // 2.6: disks have 14 fields, partitions 7.
  d = parse_diskstats(fixture("diskstats-2.6"), 8, 0);
  BOOST_REQUIRE(d);
  BOOST_TEST((*d == IoBytes{6139584ull * 512, 3027180ull * 512}));
  d = parse_diskstats(fixture("diskstats-2.6"), 8, 1);
  BOOST_REQUIRE(d);
  BOOST_TEST((*d == IoBytes{6139370ull * 512, 3029104ull * 512}));

  BOOST_TEST(!parse_diskstats(fixture("diskstats-20"), 9, 9)); // no such device
  BOOST_TEST(!parse_diskstats("   8 0 sda 1 2 3 4 5\n", 8, 0)); // neither 4 nor 11+ counts
  BOOST_TEST(!parse_diskstats("   8 0 sda 1 2 x 4\n", 8, 0));
  BOOST_TEST(!parse_diskstats("   8 0\n", 8, 0));
}

BOOST_AUTO_TEST_CASE(net_dev_sums_every_interface_but_lo) {
  auto n = parse_net_dev(fixture("net-dev"));
  BOOST_REQUIRE(n);
  BOOST_TEST(n->rx == 51233127441ull + 912331244123 + 901223312441 + 123311231 + 4123312212 + 33120);
  BOOST_TEST(n->tx == 8123312012ull + 881231244012 + 871223312412 + 4123312212 + 123311231 + 11220);

  // 2.6: no blank between the colon and a wide first count.
  n = parse_net_dev(fixture("net-dev-2.6"));
  BOOST_REQUIRE(n);
  BOOST_TEST((*n == NetBytes{3291846872ull, 1201342123ull}));

  const std::string header = fixture("net-dev").substr(0, fixture("net-dev").find("    lo:"));
  BOOST_TEST(!parse_net_dev(header)); // no interface at all
  n = parse_net_dev(header + "    lo: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n");
  BOOST_REQUIRE(n);
  BOOST_TEST((*n == NetBytes{0, 0})); // only lo: nothing, but known
  BOOST_TEST(!parse_net_dev(header + "  eth0: 1 2 3\n"));
}

BOOST_AUTO_TEST_CASE(uptime_reads_seconds_since_boot) {
  BOOST_TEST((parse_uptime(fixture("uptime")) == std::optional<double>(350735.47)));
  BOOST_TEST(!parse_uptime(""));
  BOOST_TEST(!parse_uptime("12.5"));
  BOOST_TEST(!parse_uptime("abc 1\n"));
  BOOST_TEST(!parse_uptime("-3 1\n"));
}

// ---------------------------------------------------------------------------
// Truncated and foreign text

BOOST_AUTO_TEST_CASE(every_parser_survives_every_truncation_of_every_fixture) {
  for (const auto& entry : std::filesystem::directory_iterator(fixture_dir)) {
    const std::string text = fixture(entry.path().filename().string());
    for_each_truncation(text, [](std::string_view t) { return t; }, [](std::size_t, std::string_view t) {
      (void)parse_proc_stat(t);
      (void)parse_cpu_count(t);
      (void)parse_meminfo(t);
      (void)parse_pid_stat(t);
      (void)parse_diskstats(t, 8, 0);
      (void)parse_net_dev(t);
      (void)parse_uptime(t);
    });
  }
}

BOOST_AUTO_TEST_CASE(a_truncated_file_parses_to_nothing_or_to_the_whole) {
  for (const char* f : {"stat", "stat-2.6.18", "stat-kvm-host"}) {
    truncations_give_nothing_or_all(f, parse_proc_stat);
    truncations_give_nothing_or_all(f, parse_cpu_count);
  }
  for (const char* f : {"meminfo", "meminfo-3.10"}) truncations_give_nothing_or_all(f, parse_meminfo);
  for (const char* f : {"pid-stat", "pid-stat-parens", "pid-stat-newline", "pid-stat-rt"})
    truncations_give_nothing_or_all(f, parse_pid_stat);
  const auto row = [](unsigned maj, unsigned min) {
    return [=](std::string_view t) { return parse_diskstats(t, maj, min); };
  };
  truncations_give_nothing_or_all("diskstats-20", row(254, 0));
  truncations_give_nothing_or_all("diskstats-18", row(259, 1));
  truncations_give_nothing_or_all("diskstats-14", row(8, 1));
  truncations_give_nothing_or_all("diskstats-2.6", row(8, 1));
  truncations_give_nothing_or_all("uptime", parse_uptime);
  // net/dev has no last line to wait for: a cut between lines sums fewer interfaces.
  for (const char* f : {"net-dev", "net-dev-2.6"}) {
    const std::string text = fixture(f);
    const auto whole = parse_net_dev(text);
    BOOST_REQUIRE(whole);
    for_each_truncation(text, parse_net_dev, [&](std::size_t len, const std::optional<NetBytes>& r) {
      BOOST_TEST_INFO(f << " cut to " << len << " bytes");
      BOOST_TEST((!r || (text[len - 1] == '\n' && r->rx <= whole->rx && r->tx <= whole->tx)));
    });
  }
}

// ---------------------------------------------------------------------------
// Rates over a /proc tree of the test's own

namespace {

struct FakeProc {
  TempDir tmp;
  std::string root = tmp / "proc";
  unsigned disk_major = 0, disk_minor = 0;

  FakeProc() {
    struct stat st {};
    BOOST_REQUIRE(::stat(tmp.str().c_str(), &st) == 0);
    disk_major = major(st.st_dev);
    disk_minor = minor(st.st_dev);
  }
  // A tmp dir on btrfs, overlayfs or tmpfs has no block device of its own.
  [[nodiscard]] bool has_disk() const { return disk_major != 0; }

  void host(const std::string& cpu, std::uint64_t avail_kb, std::uint64_t sectors_read, std::uint64_t sectors_written,
            const std::string& eth0, const std::string& eth1) const {
    write(root + "/stat", "cpu  " + cpu + "\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\nintr 0\nctxt 0\n");
    write(root + "/meminfo", "MemTotal: 1000 kB\nMemFree: 1 kB\nMemAvailable: " + std::to_string(avail_kb) + " kB\n");
    write(root + "/diskstats", "   7 0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n " + std::to_string(disk_major) + " " +
                                   std::to_string(disk_minor) + " sdz 10 0 " + std::to_string(sectors_read) +
                                   " 0 20 0 " + std::to_string(sectors_written) + " 0 0 0 0 0 0 0 0 0 0\n");
    write(root + "/net/dev", "Inter-|   Receive |  Transmit\n face |bytes packets|bytes packets\n"
                             "    lo: 99999 1 0 0 0 0 0 0 99999 1 0 0 0 0 0 0\n"
                             "  eth0: " + eth0 + "\n  eth1: " + eth1 + "\n");
  }
  static std::string iface(std::uint64_t rx, std::uint64_t tx) {
    return std::to_string(rx) + " 1 0 0 0 0 0 0 " + std::to_string(tx) + " 1 0 0 0 0 0 0";
  }
};

} // namespace

BOOST_AUTO_TEST_CASE(host_rates_come_from_counter_deltas_over_the_given_time) {
  FakeProc p;
  p.host("100 0 100 700 100 0 0 0 0 0", 250, 1000, 2000, FakeProc::iface(1000, 2000), FakeProc::iface(10, 20));
  HostSampler sampler(p.tmp.str(), p.root);
  if (p.has_disk()) BOOST_TEST(sampler.limitations() == "");
  BOOST_TEST_MESSAGE("limitations: " << sampler.limitations());

  HostSample s;
  BOOST_REQUIRE(!sampler.sample(s, 2.0));
  BOOST_TEST(s.cpu_percent == 20.0); // since boot: 200 busy of 1000 ticks
  BOOST_TEST(s.cpu_count == 2u);
  BOOST_TEST(s.memory_total_bytes == 1000.0 * 1024);
  BOOST_TEST(s.memory_used_bytes == 750.0 * 1024);
  BOOST_TEST(s.memory_percent == 75.0);
  BOOST_TEST(!s.disk_read_bytes_per_s);
  BOOST_TEST(!s.disk_write_bytes_per_s);
  BOOST_TEST(!s.net_rx_bytes_per_s);
  BOOST_TEST(!s.net_tx_bytes_per_s);
  BOOST_REQUIRE(s.disk_total_bytes);
  BOOST_TEST(*s.disk_total_bytes > 0);
  BOOST_TEST(*s.disk_used_bytes <= *s.disk_total_bytes);

  // +150 busy, +50 idle/iowait: 75 %. 4000 sectors read in 2 s; lo does not count.
  p.host("200 0 150 740 110 0 0 0 0 0", 500, 5000, 2000, FakeProc::iface(4000, 2000), FakeProc::iface(1010, 120));
  BOOST_REQUIRE(!sampler.sample(s, 2.0));
  BOOST_TEST(s.cpu_percent == 75.0);
  BOOST_TEST(s.memory_percent == 50.0);
  BOOST_REQUIRE(s.net_rx_bytes_per_s);
  BOOST_TEST(*s.net_rx_bytes_per_s == 2000.0);
  BOOST_TEST(*s.net_tx_bytes_per_s == 50.0);
  if (p.has_disk()) {
    BOOST_REQUIRE(s.disk_read_bytes_per_s);
    BOOST_TEST(*s.disk_read_bytes_per_s == 4000.0 * 512 / 2);
    BOOST_TEST(*s.disk_write_bytes_per_s == 0.0);
  }

  // Counters going backwards (a device reset, an interface gone) give no
  // rate; no tick passed, so cpu_percent stays.
  p.host("200 0 150 740 110 0 0 0 0 0", 500, 10, 3000, FakeProc::iface(4000, 2100), FakeProc::iface(0, 0));
  BOOST_REQUIRE(!sampler.sample(s, 1.0));
  BOOST_TEST(s.cpu_percent == 75.0);
  BOOST_TEST(!s.net_rx_bytes_per_s);
  BOOST_TEST(!s.net_tx_bytes_per_s);
  if (p.has_disk()) {
    BOOST_TEST(!s.disk_read_bytes_per_s);
    BOOST_REQUIRE(s.disk_write_bytes_per_s);
    BOOST_TEST(*s.disk_write_bytes_per_s == 1000.0 * 512);
  }

  // No time passed: no rates.
  p.host("300 0 150 740 110 0 0 0 0 0", 500, 20, 3000, FakeProc::iface(5000, 2100), FakeProc::iface(0, 0));
  BOOST_REQUIRE(!sampler.sample(s, 0.0));
  BOOST_TEST(s.cpu_percent == 100.0);
  BOOST_TEST(!s.net_rx_bytes_per_s);
  BOOST_TEST(!s.disk_read_bytes_per_s);
}

BOOST_AUTO_TEST_CASE(host_sampler_says_what_it_cannot_report) {
  FakeProc p;
  p.host("1 0 1 8 0 0 0 0 0 0", 500, 0, 0, FakeProc::iface(0, 0), FakeProc::iface(0, 0));
  std::filesystem::remove(p.root + "/net/dev");
  write(p.root + "/diskstats", "   7 0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n");
  HostSampler sampler(p.tmp.str(), p.root);
  BOOST_TEST_MESSAGE("limitations: " << sampler.limitations());
  BOOST_TEST(sampler.limitations().find("no network rates: cannot read " + p.root + "/net/dev") != std::string::npos);
  BOOST_TEST(sampler.limitations().find("no disk I/O rates") != std::string::npos);
  BOOST_TEST(sampler.limitations().find('\n') == std::string::npos);
  HostSample s;
  BOOST_REQUIRE(!sampler.sample(s, 1.0));
  BOOST_REQUIRE(!sampler.sample(s, 1.0));
  BOOST_TEST(!s.net_rx_bytes_per_s);
  BOOST_TEST(!s.disk_read_bytes_per_s);
  BOOST_TEST(s.disk_total_bytes.has_value());

  // A run directory on tmpfs: the mount is found in mountinfo, and has no device.
  struct stat st {};
  if (::stat("/dev/shm", &st) != 0 || major(st.st_dev) != 0 ||
      std::filesystem::canonical("/dev/shm") != std::filesystem::path("/dev/shm")) {
    BOOST_TEST_MESSAGE("no tmpfs at /dev/shm here: mountinfo lookup not checked");
    return;
  }
  write(p.root + "/self/mountinfo", "21 26 0:20 / /proc rw,relatime - proc proc rw\n"
                                    "26 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
                                    "24 23 0:22 / /dev/shm rw,nosuid,nodev shared:3 master:2 - tmpfs tmpfs rw\n"
                                    "30 24 0:40 / /dev/shm\\040x rw - ext4 /dev/other rw\n");
  HostSampler on_tmpfs("/dev/shm", p.root);
  BOOST_TEST_MESSAGE("limitations: " << on_tmpfs.limitations());
  BOOST_TEST(on_tmpfs.limitations().find("/dev/shm is on tmpfs (tmpfs), which has no block device") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(find_ancestor_walks_up_the_parents_to_the_nearest_of_that_name) {
  // A rank started by Hydra's proxy through a shell: train <- sh <- proxy <- mpiexec <- init.
  TempDir tmp;
  const std::string root = tmp / "proc";
  const auto process = [&](const std::string& dir, int pid, const std::string& name, int ppid, int start) {
    write(root + "/" + dir + "/stat", std::to_string(pid) + " (" + name + ") S " + std::to_string(ppid) +
                                          " 1 1 0 -1 4194304 10 0 0 0 1 1 0 0 20 0 1 0 " + std::to_string(start) +
                                          " 99999 2048 18446744073709551615 0\n");
  };
  process("self", 300, "train", 200, 5000);
  process("200", 200, "sh", 100, 4000);
  process("100", 100, "hydra_pmi_proxy", 50, 3000);
  process("50", 50, "mpiexec.hydra", 1, 2000);
  process("1", 1, "init", 0, 1);
  BOOST_TEST((find_ancestor("hydra_pmi_proxy", root) == ProcessId{100, 3000}));
  BOOST_TEST((find_ancestor("mpiexec.hydra", root) == ProcessId{50, 2000}));
  BOOST_TEST((find_ancestor("sh", root) == ProcessId{200, 4000}));
  BOOST_TEST(!find_ancestor("train", root)); // this process is not its own ancestor
  BOOST_TEST(!find_ancestor("init", root));  // the walk stops below pid 1
  BOOST_TEST(!find_ancestor("hydra_pmi", root));
  // At most so many generations up: the proxy is the second.
  BOOST_TEST(!find_ancestor("hydra_pmi_proxy", root, 1));
  BOOST_TEST((find_ancestor("hydra_pmi_proxy", root, 2) == ProcessId{100, 3000}));

  // The proxy exited and a later process took its pid: not an ancestor.
  process("100", 100, "hydra_pmi_proxy", 50, 4001);
  BOOST_TEST(!find_ancestor("hydra_pmi_proxy", root));
  process("100", 100, "hydra_pmi_proxy", 50, 4000); // started in the same tick as its child
  BOOST_TEST((find_ancestor("hydra_pmi_proxy", root) == ProcessId{100, 4000}));

  // A link that cannot be read or parsed ends the walk.
  write(root + "/200/stat", "200 (sh) S 100\n");
  BOOST_TEST(!find_ancestor("hydra_pmi_proxy", root));
  std::filesystem::remove_all(root + "/200");
  BOOST_TEST(!find_ancestor("hydra_pmi_proxy", root));
  std::filesystem::remove_all(root + "/self");
  BOOST_TEST(!find_ancestor("hydra_pmi_proxy", root));

  // A parent outside this pid namespace reads as pid 0.
  process("self", 300, "train", 0, 5000);
  BOOST_TEST(!find_ancestor("hydra_pmi_proxy", root));
}

BOOST_AUTO_TEST_CASE(find_ancestor_reads_this_process_s_parents) {
  // The test runs under some parent (ctest, a shell); its name is in /proc.
  if (::getppid() <= 1) return; // the walk never reaches pid 1
  std::ifstream comm("/proc/" + std::to_string(::getppid()) + "/comm");
  std::string name;
  BOOST_REQUIRE(std::getline(comm, name));
  const auto parent = find_ancestor(name);
  BOOST_REQUIRE(parent);
  BOOST_TEST(parent->pid == static_cast<std::uint64_t>(::getppid()));
  BOOST_TEST(parent->start_ticks > 0u);
  BOOST_TEST(!find_ancestor("no such name"));
}

BOOST_AUTO_TEST_CASE(process_cpu_is_ticks_over_elapsed_time) {
  TempDir tmp;
  const std::string root = tmp / "proc";
  const auto stat_line = [](int utime, int stime, int start) {
    return "1234 (train (rank 0)) R 1 1234 1234 0 -1 4194304 10 0 0 0 " + std::to_string(utime) + " " +
           std::to_string(stime) + " 0 0 20 0 8 0 " + std::to_string(start) + " 99999 2048 18446744073709551615 0\n";
  };
  write(root + "/uptime", "80.00 150.00\n");
  write(root + "/1234/stat", stat_line(3000, 1000, 0));
  const double tck = ticks_per_s();
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));

  ProcessSampler sampler(1234, root);
  ProcessSample s;
  BOOST_REQUIRE(!sampler.sample(s, 5.0));
  BOOST_TEST(s.cpu_percent == 100.0 * (4000 / tck) / 80.0, boost::test_tools::tolerance(1e-9)); // since start
  BOOST_TEST(s.rss_bytes == 2048 * page);
  BOOST_TEST(s.threads == 8.0);

  write(root + "/1234/stat", stat_line(3150, 1050, 0));
  BOOST_REQUIRE(!sampler.sample(s, 0.5));
  BOOST_TEST(s.cpu_percent == 100.0 * (200 / tck) / 0.5, boost::test_tools::tolerance(1e-9));

  write(root + "/1234/stat", stat_line(10, 10, 0)); // backwards: the value stays
  BOOST_REQUIRE(!sampler.sample(s, 0.5));
  BOOST_TEST(s.cpu_percent == 100.0 * (200 / tck) / 0.5, boost::test_tools::tolerance(1e-9));

  write(root + "/1234/stat", stat_line(10, 10, 777)); // another process took the pid
  const Error err = sampler.sample(s, 0.5);
  BOOST_TEST(err.code() == Errc::io_error);
  BOOST_TEST(err.message().find("process 1234 has exited") != std::string::npos);

  std::filesystem::remove_all(root + "/1234");
  ProcessSampler gone(1234, root);
  const Error gone_err = gone.sample(s);
  BOOST_TEST_MESSAGE(gone_err.message());
  BOOST_TEST(gone_err.message().find("cannot read " + root + "/1234/stat") != std::string::npos);
  BOOST_TEST(gone_err.message().find("has process 1234 exited?") != std::string::npos);
}

// ---------------------------------------------------------------------------
// This machine

BOOST_AUTO_TEST_CASE(live_host_figures_are_plausible) {
  TempDir tmp;
  HostSampler sampler(tmp.str());
  BOOST_TEST_MESSAGE("limitations here: " << (sampler.limitations().empty() ? "none" : sampler.limitations()));
  HostSample s;
  BOOST_REQUIRE(!sampler.sample(s));
  ::usleep(100'000);
  const Error err = sampler.sample(s);
  BOOST_REQUIRE_MESSAGE(!err, err.message());
  BOOST_TEST_MESSAGE("cpu " << s.cpu_percent << " % of " << s.cpu_count << ", memory " << s.memory_percent << " %");
  BOOST_TEST(s.cpu_percent >= 0.0);
  BOOST_TEST(s.cpu_percent <= 100.0);
  BOOST_TEST(s.cpu_count == static_cast<unsigned>(::sysconf(_SC_NPROCESSORS_ONLN)));
  BOOST_TEST(s.memory_total_bytes > s.memory_used_bytes);
  BOOST_TEST(s.memory_used_bytes > 0.0);
  BOOST_TEST(s.memory_percent > 0.0);
  BOOST_TEST(s.memory_percent < 100.0);
  BOOST_REQUIRE(s.disk_total_bytes);
  BOOST_TEST(*s.disk_used_bytes >= 0.0);
  BOOST_TEST(*s.disk_used_bytes <= *s.disk_total_bytes);
  BOOST_TEST(*s.disk_percent >= 0.0);
  BOOST_TEST(*s.disk_percent <= 100.0);
  if (sampler.limitations().find("disk I/O") == std::string::npos) {
    BOOST_REQUIRE(s.disk_read_bytes_per_s);
    BOOST_TEST(*s.disk_read_bytes_per_s >= 0.0);
    BOOST_TEST(*s.disk_write_bytes_per_s >= 0.0);
  }
  if (sampler.limitations().find("network") == std::string::npos) {
    BOOST_REQUIRE(s.net_rx_bytes_per_s);
    BOOST_TEST(*s.net_rx_bytes_per_s >= 0.0);
  }

  HostSampler nowhere(tmp.str(), "/nonexistent-proc");
  const Error missing = nowhere.sample(s);
  BOOST_TEST(missing.code() == Errc::io_error);
  BOOST_TEST(missing.message() ==
             "cannot read /nonexistent-proc/stat: No such file or directory (is /proc mounted?)");
}

BOOST_AUTO_TEST_CASE(live_process_figures_are_plausible) {
  for (const int pid : {0, static_cast<int>(::getpid())}) {
    ProcessSampler sampler(pid);
    ProcessSample s;
    BOOST_REQUIRE(!sampler.sample(s));
    BOOST_TEST(s.cpu_percent >= 0.0);
    timespec start{}, now{};
    ::clock_gettime(CLOCK_MONOTONIC, &start);
    do ::clock_gettime(CLOCK_MONOTONIC, &now); // spin ~200 ms: about one core busy
    while ((now.tv_sec - start.tv_sec) * 1e3 + (now.tv_nsec - start.tv_nsec) / 1e6 < 200);
    const Error err = sampler.sample(s);
    BOOST_REQUIRE_MESSAGE(!err, err.message());
    BOOST_TEST_MESSAGE("pid " << pid << ": cpu " << s.cpu_percent << " %, rss " << s.rss_bytes << ", threads "
                              << s.threads);
    BOOST_TEST(s.cpu_percent > 5.0); // even a loaded machine gives the spin some share
    BOOST_TEST(s.cpu_percent <= 100.0 * ::sysconf(_SC_NPROCESSORS_ONLN) + 10);
    BOOST_TEST(s.rss_bytes > 0.0);
    BOOST_TEST(s.threads >= 1.0);
  }
}

BOOST_AUTO_TEST_CASE(sampling_is_cheap_and_allocates_nothing_once_warm) {
  TempDir tmp;
  HostSampler host(tmp.str());
  ProcessSampler self(0);
  HostSample hs;
  ProcessSample ps;
  for (int i = 0; i < 2; ++i) {
    BOOST_REQUIRE(!host.sample(hs));
    BOOST_REQUIRE(!self.sample(ps));
  }
  constexpr int rounds = 200;
  timespec t0{}, t1{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  const std::size_t before = allocations.load();
  bool ok = true;
  for (int i = 0; i < rounds; ++i) {
    ok = !host.sample(hs) && ok;
    ok = !self.sample(ps) && ok;
  }
  const std::size_t allocated = allocations.load() - before;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  BOOST_TEST(ok);
  BOOST_TEST(allocated == 0u);
  const double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / rounds;
  BOOST_TEST_MESSAGE("one host and one process sample: " << us << " us of CPU");
  // 1 % of a core at a 0.1 s interval is 1 ms per sample.
  BOOST_TEST(us < 1000.0);
}
