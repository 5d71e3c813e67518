"""The API a W&B script ports to by changing its import: chorus.run, chorus.log,
chorus.finish, chorus.config and chorus.summary; run.config and run.summary
as dicts; log's nested dicts, value kinds and commit=; define_metric's
summary and step_metric; init(id=); finish's signal and message; and values
refused with a trace. Each checked in the run's files, read with json."""

import argparse
import dataclasses
import json
import os
import signal
import subprocess

import pytest

import chorus
from conftest import PYTHON, record, rows, run_dirs

np = pytest.importorskip("numpy")


def one_run(runs_dir):
    (d,) = run_dirs(runs_dir)
    return d


def read_json(run_dir, name):
    with open(os.path.join(run_dir, name)) as f:
        return json.load(f)


def read_lines(run_dir, name):
    path = os.path.join(run_dir, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------
# chorus.run and the module's functions


def test_no_run_before_init_names_the_fix(runs_dir):
    assert chorus.run is None
    for call in (lambda: chorus.log({"a": 1.0}), lambda: chorus.finish(), lambda: chorus.define_metric("a"),
                 lambda: chorus.config.lr, lambda: chorus.config["lr"], lambda: chorus.summary.update({"a": 1}),
                 lambda: setattr(chorus.config, "lr", 0.1), lambda: "lr" in chorus.config):
        with pytest.raises(chorus.NoRun, match=r"call chorus\.init\(\) first"):
            call()
    assert isinstance(chorus.NoRun("x"), chorus.Error) and chorus.NoRun.code == "no_run"
    assert "no run" in repr(chorus.config)


def test_init_sets_chorus_run_and_finish_clears_it(runs_dir):
    run = chorus.init(project="wb", config={"lr": 0.1})
    assert chorus.run is run
    chorus.log({"loss": 1.0}).wait()
    chorus.log({"loss": 0.5}, step=4).wait()
    assert chorus.config.lr == 0.1 and chorus.config["lr"] == 0.1 and "lr" in chorus.config
    chorus.config.batch = 64
    chorus.summary["best"] = 0.5
    chorus.define_metric("loss", summary="min").wait()
    result = chorus.finish()
    assert isinstance(result, chorus.FinishResult) and result.state == "finished"
    assert chorus.run is None
    with pytest.raises(chorus.NoRun):
        chorus.log({"loss": 2.0})
    d = one_run(runs_dir)
    assert [(r["_step"], r["loss"]) for r in rows(d)] == [(0, 1.0), (4, 0.5)]
    assert read_json(d, "config.json") == {"lr": 0.1, "batch": 64}
    assert read_json(d, "summary.json")["best"] == 0.5

    # run.finish() clears chorus.run as well, and a second run takes its place.
    first = chorus.init(project="wb")
    second = chorus.init(project="wb")
    assert chorus.run is second
    first.finish().wait()
    assert chorus.run is second
    second.finish().wait()
    assert chorus.run is None


def test_init_id_is_run_id(runs_dir):
    with chorus.init(project="wb", id="fixed-id-1") as run:
        assert run.id == "fixed-id-1"
    with chorus.init(project="wb", id="fixed-id-2", run_id="fixed-id-2") as run:
        assert run.id == "fixed-id-2"
    with pytest.raises(chorus.InvalidArgument, match="give one of them"):
        chorus.init(project="wb", id="a", run_id="b")
    assert sorted(record(d)["id"] for d in run_dirs(runs_dir)) == ["fixed-id-1", "fixed-id-2"]


# ---------------------------------------------------------------------------
# run.config and run.summary


def test_config_is_a_dict_with_attributes(runs_dir):
    with chorus.init(project="wb", config={"lr": 1e-3, "opt": {"name": "adam", "betas": (0.9, 0.99)}}) as run:
        c = run.config
        assert c.lr == 1e-3 and c["lr"] == 1e-3 and c["opt.name"] == "adam" and c["opt.betas"] == (0.9, 0.99)
        assert "lr" in c and "opt" not in c and len(c) == 3 and list(c) == ["lr", "opt.name", "opt.betas"]
        assert c.get("missing", 7) == 7
        with pytest.raises(AttributeError, match=r"run.config\['opt.<key>'\]"):
            c.opt
        with pytest.raises(AttributeError, match="no key 'nope'"):
            c.nope
        assert not hasattr(c, "nope")
        with pytest.raises(KeyError):
            c["nope"]
        c.batch = 32
        c["epochs"] = 3
        assert c.update({"sched": {"kind": "cosine"}}, allow_val_change=True) is not None
        t = c({"old_style": True})  # the method run.config was: a ticket
        assert isinstance(t, chorus.Ticket)
        t.wait()
        c.lr = 5e-4  # a key set again takes its new value
        assert c.setdefaults({"lr": 1.0, "seed": 0}) is not None and c.lr == 5e-4 and c.seed == 0
        assert c.as_dict() == dict(c) == {"lr": 5e-4, "opt.name": "adam", "opt.betas": (0.9, 0.99), "batch": 32,
                                          "epochs": 3, "sched.kind": "cosine", "old_style": True, "seed": 0}
        assert sorted(c.keys()) == sorted(c.as_dict()) and 32 in c.values() and ("epochs", 3) in c.items()
        assert c == c.as_dict()
        import copy
        import pickle
        assert pickle.loads(pickle.dumps(c)) == copy.copy(c) == c.as_dict()  # a snapshot, as a dict
        with pytest.raises(TypeError, match="set 'lr' to None"):
            del c["lr"]
        with pytest.raises(chorus.InvalidArgument, match="dict"):
            c.update(["lr", 1])
        assert c.lr == 5e-4, "a refused update changes nothing"
    assert read_json(one_run(runs_dir), "config.json") == {
        "lr": 5e-4, "opt.name": "adam", "opt.betas": "[0.9, 0.99]", "batch": 32, "epochs": 3,
        "sched.kind": "cosine", "old_style": True, "seed": 0}


@dataclasses.dataclass
class Optim:
    name: str = "sgd"
    lr: float = 0.1


@dataclasses.dataclass
class Train:
    epochs: int = 2
    optim: Optim = dataclasses.field(default_factory=Optim)


def test_config_from_a_namespace_or_a_dataclass(runs_dir):
    args = argparse.Namespace(lr=0.01, batch=16, model=argparse.Namespace(depth=4))
    with chorus.init(project="wb", config=args) as run:
        assert run.config.lr == 0.01 and run.config["model.depth"] == 4
        run.config.update(Train())
        assert run.config["optim.name"] == "sgd" and run.config.epochs == 2
        with pytest.raises(chorus.InvalidArgument, match="Namespace or a dataclass"):
            run.config.update(Train)  # the class, not an instance
    assert read_json(one_run(runs_dir), "config.json") == {"lr": 0.01, "batch": 16, "model.depth": 4, "epochs": 2,
                                                          "optim.name": "sgd", "optim.lr": 0.1}


def test_summary_is_a_dict(runs_dir):
    with chorus.init(project="wb") as run:
        run.log({"loss": 2.0}).wait()
        run.summary["best"] = 0.25
        run.summary.update({"note": "ok", "nested": {"x": 1}})
        run.summary.final = 3
        assert run.summary.best == 0.25 and run.summary["nested.x"] == 1 and len(run.summary) == 4
        run.summary({"old_style": 1}).wait()
        assert "loss" not in run.summary  # a metric's own summary is the run host's
    s = read_json(one_run(runs_dir), "summary.json")
    assert (s["best"], s["note"], s["nested.x"], s["final"], s["old_style"], s["loss"]) == (0.25, "ok", 1, 3, 1, 2.0)


# ---------------------------------------------------------------------------
# log


def test_the_plain_log_call_is_the_native_method(runs_dir):
    # run.log without commit= stays the native vectorcall: no Python frame on the hot path.
    assert chorus.Run.log is chorus._chorus.Run.__dict__["log"]
    assert type(chorus._chorus.Run.__dict__["log"]).__name__ == "method_descriptor"


def test_value_kinds_and_nested_dicts(runs_dir):
    torch = pytest.importorskip("torch")
    with chorus.init(project="wb") as run:
        grad = torch.tensor(2.0, requires_grad=True) * 3
        run.log({"i": 3, "f": 0.25, "b": True, "bf": False, "np_i8": np.int8(-4), "np_u64": np.uint64(9),
                 "np_f16": np.float16(0.5), "np_f32": np.float32(1.5), "np_f64": np.float64(-2.5),
                 "np_bool": np.bool_(True), "np_0d": np.array(4.5), "np_0d_i": np.array(7, dtype=np.int32),
                 "np_1": np.array([8.0]), "t_0d": torch.tensor(0.5), "t_1": torch.tensor([1.25]),
                 "t_i": torch.tensor(11), "t_bf16": torch.tensor(3.0, dtype=torch.bfloat16),
                 "t_bool": torch.tensor(True), "t_grad": grad, "param": torch.nn.Parameter(torch.tensor(6.0)),
                 "train": {"loss": 1.0, "acc": np.float32(0.75), "deep": {"x": torch.tensor(2.0)}}}).wait()
        run.log({"train": {"loss": 0.5}, "val/loss": 0.7}).wait()
        t = run.log({"train": {"bad": "text", "fine": 1.0}, "deep": {5: 1.0}})
        with pytest.raises(chorus.InvalidArgument) as e:
            t.wait()
        assert '"train/bad" is a str' in str(e.value) and "2 values were refused" in str(e.value)
    h = rows(one_run(runs_dir))
    assert h[0] == {**h[0], "i": 3, "f": 0.25, "b": 1, "bf": 0, "np_i8": -4, "np_u64": 9, "np_f16": 0.5,
                    "np_f32": 1.5, "np_f64": -2.5, "np_bool": 1, "np_0d": 4.5, "np_0d_i": 7, "np_1": 8.0,
                    "t_0d": 0.5, "t_1": 1.25, "t_i": 11, "t_bf16": 3.0, "t_bool": 1, "t_grad": 6.0, "param": 6.0,
                    "train/loss": 1.0, "train/acc": 0.75, "train/deep/x": 2.0}
    assert "train" not in h[0]
    assert h[1] == {**h[1], "train/loss": 0.5, "val/loss": 0.7}
    assert h[2]["train/fine"] == 1.0 and "train/bad" not in h[2] and not any(k.startswith("deep") for k in h[2])


def test_commit_false_gathers_a_step(runs_dir):
    with chorus.init(project="wb") as run:
        assert run.log({"a": 1.0, "train": {"x": 1.0}}, commit=False) is None
        assert run.log({"a": 2.0, "b": 3.0}, commit=False) is None  # a later value replaces an earlier one
        assert run.log({"train": {"y": 4.0}}, None, False) is None  # commit as the third argument
        run.log({"c": 5.0}).wait()                                 # commits them with its own values: step 0
        run.log({"d": 6.0}, commit=True).wait()                    # step 1
        run.log({"e": 7.0}, commit=False)
        run.log({"at": 1.0}, step=10, commit=False).wait()         # a step: logged at once, at 10
        run.log({"f": 8.0}).wait()                                 # e waited: 11, with f
        chorus.log({"g": 9.0}, commit=False)
        chorus.log({"h": 10.0}, commit=None).wait()                # None commits, as left out: 12
        run.log({"i": 11.0}, commit=False)
        assert run.log({}).wait() is None                          # an empty call commits them: 13
        run.log({"last": 12.0}, commit=False)                      # finish logs what still waits: 14
        with pytest.raises(chorus.InvalidArgument, match="dict"):
            run.log([1.0], commit=False)
    h = rows(one_run(runs_dir))
    strip = [{k: v for k, v in r.items() if not k.startswith("_") or k == "_step"} for r in h]
    assert strip == [{"_step": 0, "a": 2.0, "b": 3.0, "train/x": 1.0, "train/y": 4.0, "c": 5.0},
                     {"_step": 1, "d": 6.0}, {"_step": 10, "at": 1.0}, {"_step": 11, "e": 7.0, "f": 8.0},
                     {"_step": 12, "g": 9.0, "h": 10.0}, {"_step": 13, "i": 11.0}, {"_step": 14, "last": 12.0}]


def test_commit_false_values_are_logged_at_exit(runs_dir, tmp_path):
    script = tmp_path / "pending.py"
    script.write_text("import chorus\nrun = chorus.init(project='wb')\nrun.log({'a': 1.0})\n"
                      "run.log({'kept': 2.0}, commit=False)\n")
    p = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = one_run(runs_dir)
    assert [r.get("kept") for r in rows(d)] == [None, 2.0] and record(d)["state"] == "finished"


# ---------------------------------------------------------------------------
# define_metric


def test_define_metric_summary_and_step_metric(runs_dir):
    with chorus.init(project="wb") as run:
        run.define_metric("epoch").wait()
        run.define_metric("loss", summary="min", step_metric="epoch").wait()
        run.define_metric("acc", "mean", summary="max").wait()  # reduce as the second argument, as before
        run.define_metric("lr", reduce="first").wait()
        run.define_metric("loss", reduce="mean").wait()  # what it leaves unset stays as declared
        for bad, match in ((dict(summary="median"), "last, min, max or mean"), (dict(reduce="median"), "first"),
                           (dict(summary=3), "give a str")):
            with pytest.raises(chorus.InvalidArgument, match=match):
                run.define_metric("x", **bad)
        for s, loss in enumerate([3.0, 1.0, 2.0]):
            run.log({"loss": loss, "acc": 0.1 * (s + 1), "lr": 0.5, "epoch": s}).wait()
    d = one_run(runs_dir)
    summary = read_json(d, "summary.json")
    assert summary["loss"] == 1.0 and summary["acc"] == pytest.approx(0.3) and summary["lr"] == 0.5
    metrics = read_json(d, "metrics.json")
    assert metrics["loss"] == {"reduce": "mean", "summary": "min", "step_metric": "epoch"}
    assert metrics["acc"] == {"reduce": "mean", "summary": "max", "step_metric": None}
    assert metrics["lr"]["reduce"] == "first"


# ---------------------------------------------------------------------------
# How a rank ends


def rank0(run_dir):
    (r,) = record(run_dir)["ranks"]
    return r


@pytest.mark.parametrize("how, state, words", [
    (dict(exit_code=2, message="ValueError: the data ran out"), "failed", ["exit code 2", "ValueError: the data ran out"]),
    (dict(signal=signal.SIGTERM), "killed", ["SIGTERM"]),
    (dict(signal=signal.SIGUSR1, message="preempted"), "killed", ["SIGUSR1", "preempted"]),
    (dict(exit_code=None), "finished", []),
])
def test_finish_takes_a_signal_and_a_message(runs_dir, how, state, words):
    run = chorus.init(project="wb")
    run.log({"a": 1.0}).wait()
    result = run.finish(**how).wait()
    assert result.state == state
    rec = record(one_run(runs_dir))
    assert rec["state"] == state and rank0(one_run(runs_dir))["state"] == state
    for w in words:
        assert w in rank0(one_run(runs_dir))["message"], rec


def test_finish_checks_its_arguments(runs_dir):
    with chorus.init(project="wb") as run:
        with pytest.raises(chorus.InvalidArgument, match="signal 99"):
            run.finish(signal=99)
        with pytest.raises(chorus.InvalidArgument, match="exit_code"):
            run.finish(exit_code="no")
        with pytest.raises(TypeError):
            run.finish(0, 15)  # signal is keyword-only
        assert run  # none of these finished it


class Boom(Exception):
    pass


@pytest.mark.parametrize("raised, state, words", [
    (ValueError("bad batch"), "failed", ["exit code 1", "ValueError: bad batch"]),
    (Boom(), "failed", ["exit code 1", "test_wandb_api.Boom"]),
    (KeyboardInterrupt(), "killed", ["SIGINT"]),
    (SystemExit(3), "failed", ["exit code 3"]),
    (SystemExit("no data"), "failed", ["exit code 1", "no data"]),
    (SystemExit(0), "finished", []),
    (SystemExit(None), "finished", []),
])
def test_the_with_block_ends_the_rank_as_the_exception_says(runs_dir, raised, state, words):
    with pytest.raises(type(raised)):
        with chorus.init(project="wb") as run:
            run.log({"a": 1.0})
            raise raised
    d = one_run(runs_dir)
    assert record(d)["state"] == state and rank0(d)["state"] == state
    for w in words:
        assert w in rank0(d)["message"], record(d)
    assert chorus.run is None


def run_script(tmp_path, text, env=None):
    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=180, env=env)


