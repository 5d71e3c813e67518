// What may enter an actor's mailbox. CAF acts on a system message (an exit,
// a down, an error) from whoever sends it: an exit with reason `kill` stops
// any actor, whatever its exit handler, and an exit, error or down message
// can come from any process that reaches the actor over a link. chorus's
// actors are spawned Guarded: their mailbox takes such a message only from
// the actor it is about (the linked or monitored actor that ended, whose own
// exit CAF sends on its behalf), and an exit or error only from an actor of
// this process. Anything else is dropped before it is queued, and said once
// per actor. Stopping one of them is therefore `self->send_exit(...)` from an
// actor of this process, or a monitor of its parent (stop_with), never
// `caf::anon_send_exit`.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/detail/init_fun_factory.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/system_messages.hpp>

#include <atomic>
#include <utility>

namespace chorus::actors {

/// Why `x` may not enter the mailbox of an actor of node `here` (a static
/// description), or null where it may.
[[nodiscard]] const char* refused_system_message(const caf::mailbox_element& x, const caf::node_id& here);

/// Says, once per actor, that `actor` dropped a system message and why.
void report_refused(const char* actor, const char* why, const caf::mailbox_element& x, std::atomic<bool>& said);

/// An actor of type Base (a stateful or class-based actor) whose mailbox
/// refuses the system messages above.
template <class Base>
class Guarded : public Base {
public:
  using Base::Base;

  void enqueue(caf::mailbox_element_ptr ptr, caf::execution_unit* eu) override {
    if (ptr) {
      if (const char* why = refused_system_message(*ptr, this->node())) {
        // An actor already ending is past being stopped: what reaches it then
        // (the exit of a linked actor that its own end released, which CAF
        // sends in no one's name) is dropped without a word.
        if (!this->getf(caf::abstract_actor::is_shutting_down_flag | caf::abstract_actor::is_cleaned_up_flag |
                        caf::abstract_actor::is_terminated_flag))
          report_refused(this->name(), why, *ptr, said_);
        return;
      }
    }
    Base::enqueue(std::move(ptr), eu);
  }

private:
  std::atomic<bool> said_{false};
};

/// Spawns the function-based actor `fun(self, xs...)` Guarded, with spawn
/// options `Os` (as actor_system::spawn does for an unguarded one).
template <caf::spawn_options Os = caf::no_spawn_options, class F, class... Ts>
caf::infer_handle_from_fun_t<F> spawn_guarded(caf::actor_system& sys, F fun, Ts&&... xs) {
  using impl = Guarded<caf::infer_impl_from_fun_t<F>>;
  caf::actor_config cfg;
  caf::detail::init_fun_factory<impl, F> factory;
  cfg.init_fun = factory(std::move(fun), std::forward<Ts>(xs)...);
  return sys.spawn_class<impl, Os>(cfg);
}

/// Spawns the class-based actor C Guarded.
template <class C, caf::spawn_options Os = caf::no_spawn_options, class... Ts>
auto spawn_guarded_class(caf::actor_system& sys, Ts&&... xs) {
  return sys.spawn<Guarded<C>, Os>(std::forward<Ts>(xs)...);
}

/// `self` stops when `parent` does (with its reason, else user_shutdown, so
/// that what is linked to `self` stops too): a monitor rather than a link,
/// so that a child that fails does not take its parent along. The actor's
/// down handler is this one.
template <class Self>
void stop_with(Self* self, const caf::actor_addr& parent) {
  if (!parent) return;
  // Held while the monitor is set: CAF 0.17 monitors an address through a
  // raw pointer, and a parent that ended before this actor started (a
  // blocking helper starts late under load) would be called while it is
  // destroyed. One that is gone already stops this actor at once.
  const caf::strong_actor_ptr alive = caf::actor_cast<caf::strong_actor_ptr>(parent);
  if (!alive) {
    self->quit(caf::exit_reason::user_shutdown);
    return;
  }
  self->monitor(alive);
  self->set_down_handler([self, parent](caf::down_msg& dm) {
    if (dm.source == parent) self->quit(dm.reason ? std::move(dm.reason) : caf::exit_reason::user_shutdown);
  });
}

} // namespace chorus::actors
