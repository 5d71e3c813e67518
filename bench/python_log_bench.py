"""What a run.log call costs a Python trainer's thread, beside other ways
of recording a value from Python measured in the same process.

    PYTHONPATH=build-release/python /usr/bin/python3 bench/python_log_bench.py

Each figure is the time of one call, from batches of 100 calls timed with
perf_counter_ns (so the clock's own cost is spread over the batch), as the
median (p50) and the 99th percentile (p99) over the batches. The anchors:
MLflow's log_metric to a local file store where the mlflow package is
installed; Python's logging module writing a line per call to a file; and
json.dumps of the dict appended to a file, the least a tracker writing JSON
lines does. Rows for other kinds of value (a NumPy scalar, a 0-d array, a
0-d CPU tensor, a nested dict) and for commit=False follow where NumPy and
torch are installed. The "one call per 20 us of work" rows time each call alone
after 20 us of busy work, as a trainer logs once a step: the cost it sees
in a steady state, where the flat-out rows also pay for a full queue
(Overflow::block) and for chorus's threads sharing the cores.
"""

import json
import logging
import os
import statistics
import sys
import tempfile
import time

import chorus

try:
    import numpy as np
except ImportError:
    np = None
try:
    import torch
except ImportError:
    torch = None

BATCH = 100
BATCHES = int(os.environ.get("BATCHES", "2000"))


def measure(call):
    for _ in range(BATCH * 20):  # warm up
        call()
    per_call = []
    for _ in range(BATCHES):
        t0 = time.perf_counter_ns()
        for _ in range(BATCH):
            call()
        per_call.append((time.perf_counter_ns() - t0) / BATCH)
    per_call.sort()
    return statistics.median(per_call), per_call[int(len(per_call) * 0.99)]


def clock_cost():
    t = []
    for _ in range(10000):
        t0 = time.perf_counter_ns()
        t.append(time.perf_counter_ns() - t0)
    return statistics.median(t)


def measure_paced(call, work_ns=20_000, calls=20000):
    """One call after each `work_ns` of busy work, as a trainer logs once a step:
    each call timed alone, less the clock's own cost."""
    clock = clock_cost()
    per_call = []
    for _ in range(calls):
        until = time.perf_counter_ns() + work_ns
        while time.perf_counter_ns() < until:
            pass
        t0 = time.perf_counter_ns()
        call()
        per_call.append(time.perf_counter_ns() - t0 - clock)
    per_call.sort()
    return statistics.median(per_call), per_call[int(len(per_call) * 0.99)]


def empty_loop():
    t0 = time.perf_counter_ns()
    for _ in range(BATCH * BATCHES):
        pass
    return (time.perf_counter_ns() - t0) / (BATCH * BATCHES)


def main():
    tmp = tempfile.mkdtemp(prefix="chorus-pybench-")
    results = []

    def row(name, call, paced=False):
        p50, p99 = measure_paced(call) if paced else measure(call)
        results.append((name, p50, p99))
        print(f"{name:58s} p50 {p50:8.0f} ns   p99 {p99:8.0f} ns", flush=True)

    print(f"python {sys.version.split()[0]}, {BATCHES} batches of {BATCH} calls; empty loop {empty_loop():.0f} ns a call")
    run = chorus.init(project="bench", dir=os.path.join(tmp, "runs"), system_interval=0, read_env=False)
    one = {"loss": 0.25}
    two = {"loss": 0.25, "acc": 0.5}
    ten = {f"metric_{i}": float(i) for i in range(10)}
    row("chorus run.log({loss})", lambda: run.log(one))
    row("chorus run.log({loss, acc})", lambda: run.log(two))
    row("chorus run.log({loss, acc}) with a dict made per call", lambda: run.log({"loss": 0.25, "acc": 0.5}))
    row("chorus run.log(10 values)", lambda: run.log(ten))
    step = [0]

    def explicit():
        step[0] += 1
        run.log(two, step=step[0] + 10**9)

    row("chorus run.log({loss, acc}, step=s)", explicit)
    # Other kinds of value, and commit=False (a Python branch off the native call).
    kinds = {"NumPy float32": np.float32(0.25), "0-d NumPy array": np.array(0.25)} if np else {}
    if torch is not None:
        kinds["0-d CPU tensor"] = torch.tensor(0.25)
    for name, value in kinds.items():
        d = {"loss": value}
        row(f"chorus run.log({{loss: {name}}})", lambda d=d: run.log(d))
    nested = {"train": {"loss": 0.25, "acc": 0.5}}
    row("chorus run.log({train: {loss, acc}}) (nested: train/loss, train/acc)", lambda: run.log(nested))

    def gathered():
        run.log(one, commit=False)
        run.log(one)

    row("chorus run.log({loss}, commit=False) + run.log({loss}), per pair", gathered)
    row("chorus run.log({loss, acc}), one call per 20 us of work", lambda: run.log(two), paced=True)
    row("chorus run.log(10 values), one call per 20 us of work", lambda: run.log(ten), paced=True)
    result = run.finish().wait()
    print(f"  (chorus: {result.rows} rows committed, {result.dropped} dropped, state {result.state})")

    log = logging.getLogger("bench")
    log.propagate = False
    handler = logging.FileHandler(os.path.join(tmp, "log.txt"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    row("logging: log.info('%s', {loss, acc}) to a file", lambda: log.info("%s", two))
    handler.close()

    with open(os.path.join(tmp, "lines.jsonl"), "w") as f:
        row("json.dumps({loss, acc}) + file.write", lambda: f.write(json.dumps(two) + "\n"))
        row("json.dumps({loss, acc}) + file.write, one call per 20 us of work",
            lambda: f.write(json.dumps(two) + "\n"), paced=True)

    try:
        import mlflow
    except ImportError:
        print("mlflow.log_metric: not measured: the mlflow package is not installed "
              "(Debian 12 does not package it)")
    else:
        mlflow.set_tracking_uri("file://" + os.path.join(tmp, "mlruns"))
        with mlflow.start_run():
            row("mlflow.log_metric('loss', v) to a local file store", lambda: mlflow.log_metric("loss", 0.25))


if __name__ == "__main__":
    main()
