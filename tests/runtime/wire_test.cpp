#define BOOST_TEST_MODULE runtime_wire
#include <boost/test/unit_test.hpp>

#include "runtime/core/wire.hpp"

#include <cstdlib>
#include <random>
#include <string>

using namespace chorus;
namespace w = chorus::core::wire;

namespace {

std::vector<char> sample_batch() {
  std::vector<char> out;
  w::BatchWriter b(out, 3);
  b.key(0, "loss");
  b.key(7, std::string("with\0nul", 8));
  b.values(1, w::auto_step, 1'700'000'000'000'000, 2);
  b.value(0, 0.25);
  b.value(7, -1e300);
  b.values(2, 42, 5, 0);
  b.define(3, 0, Reduce::max);
  b.barrier(4, 7, 600'000);
  b.config(5, R"({"lr":0.001})");
  b.summary(6, R"({"best":1})");
  b.finish(7);
  return out;
}

std::vector<w::RankEvent> events_of(const w::Frame& f) {
  std::vector<w::RankEvent> out;
  w::for_each_event(f, [&](const w::RankEvent& e) { out.push_back(e); });
  return out;
}

std::vector<std::vector<char>> sample_host_events() {
  return {w::run_start(11, 8, R"({"id":"abc"})"), w::rank_joined(5, 12, 4242, "node-1"),
          w::rank_dead(5, 13, "its process exited"), w::barrier_timeout(2, 14), w::finish_timeout(15),
          w::run_end(RunState::crashed, 16)};
}

std::uint64_t seed_from_env() {
  if (const char* s = std::getenv("CHORUS_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

} // namespace

// A WAL outlives the build that wrote it (`chorus recover` replays it): each
// Reduce keeps its byte, and a byte past the last one known is refused.
BOOST_AUTO_TEST_CASE(each_reduce_keeps_its_byte_and_an_unknown_one_is_refused) {
  const std::pair<Reduce, std::string_view> known[] = {{Reduce::none, "none"}, {Reduce::mean, "mean"},
                                                       {Reduce::sum, "sum"},   {Reduce::min, "min"},
                                                       {Reduce::max, "max"},   {Reduce::first, "first"},
                                                       {Reduce::merge, "merge"}};
  std::vector<char> out;
  w::Frame f;
  for (std::size_t byte = 0; byte < std::size(known); ++byte) {
    BOOST_TEST_CONTEXT(known[byte].second) {
      out.clear();
      {
        w::BatchWriter b(out, 0);
        b.define(1, 0, known[byte].first);
      }
      BOOST_TEST(static_cast<std::uint8_t>(out.back()) == byte);
      BOOST_REQUIRE(w::decode(out, f));
      const auto ev = events_of(f);
      BOOST_REQUIRE_EQUAL(ev.size(), 1u);
      BOOST_TEST((std::get<w::Define>(ev[0]).reduce == known[byte].first));
      BOOST_TEST(to_string(known[byte].first) == known[byte].second);
    }
  }
  out.back() = static_cast<char>(std::size(known));
  BOOST_TEST(!w::decode(out, f));
}

BOOST_AUTO_TEST_CASE(rank_batch_round_trip) {
  const auto frame = sample_batch();
  w::Frame f;
  BOOST_REQUIRE(w::decode(frame, f));
  BOOST_TEST((f.type == w::FrameType::rank_batch));
  BOOST_TEST(f.rank == 3u);
  BOOST_TEST(f.events == 9u);
  BOOST_TEST(f.body.size() == frame.size() - 9);

  const auto ev = events_of(f);
  BOOST_REQUIRE_EQUAL(ev.size(), 9u);
  const auto& k0 = std::get<w::KeyDef>(ev[0]);
  BOOST_TEST(k0.id == 0u);
  BOOST_TEST(k0.name == "loss");
  BOOST_TEST(std::get<w::KeyDef>(ev[1]).name == std::string_view("with\0nul", 8));
  const auto& v = std::get<w::Values>(ev[2]);
  BOOST_TEST(v.seq == 1u);
  BOOST_TEST(v.step == w::auto_step);
  BOOST_TEST(v.ts_us == 1'700'000'000'000'000);
  BOOST_REQUIRE_EQUAL(v.n, 2u);
  BOOST_TEST(v.key(0) == 0u);
  BOOST_TEST(v.value(0) == 0.25);
  BOOST_TEST(v.key(1) == 7u);
  BOOST_TEST(v.value(1) == -1e300);
  const auto& empty = std::get<w::Values>(ev[3]);
  BOOST_TEST(empty.step == 42);
  BOOST_TEST(empty.n == 0u);
  const auto& d = std::get<w::Define>(ev[4]);
  BOOST_TEST(d.seq == 3u);
  BOOST_TEST(d.key == 0u);
  BOOST_TEST((d.reduce == Reduce::max));
  const auto& b = std::get<w::Barrier>(ev[5]);
  BOOST_TEST(b.seq == 4u);
  BOOST_TEST(b.name_key == 7u);
  BOOST_TEST(b.timeout_ms == 600'000);
  BOOST_TEST(std::get<w::Config>(ev[6]).json == R"({"lr":0.001})");
  BOOST_TEST(std::get<w::Config>(ev[6]).seq == 5u);
  BOOST_TEST(std::get<w::Summary>(ev[7]).json == R"({"best":1})");
  BOOST_TEST(std::get<w::Finish>(ev[8]).seq == 7u);
}

BOOST_AUTO_TEST_CASE(event_reader_walks_events_and_offsets) {
  const auto frame = sample_batch();
  w::Frame f;
  BOOST_REQUIRE(w::decode(frame, f));
  w::EventReader in(f.body);
  w::RankEvent ev;
  std::size_t n = 0, last = 0;
  while (in.next(ev)) {
    BOOST_TEST(in.offset() > last);
    last = in.offset();
    ++n;
  }
  BOOST_TEST(n == 9u);
  BOOST_TEST(in.done());
  BOOST_TEST(!in.next(ev));
  // Events copied out of a body read back the same.
  w::EventReader tail(f.body.subspan(std::get<w::KeyDef>(events_of(f)[0]).name.size() + 9));
  BOOST_REQUIRE(tail.next(ev));
  BOOST_TEST(std::get<w::KeyDef>(ev).id == 7u);
}

BOOST_AUTO_TEST_CASE(empty_batch_and_max_values) {
  std::vector<char> out;
  { w::BatchWriter b(out, 0xffffffffu); }
  w::Frame f;
  BOOST_REQUIRE(w::decode(out, f));
  BOOST_TEST(f.rank == 0xffffffffu);
  BOOST_TEST(f.events == 0u);
  BOOST_TEST(events_of(f).empty());
}

BOOST_AUTO_TEST_CASE(two_frames_back_to_back_are_not_one_frame) {
  std::vector<char> out;
  { w::BatchWriter(out, 1).finish(1); }
  const std::size_t first = out.size();
  { w::BatchWriter(out, 2).finish(1); }
  w::Frame f;
  BOOST_TEST(!w::decode(out, f)); // trailing bytes
  BOOST_TEST(w::decode(std::span<const char>(out.data(), first), f));
  BOOST_TEST(w::decode(std::span<const char>(out.data() + first, out.size() - first), f));
  BOOST_TEST(f.rank == 2u);
}

BOOST_AUTO_TEST_CASE(host_events_round_trip) {
  const auto frames = sample_host_events();
  w::Frame f;
  BOOST_REQUIRE(w::decode(frames[0], f));
  BOOST_TEST((f.type == w::FrameType::host_event));
  const auto& s = std::get<w::RunStart>(f.host);
  BOOST_TEST(s.ts_us == 11);
  BOOST_TEST(s.world_size == 8u);
  BOOST_TEST(s.run_json == R"({"id":"abc"})");

  BOOST_REQUIRE(w::decode(frames[1], f));
  const auto& j = std::get<w::RankJoined>(f.host);
  BOOST_TEST(j.rank == 5u);
  BOOST_TEST(j.ts_us == 12);
  BOOST_TEST(j.pid == 4242);
  BOOST_TEST(j.host == "node-1");

  BOOST_REQUIRE(w::decode(frames[2], f));
  const auto& d = std::get<w::RankDead>(f.host);
  BOOST_TEST(d.rank == 5u);
  BOOST_TEST(d.ts_us == 13);
  BOOST_TEST(d.reason == "its process exited");

  BOOST_REQUIRE(w::decode(frames[3], f));
  BOOST_TEST(std::get<w::BarrierTimeout>(f.host).index == 2u);
  BOOST_TEST(std::get<w::BarrierTimeout>(f.host).ts_us == 14);

  BOOST_REQUIRE(w::decode(frames[4], f));
  BOOST_TEST(std::get<w::FinishTimeout>(f.host).ts_us == 15);

  BOOST_REQUIRE(w::decode(frames[5], f));
  BOOST_TEST((std::get<w::RunEnd>(f.host).state == RunState::crashed));
  BOOST_TEST(std::get<w::RunEnd>(f.host).ts_us == 16);
}

BOOST_AUTO_TEST_CASE(every_truncation_is_rejected) {
  auto frames = sample_host_events();
  frames.push_back(sample_batch());
  for (const auto& frame : frames) {
    w::Frame f;
    BOOST_REQUIRE(w::decode(frame, f));
    for (std::size_t len = 0; len < frame.size(); ++len) {
      BOOST_TEST_CONTEXT("frame of " << frame.size() << " bytes cut to " << len) {
        BOOST_TEST(!w::decode(std::span<const char>(frame.data(), len), f));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_tags_and_enums_are_rejected) {
  w::Frame f;
  const std::vector<char> bad_type{9};
  BOOST_TEST(!w::decode(bad_type, f));
  BOOST_TEST(!w::decode(std::span<const char>(), f));

  auto run_end = w::run_end(RunState::finished, 1);
  run_end[2] = static_cast<char>(static_cast<std::uint8_t>(RunState::killed) + 1);
  BOOST_TEST(!w::decode(run_end, f));

  auto host = w::finish_timeout(1);
  host[1] = 0; // no such host event
  BOOST_TEST(!w::decode(host, f));
  host[1] = 7;
  BOOST_TEST(!w::decode(host, f));

  std::vector<char> out;
  {
    w::BatchWriter b(out, 0);
    b.finish(1);
  }
  BOOST_REQUIRE(w::decode(out, f));
  out[9] = 8; // the finish's tag
  BOOST_TEST(!w::decode(out, f));
  out[9] = 0;
  BOOST_TEST(!w::decode(out, f));
}

BOOST_AUTO_TEST_CASE(event_count_must_match) {
  auto frame = sample_batch();
  w::Frame f;
  std::uint32_t n;
  std::memcpy(&n, frame.data() + 5, 4);
  for (std::uint32_t claimed : {n - 1, n + 1, 0u, 0xffffffffu}) {
    std::memcpy(frame.data() + 5, &claimed, 4);
    BOOST_TEST(!w::decode(frame, f), "count " << claimed << " for " << n << " events");
  }
}

BOOST_AUTO_TEST_CASE(huge_lengths_are_rejected_without_reading) {
  w::Frame f;
  std::vector<char> out;
  {
    w::BatchWriter b(out, 0);
    b.values(1, 0, 0, 0);
  }
  const std::uint32_t huge = 0xffffffffu; // n * 12 would wrap a 32-bit product
  std::memcpy(out.data() + out.size() - 4, &huge, 4);
  BOOST_TEST(!w::decode(out, f));
  const std::uint32_t wraps = 0x15555556u; // 12 * this wraps to 8 in 32 bits
  std::memcpy(out.data() + out.size() - 4, &wraps, 4);
  out.resize(out.size() + 8);
  BOOST_TEST(!w::decode(out, f));

  auto start = w::run_start(0, 1, "{}");
  std::memcpy(start.data() + 14, &huge, 4);
  BOOST_TEST(!w::decode(start, f));
}

// Every byte flipped to every value, then random multi-byte damage: decode
// never reads out of bounds (run it under ASan), and what it accepts can be
// walked completely.
BOOST_AUTO_TEST_CASE(damaged_frames_decode_or_are_rejected) {
  auto frames = sample_host_events();
  frames.push_back(sample_batch());
  std::size_t accepted = 0, rejected = 0;
  auto check = [&](const std::vector<char>& bytes) {
    // An exact-size heap copy, so that ASan sees a read one past the end.
    std::unique_ptr<char[]> copy(new char[bytes.size() + 1]);
    std::memcpy(copy.get(), bytes.data(), bytes.size());
    w::Frame f;
    if (!w::decode(std::span<const char>(copy.get(), bytes.size()), f)) {
      ++rejected;
      return;
    }
    ++accepted;
    if (f.type == w::FrameType::rank_batch) {
      std::uint32_t n = 0;
      w::for_each_event(f, [&](const w::RankEvent& e) {
        ++n;
        if (const auto* v = std::get_if<w::Values>(&e))
          for (std::uint32_t i = 0; i < v->n; ++i) (void)(v->key(i) + v->value(i));
      });
      BOOST_TEST(n == f.events);
    }
  };
  for (const auto& frame : frames) {
    for (std::size_t i = 0; i < frame.size(); ++i) {
      auto damaged = frame;
      for (int b = 0; b < 256; ++b) {
        damaged[i] = static_cast<char>(b);
        check(damaged);
      }
    }
  }

  const std::uint64_t seed = seed_from_env();
  BOOST_TEST_MESSAGE("damage fuzz seed " << seed << " (set CHORUS_SEED to replay)");
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 20000; ++round) {
    BOOST_TEST_CONTEXT("seed " << seed << " round " << round) {
      auto damaged = frames[rng() % frames.size()];
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        switch (rng() % 4) {
          case 0: damaged[rng() % damaged.size()] = static_cast<char>(rng()); break;
          case 1: damaged.resize(rng() % (damaged.size() + 1)); break;
          case 2: damaged.insert(damaged.begin() + static_cast<std::ptrdiff_t>(rng() % (damaged.size() + 1)),
                                 static_cast<char>(rng()));
            break;
          case 3: { // a length or count field set to something large
            if (damaged.size() >= 4) {
              const std::uint32_t big = static_cast<std::uint32_t>(rng()) | 0x10000000u;
              std::memcpy(damaged.data() + rng() % (damaged.size() - 3), &big, 4);
            }
            break;
          }
        }
        if (damaged.empty()) damaged.push_back(1);
      }
      check(damaged);
    }
  }
  BOOST_TEST_MESSAGE("damaged frames: " << accepted << " decoded, " << rejected << " rejected");
  BOOST_TEST(rejected > 0u);
}

// Random well-formed batches decode to exactly what was written.
BOOST_AUTO_TEST_CASE(random_batches_round_trip) {
  const std::uint64_t seed = seed_from_env();
  BOOST_TEST_MESSAGE("round-trip fuzz seed " << seed << " (set CHORUS_SEED to replay)");
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 2000; ++round) {
    BOOST_TEST_CONTEXT("seed " << seed << " round " << round) {
      std::vector<char> out(rng() % 3, 'x'); // a writer appends after whatever is there
      const std::size_t at = out.size();
      const auto rank = static_cast<std::uint32_t>(rng());
      std::vector<std::pair<int, std::uint64_t>> expect; // (tag, seq or key id)
      std::vector<double> values;
      std::vector<std::int32_t> exit_codes, got_codes;
      std::vector<std::uint32_t> streams, got_streams; // of values and stream events, in order
      std::vector<Histogram> histograms, got_histograms;
      std::vector<std::string> media, got_media; // the data of each media event
      std::vector<std::pair<int, double>> rules, got_rules; // each alert rule's kind and limit
      {
        w::BatchWriter b(out, rank);
        const int n = static_cast<int>(rng() % 12);
        for (int i = 0; i < n; ++i) {
          const auto tag = static_cast<std::uint8_t>(1 + rng() % 17);
          const auto stream = static_cast<std::uint32_t>(1 + rng() % w::max_streams);
          const std::uint64_t seq = rng();
          switch (static_cast<w::Tag>(tag)) {
            case w::Tag::key: b.key(static_cast<std::uint32_t>(seq), std::string(seq % 40, 'k')); break;
            case w::Tag::values:
            case w::Tag::stream_values: {
              const auto m = static_cast<std::uint32_t>(rng() % 50);
              const std::uint32_t into = tag == 2 ? 0 : stream;
              streams.push_back(into);
              b.values(seq, static_cast<std::int64_t>(rng()), static_cast<std::int64_t>(rng()), m, into);
              for (std::uint32_t j = 0; j < m; ++j) {
                const double v = std::bit_cast<double>(rng());
                values.push_back(v);
                b.value(static_cast<std::uint32_t>(rng()), v);
              }
              break;
            }
            case w::Tag::define:
              b.define(seq, static_cast<std::uint32_t>(rng()), static_cast<Reduce>(rng() % 7));
              break;
            case w::Tag::barrier:
              b.barrier(seq, static_cast<std::uint32_t>(rng()), static_cast<std::int64_t>(rng()));
              break;
            case w::Tag::config: b.config(seq, std::string(seq % 100, '{')); break;
            case w::Tag::summary: b.summary(seq, std::string(seq % 100, '}')); break;
            case w::Tag::finish: b.finish(seq); break;
            case w::Tag::finish_failed: b.finish(seq, static_cast<std::int32_t>(seq % 200) + 1); break;
            case w::Tag::stream_open:
            case w::Tag::stream_close:
              streams.push_back(stream);
              b.stream(seq, stream, tag == 9);
              break;
            case w::Tag::finish_ended:
              b.finish_ended(seq, seq % 2 ? RunState::failed : RunState::killed, static_cast<std::int32_t>(seq % 200) - 100,
                             std::string(seq % 50, 'm'));
              break;
            case w::Tag::refused:
              b.refused(seq, static_cast<std::int64_t>(rng()), Errc::invalid_key, static_cast<std::uint32_t>(rng()),
                        std::string(seq % 30, 'w'), "{\"k\":1}");
              break;
            case w::Tag::metric_view:
              b.metric_view(seq, static_cast<std::uint32_t>(rng()), static_cast<std::uint8_t>(rng() % 4),
                            static_cast<std::uint32_t>(rng()));
              break;
            case w::Tag::histogram: {
              Histogram h;
              for (std::uint64_t j = rng() % 40; j > 0; --j) h.add(std::bit_cast<double>(rng()));
              histograms.push_back(h);
              const std::uint32_t into = rng() % 2 ? 0 : stream;
              streams.push_back(into);
              b.histogram(seq, into, static_cast<std::int64_t>(rng()), static_cast<std::int64_t>(rng()),
                          static_cast<std::uint32_t>(rng()), h);
              break;
            }
            case w::Tag::alert_rule: {
              const AlertRule rule{static_cast<AlertRule::Kind>(1 + rng() % 3), 0.5 + static_cast<double>(rng() % 1000)};
              rules.emplace_back(static_cast<int>(rule.kind), rule.limit);
              b.alert_rule(seq, static_cast<std::uint32_t>(rng()), rule);
              break;
            }
            case w::Tag::media: {
              chorus::core::Media m;
              m.kind = chorus::core::MediaKind::text;
              m.format = "md";
              m.caption = std::string(seq % 20, 'c');
              m.data.assign(seq % 300, 't');
              media.push_back(std::string(m.data.begin(), m.data.end()));
              streams.push_back(0);
              b.media(seq, 0, static_cast<std::int64_t>(rng()), static_cast<std::int64_t>(rng()),
                      static_cast<std::uint32_t>(rng()), m);
              break;
            }
          }
          // A failed or ended finish decodes as a Finish carrying its code.
          if (tag == 7 || tag == 8)
            exit_codes.push_back(tag == 8 ? static_cast<std::int32_t>(seq % 200) + 1 : 0);
          else if (tag == 12)
            exit_codes.push_back(static_cast<std::int32_t>(seq % 200) - 100);
          // Decoded as: a failed or ended finish a Finish, stream values Values,
          // an open or a close a Stream, a refusal a Refused, a view a MetricView.
          const int decoded = tag == 8 || tag == 12 ? 7
                              : tag == 10            ? 2
                              : tag == 9 || tag == 11 ? 8
                              : tag == 13            ? 9
                              : tag == 14            ? 10
                              : tag == 15            ? 11
                              : tag == 16            ? 12
                              : tag == 17            ? 13
                                                     : tag;
          expect.emplace_back(decoded, tag == 1 ? static_cast<std::uint32_t>(seq) : seq);
        }
      }
      w::Frame f;
      BOOST_REQUIRE(w::decode(std::span<const char>(out.data() + at, out.size() - at), f));
      BOOST_TEST(f.rank == rank);
      std::vector<std::pair<int, std::uint64_t>> got;
      std::size_t vi = 0;
      bool values_match = true;
      w::for_each_event(f, [&](const w::RankEvent& e) {
        std::uint64_t seq = 0;
        std::visit(
            [&](const auto& x) {
              using T = std::decay_t<decltype(x)>;
              if constexpr (std::is_same_v<T, w::KeyDef>) {
                seq = x.id;
              } else {
                seq = x.seq;
              }
              if constexpr (std::is_same_v<T, w::Finish>) got_codes.push_back(x.code);
              if constexpr (std::is_same_v<T, w::AlertRuleDef>)
                got_rules.emplace_back(static_cast<int>(x.rule.kind), x.rule.limit);
              if constexpr (std::is_same_v<T, w::Stream>) got_streams.push_back(x.id);
              if constexpr (std::is_same_v<T, w::Values>) got_streams.push_back(x.stream);
              if constexpr (std::is_same_v<T, w::MediaValue>) {
                got_streams.push_back(x.stream);
                chorus::core::Media m;
                BOOST_TEST(chorus::core::media::decode(x.body, m));
                got_media.emplace_back(m.data.begin(), m.data.end());
              }
              if constexpr (std::is_same_v<T, w::HistogramValue>) {
                got_streams.push_back(x.stream);
                BOOST_TEST(chorus::core::histogram::decode(x.body, got_histograms.emplace_back()));
              }
              if constexpr (std::is_same_v<T, w::Values>)
                for (std::uint32_t j = 0; j < x.n; ++j)
                  values_match = values_match && vi < values.size() &&
                                 std::bit_cast<std::uint64_t>(x.value(j)) == std::bit_cast<std::uint64_t>(values[vi++]);
            },
            e);
        got.emplace_back(static_cast<int>(e.index() + 1), seq); // variant order follows the tags
      });
      BOOST_TEST(values_match);
      BOOST_TEST(vi == values.size());
      BOOST_TEST((got == expect));
      BOOST_TEST((got_codes == exit_codes));
      BOOST_TEST((got_streams == streams));
      BOOST_TEST((got_histograms == histograms));
      BOOST_TEST((got_media == media));
      BOOST_TEST((got_rules == rules));
    }
  }
}

// An event the run host told travels whole (its line too), and a record
// cut short, of an unknown kind or with a newline in its line is refused.
BOOST_AUTO_TEST_CASE(an_event_record_round_trips_and_a_bad_one_is_refused) {
  const std::vector<std::int32_t> ranks{2, 5};
  w::EventRecord r;
  r.kind = EventKind::nonfinite;
  r.ts_us = 1'700'000'000'250'000;
  r.rank = -1;
  r.step = 120;
  r.key = "loss";
  r.message = "loss is NaN at step 120";
  r.ranks = ranks;
  r.json = R"({"seq":0,"kind":"nonfinite"})";
  const std::vector<char> frame = w::event(r);
  w::Frame f;
  BOOST_REQUIRE(w::decode(frame, f));
  const auto* got = std::get_if<w::EventRecord>(&f.host);
  BOOST_REQUIRE(got != nullptr);
  const Event e = got->to_event();
  BOOST_TEST((e.kind == EventKind::nonfinite));
  BOOST_TEST(e.step == 120);
  BOOST_TEST(e.rank == -1);
  BOOST_TEST(e.key == "loss");
  BOOST_TEST(e.message == r.message);
  BOOST_TEST((e.ranks == std::vector<int>{2, 5}));
  BOOST_TEST(e.json == r.json);
  BOOST_TEST(std::chrono::duration_cast<std::chrono::microseconds>(e.time.time_since_epoch()).count() == r.ts_us);
  for (std::size_t cut = 1; cut < frame.size(); ++cut)
    BOOST_TEST(!w::decode(std::span<const char>(frame.data(), cut), f), "cut at " << cut);
  std::vector<char> unknown = frame;
  unknown[2] = 99; // the kind
  BOOST_TEST(!w::decode(unknown, f));
  w::EventRecord two_lines = r;
  two_lines.json = "{}\n{}";
  BOOST_TEST(!w::decode(w::event(two_lines), f));
  // An alert rule of an unknown kind, a bound that is no number, or a no_change of no time is no rule.
  const auto rule_frame = [](AlertRule rule) {
    std::vector<char> out;
    w::BatchWriter b(out, 0);
    b.alert_rule(1, 0, rule);
    return out;
  };
  BOOST_TEST(w::decode(rule_frame(chorus::above(10)), f));
  BOOST_TEST(w::decode(rule_frame(chorus::no_change(std::chrono::seconds(60))), f));
  BOOST_TEST(!w::decode(rule_frame(AlertRule{static_cast<AlertRule::Kind>(4), 1}), f));
  BOOST_TEST(!w::decode(rule_frame(chorus::below(std::nan(""))), f));
  BOOST_TEST(!w::decode(rule_frame(chorus::no_change(std::chrono::seconds(0))), f));
}
