// chorus._chorus: the Python module's native half (pybind11), a thin layer
// over the C++ API of <chorus/chorus.hpp> — the same Run, the same actors,
// the same run directory. The Python half (python/chorus/) adds the idiom:
// the context manager, asyncio, pandas. docs/PYTHON.md describes both.
//
// The GIL is released around every call into chorus, so other Python threads
// run meanwhile; no chorus thread ever takes it: a ticket awaited in asyncio
// is completed through a Notifier's eventfd, which the event loop watches.
#include "python/convert.hpp"
#include "python/events.hpp"
#include "python/histogram.hpp"
#include "python/media.hpp"
#include "python/values.hpp"
#include "python/reader.hpp"
#include "python/ticket.hpp"

#include "runtime/client/endings.hpp"
#include "runtime/client/run_impl.hpp"

#include <chorus/chorus.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <climits>
#include <memory>
#include <optional>
#include <string>
#include <thread>

namespace py = pybind11;

namespace chorus::python {
namespace {

struct FinishTicket {
  FinishPending pending;
  py::object owner;
};

// ---------------------------------------------------------------------------
// The run

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

struct PyRun {
  Run run;
  /// What log(commit=False) keeps for the next committing call (gather()):
  /// flattened keys; `deferred` while it holds any, so that run.log's plain
  /// call costs one branch for it.
  py::dict kept;
  bool deferred = false;
  ~PyRun() {
    // The interpreter's finalization lets go of every object, the run too,
    // before the process's exit status is known: the run stays live until
    // the exit (endings.hpp), which ends it as that status says. Finishing
    // it here would record `finished` for a sys.exit(3).
    if (finalizing()) {
      client::endings::keep_until_exit(std::move(run));
      return;
    }
    // Run's destructor finishes a run left unfinished (bounded by
    // finish_timeout): other threads go on meanwhile.
    if (Py_IsInitialized() && PyGILState_Check() != 0) {
      py::gil_scoped_release unlocked;
      run = Run();
    }
  }
};

struct PyWriter {
  Writer writer;
  py::object owner; // the Run
};

/// A call's converted values, one set per thread, emptied (with the GIL
/// held) when the call returns or throws: a thread's values never outlive
/// the call, so none is released at thread exit without the GIL.
struct CallValues {
  Values& v;
  CallValues() : v(values()) { v.clear(); }
  ~CallValues() { v.clear(); }
  static Values& values() {
    thread_local Values v;
    return v;
  }
};

/// Makes a chorus call with the GIL released, and returns its ticket, held
/// by `owner` (the Run); `local` is what the conversion refused.
template <class Call>
py::object released(py::handle owner, Call&& call, Error local = {}) {
  Pending p;
  {
    py::gil_scoped_release unlocked;
    p = call();
  }
  return ticket(owner, p, std::move(local));
}

py::object log_values(py::handle self, Run& run, Writer* writer, py::handle values, py::handle step) {
  CallValues call;
  Values& v = call.v;
  LogOptions opts;
  opts.step = to_step(step);
  collect_metrics(values, v);
  if (writer != nullptr) v.refuse_device("a Writer takes host values only; log CUDA tensors with run.log");
  const DeviceValues d = device_values(v);
  // Device values, and the host values beside them at the same step, go in
  // one log_device call (RunImpl's: the public one takes device values only).
  client::RunImpl* impl = d.metrics.empty() ? nullptr : client::live(client::RunAccess::impl(run));
  // What the conversion refused goes to rejected.jsonl, waited on or not.
  client::RunImpl* record = v.refused_n == 0 ? nullptr : client::live(client::RunAccess::impl(run));
  return released(
      self,
      [&]() -> Pending {
        Pending p;
        bool logged = false; // a call went into the ring: histograms take its step
        if (impl != nullptr) {
          p = impl->log_device(d.metrics, d.stream, opts, std::nullopt, v.host);
          logged = true;
        } else if (!v.host.empty() || (v.refused_n == 0 && v.histograms.empty() && v.media.empty())) {
          // (else every number was refused, or the call holds none)
          p = writer != nullptr ? writer->log(std::span<const Metric>(v.host), opts)
                                : run.log(std::span<const Metric>(v.host), opts);
          logged = !v.host.empty();
        }
        if (!v.histograms.empty() || !v.media.empty()) {
          const auto [into, stream] = writer != nullptr ? client::RunAccess::writer(*writer)
                                                        : std::pair(client::live(client::RunAccess::impl(run)), 0u);
          for (const Values::HistogramValue& h : v.histograms) {
            if (into == nullptr) break; // an inactive run: nothing is logged
            if (h.device != nullptr) { // counted on the GPU (a Writer's were refused)
              const DeviceSource& d = *h.device;
              p = into->log_histogram_device(stream, false, h.key, d.values, d.n, d.dtype, d.stream, opts, logged);
              logged = true;
              continue;
            }
            std::unique_ptr<Histogram> copy;
            try {
              copy = std::make_unique<Histogram>(*h.value);
            } catch (...) {
            }
            p = into->log_histogram(stream, writer != nullptr, h.key, std::move(copy), opts, logged);
            logged = true;
          }
          for (const Values::MediaValue& m : v.media) {
            if (into == nullptr) break;
            p = into->log_media(stream, writer != nullptr, m.key, m.job(), opts, logged);
            logged = true;
          }
        }
        v.record(record, opts.step);
        return p;
      },
      v.refusal());
}

/// The arguments of log(values, step=None, commit=None) from a vectorcall
/// (`commit` null: Writer.log, which takes none; left null where not given):
/// false (with TypeError set) where they do not fit.
bool log_args(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject*& values, PyObject*& step,
              PyObject** commit) {
  const Py_ssize_t most = commit != nullptr ? 3 : 2;
  values = nargs > 0 ? args[0] : nullptr;
  step = nargs > 1 ? args[1] : Py_None;
  if (commit != nullptr && nargs > 2) *commit = args[2];
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  bool ok = nargs <= most;
  for (Py_ssize_t i = 0; i < nkw && ok; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    if (PyUnicode_CompareWithASCIIString(name, "step") == 0 && nargs < 2)
      step = args[nargs + i];
    else if (PyUnicode_CompareWithASCIIString(name, "values") == 0 && nargs < 1)
      values = args[nargs + i];
    else if (commit != nullptr && PyUnicode_CompareWithASCIIString(name, "commit") == 0 && nargs < 3)
      *commit = args[nargs + i];
    else
      ok = false;
  }
  if (ok && values != nullptr) return true;
  PyErr_SetString(PyExc_TypeError,
                  commit != nullptr ? "log(values, step=None, commit=None): values is a dict of key -> number, step "
                                      "an int or None, commit a bool or None"
                                    : "log(values, step=None): values is a dict of key -> number, step an int or None");
  return false;
}

/// Logs what log(commit=False) kept, with `values` (or alone: null), at the
/// rank's next step; None where nothing was kept and no values are given.
py::object commit_kept(py::handle self, PyRun& r, py::handle values) {
  py::dict all;
  std::swap(all, r.kept); // another thread's commit=False from here on is for the next call
  r.deferred = false;
  if (values) gather(all, values);
  else if (PyDict_GET_SIZE(all.ptr()) == 0) return py::none();
  return log_values(self, r.run, nullptr, all, py::none());
}

/// A run.log call (step None) that commit=False or kept values concern. Null
/// where it is an ordinary call after all.
py::object deferred_log(py::handle self, PyRun& r, PyObject* values, PyObject* commit) {
  bool committing = true;
  if (commit != nullptr && commit != Py_None) {
    const int t = PyObject_IsTrue(commit);
    if (t < 0) throw py::error_already_set();
    committing = t == 1;
  }
  if (!committing) {
    // Kept, and nothing sent: there is no ticket (W&B's log returns None too).
    gather(r.kept, values);
    r.deferred = PyDict_GET_SIZE(r.kept.ptr()) != 0;
    return py::none();
  }
  if (r.deferred) return commit_kept(self, r, values);
  return py::object();
}

/// run.log and Writer.log as plain CPython methods (vectorcall): the hot
/// path, without pybind11's argument dispatch. commit= and the values that
/// log(commit=False) keeps waiting take a branch off it.
PyObject* run_log(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&]() -> PyObject* {
    PyObject *values, *step, *commit = nullptr;
    if (!log_args(args, nargs, kwnames, values, step, &commit)) return nullptr;
    PyRun& r = py::handle(self).cast<PyRun&>();
    if (step == Py_None && (commit != nullptr || r.deferred)) {
      if (py::object done = deferred_log(self, r, values, commit)) return done.release().ptr();
    }
    return log_values(self, r.run, nullptr, values, step).release().ptr();
  });
}

