"""A rank for test_jobs.py's Ctrl-C case: rank 0 waits at a barrier that
rank 1 never reaches, until it is interrupted; rank 1 sleeps."""

import os
import sys
import time

import chorus

with chorus.init(project="jobs", mode="shared", finish_timeout=5) as run:
    rank = run.topology["rank"]
    run.log({"x": float(rank)}).wait()
    print(f"PID {rank} {os.getpid()}", flush=True)
    if rank == 0:
        try:
            run.barrier("never", timeout=600).wait()
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
            raise
    else:
        time.sleep(600)
sys.exit(0)
