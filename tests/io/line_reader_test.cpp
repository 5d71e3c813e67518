#define BOOST_TEST_MODULE io_line_reader
#include <boost/test/unit_test.hpp>

#include "io/platform/posix.hpp"
#include "io/store/line_reader.hpp"
#include "tests/io/files.hpp"
#include "tests/temp_dir.hpp"

#include <fcntl.h>

#include <string>
#include <vector>

using namespace chorus;
using namespace chorus::platform;
using namespace chorus::store;
using chorus::test::files::spit;
using chorus::test::TempDir;
using Next = LineReader::Next;

BOOST_TEST_DONT_PRINT_LOG_VALUE(Next)

namespace {

int open_file(const std::string& path) {
  const Result<int> fd = platform::open_regular(path, O_RDONLY);
  BOOST_TEST_REQUIRE(fd.has_value(), fd.error().message());
  return *fd;
}

/// Every line `r` hands out, and how the reading ended.
std::vector<std::string> all_lines(LineReader& r, Next& last) {
  std::vector<std::string> out;
  std::string_view line;
  while ((last = r.next(line)) == Next::line) out.emplace_back(line);
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE(complete_lines_only_and_the_unfinished_rest) {
  TempDir tmp;
  const std::string path = tmp / "h.jsonl";
  spit(path, "{\"a\":1}\n\n{\"b\":2}\n{\"c\":");
  LineReader r(open_file(path), path, {}, {.chunk = 3}); // lines longer than a read
  Next last{};
  const auto lines = all_lines(r, last);
  BOOST_TEST((last == Next::end));
  BOOST_TEST((lines == std::vector<std::string>{"{\"a\":1}", "", "{\"b\":2}"}));
  BOOST_TEST(r.cursor().lines == 3u);
  BOOST_TEST(r.cursor().bytes == 17u);
  BOOST_TEST(r.rest() == "{\"c\":");
}

BOOST_AUTO_TEST_CASE(reading_starts_at_a_cursor_and_stops_at_an_end) {
  TempDir tmp;
  const std::string path = tmp / "h.jsonl";
  spit(path, "one\ntwo\nthree\n");
  LineReader r(open_file(path), path, {1, 4}, {.end = 8});
  Next last{};
  BOOST_TEST((all_lines(r, last) == std::vector<std::string>{"two"}));
  BOOST_TEST((last == Next::end));
  BOOST_TEST(r.cursor().lines == 2u);
  BOOST_TEST(r.read_to() == 8u);
  BOOST_TEST(!r.holds_line());
}

BOOST_AUTO_TEST_CASE(a_file_shorter_than_its_end_fails) {
  TempDir tmp;
  const std::string path = tmp / "h.jsonl";
  spit(path, "one\n");
  LineReader r(open_file(path), path, {}, {.end = 100});
  Next last{};
  BOOST_TEST((all_lines(r, last) == std::vector<std::string>{"one"}));
  BOOST_TEST((last == Next::failed));
  BOOST_TEST(r.error().message().find(path) != std::string::npos, r.error().message());
}

BOOST_AUTO_TEST_CASE(a_line_past_the_bound_stops_the_reading) {
  TempDir tmp;
  const std::string path = tmp / "h.jsonl";
  spit(path, "short\n" + std::string(40, 'x') + "\nafter\n");
  {
    LineReader r(open_file(path), path, {}, {.chunk = 8, .max_line = 32});
    Next last{};
    BOOST_TEST((all_lines(r, last) == std::vector<std::string>{"short"}));
    BOOST_TEST((last == Next::too_long));
    BOOST_TEST(r.cursor().lines == 1u);
  }
  // Without a bound the buffer grows to the line.
  LineReader r(open_file(path), path, {}, {.chunk = 8, .max_line = 0});
  Next last{};
  BOOST_TEST(all_lines(r, last).size() == 3u);
  BOOST_TEST((last == Next::end));
}

BOOST_AUTO_TEST_CASE(lines_are_followed_by_padding) {
  TempDir tmp;
  const std::string path = tmp / "h.jsonl";
  spit(path, "a\nbb\n");
  LineReader r(open_file(path), path, {}, {.chunk = 5});
  std::string_view line;
  while (r.next(line) == Next::line) {
    // Readable (the sanitizers would say otherwise): the padding is in the buffer.
    volatile char sink = 0;
    for (std::size_t i = 0; i < LineReader::padding; ++i) sink = static_cast<char>(sink ^ line.data()[line.size() + i]);
    (void)sink;
  }
  BOOST_TEST(r.cursor().lines == 2u);
}
