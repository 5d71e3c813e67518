#include "actors/guard.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_control_block.hpp>
#include <caf/error.hpp>

#include <cstdio>
#include <string>

namespace chorus::actors {
namespace {

/// The sender is the actor the message is about.
bool sent_by(const caf::mailbox_element& x, const caf::actor_addr& source) {
  return x.sender && source && caf::actor_cast<caf::actor_addr>(x.sender) == source;
}

bool local_sender(const caf::mailbox_element& x, const caf::node_id& here) {
  return x.sender && x.sender->node() == here;
}

} // namespace

const char* refused_system_message(const caf::mailbox_element& x, const caf::node_id& here) {
  const caf::type_erased_tuple& content = x.content();
  if (content.size() != 1) return nullptr;
  if (content.match_elements<caf::exit_msg>()) {
    const auto& em = content.get_as<caf::exit_msg>(0);
    // Sent by the actor that ends (a link), or by an actor of this process that stops this one.
    if (sent_by(x, em.source) && local_sender(x, here)) return nullptr;
    return "an exit message not sent by an actor of this process in its own name";
  }
  if (content.match_elements<caf::down_msg>()) {
    const auto& dm = content.get_as<caf::down_msg>(0);
    // CAF sends a monitored actor's down message in that actor's name.
    if (sent_by(x, dm.source)) return nullptr;
    return "a down message not sent in the name of the actor it reports";
  }
  // An error that answers a request is a response; one sent as a message stops the actor.
  if (content.match_elements<caf::error>() && !x.mid.is_response()) {
    if (local_sender(x, here)) return nullptr;
    return "an error message from outside this process";
  }
  return nullptr;
}

void report_refused(const char* actor, const char* why, const caf::mailbox_element& x, std::atomic<bool>& said) {
  if (said.exchange(true)) return;
  std::string from = "an anonymous sender";
  if (x.sender) from = "actor " + std::to_string(x.sender->id()) + " of node " + caf::to_string(x.sender->node());
  std::fprintf(stderr,
               "chorus: %s dropped %s (from %s): only the actor a link or monitor is about, and this process's own "
               "actors, may stop chorus's actors; the message changed nothing (said once per actor)\n",
               actor, why, from.c_str());
}

} // namespace chorus::actors
