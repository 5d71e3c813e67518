// The help texts of `chorus`, all made from the command table (cli.hpp):
// `chorus --help`, `chorus NAME --help` and the unknown command's message.
#include "cli/cli.hpp"

#include <algorithm>
#include <cstdio>

namespace chorus::cli {
namespace {

constexpr std::size_t line_width = 80;

constexpr std::string_view overview_head = R"(usage: chorus COMMAND [ARGS...]

Experiment tracking for distributed training: start a job's ranks, and list,
show and repair the runs they logged.

commands:
)";

constexpr std::string_view overview_tail = R"(
Run 'chorus COMMAND --help' (or 'chorus help COMMAND') for a command's options.

Runs live under $CHORUS_DIR (default ./chorus-runs) as PROJECT/GROUP/RUN-ID/.

exit codes: 0 success, 1 the command failed, 2 the command line was wrong
(launch exits with the worst code of its ranks instead, or 124 where
--on-stall=kill stopped the job; watch says how the run ended: 0 finished,
3 failed, 4 killed, 5 crashed, 6 still running with --no-follow).
)";

/// Appends `lead` and then the words of `text`, wrapped at line_width with
/// the lines after the first indented as far as the end of `lead`.
void append_wrapped(std::string& out, std::string_view lead, std::string_view text) {
  out += lead;
  const std::size_t indent = display_width(lead);
  std::size_t column = indent;
  bool first = true;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find(' '), text.size());
    const std::string_view word = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    if (word.empty()) continue;
    if (!first && column + 1 + display_width(word) > line_width) {
      out += '\n';
      out.append(indent, ' ');
      column = indent;
    } else if (!first) {
      out += ' ';
      ++column;
    }
    out += word;
    column += display_width(word);
    first = false;
  }
  out += '\n';
}

} // namespace

const Command* find_command(std::string_view name) {
  for (const Command* c : commands)
    if (c->name == name) return c;
  return nullptr;
}

std::string overview() {
  std::size_t longest = 0;
  for (const Command* c : commands) longest = std::max(longest, c->name.size());
  std::string out(overview_head);
  for (const Command* c : commands) {
    std::string lead = "  " + std::string(c->name);
    lead.append(longest + 4 - lead.size(), ' ');
    append_wrapped(out, lead, c->summary);
  }
  out += overview_tail;
  return out;
}

std::string help_body(const Command& command) {
  std::string help(command.help);
  constexpr std::string_view slot = "@GENERATED@\n";
  if (const auto at = help.find(slot); command.generated != nullptr && at != std::string::npos)
    help.replace(at, slot.size(), command.generated());
  return help;
}

std::string help_text(const Command& command) {
  const std::string name = "chorus " + std::string(command.name);
  std::string out;
  append_wrapped(out, name + " - ", command.summary);
  // One usage line per form, the later ones under the first.
  std::string_view prefix = "\nusage: ";
  for (const std::string& form : split_lines(std::string(command.usage))) {
    out += prefix;
    out += name + " " + form + "\n";
    prefix = "       ";
  }
  out += '\n';
  out += help_body(command);
  return out;
}

int print_help(const Command& command) {
  std::fputs(help_text(command).c_str(), stdout);
  return exit_ok;
}

std::string unknown_command(std::string_view word) {
  std::string names;
  for (std::size_t i = 0; i < commands.size(); ++i) {
    if (i > 0) names += i + 1 == commands.size() ? " and " : ", ";
    names += commands[i]->name;
  }
  return "unknown command '" + std::string(word) + "'. The commands are " + names;
}

} // namespace chorus::cli
