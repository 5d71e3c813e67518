"""chorus.open and chorus.runs: identity, ranks, config, summary and
history, as pandas or plain rows, and what damaged files do."""

import json
import math
import os
import time
import warnings

import pytest

import chorus
from conftest import record, run_dirs


def make_run(project="reader", steps=5, **kw):
    with chorus.init(project=project, config={"lr": 0.1}, **kw) as run:
        run.define_metric("loss", "mean")
        for s in range(steps):
            run.log({"loss": 1.0 / (s + 1), "acc": s / 10, **({"nan": float("nan"), "inf": -math.inf} if s == 2 else {})})
        run.summary({"best": 0.9})
        run_dir = run.dir
    return run_dir


def test_open_reads_identity_ranks_config_summary(runs_dir):
    d = make_run()
    view = chorus.open(d)
    assert view.id == os.path.basename(d) and view.project == "reader" and view.state == "finished"
    assert [(r["rank"], r["state"], r["last_step"]) for r in view.ranks] == [(0, "finished", 4)]
    assert view.record["world_size"] == 1 and view.record["end_time"] >= view.record["start_time"]
    assert view.config == {"lr": 0.1}
    assert view.summary["best"] == 0.9 and view.summary["loss"] == 0.2
    assert chorus.open(os.path.join(d, "run.json")).id == view.id


def test_history_as_pandas_and_as_rows(runs_dir):
    pd = pytest.importorskip("pandas")
    d = make_run()
    h = chorus.open(d).history()
    assert isinstance(h, pd.DataFrame)
    assert list(h.columns[:3]) == ["_step", "_timestamp", "_runtime"]
    assert h["_step"].tolist() == [0, 1, 2, 3, 4] and str(h["_step"].dtype) == "int64"
    assert h["loss"].tolist() == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert math.isnan(h["nan"][2]) and h["inf"][2] == -math.inf and math.isnan(h["inf"][0])
    counts = chorus.open(d).history(["loss"], counts=True)
    assert list(counts.columns) == ["_step", "_timestamp", "_runtime", "loss", "_count/loss"]
    assert counts["_count/loss"].tolist() == [1] * 5
    plain = chorus.open(d).history(pandas=False)
    assert plain[0].keys() == {"_step", "_timestamp", "_runtime", "loss", "acc"}
    assert "nan" in plain[2] and math.isnan(plain[2]["nan"]) and "nan" not in plain[3]
    assert [r["_step"] for r in plain] == [0, 1, 2, 3, 4] and all(isinstance(r["_step"], int) for r in plain)


def test_runs_lists_newest_first_and_leaves_out_damage(runs_dir):
    a = make_run(project="one")
    b = make_run(project="two")
    c = make_run(project="three")
    with open(os.path.join(c, "run.json"), "w") as f:
        f.write('{"id": "x", "state": ')  # cut short
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        listed = chorus.runs(runs_dir)
    assert [r.path for r in listed] == [b, a]
    assert any(c in str(w.message) and "chorus recover" in str(w.message) for w in caught)
    with pytest.raises(chorus.IoError, match="chorus recover"):
        chorus.open(c)
    assert [r.path for r in chorus.runs(os.path.join(runs_dir, "two"))] == [b]
    with pytest.raises(chorus.IoError, match="not a directory"):
        chorus.runs(runs_dir / "nowhere")


def test_damaged_and_unfinished_history_lines(runs_dir):
    d = make_run(steps=3)
    path = os.path.join(d, "history.jsonl")
    with open(path, "a") as f:
        f.write("this is not json\n")
        f.write('{"_step":3,"_timestamp":1,"_runtime":1,"loss":9}\n')
        f.write('{"_step":4,"_timestamp":1,"_runt')  # being written
    with pytest.warns(RuntimeWarning, match=r"1 damaged line\(s\) skipped, the first \(line 4\)"):
        rows = chorus.open(d).history(pandas=False)
    assert [r["_step"] for r in rows] == [0, 1, 2, 3] and rows[3]["loss"] == 9


