#include "cli/run_events.hpp"

#include "cli/cli.hpp"

#include <chrono>

namespace chorus::cli {
namespace {

/// The most of the file one poll reads: events.jsonl grows by a line per
/// event, so this is the whole of it in practice; a longer one is read on
/// at the next poll.
constexpr std::uint64_t poll_budget = 64u << 20;

} // namespace

RunEvents::RunEvents(const std::string& run_dir)
    : path_(run_dir + "/" + store::events_file), file_(path_) {}

std::vector<RunEvents::Read> RunEvents::poll() {
  std::vector<Read> out;
  file_.follow(
      poll_budget, [] {},
      [&](std::string_view line, std::uint64_t) -> std::string {
        Result<store::EventLine> parsed = store::parse_event_line(line);
        if (!parsed) return parsed.error().message();
        // A file read afresh (chorus recover rebuilt it) holds the events handed out already.
        if (last_seq_ && parsed->seq <= *last_seq_) return {};
        last_seq_ = parsed->seq;
        if (parsed->event.kind == EventKind::run_finished)
          last_finish_ = parsed->event;
        else
          last_finish_.reset();
        out.push_back({std::move(*parsed), std::string(line)});
        return {};
      });
  return out;
}

Error RunEvents::problem() const { return file_.state().problem; }

std::uint64_t RunEvents::skipped() const { return file_.state().skipped; }

std::string RunEvents::first_skipped() const { return file_.state().first_skipped; }

std::string event_time(const Event& e) {
  return format_time(std::chrono::duration<double>(e.time.time_since_epoch()).count());
}

} // namespace chorus::cli
