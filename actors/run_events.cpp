#include "actors/run_events.hpp"

#include "io/store/event_log.hpp"
#include "runtime/core/wire.hpp"

#include <iterator>

namespace chorus::detail {

void RunEvents::joined(int rank, std::string host, std::int64_t pid, std::int64_t now_us) {
  if (rank < 0) return;
  if (static_cast<std::size_t>(rank) >= where_.size()) where_.resize(static_cast<std::size_t>(rank) + 1);
  watch.rank_joined(rank, host, pid, now_us);
  where_[static_cast<std::size_t>(rank)] = Where{std::move(host), pid};
}

void RunEvents::ended_again(int rank, std::int32_t status, std::optional<RunState> new_end, std::int64_t now_us) {
  EventDraft& failed = late_.emplace_back();
  failed.kind = EventKind::rank_failed;
  failed.ts_us = now_us;
  failed.rank = rank;
  failed.state = RunState::failed;
  failed.reason = "its process exited with status " + std::to_string(status) + " after it finished";
  failed.message = "rank " + std::to_string(rank) + " failed after the run ended: " + failed.reason +
                   ". Look at its log for what went wrong at its exit";
  if (!new_end) return;
  EventDraft& end = late_.emplace_back();
  end.kind = EventKind::run_finished;
  end.ts_us = now_us;
  end.state = *new_end;
  end.message = "the run ended " + std::string(to_string(*new_end)) + " after all: rank " + std::to_string(rank) +
                "'s process exited with status " + std::to_string(status) + " after the run's end";
}

std::vector<std::vector<char>> RunEvents::frames(std::uint64_t next_seq) {
  std::vector<std::vector<char>> out;
  std::vector<EventDraft> drafts = watch.take();
  drafts.insert(drafts.end(), std::make_move_iterator(late_.begin()), std::make_move_iterator(late_.end()));
  late_.clear();
  for (EventDraft& d : drafts) {
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
