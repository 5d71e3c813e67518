"""Reading runs: chorus.open(path) and chorus.runs(dir).

run.json is read through chorus's own reader of it (the same as the
``chorus`` command's), history.jsonl, system.jsonl, histograms.jsonl and
media.jsonl column by column in native code, events.jsonl a line at a time
through chorus's reader of an event; only complete lines are read, so a live
run can be read while it grows.
"""

import json
import os
import warnings

from . import _chorus
from ._errors import IoError
from ._events import event as _event


def _load_json(path, missing_ok=True):
    text = _chorus.read_text(path, missing_ok)
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise IoError(f"{path} is not valid JSON ({e}): it is damaged, or was cut short while being "
                      "written; `chorus recover` rebuilds it from the WAL") from None
    if not isinstance(value, dict):
        raise IoError(f"{path} is not a JSON object: it is damaged; `chorus recover` rebuilds it from the WAL")
    return value


def _checked(read, path, fix, stacklevel):
    """A JSON-lines file's reading: raises the problem that stopped it, warns of
    damaged lines (naming `fix`) at the caller `stacklevel` frames up."""
    if read["problem"] is not None:
        raise read["problem"]
    if read["skipped"]:
        warnings.warn(f"{path}: {read['skipped']} damaged line(s) skipped, the first (line "
                      f"{read['first_skipped_line']}): {read['first_skipped_why']}; {fix}", RuntimeWarning,
                      stacklevel=stacklevel + 1)
    return read


def _numpy_pandas(pandas):
    """(numpy, pandas) where a DataFrame is wanted: ``pandas`` True, or None and both import;
    else None (a list of dicts is)."""
    if pandas is None or pandas:
        try:
            import numpy as np
            import pandas as pd
        except ImportError:
            if pandas:
                raise
        else:
            return np, pd
    return None


_REBUILD = "`chorus recover` rebuilds the file from the WAL"

# histograms(key)'s columns, and the NumPy type of those that are numbers
# (the others hold Python objects: a rank or None, a list of buckets).
_HISTOGRAM_COLUMNS = ("_step", "rank", "count", "sum", "min", "max", "nan", "inf", "-inf", "buckets")
_HISTOGRAM_NUMBERS = {"_step": "q", "count": "q", "nan": "q", "inf": "q", "-inf": "q", "sum": "d", "min": "d", "max": "d"}


# images(key)'s columns (texts() and tables() add the file's contents).
_MEDIA_COLUMNS = ("_step", "_timestamp", "rank", "caption", "path", "format", "width", "height", "size")


