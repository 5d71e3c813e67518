// history_blocks.jsonl written and read (history_blocks.hpp).
#include "io/store/history_blocks.hpp"

#include "io/platform/posix.hpp"
#include "io/store/line_reader.hpp"
#include "runtime/core/json.hpp"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace chorus::store {
namespace {

/// A JSON array of whole numbers, read into `out`; false where it is anything else.
template <std::size_t N>
bool whole_numbers(simdjson::dom::element e, std::array<std::int64_t, N>& out) {
  simdjson::dom::array a;
  if (e.get_array().get(a) != simdjson::SUCCESS || a.size() != N) return false;
  std::size_t i = 0;
  for (simdjson::dom::element x : a)
    if (x.get_int64().get(out[i++]) != simdjson::SUCCESS) return false;
  return true;
}

/// The member `key` of `o`, read by whole_numbers; false where there is none.
template <std::size_t N>
bool whole_numbers(simdjson::dom::object o, std::string_view key, std::array<std::int64_t, N>& out) {
  simdjson::dom::element e;
  return o[key].get(e) == simdjson::SUCCESS && whole_numbers(e, out);
}

/// A key's finite values in a block: [n, min, min_step, max, max_step, first_step, first, last_step, last].
bool read_stat(simdjson::dom::element e, BlockStat& s) {
  simdjson::dom::array a;
  if (e.get_array().get(a) != simdjson::SUCCESS || a.size() != 9) return false;
  std::array<double, 9> v{};
  std::size_t i = 0;
  for (simdjson::dom::element x : a) {
    if (x.get_double().get(v[i]) != simdjson::SUCCESS || !std::isfinite(v[i])) return false;
    ++i;
  }
  const auto step = [](double d, std::int64_t& out) {
    if (d != std::floor(d) || d < 0 || d > 9.0e18) return false;
    out = static_cast<std::int64_t>(d);
    return true;
  };
  if (v[0] < 1 || v[0] != std::floor(v[0]) || v[0] > 9.0e18) return false;
  s.n = static_cast<std::uint64_t>(v[0]);
  s.min = v[1], s.max = v[3], s.first = v[6], s.last = v[8];
  return s.min <= s.max && step(v[2], s.min_step) && step(v[4], s.max_step) && step(v[5], s.first_step) &&
         step(v[7], s.last_step);
}

} // namespace

void HistoryBlockWriter::row(std::uint64_t start, std::int64_t step) {
  if (block_rows_ == 0) start_ = start, first_step_ = step;
  last_step_ = step;
}

void HistoryBlockWriter::first_in_block(Column& c, std::uint32_t column, std::string_view quoted) {
  if (c.quoted.empty()) c.quoted = quoted;
  c.seen = true;
  c.stat = {};
  seen_.push_back(column);
}

bool HistoryBlockWriter::end_row(std::uint64_t end, std::string& out) {
  ++rows_;
  if (++block_rows_ < rows_per_block) return false;
  out.append("{\"rows\":[");
  core::append_json_int(out, static_cast<std::int64_t>(rows_ - block_rows_));
  out.push_back(',');
  core::append_json_int(out, static_cast<std::int64_t>(block_rows_));
  out.append("],\"bytes\":[");
  core::append_json_int(out, static_cast<std::int64_t>(start_));
  out.push_back(',');
  core::append_json_int(out, static_cast<std::int64_t>(end));
  out.append("],\"steps\":[");
  core::append_json_int(out, first_step_);
  out.push_back(',');
  core::append_json_int(out, last_step_);
  out.append("],\"keys\":{");
  bool first = true;
  for (const std::uint32_t c : seen_) {
    const BlockStat& s = columns_[c].stat;
    if (s.n == 0) continue;
    if (!first) out.push_back(',');
    first = false;
    out.append(columns_[c].quoted).push_back('[');
    core::append_json_int(out, static_cast<std::int64_t>(s.n));
    for (const auto& [v, step] : {std::pair{s.min, s.min_step}, std::pair{s.max, s.max_step}}) {
      out.push_back(',');
      core::append_json_number(out, v);
      out.push_back(',');
      core::append_json_int(out, step);
    }
    for (const auto& [step, v] : {std::pair{s.first_step, s.first}, std::pair{s.last_step, s.last}}) {
      out.push_back(',');
      core::append_json_int(out, step);
      out.push_back(',');
      core::append_json_number(out, v);
    }
    out.push_back(']');
  }
  out.append("},\"nonfinite\":{");
  first = true;
  for (const std::uint32_t c : seen_) {
    const BlockStat& s = columns_[c].stat;
    if (s.nonfinite[0].n + s.nonfinite[1].n + s.nonfinite[2].n == 0) continue;
    if (!first) out.push_back(',');
    first = false;
    out.append(columns_[c].quoted).push_back('[');
    for (std::size_t k = 0; k < 3; ++k) {
      if (k) out.push_back(',');
      core::append_json_int(out, static_cast<std::int64_t>(s.nonfinite[k].n));
      out.push_back(',');
      core::append_json_int(out, s.nonfinite[k].first_step);
      out.push_back(',');
      core::append_json_int(out, s.nonfinite[k].last_step);
    }
    out.push_back(']');
  }
  out.append("}}\n");
  for (const std::uint32_t c : seen_) columns_[c].seen = false;
  seen_.clear();
  block_rows_ = 0;
  return true;
}

