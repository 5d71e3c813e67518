// How a process's runs end when the process does, so that every way a job
// ends is recorded truthfully without a manual step (README, "How a run
// ends"):
// - SIGTERM, SIGINT or SIGHUP (where their disposition is the default):
//   every live run of the process finishes with its rank `killed`, naming
//   the signal (bounded by finish_timeout), then the signal is raised again
//   so that the process ends with its usual status (143 for SIGTERM). The
//   same signal again meanwhile (Ctrl-C twice) makes the run hosts' WALs
//   durable and ends the process at once; another one lets the finish go on;
// - std::terminate: `failed`, with the exception's text, exit code 134;
// - exit(N) (and a return from main): a run still live finishes `failed`
//   with code N where N is not 0, `finished` otherwise; a run that finished
//   but whose handle is still held tells its run host that its process then
//   exited with N, which fails the rank and the run.
#pragma once

#include <chorus/chorus.hpp>


namespace chorus::client {

class RunImpl;

namespace endings {

/// A run of this process started: it is ended as above. The first call
/// installs the signal handlers, the exit handler and the terminate handler.
void watch(RunImpl& run);
/// Registers the exit handler again, where it was installed: exit() runs
/// the latest first, and destroys the statics made since the first before
/// that one. A thread that started a run's actors after init had returned
/// (actors/system.cpp) calls it, so that the runs end at exit while what
/// their actors made is whole. Only the first of them to run does the work.
void register_exit_again() noexcept;
/// The run is being freed.
void unwatch(RunImpl& run) noexcept;

/// A Run handle that an interpreter's finalization lets go before the
/// process exits (Python): it stays live, and the exit status, once known,
/// ends it (above). It is never freed: the process is ending.
void keep_until_exit(Run&& run) noexcept;

/// The run host's WAL (its file descriptor): made durable by a second
/// signal, which ends the process at once.
void note_wal(int fd) noexcept;
void forget_wal(int fd) noexcept;

} // namespace endings
} // namespace chorus::client
