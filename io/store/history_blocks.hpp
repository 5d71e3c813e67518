// history_blocks.jsonl: a summary of history.jsonl, one line per block of
// rows_per_block rows, kept by the RunWriter beside it, so that a reader can
// draw a long run's every key at full resolution without reading the
// history (chorus serve's first opening of a run; docs/DASHBOARD.md). Its
// one owner: the RunWriter writes it with HistoryBlockWriter, and every
// reader reads it with read_history_blocks.
//
//   {"rows":[0,256],"bytes":[0,210944],"steps":[0,255],
//    "keys":{"loss":[256,0.01,250,2.5,0,0,2.5,255,0.02],...},
//    "nonfinite":{"loss":[1,17,17,0,-1,-1,0,-1,-1]}}
//
// `rows`: the block's first row (0 the file's first) and its rows; `bytes`:
// where its lines lie in history.jsonl, [start, end); `steps`: its first and
// last step. `keys`, per key with a finite value in the block: [n, min,
// min's step, max, max's step, the first value's step, the first value, the
// last value's step, the last value] of its finite values (the first step
// where a value repeats). `nonfinite`, per key with a NaN or an infinity in
// the block: for NaN, +Infinity and -Infinity in turn, how many and the
// first and last step of each (-1: none). Blocks follow each other from the
// file's start; a block is written once its rows are, so the rows after the
// last block (fewer than a block) are read from history.jsonl itself.
//
// It is no record: nothing is synced for it. A reader takes the blocks that
// lie within history.jsonl, one after the other from its start, and only
// where the history agrees at their ends (the first and last block's lines
// begin with their first step, and the last ends with a newline): a file cut
// by a crash is read as far as the history holds, one left by another
// writer not at all.
#pragma once

#include "runtime/core/result.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace chorus::store {

inline constexpr const char* history_blocks_file = "history_blocks.jsonl";

/// One key's values within one block.
struct BlockStat {
  struct Nonfinite {
    std::uint64_t n = 0;
    std::int64_t first_step = -1, last_step = -1;
  };
  std::uint64_t n = 0; // finite values
  double min = 0, max = 0, first = 0, last = 0;
  std::int64_t min_step = 0, max_step = 0, first_step = 0, last_step = 0;
  std::array<Nonfinite, 3> nonfinite{}; // NaN, +Infinity, -Infinity

  /// Takes the value `v` of step `step` (inline: the writer takes every value of the history).
  void take(std::int64_t step, double v) {
    if (!std::isfinite(v)) [[unlikely]] {
      Nonfinite& k = nonfinite[std::isnan(v) ? 0 : v > 0 ? 1 : 2];
      if (k.n++ == 0) k.first_step = step;
      k.last_step = step;
      return;
    }
    if (n++ == 0) {
      min = max = first = last = v;
      min_step = max_step = first_step = last_step = step;
      return;
    }
    if (v < min) min = v, min_step = step;
    if (v > max) max = v, max_step = step;
    last = v, last_step = step;
  }
};

/// Keeps the blocks of history.jsonl as its rows are written: a row is
/// begun (row), given its values (value), and ended (end_row), which says
/// when a block is complete and appends its line.
class HistoryBlockWriter {
public:
  static constexpr std::uint64_t rows_per_block = 256;

  /// A row of step `step` whose line starts at byte `start` of history.jsonl.
  void row(std::uint64_t start, std::int64_t step);
  /// A value of the row: of column `column` (dense, from 0), whose key is
  /// written `quoted` (its JSON string and a colon).
  void value(std::uint32_t column, std::string_view quoted, double v) {
    if (column >= columns_.size()) [[unlikely]]
      columns_.resize(column + 1);
    Column& c = columns_[column];
    if (!c.seen) [[unlikely]]
      first_in_block(c, column, quoted);
    c.stat.take(last_step_, v);
  }
  /// The row's line ended before byte `end`. Where that completes a block,
  /// appends its line (with its newline) to `out` and returns true.
  bool end_row(std::uint64_t end, std::string& out);

private:
  struct Column {
    std::string quoted;
    BlockStat stat;
    bool seen = false; // a value in this block
  };
  /// `c`'s first value in this block: its stat afresh.
  void first_in_block(Column& c, std::uint32_t column, std::string_view quoted);
  std::vector<Column> columns_;
  std::vector<std::uint32_t> seen_; // the columns with a value in this block, in first use
  std::uint64_t rows_ = 0, block_rows_ = 0, start_ = 0;
  std::int64_t first_step_ = 0, last_step_ = 0;
};

/// The blocks read back: those that history.jsonl holds whole.
struct HistoryBlocks {
  struct Block {
    std::uint64_t first_row = 0, rows = 0, start = 0, end = 0;
    std::int64_t first_step = 0, last_step = 0;
  };
  /// A key's values in one block: the block's index in `blocks`, and its stat.
  struct KeyBlock {
    std::uint32_t block = 0;
    BlockStat stat;
  };
  std::vector<Block> blocks;
  /// Per key, the blocks it has a value in, in order.
  std::unordered_map<std::string, std::vector<KeyBlock>> stats;

  /// The bytes of history.jsonl the blocks cover: [0, covered()).
  [[nodiscard]] std::uint64_t covered() const { return blocks.empty() ? 0 : blocks.back().end; }
  [[nodiscard]] std::uint64_t rows() const { return blocks.empty() ? 0 : blocks.back().first_row + blocks.back().rows; }
};

/// Reads `dir`/history_blocks.jsonl: its blocks from the start, one after
/// the other, that lie within the first `history_bytes` of `dir`/history.jsonl;
/// it stops at the first line that is damaged, cut or does not follow. None
/// where `dir`/history.jsonl does not agree at the first and last block's
/// ends (their lines begin with their first step; the last ends with a
/// newline), or where there is no such file (no error); an error where it
/// cannot be read.
[[nodiscard]] Result<HistoryBlocks> read_history_blocks(const std::string& dir, std::uint64_t history_bytes);

} // namespace chorus::store
