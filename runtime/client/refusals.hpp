// Values refused on the trainer's side, and the warning each refused key
// prints once (refusals.cpp; RunImpl::record_refusal records them).
#pragma once

#include "runtime/client/run_impl.hpp"

#include <chorus/chorus.hpp>

#include <span>
#include <string>
#include <string_view>

namespace chorus::client {

/// "chorus: rank R: a value was refused: <why>" on stderr, in one write;
/// `once_per_key` adds that later refusals of the key are not printed.
void print_refusal(int rank, const Error& why, bool once_per_key);

/// Prints the warning for `key`'s first refusal in this process; nothing
/// for its later ones (nor past 10,000 keys, after a last line saying so).
void warn_refusal(int rank, std::string_view key, const Error& why) noexcept;

/// A JSON object of refused values, as rejected.jsonl's "values" holds it:
/// at most 100, keys cut to 256 bytes (invalid UTF-8 replaced).
[[nodiscard]] std::string refused_values_json(std::span<const RefusedValue> values);

/// `v` as JSON ("NaN" and the infinities as strings).
[[nodiscard]] std::string number_json(double v);

} // namespace chorus::client