PyObject* writer_log(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&]() -> PyObject* {
    PyObject *values, *step;
    if (!log_args(args, nargs, kwnames, values, step, nullptr)) return nullptr;
    PyWriter& w = py::handle(self).cast<PyWriter&>();
    return log_values(w.owner, w.owner.cast<PyRun&>().run, &w.writer, values, step).release().ptr();
  });
}

/// Puts `fn` on `cls` as its method `name`.
void add_fast_method(py::handle cls, PyMethodDef& def) {
  py::object descr =
      py::reinterpret_steal<py::object>(PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &def));
  if (!descr) throw py::error_already_set();
  py::setattr(cls, def.ml_name, descr);
}

PyMethodDef run_log_def = {
    "log", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&run_log)), METH_FASTCALL | METH_KEYWORDS,
    "log(values, step=None, commit=None): logs a dict of key -> number (int, float, bool, NumPy scalar or 0-d "
    "array, one-element tensor; a CUDA tensor through the device path; a nested dict's keys joined with '/') at "
    "`step`, or at the rank's next step. Returns a Ticket at once. commit=False (without step) keeps the values for "
    "the next call without it, and returns None."};
PyMethodDef writer_log_def = {
    "log", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&writer_log)), METH_FASTCALL | METH_KEYWORDS,
    "log(values, step=None): as Run.log, into this writer's own ordered stream."};

