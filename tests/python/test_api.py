"""chorus's Python API in one process: values, errors, tickets, asyncio,
threads, writers, the context manager and the environment."""

import asyncio
import math
import os
import threading

import pytest

import chorus
from conftest import record, rows, run_dirs

np = pytest.importorskip("numpy")


def one_run(runs_dir):
    (d,) = run_dirs(runs_dir)
    return d


def test_values_of_every_kind_land_once(runs_dir):
    with chorus.init(project="api") as run:
        assert run and run.is_host and run.topology["world_size"] == 1
        run.log({"f": 0.25, "i": 3, "b": True, "np32": np.float32(1.5), "np64": np.float64(-2.5),
                 "npi": np.int64(7), "nan": float("nan"), "inf": float("inf")}).wait()
        run.log({"f": 0.5}, step=5).wait()
        run.log({"f": 0.75}).wait()  # the automatic step follows the last one
    h = rows(one_run(runs_dir))
    assert [r["_step"] for r in h] == [0, 5, 6]
    first = h[0]
    assert (first["f"], first["i"], first["b"], first["np32"], first["np64"], first["npi"]) == (0.25, 3, 1, 1.5, -2.5, 7)
    assert first["nan"] == "NaN" and first["inf"] == "Infinity"
    assert [r["f"] for r in h] == [0.25, 0.5, 0.75]


def test_cpu_tensors_are_values(runs_dir):
    torch = pytest.importorskip("torch")
    with chorus.init(project="api") as run:
        run.log({"t0": torch.tensor(0.5), "t1": torch.tensor([2.0]), "half": torch.tensor(1.0, dtype=torch.float16)}).wait()
        with pytest.raises(chorus.InvalidArgument, match="'many'.*not one number|\"many\".*not one number"):
            run.log({"many": torch.ones(3), "ok": 1.0}).wait()
    h = rows(one_run(runs_dir))
    assert h[0] == {**h[0], "t0": 0.5, "t1": 2.0, "half": 1.0}
    assert h[1]["ok"] == 1.0 and "many" not in h[1]


def test_a_bad_value_is_refused_and_the_rest_logged(runs_dir):
    with chorus.init(project="api") as run:
        t = run.log({"good": 1.0, "text": "0.5", "none": None, "list": [1], 7: 2.0, "also": 2.0})
        with pytest.raises(chorus.InvalidArgument) as e:
            t.wait()
        assert "4 values were refused" in str(e.value) and "the call's 2 other values were logged" in str(e.value)
        assert isinstance(e.value, ValueError) and e.value.code == "invalid_argument"
        assert isinstance(t.error(), chorus.InvalidArgument)
        # a bad key: chorus's own check, as in C++
        with pytest.raises(chorus.InvalidKey, match="_step"):
            run.log({"_step": 1.0, "fine": 3.0}).wait()
        with pytest.raises(chorus.InvalidKey):
            run.log({"": 1.0}).wait()
        with pytest.raises(chorus.InvalidKey):
            run.log({"k" * 100000: 1.0}).wait()
        with pytest.raises(chorus.InvalidArgument, match="UTF-8"):
            run.log({"\udcff": 1.0, "x": 1.0}).wait()
    h = rows(one_run(runs_dir))
    assert h[0]["good"] == 1.0 and h[0]["also"] == 2.0 and "text" not in h[0]
    assert h[1]["fine"] == 3.0 and "_step" in h[1]
    assert h[-1]["x"] == 1.0


def test_steps(runs_dir):
    with chorus.init(project="api") as run:
        run.log({"a": 1}, step=10).wait()
        with pytest.raises(chorus.BackwardsStep, match="lower than its last step 10"):
            run.log({"a": 2}, step=3).wait()
        for bad in (-1, 2**63, 1.5, "7"):
            with pytest.raises(chorus.InvalidArgument, match="step"):
                run.log({"a": 3}, step=bad)
        run.log({"a": 4}, step=np.int64(11)).wait()
    assert [r["_step"] for r in rows(one_run(runs_dir))] == [10, 11]


def test_config_summary_define_metric(runs_dir):
    with chorus.init(project="api", config={"lr": 1e-3, "opt": {"name": "adam", "betas": (0.9, 0.99)},
                                            "layers": 4, "big": 2**70, "flag": False, "none": None}) as run:
        run.config({"batch": 32}).wait()
        run.summary({"best": 0.5, "note": "ok"}).wait()
        run.define_metric("loss", "mean").wait()
        with pytest.raises(chorus.InvalidArgument, match="mean, sum, min, max or first"):
            run.define_metric("loss", "median")
        with pytest.raises(chorus.InvalidArgument, match="dict"):
            run.config(["lr", 1])
        run.log({"loss": 2.0}).wait()
    view = chorus.open(one_run(runs_dir))
    assert view.config == {"lr": 1e-3, "opt.name": "adam", "opt.betas": "[0.9, 0.99]", "layers": 4,
                           "big": str(2**70), "flag": False, "none": None, "batch": 32}
    assert view.summary["best"] == 0.5 and view.summary["note"] == "ok" and view.summary["loss"] == 2.0