def test_damaged_config_names_the_file(runs_dir):
    d = make_run(steps=1)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write("{")
    # The run's end recorded config.json's length: the file and the fix are named before it is parsed.
    with pytest.raises(chorus.IoError, match=r"config.json holds 1 bytes, not the \d+ .*chorus recover"):
        chorus.open(d).config
    # A run.json without lengths (an earlier version's): the file's own damage is named.
    h = hand_made_run(runs_dir, "no-lengths", state="finished")
    with open(os.path.join(h, "config.json"), "w") as f:
        f.write("{")
    with pytest.raises(chorus.IoError, match="config.json is not valid JSON"):
        chorus.open(h).config
    assert chorus.open(h).summary == {}  # no summary.json: an empty one


def test_a_live_run_can_be_read(runs_dir):
    with chorus.init(project="reader") as run:
        for s in range(10):
            run.log({"x": float(s)}).wait()
        view = chorus.open(run.dir)
        assert view.state == "running"
        # Rows through step 8 are committed (step 9 waits for the rank to move
        # on); the run host writes them out within a few seconds.
        deadline = time.monotonic() + 30
        while len(view.history(pandas=False)) < 9 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [r["x"] for r in view.history(pandas=False)] == [float(s) for s in range(9)]
    assert len(chorus.open(run.dir).history(pandas=False)) == 10


