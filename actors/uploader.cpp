#include "actors/uploader.hpp"

#include "io/upload.hpp"

#include <cstdio>
#include <thread>

namespace chorus::detail {
namespace {

/// How long one poke may start requests before the actor looks at its
/// mailbox again. A request it started runs to its own timeout (the HTTP
/// layer's caps), so a slow or distant server still answers; the drain at
/// the run's finish cuts one still in flight then (see the front below).
constexpr std::chrono::milliseconds slice{3'000};

struct UploaderState {
  std::shared_ptr<io::Uploader> up;
  io::SteadyTime timer_at = io::SteadyTime::max(); // when the armed self-timer fires
  static inline const char* name = "chorus.uploader";
};

using uploader_actor = caf::stateful_actor<UploaderState>;

void pump_some(uploader_actor* self) {
  auto& st = self->state;
  const auto now = std::chrono::steady_clock::now();
  const io::Uploader::Progress p = st.up->pump(now + slice);
  if (p.done || p.stopped || p.caught_up) return; // new data comes with the next poke
  const io::SteadyTime at = p.wait_until ? *p.wait_until : now;
  if (at >= st.timer_at && st.timer_at > now) return; // a timer will come sooner
  st.timer_at = at;
  self->delayed_send(self, std::chrono::duration_cast<std::chrono::milliseconds>(at - now), upload_atom::value);
}

caf::behavior upload_sender(uploader_actor* self, std::shared_ptr<io::Uploader> up) {
  self->state.up = std::move(up);
  return {
      [self](upload_atom) {
        if (std::chrono::steady_clock::now() >= self->state.timer_at) self->state.timer_at = io::SteadyTime::max();
        pump_some(self);
      },
      [self](upload_drain_atom, std::int64_t ms) -> bool {
        auto& up = *self->state.up;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(ms, 0));
        io::Uploader::Progress p;
        for (;;) {
          p = up.pump(deadline);
          if (p.done || p.stopped || std::chrono::steady_clock::now() >= deadline) break;
          if (p.wait_until) std::this_thread::sleep_until(std::min(*p.wait_until, deadline));
          else if (p.caught_up) std::this_thread::sleep_for(std::chrono::milliseconds(50)); // the end state is not on disk yet
        }
        if (!p.done) {
          std::fprintf(stderr,
                       "chorus: upload to %s: %.1f MiB of history and system metrics not uploaded yet%s%s; %s`chorus sync "
                       "%s --to %s` sends them\n",
                       up.target().url.c_str(), static_cast<double>(up.bytes_pending()) / 1048576.0,
                       p.error.empty() ? "" : " (", p.error.empty() ? "" : (p.error + ")").c_str(),
                       p.stopped ? "once that is changed, " : "",
                       self->state.up->state_path().substr(0, self->state.up->state_path().rfind("/upload/")).c_str(),
                       up.target().url.c_str());
        }
        return p.done;
      },
  };
}

/// What the Run talks to: it never blocks, so a drain reaches the sender's
/// request in flight (a poke's, which may run to its own timeout) and cuts
/// it at the drain's end; and so does the Run's exit, so that neither
/// finish nor shutdown waits for a slow server.
caf::behavior uploader(caf::event_based_actor* self, std::shared_ptr<io::Uploader> up, caf::actor sender) {
  self->link_to(sender);
  self->attach_functor([up] { up->cut_requests_at(std::chrono::steady_clock::now()); });
  return {
      [self, sender](upload_atom a) { self->send(sender, a); },
      [self, up, sender](upload_drain_atom a, std::int64_t ms) {
        up->cut_requests_at(std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<std::int64_t>(ms, 0)));
        return self->delegate(sender, a, ms);
      },
  };
}

} // namespace

caf::actor spawn_uploader(caf::actor_system& sys, const std::string& run_dir, const std::string& url,
                          std::size_t read_bytes) {
  Error err;
  auto target = io::UploadTarget::parse(url, err);
  if (!target) {
    std::fprintf(stderr, "chorus: %s; the run is kept locally only\n", err.message().c_str());
    return {};
  }
  io::UploadSettings settings;
  settings.read_bytes = read_bytes;
  auto up = std::make_shared<io::Uploader>(run_dir, *target, settings);
  if (Error e = up->open()) {
    std::fprintf(stderr, "chorus: upload to %s: %s; the run is kept locally (`chorus sync` can upload it later)\n",
                 url.c_str(), e.message().c_str());
    return {};
  }
  // Detached: a request blocks its thread for up to its timeout.
  auto sender = sys.spawn<caf::detached>(upload_sender, up);
  return sys.spawn(uploader, std::move(up), std::move(sender));
}

} // namespace chorus::detail
