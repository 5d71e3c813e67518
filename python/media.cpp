// chorus.Image, chorus.Text and chorus.Table (python/media.hpp).
#include "python/media.hpp"
#include "python/convert.hpp"

#include "runtime/client/run_impl.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace chorus::python {
namespace {

/// What a chorus.Image holds: its own copy of the pixels (HWC, uint8 or
/// float32) or of the file's bytes.
struct PyImage {
  std::vector<std::uint8_t> u8;
  std::vector<float> f32;
  std::vector<char> file;
  int height = 0, width = 0, channels = 0;
  std::string caption;
};

PyTypeObject* image_type = nullptr;

PyImage make(py::handle data, py::object caption) {
  PyImage img;
  if (!caption.is_none()) img.caption = text_arg(caption, "caption");
  if (PyBytes_Check(data.ptr()) || PyByteArray_Check(data.ptr()) || PyMemoryView_Check(data.ptr())) {
    const std::string bytes = py::bytes(py::reinterpret_borrow<py::object>(data)).cast<std::string>();
    img.file.assign(bytes.begin(), bytes.end());
    return img;
  }
  py::object np = py::module_::import("numpy");
  py::object arr = py::reinterpret_borrow<py::object>(data);
  const std::string module = py::str(py::type::of(data).attr("__module__"));
  bool chw = false;
  if (module.rfind("torch", 0) == 0) {
    if (arr.attr("is_cuda").cast<bool>())
      invalid("chorus.Image of a CUDA tensor would wait for the GPU: pass t.cpu() where that wait is acceptable");
    arr = arr.attr("detach")();
    const py::tuple shape = arr.attr("shape");
    // A tensor's image is CHW (torchvision's), unless its last side is the channels.
    chw = shape.size() == 3 && (shape[0].cast<int>() == 1 || shape[0].cast<int>() == 3 || shape[0].cast<int>() == 4) &&
          !(shape[2].cast<int>() == 1 || shape[2].cast<int>() == 3 || shape[2].cast<int>() == 4);
    const std::string dtype = py::str(arr.attr("dtype"));
    if (dtype != "torch.uint8") arr = arr.attr("float")();
    arr = arr.attr("numpy")();
  }
  arr = np.attr("asarray")(arr); // PIL images and array-likes too
  if (chw) arr = arr.attr("transpose")(1, 2, 0);
  const py::tuple shape = arr.attr("shape");
  if (shape.size() == 2) {
    arr = arr.attr("reshape")(shape[0], shape[1], 1);
  } else if (shape.size() != 3) {
    invalid("chorus.Image takes pixels as height x width (grey) or height x width x channels: an array of " +
            std::to_string(shape.size()) + " dimensions is neither");
  }
  const py::tuple hwc = arr.attr("shape");
  img.height = hwc[0].cast<int>();
  img.width = hwc[1].cast<int>();
  img.channels = hwc[2].cast<int>();
  const std::string kind = py::str(arr.attr("dtype").attr("kind"));
  if (kind == "u" && py::str(arr.attr("dtype")).cast<std::string>() == "uint8") {
    arr = np.attr("ascontiguousarray")(arr);
    const py::buffer_info b = py::buffer(arr).request();
    const auto* p = static_cast<const std::uint8_t*>(b.ptr);
    img.u8.assign(p, p + b.size);
  } else if (kind == "f" || kind == "u" || kind == "i" || kind == "b") {
    arr = np.attr("ascontiguousarray")(arr, "float32");
    const py::buffer_info b = py::buffer(arr).request();
    const auto* p = static_cast<const float*>(b.ptr);
    img.f32.assign(p, p + b.size);
  } else {
    invalid("chorus.Image takes pixels of numbers (uint8, or floats in [0, 1]), not of dtype " +
            py::str(arr.attr("dtype")).cast<std::string>());
  }
  return img;
}

/// What a chorus.Text holds: its own copy of the text.
struct PyText {
  std::string text;
};

/// What a chorus.Table holds: its columns and rows, converted as made.
struct PyTable {
  std::vector<std::string> columns;
  std::vector<std::vector<Value>> rows;
};

PyTypeObject* text_type = nullptr;
PyTypeObject* table_type = nullptr;

/// A table's cell: None, a bool, a whole number, a float, or a str (NumPy's
/// scalars by their .item()).
Value cell(py::handle v, std::size_t row, std::size_t column) {
  if (v.is_none()) return {};
  if (PyBool_Check(v.ptr())) return Value(v.ptr() == Py_True);
  if (PyLong_Check(v.ptr())) {
    int overflow = 0;
    const long long i = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow == 0 && !(i == -1 && PyErr_Occurred())) return Value(static_cast<std::int64_t>(i));
    PyErr_Clear();
    return Value(PyLong_AsDouble(v.ptr()));
  }
  if (PyFloat_Check(v.ptr())) return Value(PyFloat_AS_DOUBLE(v.ptr()));
  if (PyUnicode_Check(v.ptr())) return Value(text_arg(py::reinterpret_borrow<py::object>(v), "a table's cell"));
  if (py::hasattr(v, "item") && py::hasattr(v, "dtype") && py::len(v.attr("shape")) == 0)
    return cell(v.attr("item")(), row, column);
  invalid("the cell of row " + std::to_string(row) + ", column " + std::to_string(column) +
          " of the chorus.Table is a " + std::string(py::str(py::type::of(v).attr("__name__"))) +
          ": a table holds None, bools, numbers and strings; make it one of them (str(x))");
}

