// A row of history.jsonl read by the store's one reader of it
// (io/store/history_row.hpp): its step's one rule, its times, its values and
// their counts, the keys that are chorus's own.
#define BOOST_TEST_MODULE io_history_row
#include <boost/test/unit_test.hpp>

#include "io/store/history_row.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace chorus::store;

namespace {

/// A line parsed as the readers parse it, kept with its parser.
struct Parsed {
  simdjson::dom::parser parser;
  simdjson::dom::object object;
  explicit Parsed(const std::string& line) {
    if (parser.parse(line).get(object) != simdjson::SUCCESS) throw std::runtime_error("not a JSON object: " + line);
  }
};

/// Why a row with `step` written as its _step is none ("" where it is one).
std::string why_of(const std::string& step) {
  Parsed p(R"({"_step":)" + step + R"(,"loss":1})");
  return std::string(HistoryRow(p.object).why());
}

std::vector<std::pair<std::string, double>> values(const RowValues& vs) {
  std::vector<std::pair<std::string, double>> out;
  for (const RowValue& v : vs) out.emplace_back(v.key, v.value);
  return out;
}

using Values = std::vector<std::pair<std::string, double>>;

} // namespace

BOOST_AUTO_TEST_CASE(a_row_as_the_writer_writes_it) {
  Parsed p(R"({"_step":42,"_timestamp":1700000000.25,"_runtime":12.5,"loss":0.5,"acc/rank-1":3,)"
           R"("_count":{"loss":4}})");
  const HistoryRow row(p.object);
  BOOST_TEST(static_cast<bool>(row));
  BOOST_TEST(row.why().empty());
  BOOST_TEST(row.step() == 42);
  BOOST_TEST(row.timestamp().value_or(-1) == 1700000000.25);
  BOOST_TEST(row.runtime().value_or(-1) == 12.5);
  BOOST_TEST(values(row.metrics()) == (Values{{"loss", 0.5}, {"acc/rank-1", 3}}));
  BOOST_TEST(values(row.counts()) == (Values{{"loss", 4}}));
  BOOST_TEST(row.count("loss").value_or(-1) == 4);
  BOOST_TEST(!row.count("acc/rank-1"));
  // A value keeps its JSON as written, for a reader that copies it.
  const RowValue first = *row.metrics().begin();
  BOOST_TEST(simdjson::minify(first.json) == "0.5");
}

BOOST_AUTO_TEST_CASE(the_steps_of_a_row) {
  BOOST_TEST(why_of("0") == "");
  BOOST_TEST(why_of("9223372036854775806") == "");
  Parsed p(R"({"_step":9223372036854775806})");
  BOOST_TEST(HistoryRow(p.object).step() == HistoryRow::max_step);
}

BOOST_AUTO_TEST_CASE(each_bad_step_names_its_cause) {
  Parsed missing(R"({"loss":1,"_timestamp":1})");
  const HistoryRow none(missing.object);
  BOOST_TEST(!none);
  BOOST_TEST(none.why() == "no _step");
  BOOST_TEST(none.step() == 0);
  BOOST_TEST(why_of(R"("3")") == "a _step that is not a number");
  BOOST_TEST(why_of("null") == "a _step that is not a number");
  BOOST_TEST(why_of("true") == "a _step that is not a number");
  BOOST_TEST(why_of("1.5") == "a _step not written as a whole number");
  BOOST_TEST(why_of("2.0") == "a _step not written as a whole number"); // whole, but not as the writer writes it
  BOOST_TEST(why_of("1e300") == "a _step not written as a whole number");
  BOOST_TEST(why_of("-1") == "a _step below 0");
  BOOST_TEST(why_of("9223372036854775807") == "a _step above 9223372036854775806");
  BOOST_TEST(why_of("9223372036854775808") == "a _step above 9223372036854775806"); // 2^63
  BOOST_TEST(why_of("18446744073709551615") == "a _step above 9223372036854775806");
}

