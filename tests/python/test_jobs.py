"""Jobs of real processes logging into one shared run: Python ranks under
`chorus launch`, Python and C++ ranks together, a Python rank SIGKILLed,
a PyTorch DDP job under torchrun, and ranks that exit cleanly while rank
0's exit is slow. Every value is checked once, and every reduction exactly,
reading history.jsonl with json."""

import os
import re
import signal
import subprocess
import time

import pytest

from conftest import BIN, HERE, PYTHON, free_port, job_env, launch, record, rows, run_dirs, torchrun

WORKER = os.path.join(HERE, "rank_worker.py")
SOURCE = os.path.dirname(os.path.dirname(HERE))


def check_shared_run(run_dir, ranks, steps, dead=None, dead_after=None):
    """Every rank's values at every step once; the reductions exact. A `dead`
    rank's values stop after `dead_after`; the others' never do."""
    h = rows(run_dir)
    assert [r["_step"] for r in h] == list(range(steps)), "each step once, in order"
    for r in h:
        s = r["_step"]
        alive = [k for k in range(ranks) if k != dead or (dead_after is not None and s <= dead_after and f"r/rank-{k}" in r)]
        for k in range(ranks):
            if k != dead:
                assert r[f"r/rank-{k}"] == k * 100000 + s
        if dead is not None and s > dead_after:
            assert f"r/rank-{dead}" not in r
        assert r["_count"]["loss"] == len(alive) and r["_count"]["tokens"] == len(alive)
        assert r["loss"] == sum(k + s for k in alive) / len(alive)
        assert r["tokens"] == sum(k + 1 for k in alive)


def the_run(runs_dir):
    (d,) = run_dirs(runs_dir)
    return d


def test_four_python_ranks_share_a_run(runs_dir):
    p = launch(4, [PYTHON, WORKER], env=job_env(runs_dir, STEPS=200))
    assert p.returncode == 0, p.stdout + p.stderr
    d = the_run(runs_dir)
    rec = record(d)
    assert rec["state"] == "finished" and rec["mode"] == "shared" and rec["world_size"] == 4
    assert sorted(r["rank"] for r in rec["ranks"]) == [0, 1, 2, 3]
    assert all(r["state"] == "finished" and r["last_step"] == 199 for r in rec["ranks"])
    check_shared_run(d, 4, 200)


def test_python_and_cxx_ranks_share_a_run(runs_dir):
    cxx = os.path.join(BIN, "..", "tests", "python", "cxx_rank")
    cxx = os.path.normpath(cxx)
    assert os.access(cxx, os.X_OK), cxx
    # Ranks 0 and 1 run Python, 2 and 3 C++: the same job, one run.
    script = f'if [ "$RANK" -lt 2 ]; then exec "{PYTHON}" "{WORKER}"; else exec "{cxx}"; fi'
    p = launch(4, ["sh", "-c", script], env=job_env(runs_dir, STEPS=150))
    assert p.returncode == 0, p.stdout + p.stderr
    d = the_run(runs_dir)
    rec = record(d)
    assert rec["state"] == "finished" and rec["world_size"] == 4
    check_shared_run(d, 4, 150)


def test_a_killed_python_rank(runs_dir):
    p = launch(4, [PYTHON, WORKER], env=job_env(runs_dir, STEPS=200, KILL_RANK=2, KILL_AT=120))
    # launch exits with the worst rank's code: SIGKILL's.
    assert p.returncode == 128 + 9, p.stdout + p.stderr
    d = the_run(runs_dir)
    rec = record(d)
    # The rank is recorded crashed at its last committed step; the others
    # finish, and the run's state is its ranks' worst: crashed (run.json's
    # error names rank 2), with rank 2's code from chorus launch.
    assert rec["state"] == "crashed" and "rank 2 crashed" in rec["error"] and rec["exit_codes"]["2"] == 137, rec
    ranks = {r["rank"]: r for r in rec["ranks"]}
    assert "connection was lost" in ranks[2]["message"] or "exited" in ranks[2]["message"]
    assert ranks[2]["state"] == "crashed" and ranks[2]["last_step"] <= 120
    assert all(ranks[k]["state"] == "finished" and ranks[k]["last_step"] == 199 for k in (0, 1, 3))
    check_shared_run(d, 4, 200, dead=2, dead_after=120)


