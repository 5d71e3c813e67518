#define BOOST_TEST_MODULE io_json
#include <boost/test/unit_test.hpp>

#include "runtime/core/json.hpp"
#include "runtime/core/shortest.hpp"

#include <simdjson.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace chorus;
using namespace chorus::core;

namespace {

// Parses `json` (which must be valid) and returns its root.
simdjson::dom::element parse(simdjson::dom::parser& p, const std::string& json) {
  simdjson::dom::element e;
  const auto err = p.parse(json).get(e);
  BOOST_TEST_REQUIRE(!err, "invalid JSON (" << simdjson::error_message(err) << "): " << json);
  return e;
}

std::string as_string(double v) {
  std::string s;
  JsonWriter(s).number(v);
  return s;
}

std::string json_str(std::string_view v) {
  std::string s;
  JsonWriter(s).string(v);
  return s;
}

// The string a JSON string literal decodes to.
std::string decoded(const std::string& json) {
  simdjson::dom::parser p;
  std::string_view sv;
  BOOST_TEST_REQUIRE(!parse(p, json).get(sv), "not a string: " << json);
  return std::string(sv);
}

} // namespace

BOOST_AUTO_TEST_CASE(structure_and_commas) {
  std::string out;
  JsonWriter w(out);
  w.begin_object();
  w.key("a").integer(1);
  w.key("b").begin_array().integer(1).integer(2).begin_object().key("c").null().end_object().end_array();
  w.key("d").begin_object().end_object();
  w.key("e").begin_array().end_array();
  w.key("f").boolean(true).key("g").boolean(false).key("h").raw("[1,2]");
  w.key("i").begin_array().begin_array().end_array().begin_array().string("x").end_array().end_array();
  w.end_object();
  BOOST_TEST(out == R"({"a":1,"b":[1,2,{"c":null}],"d":{},"e":[],"f":true,"g":false,"h":[1,2],"i":[[],["x"]]})");
  simdjson::dom::parser p;
  parse(p, out);
}

BOOST_AUTO_TEST_CASE(writer_appends_to_existing_text) {
  std::string out = "prefix ";
  JsonWriter(out).begin_array().integer(-5).end_array();
  BOOST_TEST(out == "prefix [-5]");
}

BOOST_AUTO_TEST_CASE(integers_at_the_limits) {
  std::string out;
  JsonWriter w(out);
  w.begin_array()
      .integer(std::numeric_limits<std::int64_t>::min())
      .integer(std::numeric_limits<std::int64_t>::max())
      .uinteger(std::numeric_limits<std::uint64_t>::max())
      .end_array();
  BOOST_TEST(out == "[-9223372036854775808,9223372036854775807,18446744073709551615]");
  simdjson::dom::parser p;
  parse(p, out);
}

BOOST_AUTO_TEST_CASE(numbers_round_trip_exactly) {
  std::vector<double> vs = {0.0,
                            -0.0,
                            1.0,
                            -1.0,
                            0.1,
                            1e-3,
                            123456789012345678.0,
                            1e22,
                            1e19,
                            -9.3e18,
                            0x1p63,
                            0x1p64,
                            1e300,
                            -2.5e-300,
                            std::numeric_limits<double>::min(),
                            std::numeric_limits<double>::denorm_min(),
                            std::numeric_limits<double>::max(),
                            std::numeric_limits<double>::lowest(),
                            std::numeric_limits<double>::epsilon()};
  std::mt19937_64 rng(11);
  while (vs.size() < 5000) {
    const double d = std::bit_cast<double>(rng());
    if (std::isfinite(d)) vs.push_back(d);
  }
  simdjson::dom::parser p;
  for (const double v : vs) {
    const std::string s = as_string(v);
    BOOST_TEST_CONTEXT(s) {
      double back = 0;
      BOOST_TEST_REQUIRE(!parse(p, s).get_double().get(back));
      BOOST_TEST(std::bit_cast<std::uint64_t>(back) == std::bit_cast<std::uint64_t>(v));
    }
  }
  BOOST_TEST(as_string(0.1) == "0.1");
  BOOST_TEST(as_string(2.0) == "2");
  BOOST_TEST(as_string(-0.0) == "-0.0");
  BOOST_TEST(as_string(1e20) == "1e+20");
  BOOST_TEST(as_string(123456789012345678.0) == "123456789012345680");
  BOOST_TEST(as_string(-136742926958265417728.0) == "-1.3674292695826542e+20");
}

