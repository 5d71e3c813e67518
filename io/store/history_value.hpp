// A value of history.jsonl or system.jsonl as the run's writer puts it: a
// JSON number, or "NaN", "Infinity", "-Infinity" (runtime/core/json.hpp
// writes non-finite numbers so). One reader for every consumer: the CLI,
// the dashboard, and the upload backends.
#pragma once

#include <simdjson.h>

#include <optional>

namespace chorus::store {

/// The value as a number, or nothing for anything else (a string of other
/// text, an object such as _count, a bool).
[[nodiscard]] std::optional<double> metric_value(const simdjson::dom::element& value);

} // namespace chorus::store
