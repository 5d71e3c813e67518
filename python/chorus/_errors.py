"""chorus's errors as Python exceptions: one class per chorus::Errc.

Every exception chorus raises is a chorus.Error; its ``code`` is the Errc's
name ("invalid_key", "barrier_timeout", ...) and its message names the cause
and the fix, as in C++. Errors about a bad argument are also ValueErrors,
and the timeouts TimeoutErrors, so that ``except ValueError`` catches them.
"""


class Error(Exception):
    """Base of every chorus error. ``code``: the chorus::Errc name."""

    code = "internal"


class InvalidArgument(Error, ValueError):
    """A bad option value or call argument."""


class InvalidKey(Error, ValueError):
    """An empty, too long, non-UTF-8 or reserved metric key."""


class BadEnvironment(Error):
    """A malformed or contradictory environment variable (CHORUS_*, the launcher's)."""


class BackwardsStep(Error, ValueError):
    """A step lower than its stream's last one."""


class StepCommitted(Error, ValueError):
    """A step at or below what a barrier already committed."""


class Dropped(Error):
    """The queue was full under overflow="drop_newest"."""


class Finished(Error):
    """The run has finished: nothing more is taken."""


class ConnectFailed(Error):
    """The run host could not be reached within init_timeout."""


class AddressInUse(Error):
    """The run host could not listen on its port."""


class BarrierTimeout(Error, TimeoutError):
    """Not every live rank reached the barrier in time."""


class BarrierMismatch(Error):
    """Ranks reached barriers with different names."""


class HostLost(Error):
    """The run host went away."""


class Timeout(Error, TimeoutError):
    """A bounded wait ran out."""


class IoError(Error):
    """The run directory could not be written (or a run file read)."""


class Internal(Error):
    """A bug in chorus: please report it."""


class UploadIncomplete(Error):
    """finish left part of the upload in the run directory for `chorus sync`."""


class NoRun(Error, RuntimeError):
    """chorus.log, chorus.finish, chorus.config or chorus.summary with no current
    run: call chorus.init() first. The Python package's own code, "no_run" (the
    C++ API has no current run)."""

    code = "no_run"


by_code = {
    "invalid_argument": InvalidArgument,
    "invalid_key": InvalidKey,
    "bad_environment": BadEnvironment,
    "backwards_step": BackwardsStep,
    "step_committed": StepCommitted,
    "dropped": Dropped,
    "finished": Finished,
    "connect_failed": ConnectFailed,
    "address_in_use": AddressInUse,
    "barrier_timeout": BarrierTimeout,
    "barrier_mismatch": BarrierMismatch,
    "host_lost": HostLost,
    "timeout": Timeout,
    "io_error": IoError,
    "internal": Internal,
    "upload_incomplete": UploadIncomplete,
}

for _code, _cls in by_code.items():
    _cls.code = _code

__all__ = ["Error", "NoRun"] + [c.__name__ for c in by_code.values()]
