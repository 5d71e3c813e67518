// A run's events from Python (docs/PYTHON.md, "Events"): Run.alert_when,
// Run.next_event, the feed behind Run.on_event and the fetch behind
// `async for event in run.events()`. No chorus thread ever takes the GIL or
// runs Python code: the C++ Run hands each event to an Executor of this
// module's (runtime/client/events.hpp), which only queues the coroutine; a
// Python thread (on_event's) or an event loop (events()) resumes it.
#pragma once

#include <chorus/chorus.hpp>

#include <pybind11/pybind11.h>

namespace chorus::python {

namespace py = pybind11;

/// An event as the tuple chorus/_events.py's Event is made of: (kind, step,
/// rank, key, time, message, ranks, state, json); None for a step or rank of
/// -1, an empty key, and the state of a kind that has none.
py::tuple event_tuple(const Event& e);

/// The run behind a _chorus.Run object (module.cpp's).
using RunOf = Run& (*)(py::handle self);

/// Adds EventFeed and EventFetch to `m`, and to `run_class` the methods
/// _alert_when, _next_event, _event_feed and _end_event_feed.
void bind_events(py::module_& m, py::handle run_class, RunOf run_of);

} // namespace chorus::python
