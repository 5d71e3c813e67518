#include "actors/run_events.hpp"

#include "io/store/event_log.hpp"
#include "runtime/core/wire.hpp"

namespace chorus::actors {

std::vector<std::vector<char>> RunEvents::frames(std::uint64_t next_seq) {
  std::vector<std::vector<char>> out;
  for (const core::EventDraft& d : watch.take()) {
    const std::string line = store::event_line(d, next_seq++);
    core::wire::EventRecord r;
    r.kind = d.kind;
    r.ts_us = d.ts_us;
    r.rank = d.rank;
    r.step = d.step;
    r.state = d.state;
    r.key = d.key;
    r.message = d.message;
    r.ranks = d.ranks;
    r.json = line;
    out.push_back(core::wire::event(r));
  }
  return out;
}

} // namespace chorus::actors
