#include "python/convert.hpp"

#include "runtime/client/ingest.hpp"
#include "runtime/core/options.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

namespace chorus::python {

// ---------------------------------------------------------------------------
// Errors

namespace {

/// chorus._errors.by_code: Errc's name -> exception class.
py::object error_class(Errc code) {
  static py::handle by_code; // borrowed from the module, which lives to the end
  if (!by_code) by_code = py::object(py::module_::import("chorus._errors").attr("by_code")).release();
  return py::reinterpret_borrow<py::dict>(by_code)[py::str(std::string(to_string(code)))];
}

[[noreturn]] void invalid(const std::string& message) { raise(Error(Errc::invalid_argument, message)); }

std::string type_name(py::handle o) { return Py_TYPE(o.ptr())->tp_name; }

/// The text a key or a value shows in a message: its repr, cut at 60 characters.
std::string shown(py::handle o) {
  std::string r;
  try {
    r = py::repr(o).cast<std::string>();
  } catch (const py::error_already_set&) {
    r = "<" + type_name(o) + ">";
  }
  if (r.size() > 60) r = r.substr(0, 57) + "...";
  return r;
}

} // namespace

py::object error_object(const Error& e) {
  if (!e) return py::none();
  py::object ex = error_class(e.code())(e.message());
  ex.attr("code") = std::string(to_string(e.code()));
  return ex;
}

void raise(const Error& e) {
  py::object ex = error_object(e);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(ex.ptr())), ex.ptr());
  throw py::error_already_set();
}

py::dict rank_dict(std::int64_t rank, std::string_view state, std::int64_t last_step, const std::string& host,
                   const std::string& message) {
  py::dict d;
  d["rank"] = rank;
  d["state"] = std::string(state);
  d["last_step"] = last_step;
  d["host"] = host;
  d["message"] = message;
  return d;
}

// ---------------------------------------------------------------------------
// Arguments

std::chrono::milliseconds to_ms(double seconds, const char* what) {
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > 1e9)
    invalid(std::string(what) + " of " + seconds_text(seconds) + " s: give a positive number of seconds");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1000)));
}

std::string seconds_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", seconds);
  return buf;
}

std::optional<std::int64_t> to_step(py::handle step) {
  if (step.is_none()) return std::nullopt;
  if (!PyLong_Check(step.ptr()) && !PyObject_HasAttrString(step.ptr(), "__index__"))
    invalid("step " + shown(step) + " is a " + type_name(step) +
            ": give a whole number (an int), or leave it out for automatic steps");
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(step.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long s = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || s < 0)
    invalid("step " + shown(step) + " is out of range: steps are whole numbers from 0 to 2^63-1");
  return s;
}

Reduce to_reduce(const std::string& name) {
  if (std::optional<Reduce> r = detail::parse_reduce(name)) return *r;
  invalid("reduce \"" + name + "\" is not a reduction: give " + std::string(detail::reduce_takes));
}

std::string path_text(py::handle path) {
  py::object fs = py::reinterpret_steal<py::object>(PyOS_FSPath(path.ptr()));
  if (!fs) throw py::error_already_set();
  if (PyBytes_Check(fs.ptr())) return py::bytes(fs).cast<std::string>();
  return fs.cast<std::string>();
}

namespace {

/// An option spelled as its CHORUS_* variable is (runtime/core/options.hpp).
template <class E>
E to_enum(const std::string& text, const char* what, std::optional<E> (*parse)(std::string_view),
          std::string_view takes) {
  if (std::optional<E> e = parse(text)) return *e;
  invalid(std::string(what) + " \"" + text + "\" is not one: give " + std::string(takes));
}

std::string text_arg(py::handle v, const char* name) {
  if (!py::isinstance<py::str>(v))
    invalid(std::string(name) + " is a " + type_name(v) + ": give a str");
  return v.cast<std::string>();
}

double number_arg(py::handle v, const char* name) {
  if (PyBool_Check(v.ptr()) || !PyNumber_Check(v.ptr()) || py::isinstance<py::str>(v))
    invalid(std::string(name) + " is a " + type_name(v) + ": give a number");
  return py::reinterpret_borrow<py::object>(v).cast<double>();
}

} // namespace