def test_options_are_checked(runs_dir, monkeypatch):
    with pytest.raises(chorus.InvalidArgument, match="auto.*shared.*new"):
        chorus.init(project="api", mode="everyone")
    with pytest.raises(chorus.InvalidArgument, match="init_timeout"):
        chorus.init(project="api", init_timeout=-1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        chorus.Run(project="api", colour="red")
    monkeypatch.setenv("CHORUS_MODE", "everyone")
    with pytest.raises(chorus.BadEnvironment, match="CHORUS_MODE"):
        chorus.init(project="api")
    monkeypatch.setenv("CHORUS_MODE", "shared")
    monkeypatch.setenv("WORLD_SIZE", "two")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(chorus.BadEnvironment, match="WORLD_SIZE"):
        chorus.init(project="api")
    assert not os.path.exists(runs_dir) or run_dirs(runs_dir) == []


def test_tickets_wait_and_await(runs_dir):
    run = chorus.init(project="api")
    t = run.log({"a": 1.0})
    t.wait(timeout=30)
    assert t.ready and t.error() is None

    async def main():
        await run.log({"a": 2.0})
        await run.barrier("one")
        await asyncio.gather(*(run.log({"b": float(i)}) for i in range(100)))
        with pytest.raises(chorus.BackwardsStep):
            await run.log({"a": 3.0}, step=0)
        return await run.finish()

    result = asyncio.run(main())
    assert result.ok and result.state == "finished" and result.rows == 102
    assert run.finish().wait().state == "finished"  # a second finish gives the same result
    with pytest.raises(chorus.Finished):
        run.log({"late": 1.0}).wait()


def test_threads_log_at_once(runs_dir):
    per_thread, threads = 2000, 8
    with chorus.init(project="api") as run:
        def work(t, w):
            with w:
                for s in range(per_thread):
                    w.log({f"w{t}": float(s)}, step=s)

        # Every writer is made before any logs: a writer joins at the last committed step.
        writers = [run.writer() for _ in range(threads)]
        ts = [threading.Thread(target=work, args=(t, writers[t])) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    h = rows(one_run(runs_dir))
    assert len(h) == per_thread
    for t in range(threads):
        assert [r[f"w{t}"] for r in h] == [float(s) for s in range(per_thread)]


def test_the_context_manager_marks_a_failure(runs_dir):
    with pytest.raises(ZeroDivisionError):
        with chorus.init(project="api") as run:
            run.log({"a": 1.0})
            1 / 0
    rec = record(one_run(runs_dir))
    assert rec["state"] == "failed"
    assert "exit code 1" in rec["ranks"][0]["message"]


def test_artifacts(runs_dir, tmp_path):
    f = tmp_path / "model.pt"
    f.write_bytes(b"weights" * 1000)
    with chorus.init(project="api") as run:
        run.log_artifact("ckpt/model.pt", f, type="model").wait()
        with pytest.raises(chorus.InvalidArgument):
            run.log_artifact("../escape", f).wait()
        with pytest.raises(chorus.Error, match="missing"):
            run.log_artifact("gone", tmp_path / "missing").wait()
    view = chorus.open(one_run(runs_dir))
    (a,) = view.artifacts()
    assert a["name"] == "ckpt/model.pt" and a["size"] == 7000 and a["type"] == "model"
    assert len(a["sha256"]) == 64 and a["rank"] == 0 and a["timestamp"] > 1.7e9
    # A damaged line is skipped with a warning; a name logged again replaces its entry.
    with open(os.path.join(view.path, "artifacts.jsonl"), "a") as f:
        f.write('{"type": "model"}\n{"name": "ckpt/model.pt", "type": "best", "size": 1}\n')
    with pytest.warns(RuntimeWarning, match=r"1 damaged line\(s\) skipped, the first \(line 2\): no name"):
        (b,) = view.artifacts()
    assert (b["type"], b["size"], b["sha256"], b["step"]) == ("best", 1, "", -1)
    assert (open(os.path.join(view.path, "artifacts", "ckpt", "model.pt"), "rb").read()) == b"weights" * 1000


def test_nan_step_and_cuda_without_a_gpu(runs_dir):
    class FakeCuda:
        """A CUDA array as the interface describes it, at an address no GPU has."""
        __cuda_array_interface__ = {"data": (8, False), "shape": (), "typestr": "<f4", "version": 3, "stream": None}

    with chorus.init(project="api") as run:
        t = run.log({"dev": FakeCuda(), "host": 1.0})
        with pytest.raises(chorus.Error) as e:
            t.wait()
        assert "CUDA" in str(e.value) or "cuda" in str(e.value)
        run.log({"after": 2.0}).wait()
    assert rows(one_run(runs_dir))[-1]["after"] == 2.0


def test_a_forked_child_logs_nothing_and_exits(runs_dir):
    # A DataLoader worker forked from the trainer: its copy of the run is
    # inactive there, its calls do nothing, and its exit does not hang.
    with chorus.init(project="api") as run:
        run.log({"a": 1.0}).wait()
        pid = os.fork()
        if pid == 0:
            code = 0 if (not run and run.log({"child": 1.0}).ready and run.finish().wait().state == "inactive") else 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        run.log({"a": 2.0}).wait()
    h = rows(one_run(runs_dir))
    assert [r["a"] for r in h] == [1.0, 2.0] and all("child" not in r for r in h)
