// chorus.Image, chorus.Text and chorus.Table: media for run.log's dict. An
// image from NumPy arrays (HWC), PIL images, CPU tensors (CHW or HWC) or
// PNG/JPEG bytes; markdown text; a table of columns and rows (W&B's Table).
#pragma once

#include <chorus/chorus.hpp>

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>

namespace chorus::client {
struct MediaJob; // runtime/client/run_impl.hpp
}

namespace chorus::python {

namespace py = pybind11;

/// Registers chorus.Image, chorus.Text and chorus.Table.
void bind_media(py::module_& m);

/// What makes the RunImpl::log_media job of a media object: called without
/// the GIL while the object lives (it views the object's own copy).
using MediaJobMaker = std::function<std::unique_ptr<chorus::client::MediaJob>()>;

/// The job maker of a chorus.Image, Text or Table object; empty for any
/// other object.
[[nodiscard]] MediaJobMaker media_of(PyObject* v);

} // namespace chorus::python
