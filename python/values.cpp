// Metric values from Python: the entries of a log call's dict (numbers,
// NumPy scalars and 0-d arrays, one-element tensors, CUDA arrays, nested
// dicts), what could not be taken and why (for the ticket and rejected.jsonl),
// and the CUDA arrays as the device path takes them. See values.hpp.
#include "python/values.hpp"
#include "python/histogram.hpp"
#include "python/media.hpp"

#include "runtime/client/ingest.hpp"
#include "runtime/core/json.hpp"

#include <cmath>
#include <deque>
#include <iterator>
#include <limits>
#include <unordered_map>

namespace chorus::python {

// ---------------------------------------------------------------------------
// Metric values

namespace {

/// "key", in double quotes, as messages name a metric key (built by
/// appending: GCC 12's -Wrestrict misfires on "lit" + std::string).
std::string quoted(std::string_view key) {
  std::string s;
  s.reserve(key.size() + 2);
  s.push_back('"');
  s.append(key);
  s.push_back('"');
  return s;
}

/// Python text as UTF-8, a lone surrogate written as its escape.
std::string utf8_of(PyObject* text) {
  py::object b = py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(text, "utf-8", "backslashreplace"));
  if (!b) {
    PyErr_Clear();
    return "?";
  }
  return std::string(PyBytes_AS_STRING(b.ptr()), static_cast<std::size_t>(PyBytes_GET_SIZE(b.ptr())));
}

/// repr(o) as UTF-8, its first `max` characters; "<type>" where repr fails.
std::string repr_text(py::handle o, Py_ssize_t max) {
  py::object r = py::reinterpret_steal<py::object>(PyObject_Repr(o.ptr()));
  if (!r) {
    PyErr_Clear();
    std::string t = "<";
    t += type_name(o);
    t += ">";
    return t;
  }
  if (PyUnicode_GET_LENGTH(r.ptr()) > max) {
    r = py::reinterpret_steal<py::object>(PyUnicode_Substring(r.ptr(), 0, max));
    if (!r) {
      PyErr_Clear();
      return "?";
    }
  }
  return utf8_of(r.ptr());
}

/// How a value that is neither a float nor an int is read, by its type.
enum class Kind : std::uint8_t {
  number, // has __float__ (NumPy scalars and 0-d arrays, Fraction, ...): read with float()
  torch,  // a torch.Tensor: its device decides
  cuda,   // its type has __cuda_array_interface__ (CuPy, Numba): the device path where present
  other,  // a dict to flatten, or not a number
};

/// Whether `t` is torch.Tensor or a subclass, by its base's name (torch._C._TensorBase,
/// TensorBase from torch 2.2): torch need not be imported to tell.
bool torch_type(PyTypeObject* t) {
  for (; t != nullptr; t = t->tp_base) {
    const std::string_view name = t->tp_name;
    if (name == "torch._C._TensorBase" || name == "torch._C.TensorBase") return true;
  }
  return false;
}

/// The Kind of a value's type, kept for the first 32 types seen (each held,
/// so that its address is not reused): a NumPy scalar or a CPU tensor costs
/// no attribute lookup that fails, which raises and costs microseconds.
Kind kind_of(PyTypeObject* t) {
  struct Known {
    PyTypeObject* type;
    Kind kind;
  };
  static Known known[32]; // the GIL guards it
  static std::size_t n = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (known[i].type == t) return known[i].kind;
  Kind k = Kind::other;
  const PyNumberMethods* num = t->tp_as_number;
  if (torch_type(t)) {
    k = Kind::torch;
  } else if (PyObject_HasAttrString(reinterpret_cast<PyObject*>(t), "__cuda_array_interface__") != 0) {
    k = Kind::cuda;
  } else if (num != nullptr && (num->nb_float != nullptr || num->nb_index != nullptr || num->nb_int != nullptr)) {
    k = Kind::number;
  }
  PyErr_Clear();
  if (n < std::size(known)) {
    Py_INCREF(t);
    known[n++] = {t, k};
  }
  return k;
}

/// Whether `v` is a CUDA array now (a torch tensor on a GPU, or any object
/// whose __cuda_array_interface__ is there: reading it does not synchronize).
bool on_gpu(PyObject* v, Kind k) {
  static PyObject* is_cuda = PyUnicode_InternFromString("is_cuda");
  static PyObject* cai = PyUnicode_InternFromString("__cuda_array_interface__");
  if (k == Kind::torch) {
    PyObject* c = PyObject_GetAttr(v, is_cuda);
    if (c == nullptr) {
      PyErr_Clear();
      return false;
    }
    const bool yes = c == Py_True;
    Py_DECREF(c);
    return yes;
  }
  const int has = PyObject_HasAttr(v, cai); // an instance's own attribute too
  PyErr_Clear();
  return has == 1;
}

bool is_mapping(PyObject* v) {
  if (PyDict_Check(v)) return true;
  static py::handle mapping; // collections.abc.Mapping, held to the end
  if (!mapping) mapping = py::object(py::module_::import("collections.abc").attr("Mapping")).release();
  const int r = PyObject_IsInstance(v, mapping.ptr());
  if (r < 0) PyErr_Clear();
  return r == 1;
}

/// A refused value as rejected.jsonl shows it: a number as a number, None
/// as null, anything else its repr as a JSON string of at most 200
/// characters; a CUDA array by its type alone (reading it would synchronize).
std::string value_json(py::handle value) {
  PyObject* v = value.ptr();
  std::string out;
  if (v == Py_None) return "null";
  if (PyBool_Check(v)) return v == Py_True ? "true" : "false";
  if (PyLong_Check(v)) {
    std::string digits = py::str(value).cast<std::string>();
    if (digits.size() <= 200) return digits;
  } else if (PyFloat_Check(v)) {
    core::append_json_number(out, PyFloat_AS_DOUBLE(v));
    return out;
  } else if (!PyUnicode_Check(v) && !PyDict_Check(v)) {
    const Kind k = kind_of(Py_TYPE(v));
    if (k != Kind::number && on_gpu(v, k)) {
      std::string what = "<a ";
      what += type_name(value);
      what += " on a GPU>";
      core::append_json_string(out, what);
      return out;
    }
    if (k == Kind::number || k == Kind::torch) {
      if (PyObject* f = PyNumber_Float(v)) {
        core::append_json_number(out, PyFloat_AS_DOUBLE(f));
        Py_DECREF(f);
        return out;
      }
      PyErr_Clear();
    }
  }
  core::append_json_string(out, repr_text(value, 200));
  return out;
}

/// A key as rejected.jsonl shows it: the text of a str key, else its repr.
std::string key_text(PyObject* k, const std::string* prefix) {
  std::string t;
  if (prefix != nullptr) {
    t = *prefix;
    t.push_back('/');
  }
  t += PyUnicode_Check(k) ? utf8_of(k) : repr_text(k, 1000);
  return t;
}

/// Keys nested deeper than this are refused rather than followed.
constexpr int max_depth = 32;

void take(py::handle key, py::handle value, Values& out, const std::string* prefix, int depth);

/// A dict's entries under `name`: {"train": {"loss": l}} logs "train/loss".
/// `depth`: the dicts it is nested in; one nested too deep is refused.
void take_nested(py::handle values, Values& out, std::string_view name, int depth) {
  if (depth >= max_depth) {
    out.refuse(quoted(name) + " is a dict nested more than 32 levels deep: flatten it", Errc::invalid_argument,
               std::string(name), value_json(values));
    return;
  }
  const std::string prefix(name);
  py::object d = py::reinterpret_borrow<py::object>(values);
  if (!PyDict_Check(values.ptr())) {
    d = py::dict(d);
    out.keys.push_back(d); // the copy holds the keys the values view
  }
  PyObject* k;
  PyObject* v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(d.ptr(), &pos, &k, &v)) take(k, v, out, &prefix, depth + 1);
}

