"""chorus: experiment tracking for distributed training, from Python.

The same C++ runtime as <chorus/chorus.hpp>, through a thin native module:
every rank of a job (torchrun, Slurm, Open MPI, MPICH, or ``chorus launch``)
logs into one shared run, or a run each, with cross-rank reductions,
barriers and a finish that never hangs. Python and C++ ranks can share a run.

    import chorus
    with chorus.init(project="mnist", mode="shared") as run:
        run.define_metric("loss", reduce="mean")
        for step, batch in enumerate(data):
            ...
            run.log({"loss": loss, "lr": lr})     # a ticket: drop it, .wait() or await it
        run.barrier("epoch-1").wait()

    run = chorus.open("chorus-runs/mnist/<group>/<id>")
    run.history()                                  # a pandas DataFrame

A W&B script ports by changing its import and its init arguments:
chorus.run, chorus.log, chorus.finish, chorus.config; run.config and
run.summary as dicts; log's nested dicts and commit=False;
define_metric(summary=..., step_metric=...). An exception, sys.exit(n),
Ctrl-C or a SIGTERM ends the rank as it happened (failed, or killed).

The run host tells what goes wrong while the run goes on (a stalled rank,
a NaN, a lost rank, a rule of run.alert_when): run.on_event(callback),
``async for event in run.events()``, run.next_event(timeout), and
chorus.open(path).events() afterwards.
docs/PYTHON.md in the repository has the whole API.
"""

import atexit as _atexit
import weakref as _weakref

from . import _errors
from ._errors import *  # noqa: F401,F403  (Error, NoRun and one class per chorus::Errc)
from . import _chorus
from . import _endings
from . import _events
from . import _fields
from ._aio import completion as _completion
from ._events import Event
from ._fields import Config, Summary
from ._reader import RunView, open, runs  # noqa: A004  (chorus.open reads a run)

__version__ = "0.1.0"

#: The run chorus.init() last started, until it finishes; None before.
run = None

Ticket = _chorus.Ticket
FinishTicket = _chorus.FinishTicket
Writer = _chorus.Writer
Histogram = _chorus.Histogram
Image = _chorus.Image
Text = _chorus.Text
Table = _chorus.Table


class FinishResult:
    """How a run (or this rank's part of it) ended: what Run.finish() gives.

    ``state``: "finished", "failed", "crashed", "killed" or "inactive";
    ``error``: a chorus.Error if the finish itself did not go cleanly, else
    None; ``ranks`` (run host only): each rank's state, last step and why it
    ended; ``upload_error``/``upload_left``: what finish left for
    ``chorus sync``.
    """

    __slots__ = ("state", "run_id", "run_dir", "rows", "dropped", "rejected", "ranks", "error",
                 "upload_error", "upload_left")

    def __init__(self, d):
        for k in self.__slots__:
            setattr(self, k, d[k])

    @property
    def ok(self):
        return self.error is None

    def __repr__(self):
        err = f", error={self.error!s}" if self.error is not None else ""
        return f"FinishResult(state={self.state!r}, run_id={self.run_id!r}, rows={self.rows}{err})"


def _ticket_await(self):
    if not self.ready:
        yield from _completion(self).__await__()
    self.wait()


def _finish_wait(self, timeout=None):
    """Blocks until the finish is done (at most finish_timeout, bounded by chorus) and
    returns its FinishResult; chorus.Timeout if `timeout` seconds pass first."""
    d = self._result(timeout)
    if d is None:
        raise Timeout(f"the finish is still in progress after {timeout} s: wait longer, or without a timeout")
    return FinishResult(d)


def _finish_await(self):
    if not self.ready:
        yield from _completion(self).__await__()
    return _finish_wait(self)


def _writer_exit(self, *exc):
    self.close().wait()
    return False


Ticket.__await__ = _ticket_await
FinishTicket.__await__ = _finish_await
FinishTicket.wait = _finish_wait
Writer.__enter__ = lambda self: self
Writer.__exit__ = _writer_exit

# Runs not finished yet: what the exception hook and exit go through.
_live = _weakref.WeakSet()


