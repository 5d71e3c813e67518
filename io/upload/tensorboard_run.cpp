// A chorus run as TensorBoard runs: see io/upload/tensorboard_run.hpp.
#include "io/upload/tensorboard_run.hpp"

#include <cmath>
#include <limits>
#include <tuple>

namespace chorus::io {
namespace {

/// "loss/rank-3" -> {"loss", "rank-3"}; "x/node-0" -> {"x", "node-0"};
/// anything else -> {key, ""}.
std::pair<std::string_view, std::string_view> split_column(std::string_view key) {
  const std::size_t slash = key.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return {key, {}};
  const std::string_view last = key.substr(slash + 1);
  for (std::string_view prefix : {"rank-", "node-"}) {
    if (!last.starts_with(prefix) || last.size() == prefix.size()) continue;
    const std::string_view digits = last.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") == std::string_view::npos) return {key.substr(0, slash), last};
  }
  return {key, {}};
}

} // namespace

std::optional<double> metric_value(const simdjson::dom::element& value) {
  switch (value.type()) {
  case simdjson::dom::element_type::DOUBLE: return double(value);
  case simdjson::dom::element_type::INT64: return static_cast<double>(std::int64_t(value));
  case simdjson::dom::element_type::UINT64: return static_cast<double>(std::uint64_t(value));
  case simdjson::dom::element_type::STRING: {
    const std::string_view s = value;
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    return std::nullopt;
  }
  default: return std::nullopt;
  }
}

std::string markdown_table(const simdjson::dom::object& object) {
  std::string out = "| key | value |\n|---|---|\n";
  auto cell = [&out](std::string_view s) {
    for (char c : s) {
      if (c == '|') out += "\\|";
      else if (c == '\n') out += ' ';
      else out += c;
    }
  };
  for (auto [key, value] : object) {
    out += "| ";
    cell(key);
    out += " | ";
    cell(value.is_string() ? std::string(std::string_view(value)) : simdjson::minify(value));
    out += " |\n";
  }
  return out;
}

TensorBoardRun::TensorBoardRun(std::string dir) : dir_(std::move(dir)) {}
TensorBoardRun::~TensorBoardRun() = default;

TfEventsWriter* TensorBoardRun::writer(std::string_view sub, double wall_time_s) {
  if (auto it = writers_.find(sub); it != writers_.end()) return it->second.get();
  const std::string dir = sub.empty() ? dir_ : dir_ + "/" + std::string(sub);
  Result<std::unique_ptr<TfEventsWriter>> made = TfEventsWriter::create(dir, wall_time_s);
  if (!made) {
    if (!failed_) failed_ = made.error();
    writers_.emplace(std::string(sub), nullptr); // asked once: its events are left out
    return nullptr;
  }
  opened_.push_back((*made)->path());
  return writers_.emplace(std::string(sub), std::move(*made)).first->second.get();
}

namespace {

double wall_time_of(const simdjson::dom::object& row) {
  simdjson::dom::element t;
  if (row["_timestamp"].get(t)) return 0;
  return metric_value(t).value_or(0);
}

} // namespace

template <class Place>
void TensorBoardRun::scalars_of(const simdjson::dom::object& row, const KeyPicker& wanted, double wall_time,
                                const Place& place) {
  for (auto [key, value] : row) {
    if (key.empty() || key.front() == '_' || (wanted && !wanted(key))) continue;
    const std::optional<double> v = metric_value(value);
    if (!v) continue;
    const auto [sub, tag, step] = place(key);
    if (TfEventsWriter* w = writer(sub, wall_time)) {
      w->scalar(tag, step, wall_time, *v);
      ++scalars_;
    }
  }
}

bool TensorBoardRun::history_row(const simdjson::dom::object& row, const KeyPicker& wanted) {
  std::int64_t step = 0;
  if (row["_step"].get_int64().get(step) || step < 0) return false;
  scalars_of(row, wanted, wall_time_of(row), [step](std::string_view key) {
    auto [tag, sub] = split_column(key);
    if (sub.starts_with("node-")) tag = key, sub = {}; // a history's columns are per rank: the key stays whole
    return std::tuple{sub, tag, step};
  });
  return true;
}

void TensorBoardRun::system_row(const simdjson::dom::object& row, const KeyPicker& wanted) {
  scalars_of(row, wanted, wall_time_of(row), [this](std::string_view key) {
    const auto [tag, sub] = split_column(key);
    std::int64_t& sample = samples_.try_emplace(std::string(key), 0).first->second;
    return std::tuple{sub, tag, sample++};
  });
}

void TensorBoardRun::text(std::string_view tag, std::string_view markdown, double wall_time_s) {
  if (TfEventsWriter* w = writer("", wall_time_s)) w->text(tag, 0, wall_time_s, markdown);
}

Error TensorBoardRun::flush() {
  Error first = std::move(failed_);
  failed_ = {};
  for (auto& [sub, w] : writers_)
    if (w)
      if (Error e = w->flush(); e && !first) first = std::move(e);
  return first;
}

Error TensorBoardRun::close() {
  Error first = std::move(failed_);
  failed_ = {};
  for (auto& [sub, w] : writers_)
    if (w)
      if (Error e = w->close(); e && !first) first = std::move(e);
  return first;
}

std::vector<std::string> TensorBoardRun::files() const { return opened_; }

} // namespace chorus::io
