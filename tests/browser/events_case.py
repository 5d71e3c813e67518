"""The `events` case of dashboard_test.py: a run's events (events.jsonl) on its page.

Events of several kinds, of a rank and of none, at steps of the run, as the run
host writes them (io/store/event_log.hpp); the list of them and their marks on
the charts (a line across a chart, or an annotation on the series of the
event's rank where the chart has one), coloured by severity; events appended
while the page is open, a line being written, and the run's end (no step: in
the list only). `t` is dashboard_test.py itself: its run files, server and
browser helpers.
"""
import json
import os
import time

SEVERITY = {"stalled": "bad", "nonfinite": "bad", "rank_failed": "bad", "rank_killed": "bad", "rank_lost": "bad",
            "barrier_timeout": "bad", "threshold": "warn", "straggler": "warn", "resumed": "info", "run_finished": "info"}


def event(t, seq, kind, rank, step, message, key=None, ranks=(), state=None):
    """An events.jsonl line (with its newline), its fields in the run host's order, at START + step."""
    line = {"seq": seq, "kind": kind, "time": t.START + (step if step is not None else 119) + 0.5, "rank": rank,
            "step": step, "key": key, "message": message, "ranks": list(ranks), "state": state}
    if kind in ("stalled", "resumed", "straggler"):
        line.update({"host": "node-a", "pid": 4242})
    return json.dumps(line) + "\n"


FIRST = [
    (0, "stalled", 1, 40, "rank 1 (process 4242 on node-a) has not moved past step 40 for 301 s"),
    (1, "resumed", 1, 45, "rank 1 moves again, after 310 s"),
    (2, "nonfinite", None, 60, "loss is NaN at step 60 <img src=x onerror=alert(1)> stays text"),
    (3, "threshold", None, 80, "loss above 1.5 at step 80"),
    (4, "straggler", 0, 90, "rank 0 came last to 9 of the last 10 barriers"),
]

# The list as the test reads it, and a chart's marks: its lines and its annotations.
LIST = """
const t = document.getElementById('events-table');
return {note: document.getElementById('events-note').textContent, hidden: t.hidden,
        rows: [...t.querySelectorAll('tr[data-seq]')].map((r) => ({seq: Number(r.dataset.seq), kind: r.dataset.kind,
          cls: r.className, cells: [...r.children].map((c) => c.textContent)})),
        injected: t.querySelectorAll('img, script, [onerror]').length};
"""
MARKS = """
const c = window.chorus.charts.find((c) => c.title === arguments[0]);
if (!c || !c.g) return null;
const g = c.g;
return {lines: [...c.plot.querySelectorAll('.ev-line')].map((l) => ({kinds: l.dataset.kinds, seqs: l.dataset.seqs,
          cls: l.className, title: l.title, x: l.offsetLeft + 3})),
        notes: g.annotations().map((a) => ({series: a.series, x: a.x, text: a.text, cls: a.cssClass, short: a.shortText})),
        shown: [...c.plot.querySelectorAll('.dygraph-annotation.ev-note')].map((d) => ({title: d.title, cls: d.className})),
        axis: c.axisUsed};
"""


def listed(t, d, want, what):
    return t.wait_until(what, lambda: (lambda r: r if want(r) else None)(d.execute_script(LIST)))


def marks(t, d, title, want, what):
    t.drawn(d, title)
    return t.wait_until(what, lambda: (lambda m: m if m and want(m) else None)(d.execute_script(MARKS, title)))


def dom_x(d, title, x):
    """Where x lies on the chart `title`, in its plot's pixels."""
    return d.execute_script("const c = window.chorus.charts.find((c) => c.title === arguments[0]);"
                            "return c.g.toDomXCoord(arguments[1]);", title, x)


def kinds_of(m):
    return sorted(k for l in m["lines"] for k in l["kinds"].split())


