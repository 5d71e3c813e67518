// chorus.Histogram: chorus::Histogram for Python, built from lists, NumPy
// arrays and CPU tensors, and logged as a value of run.log's dict.
#pragma once

#include <chorus/chorus.hpp>

#include <pybind11/pybind11.h>

namespace chorus::python {

namespace py = pybind11;

/// Registers chorus.Histogram (the native half; python/chorus re-exports it).
void bind_histogram(py::module_& m);

/// The histogram a chorus.Histogram object holds, or null for any other object.
[[nodiscard]] const Histogram* histogram_of(PyObject* v) noexcept;

} // namespace chorus::python
