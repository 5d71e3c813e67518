#include "python/ticket.hpp"

#include "python/convert.hpp"

#include <pybind11/stl.h>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

namespace chorus::python {

Notifier::Notifier() : state_(std::make_shared<State>()) {
  state_->fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (state_->fd < 0) throw std::runtime_error("eventfd failed: " + std::string(std::strerror(errno)));
}

std::vector<std::uint64_t> Notifier::drain() {
  std::uint64_t count = 0;
  while (::read(state_->fd, &count, sizeof count) < 0 && errno == EINTR) {
  }
  std::lock_guard lock(state_->mu);
  return std::exchange(state_->done, {});
}

Notifier::State::~State() {
  if (fd >= 0) ::close(fd);
}

void Notifier::State::push(std::uint64_t token) {
  {
    std::lock_guard lock(mu);
    done.push_back(token);
  }
  const std::uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

namespace {

struct TicketObject {
  PyObject_HEAD
  Pending pending;  // trivially destructible
  PyObject* owner;  // the Run, a strong reference
  Error* local;     // owned; null in the common case
};

PyTypeObject* ticket_type = nullptr;

TicketObject* as_ticket(PyObject* self) { return reinterpret_cast<TicketObject*>(self); }

/// The call's error: chorus's, and the conversion's beside it.
Error result_of(const TicketObject& t) {
  Error e = t.pending.ready() ? t.pending.wait() : Error(Errc::timeout, "the ticket is still pending");
  if (t.local == nullptr) return e;
  if (!e) return *t.local;
  return Error(e.code(), e.message() + "; and " + t.local->message());
}

void ticket_dealloc(PyObject* self) {
  TicketObject* t = as_ticket(self);
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(t->owner);
  delete t->local;
  PyObject_Free(self);
  Py_DECREF(type); // a heap type's instances hold their type
}

PyObject* ticket_ready(PyObject* self, void*) { return PyBool_FromLong(as_ticket(self)->pending.ready() ? 1 : 0); }

PyObject* ticket_wait(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&]() -> PyObject* {
    PyObject* timeout_arg = nargs > 0 ? args[0] : nullptr;
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; ++i) {
      if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), "timeout") != 0 || timeout_arg) {
        PyErr_SetString(PyExc_TypeError, "wait() takes one argument, timeout (seconds, or None)");
        return nullptr;
      }
      timeout_arg = args[nargs + i];
    }
    if (nargs > 1) {
      PyErr_SetString(PyExc_TypeError, "wait() takes one argument, timeout (seconds, or None)");
      return nullptr;
    }
    std::optional<double> timeout;
    if (timeout_arg != nullptr && timeout_arg != Py_None) {
      timeout = PyFloat_AsDouble(timeout_arg);
      if (*timeout == -1.0 && PyErr_Occurred()) return nullptr;
    }
    const TicketObject* t = as_ticket(self);
    const bool done = wait_interruptibly([&] { return t->pending.ready(); },
                                         [&](std::chrono::milliseconds d) { (void)t->pending.wait_for(d); }, timeout);
    if (!done)
      raise(Error(Errc::timeout, "the ticket is still pending after " + seconds_text(*timeout) +
                                     " s: wait longer, or without a timeout"));
    if (Error e = result_of(*t)) raise(e);
    Py_RETURN_NONE;
  });
}

PyObject* ticket_error(PyObject* self, PyObject*) {
  return guarded([&]() -> PyObject* {
    const TicketObject* t = as_ticket(self);
    if (!t->pending.ready()) Py_RETURN_NONE;
    return error_object(result_of(*t)).release().ptr();
  });
}

PyObject* ticket_notify(PyObject* self, PyObject* args) {
  return guarded([&]() -> PyObject* {
    PyObject* notifier = nullptr;
    unsigned long long token = 0;
    if (!PyArg_ParseTuple(args, "OK", &notifier, &token)) return nullptr;
    std::shared_ptr<Notifier::State> s = py::handle(notifier).cast<const Notifier&>().state();
    as_ticket(self)->pending.on_done([s, token](const Error&) { s->push(token); });
    Py_RETURN_NONE;
  });
}

PyMethodDef ticket_methods[] = {
    {"wait", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&ticket_wait)), METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None): blocks until what the call names is durably committed on the run host; raises "
     "its chorus.Error (a subclass naming the cause) if it was refused, chorus.Timeout if `timeout` seconds "
     "pass first. Ctrl-C interrupts it."},
    {"error", &ticket_error, METH_NOARGS, "The exception the call ended with, or None (also while pending)."},
    {"_notify", &ticket_notify, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef ticket_getset[] = {
    {"ready", &ticket_ready, nullptr, "True once complete (never blocks).", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot ticket_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(&ticket_dealloc)},
    {Py_tp_methods, ticket_methods},
    {Py_tp_getset, ticket_getset},
    {Py_tp_doc, const_cast<char*>("A call's ticket: drop it, .wait() on it, or await it.")},
    {0, nullptr}};

PyType_Spec ticket_spec = {"chorus._chorus.Ticket", sizeof(TicketObject), 0, Py_TPFLAGS_DEFAULT, ticket_slots};

} // namespace

PyObject* new_ticket(PyObject* owner, Pending p, Error local) {
  TicketObject* t = PyObject_New(TicketObject, ticket_type);
  if (t == nullptr) return nullptr;
  t->pending = p;
  Py_XINCREF(owner);
  t->owner = owner;
  t->local = local ? new Error(std::move(local)) : nullptr;
  return reinterpret_cast<PyObject*>(t);
}

void bind_tickets(py::module_& m) {
  // A heap type, so that the Python half can give it __await__.
  PyObject* type = PyType_FromSpec(&ticket_spec);
  if (type == nullptr) throw py::error_already_set();
  ticket_type = reinterpret_cast<PyTypeObject*>(type); // held by the module from here on
  m.add_object("Ticket", py::reinterpret_borrow<py::object>(type));
  Py_DECREF(type);
  py::class_<Notifier>(m, "Notifier")
      .def(py::init<>())
      .def("fileno", &Notifier::fileno)
      .def("drain", &Notifier::drain);
}

} // namespace chorus::python
