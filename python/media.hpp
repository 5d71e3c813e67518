// chorus.Image: an image for run.log's dict, from NumPy arrays (HWC), PIL
// images, CPU tensors (CHW or HWC) or PNG/JPEG bytes.
#pragma once

#include <chorus/chorus.hpp>

#include <pybind11/pybind11.h>

namespace chorus::python {

namespace py = pybind11;

/// Registers chorus.Image.
void bind_image(py::module_& m);

/// The image a chorus.Image object holds (a view into the object, valid
/// while it lives), or nothing for any other object.
[[nodiscard]] bool image_of(PyObject* v, Image& out) noexcept;

} // namespace chorus::python
