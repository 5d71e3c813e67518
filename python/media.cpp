// chorus.Image (python/media.hpp).
#include "python/media.hpp"
#include "python/convert.hpp"

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

} // namespace

bool image_of(PyObject* v, Image& out) noexcept {
  if (image_type == nullptr || !PyObject_TypeCheck(v, image_type)) return false;
  try {
    const PyImage& i = py::reinterpret_borrow<py::object>(v).cast<const PyImage&>();
    if (!i.file.empty())
      out = Image::from_file_bytes(i.file, i.caption);
    else if (!i.u8.empty())
      out = Image::from_pixels(std::span<const std::uint8_t>(i.u8), i.height, i.width, i.channels, i.caption);
    else
      out = Image::from_pixels(std::span<const float>(i.f32), i.height, i.width, i.channels, i.caption);
    return true;
  } catch (...) {
    return false;
  }
}

void bind_image(py::module_& m) {
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
}

} // namespace chorus::python
