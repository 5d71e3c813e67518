// metrics.json: how the run's metrics were declared (Run::define_metric):
// each declared key's reduction across ranks, its summary, and the metric
// its charts take as x (W&B's step_metric). The RunWriter writes it from
// the merge (so `chorus recover` rebuilds it from the WAL); `chorus serve`,
// `chorus show` and the Python reader read it through here.
//
//   {"loss":{"reduce":"mean","summary":"min","step_metric":"epoch"},
//    "acc":{"reduce":"none","summary":"max","step_metric":null}}
#pragma once

#include "runtime/core/result.hpp"

#include <chorus/chorus.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace chorus::store {

struct MetricSpec {
  Reduce reduce = Reduce::none;
  Summary summary = Summary::last;
  std::string step_metric; // empty: _step
  bool operator==(const MetricSpec&) const = default;
};

/// The declared keys, in the order first declared.
struct MetricSpecs {
  std::vector<std::pair<std::string, MetricSpec>> specs;

  /// The key's declaration, if it has one.
  [[nodiscard]] const MetricSpec* find(std::string_view key) const;
  /// Sets the whole declaration of `key`.
  void set(std::string_view key, MetricSpec spec);

  /// metrics.json's object, without a newline.
  [[nodiscard]] std::string json() const;
  /// Parses metrics.json's text; a member that is not a declaration, or names
  /// a reduction or summary this version does not know, is an error naming it.
  [[nodiscard]] static Result<MetricSpecs> parse(std::string_view json);
  /// Reads run_dir/metrics.json: empty where there is none (no metric was
  /// declared); an error naming the file and `chorus recover` where it is damaged.
  [[nodiscard]] static Result<MetricSpecs> read(const std::string& run_dir);

  bool operator==(const MetricSpecs&) const = default;
};

} // namespace chorus::store
