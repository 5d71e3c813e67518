// `chorus`: launch the ranks of a job, and look after the runs they wrote.
#include "cli/cli.hpp"

#include <array>
#include <cstdio>
#include <span>
#include <string_view>

namespace {

constexpr std::string_view help_text = R"(usage: chorus COMMAND [ARGS...]

Experiment tracking for distributed training: start a job's ranks, and list,
show and repair the runs they logged.

commands:
  launch   start N local ranks with torchrun's environment, prefix their output,
           forward signals and exit with the worst rank's code
  ls       list the runs under a run directory, grouped by project and group
  show     a run's identity, ranks, config, summary and a chart per metric; a
           group's runs side by side
  recover  rebuild a run's files from its write-ahead log after its host crashed
  certs    make the credentials that authenticate a job's nodes to each other
  sync     upload runs to MLflow or W&B (offline runs, cut-off uploads), or
           show how far their uploads got (--status)

Run 'chorus COMMAND --help' for a command's options.

Runs live under $CHORUS_DIR (default ./chorus-runs) as PROJECT/GROUP/RUN-ID/.

exit codes: 0 success, 1 the command failed, 2 the command line was wrong
(launch exits with the worst code of its ranks instead).
)";

struct Command {
  std::string_view name;
  int (*main)(std::span<char* const>);
};

constexpr std::array<Command, 6> commands{{
    {"launch", chorus::cli::launch_main},
    {"ls", chorus::cli::ls_main},
    {"show", chorus::cli::show_main},
    {"recover", chorus::cli::recover_main},
    {"certs", chorus::cli::certs_main},
    {"sync", chorus::cli::sync_main},
}};

} // namespace

int main(int argc, char** argv) {
  const std::span<char* const> args(argv + 1, static_cast<std::size_t>(argc > 0 ? argc - 1 : 0));
  if (args.empty()) {
    std::fputs(help_text.data(), stderr);
    return chorus::cli::exit_usage;
  }
  const std::string_view word = args[0];
  if (word == "-h" || word == "--help" || word == "help") {
    if (word == "help" && args.size() > 1) {
      // `chorus help launch` is `chorus launch --help`.
      for (const Command& c : commands)
        if (c.name == args[1]) {
          char help_flag[] = "--help";
          std::array<char*, 1> a{help_flag};
          return c.main(a);
        }
    }
    std::fputs(help_text.data(), stdout);
    return chorus::cli::exit_ok;
  }
  if (word == "--version") {
    std::printf("chorus %s\n", CHORUS_VERSION);
    return chorus::cli::exit_ok;
  }
  for (const Command& c : commands)
    if (c.name == word) return c.main(args.subspan(1));
  return chorus::cli::usage_error("", "unknown command '" + std::string(word) +
                                          "'. The commands are launch, ls, show, recover, certs and sync");
}
