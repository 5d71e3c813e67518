#include "actors/run_events.hpp"

#include "io/store/event_log.hpp"
#include "runtime/core/wire.hpp"

namespace chorus::detail {

void RunEvents::joined(int rank, std::string host, std::int64_t pid, std::int64_t now_us) {
  if (rank < 0) return;
  if (static_cast<std::size_t>(rank) >= where_.size()) where_.resize(static_cast<std::size_t>(rank) + 1);
  watch.rank_joined(rank, host, pid, now_us);
  where_[static_cast<std::size_t>(rank)] = Where{std::move(host), pid};
}

std::vector<std::vector<char>> RunEvents::frames(std::uint64_t next_seq) {
  std::vector<std::vector<char>> out;
  for (EventDraft& d : watch.take()) {
    if (d.rank >= 0 && static_cast<std::size_t>(d.rank) < where_.size()) {
      const Where& w = where_[static_cast<std::size_t>(d.rank)];
      if (d.host.empty()) d.host = w.host;
      if (d.pid < 0) d.pid = w.pid;
    }
    const std::string line = io::event_line(d, next_seq++);
    wire::EventRecord r;
    r.kind = d.kind;
    r.ts_us = d.ts_us;
    r.rank = d.rank;
    r.step = d.step;
    r.state = d.state;
    r.key = d.key;
    r.message = d.message;
    r.ranks = d.ranks;
    r.json = line;
    out.push_back(wire::event(r));
  }
  return out;
}

} // namespace chorus::detail
