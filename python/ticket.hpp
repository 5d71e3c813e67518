// chorus._chorus.Ticket, the ticket of every call but finish: a plain
// CPython type rather than a pybind11 class, as run.log makes one per call
// and a pybind11 instance costs several times as much to make. And the
// Notifier that completes awaited tickets in asyncio.
#pragma once

#include <chorus/chorus.hpp>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace chorus::python {

namespace py = pybind11;

/// Completions for an asyncio event loop: chorus's completion thread pushes
/// a ticket's token and writes the eventfd; the loop, watching the fd,
/// drains the tokens with the GIL held and resolves their futures. No
/// chorus thread ever takes the GIL.
class Notifier {
public:
  Notifier();
  [[nodiscard]] int fileno() const noexcept { return state_->fd; }
  /// Tokens whose tickets have completed since the last call.
  std::vector<std::uint64_t> drain();

  /// What a callback holds: shared, so that the fd stays open until the
  /// last callback has run.
  struct State {
    int fd = -1;
    std::mutex mu;
    std::vector<std::uint64_t> done;
    ~State();
    void push(std::uint64_t token);
  };
  [[nodiscard]] std::shared_ptr<State> state() const { return state_; }

private:
  std::shared_ptr<State> state_;
};

/// Adds the types Ticket and Notifier to `m`.
void bind_tickets(py::module_& m);

/// A new ticket for `p` (a strong reference), keeping `owner` (the Run)
/// alive; `local` is an error found before chorus saw the call (a value
/// that is not a number), reported beside chorus's own.
PyObject* new_ticket(PyObject* owner, Pending p, Error local);
inline py::object ticket(py::handle owner, Pending p, Error local = {}) {
  PyObject* t = new_ticket(owner.ptr(), p, std::move(local));
  if (t == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(t);
}

} // namespace chorus::python
