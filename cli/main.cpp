// `chorus`: launch the ranks of a job, and look after the runs they wrote.
// The commands are listed in cli.hpp (`commands`); each is defined, with its
// help text, in a file of its own.
#include "cli/cli.hpp"

#include <cstdio>
#include <span>
#include <string_view>

int main(int argc, char** argv) {
  using namespace chorus::cli;
  const std::span<char* const> args(argv + 1, static_cast<std::size_t>(argc > 0 ? argc - 1 : 0));
  if (args.empty()) {
    std::fputs(overview().c_str(), stderr);
    return exit_usage;
  }
  const std::string_view word = args[0];
  if (word == "-h" || word == "--help" || word == "help") {
    // `chorus help launch` is `chorus launch --help`.
    if (const Command* c = word == "help" && args.size() > 1 ? find_command(args[1]) : nullptr) return print_help(*c);
    std::fputs(overview().c_str(), stdout);
    return exit_ok;
  }
  if (word == "--version") {
    std::printf("chorus %s\n", CHORUS_VERSION);
    return exit_ok;
  }
  if (const Command* c = find_command(word)) return c->main(args.subspan(1));
  return usage_error("", unknown_command(word));
}
