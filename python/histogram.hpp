// chorus.Histogram: chorus::Histogram for Python, built from lists, NumPy
// arrays and CPU tensors, and logged as a value of run.log's dict; of a CUDA
// tensor or array, it stands for the values on the GPU, which run.log counts
// there (Run::log_histogram's device overload) without a host sync.
#pragma once

#include <chorus/chorus.hpp>

#include <pybind11/pybind11.h>

#include <cstddef>

namespace chorus::python {

namespace py = pybind11;

/// Registers chorus.Histogram (the native half; python/chorus re-exports it).
void bind_histogram(py::module_& m);

/// The histogram a chorus.Histogram object holds, or null for any other
/// object (and for one of values on a GPU).
[[nodiscard]] const Histogram* histogram_of(PyObject* v) noexcept;

/// The values on a GPU a chorus.Histogram of a CUDA tensor or array stands for.
struct DeviceSource {
  py::object keep; // the tensor or array (a contiguous one of a dtype the GPU counts)
  const void* values = nullptr;
  std::size_t n = 0;
  DeviceDtype dtype = DeviceDtype::float32;
  CudaStream stream = nullptr;
};
/// A chorus.Histogram's values on a GPU, or null for any other object.
[[nodiscard]] const DeviceSource* device_histogram_of(PyObject* v) noexcept;

} // namespace chorus::python
