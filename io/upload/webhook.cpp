// The webhook backend (CHORUS_UPLOAD=webhook://HOST[:PORT]/PATH, `chorus
// sync RUN --to webhook://...`; docs/UPLOADS.md, "Webhooks"): each event of
// the run's events.jsonl (io/store/event_log.hpp) POSTed as one JSON object,
// its line's own fields and a `text`, the one-line summary that Slack's and
// Mattermost's incoming webhooks show.
//
//   open    nothing to ask the server: the offsets say which events went;
//   send    one event a call, read through store::parse_event_line, then its
//           POST; the Uploader saves the offsets after each answer. The
//           rest of the run directory (history, system metrics, config,
//           summary, artifacts) is passed over: consumed, never sent.
//
// Exactly once, as far as the server's answers tell: an event counts as
// sent only after a 2xx, and its offset is then made durable before the
// next event goes (io/upload/offsets.hpp), so a restart, a live upload and
// `chorus sync` go on from the first event not answered. One whose answer
// was lost (a dropped connection, a timeout) is sent again: the server may
// then show it twice, and its Idempotency-Key header (the run's id and the
// event's seq) lets a server that honours it keep one.
//
// The run's end goes once its last event has: the run host writes run.json's
// end state before the events the end brings (run_finished, the last of an
// attempt; actors/run.cpp end_run), so a run seen ended may still be short of
// them. Its end waits, at most end_wait, for events.jsonl's last line to be
// a run_finished (not for a crashed run, whose host writes nothing more, nor
// for one made before chorus wrote events.jsonl).
//
// The URL's path is the webhook's secret (UploadTarget::path): it goes in
// the request only. Messages name the target as webhook://HOST/…, and the
// server's words are shown with any part of the path they echo cut out.
#include "io/platform/posix.hpp"
#include "io/store/event_log.hpp"
#include "io/upload/backends.hpp"
#include "runtime/core/json.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace chorus::upload {
namespace {

constexpr std::chrono::milliseconds request_cap{30'000};
/// How long a run seen ended may wait for its run_finished event, and how often it looks.
constexpr std::chrono::milliseconds end_wait{5'000};
constexpr std::chrono::milliseconds end_poll{100};

/// Whether the line of `dir`'s events.jsonl that ends at `at` (the last one
/// consumed) is a run_finished; nothing where the run has no events.jsonl
/// (made before chorus wrote one).
std::optional<bool> ends_finished(const std::string& dir, store::Cursor at) {
  const Result<int> fd = platform::open_regular(dir + "/" + store::events_file, O_RDONLY, /*missing_ok=*/true);
  if (!fd) return false; // unreadable: as a line not there yet
  if (*fd < 0) return std::nullopt;
  // An event's line is short: the last 64 KiB before `at` hold it whole.
  const std::uint64_t from = at.bytes > (64u << 10) ? at.bytes - (64u << 10) : 0;
  std::string tail(at.bytes - from, '\0');
  const ssize_t n = tail.empty() ? 0 : ::pread(*fd, tail.data(), tail.size(), static_cast<off_t>(from));
  platform::close_fd(*fd);
  if (n != static_cast<ssize_t>(tail.size()) || tail.empty() || tail.back() != '\n') return false;
  tail.pop_back();
  const std::size_t start = tail.rfind('\n');
  if (start == std::string::npos && from > 0) return false; // longer than 64 KiB: no event line
  const Result<store::EventLine> last = store::parse_event_line(std::string_view(tail).substr(start == std::string::npos ? 0 : start + 1));
  return last && last->event.kind == EventKind::run_finished;
}

/// `s` with every occurrence of `part` written "…".
void cut_out(std::string& s, std::string_view part) {
  if (part.empty()) return;
  for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 3)) s.replace(at, part.size(), "…");
}

/// What the event is, in a few words: "rank 3 stalled at step 12".
std::string what_happened(const store::EventLine& line) {
  const Event& e = line.event;
  const std::string rank = "rank " + std::to_string(e.rank);
  const std::string at = e.step >= 0 ? " at step " + std::to_string(e.step) : std::string();
  auto ranks = [&](std::string_view how) {
    if (e.ranks.empty()) return std::string();
    std::string out = e.ranks.size() == 1 ? " (rank " : " (ranks ";
    for (std::size_t i = 0; i < e.ranks.size(); ++i) out += (i > 0 ? ", " : "") + std::to_string(e.ranks[i]);
    return out.append(how).append(")");
  };
  switch (e.kind) {
  case EventKind::stalled: return rank + " stalled" + at;
  case EventKind::resumed: return rank + " resumed" + at;
  case EventKind::nonfinite: return (e.key.empty() ? std::string("a value") : e.key) + " is not finite" + at + ranks("");
  case EventKind::rank_failed: return rank + " failed" + at;
  case EventKind::rank_killed: return rank + " was killed" + at;
  case EventKind::rank_lost: return rank + " was lost" + at;
  case EventKind::barrier_timeout: return "a barrier timed out" + at + ranks(" missing");
  case EventKind::run_finished: return "the run ended " + std::string(to_string(e.state));
  case EventKind::threshold: return (e.key.empty() ? std::string("a value") : e.key) + " crossed an alert rule" + at;
  case EventKind::straggler: return rank + " is a straggler" + at;
  }
  return std::string(to_string(e.kind)) + at;
}

/// Slack reads `<`, `>` and `&` as its own markup (links, mentions such as
/// <!channel>): they are escaped as it asks, and Mattermost's markdown reads
/// the escapes back. A line break would end the one line: a space instead.
void append_shown(std::string& out, std::string_view s) {
  for (const char c : s) {
    switch (c) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '\n':
    case '\r':
    case '\t': out += ' '; break;
    default: out += c;
    }
  }
}