class Run(_chorus.Run):
    """A handle on the run this process logs into (chorus.init makes it).

    Every call may be made from many threads at once; the GIL is released
    while chorus works. Calls return tickets: drop them, ``.wait()`` on them,
    or ``await`` them. An inactive handle (a rank that logs into no run in
    this mode) is false, and its calls do nothing.

    ``log(values, step=None, commit=None)``, ``define_metric(name,
    reduce=None, step_metric=None, summary=None)``, ``config`` and
    ``summary`` (dict-like, see chorus.Config; calling them updates),
    ``barrier(name, timeout=None)``, ``log_artifact(name, path,
    type="file")``, ``reduce_device(values, op="mean", step=None)``,
    ``writer()``, ``finish(exit_code=0, *, signal=None, message=None)``;
    the run's events: ``alert_when(key, above=|below=|no_change=)``,
    ``on_event(callback)``, ``events()`` (``async for``),
    ``next_event(timeout=None)``; properties ``id``, ``dir``, ``is_host``,
    ``topology``, ``dropped``.
    """

    def __init__(self, **options):
        config = options.get("config")
        if config is not None:
            options["config"] = config = _fields.as_mapping(config, "chorus.init's config")
        super().__init__(**options)
        self._chorus_config = Config(self, _chorus._flat_fields(config) if config is not None else ())
        self._chorus_summary = Summary(self)
        _live.add(self)

    @property
    def config(self):
        """The run's config as this process set it: a chorus.Config (dict-like, attribute
        access; setting a key or update() sends it; calling it is update())."""
        return self._chorus_config

    @property
    def summary(self):
        """Summary fields as this process set them: a chorus.Summary (as config)."""
        return self._chorus_summary

    def writer(self):
        """A new ordered stream for one producer thread of this rank: its own steps."""
        return self._writer()

    def alert_when(self, key, *, above=None, below=None, no_change=None):
        """Declares a rule on ``key``, checked by the run host on committed rows: a
        ``threshold`` event when a value goes above ``above`` or below ``below``, or stays
        the same (or is not logged) for ``no_change`` seconds (a number or a
        datetime.timedelta) while the run goes on. Give exactly one (TypeError otherwise; a
        bound that is not finite, or a time not above 0, is a chorus.InvalidArgument). The
        rule fires once, and again only after the value came back within it; a key without
        a reduction is checked in each rank's column. Returns a Ticket, as define_metric does."""
        if not isinstance(key, str):
            raise TypeError(f"alert_when's key is a str (a metric's name), not {type(key).__name__}")
        kind, limit = _events.alert_rule(key, above, below, no_change)
        return self._alert_when(key, kind, limit)

    def on_event(self, callback):
        """Calls ``callback(event)`` (a chorus.Event) with each event of the run from now on,
        in order, on the run's thread ``chorus-events <run id>`` (a daemon thread of the
        package's; never a chorus thread), or, where an asyncio loop runs in the calling
        thread, on that loop (a coroutine it returns is run there as a task). An exception
        in the callback is printed with its traceback and later events still come. Every
        callback sees every event; the thread ends after the run's last event, once
        finish() has completed, or at the interpreter's exit. Returns ``callback`` (so it
        serves as a decorator)."""
        return _events.subscribe(self, callback)

    def events(self):
        """``async for event in run.events()``: the run's events (chorus.Event) from its
        start, in order, ending after its last (run_finished) or once this rank's part of
        the run is over. The loop is never blocked. events() and next_event() take from one
        queue: an event goes to one of them (on_event's callbacks see every event)."""
        return _events.Events(self)

    def next_event(self, timeout=None):
        """The run's next event not taken yet (from its start, up to the last 4,096), a
        chorus.Event; None once the run has ended, or after ``timeout`` seconds without one.
        Blocks with the GIL released; Ctrl-C interrupts it."""
        return _events.event(self._next_event(timeout))

    def finish(self, exit_code=0, *, signal=None, message=None):
        """Finishes this rank's part of the run (on the run host, the run); returns a
        FinishTicket at once. exit_code non-zero: the rank failed; signal (signal.SIGTERM,
        say): it was killed; message: why (an exception's text), kept in run.json.
        Values that log(commit=False) kept are logged first."""
        global run
        self._commit_kept()
        ticket = _chorus.Run.finish(self, exit_code, signal=signal, message=message)
        _events.finishing(self)
        _live.discard(self)
        if run is self:
            run = None
        return ticket

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        result = self.finish(**_endings.ending(exc_type, exc)).wait()
        if exc_type is None and result.error is not None:
            import warnings
            warnings.warn(f"chorus: the run's finish did not go cleanly: {result.error}", RuntimeWarning,
                          stacklevel=2)
        return False

    def __repr__(self):
        if not self:
            return "<chorus.Run inactive>"
        return f"<chorus.Run {self.id} in {self.dir}{' (host)' if self.is_host else ''}>"


