// A row of history.jsonl as the run's writer puts it (RunWriter::row,
// io/store/run_writer.cpp):
//   {"_step":N,"_timestamp":S,"_runtime":S,"key":value,...,"_count":{"key":n,...}}
// The one reader of a row: `chorus show` and `chorus export`, the dashboard's
// index, the upload backends and the Python reader read rows through it, so a
// row is read, or refused, one way everywhere and with the same words. It
// holds views into the parsed document (valid while its parser holds it) and
// allocates nothing. summary.json keeps the last row's own fields
// (_step, _timestamp, _runtime) and is read with it too.
#pragma once

#include "io/store/history_value.hpp"

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

namespace chorus::store {

/// A key of a JSON-lines file that is chorus's own, not a metric's: _step,
/// _timestamp, _runtime, _count (system.jsonl's _node, _rank), and any other
/// key starting with '_' (a metric key may not: runtime/client/ingest.cpp).
[[nodiscard]] constexpr bool reserved_key(std::string_view key) noexcept { return key.starts_with('_'); }

/// _step, _timestamp or _runtime: a row's own fields, which summary.json
/// keeps of the last row (where the run set none of its own).
[[nodiscard]] constexpr bool row_field(std::string_view key) noexcept {
  return key == "_step" || key == "_timestamp" || key == "_runtime";
}

/// One value of a row: its key, the number (metric_value), and its JSON as
/// written, for a reader that copies it.
struct RowValue {
  std::string_view key;
  double value = 0;
  simdjson::dom::element json;
};

/// The values of an object (a history row, a system.jsonl sample), in the
/// order written: the members whose key is a metric's (neither empty nor
/// reserved) and whose value is a number (metric_value); the others are
/// passed over.
class RowValues {
public:
  class iterator {
  public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = RowValue;
    using difference_type = std::ptrdiff_t;
    using pointer = const RowValue*;
    using reference = const RowValue&;

    iterator() noexcept = default;
    const RowValue& operator*() const noexcept { return v_; }
    const RowValue* operator->() const noexcept { return &v_; }
    [[gnu::always_inline]] iterator& operator++() noexcept {
      ++at_;
      settle();
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator was = *this;
      ++*this;
      return was;
    }
    bool operator==(const iterator& o) const noexcept { return at_ == o.at_; }

  private:
    friend class RowValues;
    iterator(simdjson::dom::object::iterator at, simdjson::dom::object::iterator end, bool counts) noexcept
        : at_(at), end_(end), counts_(counts) {
      settle();
    }
    /// Moves to the first value from here on; inline, as it runs for every
    /// member of every row read.
    [[gnu::always_inline]] void settle() noexcept {
      simdjson::dom::object::iterator at = at_;
      while (at != end_ && !take(at.key(), at.value(), counts_, v_)) ++at;
      at_ = at;
    }

    simdjson::dom::object::iterator at_, end_;
    RowValue v_;
    bool counts_ = false;
  };

  /// None.
  RowValues() noexcept = default;
  /// The metric values of `o`.
  explicit RowValues(const simdjson::dom::object& o) noexcept : RowValues(o, false) {}

  [[nodiscard]] iterator begin() const noexcept { return begin_; }
  [[nodiscard]] iterator end() const noexcept { return end_; }

private:
  friend class HistoryRow;
  /// Whether the member `key`: `e` is a value; if so, `v` is it. `counts`:
  /// a member of _count, whose values are JSON numbers only.
  [[gnu::always_inline]] static bool take(std::string_view key, const simdjson::dom::element& e, bool counts,
                                          RowValue& v) noexcept {
    if (key.empty() || reserved_key(key)) return false;
    double n = 0;
    if (counts) {
      if (e.get_double().get(n) != simdjson::SUCCESS) return false;
    } else if (const std::optional<double> m = metric_value(e)) {
      n = *m;
    } else {
      return false;
    }
    v = {key, n, e};
    return true;
  }

  /// `counts`: a row's _count, whose values are JSON numbers only.
  RowValues(const simdjson::dom::object& o, bool counts) noexcept
      : begin_(o.begin(), o.end(), counts), end_(o.end(), o.end(), counts) {}

  iterator begin_, end_;
};

/// One parsed line of history.jsonl read as a row.
class HistoryRow {
public:
  /// The greatest step a row may have.
  static constexpr std::int64_t max_step = std::numeric_limits<std::int64_t>::max() - 1;

  /// Reads `row`'s _step: a whole number from 0 to max_step, written as a
  /// JSON integer (as the writer writes it). Where it is not, the object is
  /// no row: false, and why() names the cause.
  explicit HistoryRow(const simdjson::dom::object& row) noexcept;

  [[nodiscard]] explicit operator bool() const noexcept { return why_.empty(); }
  /// Why the object is no row ("no _step", "a _step below 0", ...), or "".
  [[nodiscard]] std::string_view why() const noexcept { return why_; }

  /// The step (0 where the object is no row).
  [[nodiscard]] std::int64_t step() const noexcept { return step_; }
  /// _timestamp, Unix seconds: a JSON number, or nothing.
  [[nodiscard]] std::optional<double> timestamp() const noexcept { return seconds("_timestamp"); }
  /// _runtime, seconds into the run: a JSON number, or nothing.
  [[nodiscard]] std::optional<double> runtime() const noexcept { return seconds("_runtime"); }

  /// The row's metric values, in the order written (RowValues).
  [[nodiscard]] RowValues metrics() const noexcept { return RowValues(row_); }
  /// _count: how many ranks a reduced value of the row stands for, by key
  /// (a JSON number each); none where the row has none.
  [[nodiscard]] RowValues counts() const noexcept;
  /// _count of `key`, or nothing.
  [[nodiscard]] std::optional<double> count(std::string_view key) const noexcept;
  /// metrics() and counts() in one pass over the row: `value(v)` for each
  /// metric value, `count(n)` for each count, in the order written. For a
  /// reader that wants both of every row (the dashboard's index): counts()
  /// alone walks the row once more to find _count, which the writer puts last.
  template <class V, class C>
  void each(V&& value, C&& count) const {
    bool counted = false;
    RowValue v;
    for (const simdjson::dom::key_value_pair m : row_) {
      if (RowValues::take(m.key, m.value, false, v)) {
        value(std::as_const(v));
      } else if (simdjson::dom::object counts;
                 !counted && m.key == "_count" && m.value.get(counts) == simdjson::SUCCESS) {
        counted = true; // the first, as counts() finds it
        for (const RowValue& n : RowValues(counts, true)) count(n);
      }
    }
  }

  /// The object as parsed: for a reader that copies a field's text as
  /// written (chorus export), once this has read it.
  [[nodiscard]] const simdjson::dom::object& object() const noexcept { return row_; }

private:
  [[nodiscard]] std::optional<double> seconds(std::string_view key) const noexcept;

  simdjson::dom::object row_;
  std::int64_t step_ = 0;
  std::string_view why_;
};

/// The values of a line of history.jsonl (`history`: none where the line is
/// no row) or of system.jsonl: what the upload backends send of it.
[[nodiscard]] RowValues line_values(const simdjson::dom::object& line, bool history) noexcept;

} // namespace chorus::store
