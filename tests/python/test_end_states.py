"""How a Python rank's end is recorded, as real jobs of end_worker.py under
torchrun and under `chorus launch`, each rank stopped for real: a rank that
raises while the launcher SIGTERMs the others, a rank SIGTERMed, an uncaught
exception without a with-block, sys.exit(3) (in a with-block, without one,
after run.finish()), and Ctrl-C. Each checks run.json's states and messages,
the exit statuses as the launcher reports them, and that every value a rank
saw acknowledged ("ACKED s") is in history.jsonl."""

import os
import re
import signal
import subprocess
import threading
import time

import pytest

from conftest import BIN, HERE, PYTHON, free_port, record, rows, run_dirs

WORKER = os.path.join(HERE, "end_worker.py")
LAUNCHERS = ["torchrun", "launch"]
# torchrun: "[default1]:ACKED 5"; chorus launch: "[rank 1] ACKED 5".
RANK_LINE = re.compile(r"^\[(?:rank |default)(\d+)\]:? ?(.*)$")
ACKED = re.compile(r"(?:^|\]:)ACKED (\d+)")


class Job:
    """end_worker.py's ranks under a launcher, their output read as it comes."""

    def __init__(self, launcher, n, runs_dir, cwd, **env):
        if launcher == "torchrun":
            pytest.importorskip("torch")
            # --redirects/--tee 1: Debian 12's torch 1.13 cannot parse its own defaults (test_jobs.py).
            cmd = [PYTHON, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1", "--monitor_interval", "1",
                   "--nproc_per_node", str(n), "--master_port", str(free_port()), WORKER]
        else:
            # --fail-fast: the others are stopped (SIGTERM) when a rank fails, as torchrun does.
            cmd = [os.path.join(BIN, "chorus"), "launch", "-n", str(n), "--fail-fast", "--grace", "30",
                   "--master-port", str(free_port()), "--", PYTHON, WORKER]
        full_env = dict(os.environ, CHORUS_DIR=str(runs_dir), **{k: str(v) for k, v in env.items()})
        self.launcher = launcher
        self.lines = []
        self.p = subprocess.Popen(cmd, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def of_rank(self):
        for line in list(self.lines):
            m = RANK_LINE.match(line)
            if m:
                yield int(m.group(1)), m.group(2)

    def acked(self):
        """The last step each rank saw acknowledged."""
        last = {}
        for rank, text in self.of_rank():
            # torchrun's tee reads a rank's file as it grows and may print a line it has read only in part,
            # so the rank's next line can follow it without a newline: "[default1]:ACKED 104[default1]:ACKED 105".
            # A cut number can only read smaller than the step acknowledged, which checks less, never wrongly.
            for step in ACKED.findall(text):
                last[rank] = max(last.get(rank, -1), int(step))
        return last

    def pid(self, rank):
        for r, text in self.of_rank():
            if r == rank and text.startswith("PID "):
                return int(text.split()[2])
        return None

    def wait_until(self, what, timeout=120):
        deadline = time.monotonic() + timeout
        while not what():
            assert self.p.poll() is None, "the job ended early:\n" + self.text()
            assert time.monotonic() < deadline, "waited too long:\n" + self.text()
            time.sleep(0.05)

    def end(self, timeout=240):
        try:
            self.p.wait(timeout=timeout)
        finally:
            if self.p.poll() is None:
                self.p.kill()
        self.reader.join(timeout=30)
        return self.p.returncode

    def text(self):
        return "\n".join(self.lines)


def the_run(runs_dir):
    (d,) = run_dirs(runs_dir)
    return d


def ranks_of(rec):
    return {r["rank"]: r for r in rec["ranks"]}


def check_acked(job, run_dir, ranks):
    """Every value a rank saw acknowledged is in the history, at its step."""
    acked = job.acked()
    assert sorted(acked) == list(range(ranks)), job.text()
    at = {r["_step"]: r for r in rows(run_dir)}
    for rank, last in acked.items():
        for s in range(last + 1):
            assert at[s][f"v/rank-{rank}"] == rank * 100000 + s, (rank, s)


def torchrun_reports(job, rank, exitcode):
    """torchrun's failure report names the rank with its exit code."""
    text = job.text()
    assert re.search(rf"rank\s+: {rank} \(local_rank: {rank}\)\s+exitcode\s+: {exitcode} ", text), text


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_rank_raises_and_the_launcher_stops_the_others(runs_dir, tmp_path, launcher):
    job = Job(launcher, 3, runs_dir, tmp_path, ACT="raise", ACT_RANK=1, ACT_AT=100)
    code = job.end()
    text = job.text()
    assert code == 1, text
    assert "RuntimeError: rank 1 gave up at step 100" in text  # the traceback, still printed
    d = the_run(runs_dir)
    rec = record(d)
    ranks = ranks_of(rec)
    assert rec["state"] == "failed", rec
    assert ranks[1]["state"] == "failed", rec
    assert "RuntimeError: rank 1 gave up at step 100" in ranks[1]["message"], rec
    for k in (0, 2):
        assert ranks[k]["state"] == "killed" and "SIGTERM" in ranks[k]["message"], rec
    if launcher == "torchrun":
        torchrun_reports(job, 1, 1)
        assert "closing signal SIGTERM" in text
    else:
        assert rec["exit_codes"] == {"0": 143, "1": 1, "2": 143}, rec
    check_acked(job, d, 3)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sigterm_to_one_rank_kills_it(runs_dir, tmp_path, launcher):
    job = Job(launcher, 2, runs_dir, tmp_path, ACT="none")
    job.wait_until(lambda: job.acked().get(1, -1) >= 20 and job.acked().get(0, -1) >= 20)
    os.kill(job.pid(1), signal.SIGTERM)
    code = job.end()
    d = the_run(runs_dir)
    rec = record(d)
    ranks = ranks_of(rec)
    assert ranks[1]["state"] == "killed" and "SIGTERM" in ranks[1]["message"], rec
    assert ranks[0]["state"] == "killed" and "SIGTERM" in ranks[0]["message"], rec
    assert rec["state"] == "killed", rec
    if launcher == "torchrun":
        assert code == 1, job.text()
        torchrun_reports(job, 1, -15)
    else:
        assert code == 143 and rec["exit_codes"] == {"0": 143, "1": 143}, (code, rec)
    check_acked(job, d, 2)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_uncaught_exception_without_a_with_block(runs_dir, tmp_path, launcher):
    job = Job(launcher, 2, runs_dir, tmp_path, ACT="raise", BARE=1)
    code = job.end()
    assert code == 1, job.text()
    d = the_run(runs_dir)
    rec = record(d)
    ranks = ranks_of(rec)
    assert rec["state"] == "failed" and ranks[1]["state"] == "failed", rec
    assert "RuntimeError: rank 1 gave up at step 20" in ranks[1]["message"] and "exit code 1" in ranks[1]["message"], rec
    assert ranks[0]["state"] == "killed", rec
    if launcher == "torchrun":
        torchrun_reports(job, 1, 1)
    else:
        assert rec["exit_codes"]["1"] == 1, rec
    check_acked(job, d, 2)


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("how", ["with", "bare", "after_finish"])
def test_sys_exit_3_fails_the_rank_with_its_code(runs_dir, tmp_path, launcher, how):
    env = dict(ACT="exit_after_finish" if how == "after_finish" else "exit", BARE=1 if how == "bare" else 0)
    job = Job(launcher, 2, runs_dir, tmp_path, **env)
    code = job.end()
    text = job.text()
    d = the_run(runs_dir)
    rec = record(d)
    ranks = ranks_of(rec)
    assert rec["state"] == "failed", rec
    # The rank's own end says "exit code 3"; a rank that finished first is
    # failed by its process's exit status after ("exited with status 3 after it finished").
    said = "status 3" if how == "after_finish" else "exit code 3"
    assert ranks[1]["state"] == "failed" and said in ranks[1]["message"], rec
    if how == "after_finish":
        assert re.search(r"^\[(rank |default)1\]:? ?FINISHED finished$", text, re.M), text
    if launcher == "torchrun":
        assert code == 1, text
        torchrun_reports(job, 1, 3)
    else:
        assert code == 3 and rec["exit_codes"]["1"] == 3, (code, rec)
    check_acked(job, d, 2)


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("bare", [0, 1])
def test_ctrl_c_kills_the_rank(runs_dir, tmp_path, launcher, bare):
    job = Job(launcher, 2, runs_dir, tmp_path, ACT="none", BARE=bare)
    job.wait_until(lambda: job.acked().get(1, -1) >= 20 and job.acked().get(0, -1) >= 20)
    os.kill(job.pid(1), signal.SIGINT)
    code = job.end()
    text = job.text()
    assert "KeyboardInterrupt" in text, text
    d = the_run(runs_dir)
    rec = record(d)
    ranks = ranks_of(rec)
    assert ranks[1]["state"] == "killed" and "SIGINT" in ranks[1]["message"], rec
    assert rec["state"] == "killed", rec
    if launcher == "torchrun":
        assert code == 1, text
        torchrun_reports(job, 1, -2)
    else:
        assert code == 130 and rec["exit_codes"]["1"] == 130, (code, rec)
    check_acked(job, d, 2)
