"""A run's events in Python: chorus.Event, Run.alert_when's rule,
Run.on_event's thread and ``async for event in run.events()``.

No chorus thread ever runs Python code or takes the GIL. The C++ Run posts
each event to an executor of the native module's (python/events.cpp) that
only queues it:

- on_event: the run's callbacks are called, in the order the events came, on
  one Python daemon thread per run, ``chorus-events <run id>``, which waits
  for the next event with the GIL released. A callback registered while an
  asyncio loop runs in the registering thread is called on that loop instead
  (``loop.call_soon_threadsafe``). The thread ends after the run's last
  event (run_finished), once the run's finish() has completed, when the
  run's handle is let go of, and at the interpreter's exit;
- events(): the run's next_event, resumed on the awaiting coroutine's loop
  through an eventfd the loop watches, as awaited tickets are (_aio.py).
"""

import asyncio
import collections
import dataclasses
import datetime
import inspect
import json as _json
import math
import numbers
import sys
import threading
import traceback
import weakref
from typing import List, Optional

from . import _chorus
from ._errors import InvalidArgument


@dataclasses.dataclass(frozen=True, repr=False)
class Event:
    """One event of a run, as the run host told it (a line of its events.jsonl).

    ``kind``: "stalled", "resumed", "nonfinite", "rank_failed", "rank_killed",
    "rank_lost", "barrier_timeout", "run_finished", "threshold" or
    "straggler"; ``step``, ``rank``, ``key``: what it concerns (None: none,
    or the run as a whole); ``time``: when the run host saw it, in unix
    seconds; ``message``: one sentence that says what happened and what to
    do; ``ranks``: the ranks it names (those whose values were not finite,
    those missing at a barrier); ``state``: how the run (run_finished) or
    the rank (rank_failed, rank_killed, rank_lost) ended, else None;
    ``json``: the whole line as a dict, with the kind's details (``host``,
    ``pid``, ``value``, ``rule``, ``limit``, ``barrier``, ``seconds``, ...).
    """

    kind: str
    step: Optional[int]
    rank: Optional[int]
    key: Optional[str]
    time: float
    message: str
    ranks: List[int]
    state: Optional[str]
    json: dict

    def __repr__(self):
        parts = [f"{self.kind!r}"]
        for name in ("step", "rank", "key", "state"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value!r}")
        if self.ranks:
            parts.append(f"ranks={self.ranks!r}")
        parts.append(f"message={self.message!r}")
        return f"chorus.Event({', '.join(parts)})"


def event(native):
    """The Event of the native module's tuple (python/events.cpp's event_tuple); None for None."""
    if native is None:
        return None
    kind, step, rank, key, time, message, ranks, state, line = native
    try:
        parsed = _json.loads(line) if line else {}
    except ValueError:
        parsed = {}
    return Event(kind, step, rank, key, time, message, list(ranks), state, parsed if isinstance(parsed, dict) else {})


# ---------------------------------------------------------------------------
# alert_when

_RULES = {"above": 1, "below": 2, "no_change": 3}


def alert_rule(key, above, below, no_change):
    """alert_when's keyword arguments as the native rule: (kind, limit)."""
    given = [(n, v) for n, v in (("above", above), ("below", below), ("no_change", no_change)) if v is not None]
    if len(given) != 1:
        got = ", ".join(f"{n}=" for n, _ in given) or "none of them"
        raise TypeError(f"alert_when({key!r}, ...) takes exactly one of above=x, below=x or no_change=seconds; "
                        f"got {got}")
    name, value = given[0]
    if name == "no_change" and isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        takes = "seconds (a number, or a datetime.timedelta)" if name == "no_change" else "a number"
        raise TypeError(f"alert_when({key!r}, {name}=...) takes {takes}, not {type(value).__name__} ({value!r})")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgument(f"alert_when({key!r}, {name}={value}): give a finite number")
    if name == "no_change" and value <= 0:
        raise InvalidArgument(f"alert_when({key!r}, no_change={value}): give a time above 0 seconds")
    return _RULES[name], value


# ---------------------------------------------------------------------------
# on_event

def _name(fn):
    return getattr(fn, "__qualname__", None) or repr(fn)


def _report(fn, ev):
    """Prints the exception being handled, raised by `fn` on `ev`, as threading's excepthook does.

    Not sys.excepthook: chorus's own (python/chorus/_endings.py) would end the runs."""
    err = sys.stderr
    if err is None:
        return
    try:
        print(f"chorus: the on_event callback {_name(fn)} raised on a {ev.kind} event (later events are "
              f"still delivered):", file=err)
        traceback.print_exc(file=err)
        err.flush()
    except Exception:  # noqa: BLE001  (a closed stderr: nothing to say it on)
        pass


async def _awaited(fn, ev, awaitable):
    try:
        await awaitable
    except Exception:  # noqa: BLE001
        _report(fn, ev)


def _call_on_loop(fn, ev, loop):
    try:
        result = fn(ev)
        if inspect.isawaitable(result):
            loop.create_task(_awaited(fn, ev, result))
    except Exception:  # noqa: BLE001  (the loop goes on; so do later events)
        _report(fn, ev)


