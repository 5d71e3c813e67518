// Exactly once with several MLflow log-batch requests in flight (io/upload/mlflow.cpp).
//
// Each log-batch covers a Span of one file (history.jsonl or system.jsonl)
// and records it in the run's tag chorus.upload.batch.<slot>, in the same
// request as its points, so the server keeps which spans it stored, with
// the offsets of both files acknowledged when it was sent (a prefix every
// point of which the server holds). A slot is reused only once the
// offsets have passed its span, by a batch whose prefix covers that span.
// So after a lost answer, or a crash, the greatest prefix any slot names,
// and from there the chain of spans (each starting where the one before
// ends), were stored; a span stored beyond a gap is skipped when the
// offsets reach it, never sent twice.
#pragma once

#include "io/upload/upload.hpp"

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace chorus::upload {

/// A place in a JSON-lines file: the cursor at a line's start, and how many
/// values of that line are already sent.
struct Place {
  store::Cursor at;
  std::uint64_t part = 0;
  bool operator==(const Place&) const = default;
};

inline bool beyond(const Place& a, const Place& b) {
  return a.at.bytes > b.at.bytes || (a.at.bytes == b.at.bytes && a.part > b.part);
}

/// What one log-batch carries of one file: its points from `from` to `to`.
struct Span {
  bool history = true; // else system.jsonl
  Place from, to;
  bool operator==(const Span&) const = default;
};

inline std::string slot_tag(std::size_t slot) { return "chorus.upload.batch." + std::to_string(slot); }

/// The offsets of both files: history, system.
struct Prefix {
  Place history, system;
};

/// What a slot's tag says: a span, and the prefix acknowledged when it was sent.
struct SlotRecord {
  Span span;
  Prefix prefix;
};

inline std::string encode_place(const Place& p) {
  return std::to_string(p.at.lines) + "." + std::to_string(p.at.bytes) + "." + std::to_string(p.part);
}

/// "h=<l>.<b>.<p>-<l>.<b>.<p> after h=<l>.<b>.<p>;s=<l>.<b>.<p>" ("s=" first for a system.jsonl span).
inline std::string encode_slot(const SlotRecord& r) {
  return std::string(r.span.history ? "h=" : "s=") + encode_place(r.span.from) + "-" + encode_place(r.span.to) +
         " after h=" + encode_place(r.prefix.history) + ";s=" + encode_place(r.prefix.system);
}

/// Reads "<lines>.<bytes>.<part>" from the front of `v`, moving past it.
inline bool decode_place(std::string_view& v, Place& p) {
  std::uint64_t n[3];
  const char* at = v.data();
  const char* end = v.data() + v.size();
  for (int i = 0; i < 3; ++i) {
    auto r = std::from_chars(at, end, n[i]);
    if (r.ec != std::errc()) return false;
    at = r.ptr;
    if (i < 2) {
      if (at == end || *at != '.') return false;
      ++at;
    }
  }
  v.remove_prefix(static_cast<std::size_t>(at - v.data()));
  p = {{n[0], n[1]}, n[2]};
  return true;
}

/// Takes `lit` off the front of `v`, if it is there.
inline bool take(std::string_view& v, std::string_view lit) {
  if (!v.starts_with(lit)) return false;
  v.remove_prefix(lit.size());
  return true;
}

/// "h=<l>.<b>.<p>;s=<l>.<b>.<p>": the tag chorus.upload.offset, which one
/// request at a time (before several went at once) left on the run.
inline std::optional<Prefix> decode_prefix(std::string_view v) {
  Prefix p;
  if (!take(v, "h=") || !decode_place(v, p.history) || !take(v, ";s=") || !decode_place(v, p.system) || !v.empty())
    return std::nullopt;
  return p;
}

inline std::optional<SlotRecord> decode_slot(std::string_view v) {
  SlotRecord r;
  auto take = [&v](std::string_view lit) { return upload::take(v, lit); };
  if (take("s=")) r.span.history = false;
  else if (!take("h=")) return std::nullopt;
  if (!decode_place(v, r.span.from) || !take("-") || !decode_place(v, r.span.to) || !take(" after h=") ||
      !decode_place(v, r.prefix.history) || !take(";s=") || !decode_place(v, r.prefix.system) || !v.empty() ||
      !beyond(r.span.to, r.span.from))
    return std::nullopt;
  return r;
}

/// Where the spans the server holds take a file on from `at`: the end of
/// the chain of spans starting at `at`, each where the one before ends.
inline Place chain_end(const std::vector<Span>& spans, bool history, Place at) {
  for (bool moved = true; moved;) {
    moved = false;
    for (const Span& s : spans) {
      if (s.history == history && s.from == at) {
        at = s.to;
        moved = true;
      }
    }
  }
  return at;
}

} // namespace chorus::upload
