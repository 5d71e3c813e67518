// The shortest decimal text of a double that reads back as the same double:
// exactly what std::to_chars(first, last, v) writes, about a quarter faster
// (Schubfach's interval arithmetic; docs/ARCHITECTURE.md, "Files"). Every
// value of history.jsonl goes through it.
#pragma once

namespace chorus::core {

/// Room `shortest` may write in: its text is at most 24 bytes, but it
/// copies in blocks.
inline constexpr int shortest_room = 48;

/// Writes finite `v` at `out` (shortest_room bytes) as std::to_chars(out,
/// out + 32, v) does; returns the end of the text.
char* shortest(char* out, double v) noexcept;

} // namespace chorus::core
