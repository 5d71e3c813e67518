// TensorBoard event files as chorus writes them (io/upload/tfevents.hpp),
// read back by a reader of this file's own: a bitwise CRC32C, a protobuf
// wire decoder, and the Event / Summary / Value / SummaryMetadata /
// TensorProto fields of docs/TENSORBOARD.md. It shares no code with the
// writer, so a mistake in one shows against the other.
#define BOOST_TEST_MODULE tfevents
#include <boost/test/unit_test.hpp>

#include "io/upload/tensorboard_run.hpp"
#include "io/upload/tfevents.hpp"
#include "tests/temp_dir.hpp"
#include "tests/upload/tfevents_reader.hpp"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>
#include <sys/resource.h>
#include <unistd.h>

BOOST_TEST_DONT_PRINT_LOG_VALUE(chorus::Errc)

using namespace chorus;
using chorus::test::slurp;
using chorus::test::TempDir;
using namespace chorus::test::tfevents;

namespace {

std::unique_ptr<upload::TfEventsWriter> make_writer(const std::string& dir, double wall_time_s = 1700000000.25) {
  auto w = upload::TfEventsWriter::create(dir, wall_time_s);
  BOOST_TEST_REQUIRE(w.has_value(), w.error().message());
  return std::move(w).value();
}

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

} // namespace

// ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(crc32c_known_vector_both_implementations) {
  const std::string check = "123456789";
  BOOST_TEST(bitwise_crc32c(check) == 0xE3069283u);
  BOOST_TEST(chorus::upload::crc32c(std::span<const char>(check)) == 0xE3069283u);
  BOOST_TEST(chorus::upload::masked_crc32c(std::span<const char>(check)) == masked(0xE3069283u));
  BOOST_TEST(bitwise_crc32c("") == 0u);
  BOOST_TEST(chorus::upload::crc32c(std::span<const char>()) == 0u);
  // 32 zero bytes: the iSCSI test vector (RFC 3720, B.4).
  const std::string zeros(32, '\0');
  BOOST_TEST(bitwise_crc32c(zeros) == 0x8A9136AAu);
  BOOST_TEST(chorus::upload::crc32c(std::span<const char>(zeros)) == 0x8A9136AAu);

  // Every length up to 300 at every alignment of 8, and extension.
  std::mt19937 rng(7);
  std::string buf(512, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  for (std::size_t off = 0; off < 8; ++off)
    for (std::size_t n = 0; n <= 300; ++n) {
      const std::span<const char> s(buf.data() + off, n);
      const std::uint32_t expected = bitwise_crc32c(std::string_view(s.data(), s.size()));
      BOOST_TEST_REQUIRE(chorus::upload::crc32c(s) == expected, "offset " << off << " length " << n);
      const std::size_t half = n / 2;
      BOOST_TEST_REQUIRE(chorus::upload::crc32c(s.subspan(half), chorus::upload::crc32c(s.first(half))) == expected);
    }
}

BOOST_AUTO_TEST_CASE(file_version_is_the_first_event) {
  TempDir tmp;
  const std::string dir = tmp / "a/b/run";
  auto w = make_writer(dir, 1700000000.25);
  const std::string name = file_name(w->path());
  BOOST_TEST(std::filesystem::path(w->path()).parent_path() == std::filesystem::path(dir));
  BOOST_TEST(name.starts_with("events.out.tfevents.1700000000."), name);
  // ...<hostname>.<pid>.<n>
  const std::size_t last = name.rfind('.');
  const std::size_t before = name.rfind('.', last - 1);
  BOOST_TEST(name.substr(before + 1, last - before - 1) == std::to_string(::getpid()), name);
  BOOST_TEST(std::all_of(name.begin() + static_cast<std::ptrdiff_t>(last) + 1, name.end(),
                         [](char c) { return c >= '0' && c <= '9'; }), name);
  // Written at once, and counted.
  BOOST_TEST(w->bytes_written() == std::filesystem::file_size(w->path()));
  BOOST_TEST(w->bytes_written() > 0u);
  BOOST_TEST(!w->close());

  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == 1u);
  BOOST_TEST(events[0].file_version.value_or("") == "brain.Event:2");
  BOOST_TEST(events[0].wall_time == 1700000000.25);
  BOOST_TEST(!events[0].has_summary);
  BOOST_TEST(((std::filesystem::status(dir).permissions() & std::filesystem::perms::all) ==
              std::filesystem::perms::owner_all));
}