Result<HistoryBlocks> read_history_blocks(const std::string& dir, std::uint64_t history_bytes) {
  HistoryBlocks out;
  const std::string path = dir + "/" + history_blocks_file;
  const Result<int> fd = platform::open_regular(path, O_RDONLY, /*missing_ok=*/true);
  if (!fd) return fd.error();
  if (*fd < 0) return out;
  // The history the blocks must agree with (holds, below).
  const Result<int> history = platform::open_regular(dir + "/history.jsonl", O_RDONLY, /*missing_ok=*/true);
  if (!history) {
    platform::close_fd(*fd);
    return history.error();
  }
  // The first and last block taken are checked against history.jsonl
  // itself: the line at a block's start is a row of its first step, and its
  // last byte a newline. Four reads, where a block each would be thousands
  // of reads scattered over a file out of the page cache.
  const auto holds = [&](const HistoryBlocks::Block& b) {
    const std::string head = "{\"_step\":" + std::to_string(b.first_step) + ",";
    std::string got(head.size(), '\0');
    char c = 0;
    return *history >= 0 && ::pread(*history, &c, 1, static_cast<off_t>(b.end - 1)) == 1 && c == '\n' &&
           ::pread(*history, got.data(), got.size(), static_cast<off_t>(b.start)) == static_cast<ssize_t>(got.size()) &&
           got == head;
  };
  // No block past the history's end as it is now (a history cut since its size was taken).
  if (struct stat st {}; *history >= 0 && ::fstat(*history, &st) == 0)
    history_bytes = std::min<std::uint64_t>(history_bytes, static_cast<std::uint64_t>(st.st_size));
  LineReader lines(*fd, path, {}, {});
  simdjson::dom::parser parser;
  std::string_view line;
  while (lines.next(line) == LineReader::Next::line) {
    simdjson::dom::object o;
    if (parser.parse(line.data(), line.size(), false).get(o) != simdjson::SUCCESS) break;
    std::array<std::int64_t, 2> rows{}, bytes{}, steps{};
    if (!whole_numbers(o, "rows", rows) || !whole_numbers(o, "bytes", bytes) || !whole_numbers(o, "steps", steps)) break;
    HistoryBlocks::Block b{static_cast<std::uint64_t>(rows[0]), static_cast<std::uint64_t>(rows[1]),
                           static_cast<std::uint64_t>(bytes[0]), static_cast<std::uint64_t>(bytes[1]), steps[0],
                           steps[1]};
    // Where the last block ended, in rows and bytes, and in step order.
    if (rows[0] < 0 || rows[1] < 1 || bytes[0] < 0 || bytes[1] <= bytes[0] || steps[0] < 0 || steps[1] < steps[0] ||
        b.first_row != out.rows() || b.start != out.covered() ||
        (!out.blocks.empty() && b.first_step < out.blocks.back().last_step) || b.end > history_bytes)
      break;
    simdjson::dom::object keys, nonfinite;
    if (o["keys"].get(keys) != simdjson::SUCCESS || o["nonfinite"].get(nonfinite) != simdjson::SUCCESS) break;
    const auto index = static_cast<std::uint32_t>(out.blocks.size());
    std::unordered_map<std::string_view, BlockStat> here;
    bool good = true;
    for (auto [k, v] : keys) good = good && read_stat(v, here[k]);
    for (auto [k, v] : nonfinite) {
      std::array<std::int64_t, 9> n{};
      good = good && whole_numbers(v, n);
      if (!good) break;
      BlockStat& s = here[k];
      for (std::size_t i = 0; i < 3; ++i) {
        const std::int64_t count = n[3 * i], first = n[3 * i + 1], last = n[3 * i + 2];
        // None: -1 and -1; some: steps within the block's, in order.
        good = good && (count == 0 ? first == -1 && last == -1
                                   : count > 0 && first >= steps[0] && first <= last && last <= steps[1]);
        s.nonfinite[i] = {static_cast<std::uint64_t>(count), first, last};
      }
    }
    if (!good) break;
    for (auto& [k, s] : here) out.stats[std::string(k)].push_back({index, s});
    out.blocks.push_back(b);
  }
  const bool whole = out.blocks.empty() || (holds(out.blocks.front()) && holds(out.blocks.back()));
  if (*history >= 0) platform::close_fd(*history);
  // A summary that does not agree with the history at its ends is another's: none of it is taken.
  if (!whole) return HistoryBlocks{};
  return out;
}

} // namespace chorus::store
