"""One rank of a test job, in Python: the same values as cxx_rank.cpp logs.

Each step s, rank k logs loss = k + s (reduced with mean), tokens = k + 1
(sum), and r = k * 100000 + s (a column per rank); a barrier every 50 steps.
STEPS sets the steps; KILL_RANK and KILL_AT make that rank SIGKILL itself
right after logging that step.
"""

import os
import signal

import chorus

steps = int(os.environ.get("STEPS", "200"))
kill_rank = int(os.environ.get("KILL_RANK", "-1"))
kill_at = int(os.environ.get("KILL_AT", "-1"))

with chorus.init(project="jobs", mode="shared", config={"steps": steps}) as run:
    rank = run.topology["rank"]
    run.define_metric("loss", "mean")
    run.define_metric("tokens", "sum")
    for s in range(steps):
        run.log({"loss": rank + s, "tokens": rank + 1, "r": rank * 100000 + s})
        if rank == kill_rank and s == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if (s + 1) % 50 == 0:
            run.barrier(f"b{s + 1}").wait()
    if run.is_host:
        print("RUN_DIR", run.dir, flush=True)
