"""The three ways to track a distributed job (samples/python/ddp_rank0_only.py,
ddp_run_per_rank.py, ddp_shared_run.py: W&B scripts that import chorus),
each run under torchrun on 4 CPU ranks (gloo) and its run directories
checked value by value: the steps, the epochs, the learning rate schedule,
the sample counts, validation accuracy at each epoch's last step (logged
with commit=False), config, the loss summary (summary="min"), and each
rank's last loss as the rank printed it."""

import json
import os
import re

import pytest

from conftest import job_env, record, rows, run_dirs, torchrun

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "samples", "python")
EPOCHS, STEPS, BATCH, LR = 2, 6, 8, 0.1
ARGS = ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch", str(BATCH), "--lr", str(LR),
        "--project", "strategies"]


@pytest.fixture(autouse=True)
def needs_torch():
    pytest.importorskip("torch")


def run_sample(name, runs_dir, tmp_path, *extra):
    p = torchrun(4, [os.path.join(SAMPLES, name), *ARGS, *extra], job_env(runs_dir, OMP_NUM_THREADS=1), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    # "[default2]:rank 2 final train/loss 0.8120..." (the float's repr: exact)
    final = {int(m.group(1)): float(m.group(2))
             for m in re.finditer(r"rank (\d) final train/loss (\S+)", p.stdout)}
    return p, final


def read(run_dir, name):
    with open(os.path.join(run_dir, name)) as f:
        return json.load(f)


def check_history(h, column, world, final_loss):
    """One row a step, every step's values exact, the loss's last value as printed."""
    assert [r["_step"] for r in h] == list(range(EPOCHS * STEPS))
    for r in h:
        s = r["_step"]
        epoch, i = divmod(s, STEPS)
        assert r[column("epoch")] == epoch
        assert r[column("lr")] == LR * 0.5 ** epoch  # StepLR(gamma=0.5) each epoch: exact in binary
        assert r[column("samples")] == (s + 1) * BATCH * world
        assert isinstance(r[column("train/loss")], float) and r[column("train/loss")] > 0
        if i == STEPS - 1:  # commit=False put it in the step's row
            assert 0 <= r[column("val/accuracy")] <= 1
        else:
            assert column("val/accuracy") not in r
    assert h[-1][column("train/loss")] == final_loss


def check_config(run_dir):
    config = read(run_dir, "config.json")
    assert (config["epochs"], config["steps_per_epoch"], config["batch"], config["lr"], config["project"]) == (
        EPOCHS, STEPS, BATCH, LR, "strategies")


def test_rank0_only(runs_dir, tmp_path):
    p, final = run_sample("ddp_rank0_only.py", runs_dir, tmp_path)
    (d,) = run_dirs(runs_dir)  # the other ranks made no run
    rec = record(d)
    assert rec["state"] == "finished" and rec["mode"] == "auto" and rec["launcher"] == "torchrun"
    assert rec["world_size"] == 1 and [r["rank"] for r in rec["ranks"]] == [0]
    assert list(final) == [0]
    h = rows(d)
    # rank 0 counts every rank's samples (world 4); its loss is its own shard's.
    check_history(h, lambda k: k, 4, final[0])
    check_config(d)
    summary = read(d, "summary.json")
    assert summary["train/loss"] == min(r["train/loss"] for r in h)  # define_metric(summary="min")
    assert summary["final/train_loss"] == final[0]


def test_a_run_per_rank_in_a_group(runs_dir, tmp_path):
    p, final = run_sample("ddp_run_per_rank.py", runs_dir, tmp_path, "--group", "ddp-job")
    dirs = run_dirs(runs_dir)
    assert len(dirs) == 4 and sorted(final) == [0, 1, 2, 3]
    by_rank = {}
    for d in dirs:
        rec = record(d)
        assert rec["state"] == "finished" and rec["mode"] == "new" and rec["group"] == "ddp-job"
        assert os.path.basename(os.path.dirname(d)) == "ddp-job"  # the runs side by side in the group's directory
        (r,) = rec["ranks"]
        by_rank[rec["name"]] = d
        rank = int(re.search(r"rank-(\d)", rec["name"]).group(1))
        h = rows(d)
        check_history(h, lambda k: k, 1, final[rank])
        check_config(d)
        assert read(d, "summary.json")["train/loss"] == min(x["train/loss"] for x in h)
    assert len(by_rank) == 4


def test_one_shared_run(runs_dir, tmp_path):
    p, final = run_sample("ddp_shared_run.py", runs_dir, tmp_path)
    (d,) = run_dirs(runs_dir)
    rec = record(d)
    assert rec["state"] == "finished" and rec["mode"] == "shared" and rec["world_size"] == 4
    assert sorted(r["rank"] for r in rec["ranks"]) == [0, 1, 2, 3]
    assert all(r["state"] == "finished" and r["last_step"] == EPOCHS * STEPS - 1 for r in rec["ranks"])
    h = rows(d)
    for rank in range(4):
        # Without a reduction, each rank's values are a column of their own.
        check_history(h, lambda k: f"{k}/rank-{rank}", 1, final[rank])
    check_config(d)