Options to_options(const py::kwargs& kw) {
  Options o;
  using Ms = std::chrono::milliseconds Options::*;
  using Text = std::string Options::*;
  static const std::pair<const char*, Text> texts[] = {
      {"project", &Options::project}, {"name", &Options::name},       {"group", &Options::group},
      {"job_type", &Options::job_type}, {"run_id", &Options::run_id}, {"notes", &Options::notes},
      {"dir", &Options::dir},         {"upload", &Options::upload},   {"host_address", &Options::host_address},
      {"tls_dir", &Options::tls_dir}};
  static const std::pair<const char*, Ms> times[] = {{"init_timeout", &Options::init_timeout},
                                                     {"finish_timeout", &Options::finish_timeout},
                                                     {"upload_timeout", &Options::upload_timeout},
                                                     {"barrier_timeout", &Options::barrier_timeout},
                                                     {"heartbeat_interval", &Options::heartbeat_interval},
                                                     {"connection_timeout", &Options::connection_timeout}};
  for (auto item : kw) {
    const std::string name = item.first.cast<std::string>();
    py::handle v = item.second;
    if (v.is_none()) continue; // the default
    bool known = false;
    for (const auto& [n, field] : texts)
      if (name == n) {
        o.*field = text_arg(v, n);
        known = true;
      }
    for (const auto& [n, field] : times)
      if (name == n) {
        o.*field = to_ms(number_arg(v, n), n);
        known = true;
      }
    if (known) continue;
    if (name == "mode") {
      o.mode = to_enum(text_arg(v, "mode"), "mode", &detail::parse_mode, detail::mode_takes);
    } else if (name == "scope") {
      o.scope = to_enum(text_arg(v, "scope"), "scope", &detail::parse_scope, detail::scope_takes);
    } else if (name == "resume") {
      if (PyBool_Check(v.ptr()))
        o.resume = v.cast<bool>() ? Resume::allow : Resume::never;
      else
        o.resume = to_enum(text_arg(v, "resume"), "resume", &detail::parse_resume, detail::resume_takes);
    } else if (name == "overflow") {
      // Not a CHORUS_* variable: Options::overflow's two words.
      const std::string text = text_arg(v, "overflow");
      if (text != "block" && text != "drop_newest") invalid("overflow \"" + text + "\" is not one: give block or drop_newest");
      o.overflow = text == "block" ? Overflow::block : Overflow::drop_newest;
    } else if (name == "port") {
      const double p = number_arg(v, "port");
      if (p != std::floor(p) || p < 1 || p > 65535) invalid("port " + shown(v) + " is not a port: give 1..65535");
      o.port = static_cast<std::uint16_t>(p);
    } else if (name == "queue_capacity" || name == "upload_buffer") {
      const double n = number_arg(v, name.c_str());
      if (n != std::floor(n) || n < 1 || n > 1e12) invalid(name + " " + shown(v) + ": give a positive whole number");
      (name == "queue_capacity" ? o.queue_capacity : o.upload_buffer) = static_cast<std::size_t>(n);
    } else if (name == "system_interval") {
      o.system_interval = number_arg(v, "system_interval");
    } else if (name == "insecure" || name == "read_env") {
      if (!PyBool_Check(v.ptr())) invalid(name + " is a " + type_name(v) + ": give True or False");
      (name == "insecure" ? o.insecure : o.read_env) = v.cast<bool>();
    } else if (name == "config") {
      std::vector<std::string> keys;
      for (const Field& f : to_fields(v, keys)) o.config.emplace_back(std::string(f.key), f.value);
    } else {
      PyErr_SetString(PyExc_TypeError, ("chorus.init() got an unexpected keyword argument '" + name +
                                        "': see help(chorus.init) for the options it takes")
                                           .c_str());
      throw py::error_already_set();
    }
  }
  return o;
}

// ---------------------------------------------------------------------------
// Config and summary fields