class RunView:
    """A run directory, read: identity, ranks, config, summary, history, histograms, media, events.

    Attributes: ``path``, ``record`` (run.json as a dict) and, from it,
    ``id``, ``name``, ``project``, ``group``, ``state``, ``ranks``; the
    methods read the files each time they are called, so a live run shows
    its latest rows. A run whose run.json says running but whose host is
    gone (its lease expired, or on its own machine nobody holds its
    write-ahead log) reads ``crashed``, as ``chorus ls`` has it: its running
    ranks crashed at the last committed step, and ``record["error"]`` says why.
    A run whose files a crash of the machine cut short after its end (shorter
    than its run.json records them) says which in ``record["files_cut"]``, and
    reading them raises chorus.IoError naming ``chorus recover``.
    """

    def __init__(self, path):
        path = os.fspath(path)
        if os.path.basename(path) == "run.json":
            path = os.path.dirname(path) or "."
        if not os.path.isdir(path):
            raise IoError(f"{path} is not a run directory (no such directory): give the path of a run, "
                          "<dir>/<project>/<group>/<run-id>, as `chorus ls` lists them")
        self.path = path
        self.record = _chorus.read_record(os.path.join(path, "run.json"))

    id = property(lambda self: self.record["id"])
    name = property(lambda self: self.record["name"])
    project = property(lambda self: self.record["project"])
    group = property(lambda self: self.record["group"])
    state = property(lambda self: self.record["state"])
    ranks = property(lambda self: self.record["ranks"])
    start_time = property(lambda self: self.record["start_time"])

    def _whole(self):
        """Raises where a crash of the machine cut the run's files short after its end."""
        if self.record.get("files_cut"):
            raise IoError(f"{self.path}: {self.record['files_cut']}")

    @property
    def config(self):
        """config.json as a dict."""
        self._whole()
        return _load_json(os.path.join(self.path, "config.json"))

    @property
    def summary(self):
        """summary.json as a dict: each key's last value, and what the run set."""
        self._whole()
        return _load_json(os.path.join(self.path, "summary.json"))

    def history(self, keys=None, *, counts=False, pandas=None):
        """The committed rows of history.jsonl: a pandas DataFrame with a column per key
        (``_step``, ``_timestamp``, ``_runtime`` first; NaN where a row has no value),
        or, without pandas (or with pandas=False), a list of dicts with the keys each
        row has. ``keys``: only the keys these patterns pick (and the row's own), as
        ``chorus export --metric`` picks them: a key and its per-rank columns
        (``"loss"``: ``loss``, ``loss/rank-0``, ...), a glob (``"train/*"``), or a
        POSIX extended regular expression between slashes (``"/^val/"``); None, all
        keys. ``counts``: a reduced key's rank count as the column ``_count/<key>``."""
        return self._read("history.jsonl", keys, counts, pandas)

    def system(self, keys=None, *, pandas=None):
        """system.jsonl's samples as history() gives rows: ``_timestamp``, ``_node``,
        ``_rank`` and a column per metric (``system.cpu.percent/node-0``, ...);
        ``keys`` picks them as history()'s does (``"system.gpu.*"``)."""
        return self._read("system.jsonl", keys, False, pandas)

    def artifacts(self):
        """artifacts.jsonl's entries, the last per name (a name logged again replaces its file):
        name, type, size, sha256, rank, step, timestamp."""
        path = os.path.join(self.path, "artifacts.jsonl")
        if not os.path.lexists(path):
            return []
        read = _checked(_chorus.read_artifacts(path), path,
                        "the other entries are listed; each artifact's file is under artifacts/", 2)
        return list({e["name"]: e for e in read["entries"]}.values())

    def events(self, kind=None):
        """The run's events, as the run host told them while it ran (events.jsonl, in
        order): a list of chorus.Event, the same as Run.on_event gives. ``kind`` (a str, or
        several): only those kinds ("nonfinite", ("rank_failed", "rank_lost")). A run
        without events.jsonl has none."""
        self._whole()
        path = os.path.join(self.path, "events.jsonl")
        if not os.path.lexists(path):
            return []
        read = _checked(_chorus.read_events(path), path, _REBUILD, 2)
        kinds = None if kind is None else {kind} if isinstance(kind, str) else set(kind)
        return [e for e in map(_event, read["entries"]) if kinds is None or e.kind in kinds]

    def histogram_keys(self):
        """The keys of histograms.jsonl, in the order they first appear (a rank's own
        column, ``act/rank-1``, under its key ``act``); [] for a run without histograms."""
        return self._histograms(None)["keys"]

    def histograms(self, key, *, pandas=None):
        """The histograms of ``key``, a row per histograms.jsonl line, in the file's order:
        a pandas DataFrame with the columns ``_step``, ``rank`` (None for a merged histogram
        or a run of one rank, else the rank whose column ``key/rank-N`` it is), ``count``
        (every value, NaN and infinities included), ``sum``, ``min`` and ``max`` (of the
        finite values; NaN where there is none), ``nan``, ``inf``, ``-inf`` (their counts)
        and ``buckets`` (the non-empty buckets as ``(lo, hi, count)`` tuples, ascending, as
        ``chorus.Histogram.buckets()`` gives them). ``key`` takes every rank's column of
        the key; a column's full name (``"act/rank-1"``) takes that one. A key the run
        has none of gives no rows. Without pandas (or with pandas=False), a list of dicts."""
        read = self._histograms(str(key))
        frame = _numpy_pandas(pandas)
        if frame:
            np, pd = frame
            data = {n: np.frombuffer(read[n], dtype=_HISTOGRAM_NUMBERS[n])
                    if n in _HISTOGRAM_NUMBERS else pd.Series(read[n], dtype=object)
                    for n in _HISTOGRAM_COLUMNS}
            return pd.DataFrame(data, columns=list(_HISTOGRAM_COLUMNS))
        import array
        columns = {n: array.array(_HISTOGRAM_NUMBERS[n], read[n]) if n in _HISTOGRAM_NUMBERS else read[n]
                   for n in _HISTOGRAM_COLUMNS}
        return [{n: columns[n][i] for n in _HISTOGRAM_COLUMNS} for i in range(read["rows"])]

    def media_keys(self):
        """The keys of media.jsonl with their kinds, ``[(key, "image" | "text" | "table"), ...]``,
        in the order they first appear; [] for a run without images, text or tables."""
        return self._media(None, None)["keys"]

    def images(self, key, *, pandas=None):
        """The images of ``key``, a row per media.jsonl line, in the file's (step) order: a pandas
        DataFrame with the columns ``_step``, ``_timestamp``, ``rank`` (the rank that logged it),
        ``caption`` (None without one), ``path`` (the file, under the run directory's media/),
        ``format`` (``png`` or ``jpeg``), ``width``, ``height`` and ``size`` (bytes). A key the run
        has no images of gives no rows. Without pandas (or with pandas=False), a list of dicts."""
        return self._media_frame(key, "image", pandas)

    def texts(self, key, *, pandas=None):
        """The texts (markdown) of ``key`` as images() gives images, with a column ``text``
        (the file's contents) beside ``path``."""
        rows = self._media(str(key), "text")["entries"]
        for r in rows:
            r["text"] = _chorus.read_text(r["path"], False)
        return self._frame(rows, _MEDIA_COLUMNS + ("text",), pandas)

    def tables(self, key, *, pandas=None):
        """The tables of ``key`` as images() gives images, with a column ``table``: the table's
        ``{"columns": [...], "data": [[...], ...]}`` read from its file."""
        rows = self._media(str(key), "table")["entries"]
        for r in rows:
            r["table"] = _load_json(r["path"], missing_ok=False)
        return self._frame(rows, _MEDIA_COLUMNS + ("table",), pandas)

    def _media_frame(self, key, kind, pandas):
        return self._frame(self._media(str(key), kind)["entries"], _MEDIA_COLUMNS, pandas)

    @staticmethod
    def _frame(rows, columns, pandas):
        frame = _numpy_pandas(pandas)
        if frame:
            _, pd = frame
            return pd.DataFrame([{n: r[n] for n in columns} for r in rows], columns=list(columns))
        return [{n: r[n] for n in columns} for r in rows]

    def _media(self, key, kind):
        self._whole()
        path = os.path.join(self.path, "media.jsonl")
        if not os.path.lexists(path):
            return {"keys": [], "entries": []}
        read = _checked(_chorus.read_media(path, key, kind), path, _REBUILD, 4)
        read["keys"] = [tuple(k) for k in read["keys"]]
        return read

    def _histograms(self, key):
        self._whole()
        path = os.path.join(self.path, "histograms.jsonl")
        if not os.path.lexists(path):
            return {"keys": [], "rows": 0, **{n: b"" if n in _HISTOGRAM_NUMBERS else [] for n in _HISTOGRAM_COLUMNS}}
        return _checked(_chorus.read_histograms(path, key), path, _REBUILD, 3)

    def _read(self, name, keys, counts, pandas):
        if name != "system.jsonl":  # synced at the end: never cut short
            self._whole()
        path = os.path.join(self.path, name)
        if isinstance(keys, str):
            keys = [keys]  # one pattern, not its characters
        cols = _checked(_chorus.read_lines(path, None if keys is None else [str(k) for k in keys], counts,
                                           name == "history.jsonl"), path, _REBUILD, 3)
        frame = _numpy_pandas(pandas)
        if frame:
            np, pd = frame
            data = {}
            for n, v in zip(cols["names"], cols["values"]):
                a = np.frombuffer(v, dtype=np.float64)
                if n == "_step" or n == "_rank" or n == "_node":
                    if not np.isnan(a).any():
                        a = a.astype(np.int64)
                data[n] = a
            return pd.DataFrame(data, columns=cols["names"])
        import array
        rows = [{} for _ in range(cols["rows"])]
        for n, v, p in zip(cols["names"], cols["values"], cols["present"]):
            values = array.array("d", v)
            whole = n in ("_step", "_rank", "_node")
            for i, has in enumerate(p):
                if has:
                    rows[i][n] = int(values[i]) if whole else values[i]
        return rows

    def __repr__(self):
        return f"<chorus.RunView {self.project}/{self.group}/{self.id} {self.state} at {self.path}>"


def open(path):  # noqa: A001  (chorus.open, as the package names it)
    """Reads the run at `path` (its directory, or its run.json)."""
    return RunView(path)


def runs(dir=None):
    """The runs under `dir` (default: $CHORUS_DIR, else ./chorus-runs), newest first.
    `dir` may also be a project's or a group's directory. A run whose run.json is
    damaged is left out with a warning that names it."""
    root = os.fspath(dir) if dir is not None else os.environ.get("CHORUS_DIR") or "chorus-runs"
    if not os.path.isdir(root):
        raise IoError(f"{root} is not a directory: give the run directory (CHORUS_DIR, ./chorus-runs by default)")
    found = []
    base = root.rstrip(os.sep).count(os.sep)
    for here, dirs, files in os.walk(root):
        if "run.json" in files:
            dirs[:] = []
            try:
                found.append(RunView(here))
            except Exception as e:  # noqa: BLE001  (one damaged run never hides the others)
                warnings.warn(f"{here}: left out: {e}", RuntimeWarning, stacklevel=2)
        elif here.rstrip(os.sep).count(os.sep) - base >= 3:
            dirs[:] = []
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    found.sort(key=lambda r: r.start_time or 0, reverse=True)
    return found