/// Takes one entry: a number on the host, a CUDA array, a dict of entries,
/// or a refusal.
void take(py::handle key, py::handle value, Values& out, const std::string* prefix, int depth) {
  PyObject* k = key.ptr();
  PyObject* v = value.ptr();
  if (!PyUnicode_Check(k)) {
    std::string why = "the key " + shown(key);
    if (prefix != nullptr) why += " in " + quoted(*prefix);
    why += " is a " + type_name(key) + ": keys are str";
    out.refuse(std::move(why), Errc::invalid_argument, key_text(k, prefix), value_json(value));
    return;
  }
  Py_ssize_t len = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(k, &len);
  if (utf8 == nullptr) {
    PyErr_Clear();
    out.refuse("the key " + shown(key) + " is not valid UTF-8 (it holds a lone surrogate): keys are UTF-8 text",
               Errc::invalid_argument, key_text(k, prefix), value_json(value));
    return;
  }
  std::string_view name(utf8, static_cast<std::size_t>(len));
  if (prefix != nullptr) {
    std::string joined = *prefix;
    joined.push_back('/');
    joined.append(name);
    name = out.joined.emplace_back(std::move(joined)); // a deque: the views stay valid
  }
  double d;
  if (PyFloat_Check(v)) { // float, and NumPy's float64
    d = PyFloat_AS_DOUBLE(v);
  } else if (PyLong_Check(v)) { // int and bool
    d = PyLong_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      out.refuse(quoted(name) + " is an int too large for a float", Errc::invalid_argument, std::string(name),
                 value_json(value));
      return;
    }
  } else if (PyDict_Check(v)) {
    take_nested(value, out, name, depth);
    return;
  } else {
    if (const Histogram* h = histogram_of(v)) {
      if (prefix == nullptr) out.keys.push_back(py::reinterpret_borrow<py::object>(key));
      out.keys.push_back(py::reinterpret_borrow<py::object>(value)); // held with the call
      out.histograms.push_back({name, h, nullptr});
      return;
    }
    if (const DeviceSource* d = device_histogram_of(v)) {
      if (prefix == nullptr) out.keys.push_back(py::reinterpret_borrow<py::object>(key));
      out.keys.push_back(py::reinterpret_borrow<py::object>(value)); // held with the call
      out.histograms.push_back({name, nullptr, d});
      return;
    }
    if (MediaJobMaker job = media_of(v)) {
      if (prefix == nullptr) out.keys.push_back(py::reinterpret_borrow<py::object>(key));
      out.keys.push_back(py::reinterpret_borrow<py::object>(value)); // held with the call
      out.media.push_back({name, std::move(job)});
      return;
    }
    const Kind kind = PyUnicode_Check(v) ? Kind::other : kind_of(Py_TYPE(v));
    if (kind != Kind::number && on_gpu(v, kind)) {
      // The device path: float() of a CUDA tensor would synchronize with the GPU.
      if (prefix == nullptr) out.keys.push_back(py::reinterpret_borrow<py::object>(key));
      out.device.push_back({name, py::reinterpret_borrow<py::object>(value)});
      return;
    }
    if (kind == Kind::other && is_mapping(v)) { // a Mapping that is not a dict
      take_nested(value, out, name, depth);
      return;
    }
    if (kind == Kind::other) {
      out.refuse(quoted(name) + " is a " + type_name(value) + " (" + shown(value) +
                     "), not a number: log int, float, NumPy scalars or one-element tensors",
                 Errc::invalid_argument, std::string(name), value_json(value));
      return;
    }
    // NumPy scalars and 0-d arrays, CPU tensors: one read of the value, no copy.
    PyObject* f = PyNumber_Float(v);
    if (f == nullptr) {
      std::string why;
      try {
        py::error_already_set e;
        why = e.what();
      } catch (...) {
        PyErr_Clear();
      }
      out.refuse(quoted(name) + " (a " + type_name(value) + ") is not one number: " + why, Errc::invalid_argument,
                 std::string(name), value_json(value));
      return;
    }
    d = PyFloat_AS_DOUBLE(f);
    Py_DECREF(f);
  }
  if (prefix == nullptr) out.keys.push_back(py::reinterpret_borrow<py::object>(key));
  out.host.push_back({name, d});
}

} // namespace

