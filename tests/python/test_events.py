"""A run's events from Python (docs/PYTHON.md, "Events"): alert_when's
arguments and its threshold events, on_event's thread (never a chorus
thread) and its end, `async for event in run.events()` in an asyncio
program, next_event, the reader's events() against events.jsonl, and a job
of real processes whose every rank sees the same event.

A row is committed (and so checked by the run host) once every live rank
is past its step: a value is followed by a later step before its event is
awaited."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import chorus
from conftest import PYTHON, job_env, launch, record, run_dirs

# How long a test waits for what must come; a bound on a hang, never a measure.
PATIENCE = 60


def one_run(runs_dir):
    (d,) = run_dirs(runs_dir)
    return d


def file_events(run_dir):
    """events.jsonl's lines, parsed here with json (independently of chorus's reader)."""
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def python(runs_dir, code, **env):
    """Runs `code` in a fresh interpreter with the package on its path; its CompletedProcess."""
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], env=job_env(runs_dir, **env), capture_output=True,
                          text=True, timeout=PATIENCE * 2)


# ---------------------------------------------------------------------------
# alert_when


def test_alert_when_takes_exactly_one_rule(runs_dir):
    with chorus.init(project="events") as run:
        with pytest.raises(TypeError, match="exactly one of above=x, below=x or no_change=seconds; got none"):
            run.alert_when("loss")
        with pytest.raises(TypeError, match="got above=, below="):
            run.alert_when("loss", above=1.0, below=0.0)
        with pytest.raises(TypeError, match="got above=, no_change="):
            run.alert_when("loss", above=1.0, no_change=5)
        with pytest.raises(TypeError, match="takes a number, not str"):
            run.alert_when("loss", above="10")
        with pytest.raises(TypeError, match="not bool"):
            run.alert_when("loss", below=True)
        with pytest.raises(TypeError, match=r"seconds \(a number, or a datetime.timedelta\), not list"):
            run.alert_when("loss", no_change=[5])
        with pytest.raises(TypeError, match="key is a str"):
            run.alert_when(3, above=1.0)
        with pytest.raises(TypeError):
            run.alert_when("loss", 10.0)  # the rule is a keyword
        for bad in (dict(above=float("nan")), dict(below=float("inf")), dict(no_change=0), dict(no_change=-1.0)):
            with pytest.raises(chorus.InvalidArgument) as e:
                run.alert_when("loss", **bad)
            assert isinstance(e.value, ValueError)
        # Well-formed rules: a ticket each, as define_metric gives.
        import datetime
        tickets = [run.alert_when("loss", above=10), run.alert_when("acc", below=0.5),
                   run.alert_when("lr", no_change=600.0), run.alert_when("lr", no_change=datetime.timedelta(minutes=5))]
        assert all(isinstance(t, chorus.Ticket) for t in tickets)
        for t in tickets:
            t.wait(timeout=PATIENCE)
        # A key chorus refuses is refused on the ticket, as for define_metric.
        with pytest.raises(chorus.Error):
            run.alert_when("", above=1.0).wait(timeout=PATIENCE)
    with pytest.raises(chorus.Finished):
        run.alert_when("loss", above=1.0).wait(timeout=PATIENCE)


def test_the_module_level_alert_when(runs_dir):
    with pytest.raises(chorus.NoRun, match="chorus.alert_when"):
        chorus.alert_when("loss", above=1.0)
    chorus.init(project="events")
    try:
        with pytest.raises(TypeError, match="exactly one"):
            chorus.alert_when("loss")
        t = chorus.alert_when("loss", above=2.0)
        assert isinstance(t, chorus.Ticket)
        t.wait(timeout=PATIENCE)
        for v in (1.0, 5.0, 1.0):
            chorus.log({"loss": v})
        ev = chorus.run.next_event(timeout=PATIENCE)
        assert ev is not None and ev.kind == "threshold" and ev.key == "loss" and ev.step == 1
        assert ev.json["rule"] == "above" and ev.json["limit"] == 2 and ev.json["value"] == 5
    finally:
        chorus.finish()


# ---------------------------------------------------------------------------
# on_event


def test_a_nan_reaches_on_event_on_a_python_thread(runs_dir):
    seen, came = [], threading.Event()

    def callback(event):
        seen.append((event, threading.current_thread()))
        if event.kind == "nonfinite":
            came.set()

    with chorus.init(project="events") as run:
        run.define_metric("loss", reduce="mean")
        assert run.on_event(callback) is callback  # a decorator too
        run.log({"loss": 1.0})
        run.log({"loss": float("nan")})
        run.log({"loss": 2.0})  # commits the NaN's step
        assert came.wait(PATIENCE), f"no nonfinite event came; got {seen}"
    (event, thread), = [s for s in seen if s[0].kind == "nonfinite"]
    assert isinstance(event, chorus.Event)
    assert (event.step, event.rank, event.key, event.ranks, event.state) == (1, None, "loss", [0], None)
    assert "NaN" in event.message and event.json["value"] == "NaN" and event.json["kind"] == "nonfinite"
    assert isinstance(event.time, float)
    # A thread of the package's, which Python made: not a chorus thread (that would be a _DummyThread).
    assert thread is not threading.main_thread()
    assert not isinstance(thread, threading._DummyThread)
    assert thread.name == f"chorus-events {run.id}" and thread.daemon
    assert "chorus.Event('nonfinite', step=1, key='loss', ranks=[0]" in repr(event)
    # The thread ends once the finish has completed; run_finished came last.
    thread.join(PATIENCE)
    assert not thread.is_alive()
    assert [e.kind for e, _ in seen] == ["nonfinite", "run_finished"]
    assert seen[-1][0].state == "finished"
    with pytest.raises(dataclass_frozen()):
        event.kind = "stalled"


def dataclass_frozen():
    import dataclasses
    return dataclasses.FrozenInstanceError


def test_every_callback_sees_every_event_and_one_that_raises_goes_on(runs_dir):
    p = python(runs_dir, """
        import chorus
        seen = []
        run = chorus.init(project="events")
        run.alert_when("loss", above=10.0).wait()

        @run.on_event
        def broken(event):
            raise RuntimeError("a callback's own bug at " + event.kind)

        run.on_event(lambda event: seen.append(event.kind))
        for v in (1.0, 20.0, 1.0, 30.0, 1.0):
            run.log({"loss": v})
        print("FINISHED", run.finish().wait().state, flush=True)
        run._chorus_dispatch.thread.join(60)
        print("SEEN", " ".join(seen), flush=True)
    """)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FINISHED finished" in p.stdout
    assert "SEEN threshold threshold run_finished" in p.stdout, p.stdout + p.stderr
    # Each raise is printed with its traceback, and did not stop the later events.
    assert p.stderr.count("chorus: the on_event callback broken raised on a") == 3, p.stderr
    assert p.stderr.count("RuntimeError: a callback's own bug at threshold") == 2
    assert "RuntimeError: a callback's own bug at run_finished" in p.stderr
    assert "Traceback (most recent call last)" in p.stderr
    # Not the exception hook's: the run ended as it did, not failed by the callback.
    assert record(one_run(runs_dir))["state"] == "finished"


@pytest.mark.parametrize("ending", ["finish", "exit", "drop"])
def test_the_interpreter_exits_with_a_callback_registered(runs_dir, ending):
    # finish: the thread ends once the finish completes. exit: nothing finishes the run;
    # the interpreter exits all the same (the core ends the run with the exit status).
    # drop: the run's handle is let go of, which finishes it, and the thread ends.
    p = python(runs_dir, f"""
        import gc, threading, chorus
        run = chorus.init(project="events")
        run.on_event(lambda event: print("EVENT", event.kind, flush=True))
        run.log({{"x": 1.0}}).wait()
        thread = run._chorus_dispatch.thread
        assert thread.is_alive()
        if "{ending}" == "finish":
            run.finish().wait()
        elif "{ending}" == "drop":
            del run
            chorus.run = None
            gc.collect()
        if "{ending}" != "exit":
            thread.join(60)
            print("THREAD", "alive" if thread.is_alive() else "ended", flush=True)
        print("BYE", flush=True)
    """)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "BYE" in p.stdout
    if ending != "exit":
        assert "THREAD ended" in p.stdout, p.stdout + p.stderr
    if ending == "finish":
        assert "EVENT run_finished" in p.stdout
    assert record(one_run(runs_dir))["state"] == "finished"


# ---------------------------------------------------------------------------
# events() and next_event()

ASYNC_PROGRAM = """
    import asyncio, threading, chorus

    async def main():
        loop = asyncio.get_running_loop()
        run = chorus.init(project="events")
        run.define_metric("loss", reduce="mean")
        called, last_called = [], asyncio.Event()

        # Registered while the loop runs: called on the loop, in its thread.
        @run.on_event
        def on_loop(e):
            called.append((e.kind, threading.current_thread() is threading.main_thread(),
                           asyncio.get_running_loop() is loop))
            if e.kind == "run_finished":
                last_called.set()
        waiting = asyncio.Event()

        async def consume():
            kinds = []
            events = run.events()
            waiting.set()
            async for event in events:
                kinds.append((event.kind, event.key, event.step))
            # Ended: the iterator stays ended, and a new one has nothing.
            assert [e async for e in events] == []
            assert [e async for e in run.events()] == []
            return kinds

        task = asyncio.create_task(consume())
        await waiting.wait()
        await asyncio.sleep(0)  # consume() now awaits its first event: the loop runs on
        await run.log({"loss": float("inf")})
        await run.log({"loss": 1.0})
        result = await run.finish()
        kinds = await asyncio.wait_for(task, 60)
        await asyncio.wait_for(last_called.wait(), 60)
        print("STATE", result.state)
        print("KINDS", kinds)
        print("CALLED", called)
        print("NEXT", run.next_event())  # ended: None at once, never a wait

    asyncio.run(main())
    print("DONE")
