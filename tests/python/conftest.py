"""Shared by the Python tests: a fresh run directory per test, a free port,
and jobs of real processes under `chorus launch`."""

import json
import os
import socket
import subprocess
import sys

import pytest

BIN = os.environ.get("CHORUS_BIN_DIR", "")


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setenv("CHORUS_DIR", str(d))
    # Nothing of the caller's environment decides where a test's run goes.
    for v in ("CHORUS_PROJECT", "CHORUS_GROUP", "CHORUS_RUN_ID", "CHORUS_MODE", "CHORUS_UPLOAD", "CHORUS_PORT",
              "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("CHORUS_SYSTEM_INTERVAL", "0")
    return d


def free_port():
    """A port whose next one is free too (the run host listens on MASTER_PORT + 1)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65000:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of ports")


def run_dirs(root):
    """Every run directory under `root`."""
    return sorted(os.path.dirname(os.path.join(d, "run.json")) for d, _, files in os.walk(root) if "run.json" in files)


def rows(run_dir):
    """history.jsonl's rows, parsed here with json (independently of chorus's reader)."""
    with open(os.path.join(run_dir, "history.jsonl")) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def record(run_dir):
    with open(os.path.join(run_dir, "run.json")) as f:
        return json.load(f)


def launch(n, argv, env=None, timeout=240):
    """Runs `chorus launch -n N -- argv...` and returns the CompletedProcess."""
    cmd = [os.path.join(BIN, "chorus"), "launch", "-n", str(n), "--master-port", str(free_port()), "--", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def job_env(runs_dir, **extra):
    """This process's environment, with CHORUS_DIR and `extra` set."""
    env = dict(os.environ)
    env["CHORUS_DIR"] = str(runs_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def torchrun(nproc, argv, env, cwd):
    """Runs `torchrun --nproc_per_node N argv...` and returns the CompletedProcess."""
    # Debian 12's torch 1.13 on Python 3.11 cannot parse its own default
    # --redirects/--tee of 0 (Python 3.11's IntFlag leaves 0 out when
    # iterating): giving them 1 works around it.
    cmd = [PYTHON, "-m", "torch.distributed.run", "--redirects", "1", "--tee", "1", "--nproc_per_node", str(nproc),
           "--master_port", str(free_port()), *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=cwd)


def pytest_sessionfinish(session, exitstatus):
    # A file whose every test skipped (no GPU, no torch) is reported to
    # ctest as skipped (77), with pytest's reason in the output.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if exitstatus in (0, 5) and reporter is not None and not reporter.stats.get("passed") and reporter.stats.get("skipped"):
        session.exitstatus = 77


PYTHON = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
