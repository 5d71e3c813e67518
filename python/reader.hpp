// Reading a run from Python (chorus.open, chorus.runs): run.json through
// its owner (store::RunRecord) as every reader reports it (a run whose host is
// gone is crashed: io/store/lease.hpp), history.jsonl and system.jsonl
// through the store's LineReader and value reader, column by column, so
// that a million-row history becomes a DataFrame without a Python object per
// value; their keys are picked as `chorus export --metric` picks them.
// histograms.jsonl's lines go through their one reader
// (store::read_histogram_line), one key's lines column by column.
#pragma once

#include <pybind11/pybind11.h>

namespace chorus::python {

/// Adds _chorus.read_record(path), _chorus.read_lines(path, ...), read_histograms,
/// read_artifacts and read_text.
void bind_reader(pybind11::module_& m);

} // namespace chorus::python
