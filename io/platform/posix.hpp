// Small POSIX helpers shared by the io/ files: errors that name the cause and
// the fix, private file creation, and writes that survive EINTR and short counts.
#pragma once

#include "runtime/core/result.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/uio.h>

namespace chorus::platform {

/// Errc::io_error "<what> on <path>: <strerror(errnum)>. <fix>", the fix
/// chosen from errnum; `elsewhere` says how to write somewhere else instead.
/// "alice (uid 1000)", or "uid 1000" for an id without a name: whose a
/// file is, or who a process runs as, in an error.
[[nodiscard]] std::string user_named(unsigned uid);

[[nodiscard]] Error os_error(std::string_view what, std::string_view path, int errnum,
                             std::string_view elsewhere = "point CHORUS_DIR at another filesystem");

/// open(2) with O_CLOEXEC, creating with mode 0600 whatever the umask, and
/// putting an existing file's mode back to 0600. Like open_regular, it follows
/// no link in the last part of `path`, never blocks on a FIFO and refuses what
/// is not a regular file. Returns the descriptor, or why it could not be opened.
/// `st`, where given: the file's stat as it was opened (before any fchmod).
[[nodiscard]] Result<int> open_private(const std::string& path, int flags, struct stat* st = nullptr);

/// Opens an existing regular file of a run directory for reading (or with
/// `flags`, O_RDWR say) without following a symbolic link in its last part
/// and without blocking: a FIFO, device, socket or directory planted where a
/// run file belongs is refused with an error naming it, instead of hanging
/// the reader or letting it truncate a file elsewhere. Returns the
/// descriptor, or why it could not be opened; with `missing_ok`, a file that
/// does not exist is descriptor -1 and no error.
[[nodiscard]] Result<int> open_regular(const std::string& path, int flags, bool missing_ok = false);

/// Writes every byte of `iov[0..n)` (which it may modify), retrying on EINTR
/// and after short writes.
[[nodiscard]] Error write_all(int fd, iovec* iov, int n, std::string_view path);
[[nodiscard]] Error write_all(int fd, std::string_view data, std::string_view path);

/// fsync, or with `data_only` fdatasync, of the regular file `fd`, retried on
/// EINTR, and trusted only while the file system is still alive: ext4 can
/// return success from a sync that a forced shutdown (a dying device,
/// EXT4_IOC_SHUTDOWN) or an aborted journal raced, as jbd2 reports a
/// transaction that is no longer running or committing as done. Such a file
/// system fails every later read, so one byte read back from the page cache
/// tells the two apart (tests/e2e/disk_fault_test.cpp); open `fd` for
/// reading too, or that check is left out.
[[nodiscard]] Error sync_file(int fd, std::string_view path, bool data_only = false);

/// Starts writing `fd`'s dirty pages to the device without waiting: where
/// several files are synced together, each one's sync_file then waits for
/// its own writes, already under way, rather than starting them one file
/// after another. Only a hint: what fails shows in sync_file.
void start_writeback(int fd) noexcept;

/// Faults in, in one call, the whole pages of [`at`, `at` + `bytes`) that
/// a buffer is about to be written through, without changing a byte (so a
/// thread may write the buffer meanwhile): a fault taken page by page costs
/// a trap each, which a virtual machine can make 10-20 us. False where the
/// kernel cannot (before Linux 5.14): the pages then fault as they are written.
bool populate_for_write(void* at, std::size_t bytes) noexcept;

/// The largest run file (run.json, config.json, summary.json, group.json, an
/// offsets file) read_text takes: chorus writes them far smaller, so a bigger
/// one is damaged or planted, and is refused rather than allocated.
inline constexpr std::size_t run_file_max_bytes = 64u << 20;

/// The whole regular file (opened as open_regular does). A missing file is
/// Errc::io_error unless `missing_ok`, which reads as empty; a file over
/// `max_bytes` is Errc::io_error.
[[nodiscard]] Result<std::string> read_text(const std::string& path, bool missing_ok = false,
                                            std::size_t max_bytes = run_file_max_bytes);

/// Closes `fd`, retrying nothing (Linux releases the descriptor even on EINTR).
void close_fd(int fd) noexcept;

/// Wall-clock time in microseconds since the Unix epoch (the timestamps of
/// runs, rows and events).
[[nodiscard]] std::int64_t unix_now_us() noexcept;

/// A TCP connection to host:port, opened within `limit` (CAF 0.17's own
/// connect blocks for the kernel's full SYN timeout on an unreachable host):
/// non-blocking and close-on-exec, its descriptor in `out`; else why not,
/// and `out` is -1.
///
/// With nothing listening yet on a port of the kernel's ephemeral range, a
/// connect on the same machine may be given that very port as its own, and
/// TCP's simultaneous open joins the socket to itself. Such a connection
/// found nothing listening, and is closed with a reset: a normal close would
/// leave the port in TIME_WAIT for a minute, and the host, starting a moment
/// later, could not listen on it.
[[nodiscard]] Error tcp_connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds limit, int& out);

/// Where `port` lies in this machine's ephemeral range (the ports outgoing
/// connections are given, net.ipv4.ip_local_port_range), a sentence that
/// says so, to add to an error about listening on it; empty otherwise.
[[nodiscard]] std::string ephemeral_port_note(std::uint16_t port);

/// Raises this process's soft limit on open files to `want` where it is
/// lower, as far as its hard limit lets it (a run host keeps a connection a
/// rank open). No error where the limit is `want` or more now; else one
/// (bad_environment) that says how far short it is and how to raise it.
[[nodiscard]] Error raise_open_files(std::uint64_t want);

/// This machine's host name; empty if it cannot be read.
[[nodiscard]] std::string this_host();

/// The function `symbol` of the library `lib` (a dlopen handle, or
/// RTLD_NEXT) as a pointer of type F; null if the library has none.
template <class F>
[[nodiscard]] F dl_symbol(void* lib, const char* symbol) noexcept {
  return reinterpret_cast<F>(::dlsym(lib, symbol));
}

} // namespace chorus::platform