void Values::clear() {
  host.clear();
  device.clear();
  histograms.clear();
  media.clear();
  keys.clear();
  joined.clear();
  refused.clear();
  refused_n = 0;
  all_refused.clear();
}

void Values::refuse(std::string why, Errc code, std::string key_text, std::string value_json) {
  all_refused.push_back({code, why, {std::move(key_text), std::move(value_json)}});
  if (refused_n++ != 0) return;
  refused = std::move(why);
  refused_code = code;
}

void Values::refuse_device(const std::string& why) {
  for (const Device& d : device)
    refuse(quoted(d.key) + ": " + why, Errc::invalid_argument, std::string(d.key), value_json(d.value));
  device.clear();
  std::erase_if(histograms, [&](const HistogramValue& h) {
    if (h.device == nullptr) return false;
    refuse(quoted(h.key) + ": " + why, Errc::invalid_argument, std::string(h.key),
           "{\"histogram\":{\"count\":" + std::to_string(h.device->n) + ",\"on_gpu\":true}}");
    return true;
  });
}

void Values::refuse_host(const std::string& why) {
  for (const Metric& m : host) {
    std::string number;
    core::append_json_number(number, m.value);
    refuse(quoted(m.key) + ": " + why, Errc::invalid_argument, std::string(m.key), std::move(number));
  }
}

