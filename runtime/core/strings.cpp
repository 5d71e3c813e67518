// The spellings of chorus's enums. Mode and Scope use the CHORUS_MODE and
// CHORUS_SCOPE spellings (Flyte's run_mode and rank_scope), so what run.json
// records can be pasted back into the environment.
#include "runtime/core/strings.hpp"

#include <chorus/chorus.hpp>

#include <csignal>

namespace chorus {

std::string_view to_string(Mode m) noexcept {
  switch (m) {
  case Mode::automatic: return "auto";
  case Mode::shared: return "shared";
  case Mode::per_rank: return "new";
  }
  return "unknown";
}

std::string_view to_string(Scope s) noexcept {
  switch (s) {
  case Scope::global: return "global";
  case Scope::node: return "worker";
  }
  return "unknown";
}

std::string_view to_string(Reduce r) noexcept {
  switch (r) {
  case Reduce::none: return "none";
  case Reduce::mean: return "mean";
  case Reduce::sum: return "sum";
  case Reduce::min: return "min";
  case Reduce::max: return "max";
  case Reduce::first: return "first";
  case Reduce::merge: return "merge";
  }
  return "unknown";
}

std::string_view to_string(Summary s) noexcept {
  switch (s) {
  case Summary::last: return "last";
  case Summary::min: return "min";
  case Summary::max: return "max";
  case Summary::mean: return "mean";
  }
  return "unknown";
}

std::string_view to_string(RunState s) noexcept {
  switch (s) {
  case RunState::running: return "running";
  case RunState::finished: return "finished";
  case RunState::failed: return "failed";
  case RunState::crashed: return "crashed";
  case RunState::killed: return "killed";
  case RunState::inactive: return "inactive";
  }
  return "unknown";
}

std::string_view to_string(EventKind k) noexcept {
  switch (k) {
  case EventKind::stalled: return "stalled";
  case EventKind::resumed: return "resumed";
  case EventKind::nonfinite: return "nonfinite";
  case EventKind::rank_failed: return "rank_failed";
  case EventKind::rank_killed: return "rank_killed";
  case EventKind::rank_lost: return "rank_lost";
  case EventKind::barrier_timeout: return "barrier_timeout";
  case EventKind::run_finished: return "run_finished";
  case EventKind::threshold: return "threshold";
  case EventKind::straggler: return "straggler";
  }
  return "unknown";
}

std::string_view to_string(Resume r) noexcept {
  switch (r) {
  case Resume::never: return "never";
  case Resume::allow: return "allow";
  case Resume::must: return "must";
  }
  return "unknown";
}

std::string_view to_string(Errc e) noexcept {
  switch (e) {
  case Errc::ok: return "ok";
  case Errc::invalid_argument: return "invalid_argument";
  case Errc::invalid_key: return "invalid_key";
  case Errc::bad_environment: return "bad_environment";
  case Errc::backwards_step: return "backwards_step";
  case Errc::step_committed: return "step_committed";
  case Errc::dropped: return "dropped";
  case Errc::finished: return "finished";
  case Errc::connect_failed: return "connect_failed";
  case Errc::address_in_use: return "address_in_use";
  case Errc::barrier_timeout: return "barrier_timeout";
  case Errc::barrier_mismatch: return "barrier_mismatch";
  case Errc::host_lost: return "host_lost";
  case Errc::timeout: return "timeout";
  case Errc::io_error: return "io_error";
  case Errc::internal: return "internal";
  case Errc::upload_incomplete: return "upload_incomplete";
  }
  return "unknown";
}

namespace core {

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string signal_name(int sig) {
  // The signals that end or interrupt a job (launchers, schedulers, a terminal).
  static constexpr std::pair<int, const char*> names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},   {SIGABRT, "SIGABRT"},
      {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"},
      {SIGUSR2, "SIGUSR2"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"},
  };
  for (const auto& [n, name] : names)
    if (n == sig) return name;
  std::string out = "signal ";
  out += std::to_string(sig);
  return out;
}

} // namespace core
} // namespace chorus