def case_events(t, chorus, root, d):
    run = t.make_run(root, "mnist", "job-1", "ev1", name="ev1", state="running", ended=False, rows=120)
    path = os.path.join(run, "events.jsonl")
    t.write(path, "".join(event(t, *e) for e in FIRST))
    s = t.Serve(chorus, root)
    try:
        d.get(s.url + "#/run/mnist/job-1/ev1")
        r = listed(t, d, lambda r: len(r["rows"]) == 5, "five events listed")
        # The newest first: time, kind, rank, step, message; coloured by severity; the message as text.
        assert [x["seq"] for x in r["rows"]] == [4, 3, 2, 1, 0], r
        for x in r["rows"]:
            assert "ev-" + SEVERITY[x["kind"]] in x["cls"], x
        stalled = r["rows"][-1]["cells"]
        assert stalled[1:4] == ["stalled", "1", "40"] and stalled[4] == FIRST[0][4], stalled
        assert "<img src=x onerror=alert(1)> stays text" in r["rows"][2]["cells"][4] and r["injected"] == 0, r
        assert "5 events" in r["note"], r

        # They were asked for after the charts: every series request begun before them had its answer.
        timing = d.execute_script(
            "const all = performance.getEntriesByType('resource');"
            "const ev = all.filter((e) => e.name.includes('/api/run/events'));"
            "const before = all.filter((e) => e.name.includes('/api/series') && ev.length && e.startTime < ev[0].startTime);"
            "return {events: ev.length, series: before.length, late: before.filter((e) => e.responseEnd > ev[0].startTime).length};")
        assert timing["events"] >= 1 and timing["series"] >= 1 and timing["late"] == 0, timing

        # loss has no rank columns: every event with a step is a line at its step, coloured by severity.
        m = marks(t, d, "loss", lambda m: len(m["lines"]) == 5, "five lines on loss")
        assert kinds_of(m) == ["nonfinite", "resumed", "stalled", "straggler", "threshold"], m
        assert not m["shown"], m
        for line in m["lines"]:
            kind, seq = line["kinds"], int(line["seqs"])
            step = FIRST[seq][3]
            assert "ev-" + SEVERITY[kind] in line["cls"], line
            assert FIRST[seq][4] in line["title"] and f"step {step}" in line["title"], line
            assert abs(line["x"] - dom_x(d, "loss", step)) <= 1.5, (line, dom_x(d, "loss", step))

        # acc has a column per rank: an event of a rank is on its rank's series, the others lines.
        m = marks(t, d, "acc", lambda m: len(m["notes"]) == 3 and len(m["shown"]) == 3, "three annotations on acc")
        notes = sorted((n["series"], n["x"], n["short"]) for n in m["notes"])
        assert notes == [("acc/rank-0", 90, "G"), ("acc/rank-1", 40, "S"), ("acc/rank-1", 45, "R")], notes
        assert kinds_of(m) == ["nonfinite", "threshold"], m
        for n in m["notes"]:
            sev = SEVERITY[{"S": "stalled", "R": "resumed", "G": "straggler"}[n["short"]]]
            assert n["cls"] == "ev-note ev-" + sev, n
        assert any(FIRST[0][4] in x["title"] and "ev-bad" in x["cls"] for x in m["shown"]), m["shown"]
        d.execute_script("window.chorus.charts.find((c) => c.title === 'acc').el.scrollIntoView({block: 'center'})")
        # The progress chart (time into the run): each rank's on its series.
        p = marks(t, d, "progress: step over time", lambda m: len(m["notes"]) == 3, "the ranks' events on progress")
        assert sorted(n["series"] for n in p["notes"]) == ["rank 0", "rank 1", "rank 1"] and p["axis"] == "rel", p

        d.execute_script("document.getElementById('events-head').scrollIntoView(); window.scrollBy(0, -50);")
        time.sleep(0.4)
        d.save_screenshot("events.png")
        d.execute_script("window.chorus.charts.find((c) => c.title === 'acc').el.scrollIntoView({block: 'center'})")
        time.sleep(0.3)
        d.save_screenshot("events_charts.png")

        # Without the ranks' columns, acc's rank events are lines too.
        d.execute_script("document.getElementById('ranks').click()")
        m = marks(t, d, "acc", lambda m: len(m["lines"]) == 5 and not m["notes"], "acc's events as lines")
        d.execute_script("document.getElementById('ranks').click()")
        marks(t, d, "acc", lambda m: len(m["notes"]) == 3, "acc's annotations again")

        # Live: a rank fails, then the run ends (no step: listed, never marked).
        with open(path, "a") as f:
            f.write(event(t, 5, "rank_failed", 0, 110, "rank 0 failed: exit code 3", state="failed"))
            f.write(event(t, 6, "run_finished", None, None, "the run ended: failed", state="failed"))
        r = listed(t, d, lambda r: len(r["rows"]) == 7, "the new events listed")
        assert [x["seq"] for x in r["rows"]][:2] == [6, 5], r
        assert r["rows"][0]["cells"][1:4] == ["run_finished", "", ""], r
        m = marks(t, d, "acc", lambda m: len(m["notes"]) == 4, "rank 0's failure on its series")
        assert ("acc/rank-0", 110) in [(n["series"], n["x"]) for n in m["notes"]], m
        m = marks(t, d, "loss", lambda m: len(m["lines"]) == 6, "the failure on loss")
        assert "run_finished" not in kinds_of(m), m
        # A line being written is listed once it is whole.
        torn = event(t, 7, "barrier_timeout", None, 115, "barrier \"epoch-5\" timed out: rank 1 did not reach it", ranks=[1])
        with open(path, "a") as f:
            f.write(torn[:40])
        time.sleep(2)
        r = d.execute_script(LIST)
        assert len(r["rows"]) == 7, r
        assert "a line is being written" in r["note"], r
        with open(path, "a") as f:
            f.write(torn[40:])
        r = listed(t, d, lambda r: len(r["rows"]) == 8, "the whole line listed")
        assert r["rows"][0]["kind"] == "barrier_timeout" and "ev-bad" in r["rows"][0]["cls"], r
        d.execute_script("document.getElementById('events-head').scrollIntoView(); window.scrollBy(0, -50);")
        time.sleep(0.4)
        d.save_screenshot("events_live.png")
        errors = t.js_errors(d)
        assert not errors, errors
    finally:
        s.stop()