def init(project=None, *, name=None, group=None, job_type=None, id=None, run_id=None, notes=None, mode=None,  # noqa: A002
         scope=None, resume=None, dir=None, upload=None, config=None, host_address=None, port=None,
         init_timeout=None, finish_timeout=None, upload_timeout=None, upload_buffer=None,
         barrier_timeout=None, heartbeat_interval=None, connection_timeout=None, queue_capacity=None,
         overflow=None, system_interval=None, tls_dir=None, insecure=None, read_env=None, stall_after=None):
    """Starts (or joins) the run this process logs into, as the arguments and the
    environment say (the same CHORUS_* variables and launcher detection as C++),
    and makes it chorus.run.

    mode: "auto" (rank 0 logs), "shared" (every rank into one run) or "new" (a run
    per rank); scope: "global" or "worker" (a run per node); id (or run_id): the
    run's id; resume: "never", "allow" or "must"; times are in seconds (stall_after:
    how long a rank may make no progress before it is reported stalled, 0 off); config: a
    dict, an argparse.Namespace or a dataclass instance (nested dicts are flattened
    with "."). Arguments left None keep chorus's defaults; CHORUS_* variables
    override them unless read_env=False. Raises a chorus.Error (ConnectFailed,
    BadEnvironment, InvalidArgument, ...) that names the cause and the fix.
    """
    global run
    if id is not None and run_id is not None and id != run_id:
        raise InvalidArgument(f"chorus.init got id={id!r} and run_id={run_id!r}: they are one option (id is "
                              f"W&B's name for run_id): give one of them")
    options = dict(project=project, name=name, group=group, job_type=job_type,
                   run_id=run_id if run_id is not None else id, notes=notes,
                   mode=mode, scope=scope, resume=resume, dir=dir, upload=upload, config=config,
                   host_address=host_address, port=port, init_timeout=init_timeout,
                   finish_timeout=finish_timeout, upload_timeout=upload_timeout, upload_buffer=upload_buffer,
                   barrier_timeout=barrier_timeout, heartbeat_interval=heartbeat_interval,
                   connection_timeout=connection_timeout, queue_capacity=queue_capacity, overflow=overflow,
                   system_interval=system_interval, tls_dir=tls_dir, insecure=insecure, read_env=read_env,
                   stall_after=stall_after)
    if dir is not None:
        import os
        options["dir"] = os.fspath(dir)
    started = Run(**{k: v for k, v in options.items() if v is not None})
    run = started
    return started


def _current(what):
    if run is None:
        raise NoRun(f"chorus.{what}: there is no run: call chorus.init() first")
    return run


def log(values, step=None, commit=None):
    """chorus.run.log(values, step, commit): see Run.log."""
    if commit is None:
        return _current("log").log(values, step)
    return _current("log").log(values, step, commit=commit)


def define_metric(name, reduce=None, step_metric=None, summary=None):
    """chorus.run.define_metric(...): see Run.define_metric."""
    return _current("define_metric").define_metric(name, reduce, step_metric=step_metric, summary=summary)


def alert_when(key, *, above=None, below=None, no_change=None):
    """chorus.run.alert_when(...): see Run.alert_when."""
    return _current("alert_when").alert_when(key, above=above, below=below, no_change=no_change)


def finish(exit_code=0, *, signal=None, message=None):
    """Finishes chorus.run (see Run.finish), waits for it (bounded by its
    finish_timeout) and returns its FinishResult; chorus.run is None after."""
    return _current("finish").finish(exit_code, signal=signal, message=message).wait()


#: The current run's config and summary (chorus.run.config, chorus.run.summary);
#: a chorus.NoRun error before chorus.init().
config = _fields.Current("config", lambda: run)
summary = _fields.Current("summary", lambda: run)


def detect_topology():
    """Where this process sits in the job (rank, world_size, ...), from the launcher's environment."""
    return _chorus.detect_topology()


# An uncaught exception ends the live runs failed (Ctrl-C: killed), with its text.
_endings.install_excepthook(lambda: list(_live))


# At exit, the on_event threads end before the interpreter finalizes.
_atexit.register(_events.close_all)


@_atexit.register
def _log_waiting_values():
    # Values log(commit=False) kept are logged before the exit. The runs
    # themselves are not finished here: the exit status is not known yet
    # (sys.exit(3)); the C++ core ends them with it (runtime/client/endings.hpp).
    for r in list(_live):
        try:
            r._commit_kept()
        except BaseException:  # noqa: BLE001,B036  (exit goes on)
            pass
