#include "python/convert.hpp"

#include "runtime/client/ingest.hpp"
#include "runtime/core/json.hpp"
#include "runtime/core/options.hpp"

#include <cmath>
#include <cstdio>
#include <deque>
#include <iterator>
#include <limits>
#include <thread>
#include <unordered_map>

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

} // namespace

void invalid(const std::string& message) { raise(Error(Errc::invalid_argument, message)); }

std::string type_name(py::handle o) { return Py_TYPE(o.ptr())->tp_name; }

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
  if (std::optional<Reduce> r = core::parse_reduce(name)) return *r;
  invalid("reduce \"" + name + "\" is not a reduction: give " + std::string(core::reduce_takes));
}

int int_arg(py::handle v, const char* what, const char* takes, long long lo, long long hi) {
  if (!PyLong_Check(v.ptr()) && !PyObject_HasAttrString(v.ptr(), "__index__"))
    invalid(std::string(what) + " " + shown(v) + " is a " + type_name(v) + ": give " + takes);
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || n < lo || n > hi)
    invalid(std::string(what) + " " + shown(v) + " is out of range: give " + takes);
  return static_cast<int>(n);
}

Summary to_summary(const std::string& name) {
  if (std::optional<Summary> r = core::parse_summary(name)) return *r;
  invalid("summary \"" + name + "\" is not a summary: give " + std::string(core::summary_takes) +
          " (the metric's value in the run's summary)");
}

std::string text_arg(py::handle v, const char* name) {
  if (!py::isinstance<py::str>(v))
    invalid(std::string(name) + " is a " + type_name(v) + ": give a str");
  return v.cast<std::string>();
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
      o.mode = to_enum(text_arg(v, "mode"), "mode", &core::parse_mode, core::mode_takes);
    } else if (name == "scope") {
      o.scope = to_enum(text_arg(v, "scope"), "scope", &core::parse_scope, core::scope_takes);
    } else if (name == "resume") {
      if (PyBool_Check(v.ptr()))
        o.resume = v.cast<bool>() ? Resume::allow : Resume::never;
      else
        o.resume = to_enum(text_arg(v, "resume"), "resume", &core::parse_resume, core::resume_takes);
    } else if (name == "stall_after") {
      // Seconds; 0 turns stall detection off, so not a timeout (which must be above 0).
      const double secs = number_arg(v, "stall_after");
      if (!(secs >= 0) || secs > 1e9) invalid("stall_after " + shown(v) + " is not a duration: give seconds, 0 (off) or more");
      o.stall_after = std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(secs * 1000.0)));
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

/// A (key, value) pair of config or summary fields, the value as given.
struct FlatField {
  std::string key;
  py::object value;
};

/// Adds `mapping`'s entries, a nested mapping's keys joined to its own with '.'.
void add_fields(py::handle mapping, const std::string& prefix, std::vector<FlatField>& out, int depth) {
  if (depth > 32) invalid("config nested more than 32 levels deep at \"" + prefix + "\": flatten it");
  py::object items = py::reinterpret_borrow<py::object>(mapping).attr("items")();
  for (py::handle kv : items) {
    py::tuple pair = py::reinterpret_borrow<py::tuple>(kv);
    py::handle k = pair[0];
    py::object v = pair[1];
    std::string key = py::isinstance<py::str>(k) ? k.cast<std::string>() : py::str(k).cast<std::string>();
    if (!prefix.empty()) key = prefix + "." + key;
    const bool nested = !v.is_none() && !PyBool_Check(v.ptr()) && !py::isinstance<py::str>(v) &&
                        PyObject_HasAttrString(v.ptr(), "items") && PyObject_HasAttrString(v.ptr(), "keys");
    if (nested)
      add_fields(v, key, out, depth + 1);
    else
      out.push_back({std::move(key), std::move(v)});
  }
}

std::vector<FlatField> flatten(py::handle mapping) {
  if (!PyObject_HasAttrString(mapping.ptr(), "items"))
    invalid("config and summary take a dict (a mapping of str to values), not a " + type_name(mapping));
  std::vector<FlatField> out;
  add_fields(mapping, "", out, 0);
  return out;
}

} // namespace

std::vector<Field> to_fields(py::handle mapping, std::vector<std::string>& keys) {
  std::vector<FlatField> flat = flatten(mapping);
  std::vector<Value> values;
  values.reserve(flat.size());
  keys.clear();
  for (FlatField& f : flat) {
    values.push_back(field_value(f.value));
    keys.push_back(std::move(f.key));
  }
  std::vector<Field> fields;
  fields.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) fields.push_back({keys[i], std::move(values[i])});
  return fields;
}

py::list flat_fields(py::handle mapping) {
  py::list out;
  for (FlatField& f : flatten(mapping)) out.append(py::make_tuple(py::str(f.key), std::move(f.value)));
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
