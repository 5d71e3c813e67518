"""`chorus sync` against a real MLflow 2.10.2 tracking server, beside MLflow's
own Python client on the same points, with 1 and 4 server workers.

    /usr/bin/python3 bench/mlflow_peer_bench.py --peers PEERS_DIR \
        --chorus build-release/bin/chorus [--chorus OTHER/chorus ...] \
        [--points 200000] [--workers 1,4] [--rounds 2]

PEERS_DIR holds mlflow-server.sh and mlflow-2.10.2/ (the server and its
client). Each measurement gets a fresh server (its own SQLite store) with
the given workers, then one client uploads the same run: a run directory of
`--points` values (rows of 10 keys, full-precision doubles) written once,
or, for MLflow's client, the same values through MlflowClient.log_batch,
1000 metrics a call, in this process. The clients take turns within a
round (each --chorus binary, then MLflow's client), for each worker count.

Reported per measurement: the upload's wall time (for `chorus sync` the
whole command, process start and run creation included; for MLflow's
client from create_run to set_terminated, its imports left out), points/s,
the server's CPU seconds in that time (utime + stime of every process of
its process group, from /proc), and its busy share: CPU seconds over wall
seconds, where 100 % is one core kept busy. Then the medians per client and
worker count, and each chorus binary's points/s over MLflow's client's.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

KEYS = ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/step_time",
        "eval/loss", "eval/accuracy", "memory/allocated_gib", "throughput/tflops", "loss_scale"]
START = 1_700_000_000.0
TICKS = os.sysconf("SC_CLK_TCK")


def row_values(step):
    return [((step * 7919 + k * 104729) % 1000003) / 1000003.0 + step * 1e-3 for k in range(len(KEYS))]


def write_run(root, rows):
    """A finished run directory of `rows` history rows, as the run host writes one."""
    d = os.path.join(root, "bench", "grp", "upload-bench")
    os.makedirs(d)
    with open(os.path.join(d, "history.jsonl"), "w") as f:
        for s in range(rows):
            row = {"_step": s, "_timestamp": START + s * 0.01, "_runtime": s * 0.01}
            row.update(zip(KEYS, row_values(s)))
            f.write(json.dumps(row) + "\n")
    run = {"id": "upload-bench", "name": "upload-bench", "project": "bench", "group": "grp",
           "job_type": "train", "notes": "", "mode": "per_rank", "scope": "global", "host": "bench",
           "state": "finished", "start_time": START, "end_time": START + rows * 0.01, "world_size": 1,
           "segments": [{"start_time": START, "state": "finished", "end_time": START + rows * 0.01}]}
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump(run, f)
    return d


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A fresh MLflow server with `workers` workers, stopped (its process group) on exit."""

    def __init__(self, peers, workers):
        self.data = tempfile.mkdtemp(prefix="chorus-mlflow-bench-")
        port = free_port()
        out = subprocess.run([os.path.join(peers, "mlflow-server.sh"), str(port), self.data, str(workers)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit("the MLflow server did not start: " + out.stdout + out.stderr)
        pgid, self.url = out.stdout.split()
        self.pgid = int(pgid)
        self.port = port

    def cpu_seconds(self):
        total = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.pgid:  # pgrp
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / TICKS

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            os.killpg(self.pgid, 15)
        except ProcessLookupError:
            pass
        for _ in range(100):
            try:
                os.killpg(self.pgid, 0)
                time.sleep(0.05)
            except ProcessLookupError:
                break
        shutil.rmtree(self.data, ignore_errors=True)


def chorus_sync(binary, run_dir, server):
    env = dict(os.environ)
    upload_dir = os.path.join(run_dir, "upload")
    shutil.rmtree(upload_dir, ignore_errors=True)  # a fresh upload each time
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    out = subprocess.run([binary, "sync", run_dir, "--to", f"mlflow://127.0.0.1:{server.port}"],
                         capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
    if out.returncode != 0:
        sys.exit(f"{binary} sync failed ({out.returncode}): {out.stdout}{out.stderr}")
    return wall, cpu


def mlflow_client(rows, server):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=server.url)
    cpu0, t0 = server.cpu_seconds(), time.perf_counter()
    exp = c.create_experiment("bench")
    run = c.create_run(exp, run_name="upload-bench")
    batch = []
    for s in range(rows):
        ts = int(round((START + s * 0.01) * 1000))
        for k, v in zip(KEYS, row_values(s)):
            batch.append(Metric(k, v, ts, s))
            if len(batch) == 1000:
                c.log_batch(run.info.run_id, metrics=batch)
                batch = []
    if batch:
        c.log_batch(run.info.run_id, metrics=batch)
    c.set_terminated(run.info.run_id, "FINISHED")
    return time.perf_counter() - t0, server.cpu_seconds() - cpu0


def count_points(server, run_name):
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri=server.url)
    runs = c.search_runs([e.experiment_id for e in c.search_experiments()],
                         filter_string=f"attributes.run_name = '{run_name}'")
    if len(runs) != 1:
        return -1
    return sum(len(c.get_metric_history(runs[0].info.run_id, k)) for k in KEYS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", required=True, help="the folder of mlflow-server.sh and mlflow-2.10.2/")
    ap.add_argument("--chorus", action="append", required=True, help="a chorus binary (repeat to compare builds)")
    ap.add_argument("--label", action="append", help="a name for each --chorus, in order")
    ap.add_argument("--points", type=int, default=200_000)
    ap.add_argument("--workers", default="1,4", help="server worker counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="read every key's history back after each upload")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.peers, "mlflow-server.sh")):
        sys.exit(f"no mlflow-server.sh in {a.peers}: give the peers folder with --peers")
    for b in a.chorus:
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} is not an executable chorus binary: build it (cmake --build build-release --target chorus_cli)")
    labels = a.label or [os.path.relpath(b) for b in a.chorus]
    if len(labels) != len(a.chorus):
        sys.exit("give one --label per --chorus, or none")
    try:
        workers = [int(w) for w in a.workers.split(",")]
    except ValueError:
        sys.exit(f"--workers takes worker counts separated by commas, like 1,4; got {a.workers!r}")
    sys.path.insert(0, os.path.join(a.peers, "mlflow-2.10.2"))
    rows = a.points // len(KEYS)
    root = tempfile.mkdtemp(prefix="chorus-upload-peer-bench-")
    try:
        run_dir = write_run(root, rows)
        print(f"{rows * len(KEYS):,} points ({rows:,} rows x {len(KEYS)} keys); {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.2f} at the start")
        clients = [(label, lambda s, b=b: chorus_sync(b, run_dir, s)) for label, b in zip(labels, a.chorus)]
        clients.append(("mlflow log_batch", lambda s: mlflow_client(rows, s)))
        results = {}
        print(f"{'round':>5} {'workers':>7}  {'client':<28} {'wall s':>7} {'points/s':>10} {'server CPU s':>12} {'busy':>6}")
        for r in range(a.rounds):
            for w in workers:
                for label, run in clients:
                    with Server(a.peers, w) as server:
                        wall, cpu = run(server)
                        note = ""
                        if a.check:
                            n = count_points(server, "upload-bench")
                            note = f"  stored {n:,}" + ("" if n == rows * len(KEYS) else "  WRONG")
                    pps = rows * len(KEYS) / wall
                    results.setdefault((label, w), []).append((wall, pps, cpu / wall))
                    print(f"{r + 1:>5} {w:>7}  {label:<28} {wall:7.2f} {pps:10,.0f} {cpu:12.2f} {cpu / wall:6.0%}{note}",
                          flush=True)
        print(f"\nmedians ({a.rounds} rounds); load average {os.getloadavg()[0]:.2f} at the end")
        print(f"{'workers':>7}  {'client':<28} {'points/s':>10} {'busy':>6} {'x MLflow client':>16}")
        for w in workers:
            ref = statistics.median(p for _, p, _ in results[("mlflow log_batch", w)])
            for label, _ in clients:
                pps = statistics.median(p for _, p, _ in results[(label, w)])
                busy = statistics.median(b for _, _, b in results[(label, w)])
                print(f"{w:>7}  {label:<28} {pps:10,.0f} {busy:6.0%} {pps / ref:15.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
