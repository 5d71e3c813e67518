"""run.config and run.summary: dict-like views of the fields this process set.

Reads give what this process set (and init's config), as it gave them; each
change goes through the run's native config or summary call (the same as
``run.config({...})``), which sends it to the run host. A nested dict is
kept flattened with "." as chorus's config is: ``{"opt": {"lr": 0.1}}`` is
``config["opt.lr"]``.
"""

import argparse
import collections.abc
import dataclasses
import weakref

from . import _chorus
from ._errors import Finished, InvalidArgument


def as_mapping(values, what):
    """A dict, an argparse.Namespace or a dataclass instance as a mapping
    (nested Namespaces and dataclasses too); anything else with items() as it is."""
    if isinstance(values, argparse.Namespace):
        return {k: _inner(v) for k, v in vars(values).items()}
    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        # Shallow, unlike dataclasses.asdict: values are not deep-copied.
        return {f.name: _inner(getattr(values, f.name)) for f in dataclasses.fields(values)}
    if hasattr(values, "items"):
        return values
    raise InvalidArgument(f"{what} takes a dict, an argparse.Namespace or a dataclass instance, not a "
                          f"{type(values).__name__}: pass vars(obj) or a dict of its fields")


def _inner(v):
    if isinstance(v, argparse.Namespace) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
        return as_mapping(v, "config")
    return v


class _Fields(collections.abc.Mapping):
    """What Config and Summary share: a mapping of flattened keys to the values
    this process set, whose changes are sent to the run."""

    __slots__ = ("_Fields__run", "_Fields__values", "__weakref__")
    _what = ""

    def __init__(self, run, pairs=()):
        object.__setattr__(self, "_Fields__run", weakref.ref(run))
        object.__setattr__(self, "_Fields__values", dict(pairs))

    def update(self, values=None, allow_val_change=None, **more):
        """Sets the fields of a dict (or an argparse.Namespace, a dataclass
        instance) and of keyword arguments, and sends them to the run; returns
        the call's Ticket. A key set again takes its new value (chorus always
        allows it: `allow_val_change` is accepted and changes nothing)."""
        del allow_val_change
        mapping = {} if values is None else as_mapping(values, f"run.{self._what}")
        if more:
            mapping = {**dict(mapping.items()), **more}
        run = self.__run()
        if run is None:
            raise Finished(f"run.{self._what}: its run is gone (the Run object was freed): "
                           f"keep the Run while you set its {self._what}")
        pairs = _chorus._flat_fields(mapping)
        # Sent first: a value the native call refuses is not kept either.
        ticket = self._send(run, mapping)
        self.__values.update(pairs)
        return ticket

    def __call__(self, values):
        """The method run.config(values) was: update(values), returning its Ticket."""
        return self.update(values)

    def setdefaults(self, values):
        """Sets only the fields not set yet; returns the Ticket, or None where none was new."""
        mapping = as_mapping(values, f"run.{self._what}")
        new = {k: v for k, v in _chorus._flat_fields(mapping) if k not in self.__values}
        return self.update(new) if new else None

    def as_dict(self):
        """A copy, as a plain dict of flattened keys."""
        return dict(self.__values)

    def __getitem__(self, key):
        return self.__values[key]

    def __contains__(self, key):
        return key in self.__values

    def __iter__(self):
        return iter(self.__values)

    def __len__(self):
        return len(self.__values)

    def __setitem__(self, key, value):
        self.update({key: value})

    def __delitem__(self, key):
        raise TypeError(f"run.{self._what} keeps every key it was given, as the run does: set {key!r} to None "
                        f"instead of deleting it")

    def __getattr__(self, name):
        if name.startswith("_Fields__") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        try:
            return self.__values[name]
        except KeyError:
            pass
        hint = ""
        if any(k.startswith(name + ".") for k in self.__values):
            hint = f": nested dicts are kept flattened with '.', read run.{self._what}['{name}.<key>']"
        raise AttributeError(f"run.{self._what} has no key {name!r}{hint}") from None

    def __setattr__(self, name, value):
        self.update({name: value})

    def __delattr__(self, name):
        self.__delitem__(name)

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | {k for k in self.__values if k.isidentifier()})

    def __repr__(self):
        return f"chorus.{type(self).__name__}({self.__values!r})"

    def __reduce__(self):
        # Pickled or copied, it is a plain dict of its fields: a snapshot,
        # not a view that sends (a worker process has no run to send to).
        return (dict, (self.as_dict(),))

    __hash__ = None  # mutable: not hashable, as a dict is not


class Config(_Fields):
    """run.config: the run's config as this process set it (init's config and
    every update since). ``run.config.lr``, ``run.config["lr"]``,
    ``run.config.lr = 0.1``, ``run.config.update({...})``; calling it,
    ``run.config({...})``, updates and returns the Ticket."""

    __slots__ = ()
    _what = "config"

    @staticmethod
    def _send(run, mapping):
        return _chorus.Run.config(run, mapping)


class Summary(_Fields):
    """run.summary: summary fields as this process set them (``run.summary["best"] = x``,
    ``run.summary.update({...})``). The metrics' own summaries (last, min, max or
    mean of each, define_metric's summary=) are the run host's: read them with
    chorus.open(run.dir).summary."""

    __slots__ = ()
    _what = "summary"

    @staticmethod
    def _send(run, mapping):
        return _chorus.Run.summary(run, mapping)


class Current:
    """chorus.config and chorus.summary: the current run's (chorus.run), or a
    chorus.NoRun error naming the fix before chorus.init()."""

    __slots__ = ("_Current__what", "_Current__current")

    def __init__(self, what, current):
        object.__setattr__(self, "_Current__what", what)
        object.__setattr__(self, "_Current__current", current)

    def __target(self):
        run = self.__current()
        if run is None:
            from ._errors import NoRun
            raise NoRun(f"chorus.{self.__what} is the current run's {self.__what}, and there is no run: "
                        f"call chorus.init() first")
        return getattr(run, self.__what)

    def __getattr__(self, name):
        if name.startswith("_Current__") or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self.__target(), name)

    def __setattr__(self, name, value):
        setattr(self.__target(), name, value)

    def __delattr__(self, name):
        delattr(self.__target(), name)

    def __getitem__(self, key):
        return self.__target()[key]

    def __setitem__(self, key, value):
        self.__target()[key] = value

    def __delitem__(self, key):
        del self.__target()[key]

    def __contains__(self, key):
        return key in self.__target()

    def __iter__(self):
        return iter(self.__target())

    def __len__(self):
        return len(self.__target())

    def __call__(self, values):
        return self.__target()(values)

    def __eq__(self, other):
        return self.__target() == other

    __hash__ = None

    def __repr__(self):
        if self.__current() is None:
            return f"<chorus.{self.__what}: no run yet (chorus.init() makes one)>"
        return repr(self.__target())
