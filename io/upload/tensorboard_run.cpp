// A chorus run as TensorBoard runs: see io/upload/tensorboard_run.hpp.
#include "io/upload/tensorboard_run.hpp"

#include "io/platform/posix.hpp"
#include "runtime/core/json.hpp"
#include "runtime/core/media.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <tuple>

namespace chorus::upload {
namespace fs = std::filesystem;
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

Error table_cells(const simdjson::dom::element& table, StringTensor& cells, std::uint64_t& rows,
                  std::uint64_t& columns) {
  using simdjson::dom::element_type;
  simdjson::dom::array names, data;
  if (table["columns"].get(names) || table["data"].get(data))
    return Error{Errc::invalid_argument, "is no JSON object of a \"columns\" and a \"data\" array"};
  std::string text;
  auto cell = [&](const simdjson::dom::element& v) {
    text.clear();
    switch (v.type()) {
    case element_type::STRING: cells.add(std::string_view(v)); return;
    case element_type::INT64: text = std::to_string(std::int64_t(v)); break;
    case element_type::UINT64: text = std::to_string(std::uint64_t(v)); break;
    case element_type::DOUBLE: core::append_json_number(text, double(v)); break;
    case element_type::BOOL: text = bool(v) ? "true" : "false"; break;
    case element_type::NULL_VALUE: break;
    default: text = simdjson::minify(v);
    }
    cells.add(text);
  };
  columns = names.size();
  rows = 1;
  for (const simdjson::dom::element name : names) cell(name);
  for (const simdjson::dom::element row : data) {
    simdjson::dom::array values;
    if (row.get(values) || values.size() != columns)
      return Error{Errc::invalid_argument, "has a row " + std::to_string(rows - 1) + " that is not an array of " +
                                               std::to_string(columns) + " cells, one a column"};
    for (const simdjson::dom::element v : values) cell(v);
    ++rows;
  }
  return {};
}

std::vector<HParam> hparams_of(const simdjson::dom::object& config) {
  std::vector<HParam> out;
  for (auto [key, value] : config) {
    double d = 0;
    bool b = false;
    std::string_view s;
    if (value.is_null()) continue;
    if (value.get_double().get(d) == simdjson::SUCCESS) out.push_back({std::string(key), d});
    else if (value.get_bool().get(b) == simdjson::SUCCESS) out.push_back({std::string(key), b});
    else if (value.get_string().get(s) == simdjson::SUCCESS) out.push_back({std::string(key), std::string(s)});
    else out.push_back({std::string(key), simdjson::minify(value)});
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
  return store::metric_value(t).value_or(0);
}

} // namespace

TagExtent& TensorBoardRun::extent(std::string_view sub, std::string_view tag) {
  std::string key(sub);
  key.append("\n").append(tag);
  return extents_.try_emplace(std::move(key)).first->second;
}

template <class Step>
void TensorBoardRun::scalars_of(const store::RowValues& values, const KeyPicker& wanted, double wall_time, bool history,
                                const Step& step) {
  for (const store::RowValue& v : values) {
    const std::string_view key = v.key;
    if (wanted && !wanted(key)) continue;
    auto [tag, sub] = split_column(key);
    if (history && sub.starts_with("node-")) tag = key, sub = {}; // a history's columns are per rank: the key stays whole
    TagExtent& e = extent(sub, tag);
    const std::int64_t at = step(e);
    if (at < 0) continue; // written already
    if (TfEventsWriter* w = writer(sub, wall_time)) {
      w->scalar(tag, at, wall_time, v.value);
      extend(e, at, wall_time);
      ++scalars_;
    }
  }
}

void TensorBoardRun::extend(TagExtent& e, std::int64_t step, double wall_time) {
  e.max_step = std::max(e.max_step, step);
  e.max_wall_time = std::max(e.max_wall_time, wall_time);
  ++e.events;
}

void TensorBoardRun::histogram(const store::HistogramLine& line, const KeyPicker& wanted) {
  if (wanted && !wanted(line.column())) return;
  const std::string sub = line.rank ? "rank-" + std::to_string(*line.rank) : std::string();
  TagExtent& e = extent(sub, line.key);
  if (line.step <= e.max_step) return; // written already
  if (TfEventsWriter* w = writer(sub, line.timestamp)) {
    w->histogram(line.key, line.step, line.timestamp, line.value);
    extend(e, line.step, line.timestamp);
    ++histograms_;
  }
}

Error TensorBoardRun::media(const store::MediaLine& line, const std::string& run_dir, const KeyPicker& wanted) {
  const std::string sub = one_rank_ ? std::string() : "rank-" + std::to_string(line.rank);
  if (wanted && !wanted(sub.empty() ? std::string(line.key) : std::string(line.key) + "/" + sub)) return {};
  TagExtent& e = extent(sub, line.key);
  if (line.step <= e.max_step) return {}; // written already
  const std::string path = run_dir + "/" + std::string(line.path);
  auto damaged = [&](const std::string& what) {
    return Error{Errc::invalid_argument, "the " + std::string(line.kind) + " " + path + " " + what +
                                             ": it is left out of TensorBoard's files; `chorus recover RUN` writes "
                                             "the run's media again from its WAL"};
  };
  const Result<std::string> file = platform::read_text(path, false, core::max_media_bytes);
  if (!file) {
    std::error_code ec;
    return damaged(fs::exists(fs::symlink_status(path, ec)) ? "cannot be read (" + file.error().message() + ")"
                                                            : std::string("is missing"));
  }
  if (file->size() != line.size)
    return damaged("is " + std::to_string(file->size()) + " bytes, but media.jsonl says " + std::to_string(line.size));
  chorus::core::media::ImageHeader image;
  StringTensor cells;
  std::uint64_t rows = 0, columns = 0;
  if (line.kind == "image") {
    if (Error err = chorus::core::media::image_header(*file, image))
      return damaged("is no image (" + err.message() + ")");
  } else if (line.kind == "table") {
    simdjson::dom::element table;
    if (const auto err = parser_.parse(*file).get(table))
      return damaged("is no JSON (" + std::string(simdjson::error_message(err)) + ")");
    if (Error err = table_cells(table, cells, rows, columns)) return damaged(err.message());
  }
  TfEventsWriter* w = writer(sub, line.timestamp);
  if (!w) return {}; // flush() says why
  if (line.kind == "image")
    w->image(line.key, line.step, line.timestamp, *file, image.width, image.height, image_colorspace(*file));
  else if (line.kind == "table")
    w->table(line.key, line.step, line.timestamp, rows, columns, cells);
  else
    w->text(line.key, line.step, line.timestamp, *file);
  extend(e, line.step, line.timestamp);
  ++media_;
  return {};
}

std::string_view TensorBoardRun::history_row(const simdjson::dom::object& line, const KeyPicker& wanted) {
  const store::HistoryRow row(line);
  if (!row) return row.why();
  const std::int64_t step = row.step();
  scalars_of(row.metrics(), wanted, row.timestamp().value_or(0), true,
             [step](const TagExtent& e) { return step > e.max_step ? step : std::int64_t{-1}; });
  return {};
}

void TensorBoardRun::system_row(const simdjson::dom::object& row, const KeyPicker& wanted) {
  const double wall = wall_time_of(row);
  scalars_of(store::RowValues(row), wanted, wall, false, [wall](const TagExtent& e) {
    return e.events == 0 || wall > e.max_wall_time ? static_cast<std::int64_t>(e.events) : std::int64_t{-1};
  });
}

Error TensorBoardRun::resume() {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return {};
  auto scan_dir = [this](const fs::path& dir, const std::string& sub) -> Error {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!name.starts_with("events.out.tfevents.") || !it->is_regular_file(ec)) continue;
      Result<std::map<std::string, TagExtent, std::less<>>> tags = scan_events(it->path().string());
      if (!tags) return tags.error();
      for (const auto& [tag, got] : *tags) {
        TagExtent& e = extent(sub, tag);
        e.max_step = std::max(e.max_step, got.max_step);
        e.max_wall_time = std::max(e.max_wall_time, got.max_wall_time);
        e.events += got.events;
      }
    }
    if (ec) return Error{Errc::io_error, "cannot list " + dir.string() + ": " + ec.message()};
    return {};
  };
  if (Error e = scan_dir(dir_, "")) return e;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string sub = it->path().filename().string();
    if (it->is_directory(ec) && (sub.starts_with("rank-") || sub.starts_with("node-")))
      if (Error e = scan_dir(it->path(), sub)) return e;
  }
  return {};
}

