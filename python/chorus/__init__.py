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

docs/PYTHON.md in the repository has the whole API.
"""

import atexit as _atexit
import weakref as _weakref

from . import _errors
from ._errors import *  # noqa: F401,F403  (Error and one class per chorus::Errc)
from . import _chorus
from ._aio import completion as _completion
from ._reader import RunView, open, runs  # noqa: A004  (chorus.open reads a run)

__version__ = "0.1.0"

Ticket = _chorus.Ticket
FinishTicket = _chorus.FinishTicket
Writer = _chorus.Writer


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

_live = _weakref.WeakSet()


class Run(_chorus.Run):
    """A handle on the run this process logs into (chorus.init makes it).

    Every call may be made from many threads at once; the GIL is released
    while chorus works. Calls return tickets: drop them, ``.wait()`` on them,
    or ``await`` them. An inactive handle (a rank that logs into no run in
    this mode) is false, and its calls do nothing.

    Methods (native): ``log(values, step=None)``, ``define_metric(key,
    reduce="none")``, ``config(values)``, ``summary(values)``,
    ``barrier(name, timeout=None)``, ``log_artifact(name, path,
    type="file")``, ``reduce_device(values, op="mean", step=None)``,
    ``finish(exit_code=0)``; properties ``id``, ``dir``, ``is_host``,
    ``topology``, ``dropped``.
    """

    def __init__(self, **options):
        super().__init__(**options)
        _live.add(self)

    def writer(self):
        """A new ordered stream for one producer thread of this rank: its own steps."""
        return self._writer()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            code = 0
        elif issubclass(exc_type, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        elif issubclass(exc_type, KeyboardInterrupt):
            code = 130
        else:
            code = 1
        result = self.finish(exit_code=code).wait()
        if exc_type is None and result.error is not None:
            import warnings
            warnings.warn(f"chorus: the run's finish did not go cleanly: {result.error}", RuntimeWarning,
                          stacklevel=2)
        return False

    def __repr__(self):
        if not self:
            return "<chorus.Run inactive>"
        return f"<chorus.Run {self.id} in {self.dir}{' (host)' if self.is_host else ''}>"


def init(project=None, *, name=None, group=None, job_type=None, run_id=None, notes=None, mode=None,
         scope=None, resume=None, dir=None, upload=None, config=None, host_address=None, port=None,
         init_timeout=None, finish_timeout=None, upload_timeout=None, upload_buffer=None,
         barrier_timeout=None, heartbeat_interval=None, connection_timeout=None, queue_capacity=None,
         overflow=None, system_interval=None, tls_dir=None, insecure=None, read_env=None):
    """Starts (or joins) the run this process logs into, as the arguments and the
    environment say (the same CHORUS_* variables and launcher detection as C++).

    mode: "auto" (rank 0 logs), "shared" (every rank into one run) or "new" (a run
    per rank); scope: "global" or "worker" (a run per node); resume: "never",
    "allow" or "must"; times are in seconds; config: a dict (nested dicts are
    flattened with "."). Arguments left None keep chorus's defaults; CHORUS_*
    variables override them unless read_env=False. Raises a chorus.Error
    (ConnectFailed, BadEnvironment, InvalidArgument, ...) that names the cause
    and the fix.
    """
    options = dict(project=project, name=name, group=group, job_type=job_type, run_id=run_id, notes=notes,
                   mode=mode, scope=scope, resume=resume, dir=dir, upload=upload, config=config,
                   host_address=host_address, port=port, init_timeout=init_timeout,
                   finish_timeout=finish_timeout, upload_timeout=upload_timeout, upload_buffer=upload_buffer,
                   barrier_timeout=barrier_timeout, heartbeat_interval=heartbeat_interval,
                   connection_timeout=connection_timeout, queue_capacity=queue_capacity, overflow=overflow,
                   system_interval=system_interval, tls_dir=tls_dir, insecure=insecure, read_env=read_env)
    if dir is not None:
        import os
        options["dir"] = os.fspath(dir)
    return Run(**{k: v for k, v in options.items() if v is not None})


def detect_topology():
    """Where this process sits in the job (rank, world_size, ...), from the launcher's environment."""
    return _chorus.detect_topology()


@_atexit.register
def _finish_live_runs():
    # A run left unfinished at exit is finished here (bounded by its
    # finish_timeout), while the interpreter is whole.
    for run in list(_live):
        try:
            run.finish().wait()
        except BaseException:  # noqa: B036  (exit goes on)
            pass