py::object reduce_values(py::handle self, Run& run, py::handle values, const std::string& op, py::handle step) {
  CallValues call;
  Values& v = call.v;
  LogOptions opts;
  opts.step = to_step(step);
  const Reduce reduce = to_reduce(op);
  collect_metrics(values, v);
  if (!v.host.empty()) {
    v.refuse_host("reduce_device takes CUDA tensors (float32, one element) only; log host values with run.log");
    v.host.clear();
  }
  const DeviceValues d = device_values(v);
  client::RunImpl* record = v.refused_n == 0 ? nullptr : client::live(client::RunAccess::impl(run));
  return released(
      self,
      [&]() -> Pending {
        Pending p = d.metrics.empty() ? Pending{} : run.reduce_device(d.metrics, reduce, d.stream, opts);
        v.record(record, opts.step);
        return p;
      },
      v.refusal());
}

py::object fields_call(py::handle self, Run& run, py::handle fields, bool summary) {
  std::vector<std::string> keys;
  const std::vector<Field> f = to_fields(fields, keys);
  return released(self, [&] { return summary ? run.summary(f) : run.config(f); });
}

py::dict topology_dict(const Topology& t) {
  py::dict d;
  d["rank"] = t.rank;
  d["local_rank"] = t.local_rank;
  d["world_size"] = t.world_size;
  d["local_world_size"] = t.local_world_size;
  d["node_rank"] = t.node_rank;
  d["num_nodes"] = t.num_nodes;
  d["master_addr"] = t.master_addr;
  d["master_port"] = t.master_port;
  d["launcher"] = t.launcher;
  d["job_id"] = t.job_id;
  d["job_step"] = t.job_step;
  return d;
}

