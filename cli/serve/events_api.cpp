#include "cli/serve/events_api.hpp"

#include "cli/cli.hpp"
#include "cli/serve/followed_file.hpp"
#include "io/store/event_log.hpp"
#include "runtime/core/json.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

namespace chorus::cli::serve {
namespace {

/// A number for each reading of a file, unique in the process: a page that
/// holds events of another reading asks for them all again.
std::atomic<std::uint64_t> generations{0};

void file_state(core::JsonWriter& w, const IndexState& s) {
  w.key("rows").uinteger(s.rows).key("skipped").uinteger(s.skipped);
  w.key("first_skipped").string(s.first_skipped).key("unfinished").boolean(s.unfinished);
  w.key("missing").boolean(s.missing).key("last_step").integer(s.last_step).key("bytes").uinteger(s.bytes);
  w.key("indexing").boolean(s.indexing);
  if (s.problem) w.key("error").string(s.problem.message());
}

} // namespace

struct EventsApi::Log {
  explicit Log(const std::string& dir) : file(dir + "/" + store::events_file), generation(++generations) {}

  /// Reads on: the complete lines appended since the last look.
  void refresh() {
    file.follow(
        step_bytes,
        [this] {
          kept.clear();
          bytes = 0;
          left_out = 0;
          generation = ++generations;
        },
        [this](std::string_view line, std::uint64_t) -> std::string {
          const Result<store::EventLine> e = store::parse_event_line(line);
          if (!e) return e.error().message();
          IndexState& s = file.counts();
          if (e->event.step > s.last_step) s.last_step = e->event.step;
          // The line itself, which parse_event_line found whole and valid: every field it has.
          kept.push_back({s.rows++, std::move(e->event.json)});
          bytes += kept.back().json.size();
          while (kept.size() > max_events || bytes > max_bytes) {
            bytes -= kept.front().json.size();
            kept.pop_front();
            ++left_out;
          }
          return {};
        });
    memory = sizeof(Log) + bytes + kept.size() * sizeof(Kept);
  }

  struct Kept {
    std::uint64_t ordinal; // its place among the events of the file, from 0
    std::string json;
  };

  std::mutex mutex; // guards everything below but `used` and `memory`
  FollowedFile file;
  std::deque<Kept> kept;
  std::size_t bytes = 0;       // of the JSON kept
  std::uint64_t left_out = 0;  // events read and no longer kept (the oldest)
  std::uint64_t generation;
  std::atomic<std::uint64_t> used{0};
  std::atomic<std::size_t> memory{sizeof(Log)};
};

EventsApi::EventsApi(const Api& api) : api_(api) {}
EventsApi::~EventsApi() = default;

std::shared_ptr<EventsApi::Log> EventsApi::log(const std::string& dir) {
  std::shared_ptr<Log> l;
  {
    std::lock_guard lock(mutex_);
    auto& slot = logs_[dir];
    if (!slot) slot = std::make_shared<Log>(dir);
    l = slot;
    l->used = ++clock_;
  }
  {
    std::lock_guard lock(l->mutex);
    l->refresh();
  }
  evict();
  return l;
}

void EventsApi::evict() {
  std::lock_guard lock(mutex_);
  for (;;) {
    std::size_t total = 0;
    auto oldest = logs_.end();
    for (auto it = logs_.begin(); it != logs_.end(); ++it) {
      total += it->second->memory;
      // One in use elsewhere (a request, an event stream) stays.
      if (it->second.use_count() == 1 && (oldest == logs_.end() || it->second->used < oldest->second->used))
        oldest = it;
    }
    if (total <= max_total_bytes || oldest == logs_.end()) return;
    logs_.erase(oldest);
  }
}

std::size_t EventsApi::cached_bytes() {
  std::lock_guard lock(mutex_);
  std::size_t total = 0;
  for (const auto& [dir, l] : logs_) total += l->memory;
  return total;
}

Reply EventsApi::events(std::string_view rel, std::string_view after_text) {
  const Resolved where = api_.resolve_run(rel);
  if (!where) return refusal(where.status, where.why);
  std::uint64_t after = 0;
  if (!after_text.empty()) {
    const std::optional<std::int64_t> n = parse_int(after_text, 0, INT64_MAX);
    if (!n) return refusal(400, "after is a whole number of 0 or more (the rows of an earlier answer)");
    after = static_cast<std::uint64_t>(*n);
  }
  const std::shared_ptr<Log> l = log(where.dir);
  std::lock_guard lock(l->mutex);
  std::string out;
  core::JsonWriter w(out);
  w.begin_object().key("run").string(rel);
  file_state(w, l->file.state());
  w.key("generation").uinteger(l->generation).key("after").uinteger(after);
  w.key("left_out").uinteger(l->left_out).key("kept").uinteger(l->kept.size());
  w.key("events").begin_array();
  // The kept events are in the file's order: those after the first `after` are its last ones.
  auto first = std::partition_point(l->kept.begin(), l->kept.end(), [&](const Log::Kept& k) { return k.ordinal < after; });
  for (; first != l->kept.end(); ++first) w.raw(first->json);
  w.end_array().end_object();
  return {200, std::move(out)};
}

std::string EventsApi::changes(std::string_view rel, EventsSeen& seen) {
  const Resolved where = api_.resolve_run(rel);
  if (!where) return {};
  const std::shared_ptr<Log> l = log(where.dir);
  std::lock_guard lock(l->mutex);
  const IndexState s = l->file.state();
  const std::string problem = s.problem ? s.problem.message() : std::string();
  if (seen.started && s.rows + s.skipped == seen.lines && l->generation == seen.generation &&
      s.unfinished == seen.unfinished && s.missing == seen.missing && problem == seen.problem)
    return {};
  seen = {true, s.rows + s.skipped, l->generation, s.unfinished, s.missing, problem};
  std::string out = "event: events\ndata: ";
  core::JsonWriter w(out);
  w.begin_object().key("run").string(rel);
  file_state(w, s);
  w.key("generation").uinteger(l->generation).key("left_out").uinteger(l->left_out);
  w.end_object();
  out += "\n\n";
  return out;
}

} // namespace chorus::cli::serve
