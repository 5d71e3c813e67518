// A log call's values from Python (values.cpp): numbers on the host, CUDA
// arrays for the device path, and each value refused, with why.
#pragma once

#include "python/convert.hpp"
#include "python/histogram.hpp"
#include "python/media.hpp"

#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace chorus::python {

/// One log call's values: those on the host, those on a GPU, and those that
/// could be taken neither way: the first named in the ticket's error (with
/// how many), and each kept for rejected.jsonl (record()).
struct Values {
  std::vector<Metric> host;
  struct Device {
    std::string_view key;
    py::object value; // the CUDA array (kept while the call is made)
  };
  std::vector<Device> device;
  /// chorus.Histogram values: logged after the numbers, at their step.
  struct HistogramValue {
    std::string_view key;
    const Histogram* value;     // held by `keys`' objects while the call is made
    const DeviceSource* device; // or values on a GPU, counted there
  };
  std::vector<HistogramValue> histograms;
  /// chorus.Image, Text and Table values: logged last, at the numbers' step.
  struct MediaValue {
    std::string_view key;
    MediaJobMaker job; // views the object, held by `keys`
  };
  std::vector<MediaValue> media;
  /// Keys the values view: held while the GIL is released.
  std::vector<py::object> keys;
  /// The keys of nested dicts' values, joined with '/' ("train/loss").
  std::deque<std::string> joined;
  std::string refused;      // why the first refused value was refused
  Errc refused_code = Errc::invalid_argument;
  std::size_t refused_n = 0;
  /// Every refused value, with why (a message that names its key).
  struct Refused {
    Errc code;
    std::string why;
    client::RefusedValue value;
  };
  std::vector<Refused> all_refused;

  void clear();
  /// Refuses one value: `why` names the key, the cause and the fix;
  /// `key_text` is the key as text, `value_json` the value as JSON.
  void refuse(std::string why, Errc code, std::string key_text, std::string value_json);
  void refuse_device(const std::string& why);
  void refuse_host(const std::string& why);
  /// The error for what was refused (naming what was logged), or none.
  [[nodiscard]] Error refusal() const;
  /// Hands the refused values to `run` (rejected.jsonl, the run's count of
  /// refused values, one warning per key): one call per distinct reason.
  /// Takes no Python object: may be called with the GIL released.
  void record(client::RunImpl* run, std::optional<std::int64_t> step) const noexcept;
};

/// Sorts the entries of `values` (a dict, or any mapping) into `out`.
void collect_metrics(py::handle values, Values& out);

/// Puts the entries of `values` (as log takes them) into the dict `into`, a
/// nested dict's keys joined with '/' as collect_metrics joins them: a later
/// value of a key replaces an earlier one. A key that is not a str is kept
/// as it is (in a dict under its parent's key where nested), for the log
/// call to refuse as it would. What log(commit=False) keeps.
void gather(py::dict into, py::handle values);

/// The device values of a call as log_device takes them: float32 pointers,
/// and the stream they are computed on. A value that is not one float32
/// element on one device with the others is refused into `v`.
struct DeviceValues {
  std::vector<DeviceMetric> metrics;
  CudaStream stream = nullptr;
  std::vector<py::object> hold; // float32 copies made from other dtypes
};
DeviceValues device_values(Values& v);

} // namespace chorus::python