BOOST_AUTO_TEST_CASE(scalars_round_trip) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  struct In {
    const char* tag;
    std::int64_t step;
    double wall;
    double value;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const In in[] = {
      {"loss", 0, 1700000001.5, 0.25},
      {"loss", 1, 1700000002.125, 0.1},          // not exact in a float
      {"train/acc", 7, 1700000003.0, -3.5},
      {"nan", 8, 1700000004.0, std::numeric_limits<double>::quiet_NaN()},
      {"inf", 9, 1700000005.0, inf},
      {"ninf", 10, 1700000006.0, -inf},
      {"huge", 11, 1700000007.0, 1e300},         // past a float's range: infinity
      {"big/step", std::int64_t{1} << 40, 0.0, 42.0},
      {"", 12, 1700000008.0, 1.0},                // an empty tag is a tag
      {"ünïcødé/λ", 13, 1700000009.0, 2.0},
  };
  for (const In& x : in) w->scalar(x.tag, x.step, x.wall, x.value);
  BOOST_TEST(!w->flush());
  BOOST_TEST(w->bytes_written() == std::filesystem::file_size(w->path()));

  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == std::size(in) + 1);
  BOOST_TEST(events[0].file_version.has_value());
  for (std::size_t i = 0; i < std::size(in); ++i) {
    const TbEvent& e = events[i + 1];
    BOOST_TEST_CONTEXT("scalar " << i << " (" << in[i].tag << ")") {
      BOOST_TEST(!e.file_version.has_value());
      BOOST_TEST(e.step == in[i].step);
      BOOST_TEST(e.wall_time == in[i].wall);
      BOOST_TEST_REQUIRE(e.values.size() == 1u);
      const TbValue& v = e.values[0];
      BOOST_TEST(v.tag == in[i].tag);
      BOOST_TEST(!v.has_metadata);
      BOOST_TEST(!v.has_tensor);
      BOOST_TEST_REQUIRE(v.simple_value.has_value());
      const float expected = static_cast<float>(in[i].value);
      if (std::isnan(expected))
        BOOST_TEST(std::isnan(*v.simple_value));
      else
        BOOST_TEST(*v.simple_value == expected);
    }
  }
  BOOST_TEST(*events[7].values[0].simple_value == std::numeric_limits<float>::infinity()); // 1e300
}

BOOST_AUTO_TEST_CASE(negative_steps_are_left_out_and_reported) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  w->scalar("loss", 1, 1.0, 1.0);
  w->scalar("loss", -1, 2.0, 2.0);
  w->text("notes", -5, 3.0, "no");
  w->scalar("loss", 2, 4.0, 3.0);
  const Error e = w->flush();
  BOOST_TEST(e.code() == Errc::invalid_argument);
  BOOST_TEST(e.message().find("2 events with a negative step") != std::string::npos, e.message());
  BOOST_TEST(e.message().find("'loss' at step -1") != std::string::npos, e.message());
  BOOST_TEST(e.message().find(w->path()) != std::string::npos, e.message());
  BOOST_TEST(!w->flush()); // reported once
  BOOST_TEST(!w->close());
  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == 3u);
  BOOST_TEST(events[1].step == 1);
  BOOST_TEST(events[2].step == 2);
}

BOOST_AUTO_TEST_CASE(text_round_trips_as_the_text_plugin) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  const std::string with_nul("a\0b", 3);
  std::string long_text(200000, 'x');
  long_text[12345] = '\n';
  const std::string texts[] = {"hello **markdown**", "", with_nul, "ünïcødé", long_text};
  std::int64_t step = 3;
  for (const std::string& t : texts) w->text("notes/run", step++, 1700000100.5, t);
  BOOST_TEST(!w->close());

  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == std::size(texts) + 1);
  for (std::size_t i = 0; i < std::size(texts); ++i) {
    const TbEvent& e = events[i + 1];
    BOOST_TEST_CONTEXT("text " << i) {
      BOOST_TEST(e.step == static_cast<std::int64_t>(3 + i));
      BOOST_TEST(e.wall_time == 1700000100.5);
      BOOST_TEST_REQUIRE(e.values.size() == 1u);
      const TbValue& v = e.values[0];
      BOOST_TEST(v.tag == "notes/run");
      BOOST_TEST(!v.simple_value.has_value());
      BOOST_TEST(v.has_metadata);
      BOOST_TEST(v.plugin_name == "text");
      BOOST_TEST(v.plugin_content.empty()); // TextPluginData{version 0}
      BOOST_TEST(v.has_tensor);
      BOOST_TEST(v.dtype == 7); // DT_STRING
      BOOST_TEST(v.has_shape);
      BOOST_TEST(v.shape_dims == 0); // a scalar
      BOOST_TEST_REQUIRE(v.string_val.size() == 1u);
      BOOST_TEST(v.string_val[0] == texts[i]);
    }
  }
}