BOOST_AUTO_TEST_CASE(non_finite_values_are_values) {
  Parsed p(R"({"_step":1,"a":"NaN","b":"Infinity","c":"-Infinity","d":"nan","e":null,"f":[1],"g":{"x":1},"h":true})");
  const HistoryRow row(p.object);
  const Values got = values(row.metrics());
  BOOST_REQUIRE(got.size() == 3u); // "nan", null, an array, an object and a bool are no values
  BOOST_TEST(got[0].first == "a");
  BOOST_TEST(std::isnan(got[0].second));
  BOOST_TEST(got[1].first == "b");
  BOOST_TEST(got[1].second == INFINITY);
  BOOST_TEST(got[2].first == "c");
  BOOST_TEST(got[2].second == -INFINITY);
  BOOST_TEST(simdjson::minify(row.metrics().begin()->json) == R"("NaN")");
}

BOOST_AUTO_TEST_CASE(reserved_keys_are_no_values) {
  // Every key starting with '_' is chorus's own, the known ones and any other;
  // an empty key is no metric's either.
  Parsed p(R"({"_step":7,"_timestamp":1,"_runtime":2,"_node":3,"_rank":0,"_other":5,"":6,"x_":8,"a/_b":9,)"
           R"("_count":{"x_":2}})");
  const HistoryRow row(p.object);
  BOOST_TEST(values(row.metrics()) == (Values{{"x_", 8}, {"a/_b", 9}}));
  BOOST_TEST(reserved_key("_step"));
  BOOST_TEST(reserved_key("_count"));
  BOOST_TEST(reserved_key("_other"));
  BOOST_TEST(!reserved_key("x_"));
  BOOST_TEST(!reserved_key(""));
  BOOST_TEST(row_field("_step"));
  BOOST_TEST(row_field("_timestamp"));
  BOOST_TEST(row_field("_runtime"));
  BOOST_TEST(!row_field("_count"));
  BOOST_TEST(!row_field("_other"));
  // The values of any object read the same way (a system.jsonl sample).
  BOOST_TEST(values(RowValues(p.object)) == (Values{{"x_", 8}, {"a/_b", 9}}));
  BOOST_TEST(values(RowValues()).empty());
}

BOOST_AUTO_TEST_CASE(counts_of_a_row) {
  Parsed p(R"({"_step":1,"a":1,"b":2,"c":3,"_count":{"a":2,"b":"NaN","_step":3,"c":1.5}})");
  const HistoryRow row(p.object);
  BOOST_TEST(values(row.counts()) == (Values{{"a", 2}, {"c", 1.5}})); // numbers only, of metric keys
  BOOST_TEST(row.count("a").value_or(-1) == 2);
  BOOST_TEST(!row.count("b"));
  BOOST_TEST(!row.count("_step"));
  BOOST_TEST(!row.count("nosuch"));

  Parsed none(R"({"_step":1,"a":1})");
  BOOST_TEST(values(HistoryRow(none.object).counts()).empty());
  BOOST_TEST(!HistoryRow(none.object).count("a"));
  Parsed not_object(R"({"_step":1,"a":1,"_count":4})");
  BOOST_TEST(values(HistoryRow(not_object.object).counts()).empty());
  BOOST_TEST(!HistoryRow(not_object.object).count("a"));
}

BOOST_AUTO_TEST_CASE(each_is_metrics_and_counts_in_one_pass) {
  Parsed p(R"({"_step":1,"_count":{"a":2,"b":"NaN"},"a":1,"_x":5,"b":"Infinity","c":"text","_count":{"c":9}})");
  const HistoryRow row(p.object);
  Values got_values, got_counts;
  row.each([&](const RowValue& v) { got_values.emplace_back(v.key, v.value); },
           [&](const RowValue& n) { got_counts.emplace_back(n.key, n.value); });
  BOOST_TEST(got_values == values(row.metrics()));
  BOOST_TEST(got_values == (Values{{"a", 1}, {"b", INFINITY}}));
  BOOST_TEST(got_counts == values(row.counts())); // the first _count, as a lookup finds it
  BOOST_TEST(got_counts == (Values{{"a", 2}}));
}

BOOST_AUTO_TEST_CASE(times_are_numbers_or_nothing) {
  Parsed p(R"({"_step":1,"_timestamp":"NaN","_runtime":3})");
  const HistoryRow row(p.object);
  BOOST_TEST(!row.timestamp());
  BOOST_TEST(row.runtime().value_or(-1) == 3);
  Parsed none(R"({"_step":1})");
  BOOST_TEST(!HistoryRow(none.object).timestamp());
  BOOST_TEST(!HistoryRow(none.object).runtime());
}
