// chorus.Histogram (python/histogram.hpp).
#include "python/histogram.hpp"
#include "python/convert.hpp"

#include <pybind11/stl.h>

#include <cstring>
#include <string>
#include <vector>

namespace chorus::python {
namespace {

PyTypeObject* histogram_type = nullptr;

/// A C-contiguous buffer of float32 or float64 values, or nothing.
struct Floats {
  Py_buffer view{};
  bool held = false;
  bool is_float = false;
  ~Floats() {
    if (held) PyBuffer_Release(&view);
  }
  /// Takes `o`'s buffer if it is one of floats or doubles, in native order.
  bool take(PyObject* o) {
    if (PyObject_CheckBuffer(o) == 0) return false;
    if (PyObject_GetBuffer(o, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return false;
    }
    held = true;
    std::string_view f = view.format != nullptr ? view.format : "B";
    if (!f.empty() && (f.front() == '@' || f.front() == '=' || f.front() == '<')) f.remove_prefix(1);
    if (f == "f" && view.itemsize == 4) {
      is_float = true;
      return true;
    }
    return f == "d" && view.itemsize == 8;
  }
};

bool is_torch(py::handle o) {
  const py::object mod = py::type::of(o).attr("__module__");
  return py::isinstance<py::str>(mod) && mod.cast<std::string>().rfind("torch", 0) == 0;
}

/// Adds the values of `x` (a list or tuple of numbers, a NumPy array of any
/// numeric dtype, a CPU tensor of any float or int dtype, anything with a
/// float buffer) to `h`. Floats and doubles in a contiguous buffer are
/// bucketed in place, with the GIL released.
void add_values(Histogram& h, py::handle x) {
  if (const Histogram* other = histogram_of(x.ptr())) {
    h.merge(*other);
    return;
  }
  if (PyFloat_Check(x.ptr()) || PyLong_Check(x.ptr())) {
    const double d = PyFloat_AsDouble(x.ptr());
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      invalid("chorus.Histogram: " + shown(x) + " is an int too large for a float");
    }
    h.add(d);
    return;
  }
  py::object values = py::reinterpret_borrow<py::object>(x);
  if (is_torch(x)) {
    if (values.attr("is_cuda").cast<bool>())
      invalid("chorus.Histogram of a CUDA tensor would wait for the GPU: log the tensor's histogram from the "
              "host with chorus.Histogram(t.cpu()) where that wait is acceptable");
    values = values.attr("detach")();
    const std::string dtype = py::str(values.attr("dtype"));
    if (dtype != "torch.float32" && dtype != "torch.float64") values = values.attr("double")();
    values = values.attr("contiguous")().attr("numpy")();
  }
  Floats buf;
  if (!buf.take(values.ptr())) {
    if (PyObject_CheckBuffer(values.ptr()) != 0 || py::hasattr(values, "__array__")) {
      // Another dtype (ints, float16, a strided view): as float64, through NumPy.
      try {
        values = py::module_::import("numpy").attr("ascontiguousarray")(values, "float64");
      } catch (py::error_already_set&) {
        invalid("chorus.Histogram takes numbers: " + type_name(x) + " " + shown(x) +
                " could not be read as an array of numbers");
      }
      if (!buf.take(values.ptr())) invalid("chorus.Histogram could not read " + type_name(x) + " as numbers");
    } else {
      // A list, a tuple, any iterable of numbers.
      std::vector<double> v;
      for (py::handle item : values) {
        const double d = PyFloat_AsDouble(item.ptr());
        if (d == -1.0 && PyErr_Occurred()) {
          PyErr_Clear();
          invalid("chorus.Histogram takes numbers; its values hold a " + type_name(item) + " (" + shown(item) + ")");
        }
        v.push_back(d);
      }
      h.add(std::span<const double>(v));
      return;
    }
  }
  const auto n = static_cast<std::size_t>(buf.view.len / buf.view.itemsize);
  py::gil_scoped_release unlocked;
  if (buf.is_float)
    h.add(std::span<const float>(static_cast<const float*>(buf.view.buf), n));
  else
    h.add(std::span<const double>(static_cast<const double*>(buf.view.buf), n));
}

} // namespace

const Histogram* histogram_of(PyObject* v) noexcept {
  if (histogram_type == nullptr || !PyObject_TypeCheck(v, histogram_type)) return nullptr;
  try {
    return &py::reinterpret_borrow<py::object>(v).cast<const Histogram&>();
  } catch (...) {
    return nullptr;
  }
}

void bind_histogram(py::module_& m) {
  py::class_<Histogram> cls(m, "Histogram", R"(A distribution of values in chorus's bucket layout, for run.log:
run.log({"grad": chorus.Histogram(t)}). Takes a list or tuple of numbers, a
NumPy array or a CPU tensor (any numeric dtype), or another Histogram. Buckets
are 1/128 of their lower bound wide (a zero bucket below 2**-126), NaN and
infinities are counted apart, and histograms of a key declared
define_metric(key, reduce="merge") are merged exactly across ranks.)");
  cls.def(py::init([](py::handle values) {
            Histogram h;
            if (!values.is_none()) add_values(h, values);
            return h;
          }),
          py::arg("values") = py::none())
      .def("add", [](Histogram& h, py::handle values) { add_values(h, values); }, py::arg("values"),
           "Adds values (as the constructor takes them), or one number.")
      .def("merge", [](Histogram& h, const Histogram& other) { h.merge(other); }, py::arg("other"))
      .def_property_readonly("count", &Histogram::count, "Every value added, NaN and infinities included.")
      .def_property_readonly("sum", &Histogram::sum, "Of the finite values.")
      .def_property_readonly("min", &Histogram::min, "The smallest finite value (NaN when there is none).")
      .def_property_readonly("max", &Histogram::max, "The largest finite value (NaN when there is none).")
      .def_property_readonly("nan_count", &Histogram::nan_count)
      .def_property_readonly("pos_inf_count", &Histogram::pos_inf_count)
      .def_property_readonly("neg_inf_count", &Histogram::neg_inf_count)
      .def("quantile", &Histogram::quantile, py::arg("q"),
           "The value of rank round(q (n - 1)) among the values that are not NaN, within 1/256 of its magnitude.")
      .def(
          "buckets",
          [](const Histogram& h) {
            py::list out;
            for (const Histogram::Bucket& b : h.buckets()) out.append(py::make_tuple(b.lo, b.hi, b.count));
            return out;
          },
          "The non-empty buckets, ascending, as (lo, hi, count).")
      .def("__eq__", [](const Histogram& a, const Histogram& b) { return a == b; })
      .def("__repr__", [](const Histogram& h) {
        return "chorus.Histogram(count=" + std::to_string(h.count()) + ", min=" + py::repr(py::float_(h.min())).cast<std::string>() +
               ", max=" + py::repr(py::float_(h.max())).cast<std::string>() + ")";
      });
  cls.attr("relative_error") = Histogram::relative_error;
  histogram_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
}

} // namespace chorus::python