/// "chorus: run NAME (ID) in PROJECT: rank 3 stalled at step 12 — <message>".
std::string event_text(const RunSnapshot& run, const store::EventLine& line) {
  std::string t = "chorus: run ";
  append_shown(t, run.name);
  if (run.name != run.id) {
    t += " (";
    append_shown(t, run.id);
    t += ")";
  }
  if (!run.project.empty()) {
    t += " in ";
    append_shown(t, run.project);
  }
  t += ": ";
  append_shown(t, what_happened(line));
  if (!line.event.message.empty()) {
    t += " — ";
    append_shown(t, line.event.message);
  }
  return t;
}

class WebhookBackend final : public Backend {
public:
  WebhookBackend(const UploadTarget& target, HttpClient& http) : target_(target), http_(http) {
    // The parts of the path a server's answer might echo: the whole, without
    // its query, and each long part (a token), longest first.
    // ("/", a webhook at the server's root, is no secret.)
    const std::string_view p = target_.path;
    for (const std::string_view whole : {p, p.substr(0, p.find('?'))})
      if (whole.size() > 1) secrets_.push_back(whole);
    for (std::size_t from = 0; from < p.size();) {
      const std::size_t end = std::min(p.find_first_of("/?&=", from), p.size());
      if (end - from >= 8) secrets_.push_back(p.substr(from, end - from));
      from = end + 1;
    }
  }

  Sent open(const RunSnapshot& run, UploadState& st) override {
    st.remote_run = run.id; // what `chorus sync` names as the remote run
    return {};
  }

  Sent send(const RunSnapshot& run, const Batch& b, UploadState&) override {
    Sent s;
    if (!b.events.empty()) {
      const std::string_view line = b.events.front();
      const Result<store::EventLine> event = store::parse_event_line(line);
      if (!event) {
        // A damaged line (a torn write, an edit): left out, listed, and the next one goes.
        std::string why = "{\"part\":\"events\",\"line\":" + std::to_string(b.events_from.lines) + ",\"why\":";
        core::append_json_string(why, "not an event line: " + event.error().message());
        s.refused.push_back(why + "}");
        s.refused_points = 1;
        s.message = "events.jsonl holds a line that is no event; it is left out and listed in upload/" + target_.id +
                    ".refused.jsonl";
      } else {
        HttpRequest req;
        req.method = "POST";
        req.url = target_.base_url + target_.path;
        req.headers = {"Content-Type: application/json",
                       "Idempotency-Key: chorus-" + run.id + "-" + std::to_string(event->seq)};
        req.body = body(line, run, *event);
        req.idempotent = false; // libcurl must not send it again by itself: a chat would show it twice
        const HttpResponse r = perform_capped(http_, req, request_cap);
        if (!r.ok()) return not_posted(r, *event);
        s.points = 1;
      }
      s.events = 1;
    }
    // The rest of the run directory is not this target's: passed over.
    s.history = b.history.size();
    s.system = b.system.size();
    s.artifacts = b.artifacts.size();
    s.config = b.config != nullptr;
    s.summary = b.summary != nullptr;
    if (!b.final) end_seen_.reset();
    s.final = b.final && !wait_for_last_event(run, b, s);
    return s;
  }

