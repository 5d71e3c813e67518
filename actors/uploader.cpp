#include "actors/uploader.hpp"

#include "io/upload/upload.hpp"

#include <cstdio>
#include <thread>

namespace chorus::actors {
namespace {

/// How long one poke may start requests before the actor looks at its
/// mailbox again. A request it started runs to its own timeout (the HTTP
/// layer's caps), so a slow or distant server still answers; the drain at
/// the run's finish cuts one still in flight then (see the front below).
constexpr std::chrono::milliseconds slice{3'000};

struct UploaderState {
  std::shared_ptr<upload::Uploader> up;
  upload::SteadyTime timer_at = upload::SteadyTime::max(); // when the armed self-timer fires
  static inline const char* name = "chorus.uploader";
};

using sender_ptr = uploader_actor::stateful_pointer<UploaderState>;

void pump_some(sender_ptr self) {
  auto& st = self->state;
  const auto now = std::chrono::steady_clock::now();
  const upload::Uploader::Progress p = st.up->pump(now + slice);
  if (p.done || p.stopped || p.caught_up) return; // new data comes with the next poke
  const upload::SteadyTime at = p.wait_until ? *p.wait_until : now;
  if (at >= st.timer_at && st.timer_at > now) return; // a timer will come sooner
  st.timer_at = at;
  self->delayed_send(self, std::chrono::duration_cast<std::chrono::milliseconds>(at - now), upload_atom::value);
}

/// How long, while the run finishes, a target that has not answered since
/// its last failure (or at all) may leave a request unanswered: long enough
/// for a distant server to answer a small request, short beside the drain's
/// bound, which a target that answers keeps whole.
constexpr std::chrono::milliseconds drain_silence{5'000};

std::string size_text(std::uint64_t bytes) {
  char buf[32];
  if (bytes < 1024) std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  else if (bytes < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

/// Sends what is left, the end state last, until it is delivered, the
/// target stops the upload, `deadline` comes, or the target proves
/// unreachable. A target that refuses connections or leaves requests
/// unanswered gets no more tries then: the rest waits for `chorus sync`
/// instead of holding the finish to its bound, while one that answers, however
/// slowly, keeps the whole bound. Returns what is left: bytes of history
/// and system metrics, and no error, or an upload_incomplete one that names
/// what is left and the command that sends it (also printed).
std::pair<std::uint64_t, Error> drain(upload::Uploader& up, upload::SteadyTime deadline) {
  // A target the live upload found down may be back: it gets one try now,
  // not after the rest of its backoff.
  if (up.unreachable()) up.retry_now();
  upload::Uploader::Progress p;
  for (;;) {
    p = up.pump(deadline);
    if (p.done || p.stopped || std::chrono::steady_clock::now() >= deadline || up.unreachable()) break;
    if (p.wait_until) {
      if (*p.wait_until >= deadline) break; // the next try could not start in time
      std::this_thread::sleep_until(*p.wait_until);
    } else if (p.caught_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50)); // the end state is not on disk yet
    }
  }
  if (p.done) return {0, Error()};
  const std::uint64_t left = up.bytes_pending();
  const std::string run_dir = up.state_path().substr(0, up.state_path().rfind("/upload/"));
  std::string what = left > 0 ? size_text(left) + " of history and system metrics and the run's end state"
                              : std::string("the run's end state");
  std::string line = "upload to " + up.target().url + ": " + what + " not uploaded yet";
  if (!p.error.empty()) line += " (" + p.error + ")";
  line += "; what is left stays in the run directory, and ";
  if (p.stopped) line += "once that is changed, ";
  line += "`chorus sync " + run_dir + " --to " + up.target().url + "` sends it";
  std::fprintf(stderr, "chorus: %s\n", line.c_str());
  return {left, Error(Errc::upload_incomplete, std::move(line))};
}

uploader_actor::behavior_type upload_sender(sender_ptr self, std::shared_ptr<upload::Uploader> up) {
  self->state.up = std::move(up);
  return {
      [self](upload_atom) {
        if (std::chrono::steady_clock::now() >= self->state.timer_at) self->state.timer_at = upload::SteadyTime::max();
        pump_some(self);
      },
      [self](upload_drain_atom, std::int64_t ms) -> caf::result<std::uint64_t, WireError> {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(ms, 0));
        auto [left, failure] = drain(*self->state.up, deadline);
        return {left, WireError(failure)};
      },
  };
}

/// What the Run talks to: it never blocks, so a drain reaches the sender's
/// request in flight (a poke's, which may run to its own timeout) and cuts
/// it at the drain's end; and so does the Run's exit, so that neither
/// finish nor shutdown waits for a slow server.
uploader_actor::behavior_type uploader(uploader_actor::pointer self, std::shared_ptr<upload::Uploader> up,
                                       uploader_actor sender, caf::actor_addr run) {
  self->link_to(sender);
  // An uploader outlives no run.
  stop_with(self, run);
  self->attach_functor([up] { up->cut_requests_at(std::chrono::steady_clock::now()); });
  return {
      [self, sender](upload_atom a) { self->send(sender, a); },
      [self, up, sender](upload_drain_atom a, std::int64_t ms) {
        up->cut_requests_at(std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(ms, 0)));
        // Here, not in the sender: a request of the live upload to a target
        // that does not answer may be in flight, and the sender sees the
        // drain only once that request ends.
        up->limit_silence(drain_silence);
        return self->delegate(sender, a, ms);
      },
  };
}

} // namespace

uploader_actor spawn_uploader(caf::actor_system& sys, const std::string& run_dir, const std::string& url,
                          upload::UploadSettings settings, Blocking blocking, caf::actor_addr run,
                          caf::actor* sender_out) {
  auto target = upload::UploadTarget::parse(url);
  if (!target) {
    std::fprintf(stderr, "chorus: %s; the run is kept locally only\n", target.error().message().c_str());
    return {};
  }
  auto up = std::make_shared<upload::Uploader>(run_dir, *target, settings);
  if (Error e = up->open()) {
    std::fprintf(stderr, "chorus: upload to %s: %s; the run is kept locally (`chorus sync` can upload it later)\n",
                 target->url.c_str(), e.message().c_str());
    return {};
  }
  // Detached: a request blocks its thread for up to its timeout.
  auto sender = spawn_blocking(sys, blocking, upload_sender, up);
  if (sender_out != nullptr) *sender_out = caf::actor_cast<caf::actor>(sender);
  return spawn_guarded(sys, uploader, std::move(up), std::move(sender), std::move(run));
}

} // namespace chorus::actors