namespace {

/// A config or summary value as chorus keeps it: None, bool, int (one beyond
/// 64 bits as its digits), float, str; a list or tuple as its JSON text; any
/// other object as its str().
Value field_value(py::handle v) {
  if (v.is_none()) return {};
  if (PyBool_Check(v.ptr())) return v.cast<bool>();
  if (PyLong_Check(v.ptr()) ||
      (PyNumber_Check(v.ptr()) && PyObject_HasAttrString(v.ptr(), "__index__") && !PyFloat_Check(v.ptr()))) {
    py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow != 0) return py::str(i).cast<std::string>();
    return static_cast<std::int64_t>(n);
  }
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (PyFloat_Check(v.ptr()) || (PyNumber_Check(v.ptr()) && PyObject_HasAttrString(v.ptr(), "__float__") &&
                                 !PyObject_HasAttrString(v.ptr(), "__cuda_array_interface__"))) {
    py::object f = py::reinterpret_steal<py::object>(PyNumber_Float(v.ptr()));
    if (f) return PyFloat_AS_DOUBLE(f.ptr());
    PyErr_Clear(); // a number that is not one float (a tensor of several): its text
  } else if (PyList_Check(v.ptr()) || PyTuple_Check(v.ptr())) {
    return py::module_::import("json")
        .attr("dumps")(v, py::arg("default") = py::module_::import("builtins").attr("str"))
        .cast<std::string>();
  }
  return py::str(v).cast<std::string>();
}

/// Adds `mapping`'s entries, a nested mapping's keys joined to its own with '.'.
void add_fields(py::handle mapping, const std::string& prefix, std::vector<std::string>& keys,
                std::vector<Value>& values, int depth) {
  if (depth > 32) invalid("config nested more than 32 levels deep at \"" + prefix + "\": flatten it");
  py::object items = py::reinterpret_borrow<py::object>(mapping).attr("items")();
  for (py::handle kv : items) {
    py::tuple pair = py::reinterpret_borrow<py::tuple>(kv);
    py::handle k = pair[0];
    py::handle v = pair[1];
    std::string key = py::isinstance<py::str>(k) ? k.cast<std::string>() : py::str(k).cast<std::string>();
    if (!prefix.empty()) key = prefix + "." + key;
    const bool nested = !v.is_none() && !PyBool_Check(v.ptr()) && !py::isinstance<py::str>(v) &&
                        PyObject_HasAttrString(v.ptr(), "items") && PyObject_HasAttrString(v.ptr(), "keys");
    if (nested) {
      add_fields(v, key, keys, values, depth + 1);
    } else {
      values.push_back(field_value(v));
      keys.push_back(std::move(key));
    }
  }
}

} // namespace

std::vector<Field> to_fields(py::handle mapping, std::vector<std::string>& keys) {
  if (!PyObject_HasAttrString(mapping.ptr(), "items"))
    invalid("config and summary take a dict (a mapping of str to values), not a " + type_name(mapping));
  std::vector<Value> values;
  keys.clear();
  add_fields(mapping, "", keys, values, 0);
  std::vector<Field> fields;
  fields.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) fields.push_back({keys[i], std::move(values[i])});
  return fields;
}

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

} // namespace

void Values::clear() {
  host.clear();
  device.clear();
  keys.clear();
  refused.clear();
  refused_n = 0;
}

void Values::refuse(std::string why, Errc code) {
  if (refused_n++ != 0) return;
  refused = std::move(why);
  refused_code = code;
}

void Values::refuse_device(const std::string& why) {
  for (const Device& d : device) refuse(quoted(d.key) + ": " + why);
  device.clear();
}

