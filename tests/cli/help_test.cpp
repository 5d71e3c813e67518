// The help of `chorus` against its command table: every command in the
// table has its help, and every help text and message names every command.
#define BOOST_TEST_MODULE cli_help
#include <boost/test/unit_test.hpp>

#include "cli/cli.hpp"
#include "tests/cli/process.hpp"

#include <set>

using namespace chorus::test;
using chorus::cli::Command;
using chorus::cli::commands;

namespace {

/// `text` with every run of white space one space: help texts wrap their lines.
std::string folded(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool space = c == ' ' || c == '\n' || c == '\t';
    if (!space)
      out += c;
    else if (!out.empty() && out.back() != ' ')
      out += ' ';
  }
  return out;
}

/// Whether `help` (chorus's top-level help) lists `c` with its summary.
bool lists(const std::string& help, const Command& c) {
  bool at_line_start = false;
  for (const std::string& line : lines_of(help))
    at_line_start = at_line_start || line.starts_with("  " + std::string(c.name) + " ");
  return at_line_start && contains(folded(help), std::string(c.name) + " " + folded(c.summary));
}

} // namespace

BOOST_AUTO_TEST_CASE(the_table_is_whole) {
  BOOST_TEST(!commands.empty());
  std::set<std::string_view> names;
  for (const Command* c : commands) {
    BOOST_TEST_CONTEXT(c->name) {
      BOOST_TEST(names.insert(c->name).second, "a second command called " << c->name);
      BOOST_TEST(!c->name.empty());
      BOOST_TEST(!c->summary.empty());
      BOOST_TEST(!contains(std::string(c->summary), "\n"), "a summary is one line");
      BOOST_TEST(!c->usage.empty());
      BOOST_TEST(c->help.ends_with("\n"));
      BOOST_TEST(c->main != nullptr);
      BOOST_TEST(chorus::cli::find_command(c->name) == c);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_command_has_help_with_its_summary) {
  for (const Command* c : commands) {
    const std::string name(c->name);
    BOOST_TEST_CONTEXT("chorus " << name << " --help") {
      const Output help = run_chorus({name, "--help"});
      BOOST_TEST(help.code == 0, help.err);
      BOOST_TEST(contains(folded(help.out), folded(c->summary)), help.out);
      BOOST_TEST(contains(help.out, "usage: chorus " + name + " "), help.out);
      BOOST_TEST(contains(help.out, help_body(*c)));
      BOOST_TEST(!contains(help.out, "@GENERATED@"));
      BOOST_TEST(help.err.empty(), help.err);
      // The same text from -h and from `chorus help NAME`.
      const Output short_flag = run_chorus({name, "-h"});
      BOOST_TEST(short_flag.code == 0);
      BOOST_TEST(short_flag.out == help.out);
      const Output help_command = run_chorus({"help", name});
      BOOST_TEST(help_command.code == 0);
      BOOST_TEST(help_command.out == help.out);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_top_level_help_lists_every_command) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{{"--help"}, {"-h"}, {"help"}}) {
    const Output help = run_chorus(args);
    BOOST_TEST_CONTEXT("chorus " << args[0]) {
      BOOST_TEST(help.code == 0);
      BOOST_TEST(contains(help.out, "usage: chorus COMMAND"));
      for (const Command* c : commands) BOOST_TEST(lists(help.out, *c), c->name << " is not listed:\n" << help.out);
    }
  }
  // Without a command: the same list on stderr, and a usage error.
  const Output bare = run_chorus({});
  BOOST_TEST(bare.code == 2);
  BOOST_TEST(bare.out.empty());
  for (const Command* c : commands) BOOST_TEST(lists(bare.err, *c), c->name << " is not listed:\n" << bare.err);
}

BOOST_AUTO_TEST_CASE(an_unknown_command_is_told_every_command) {
  const Output o = run_chorus({"frobnicate", "--help"});
  BOOST_TEST(o.code == 2);
  BOOST_TEST(o.out.empty());
  BOOST_TEST(contains(o.err, "chorus: unknown command 'frobnicate'"), o.err);
  const auto list = o.err.find("The commands are ");
  BOOST_REQUIRE(list != std::string::npos);
  std::string words = o.err.substr(list);
  words = words.substr(0, words.find('\n'));
  for (char& ch : words)
    if (ch == ',') ch = ' ';
  for (const Command* c : commands)
    BOOST_TEST(contains(words + " ", " " + std::string(c->name) + " "), c->name << " is not named: " << words);
}
