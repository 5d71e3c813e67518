"""One rank of test_end_states.py's jobs: how a rank ends, for real.

Every rank logs v = rank * 100000 + s at step s into one shared run, waits
for each value to be acknowledged and prints "ACKED s", until it is stopped.
At step ACT_AT (default 20), rank ACT_RANK (default 1) ends as ACT says:
  raise              raise RuntimeError (uncaught)
  exit               sys.exit(3)
  exit_after_finish  run.finish(), then sys.exit(3)
  none               go on (the test signals it)
BARE=1 makes the run without a with-block. "PID <rank> <pid>" comes first.
A rank still running after STOP_AFTER seconds (default 120) exits with 9.
"""

import os
import sys
import time

import chorus

act = os.environ.get("ACT", "none")
act_rank = int(os.environ.get("ACT_RANK", "1"))
act_at = int(os.environ.get("ACT_AT", "20"))
stop_after = float(os.environ.get("STOP_AFTER", "120"))


def steps(run):
    rank = run.topology["rank"]
    print(f"PID {rank} {os.getpid()}", flush=True)
    t0 = time.monotonic()
    s = 0
    while time.monotonic() - t0 < stop_after:
        run.log({"v": rank * 100000 + s}, step=s).wait()
        print(f"ACKED {s}", flush=True)
        if rank == act_rank and s == act_at:
            if act == "raise":
                raise RuntimeError(f"rank {rank} gave up at step {s}")
            if act == "exit":
                sys.exit(3)
            if act == "exit_after_finish":
                print("FINISHED", run.finish().wait().state, flush=True)
                sys.exit(3)
        s += 1
        time.sleep(0.01)
    print("STOP_AFTER ran out", flush=True)
    os._exit(9)


options = dict(project="ends", mode="shared", finish_timeout=20)
if os.environ.get("BARE") == "1":
    steps(chorus.init(**options))
else:
    with chorus.init(**options) as run:
        steps(run)