Error Values::refusal() const {
  if (refused_n == 0) return {};
  const std::size_t logged = host.size() + device.size();
  std::string m = refused_n == 1 ? "1 value was refused: " : std::to_string(refused_n) + " values were refused, the first: ";
  m += refused;
  m += logged == 0 ? " (nothing of the call was logged)"
                   : " (the call's " + std::to_string(logged) + " other value" + (logged == 1 ? " was" : "s were") +
                         " logged)";
  return Error(refused_code, std::move(m));
}

void Values::record(client::RunImpl* run, std::optional<std::int64_t> step) const noexcept {
  if (run == nullptr || all_refused.empty()) return;
  try {
    // One call per distinct reason; a reason names its key, so that is
    // mostly one a value (a key refused twice in a call shares its call).
    std::vector<std::size_t> order;
    std::unordered_map<std::string_view, std::size_t> group_of; // why -> index into groups
    std::vector<std::vector<client::RefusedValue>> groups;
    for (std::size_t i = 0; i < all_refused.size(); ++i) {
      const Refused& r = all_refused[i];
      auto [at, added] = group_of.try_emplace(r.why, groups.size());
      if (added) {
        groups.emplace_back();
        order.push_back(i);
      }
      groups[at->second].push_back(r.value);
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const Refused& first = all_refused[order[g]];
      run->record_refusal(step, Error(first.code, first.why), groups[g]);
    }
  } catch (...) {
    // Out of memory: the ticket's error is the trace left.
  }
}

void collect_metrics(py::handle values, Values& out) {
  if (PyDict_Check(values.ptr())) {
    PyObject* k;
    PyObject* v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(values.ptr(), &pos, &k, &v)) take(k, v, out, nullptr, 0);
    return;
  }
  if (!PyObject_HasAttrString(values.ptr(), "items")) {
    PyErr_Clear();
    invalid("log takes a dict of key -> number (run.log({\"loss\": 0.3})), not a " + type_name(values));
  }
  py::dict d(py::reinterpret_borrow<py::object>(values));
  // The dict is a copy: keep it (and so its keys) alive with the call.
  out.keys.push_back(d);
  PyObject* k;
  PyObject* v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(d.ptr(), &pos, &k, &v)) take(k, v, out, nullptr, 0);
}

namespace {

void gather_into(PyObject* into, py::handle values, const std::string* prefix, int depth) {
  py::object items = py::reinterpret_borrow<py::object>(values);
  if (!PyDict_Check(values.ptr())) items = py::dict(items);
  PyObject* k;
  PyObject* v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(items.ptr(), &pos, &k, &v)) {
    const bool text = PyUnicode_Check(k) != 0;
    std::string name;
    if (text) {
      if (prefix != nullptr) {
        name = *prefix;
        name.push_back('/');
      }
      name += utf8_of(k);
    }
    // Nested as take() follows them: a dict, or another Mapping that is no number.
    const bool nested = text && depth < max_depth &&
                        (PyDict_Check(v) || (!PyFloat_Check(v) && !PyLong_Check(v) && !PyUnicode_Check(v) &&
                                             kind_of(Py_TYPE(v)) == Kind::other && is_mapping(v)));
    if (nested) {
      gather_into(into, v, &name, depth + 1);
    } else if (prefix == nullptr || text) {
      py::object key = text && prefix != nullptr ? py::object(py::str(name)) : py::reinterpret_borrow<py::object>(k);
      if (PyDict_SetItem(into, key.ptr(), v) != 0) throw py::error_already_set();
    } else {
      // A key that is not a str inside a dict: under its parent's key, nested, so
      // that the log call refuses it with the message it gives in one call.
      py::str parent(*prefix);
      PyObject* inner = PyDict_GetItemWithError(into, parent.ptr());
      if (inner == nullptr && PyErr_Occurred()) throw py::error_already_set();
      py::object d = inner != nullptr && PyDict_Check(inner) ? py::reinterpret_borrow<py::object>(inner) : py::dict();
      if (PyDict_SetItem(d.ptr(), k, v) != 0 || PyDict_SetItem(into, parent.ptr(), d.ptr()) != 0)
        throw py::error_already_set();
    }
  }
}

} // namespace