def test_an_uncaught_exception_fails_the_run_with_its_text(runs_dir, tmp_path):
    p = run_script(tmp_path, "import chorus\nrun = chorus.init(project='wb')\nrun.log({'a': 1.0})\n"
                             "raise RuntimeError('out of memory at step 3')\n")
    assert p.returncode == 1 and "RuntimeError: out of memory at step 3" in p.stderr, p.stderr
    d = one_run(runs_dir)
    assert record(d)["state"] == "failed" and rank0(d)["state"] == "failed"
    assert "RuntimeError: out of memory at step 3" in rank0(d)["message"], record(d)


def test_the_exception_hook_chains_to_the_one_before(runs_dir, tmp_path):
    # A hook installed before chorus is imported still runs (first); one
    # installed after chorus that chains to it reaches chorus's too.
    p = run_script(tmp_path, "import sys\n"
                             "def mine(t, e, tb):\n    print('MINE', t.__name__, flush=True)\n"
                             "sys.excepthook = mine\n"
                             "import chorus\n"
                             "assert sys.excepthook is not mine and sys.excepthook.previous is mine\n"
                             "run = chorus.init(project='wb')\n"
                             "raise KeyError('k')\n")
    assert p.returncode == 1 and "MINE KeyError" in p.stdout and "Traceback" not in p.stderr, p.stdout + p.stderr
    d = one_run(runs_dir)
    assert rank0(d)["state"] == "failed" and "KeyError: 'k'" in rank0(d)["message"]