// A histogram is HistogramProto (Value.histo): its buckets, read back as
// TensorBoard reads them ((previous limit, limit], the first from min), hold
// every value in the histogram's own buckets; the infinities sit at
// -DBL_MAX and DBL_MAX, NaN is left out of num.
BOOST_AUTO_TEST_CASE(histograms_round_trip_as_histogram_protos) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  std::mt19937_64 rng(11);
  std::normal_distribution<double> d(0.0, 3.0);
  std::vector<double> values(5000);
  for (double& v : values) v = d(rng);
  values[0] = std::numeric_limits<double>::quiet_NaN();
  values[1] = std::numeric_limits<double>::infinity();
  values[2] = -std::numeric_limits<double>::infinity();
  values[3] = 0.0;
  const Histogram h{std::span<const double>(values)};
  w->histogram("grad", 7, 1700000200.25, h);
  w->histogram("empty", 8, 1700000200.5, Histogram());
  BOOST_TEST(!w->close());

  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == 3u);
  const TbEvent& e = events[1];
  BOOST_TEST(e.step == 7);
  BOOST_TEST(e.wall_time == 1700000200.25);
  BOOST_TEST_REQUIRE(e.values.size() == 1u);
  BOOST_TEST(e.values[0].tag == "grad");
  BOOST_TEST_REQUIRE(e.values[0].histo.has_value());
  const auto& p = *e.values[0].histo;
  constexpr double most = std::numeric_limits<double>::max();
  BOOST_TEST(p.num == 4999.0); // all but the NaN
  BOOST_TEST(p.min == -most);  // -Inf is below every finite value
  BOOST_TEST(p.max == most);
  BOOST_TEST(p.sum == h.sum());
  BOOST_TEST(p.sum_squares == 0.0);
  // Limits ascend, and the counts add up to num.
  BOOST_TEST(std::is_sorted(p.bucket_limit.begin(), p.bucket_limit.end()));
  double total = 0;
  for (double c : p.bucket) total += c;
  BOOST_TEST(total == p.num);
  BOOST_TEST(p.bucket_limit.front() == -most);
  BOOST_TEST(p.bucket.front() == 1.0);
  BOOST_TEST(p.bucket_limit.back() == most);
  BOOST_TEST(p.bucket.back() == 1.0);
  // Each of the histogram's buckets is one bucket of the proto, with its count.
  for (const Histogram::Bucket& b : h.buckets()) {
    const auto at = std::find(p.bucket_limit.begin(), p.bucket_limit.end(), b.hi);
    BOOST_TEST_REQUIRE((at != p.bucket_limit.end()), "no limit at " << b.hi);
    BOOST_TEST(p.bucket[static_cast<std::size_t>(at - p.bucket_limit.begin())] == static_cast<double>(b.count));
    const double left = at == p.bucket_limit.begin() ? p.min : *(at - 1);
    BOOST_TEST(left == b.lo); // the gap before it is its own bucket of 0
  }
  const auto& empty = events[2].values.at(0).histo.value();
  BOOST_TEST(empty.num == 0.0);
  BOOST_TEST(empty.bucket_limit.empty());
}

BOOST_AUTO_TEST_CASE(hparams_round_trip_as_the_hparams_plugins_session_start) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  const std::vector<upload::HParam> values = {
      {"lr", 0.001}, {"layers", 3.0}, {"zero", 0.0}, {"amp", false}, {"ema", true}, {"optimizer", std::string("adam")},
      {"empty", std::string()}};
  w->hparams(values, 1700000000.5, 1700000001.25);
  BOOST_TEST(!w->close());

  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == 2u);
  const TbEvent& e = events[1];
  BOOST_TEST(e.step == 0);
  BOOST_TEST(e.wall_time == 1700000001.25);
  BOOST_TEST_REQUIRE(e.values.size() == 1u);
  const TbValue& v = e.values[0];
  BOOST_TEST(v.tag == "_hparams_/session_start_info");
  BOOST_TEST(!v.simple_value.has_value());
  BOOST_TEST(v.plugin_name == "hparams");
  // The empty tensor of the plugin's own summaries: DT_FLOAT, shape [0].
  BOOST_TEST(v.has_tensor);
  BOOST_TEST(v.dtype == 1);
  BOOST_TEST(v.has_shape);
  BOOST_TEST(v.dim_sizes == std::vector<std::int64_t>{0}, boost::test_tools::per_element());
  const TbHParams h = decode_hparams(v.plugin_content);
  BOOST_TEST(h.version <= 0); // 0, left out as protobuf leaves a default
  BOOST_TEST(h.session_start);
  BOOST_TEST(h.start_time.value_or(0) == 1700000000.5);
  BOOST_TEST_REQUIRE(h.values.size() == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    BOOST_TEST_CONTEXT(values[i].name) {
      BOOST_TEST(h.values[i].first == values[i].name);
      BOOST_TEST((h.values[i].second == values[i].value)); // a 0 and a false are there too
    }
  }
}