"""


def test_async_for_in_an_asyncio_program(runs_dir):
    p = python(runs_dir, ASYNC_PROGRAM)
    assert p.returncode == 0, p.stdout + p.stderr
    out = dict(line.split(" ", 1) for line in p.stdout.splitlines() if " " in line)
    assert out["STATE"] == "finished"
    # The events in order; run_finished, the last, ended the iteration.
    assert out["KINDS"] == "[('nonfinite', 'loss', 0), ('run_finished', None, None)]"
    assert out["CALLED"] == "[('nonfinite', True, True), ('run_finished', True, True)]"
    assert out["NEXT"] == "None"
    assert "DONE" in p.stdout


def test_a_cancelled_wait_loses_no_event(runs_dir):
    import asyncio

    async def main():
        run = chorus.init(project="events")
        run.define_metric("loss", reduce="mean")
        events = run.events()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(events.__anext__(), 0.05)  # nothing yet: cancelled while it waits
        await run.log({"loss": float("nan")})
        await run.log({"loss": 1.0})
        # The request the cancelled wait left is answered for the next one.
        first = await asyncio.wait_for(events.__anext__(), PATIENCE)
        await run.finish()
        rest = [e.kind async for e in events]
        return first, rest

    first, rest = asyncio.run(main())
    assert (first.kind, first.key, first.step) == ("nonfinite", "loss", 0)
    assert rest == ["run_finished"]


def test_next_event_waits_and_times_out(runs_dir):
    with chorus.init(project="events") as run:
        assert run.next_event(timeout=0) is None  # nothing yet
        with pytest.raises(chorus.InvalidArgument, match="timeout"):
            run.next_event(timeout=-1)
        run.define_metric("loss", reduce="mean")
        for v in (float("-inf"), 1.0, float("nan"), 2.0):
            run.log({"loss": v})
        first = run.next_event(timeout=PATIENCE)
        second = run.next_event(timeout=PATIENCE)
        assert (first.kind, first.step, first.json["value"]) == ("nonfinite", 0, "-Infinity")
        # Finite again at step 1, so step 2's NaN is told again.
        assert (second.kind, second.step, second.json["value"]) == ("nonfinite", 2, "NaN")
        assert run.next_event(timeout=0.05) is None
    # After the finish: run_finished, then the end.
    last = run.next_event(timeout=PATIENCE)
    assert last.kind == "run_finished" and last.state == "finished"
    assert run.next_event() is None


def test_an_inactive_run_has_no_events(runs_dir, monkeypatch):
    # Rank 1 of a job whose rank 0 alone logs: an inactive handle.
    for k, v in dict(CHORUS_MODE="auto", RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT="29400").items():
        monkeypatch.setenv(k, v)
    run = chorus.init(project="events")
    try:
        assert not run
        seen = []
        run.on_event(seen.append)
        thread = run._chorus_dispatch.thread
        thread.join(PATIENCE)
        assert not thread.is_alive() and seen == []
        assert run.next_event() is None

        async def drain():
            return [e async for e in run.events()]

        import asyncio
        assert asyncio.run(drain()) == []
        run.alert_when("loss", above=1.0).wait(timeout=PATIENCE)  # a no-op, as every call of an inactive run
    finally:
        run.finish()


# ---------------------------------------------------------------------------
# The reader


def test_the_reader_lists_the_files_events(runs_dir):
    with chorus.init(project="events") as run:
        run.define_metric("loss", reduce="mean")
        run.alert_when("loss", above=100.0).wait(timeout=PATIENCE)
        for v in (1.0, float("nan"), 500.0, 1.0):
            run.log({"loss": v})
        assert run.next_event(timeout=PATIENCE) is not None
        assert run.next_event(timeout=PATIENCE) is not None
    d = run.dir
    lines = file_events(d)
    events = chorus.open(d).events()
    assert [e.kind for e in events] == ["nonfinite", "threshold", "run_finished"]
    assert len(events) == len(lines)
    for e, line in zip(events, lines):
        assert isinstance(e, chorus.Event)
        assert e.json == line
        assert (e.kind, e.step, e.rank, e.key, e.message, e.ranks, e.state) == (
            line["kind"], line["step"], line["rank"], line["key"], line["message"], line["ranks"], line["state"])
        assert e.time == line["time"]
    assert events[1].json["value"] == 500 and events[1].json["rule"] == "above"
    # kind= picks kinds.
    view = chorus.open(d)
    assert [e.kind for e in view.events("threshold")] == ["threshold"]
    assert [e.kind for e in view.events(("nonfinite", "run_finished"))] == ["nonfinite", "run_finished"]
    # The same events as the live run gave (its next_event's nonfinite and threshold).
    assert events[-1].state == "finished"


def test_the_reader_skips_a_damaged_line_and_a_run_without_events(runs_dir):
    with chorus.init(project="events") as run:
        run.log({"x": 1.0})
    d = run.dir
    lines = file_events(d)
    assert [line["kind"] for line in lines] == ["run_finished"]
    path = os.path.join(d, "events.jsonl")
    with open(path) as f:
        good = f.read()
    with open(path, "w") as f:
        f.write('{"seq":7,"kind":"no_such_kind","time":1.0,"message":"m"}\n' + good + '{"seq":9,"kind":"sta')
    with pytest.warns(RuntimeWarning, match=r"events.jsonl: 1 damaged line\(s\) skipped, the first \(line 1\): "
                                            r"an unknown kind \"no_such_kind\""):
        events = chorus.open(d).events()
    assert [e.kind for e in events] == ["run_finished"]  # the unfinished last line is left out
    os.remove(path)
    # The run's end wrote events.jsonl: gone, it is named with the fix.
    with pytest.raises(chorus.IoError, match=r"events.jsonl is missing, not \d+ .*chorus recover"):
        chorus.open(d).events()
    # A run.json without lengths (an earlier version's) and no events.jsonl: no events.
    record_path = os.path.join(d, "run.json")
    with open(record_path) as f:
        record = json.load(f)
    del record["lengths"]
    with open(record_path, "w") as f:
        json.dump(record, f)
    assert chorus.open(d).events() == []


# ---------------------------------------------------------------------------
# A job of real processes


WORKER = """
import os, sys, threading, time, chorus
flag = sys.argv[1]
came = threading.Event()
seen = []
def callback(event):
    seen.append(event)
    if event.kind == "nonfinite":
        came.set()
