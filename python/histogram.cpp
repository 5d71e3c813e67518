// chorus.Histogram (python/histogram.hpp).
#include "python/histogram.hpp"
#include "python/convert.hpp"

#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace chorus::python {
namespace {

PyTypeObject* histogram_type = nullptr;

bool is_torch(py::handle o) {
  const py::object mod = py::type::of(o).attr("__module__");
  return py::isinstance<py::str>(mod) && mod.cast<std::string>().rfind("torch", 0) == 0;
}

/// What a chorus.Histogram holds: a histogram, or values on a GPU.
struct PyHistogram {
  Histogram h;
  std::shared_ptr<DeviceSource> device;
};

/// The histogram of `self`; an error where its values are on a GPU.
Histogram& host(PyHistogram& self) {
  if (self.device)
    invalid("this chorus.Histogram stands for values on a GPU, which run.log counts there: it has no figures on "
            "the host; read the logged histogram back with chorus.open(run_dir).histograms(key), or build one "
            "from t.cpu() where a host sync is acceptable");
  return self.h;
}
const Histogram& host(const PyHistogram& self) { return host(const_cast<PyHistogram&>(self)); }

/// The values of a CUDA tensor, or of an object with __cuda_array_interface__.
std::shared_ptr<DeviceSource> device_source(py::handle x) {
  auto d = std::make_shared<DeviceSource>();
  py::object t = py::reinterpret_borrow<py::object>(x);
  if (is_torch(x)) {
    t = t.attr("detach")();
    const std::string dtype = py::str(t.attr("dtype"));
    if (dtype == "torch.float16")
      d->dtype = DeviceDtype::float16;
    else if (dtype == "torch.bfloat16")
      d->dtype = DeviceDtype::bfloat16;
    else if (dtype != "torch.float32")
      t = t.attr("float")(); // on the tensor's stream: no host sync
    t = t.attr("contiguous")();
    d->values = reinterpret_cast<const void*>(t.attr("data_ptr")().cast<std::uintptr_t>());
    d->n = t.attr("numel")().cast<std::size_t>();
    py::object s = py::module_::import("torch.cuda").attr("current_stream")(t.attr("device"));
    d->stream = reinterpret_cast<CudaStream>(s.attr("cuda_stream").cast<std::uintptr_t>());
    d->keep = t;
    return d;
  }
  const py::dict cai = t.attr("__cuda_array_interface__").cast<py::dict>();
  const std::string typestr = cai["typestr"].cast<std::string>();
  std::size_t itemsize = 4;
  if (typestr == "<f2")
    d->dtype = DeviceDtype::float16, itemsize = 2;
  else if (typestr != "<f4")
    invalid("chorus.Histogram of a CUDA array of " + typestr +
            ": the GPU counts float32 (<f4) and float16 (<f2) arrays; cast it first");
  d->n = 1;
  for (py::handle n : cai["shape"].cast<py::tuple>()) d->n *= n.cast<std::size_t>();
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    std::size_t want = itemsize;
    const py::tuple shape = cai["shape"], strides = cai["strides"];
    for (std::size_t i = shape.size(); i-- > 0;) {
      if (shape[i].cast<std::size_t>() > 1 && strides[i].cast<std::size_t>() != want)
        invalid("chorus.Histogram of a CUDA array that is not contiguous: pass a contiguous copy");
      want *= shape[i].cast<std::size_t>();
    }
  }
  d->values = reinterpret_cast<const void*>(cai["data"].cast<py::tuple>()[0].cast<std::uintptr_t>());
  if (cai.contains("stream") && !cai["stream"].is_none()) {
    // Version 3 of the interface: 1 is the legacy default stream, 2 the per-thread one.
    const auto s = cai["stream"].cast<std::uintptr_t>();
    d->stream = s == 1 ? nullptr : reinterpret_cast<CudaStream>(s);
  }
  d->keep = t;
  return d;
}

/// Whether `x` is a CUDA tensor or a CUDA array.
bool on_a_gpu(py::handle x) {
  if (is_torch(x)) return py::hasattr(x, "is_cuda") && x.attr("is_cuda").cast<bool>();
  const int has = PyObject_HasAttrString(x.ptr(), "__cuda_array_interface__");
  PyErr_Clear();
  return has == 1;
}

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