BOOST_AUTO_TEST_CASE(a_flipped_byte_or_a_cut_is_detected) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  w->scalar("loss", 1, 2.0, 0.5);
  w->text("notes", 2, 3.0, "some text");
  BOOST_TEST(!w->close());
  const std::string good = slurp(w->path());
  BOOST_TEST_REQUIRE(read_records(good).problem.empty());
  BOOST_TEST_REQUIRE(read_records(good).data.size() == 3u);

  // Every byte, flipped one bit at a time, is caught.
  for (std::size_t i = 0; i < good.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      const Records r = read_records(bad);
      BOOST_TEST_REQUIRE(!r.problem.empty(), "byte " << i << " bit " << bit << " went unnoticed");
    }
  // Named for what it hit: the length, its CRC, the data, the data's CRC.
  auto flipped = [&](std::size_t i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    return read_records(bad).problem;
  };
  const std::size_t first_len = static_cast<std::size_t>(little_endian(std::string_view(good).substr(0, 8)));
  BOOST_TEST(flipped(0).starts_with("length CRC mismatch"));
  BOOST_TEST(flipped(9).starts_with("length CRC mismatch"));
  BOOST_TEST(flipped(12).starts_with("data CRC mismatch"));
  BOOST_TEST(flipped(12 + first_len).starts_with("data CRC mismatch"));
  BOOST_TEST(flipped(good.size() - 1).find("record 2") != std::string::npos);

  // Cut anywhere inside a record: truncated.
  const std::size_t second = 12 + first_len + 4;
  for (std::size_t cut : {good.size() - 1, good.size() - 4, second + 5, second + 12, std::size_t{3}}) {
    const Records r = read_records(std::string_view(good).substr(0, cut));
    BOOST_TEST(r.problem.starts_with("truncated"), "cut at " << cut << ": " << r.problem);
  }
  // A cut between records is a shorter, whole file.
  BOOST_TEST(read_records(std::string_view(good).substr(0, second)).problem.empty());
}

BOOST_AUTO_TEST_CASE(two_writers_in_one_second_get_their_own_files) {
  TempDir tmp;
  auto a = make_writer(tmp.str(), 1700000000.0);
  auto b = make_writer(tmp.str(), 1700000000.5);
  BOOST_TEST(a->path() != b->path());
  a->scalar("x", 1, 1700000000.0, 1.0);
  b->scalar("x", 1, 1700000000.5, 2.0);
  BOOST_TEST(!a->close());
  BOOST_TEST(!b->close());
  const auto ea = read_events(a->path());
  const auto eb = read_events(b->path());
  BOOST_TEST_REQUIRE(ea.size() == 2u);
  BOOST_TEST_REQUIRE(eb.size() == 2u);
  BOOST_TEST(*ea[1].values[0].simple_value == 1.0f);
  BOOST_TEST(*eb[1].values[0].simple_value == 2.0f);
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path)) {
    ++files;
    BOOST_TEST(((entry.status().permissions() & std::filesystem::perms::all) ==
                (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write)));
  }
  BOOST_TEST(files == 2u);
}

BOOST_AUTO_TEST_CASE(a_directory_that_is_a_file_is_an_error_naming_it) {
  TempDir tmp;
  const std::string file = tmp / "plain";
  { std::ofstream(file) << "x"; }
  for (const std::string& dir : {file, file + "/run"}) {
    auto w = upload::TfEventsWriter::create(dir, 1.0);
    BOOST_TEST_REQUIRE(!w.has_value());
    BOOST_TEST(w.error().code() == Errc::io_error);
    BOOST_TEST(w.error().message().find(file) != std::string::npos, w.error().message());
    BOOST_TEST(w.error().message().find("Not a directory") != std::string::npos, w.error().message());
  }
  auto empty = upload::TfEventsWriter::create("", 1.0);
  BOOST_TEST_REQUIRE(!empty.has_value());
  BOOST_TEST(empty.error().code() == Errc::invalid_argument);
}