run = chorus.init(project="events", mode="shared")
rank = run.topology["rank"]
run.define_metric("loss", reduce="mean")
run.on_event(callback)
thread = run._chorus_dispatch.thread
for step in range(5):
    bad = rank == 1 and step == 2
    run.log({"loss": float("nan") if bad else 1.0}, step=step)
ok = came.wait(60)
e = [e for e in seen if e.kind == "nonfinite"]
print(f"RANK {rank} CAME {ok} NONFINITE {[(x.key, x.step, x.ranks) for x in e]} "
      f"ON {thread.name == threading.current_thread().name}", flush=True)
run.barrier("seen").wait()
if rank == 0:  # the run host finishes last: rank 1's thread ends with its own finish
    deadline = time.monotonic() + 60
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
run.finish().wait()
thread.join(60)
print(f"RANK {rank} THREAD {'alive' if thread.is_alive() else 'ended'}", flush=True)
open(flag, "w").close()
"""


def test_every_rank_of_a_job_sees_the_event(runs_dir, tmp_path):
    worker = tmp_path / "events_worker.py"
    worker.write_text(WORKER)
    p = launch(2, [PYTHON, str(worker), str(tmp_path / "rank-1-ended")], env=job_env(runs_dir))
    assert p.returncode == 0, p.stdout + p.stderr
    for rank in (0, 1):
        assert f"RANK {rank} CAME True NONFINITE [('loss', 2, [1])] ON False" in p.stdout, p.stdout + p.stderr
        assert f"RANK {rank} THREAD ended" in p.stdout, p.stdout + p.stderr
    d = one_run(runs_dir)
    (line,) = [line for line in file_events(d) if line["kind"] == "nonfinite"]
    assert line["ranks"] == [1] and line["step"] == 2
    assert [e.kind for e in chorus.open(d).events("nonfinite")] == ["nonfinite"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_init_takes_stall_after(runs_dir):
    with pytest.raises(chorus.InvalidArgument, match="stall_after"):
        chorus.init(project="events", stall_after=-1)
    with pytest.raises(chorus.InvalidArgument, match="stall_after"):
        chorus.init(project="events", stall_after=float("nan"))
    # 0 turns stall detection off: a run of one rank takes it.
    with chorus.init(project="events", stall_after=0) as run:
        run.log({"loss": 1.0})
    assert chorus.open(one_run(runs_dir)).events()[-1].kind == "run_finished"