PyTable make_table(py::object columns, py::object data, py::object dataframe) {
  PyTable t;
  if (!dataframe.is_none()) {
    if (!columns.is_none() || !data.is_none())
      invalid("chorus.Table takes a dataframe, or columns and data, not both");
    columns = py::list(dataframe.attr("columns"));
    data = dataframe.attr("itertuples")(py::arg("index") = false, py::arg("name") = py::none());
  }
  if (columns.is_none()) invalid("chorus.Table needs its columns: chorus.Table(columns=[...], data=[[...], ...])");
  if (PyUnicode_Check(columns.ptr()))
    invalid("chorus.Table's columns are a list of names, not one string: columns=[\"" +
            text_arg(columns, "a column") + "\"]");
  for (py::handle c : columns) t.columns.push_back(PyUnicode_Check(c.ptr()) ? text_arg(py::reinterpret_borrow<py::object>(c), "a column")
                                                                           : std::string(py::str(c)));
  if (!data.is_none())
    for (py::handle r : data) {
      if (PyUnicode_Check(r.ptr()) || PyBytes_Check(r.ptr()))
        invalid("row " + std::to_string(t.rows.size()) + " of the chorus.Table is a string: give each row as a "
                "list of cells");
      std::vector<Value>& row = t.rows.emplace_back();
      for (py::handle c : r) row.push_back(cell(c, t.rows.size() - 1, row.size()));
    }
  return t;
}

} // namespace

MediaJobMaker media_of(PyObject* v) {
  if (image_type != nullptr && PyObject_TypeCheck(v, image_type)) {
    const PyImage& i = py::reinterpret_borrow<py::object>(v).cast<const PyImage&>();
    return [&i] {
      if (!i.file.empty()) return client::image_job(Image::from_file_bytes(i.file, i.caption));
      if (!i.u8.empty())
        return client::image_job(
            Image::from_pixels(std::span<const std::uint8_t>(i.u8), i.height, i.width, i.channels, i.caption));
      return client::image_job(
          Image::from_pixels(std::span<const float>(i.f32), i.height, i.width, i.channels, i.caption));
    };
  }
  if (text_type != nullptr && PyObject_TypeCheck(v, text_type)) {
    const PyText& t = py::reinterpret_borrow<py::object>(v).cast<const PyText&>();
    return [&t] { return client::text_job(t.text); };
  }
  if (table_type != nullptr && PyObject_TypeCheck(v, table_type)) {
    const PyTable& t = py::reinterpret_borrow<py::object>(v).cast<const PyTable&>();
    return [&t] { return client::table_job(t.columns, t.rows); };
  }
  return {};
}

void bind_media(py::module_& m) {
  py::class_<PyImage> cls(m, "Image", R"(An image for run.log: run.log({"samples": chorus.Image(x, caption="epoch 3")}).
Takes a NumPy array (height x width, or height x width x channels with 1, 3 or 4
channels; uint8, or floats in [0, 1]), a PIL image, a CPU tensor (CHW or HWC), or
the bytes of a PNG or JPEG file. Pixels are encoded to PNG off the calling thread.)");
  cls.def(py::init(&make), py::arg("data"), py::arg("caption") = py::none())
      .def_property_readonly("height", [](const PyImage& i) { return i.height; })
      .def_property_readonly("width", [](const PyImage& i) { return i.width; })
      .def_property_readonly("channels", [](const PyImage& i) { return i.channels; })
      .def_property_readonly("caption", [](const PyImage& i) { return i.caption; });
  image_type = reinterpret_cast<PyTypeObject*>(cls.ptr());

  py::class_<PyText> text(m, "Text", R"(Text (markdown) for run.log: run.log({"sample": chorus.Text("**3** tokens")}).
UTF-8, at most 64 MiB.)");
  text.def(py::init([](py::object s) { return PyText{text_arg(s, "chorus.Text's text")}; }), py::arg("text"))
      .def_property_readonly("text", [](const PyText& t) { return t.text; });
  text_type = reinterpret_cast<PyTypeObject*>(text.ptr());

  py::class_<PyTable> table(m, "Table", R"(A table for run.log, as W&B's: chorus.Table(columns=["id", "pred"], data=[[1, "cat"], ...]),
or chorus.Table(dataframe=df). Cells are None, bools, numbers or strings; every row has
one cell per column (a ragged row is refused on the call's ticket).)");
  table.def(py::init(&make_table), py::arg("columns") = py::none(), py::arg("data") = py::none(),
            py::arg("dataframe") = py::none())
      .def_property_readonly("columns", [](const PyTable& t) { return t.columns; })
      .def_property_readonly("rows", [](const PyTable& t) { return t.rows.size(); });
  table_type = reinterpret_cast<PyTypeObject*>(table.ptr());
}

} // namespace chorus::python
