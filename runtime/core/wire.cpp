#include "runtime/core/wire.hpp"

#include <algorithm>
#include <cmath>

namespace chorus::core::wire {

namespace {

/// A bounds-checked cursor over untrusted bytes: every read says whether the
/// bytes were there, and nothing is read past the end.
class Reader {
public:
  explicit Reader(std::span<const char> bytes) noexcept : p_(bytes.data()), end_(bytes.data() + bytes.size()) {}

  template <class T>
  bool get(T& v) noexcept {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  bool bytes(std::string_view& s) noexcept {
    std::uint32_t n;
    if (!get(n) || remaining() < n) return false;
    s = std::string_view(p_, n);
    p_ += n;
    return true;
  }
  bool skip(std::uint64_t n, const char*& start) noexcept {
    if (remaining() < n) return false;
    start = p_;
    p_ += n;
    return true;
  }
  [[nodiscard]] std::size_t remaining() const noexcept { return static_cast<std::size_t>(end_ - p_); }
  [[nodiscard]] const char* position() const noexcept { return p_; }

private:
  const char* p_;
  const char* end_;
};

bool valid(RunState s) noexcept { return static_cast<std::uint8_t>(s) <= static_cast<std::uint8_t>(RunState::killed); }

/// A writer stream's id: the default stream (0) is never named, and ids stay bounded.
bool writer_stream(std::uint32_t id) noexcept { return id >= 1 && id <= max_streams; }

bool read_event(Reader& in, RankEvent& ev) noexcept {
  Tag tag;
  if (!in.get(tag)) return false;
  switch (tag) {
    case Tag::key: {
      KeyDef k{};
      if (!in.get(k.id) || !in.bytes(k.name)) return false;
      ev = k;
      return true;
    }
    case Tag::values:
    case Tag::stream_values: {
      Values v{};
      if (!in.get(v.seq)) return false;
      if (tag == Tag::stream_values && (!in.get(v.stream) || !writer_stream(v.stream))) return false;
      if (!in.get(v.step) || !in.get(v.ts_us) || !in.get(v.n)) return false;
      // 64-bit product: n * 12 cannot wrap.
      if (!in.skip(std::uint64_t{v.n} * value_size, v.data)) return false;
      ev = v;
      return true;
    }
    case Tag::define: {
      Define d{};
      std::uint8_t r;
      if (!in.get(d.seq) || !in.get(d.key) || !in.get(r)) return false;
      d.reduce = static_cast<Reduce>(r);
      if (!known(d.reduce)) return false;
      ev = d;
      return true;
    }
    case Tag::barrier: {
      Barrier b{};
      if (!in.get(b.seq) || !in.get(b.name_key) || !in.get(b.timeout_ms)) return false;
      ev = b;
      return true;
    }
    case Tag::config: {
      Config c{};
      if (!in.get(c.seq) || !in.bytes(c.json)) return false;
      ev = c;
      return true;
    }
    case Tag::summary: {
      Summary s{};
      if (!in.get(s.seq) || !in.bytes(s.json)) return false;
      ev = s;
      return true;
    }
    case Tag::finish:
    case Tag::finish_failed: {
      Finish f{};
      if (!in.get(f.seq)) return false;
      if (tag == Tag::finish_failed) {
        if (!in.get(f.code) || f.code == 0) return false;
        f.state = RunState::failed;
      }
      ev = f;
      return true;
    }
    case Tag::finish_ended: {
      Finish f{};
      std::uint8_t state;
      if (!in.get(f.seq) || !in.get(state) || !in.get(f.code) || !in.bytes(f.message)) return false;
      f.state = static_cast<RunState>(state);
      if ((f.state != RunState::failed && f.state != RunState::killed) || f.message.size() > max_end_message)
        return false;
      ev = f;
      return true;
    }
    case Tag::refused: {
      Refused r{};
      std::uint8_t code;
      if (!in.get(r.seq) || !in.get(r.step) || !in.get(code) || !in.get(r.n) || !in.bytes(r.message) ||
          !in.bytes(r.values))
        return false;
      r.code = static_cast<Errc>(code);
      if (code == 0 || code > static_cast<std::uint8_t>(Errc::upload_incomplete)) return false;
      ev = r;
      return true;
    }
    case Tag::metric_view: {
      MetricView m{};
      if (!in.get(m.seq) || !in.get(m.key) || !in.get(m.summary) || !in.get(m.step_key)) return false;
      if (m.summary != unchanged_summary && !known(static_cast<chorus::Summary>(m.summary))) return false;
      ev = m;
      return true;
    }
    case Tag::histogram: {
      HistogramValue h{};
      std::string_view body;
      if (!in.get(h.seq) || !in.get(h.stream) || !in.get(h.step) || !in.get(h.ts_us) || !in.get(h.key) ||
          !in.bytes(body))
        return false;
      if (h.stream > max_streams || !chorus::core::histogram::valid(body)) return false;
      h.body = std::span<const char>(body.data(), body.size());
      ev = h;
      return true;
    }
    case Tag::media: {
      MediaValue m{};
      std::string_view body;
      if (!in.get(m.seq) || !in.get(m.stream) || !in.get(m.step) || !in.get(m.ts_us) || !in.get(m.key) ||
          !in.bytes(body))
        return false;
      if (m.stream > max_streams || !chorus::core::media::valid(std::span<const char>(body.data(), body.size())))
        return false;
      m.body = std::span<const char>(body.data(), body.size());
      ev = m;
      return true;
    }
    case Tag::alert_rule: {
      AlertRuleDef a{};
      std::uint8_t kind = 0;
      if (!in.get(a.seq) || !in.get(a.key) || !in.get(kind) || !in.get(a.rule.limit)) return false;
      a.rule.kind = static_cast<AlertRule::Kind>(kind);
      if (kind < 1 || kind > 3 || !std::isfinite(a.rule.limit)) return false;
      if (a.rule.kind == AlertRule::Kind::no_change && !(a.rule.limit > 0)) return false;
      ev = a;
      return true;
    }
    case Tag::stream_open:
    case Tag::stream_close: {
      Stream st{};
      st.open = tag == Tag::stream_open;
      if (!in.get(st.seq) || !in.get(st.id) || !writer_stream(st.id)) return false;
      ev = st;
      return true;
    }
  }
  return false; // an unknown tag
}

bool read_host_event(Reader& in, HostEventData& out) noexcept {
  HostEvent kind;
  if (!in.get(kind)) return false;
  switch (kind) {
    case HostEvent::run_start: {
      RunStart e{};
      if (!in.get(e.ts_us) || !in.get(e.world_size) || !in.bytes(e.run_json)) return false;
      out = e;
      return true;
    }
    case HostEvent::rank_joined: {
      RankJoined e{};
      if (!in.get(e.rank) || !in.get(e.ts_us) || !in.get(e.pid) || !in.bytes(e.host)) return false;
      out = e;
      return true;
    }
    case HostEvent::rank_dead: {
      RankDead e{};
      if (!in.get(e.rank) || !in.get(e.ts_us) || !in.bytes(e.reason)) return false;
      out = e;
      return true;
    }
    case HostEvent::barrier_timeout: {
      BarrierTimeout e{};
      if (!in.get(e.index) || !in.get(e.ts_us)) return false;
      out = e;
      return true;
    }
    case HostEvent::finish_timeout: {
      FinishTimeout e{};
      if (!in.get(e.ts_us)) return false;
      out = e;
      return true;
    }
    case HostEvent::rank_exit: {
      RankExit e{};
      if (!in.get(e.rank) || !in.get(e.ts_us) || !in.get(e.status) || e.status == 0) return false;
      out = e;
      return true;
    }
    case HostEvent::event: {
      EventRecord e{};
      std::uint8_t kind = 0, state = 0;
      std::uint32_t n = 0;
      const char* ranks = nullptr;
      if (!in.get(kind) || !in.get(e.ts_us) || !in.get(e.rank) || !in.get(e.step) || !in.get(state) ||
          !in.bytes(e.key) || !in.bytes(e.message) || !in.get(n) || !in.skip(std::uint64_t{n} * 4, ranks) ||
          !in.bytes(e.json))
        return false;
      e.kind = static_cast<EventKind>(kind);
      e.state = static_cast<RunState>(state);
      if (!known(e.kind) || !valid(e.state) || e.json.find('\n') != std::string_view::npos) return false;
      e.rank_bytes = std::span<const char>(ranks, std::size_t{n} * 4);
      out = e;
      return true;
    }
    case HostEvent::run_end: {
      RunEnd e{};
      std::uint8_t s;
      if (!in.get(s) || !in.get(e.ts_us)) return false;
      e.state = static_cast<RunState>(s);
      if (!valid(e.state)) return false;
      out = e;
      return true;
    }
  }
  return false;
}

std::vector<char> host_frame(HostEvent kind) {
  std::vector<char> out;
  detail::put(out, FrameType::host_event);
  detail::put(out, kind);
  return out;
}

} // namespace

std::vector<char> run_start(std::int64_t ts_us, std::uint32_t world_size, std::string_view run_json) {
  auto out = host_frame(HostEvent::run_start);
  detail::put(out, ts_us);
  detail::put(out, world_size);
  detail::put_bytes(out, run_json);
  return out;
}

std::vector<char> rank_joined(std::uint32_t rank, std::int64_t ts_us, std::int64_t pid, std::string_view host) {
  auto out = host_frame(HostEvent::rank_joined);
  detail::put(out, rank);
  detail::put(out, ts_us);
  detail::put(out, pid);
  detail::put_bytes(out, host);
  return out;
}

std::vector<char> rank_dead(std::uint32_t rank, std::int64_t ts_us, std::string_view reason) {
  auto out = host_frame(HostEvent::rank_dead);
  detail::put(out, rank);
  detail::put(out, ts_us);
  detail::put_bytes(out, reason);
  return out;
}

std::vector<char> barrier_timeout(std::uint32_t index, std::int64_t ts_us) {
  auto out = host_frame(HostEvent::barrier_timeout);
  detail::put(out, index);
  detail::put(out, ts_us);
  return out;
}

std::vector<char> finish_timeout(std::int64_t ts_us) {
  auto out = host_frame(HostEvent::finish_timeout);
  detail::put(out, ts_us);
  return out;
}

std::vector<char> run_end(RunState state, std::int64_t ts_us) {
  auto out = host_frame(HostEvent::run_end);
  detail::put(out, static_cast<std::uint8_t>(state));
  detail::put(out, ts_us);
  return out;
}

std::vector<char> rank_exit(std::uint32_t rank, std::int64_t ts_us, std::int32_t status) {
  auto out = host_frame(HostEvent::rank_exit);
  detail::put(out, rank);
  detail::put(out, ts_us);
  detail::put(out, status);
  return out;
}

std::vector<char> event(const EventRecord& e) {
  auto out = host_frame(HostEvent::event);
  detail::put(out, static_cast<std::uint8_t>(e.kind));
  detail::put(out, e.ts_us);
  detail::put(out, e.rank);
  detail::put(out, e.step);
  detail::put(out, static_cast<std::uint8_t>(e.state));
  detail::put_bytes(out, e.key);
  detail::put_bytes(out, e.message);
  detail::put(out, static_cast<std::uint32_t>(e.ranks.size()));
  for (const std::int32_t r : e.ranks) detail::put(out, r);
  detail::put_bytes(out, e.json);
  return out;
}

chorus::Event EventRecord::to_event() const {
  chorus::Event ev;
  ev.kind = kind;
  ev.step = step;
  ev.rank = rank;
  ev.key = std::string(key);
  // Within what system_clock's nanoseconds hold (a frame's time is the run host's clock; never trusted blindly).
  constexpr std::int64_t max_us = 9'000'000'000'000'000;
  ev.time = std::chrono::system_clock::time_point(std::chrono::microseconds(std::clamp(ts_us, -max_us, max_us)));
  ev.message = std::string(message);
  ev.ranks.reserve(rank_count());
  for (std::size_t i = 0; i < rank_count(); ++i) ev.ranks.push_back(rank_at(i));
  ev.state = state;
  ev.json = std::string(json);
  return ev;
}

bool decode(std::span<const char> frame, Frame& out) {
  Reader in(frame);
  FrameType type;
  if (!in.get(type)) return false;
  Frame f{};
  f.type = type;
  switch (type) {
    case FrameType::rank_batch: {
      if (!in.get(f.rank) || !in.get(f.events)) return false;
      const char* body = in.position();
      RankEvent ev;
      for (std::uint32_t i = 0; i < f.events; ++i)
        if (!read_event(in, ev)) return false;
      f.body = std::span<const char>(body, static_cast<std::size_t>(in.position() - body));
      break;
    }
    case FrameType::host_event:
      if (!read_host_event(in, f.host)) return false;
      break;
    default:
      return false;
  }
  if (in.remaining() != 0) return false; // trailing bytes: not the frame it claims to be
  out = f;
  return true;
}

bool EventReader::next(RankEvent& ev) noexcept {
  Reader in(data_.subspan(pos_));
  if (in.remaining() == 0 || !read_event(in, ev)) return false;
  pos_ = static_cast<std::size_t>(in.position() - data_.data());
  return true;
}

void for_each_event(const Frame& frame, const std::function<void(const RankEvent&)>& f) {
  if (frame.type != FrameType::rank_batch) return;
  EventReader reader(frame.body);
  RankEvent ev;
  while (reader.next(ev)) f(ev);
}

} // namespace chorus::core::wire
