// What the subcommands of `chorus` share: exit codes, a small argument
// cursor, number parsing and the formatting of times and durations.
#pragma once

#include "runtime/core/result.hpp"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::cli {

// Exit codes scripts can trust (`chorus launch` passes on its ranks' codes instead).
inline constexpr int exit_ok = 0;
inline constexpr int exit_failure = 1; // the command ran and failed
inline constexpr int exit_usage = 2;   // the command line was wrong: nothing was done
// How a run ended, as `chorus watch` tells it (0: finished; for a group, its
// worst run's, failed over crashed over killed).
inline constexpr int exit_run_failed = 3;
inline constexpr int exit_run_killed = 4;
inline constexpr int exit_run_crashed = 5; // its host was lost, or a run of the group never started
inline constexpr int exit_run_running = 6; // --no-follow: it goes on

/// A subcommand of `chorus`: all that the dispatch and the help texts know of
/// it. Each is defined in its own file, its help text beside its code.
struct Command {
  std::string_view name;    ///< `chorus NAME`
  std::string_view summary; ///< one line, lower case: `chorus --help` lists it, `chorus NAME --help` starts with it
  std::string_view usage;   ///< what follows `chorus NAME` on the usage line; a line per form
  std::string_view help;    ///< the rest of `chorus NAME --help`: what it does, its options, its exit codes
  int (*main)(std::span<char* const> args); ///< runs it on the words after NAME
  /// Where set, its text takes the place of the line "@GENERATED@" in `help`:
  /// what the build decides, such as the upload backends `chorus sync` knows.
  std::string (*generated)() = nullptr;
};

extern const Command launch_command;  // launch_main.cpp
extern const Command ls_command;      // ls.cpp
extern const Command show_command;    // show.cpp
extern const Command recover_command; // recover.cpp
extern const Command certs_command;   // certs.cpp
extern const Command sync_command;     // sync.cpp
extern const Command export_command;   // export.cpp
extern const Command serve_command;    // serve.cpp
extern const Command watch_command;    // watch.cpp

/// Every command, in the order `chorus --help` lists them. A new command is a
/// file of its own that defines its Command, declared above and listed here.
inline constexpr std::array commands{&launch_command,  &ls_command,    &show_command,  &watch_command,
                                     &recover_command, &certs_command, &sync_command,
                                     &export_command,  &serve_command};

/// The command called `name`, or nullptr.
const Command* find_command(std::string_view name);
/// `chorus --help`: what chorus is for, and every command with its summary.
std::string overview();
/// `chorus NAME --help`: the summary, the usage and the help text.
std::string help_text(const Command& command);
/// The command's `help`, its generated part filled in.
std::string help_body(const Command& command);
/// Prints help_text(command) to stdout; returns exit_ok.
int print_help(const Command& command);
/// "unknown command 'WORD'. The commands are ...", every command named.
std::string unknown_command(std::string_view word);

/// Walks a subcommand's words. Options take `--name value` and `--name=value`;
/// a short option also `-n4`. The first usage problem is kept in error().
class ArgCursor {
public:
  explicit ArgCursor(std::span<char* const> args) : args_(args) {}

  [[nodiscard]] bool done() const noexcept { return i_ >= args_.size(); }
  [[nodiscard]] std::string_view peek() const noexcept { return args_[i_]; }
  void next() noexcept { ++i_; }
  /// The words from here on (after `--`, the program and its arguments).
  [[nodiscard]] std::span<char* const> rest() const noexcept { return args_.subspan(i_); }

  /// Consumes the current word if it is one of `names`.
  bool flag(std::initializer_list<std::string_view> names);
  /// Consumes the current word (and the next one, for its value) if it is
  /// one of `names`; a missing value is a usage error.
  bool option(std::initializer_list<std::string_view> names, std::string& value);

  /// Reads `value` (the option `opt` just consumed) as a whole number in
  /// [lo, hi] into `out`; anything else is a usage error naming the range.
  void integer(std::string_view opt, const std::string& value, std::int64_t lo, std::int64_t hi, int& out);

  /// Takes the current word as the command's one operand into `slot`
  /// (`what` names it: "directory"); a word that looks like an option, or a
  /// second operand, is a usage error.
  void operand(std::string& slot, std::string_view what);

  /// Reads `value` (of --smooth) as TensorBoard's smoothing weight, 0 to
  /// below 1, into `out`; anything else is a usage error.
  void smoothing(const std::string& value, double& out);

  void fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

private:
  std::span<char* const> args_;
  std::size_t i_ = 0;
  std::string error_;
};

/// A problem with what a command was given (its words, or a name that leads
/// to no run): Errc::invalid_argument with `message`.
[[nodiscard]] inline Error invalid(std::string message) { return {Errc::invalid_argument, std::move(message)}; }
/// A run or group file the command could not read or write: Errc::io_error.
[[nodiscard]] inline Error file_problem(std::string message) { return {Errc::io_error, std::move(message)}; }

/// Prints "chorus CMD: MESSAGE" and a pointer to the help; returns exit_usage.
int usage_error(std::string_view command, std::string_view message);
/// Prints "chorus CMD: MESSAGE" to stderr; returns exit_failure.
int failure(std::string_view command, std::string_view message);

/// Reads a command's words into `a` with its `parse` (which sets `help` at
/// -h/--help): the exit code to return at once, after a usage error or the
/// help, or nothing where the command goes on.
template <class Args>
std::optional<int> parse_words(const Command& command, std::span<char* const> words, Args& a,
                               Error (*parse)(std::span<char* const>, Args&, bool&)) {
  bool help = false;
  if (Error e = parse(words, a, help)) return usage_error(command.name, e.message());
  if (help) return print_help(command);
  return std::nullopt;
}

/// A whole decimal integer in [lo, hi], or nothing.
std::optional<std::int64_t> parse_int(std::string_view s, std::int64_t lo, std::int64_t hi);
/// A finite decimal number, or nothing.
std::optional<double> parse_double(std::string_view s);

/// "2024-05-01 12:00:03" in local time, from unix seconds.
std::string format_time(double unix_s);
/// "4h 02m", "3m 07s", "12.4s", "850ms".
std::string format_duration(double seconds);
/// A value for a table: integers without a fraction, else 6 significant digits.
std::string format_number(double v);

/// "512 B", "1.5 KiB", "12.3 MiB", "640 GiB".
std::string format_bytes(std::uint64_t n);

/// The run directory root: $CHORUS_DIR, else ./chorus-runs.
std::string default_runs_dir();

/// The lines of `text`, without their newlines.
std::vector<std::string> split_lines(const std::string& text);

/// Characters on screen (UTF-8 code points; every one taken as one column).
std::size_t display_width(std::string_view s);

/// `s` cut to `width` columns, ending in "…" where it was cut.
std::string clip(std::string s, int width);

/// Rows of cells printed in aligned columns; the last column is not padded.
class Table {
public:
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  [[nodiscard]] bool empty() const noexcept { return rows_.empty(); }
  [[nodiscard]] std::string render(std::string_view indent) const;

private:
  std::vector<std::vector<std::string>> rows_;
};

} // namespace chorus::cli