  /// events.jsonl is what this target sends, and nothing else.
  [[nodiscard]] bool events() const noexcept override { return true; }

private:
  /// Whether the run's end is to wait for its last events (see the top):
  /// then `s` says when to look again.
  bool wait_for_last_event(const RunSnapshot& run, const Batch& b, Sent& s) {
    if (run.state == "crashed" || ends_finished(run.dir, b.events_from).value_or(true)) return false;
    const auto now = std::chrono::steady_clock::now();
    if (!end_seen_) end_seen_ = now;
    if (now - *end_seen_ >= end_wait) return false; // it never came: the end goes without it
    s.not_before = now + end_poll;
    return true;
  }

  /// The event's line with `text` added as its last field. The line is the
  /// run host's own JSON object (parse_event_line read it whole): its
  /// closing brace, past any trailing space, is where the field goes.
  static std::string body(std::string_view line, const RunSnapshot& run, const store::EventLine& event) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r' || line.back() == '\t')) line.remove_suffix(1);
    std::string out(line.substr(0, line.size() - 1)); // without its '}'
    out += ",\"text\":";
    core::append_json_string(out, event_text(run, event));
    out += "}";
    return out;
  }

  /// The Sent for an answer that was not 2xx: retried (no answer, 408, 425,
  /// 429, 5xx) or stopped, with what to check; nothing consumed, so the
  /// same event goes next.
  Sent not_posted(const HttpResponse& r, const store::EventLine& event) const {
    Sent s;
    s.delivery = classify(r);
    s.retry_after = r.retry_after;
    std::string said = describe(r);
    for (const std::string_view secret : secrets_) cut_out(said, secret);
    s.message = "the webhook answered event " + std::to_string(event.seq) + " (" +
                std::string(to_string(event.event.kind)) + ") with " + said;
    if (s.delivery != Delivery::refused) return s;
    s.stop = true;
    if (r.status == 404 || r.status == 410)
      s.message += " (no webhook at this URL: it was removed or mistyped; give the URL its server shows now)";
    else if (r.status == 401 || r.status == 403)
      s.message += " (the server does not accept this URL: check that the webhook is enabled and that the URL is "
                   "the one its server shows now)";
    else if (r.status == 400)
      s.message += " (the server refused the event's JSON: check that the URL is an incoming webhook that takes a "
                   "JSON body with a `text` field, as Slack's and Mattermost's do)";
    else if (r.status >= 300 && r.status < 400)
      s.message += " (the webhook moved: give the URL it moved to; redirects are not followed)";
    else if (r.status != 0)
      s.message += " (sending the event again cannot succeed: check the webhook's URL and its server)";
    return s;
  }

  const UploadTarget& target_;
  HttpClient& http_;
  std::vector<std::string_view> secrets_; // views into target_.path
  std::optional<SteadyTime> end_seen_;     // when the run was first found ended short of its run_finished
};

Result<std::unique_ptr<Backend>> make_webhook_backend(const BackendContext& context) {
  return std::unique_ptr<Backend>(std::make_unique<WebhookBackend>(context.target, *context.http));
}

} // namespace
} // namespace chorus::upload

namespace chorus::upload::backends {

BackendSpec webhook() {
  return {.connections = 1, .path = {}, .path_variable = {}, .secret_path = true, .make = make_webhook_backend};
}

} // namespace chorus::upload::backends