/// Adds the values of `x` (a list or tuple of numbers, a NumPy array of any
/// numeric dtype, a CPU tensor of any float or int dtype, anything with a
/// float buffer) to `h`. Floats and doubles in a contiguous buffer are
/// bucketed in place, with the GIL released.
void add_values(Histogram& h, py::handle x) {
  if (const Histogram* other = histogram_of(x.ptr())) {
    h.merge(*other);
    return;
  }
  if (device_histogram_of(x.ptr()) != nullptr)
    invalid("a chorus.Histogram of values on a GPU cannot be added to one on the host: log each under its key");
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
  if (on_a_gpu(x))
    invalid("chorus.Histogram.add of values on a GPU would wait for the GPU: make a chorus.Histogram of them alone "
            "(chorus.Histogram(t)), which run.log counts on the GPU, or add t.cpu() where that wait is acceptable");
  if (is_torch(x)) {
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
    const PyHistogram& p = py::reinterpret_borrow<py::object>(v).cast<const PyHistogram&>();
    return p.device ? nullptr : &p.h;
  } catch (...) {
    return nullptr;
  }
}

const DeviceSource* device_histogram_of(PyObject* v) noexcept {
  if (histogram_type == nullptr || !PyObject_TypeCheck(v, histogram_type)) return nullptr;
  try {
    return py::reinterpret_borrow<py::object>(v).cast<const PyHistogram&>().device.get();
  } catch (...) {
    return nullptr;
  }
}

void bind_histogram(py::module_& m) {
  py::class_<PyHistogram> cls(m, "Histogram", R"(A distribution of values in chorus's bucket layout, for run.log:
run.log({"grad": chorus.Histogram(t)}). Takes a list or tuple of numbers, a
NumPy array or a CPU tensor (any numeric dtype), or another Histogram. Buckets
are 1/128 of their lower bound wide (a zero bucket below 2**-126), NaN and
infinities are counted apart, and histograms of a key declared
define_metric(key, reduce="merge") are merged exactly across ranks.
Of a CUDA tensor (float32, float16, bfloat16; other dtypes as float32) or a
CUDA array (<f4, <f2), it stands for the values on the GPU: run.log counts
them there, in the tensor's stream's order, without a host sync, and it has
no figures of its own on the host.)");
  cls.def(py::init([](py::handle values) {
            PyHistogram p;
            if (!values.is_none() && histogram_of(values.ptr()) == nullptr && on_a_gpu(values))
              p.device = device_source(values);
            else if (!values.is_none())
              add_values(p.h, values);
            return p;
          }),
          py::arg("values") = py::none())
      .def("add", [](PyHistogram& p, py::handle values) { add_values(host(p), values); }, py::arg("values"),
           "Adds values (as the constructor takes them, on the host), or one number.")
      .def("merge", [](PyHistogram& p, const PyHistogram& other) { host(p).merge(host(other)); }, py::arg("other"))
      .def_property_readonly("on_gpu", [](const PyHistogram& p) { return p.device != nullptr; },
                             "Whether it stands for values on a GPU (counted there by run.log).")
      .def_property_readonly("count", [](const PyHistogram& p) { return host(p).count(); },
                             "Every value added, NaN and infinities included.")
      .def_property_readonly("sum", [](const PyHistogram& p) { return host(p).sum(); }, "Of the finite values.")
      .def_property_readonly("min", [](const PyHistogram& p) { return host(p).min(); },
                             "The smallest finite value (NaN when there is none).")
      .def_property_readonly("max", [](const PyHistogram& p) { return host(p).max(); },
                             "The largest finite value (NaN when there is none).")
      .def_property_readonly("nan_count", [](const PyHistogram& p) { return host(p).nan_count(); })
      .def_property_readonly("pos_inf_count", [](const PyHistogram& p) { return host(p).pos_inf_count(); })
      .def_property_readonly("neg_inf_count", [](const PyHistogram& p) { return host(p).neg_inf_count(); })
      .def("quantile", [](const PyHistogram& p, double q) { return host(p).quantile(q); }, py::arg("q"),
           "The value of rank round(q (n - 1)) among the values that are not NaN, within 1/256 of its magnitude.")
      .def(
          "buckets",
          [](const PyHistogram& p) {
            py::list out;
            for (const Histogram::Bucket& b : host(p).buckets()) out.append(py::make_tuple(b.lo, b.hi, b.count));
            return out;
          },
          "The non-empty buckets, ascending, as (lo, hi, count).")
      .def("__eq__", [](const PyHistogram& a, const PyHistogram& b) { return host(a) == host(b); })
      .def("__repr__", [](const PyHistogram& p) {
        if (p.device) return "chorus.Histogram(" + std::to_string(p.device->n) + " values on a GPU)";
        const Histogram& h = p.h;
        return "chorus.Histogram(count=" + std::to_string(h.count()) + ", min=" + py::repr(py::float_(h.min())).cast<std::string>() +
               ", max=" + py::repr(py::float_(h.max())).cast<std::string>() + ")";
      });
  cls.attr("relative_error") = Histogram::relative_error;
  histogram_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
}

} // namespace chorus::python
