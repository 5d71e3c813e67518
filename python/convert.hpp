// Python objects to chorus's C++ types and back: options and arguments,
// config fields, and chorus::Error as the chorus.Error exception of its
// code. A log call's values are values.hpp's.
#pragma once

#include "runtime/client/run_impl.hpp"

#include <chorus/chorus.hpp>

#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace chorus::python {

namespace py = pybind11;

/// Raises `e` as the exception class of its code (chorus/_errors.py), with
/// its message.
[[noreturn]] void raise(const Error& e);
/// Raises chorus.InvalidArgument with `message`.
[[noreturn]] void invalid(const std::string& message);
/// An object's type name, and the text it shows in a message (its repr, cut at 60 characters).
std::string type_name(py::handle o);
std::string shown(py::handle o);
/// The exception object of `e`, or None where it is empty.
py::object error_object(const Error& e);

/// One rank as finish() and run.json give it: rank, state, last_step, host, message.
py::dict rank_dict(std::int64_t rank, std::string_view state, std::int64_t last_step, const std::string& host,
                   const std::string& message);

/// Options from chorus.init's keyword arguments; a bad one raises
/// chorus.InvalidArgument (or TypeError for an unknown name).
Options to_options(const py::kwargs& kw);
Reduce to_reduce(const std::string& name);
/// define_metric's summary=: "last", "min", "max" or "mean".
Summary to_summary(const std::string& name);
/// A whole-number argument in lo..hi; `what` names it and `takes` says what
/// it takes in the error.
int int_arg(py::handle v, const char* what, const char* takes, long long lo, long long hi);
/// A str argument; `what` names it in the error.
std::string text_arg(py::handle v, const char* what);
/// A step argument: None, or an int in 0..2^63-1.
std::optional<std::int64_t> to_step(py::handle step);
/// Seconds as a positive timeout; `what` names the argument in the error.
std::chrono::milliseconds to_ms(double seconds, const char* what);
std::string seconds_text(double seconds);
/// A path argument: str or os.PathLike.
std::string path_text(py::handle path);

/// Config or summary fields from a mapping: a nested mapping's keys are
/// joined with '.', lists and tuples become JSON text, other objects their
/// str(). `keys` holds the joined keys the fields view.
std::vector<Field> to_fields(py::handle mapping, std::vector<std::string>& keys);
/// The same fields as (key, value) pairs, each value the object given: what
/// run.config reads back (python/chorus/_fields.py).
py::list flat_fields(py::handle mapping);

/// Runs `body`, turning a C++ or pybind11 exception into the Python error
/// it stands for (what a plain CPython function returns as nullptr).
template <class F>
PyObject* guarded(F&& body) noexcept {
  try {
    return body();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "an unknown C++ exception");
  }
  return nullptr;
}

/// Waits with the GIL released, in slices, so that Ctrl-C (a pending signal)
/// interrupts the wait with KeyboardInterrupt. False where `timeout` ran out first.
bool wait_interruptibly(const std::function<bool()>& ready,
                        const std::function<void(std::chrono::milliseconds)>& wait_some,
                        std::optional<double> timeout);

} // namespace chorus::python