py::dict finish_dict(const FinishResult& r) {
  py::dict d;
  d["state"] = std::string(to_string(r.state));
  d["run_id"] = r.run_id;
  d["run_dir"] = r.run_dir;
  d["rows"] = r.rows;
  d["dropped"] = r.dropped;
  d["rejected"] = r.rejected;
  py::list ranks;
  for (const RankResult& k : r.ranks) ranks.append(rank_dict(k.rank, to_string(k.state), k.last_step, k.host, k.message));
  d["ranks"] = ranks;
  d["error"] = error_object(r.error);
  d["upload_error"] = error_object(r.upload_error);
  d["upload_left"] = r.upload_left;
  return d;
}

} // namespace
} // namespace chorus::python

PYBIND11_MODULE(_chorus, m) {
  using namespace chorus;
  using namespace chorus::python;
  m.doc() = "chorus's native half: the C++ runtime under the `chorus` package";

  bind_tickets(m);
  bind_histogram(m);
  bind_media(m);

  py::class_<FinishTicket>(m, "FinishTicket", "What finish() returns: .wait() for its result, or await it.")
      .def_property_readonly("ready", [](const FinishTicket& t) { return t.pending.ready(); })
      .def(
          "_result",
          [](const FinishTicket& t, std::optional<double> timeout) -> py::object {
            const bool done = wait_interruptibly(
                [&] { return t.pending.ready(); },
                [&](std::chrono::milliseconds d) {
                  const auto until = std::chrono::steady_clock::now() + d;
                  while (!t.pending.ready() && std::chrono::steady_clock::now() < until)
                    std::this_thread::sleep_for(std::chrono::milliseconds(5));
                },
                timeout);
            if (!done) return py::none();
            FinishResult r;
            {
              py::gil_scoped_release unlocked;
              r = t.pending.wait();
            }
            return finish_dict(r);
          },
          py::arg("timeout") = py::none())
      .def("_notify", [](const FinishTicket& t, const Notifier& n, std::uint64_t token) {
        t.pending.on_done([s = n.state(), token](const FinishResult&) { s->push(token); });
      });

  py::class_<PyRun> run_class(m, "Run", py::dynamic_attr());
  add_fast_method(run_class, run_log_def);
  run_class
      .def(py::init([](py::kwargs kw) {
             Options opts = to_options(kw);
             auto r = std::make_unique<PyRun>();
             Error error;
             {
               py::gil_scoped_release unlocked;
               r->run = init(opts, error);
             }
             if (error) raise(error);
             return r;
           }),
           "Starts (or joins) the run this process logs into; see chorus.init.")
      .def(
          "reduce_device",
          [](py::handle self, py::handle values, const std::string& op, py::handle step) {
            return reduce_values(self, self.cast<PyRun&>().run, values, op, step);
          },
          py::arg("values"), py::arg("op") = "mean", py::arg("step") = py::none())
      .def(
          "define_metric",
          [](py::handle self, const std::string& name, py::handle reduce, py::handle step_metric, py::handle summary) {
            // What is left None keeps what an earlier call declared.
            MetricOptions o;
            if (!reduce.is_none()) o.reduce = to_reduce(text_arg(reduce, "reduce"));
            if (!summary.is_none()) o.summary = to_summary(text_arg(summary, "summary"));
            const std::string x = step_metric.is_none() ? std::string() : text_arg(step_metric, "step_metric");
            o.step_metric = x;
            Run& run = self.cast<PyRun&>().run;
            return released(self, [&] { return run.define_metric(name, o); });
          },
          py::arg("name"), py::arg("reduce") = py::none(), py::arg("step_metric") = py::none(),
          py::arg("summary") = py::none())
      .def(
          "config", [](py::handle self, py::handle fields) { return fields_call(self, self.cast<PyRun&>().run, fields, false); },
          py::arg("values"))
      .def(
          "summary", [](py::handle self, py::handle fields) { return fields_call(self, self.cast<PyRun&>().run, fields, true); },
          py::arg("values"))
      .def(
          "barrier",
          [](py::handle self, std::string_view name, std::optional<double> timeout) {
            const std::chrono::milliseconds ms = timeout ? to_ms(*timeout, "barrier's timeout") : std::chrono::milliseconds{};
            Run& run = self.cast<PyRun&>().run;
            return released(self, [&] { return run.barrier(name, ms); });
          },
          py::arg("name"), py::arg("timeout") = py::none())
      .def(
          "log_artifact",
          [](py::handle self, std::string_view name, py::handle path, std::string_view type) {
            const std::string p_text = path_text(path);
            Run& run = self.cast<PyRun&>().run;
            return released(self, [&] { return run.log_artifact(name, p_text, type); });
          },
          py::arg("name"), py::arg("path"), py::arg("type") = "file")
      .def(
          "finish",
          [](py::handle self, py::handle exit_code, py::handle signal, py::handle message) {
            // W&B's finish(exit_code=None) is a finish; a signal wins over the code (chorus.hpp).
            const int code = exit_code.is_none()
                                 ? 0
                                 : int_arg(exit_code, "exit_code", "a whole number (0: finished)", INT_MIN, INT_MAX);
            const int sig =
                signal.is_none()
                    ? 0
                    : int_arg(signal, "signal", "a signal's number, 1..64 (signal.SIGTERM, say), or None", 0, 64);
            const std::string text = message.is_none() ? std::string() : py::str(message).cast<std::string>();
            Run& run = self.cast<PyRun&>().run; // with the GIL held
            FinishPending p;
            {
              py::gil_scoped_release unlocked;
              p = run.finish({.exit_code = code, .signal = sig, .message = text});
            }
            return FinishTicket{p, py::reinterpret_borrow<py::object>(self)};
          },
          py::arg("exit_code") = 0, py::kw_only(), py::arg("signal") = py::none(), py::arg("message") = py::none())
      .def(
          "_commit_kept", [](py::handle self) { return commit_kept(self, self.cast<PyRun&>(), py::handle()); },
          "Logs what log(commit=False) kept, at the rank's next step: its Ticket, or None where nothing was kept.")
      .def("__bool__", [](const PyRun& r) { return static_cast<bool>(r.run); })
      .def_property_readonly("id", [](const PyRun& r) { return std::string(r.run.id()); })
      .def_property_readonly("dir", [](const PyRun& r) { return std::string(r.run.dir()); })
      .def_property_readonly("is_host", [](const PyRun& r) { return r.run.is_host(); })
      .def_property_readonly("dropped", [](const PyRun& r) { return r.run.dropped(); })
      .def_property_readonly("topology", [](const PyRun& r) { return topology_dict(r.run.topology()); })
      .def("_writer", [](py::handle self) {
        auto w = std::make_unique<PyWriter>();
        w->writer = self.cast<PyRun&>().run.writer();
        w->owner = py::reinterpret_borrow<py::object>(self);
        return w;
      });

  py::class_<PyWriter> writer_class(m, "Writer", "One producer's own ordered stream into the run (Run.writer()).");
  add_fast_method(writer_class, writer_log_def);
  writer_class
      .def("close",
           [](PyWriter& w) { return released(w.owner, [&] { return w.writer.close(); }); })
      .def("__bool__", [](const PyWriter& w) { return static_cast<bool>(w.writer); });

  bind_events(m, run_class, [](py::handle self) -> Run& { return self.cast<PyRun&>().run; });

  m.def("_flat_fields", &flat_fields, py::arg("mapping"),
        "config's fields as (key, value) pairs: a nested dict's keys joined with '.', each value as given.");

  m.def(
      "detect_topology",
      []() {
        Error e;
        Topology t = detect_topology(e);
        if (e) raise(e);
        return topology_dict(t);
      },
      "Where this process sits in the job, read from the launcher's environment.");

  bind_reader(m);
}