def _call(fn, ev):
    try:
        fn(ev)
    except BaseException:  # noqa: BLE001,B036  (a SystemExit would end the thread: later events go on)
        _report(fn, ev)


class _Dispatch:
    """One run's on_event callbacks and the thread that calls them."""

    def __init__(self, run):
        self._feed = run._event_feed()
        self._lock = threading.Lock()
        self._callbacks = []  # (fn, loop or None)
        self.thread = threading.Thread(target=self._deliver, name=f"chorus-events {run.id or 'inactive'}",
                                       daemon=True)

    def add(self, fn, loop):
        with self._lock:
            self._callbacks.append((fn, loop))

    @property
    def ended(self):
        return self.thread.ident is not None and not self.thread.is_alive()

    def end_after_finish(self, run):
        run._end_event_feed(self._feed)

    def close(self):
        self._feed.close()

    def _deliver(self):
        try:
            while True:
                native = self._feed.take()
                if native is None:
                    return
                ev = event(native)
                with self._lock:
                    callbacks = list(self._callbacks)
                for fn, loop in callbacks:
                    if loop is None:
                        _call(fn, ev)
                        continue
                    try:
                        loop.call_soon_threadsafe(_call_on_loop, fn, ev, loop)
                    except RuntimeError:  # the loop is closed: nothing more goes to it
                        with self._lock:
                            self._callbacks = [c for c in self._callbacks if c[1] is not loop]
                if ev.kind == "run_finished":
                    return
        finally:
            self._feed.close()


_dispatches = weakref.WeakSet()
_dispatch_lock = threading.Lock()


def subscribe(run, fn):
    """Run.on_event(fn): `fn` is called with each event of `run` from now on."""
    if not callable(fn):
        raise TypeError(f"on_event takes a callable (it is called with each chorus.Event), not "
                        f"{type(fn).__name__}")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    with _dispatch_lock:
        d = run.__dict__.get("_chorus_dispatch")
        start = d is None or d.ended
        if start:
            d = _Dispatch(run)
            run._chorus_dispatch = d
            _dispatches.add(d)
        d.add(fn, loop)
        if start:
            d.thread.start()
    return fn


def finishing(run):
    """Run.finish() was called: the run's on_event thread ends once the finish completes."""
    d = run.__dict__.get("_chorus_dispatch")
    if d is not None:
        d.end_after_finish(run)


def close_all():
    """At the interpreter's exit: every on_event thread ends (a callback running is let finish for at
    most a second), so that none waits in native code while the interpreter finalizes."""
    ds = list(_dispatches)
    for d in ds:
        d.close()
    for d in ds:
        if d.thread.ident is not None and d.thread is not threading.current_thread():
            d.thread.join(1.0)


# ---------------------------------------------------------------------------
# events() and next_event()

class _Fetcher:
    """One run's next_event on one event loop: at most one native request in flight; an event
    that comes once its awaiter went away (cancelled) waits there for the next."""

    def __init__(self, run):
        self._run = run  # held while a request may be in flight: its Run outlives it
        self._native = _chorus.EventFetch()
        self._waiters = collections.deque()
        self._ended = False
        self._watching = False

    def next(self):
        """A future of the running loop: the next event, or None at the end."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self._ended:
            fut.set_result(None)
        else:
            self._waiters.append(fut)
            self._settle()
            if not fut.done() and not self._watching:
                loop.add_reader(self._native.fileno(), self._drain)
                self._watching = True
        return fut

    def _drain(self):
        self._native.drain()
        self._settle()

    def _settle(self):
        while True:
            while self._waiters and self._waiters[0].done():  # cancelled
                self._waiters.popleft()
            if not self._waiters:
                return
            self._native.start(self._run)
            got, native = self._native.take()
            if not got:
                return
            ev = event(native)
            if ev is None:
                self._end()
                while self._waiters:
                    w = self._waiters.popleft()
                    if not w.done():
                        w.set_result(None)
                return
            self._waiters.popleft().set_result(ev)

    def _end(self):
        self._ended = True
        if self._watching:
            self._watching = False
            try:
                asyncio.get_running_loop().remove_reader(self._native.fileno())
            except (RuntimeError, ValueError):  # the loop is closing
                pass


def _fetcher(run):
    loop = asyncio.get_running_loop()
    fetchers = run.__dict__.get("_chorus_fetchers")
    if fetchers is None:
        fetchers = run._chorus_fetchers = weakref.WeakKeyDictionary()
    f = fetchers.get(loop)
    if f is None:
        f = fetchers[loop] = _Fetcher(run)
    return f


class Events:
    """``async for event in run.events()``: the run's events in order, ending after its last
    (run_finished), or once this rank's part of the run is over. Waiting never blocks the loop."""

    def __init__(self, run):
        self._run = run
        self._done = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        ev = await _fetcher(self._run).next()
        if ev is None:
            self._done = True
            raise StopAsyncIteration
        if ev.kind == "run_finished":
            self._done = True
        return ev

    def __repr__(self):
        return f"<chorus.Run.events() of {self._run!r}>"