void Values::refuse_host(const std::string& why) {
  for (const Metric& m : host) refuse(quoted(m.key) + ": " + why);
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

namespace {

/// Takes one entry; false where the value is not a number on the host.
void take(py::handle key, py::handle value, Values& out) {
  PyObject* k = key.ptr();
  PyObject* v = value.ptr();
  if (!PyUnicode_Check(k)) {
    out.refuse("the key " + shown(key) + " is a " + type_name(key) + ": keys are str");
    return;
  }
  Py_ssize_t len = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(k, &len);
  if (utf8 == nullptr) {
    PyErr_Clear();
    out.refuse("the key " + shown(key) + " is not valid UTF-8 (it holds a lone surrogate): keys are UTF-8 text");
    return;
  }
  const std::string_view name(utf8, static_cast<std::size_t>(len));
  double d;
  if (PyFloat_Check(v)) { // float, and NumPy's float64
    d = PyFloat_AS_DOUBLE(v);
  } else if (PyLong_Check(v)) { // int and bool
    d = PyLong_AsDouble(v);
    if (d == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      out.refuse(quoted(name) + " is an int too large for a float");
      return;
    }
  } else if (PyUnicode_Check(v) || PyBytes_Check(v) || !PyNumber_Check(v)) {
    if (PyObject_HasAttrString(v, "__cuda_array_interface__")) {
      out.keys.push_back(py::reinterpret_borrow<py::object>(key));
      out.device.push_back({name, py::reinterpret_borrow<py::object>(value)});
      return;
    }
    PyErr_Clear();
    out.refuse(quoted(name) + " is a " + type_name(value) + " (" + shown(value) +
               "), not a number: log int, float, NumPy scalars or one-element tensors");
    return;
  } else {
    // NumPy scalars, tensors: a CUDA tensor goes the device path (its
    // __float__ would synchronize with the GPU).
    if (PyObject_HasAttrString(v, "__cuda_array_interface__")) {
      out.keys.push_back(py::reinterpret_borrow<py::object>(key));
      out.device.push_back({name, py::reinterpret_borrow<py::object>(value)});
      return;
    }
    PyErr_Clear();
    PyObject* f = PyNumber_Float(v);
    if (f == nullptr) {
      std::string why;
      try {
        py::error_already_set e;
        why = e.what();
      } catch (...) {
        PyErr_Clear();
      }
      out.refuse(quoted(name) + " (a " + type_name(value) + ") is not one number: " + why);
      return;
    }
    d = PyFloat_AS_DOUBLE(f);
    Py_DECREF(f);
  }
  out.keys.push_back(py::reinterpret_borrow<py::object>(key));
  out.host.push_back({name, d});
}

} // namespace

void collect_metrics(py::handle values, Values& out) {
  if (PyDict_Check(values.ptr())) {
    PyObject* k;
    PyObject* v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(values.ptr(), &pos, &k, &v)) take(k, v, out);
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
  while (PyDict_Next(d.ptr(), &pos, &k, &v)) take(k, v, out);
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
    if (Error bad = detail::validate_metric_key(d.key)) {
      v.refuse(bad.message(), bad.code());
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
               " elements: log one element (a loss, a mean: .mean() or .sum() first, or index it)");
      continue;
    }
    if (typestr != "<f4") {
      if (!is_torch) {
        v.refuse(quoted(d.key) + " is a CUDA array of " + typestr +
                 ": the device path takes float32 (<f4); cast it first");
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
                                               "log each stream's values in a call of its own");
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

// ---------------------------------------------------------------------------

bool wait_interruptibly(const std::function<bool()>& ready,
                        const std::function<void(std::chrono::milliseconds)>& wait_some,
                        std::optional<double> timeout) {
  using clock = std::chrono::steady_clock;
  std::optional<clock::time_point> until;
  if (timeout) {
    if (!std::isfinite(*timeout) || *timeout < 0) invalid("timeout " + seconds_text(*timeout) + ": give seconds >= 0");
    until = clock::now() + std::chrono::microseconds(static_cast<long long>(*timeout * 1e6));
  }
  for (;;) {
    if (ready()) return true;
    auto slice = std::chrono::milliseconds(100);
    if (until) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*until - clock::now());
      if (left.count() <= 0) return ready();
      slice = std::min(slice, left + std::chrono::milliseconds(1));
    }
    {
      py::gil_scoped_release unlocked;
      wait_some(slice);
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

} // namespace chorus::python
