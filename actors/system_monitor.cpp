#include "actors/system_monitor.hpp"

#include "io/platform/posix.hpp"
#include "io/sampling/system_metrics.hpp"

#include <cstdio>

namespace chorus::actors {

namespace {

struct MonitorState {
  std::function<std::unique_ptr<sampling::SystemSampler>()> make; // emptied once the sampler is made
  std::unique_ptr<sampling::SystemSampler> sampler;
  bool speak = false;
  run_actor run;
  std::chrono::microseconds interval{};
  std::uint32_t rank = 0;
  std::int64_t start_us = 0;
  std::string line;
  bool error_told = false;
  static inline const char* name = "chorus.system_monitor";
};

using monitor_ptr = system_monitor_actor::stateful_pointer<MonitorState>;

system_monitor_actor::behavior_type system_monitor(monitor_ptr self, run_actor run,
                                                   std::function<std::unique_ptr<sampling::SystemSampler>()> make,
                                                   std::chrono::microseconds interval, std::uint32_t rank,
                                                   std::int64_t start_us, bool speak) {
  auto& st = self->state;
  st.make = std::move(make);
  st.speak = speak;
  st.run = std::move(run);
  st.interval = interval;
  st.rank = rank;
  st.start_us = start_us;
  self->monitor(st.run);
  self->set_down_handler([self](caf::down_msg&) { self->quit(); });
  self->send(self, sample_atom::value);
  return {
      [self](sample_atom) {
        auto& st = self->state;
        if (st.make) {
          st.sampler = st.make();
          st.make = nullptr;
          if (st.speak && !st.sampler->notes().empty())
            std::fprintf(stderr, "chorus: system metrics: %s\n", st.sampler->notes().c_str());
        }
        // The next sample is scheduled first, so a slow one does not shift the rest.
        self->delayed_send(self, st.interval, sample_atom::value);
        const std::int64_t now = platform::unix_now_us();
        Error e = st.sampler->sample_line(st.line, now, static_cast<double>(now - st.start_us) / 1e6);
        if (e && !st.error_told) {
          st.error_told = true;
          std::fprintf(stderr, "chorus: system metrics of rank %u: %s (sampling goes on with what can be read)\n",
                       st.rank, e.message().c_str());
        }
        self->send(st.run, system_atom::value, st.rank, st.line);
      },
  };
}

} // namespace

system_monitor_actor spawn_system_monitor(caf::actor_system& sys, run_actor run,
                                          std::function<std::unique_ptr<sampling::SystemSampler>()> make,
                                          std::chrono::microseconds interval, std::uint32_t rank,
                                          std::int64_t start_us, bool speak) {
  return spawn_guarded(sys, system_monitor, std::move(run), std::move(make), interval, rank, start_us, speak);
}

} // namespace chorus::actors
