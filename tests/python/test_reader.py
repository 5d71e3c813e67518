"""chorus.open and chorus.runs: identity, ranks, config, summary and
history, as pandas or plain rows, and what damaged files do."""

import json
import math
import os
import time
import warnings

import pytest

import chorus
from conftest import run_dirs


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
    with pytest.raises(chorus.IoError, match="config.json is not valid JSON"):
        chorus.open(d).config
    os.remove(os.path.join(d, "summary.json"))
    assert chorus.open(d).summary == {}


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