def test_ctrl_c_interrupts_a_wait_and_ends_the_rank_killed(runs_dir):
    # Rank 0 waits at a barrier rank 1 never reaches; Ctrl-C (SIGINT) must
    # interrupt the wait with KeyboardInterrupt, and the with-block end the
    # rank as killed by SIGINT within its finish_timeout.
    cmd = [os.path.join(BIN, "chorus"), "launch", "-n", "2", "--master-port", str(free_port()), "--",
           PYTHON, os.path.join(HERE, "sigint_worker.py")]
    p = subprocess.Popen(cmd, env=job_env(runs_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, out = {}, []
    try:
        for line in p.stdout:
            out.append(line)
            m = re.search(r"PID (\d) (\d+)", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            if len(pids) == 2:
                break
        assert len(pids) == 2, "".join(out)
        time.sleep(0.5)  # rank 0 is in its wait
        os.kill(pids[0], signal.SIGINT)
        while True:  # rank 0 ends on its own
            try:
                os.kill(pids[0], 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        os.kill(pids[1], signal.SIGKILL)
        rest, _ = p.communicate(timeout=120)
        out.append(rest)
    finally:
        if p.poll() is None:
            p.kill()
    text = "".join(out)
    assert "INTERRUPTED" in text and "KeyboardInterrupt" in text, text
    rec = record(the_run(runs_dir))
    ranks = {r["rank"]: r for r in rec["ranks"]}
    assert ranks[0]["state"] == "killed" and "SIGINT" in ranks[0]["message"], rec
    assert rec["state"] in ("killed", "crashed"), rec


def test_python_and_cxx_ranks_share_a_run_under_torchrun(runs_dir, tmp_path):
    pytest.importorskip("torch")
    cxx = os.path.normpath(os.path.join(BIN, "..", "tests", "python", "cxx_rank"))
    assert os.access(cxx, os.X_OK), cxx
    # torchrun starts a program of any kind with --no_python: ranks 0 and 1
    # run Python, 2 and 3 C++, and all four detect torchrun's environment.
    script = f'if [ "$RANK" -lt 2 ]; then exec "{PYTHON}" "{WORKER}"; else exec "{cxx}"; fi'
    p = torchrun(4, ["--no_python", "sh", "-c", script], job_env(runs_dir, STEPS=150), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    d = the_run(runs_dir)
    rec = record(d)
    assert rec["state"] == "finished" and rec["launcher"] == "torchrun" and rec["world_size"] == 4
    assert all(r["state"] == "finished" and r["last_step"] == 149 for r in rec["ranks"])
    check_shared_run(d, 4, 150)


def test_four_python_ranks_under_torchrun_share_a_run(runs_dir, tmp_path):
    pytest.importorskip("torch")
    p = torchrun(4, [WORKER], job_env(runs_dir, STEPS=150), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    d = the_run(runs_dir)
    rec = record(d)
    assert rec["state"] == "finished" and rec["launcher"] == "torchrun" and rec["world_size"] == 4
    check_shared_run(d, 4, 150)


def test_python_ranks_exit_cleanly_while_rank_0s_exit_is_slow(runs_dir, tmp_path):
    # Each Python rank exits holding its run (the interpreter lets go of it
    # only as it ends). Rank 0's exit is slowed by another library's exit
    # handler (preloaded, so that it runs after every static destructor)
    # while the other ranks' links close, and memory freed at exit is
    # overwritten at once: nothing the run's threads reach may be freed.
    pytest.importorskip("torch")
    shim = os.path.normpath(os.path.join(BIN, "..", "tests", "python", "libslow_exit.so"))
    assert os.access(shim, os.R_OK), shim
    env = job_env(runs_dir, STEPS=150, LD_PRELOAD=shim,
                  GLIBC_TUNABLES="glibc.malloc.tcache_count=0:glibc.malloc.perturb=165")
    p = torchrun(4, [WORKER], env, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rec = record(the_run(runs_dir))
    assert rec["state"] == "finished" and all(r["state"] == "finished" for r in rec["ranks"]), rec
    check_shared_run(the_run(runs_dir), 4, 150)


def test_torchrun_ddp_sample(runs_dir, tmp_path):
    pytest.importorskip("torch")
    sample = os.path.join(SOURCE, "samples", "python", "ddp_train.py")
    p = torchrun(4, [sample, "--epochs", "2", "--steps-per-epoch", "20"], job_env(runs_dir, OMP_NUM_THREADS=1), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    d = the_run(runs_dir)
    rec = record(d)
    assert rec["state"] == "finished" and rec["launcher"] == "torchrun" and rec["world_size"] == 4
    h = rows(d)
    assert [r["_step"] for r in h] == list(range(40))
    assert all(r["_count"]["loss"] == 4 for r in h)
    for k in range(4):
        assert all(f"samples_per_s/rank-{k}" in r for r in h)
    # DDP keeps the replicas equal: the mean loss falls over training.
    first, last = sum(r["loss"] for r in h[:5]) / 5, sum(r["loss"] for r in h[-5:]) / 5
    assert last < first
    assert re.search(r"chorus: the run is in .*\(finished, 40 rows\)", p.stdout), p.stdout
    artifacts = os.path.join(d, "artifacts", "model.pt")
    assert os.path.getsize(artifacts) > 0