BOOST_AUTO_TEST_CASE(records_are_buffered_until_flush_or_a_mebibyte) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  const std::uint64_t first = w->bytes_written();
  w->scalar("loss", 1, 1.0, 1.0);
  BOOST_TEST(w->bytes_written() == first);
  BOOST_TEST(std::filesystem::file_size(w->path()) == first);
  BOOST_TEST(!w->flush());
  BOOST_TEST(w->bytes_written() > first);
  BOOST_TEST(std::filesystem::file_size(w->path()) == w->bytes_written());

  // Past about 1 MiB, records go out without a flush.
  const std::uint64_t before = w->bytes_written();
  const std::string chunk(8192, 'y');
  for (int i = 0; i < 200; ++i) w->text("big", i, 1.0, chunk);
  BOOST_TEST(w->bytes_written() > before + (upload::TfEventsWriter::buffer_limit / 2));
  BOOST_TEST(std::filesystem::file_size(w->path()) == w->bytes_written());
  BOOST_TEST(!w->close());
  BOOST_TEST(read_events(w->path()).size() == 202u);
}

BOOST_AUTO_TEST_CASE(the_destructor_flushes_and_close_takes_nothing_more) {
  TempDir tmp;
  std::string path;
  {
    auto w = make_writer(tmp.str());
    path = w->path();
    w->scalar("loss", 1, 1.0, 1.0);
  }
  BOOST_TEST(read_events(path).size() == 2u);

  auto w = make_writer(tmp.str());
  BOOST_TEST(!w->close());
  w->scalar("late", 1, 1.0, 1.0);
  const Error e = w->close();
  BOOST_TEST(e.code() == Errc::finished);
  BOOST_TEST(e.message().find("after close()") != std::string::npos, e.message());
  BOOST_TEST(read_events(w->path()).size() == 1u);
}

// A file that cannot grow (RLIMIT_FSIZE: write(2) fails with EFBIG once the
// file reaches it, as a full disk fails with ENOSPC): flush() names the file
// and the cause, the file keeps only whole records, and a later flush, with
// room again, writes what was kept.
BOOST_AUTO_TEST_CASE(a_failed_flush_names_the_file_and_damages_nothing) {
  TempDir tmp;
  auto w = make_writer(tmp.str());
  const std::uint64_t first = w->bytes_written();
  for (int i = 0; i < 100; ++i) w->scalar("loss", i, 1700000000.0 + i, i * 0.5);

  rlimit old{};
  BOOST_TEST_REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = first + 1000; // room for part of the buffer: a short write, then EFBIG
  BOOST_TEST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  const Error e = w->flush();
  BOOST_TEST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);
  std::signal(SIGXFSZ, old_handler);

  BOOST_TEST(e.code() == Errc::io_error);
  BOOST_TEST(e.message().find(w->path()) != std::string::npos, e.message());
  BOOST_TEST(e.message().find(std::strerror(EFBIG)) != std::string::npos, e.message());
  BOOST_TEST(e.message().find("ulimit -f") != std::string::npos, e.message());
  // Cut back to the last whole record: what was written before is intact.
  BOOST_TEST(w->bytes_written() == first);
  BOOST_TEST(std::filesystem::file_size(w->path()) == first);
  BOOST_TEST(read_events(w->path()).size() == 1u);

  // With room again, the kept records go out.
  BOOST_TEST(!w->flush());
  BOOST_TEST(!w->close());
  const auto events = read_events(w->path());
  BOOST_TEST_REQUIRE(events.size() == 101u);
  BOOST_TEST(events[100].step == 99);
  BOOST_TEST(*events[100].values[0].simple_value == 49.5f);
}

BOOST_AUTO_TEST_CASE(a_configs_keys_become_hyperparameters) {
  simdjson::dom::parser parser;
  simdjson::dom::object config;
  BOOST_TEST_REQUIRE(!parser.parse(std::string_view(
                                       R"({"lr":0.001,"steps":100,"amp":true,"name":"x","layers":[1,2],"opt":{"b":0.9},"none":null})"))
                          .get(config));
  const std::vector<upload::HParam> h = upload::hparams_of(config);
  BOOST_TEST_REQUIRE(h.size() == 6u); // the null left out
  BOOST_TEST(std::get<double>(h[0].value) == 0.001);
  BOOST_TEST(std::get<double>(h[1].value) == 100.0);
  BOOST_TEST(std::get<bool>(h[2].value));
  BOOST_TEST(std::get<std::string>(h[3].value) == "x");
  BOOST_TEST(h[4].name == "layers");
  BOOST_TEST(std::get<std::string>(h[4].value) == "[1,2]");
  BOOST_TEST(std::get<std::string>(h[5].value) == R"({"b":0.9})");
}
