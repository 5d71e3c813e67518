// Python objects to chorus's C++ types and back: options, metric values
// (numbers, NumPy scalars, tensors on the host or on a GPU), config fields,
// and chorus::Error as the chorus.Error exception of its code.
#pragma once

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
/// The exception object of `e`, or None where it is empty.
py::object error_object(const Error& e);

/// One rank as finish() and run.json give it: rank, state, last_step, host, message.
py::dict rank_dict(std::int64_t rank, std::string_view state, std::int64_t last_step, const std::string& host,
                   const std::string& message);

/// Options from chorus.init's keyword arguments; a bad one raises
/// chorus.InvalidArgument (or TypeError for an unknown name).
Options to_options(const py::kwargs& kw);
Reduce to_reduce(const std::string& name);
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

/// One log call's values: those on the host, those on a GPU, and the first
/// that could be taken neither way (with how many).
struct Values {
  std::vector<Metric> host;
  struct Device {
    std::string_view key;
    py::object value; // the CUDA array (kept while the call is made)
  };
  std::vector<Device> device;
  /// Keys the values view: held while the GIL is released.
  std::vector<py::object> keys;
  std::string refused;      // why the first refused value was refused
  Errc refused_code = Errc::invalid_argument;
  std::size_t refused_n = 0;

  void clear();
  void refuse(std::string why, Errc code = Errc::invalid_argument);
  void refuse_device(const std::string& why);
  void refuse_host(const std::string& why);
  /// The error for what was refused (naming what was logged), or none.
  [[nodiscard]] Error refusal() const;
};

/// Sorts the entries of `values` (a dict, or any mapping) into `out`.
void collect_metrics(py::handle values, Values& out);

/// The device values of a call as log_device takes them: float32 pointers,
/// and the stream they are computed on. A value that is not one float32
/// element on one device with the others is refused into `v`.
struct DeviceValues {
  std::vector<DeviceMetric> metrics;
  CudaStream stream = nullptr;
  std::vector<py::object> hold; // float32 copies made from other dtypes
};
DeviceValues device_values(Values& v);

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
