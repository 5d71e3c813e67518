// <chorus/caf.hpp>: chorus's actors in an orchestrator's actor system, and
// the rank's proxy as a typed handle for the orchestrator's actors.
#include <chorus/caf.hpp>

#include "runtime/client/run_impl.hpp"
#include "actors/system.hpp"
#include "runtime/client/system.hpp"
#include "runtime/core/options.hpp"

namespace chorus::actors {

Error configure(caf::actor_system_config& cfg, const Options& opts) noexcept {
  try {
    cfg.add_message_type<Event>("chorus::Event");
    const Result<core::Settings> s = core::resolve(opts, core::process_env());
    if (!s) return s.error();
    if (!s->active) return {}; // an inactive rank links nothing
    if (Error e = configure_system(cfg, *s)) return e;
    // Renders the proxy's errors (to_error reads them back).
    cfg.add_error_category(error_category, [](std::uint8_t code, caf::atom_value, const caf::message& context) {
      std::string out = "chorus error: ";
      out.append(to_string(static_cast<Errc>(code)));
      if (context.match_elements<std::string>()) out.append(": ").append(context.get_as<std::string>(0));
      return out;
    });
    return {};
  } catch (const std::exception& e) {
    return {Errc::internal, std::string("configure failed: ") + e.what()};
  }
}

Run init(caf::actor_system& sys, const Options& opts, Error& error) noexcept {
  return client::RunAccess::init(opts, error, &sys);
}

Run init(caf::actor_system& sys, const Options& opts) {
  Error error;
  Run run = init(sys, opts, error);
  if (error) throw InitError(std::move(error));
  return run;
}

rank_proxy proxy(const Run& run) noexcept {
  const client::RunImpl* impl = client::live(client::RunAccess::impl(run));
  if (impl == nullptr || impl->system() == nullptr) return {};
  return caf::actor_cast<rank_proxy>(impl->system()->proxy());
}

Error subscribe(const Run& run, const caf::actor& subscriber) noexcept {
  if (!subscriber) return {Errc::invalid_argument, "subscribe: the subscriber's handle is invalid: pass a live actor"};
  client::RunImpl* impl = client::live(client::RunAccess::impl(run));
  if (impl == nullptr)
    return {Errc::invalid_argument, "subscribe: the run is inactive on this rank (nothing is logged here, and no "
                                    "event comes): subscribe on a rank that logs into the run"};
  try {
    impl->events().add_sink(detail::event_sender(subscriber));
  } catch (const std::exception& e) {
    return {Errc::internal, std::string("subscribe failed: ") + e.what()};
  }
  return {};
}

} // namespace chorus::actors