def test_an_interactive_interpreter_keeps_its_run_after_an_exception(runs_dir, tmp_path):
    # The REPL (sys.ps1) goes on after an uncaught exception: the run must too.
    p = subprocess.run([PYTHON, "-i", "-q"], input="import chorus\nrun = chorus.init(project='wb')\n1/0\n"
                       "run.log({'after': 1.0}).wait()\nprint('STATE', run.finish().wait().state)\n",
                       capture_output=True, text=True, timeout=120)
    assert "ZeroDivisionError" in p.stderr and "STATE finished" in p.stdout, p.stdout + p.stderr
    assert rows(one_run(runs_dir))[-1]["after"] == 1.0


def test_uncaught_ctrl_c_kills_the_run(runs_dir, tmp_path):
    p = run_script(tmp_path, "import chorus\nrun = chorus.init(project='wb')\nrun.log({'a': 1.0})\n"
                             "raise KeyboardInterrupt\n")
    assert p.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (p.returncode, p.stderr)
    d = one_run(runs_dir)
    assert rank0(d)["state"] == "killed" and "SIGINT" in rank0(d)["message"], record(d)


# ---------------------------------------------------------------------------
# Refused values leave a trace


def test_refused_values_are_in_rejected_jsonl_once_warned(runs_dir, capfd):
    with chorus.init(project="wb") as run:
        # Tickets dropped: nobody waits, the trace is left all the same.
        run.log({"ok_r": 1.0, "bad_r": "a string"})
        run.log({"": 3.0, "fine_r": 2.0})
        run.log({5: 1.0})
        run.log({"none_r": None, "list_r": [1, 2]}, step=7)
        run.log({"bad_r": "again"})  # the same key again: recorded, not warned again
        run.log({"huge_r": 10**400})
        run.log({"ok_r": 2.0}).wait()
    d = one_run(runs_dir)
    lines = read_lines(d, "rejected.jsonl")
    values = {}
    for line in lines:
        assert line["error"] in ("invalid_argument", "invalid_key") and line["message"] and line["rank"] == 0
        for k, v in line["values"].items():
            values.setdefault(k, []).append((v, line["message"], line["step"]))
    assert [v for v, _, _ in values["bad_r"]] == ["'a string'", "'again'"]
    assert "not a number" in values["bad_r"][0][1] and '"bad_r"' in values["bad_r"][0][1]
    assert values[""][0][0] == 3.0
    assert values["5"][0][0] == 1.0 and "keys are str" in values["5"][0][1]
    assert values["none_r"][0][0] is None and values["none_r"][0][2] == 7
    assert values["list_r"][0][0] == "[1, 2]"
    assert values["huge_r"][0][0] == "1" + "0" * 199  # its repr, cut to 200 characters
    assert record(d)["rejected"] == sum(len(v) for v in values.values()) == 7
    err = capfd.readouterr().err
    for key in ('"bad_r"', '"none_r"', '"list_r"', "the key 5", '"huge_r"'):
        assert err.count(key) == 1, (key, err)
    assert "'again'" not in err
    h = rows(d)
    assert h[0]["ok_r"] == 1.0 and h[1]["fine_r"] == 2.0


def test_a_refusal_names_its_fix_in_the_warning(runs_dir, capfd):
    with chorus.init(project="wb") as run:
        run.log({"warned_once": object()})
    err = capfd.readouterr().err
    assert '"warned_once" is a object' in err and "log int, float" in err and "rejected.jsonl" in err, err


def test_sys_exit_without_a_with_block_fails_the_run(runs_dir, tmp_path):
    # sys.exit(3) without a with-block: the run ends failed with the code
    # (the C++ core sees the exit status; Python's finalization does not finish it).
    p = run_script(tmp_path, "import sys, chorus\nrun = chorus.init(project='wb')\nrun.log({'a': 1.0})\nsys.exit(3)\n")
    assert p.returncode == 3, p.stderr
    d = one_run(runs_dir)
    assert record(d)["state"] == "failed" and rank0(d)["state"] == "failed", record(d)
    assert "exit code 3" in rank0(d)["message"] or "exit code 3" in (record(d).get("error") or ""), record(d)