def hand_made_run(root, run_id, host="node-elsewhere", state="running", history_rows=(), system_rows=()):
    """A run directory written here, as a run host on `host` (pid 4242) leaves it."""
    d = os.path.join(str(root), "reader", "hand", run_id)
    os.makedirs(d)
    ranks = [{"rank": r, "state": state, "last_step": -1, "host": host, "message": ""} for r in range(2)]
    record = {"id": run_id, "name": run_id, "project": "reader", "group": "hand", "mode": "shared", "scope": "global",
              "host": host, "pid": 4242, "dir": d, "state": state, "start_time": time.time() - 600,
              "end_time": None, "world_size": 2, "ranks": ranks}
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump(record, f)
    for name, lines in (("history.jsonl", history_rows), ("system.jsonl", system_rows)):
        with open(os.path.join(d, name), "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
    return d


def write_lease(d, host="node-elsewhere", age=0.0):
    """lease.json as its host writes it, renewed `age` seconds ago (it expires 30 s after)."""
    renewed = time.time() - age
    with open(os.path.join(d, "lease.json"), "w") as f:
        json.dump({"host": host, "pid": 4242, "renewed": renewed, "interval": 5, "expires": renewed + 30}, f)


def test_history_keys_pick_as_export_metric_does(runs_dir):
    row = {"_timestamp": 1.0, "_runtime": 0.5, "loss": 1.0, "loss/rank-0": 0.5, "loss/rank-1": 1.5, "lossy": 9.0,
           "train/acc": 0.1, "train/loss/rank-1": 0.2, "val/acc": 0.3, "_count": {"loss": 2}}
    d = hand_made_run(runs_dir, "keys", state="finished", history_rows=[{"_step": s, **row} for s in range(3)],
                      system_rows=[{"_timestamp": 1.0, "_node": 0, "_rank": 0, "system.cpu.percent/node-0": 5.0,
                                    "system.gpu.power_w/rank-0": 300.0}])
    view = chorus.open(d)

    def columns(keys, **kw):
        return sorted(view.history(keys, pandas=False, **kw)[0].keys() - {"_step", "_timestamp", "_runtime"})

    # A key: itself and its per-rank columns, not a key it merely starts.
    assert columns(["loss"]) == ["loss", "loss/rank-0", "loss/rank-1"]
    assert columns("loss") == columns(["loss"])  # one pattern, not its letters
    assert columns(["loss"], counts=True) == ["_count/loss", "loss", "loss/rank-0", "loss/rank-1"]
    assert columns(["train/*"]) == ["train/acc", "train/loss/rank-1"]  # `*` crosses `/`
    assert columns(["/^val/", "lossy"]) == ["lossy", "val/acc"]
    assert columns(["/acc$/"]) == ["train/acc", "val/acc"]
    assert len(columns(None)) == 7 and columns([]) == []
    with pytest.raises(chorus.InvalidArgument, match=r"keys /\(/ is no regular expression"):
        view.history(["/(/"])
    with pytest.raises(chorus.InvalidArgument, match="not an empty word"):
        view.history([""])
    assert sorted(view.system(["system.gpu.*"], pandas=False)[0].keys()) == [
        "_node", "_rank", "_timestamp", "system.gpu.power_w/rank-0"]
    pd = pytest.importorskip("pandas")
    h = view.history(["loss"])
    assert isinstance(h, pd.DataFrame) and list(h.columns) == ["_step", "_timestamp", "_runtime", "loss",
                                                               "loss/rank-0", "loss/rank-1"]


def test_a_run_whose_host_lease_expired_reads_crashed(runs_dir):
    lost = hand_made_run(runs_dir, "lost")
    write_lease(lost, age=3600)
    with open(os.path.join(lost, "summary.json"), "w") as f:
        json.dump({"_step": 41, "loss": 0.5}, f)
    live = hand_made_run(runs_dir, "live")
    write_lease(live, age=1)
    unleased = hand_made_run(runs_dir, "unleased")  # nothing to go by from this machine

    view = chorus.open(lost)
    assert view.state == "crashed"
    assert [(r["state"], r["last_step"]) for r in view.ranks] == [("crashed", 41), ("crashed", 41)]
    assert "node-elsewhere" in view.ranks[0]["message"]
    assert "stopped renewing its lease" in view.record["error"]
    assert "last committed step 41" in view.record["error"] and f"chorus recover {lost}" in view.record["error"]
    assert view.record["end_time"] is not None  # its last renewal
    assert chorus.open(live).state == "running" and chorus.open(unleased).state == "running"
    assert {r.id: r.state for r in chorus.runs(runs_dir)} == {"lost": "crashed", "live": "running",
                                                            "unleased": "running"}
    # The file says what it said: only the reading changed.
    assert record(lost)["state"] == "running"


def test_a_run_whose_files_a_crash_cut_short_after_its_end_says_which_and_raises(runs_dir):
    with chorus.init(project="reader") as run:
        for s in range(50):
            run.log({"x": float(s)})
    view = chorus.open(run.dir)
    assert view.state == "finished" and view.record["files_cut"] is None
    assert len(view.history(pandas=False)) == 50
    # As a crash of the machine may leave it: the rows' last blocks never reached the disk.
    history = os.path.join(run.dir, "history.jsonl")
    size = os.path.getsize(history)
    os.truncate(history, size // 2)
    view = chorus.open(run.dir)
    assert view.state == "finished"  # the run did finish: its files are what is wrong
    cut = view.record["files_cut"]
    assert f"history.jsonl holds {size // 2} bytes, not the {size}" in cut and f"chorus recover {run.dir}" in cut
    assert cut in view.record["error"]
    for read in (lambda: view.history(), lambda: view.summary, lambda: view.events()):
        with pytest.raises(chorus.IoError, match="history.jsonl holds"):
            read()


HISTOGRAM_COLUMNS = ["_step", "rank", "count", "sum", "min", "max", "nan", "inf", "-inf", "buckets"]


def assert_row_is(row, want):
    """A histograms() row holds what chorus.Histogram `want` holds."""
    assert (row["count"], row["nan"], row["inf"], row["-inf"]) == (
        want.count, want.nan_count, want.pos_inf_count, want.neg_inf_count)
    assert row["sum"] == want.sum and row["min"] == want.min and row["max"] == want.max
    assert row["buckets"] == [tuple(b) for b in want.buckets()]


def test_histograms_read_back_as_logged(runs_dir):
    pd = pytest.importorskip("pandas")
    logged = [[0.5 * s, -1.25, 3.0, 0.0, 1e-3, 250.0 + s] + ([math.nan, math.inf, -math.inf] if s == 2 else [])
              for s in range(4)]
    with chorus.init(project="reader") as run:
        for s, values in enumerate(logged):
            run.log({"loss": float(s), "grad": chorus.Histogram(values)})
        run_dir = run.dir
    view = chorus.open(run_dir)
    assert view.histogram_keys() == ["grad"]
    h = view.histograms("grad")
    assert isinstance(h, pd.DataFrame) and list(h.columns) == HISTOGRAM_COLUMNS
    assert h["_step"].tolist() == [0, 1, 2, 3] and str(h["_step"].dtype) == "int64"
    assert str(h["count"].dtype) == "int64" and str(h["sum"].dtype) == "float64"
    for s, row in h.iterrows():
        assert row["rank"] is None  # a run of one rank
        assert_row_is(row, chorus.Histogram(logged[s]))
    assert h["inf"].tolist() == [0, 0, 1, 0]
    plain = view.histograms("grad", pandas=False)
    assert [r["_step"] for r in plain] == [0, 1, 2, 3] and list(plain[0]) == HISTOGRAM_COLUMNS
    assert_row_is(plain[2], chorus.Histogram(logged[2]))
    # A key the run has none of: no rows, the same columns.
    empty = view.histograms("loss")
    assert list(empty.columns) == HISTOGRAM_COLUMNS and len(empty) == 0 and view.histograms("x", pandas=False) == []
    # A run without histograms.jsonl.
    os.remove(os.path.join(run_dir, "histograms.jsonl"))
    assert view.histogram_keys() == [] and len(view.histograms("grad")) == 0


def test_histograms_of_a_job_merged_and_per_rank(runs_dir, tmp_path):
    from conftest import PYTHON, job_env, launch
    worker = tmp_path / "hist_worker.py"
    worker.write_text(
        "import chorus\n"
        "with chorus.init(project='reader', mode='shared') as run:\n"
        "    k = run.topology['rank']\n"
        "    run.define_metric('grad', reduce='merge')\n"
        "    for s in range(3):\n"
        "        run.log({'grad': chorus.Histogram([k + s, -k, 0.25 * s]), 'act': chorus.Histogram([k * 10.0 + s])})\n")
    p = launch(2, [PYTHON, str(worker)], env=job_env(runs_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    (d,) = run_dirs(runs_dir)
    view = chorus.open(d)
    assert sorted(view.histogram_keys()) == ["act", "grad"]
    grad = view.histograms("grad", pandas=False)
    assert [(r["_step"], r["rank"]) for r in grad] == [(0, None), (1, None), (2, None)]
    for r in grad:
        s = r["_step"]
        assert_row_is(r, chorus.Histogram([0 + s, 0, 0.25 * s, 1 + s, -1, 0.25 * s]))
    act = view.histograms("act", pandas=False)  # every rank's column of the key
    assert sorted((r["_step"], r["rank"]) for r in act) == [(s, k) for s in range(3) for k in range(2)]
    one = view.histograms("act/rank-1", pandas=False)  # the one column
    assert [(r["_step"], r["rank"]) for r in one] == [(0, 1), (1, 1), (2, 1)]
    for r in one:
        assert_row_is(r, chorus.Histogram([10.0 + r["_step"]]))
    assert view.histograms("act/rank-7", pandas=False) == []


def test_a_damaged_histogram_line_is_skipped_with_the_readers_words(runs_dir):
    d = hand_made_run(runs_dir, "hist", state="finished")
    good = {"_step": 0, "_timestamp": 1.0, "_runtime": 0.0, "key": "h", "rank": None, "count": 1, "sum": 1.0,
            "min": 1.0, "max": 1.0, "nan": 0, "inf": 0, "-inf": 0, "buckets": [[16129, 1]]}
    with open(os.path.join(d, "histograms.jsonl"), "w") as f:
        f.write(json.dumps(good) + "\n")
        f.write(json.dumps({**good, "_step": 1, "count": 2}) + "\n")  # its count is not its buckets'
        f.write(json.dumps({**good, "_step": 2}) + "\n")
    with pytest.warns(RuntimeWarning, match=r"1 damaged line\(s\) skipped, the first \(line 2\): a histograms.jsonl "
                                            r"line has a count that is not the sum"):
        rows = chorus.open(d).histograms("h", pandas=False)
    assert [r["_step"] for r in rows] == [0, 2] and rows[0]["buckets"] == [(1.0, 1.0078125, 1)]