BOOST_AUTO_TEST_CASE(shortest_writes_what_to_chars_writes) {
  // core::shortest against std::to_chars, byte for byte: random bit
  // patterns, every binary exponent at its edges, decimal powers and their
  // neighbours, the subnormals, integers about 2^53, floats made doubles.
  std::mt19937_64 rng(12);
  std::size_t checked = 0, differ = 0;
  const auto same = [&](double v) {
    if (!std::isfinite(v) || v == 0) return;
    char want[64], got[chorus::core::shortest_room];
    const char* w = std::to_chars(want, want + sizeof want, v).ptr;
    const char* g = chorus::core::shortest(got, v);
    ++checked;
    if (std::string_view(want, static_cast<std::size_t>(w - want)) != std::string_view(got, static_cast<std::size_t>(g - got)) &&
        ++differ <= 5)
      BOOST_ERROR(std::string(static_cast<const char*>(want), w) << " written as " << std::string(static_cast<const char*>(got), g));
  };
  for (int i = 0; i < 1'000'000; ++i) same(std::bit_cast<double>(rng()));
  for (int e = -1074; e <= 1023; ++e) {
    const double p = std::ldexp(1.0, e);
    for (const double v : {p, std::nextafter(p, 0.0), std::nextafter(p, 2 * p), 1.5 * p,
                           std::ldexp(static_cast<double>((std::uint64_t{1} << 53) - 1), e - 52)}) {
      same(v);
      same(-v);
    }
  }
  for (int e = -330; e <= 310; ++e)
    for (const double m : {1.0, 1.5, 2.0, 5.0, 9.999999999999999, 1.0000000000000002, 0.1, 0.3, 123456789.0}) {
      const double v = m * std::pow(10.0, e);
      same(v);
      same(std::nextafter(v, 0.0));
      same(std::nextafter(v, 1e308));
    }
  for (std::uint64_t t = 1; t < 20'000; ++t) same(std::bit_cast<double>(t));
  // Short decimals (a learning rate, an accuracy over 1,000 samples): the
  // interval's arithmetic gives their digits with up to 16 zeros behind.
  for (std::int64_t k = 1; k < 2'000; ++k)
    for (int e = -25; e <= 25; ++e) {
      same(static_cast<double>(k) * std::pow(10.0, e));
      same(static_cast<double>(k) / std::pow(10.0, e));
    }
  for (std::int64_t i = -20'000; i < 20'000; ++i) {
    same(static_cast<double>(i));
    same(static_cast<double>(i) * 0.001);
    same(static_cast<double>((std::int64_t{1} << 53) + i * 64));
    same(static_cast<double>(static_cast<float>(std::bit_cast<double>(rng()))));
  }
  BOOST_TEST(differ == 0u);
  BOOST_TEST(checked > 1'300'000u);
}

BOOST_AUTO_TEST_CASE(non_finite_numbers_are_strings) {
  BOOST_TEST(as_string(std::numeric_limits<double>::quiet_NaN()) == "\"NaN\"");
  BOOST_TEST(as_string(-std::numeric_limits<double>::quiet_NaN()) == "\"NaN\"");
  BOOST_TEST(as_string(std::numeric_limits<double>::infinity()) == "\"Infinity\"");
  BOOST_TEST(as_string(-std::numeric_limits<double>::infinity()) == "\"-Infinity\"");
  // In a document they stay valid JSON and read back as the same spelling.
  std::string out;
  JsonWriter w(out);
  w.begin_object()
      .key("nan")
      .number(std::nan(""))
      .key("inf")
      .number(HUGE_VAL)
      .key("ninf")
      .number(-HUGE_VAL)
      .end_object();
  simdjson::dom::parser p;
  auto root = parse(p, out);
  std::string_view s;
  BOOST_TEST(!root["nan"].get(s));
  BOOST_TEST(s == "NaN");
  BOOST_TEST(!root["inf"].get(s));
  BOOST_TEST(s == "Infinity");
  BOOST_TEST(!root["ninf"].get(s));
  BOOST_TEST(s == "-Infinity");
  BOOST_TEST(std::isnan(std::strtod("NaN", nullptr)));
  BOOST_TEST(std::strtod("-Infinity", nullptr) == -HUGE_VAL);
}

BOOST_AUTO_TEST_CASE(escapes) {
  BOOST_TEST(json_str("plain") == "\"plain\"");
  BOOST_TEST(json_str("a\"b\\c") == R"("a\"b\\c")");
  BOOST_TEST(json_str("\n\t\r\b\f") == R"("\n\t\r\b\f")");
  BOOST_TEST(json_str(std::string_view("\0\x01\x1f", 3)) == R"("\u0000\u0001\u001f")");
  BOOST_TEST(json_str("/\x7f") == "\"/\x7f\"");
  std::string all;
  for (int c = 0; c < 0x80; ++c) all.push_back(static_cast<char>(c));
  BOOST_TEST(decoded(json_str(all)) == all);
  BOOST_TEST(json_str("") == "\"\"");
  BOOST_TEST(json_str("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80") == "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"");
}

BOOST_AUTO_TEST_CASE(invalid_utf8_is_replaced) {
  const std::string r = "\xEF\xBF\xBD"; // U+FFFD
  struct Case {
    std::string in;
    std::string out;
  };
  const std::vector<Case> cases = {
      {"\x80", r},                                    // lone continuation
      {"a\xFFz", "a" + r + "z"},                      // never valid
      {"\xC0\xAF", r + r},                            // overlong lead
      {"\xE0\x80\xAF", r + r + r},                    // overlong 3-byte
      {"\xED\xA0\x80", r + r + r},                    // surrogate
      {"\xF4\x90\x80\x80", r + r + r + r},            // above U+10FFFF
      {"\xF5\x80", r + r},                            // lead out of range
      {"\xE2\x82", r},                                // truncated at the end
      {"a\xE2\x82z", "a" + r + "z"},                  // truncated in the middle: one U+FFFD
      {"\xF0\x9F\x98x", r + "x"},                     // truncated 4-byte
      {"\xE2\x82\xAC\xE2", "\xE2\x82\xAC" + r},       // good then cut
      {"\xF4\x8F\xBF\xBF", "\xF4\x8F\xBF\xBF"},       // U+10FFFF itself is fine
  };
  for (const auto& c : cases) {
    const std::string q = json_str(c.in);
    BOOST_TEST_CONTEXT(q) {
      BOOST_TEST(valid_utf8(q));
      BOOST_TEST(decoded(q) == c.out);
    }
  }
}

BOOST_AUTO_TEST_CASE(random_strings_always_give_valid_json) {
  std::mt19937_64 rng(12);
  simdjson::dom::parser p;
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 40, '\0');
    for (auto& c : s) {
      // Mostly high bytes and controls: where the trouble is.
      const auto x = rng() % 4;
      c = static_cast<char>(x == 0 ? rng() % 0x20 : x == 1 ? 0x80 + rng() % 0x80 : rng());
    }
    const std::string q = json_str(s);
    BOOST_TEST_CONTEXT("input of " << s.size() << " bytes, case " << i) {
      BOOST_TEST_REQUIRE(valid_utf8(q));
      std::string_view back;
      BOOST_TEST_REQUIRE(!parse(p, q).get(back));
      if (valid_utf8(s)) BOOST_TEST_REQUIRE(back == s);
      // The strict check agrees with simdjson's validator.
      BOOST_TEST_REQUIRE(valid_utf8(s) == simdjson::validate_utf8(s.data(), s.size()));
    }
  }
}

BOOST_AUTO_TEST_CASE(valid_utf8_edges) {
  BOOST_TEST(valid_utf8(""));
  BOOST_TEST(valid_utf8("hello, world"));
  BOOST_TEST(valid_utf8(std::string_view("a\0b", 3)));
  BOOST_TEST(valid_utf8("\xC2\x80"));         // U+0080
  BOOST_TEST(valid_utf8("\xDF\xBF"));         // U+07FF
  BOOST_TEST(valid_utf8("\xE0\xA0\x80"));     // U+0800
  BOOST_TEST(valid_utf8("\xED\x9F\xBF"));     // U+D7FF
  BOOST_TEST(valid_utf8("\xEE\x80\x80"));     // U+E000
  BOOST_TEST(valid_utf8("\xEF\xBF\xBF"));     // U+FFFF
  BOOST_TEST(valid_utf8("\xF0\x90\x80\x80")); // U+10000
  BOOST_TEST(valid_utf8("\xF4\x8F\xBF\xBF")); // U+10FFFF

  BOOST_TEST(!valid_utf8("\x80"));
  BOOST_TEST(!valid_utf8("\xBF"));
  BOOST_TEST(!valid_utf8("\xC0\x80"));         // overlong NUL
  BOOST_TEST(!valid_utf8("\xC1\xBF"));         // overlong
  BOOST_TEST(!valid_utf8("\xE0\x9F\xBF"));     // overlong
  BOOST_TEST(!valid_utf8("\xF0\x8F\xBF\xBF")); // overlong
  BOOST_TEST(!valid_utf8("\xED\xA0\x80"));     // U+D800
  BOOST_TEST(!valid_utf8("\xED\xBF\xBF"));     // U+DFFF
  BOOST_TEST(!valid_utf8("\xF4\x90\x80\x80")); // U+110000
  BOOST_TEST(!valid_utf8("\xF5\x80\x80\x80"));
  BOOST_TEST(!valid_utf8("\xFE"));
  BOOST_TEST(!valid_utf8("\xFF"));
  BOOST_TEST(!valid_utf8("\xC2"));             // truncated
  BOOST_TEST(!valid_utf8("\xE2\x82"));
  BOOST_TEST(!valid_utf8("\xF0\x9F\x98"));
  BOOST_TEST(!valid_utf8("\xC2\x41"));         // continuation missing
  // Past the eight-byte ASCII fast path.
  BOOST_TEST(!valid_utf8("abcdefghijklmnop\x80"));
  BOOST_TEST(valid_utf8("abcdefghijklmnop\xC3\xA9qrstuvwxyz01234567"));
  BOOST_TEST(!valid_utf8("abcdefgh\xC3\xA9ijklmnop\xED\xA0\x80qrstuvwx"));
}

BOOST_AUTO_TEST_CASE(values_and_fields) {
  std::string out;
  JsonWriter w(out);
  w.begin_array()
      .value(Value())
      .value(Value(true))
      .value(Value(-42))
      .value(Value(0.5))
      .value(Value("s\"x"))
      .value(Value(std::nan("")))
      .end_array();
  BOOST_TEST(out == R"([null,true,-42,0.5,"s\"x","NaN"])");

  const std::vector<Field> fields = {{"lr", 1e-3}, {"name", "adam"}, {"layers", 12}, {"bad\xFFkey", true}};
  const std::string obj = fields_to_json(fields);
  BOOST_TEST(obj == "{\"lr\":0.001,\"name\":\"adam\",\"layers\":12,\"bad\xEF\xBF\xBDkey\":true}");
  simdjson::dom::parser p;
  auto root = parse(p, obj);
  double lr = 0;
  BOOST_TEST(!root["lr"].get(lr));
  BOOST_TEST(lr == 1e-3);
  BOOST_TEST(fields_to_json({}) == "{}");
}
