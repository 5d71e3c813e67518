"""How a Python exception ends a rank (README, "How a run ends").

The with-block and the uncaught-exception hook both say it with
``ending(exc_type, exc)``: no exception, or SystemExit(0)/SystemExit(None),
is a finish; SystemExit(n) fails the rank with exit code n; Ctrl-C
(KeyboardInterrupt) kills it by SIGINT; any other exception fails it with
exit code 1 and the traceback's last line as its message. SIGTERM and the
process's exit status are the C++ core's (runtime/client/endings.hpp).
"""

import signal as _signal
import sys

_INT_RANGE = range(-2**31, 2**31)


def exception_text(exc_type, exc):
    """`ExcType: text`, as a traceback's last line names an exception."""
    name = getattr(exc_type, "__qualname__", None) or getattr(exc_type, "__name__", "Exception")
    module = getattr(exc_type, "__module__", "builtins")
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    try:
        text = "" if exc is None else str(exc)
    except Exception:  # noqa: BLE001  (a broken __str__ must not hide the exception)
        text = "<its str() failed>"
    return f"{name}: {text}" if text else name


def ending(exc_type, exc):
    """finish()'s keyword arguments for a block or a program that ends with `exc`."""
    if exc_type is None:
        return {}
    if issubclass(exc_type, SystemExit):
        code = getattr(exc, "code", None)
        if code is None or (isinstance(code, int) and code == 0):
            return {}
        if isinstance(code, int):
            return {"exit_code": int(code) if int(code) in _INT_RANGE else 1}
        # sys.exit("message"): Python prints it and exits with 1.
        return {"exit_code": 1, "message": str(code)}
    if issubclass(exc_type, KeyboardInterrupt):
        return {"signal": int(_signal.SIGINT)}
    return {"exit_code": 1, "message": exception_text(exc_type, exc)}


def interactive():
    """An interpreter that goes on after an uncaught exception (the REPL,
    python -i, IPython and Jupyter, which set sys.ps1): its runs live on."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive) or bool(sys.flags.inspect)


def install_excepthook(live_runs):
    """Wraps sys.excepthook: after the previous hook has shown the exception,
    every live run (live_runs() gives them) is finished as `ending` says, so
    that an uncaught exception outside a with-block records `failed` with its
    message (KeyboardInterrupt: `killed` by SIGINT) before the interpreter
    finalizes. The previous hook is always called, and first."""
    previous = sys.excepthook
    if getattr(previous, "_chorus_hook", False):
        return  # the package was imported again (importlib.reload): one hook is enough

    def excepthook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)
        finally:
            if not interactive():
                end_runs(live_runs(), ending(exc_type, exc))

    excepthook._chorus_hook = True
    excepthook.previous = previous
    sys.excepthook = excepthook


def end_runs(runs, how):
    """Finishes `runs` as `how` says, all at once, and waits for each (bounded
    by its finish_timeout). Nothing here may hide the exception being handled."""
    tickets = []
    for run in runs:
        try:
            if run:
                tickets.append(run.finish(**how))
        except BaseException:  # noqa: BLE001,B036
            pass
    for ticket in tickets:
        try:
            ticket.wait()
        except BaseException:  # noqa: BLE001,B036  (a second Ctrl-C stops waiting)
            pass