void gather(py::dict into, py::handle values) {
  if (!PyDict_Check(values.ptr()) && !PyObject_HasAttrString(values.ptr(), "items")) {
    PyErr_Clear();
    invalid("log takes a dict of key -> number (run.log({\"loss\": 0.3})), not a " + type_name(values));
  }
  gather_into(into.ptr(), values, nullptr, 0);
}

// ---------------------------------------------------------------------------
// CUDA arrays

namespace {

/// The stream a torch tensor is computed on: torch.cuda.current_stream(device).
std::optional<CudaStream> torch_stream(py::handle value) {
  if (!PyObject_HasAttrString(value.ptr(), "is_cuda") || !PyObject_HasAttrString(value.ptr(), "data_ptr")) {
    PyErr_Clear();
    return std::nullopt;
  }
  py::object cuda = py::module_::import("torch.cuda");
  py::object s = cuda.attr("current_stream")(value.attr("device"));
  return reinterpret_cast<CudaStream>(s.attr("cuda_stream").cast<std::uintptr_t>());
}

} // namespace

DeviceValues device_values(Values& v) {
  DeviceValues out;
  bool have_stream = false;
  std::vector<Values::Device> taken;
  for (Values::Device& d : v.device) {
    // A bad key refuses that value alone, as for host values (log_device
    // itself refuses its whole call: reduce_device's collective needs that).
    if (Error bad = client::validate_metric_key(d.key)) {
      v.refuse(bad.message(), bad.code(), std::string(d.key), value_json(d.value));
      continue;
    }
    py::object value = d.value;
    const bool is_torch = PyObject_HasAttrString(value.ptr(), "is_cuda") != 0;
    PyErr_Clear();
    py::dict cai = value.attr("__cuda_array_interface__").cast<py::dict>();
    const std::string typestr = cai["typestr"].cast<std::string>();
    std::size_t elements = 1;
    for (py::handle n : cai["shape"].cast<py::tuple>()) elements *= n.cast<std::size_t>();
    if (elements != 1) {
      v.refuse(quoted(d.key) + " is a CUDA array of " + std::to_string(elements) +
                   " elements: log one element (a loss, a mean: .mean() or .sum() first, or index it)",
               Errc::invalid_argument, std::string(d.key), value_json(d.value));
      continue;
    }
    if (typestr != "<f4") {
      if (!is_torch) {
        v.refuse(quoted(d.key) + " is a CUDA array of " + typestr +
                     ": the device path takes float32 (<f4); cast it first",
                 Errc::invalid_argument, std::string(d.key), value_json(d.value));
        continue;
      }
      value = value.attr("float")(); // on its stream: no host sync
      out.hold.push_back(value);
      cai = value.attr("__cuda_array_interface__").cast<py::dict>();
    }
    const auto ptr = cai["data"].cast<py::tuple>()[0].cast<std::uintptr_t>();
    CudaStream stream = nullptr;
    if (std::optional<CudaStream> ts = torch_stream(value)) {
      stream = *ts;
    } else if (cai.contains("stream") && !cai["stream"].is_none()) {
      // Version 3 of the interface: 1 is the legacy default stream, 2 the
      // per-thread default stream, any other value a cudaStream_t.
      const auto s = cai["stream"].cast<std::uintptr_t>();
      stream = s == 1 ? nullptr : reinterpret_cast<CudaStream>(s);
    }
    if (have_stream && stream != out.stream) {
      v.refuse(quoted(d.key) + " is computed on another CUDA stream than the call's other values: "
                               "log each stream's values in a call of its own",
               Errc::invalid_argument, std::string(d.key), value_json(d.value));
      continue;
    }
    have_stream = true;
    out.stream = stream;
    out.metrics.push_back({d.key, reinterpret_cast<const float*>(ptr)});
    taken.push_back(std::move(d));
  }
  v.device = std::move(taken);
  return out;
}

} // namespace chorus::python