void TensorBoardRun::text(std::string_view tag, std::string_view markdown, double wall_time_s) {
  TagExtent& e = extent("", tag);
  if (TfEventsWriter* w = writer("", wall_time_s)) {
    w->text(tag, static_cast<std::int64_t>(e.events), wall_time_s, markdown);
    e.max_step = static_cast<std::int64_t>(e.events++);
  }
}

void TensorBoardRun::config(const simdjson::dom::object& config, double wall_time_s) {
  text("config", markdown_table(config), wall_time_s);
  // The session's hyperparameters, once: TensorBoard keeps a tag's first.
  constexpr std::string_view tag = "_hparams_/session_start_info";
  TagExtent& e = extent("", tag);
  if (e.events > 0) return;
  if (TfEventsWriter* w = writer("", wall_time_s)) {
    const std::vector<HParam> values = hparams_of(config);
    w->hparams(values, wall_time_s, wall_time_s);
    e.max_step = 0;
    e.events = 1;
  }
}

Error TensorBoardRun::each_writer(Error (TfEventsWriter::*op)()) {
  Error first = std::move(failed_);
  failed_ = {};
  for (auto& [sub, w] : writers_)
    if (w)
      if (Error e = (w.get()->*op)(); e && !first) first = std::move(e);
  return first;
}

Error TensorBoardRun::flush() { return each_writer(&TfEventsWriter::flush); }
Error TensorBoardRun::sync() { return each_writer(&TfEventsWriter::sync); }
Error TensorBoardRun::close() { return each_writer(&TfEventsWriter::close); }

std::vector<std::string> TensorBoardRun::files() const { return opened_; }

} // namespace chorus::upload
