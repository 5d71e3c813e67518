"""The cases of dashboard_test.py that check the page says only what is true of a run:

    laggards       ⚑ only on a rank that really holds the others back (real runs of
                   chorus_e2e_worker and chorus_e2e_barrier_worker under `chorus launch`,
                   and a live run whose rank logs its per-rank values every 25 steps)
    contributions  missing contributions only where a rank missed a reduced value, not
                   for a key that rank 0 logs alone (Reduce::first)
    nonfinite      NaN and ±Inf marked on the chart where they were logged, the line
                   broken there, and counted in the chart's status
    ticks          y tick labels distinct and in the quantity's unit (bytes, rates, %)
    smooth         a smoothed constant is drawn as exactly that constant
    summary        times in the summary as dates, other numbers to their last digit
    log_zeros      a log scale over zeros and negatives: no console error, the points
                   left out said so on the chart
    last_point     a downsampled chart draws the run's last step

Runs are made by the project's own binaries where a case needs what they do (barriers
timed by the run host), else written as the RunWriter writes them. `t` is
dashboard_test.py itself: its run files, server and browser helpers. Every case
fails on a console error.
"""
import json
import math
import os
import socket
import subprocess
import time

from selenium.webdriver.common.by import By


# ---------- runs ----------

def row_line(t, step, values, counts=None, start=None):
    """A history.jsonl line as the RunWriter writes it: _step, _timestamp, _runtime, the values (keys sorted;
    a NaN or an infinity as the text "NaN", "Infinity", "-Infinity"), then _count."""
    start = t.START if start is None else start
    row = {"_step": step, "_timestamp": round(start + step * 0.5 + 0.25, 6), "_runtime": round(step * 0.5 + 0.25, 6)}
    for k in sorted(values):
        v = values[k]
        if isinstance(v, float) and math.isnan(v):
            v = "NaN"
        elif isinstance(v, float) and math.isinf(v):
            v = "Infinity" if v > 0 else "-Infinity"
        row[k] = v
    if counts:
        row["_count"] = {k: counts[k] for k in sorted(counts)}
    return json.dumps(row, separators=(",", ":")) + "\n"


def written_run(t, root, project, group, run_id, rows, world=4, metrics=None, summary=None, state="finished",
                last_step=None, system=None):
    """A run directory as the run host leaves it: run.json, history.jsonl (`rows`: the lines), metrics.json,
    config.json, summary.json and, given, system.jsonl."""
    d = os.path.join(root, project, group, run_id)
    last = len(rows) - 1 if last_step is None else last_step
    record = json.loads(t.run_json(run_id, run_id, project, group, state=state, world=world, last_step=last,
                                   ended=state != "running"))
    record["rows"] = len(rows)
    if state == "running":
        # run.json learns a rank's last step when it ends: a running rank's reads -1 until then.
        for k in record["ranks"]:
            k["last_step"] = -1
    t.write(os.path.join(d, "run.json"), json.dumps(record) + "\n")
    t.write(os.path.join(d, "history.jsonl"), "".join(rows))
    t.write(os.path.join(d, "metrics.json"), json.dumps(metrics or {}, separators=(",", ":")) + "\n")
    t.write(os.path.join(d, "config.json"), json.dumps({"optimizer": "adam"}))
    t.write(os.path.join(d, "summary.json"), json.dumps(summary if summary is not None else {"_step": last}))
    if system:
        t.write(os.path.join(d, "system.jsonl"), "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in system))
    return d


def declared(reduce):
    return {"reduce": reduce, "summary": "last", "step_metric": None}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dirs(root):
    out = set()
    for d, _, files in os.walk(root):
        if "run.json" in files:
            out.add(d)
    return out


def launch(chorus, root, n, program, *args):
    """Runs `program args` as `n` ranks under `chorus launch`, their run under `root`; its directory."""
    before = run_dirs(root)
    env = dict(os.environ, CHORUS_DIR=root)
    p = subprocess.run([chorus, "launch", "-n", str(n), "--master-port", str(free_port()), "--", program, *args],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=150)
    assert p.returncode == 0, f"chorus launch {program} exited {p.returncode}:\n{p.stdout[-4000:]}"
    new = run_dirs(root) - before
    assert len(new) == 1, (new, p.stdout[-2000:])
    return new.pop()


def rel(root, d):
    return os.path.relpath(d, root)


# ---------- the page ----------

def no_errors(t, d):
    errors = t.js_errors(d)
    assert not errors, errors


def open_run(t, d, s, path, title=None):
    d.get(s.url + "#/run/" + path)
    t.wait_until(f"the page of {path}", lambda: d.find_elements(By.CSS_SELECTOR, "#ranks-table tr[data-rank]"))
    if title:
        return t.drawn(d, title)


def y_labels(d, title):
    return d.execute_script("const c = window.chorus.charts.find((c) => c.title === arguments[0]);"
                            "return c && c.g ? [...c.plot.querySelectorAll('.dygraph-axis-label-y')].map((e) => e.textContent)"
                            "  : null;", title)


def column(d, title, label):
    """The chart's drawn rows as [x, value of the series `label`] (NaN as the text 'NaN')."""
    return d.execute_script(
        "const c = window.chorus.charts.find((c) => c.title === arguments[0]); const g = c.g;"
        "const i = g.getLabels().indexOf(arguments[1]); const out = [];"
        "for (let r = 0; r < g.numRows(); r++) { const v = g.getValue(r, i);"
        "  out.push([+g.getValue(r, 0), Number.isNaN(v) ? 'NaN' : v]); }"
        "return out;", title, label)


def show(d, title):
    d.execute_script("const c = window.chorus.charts.find((c) => c.title === arguments[0]);"
                     "if (c) c.el.scrollIntoView({block: 'center'});", title)
    time.sleep(0.4)


# ---------- 1. laggards ----------

LAGGARDS = """
const marked = (sel) => [...document.querySelectorAll(sel)].map((r) => Number(r.dataset.rank));
return {ranks: marked('#ranks-table tr[data-rank]'), flagged: marked('#ranks-table tr.laggard'),
        totals: marked('#barrier-totals tr.laggard'), flags: [...document.querySelectorAll('#ranks-table td.lag')]
          .map((c) => c.textContent).filter(Boolean),
        barriers: document.querySelectorAll('#barrier-waits tr').length - 1};
"""


def laggards(t, d, s, path, ranks):
    d.get(s.url + "#/run/" + path)
    return t.wait_until(f"the ranks of {path}", lambda: (lambda x: x if len(x["ranks"]) == ranks else None)(
        d.execute_script(LAGGARDS)))


def caused(run_dir):
    """Per rank, the others' waits it caused at barriers.jsonl's barriers (as io::BarrierLog::read adds them up)."""
    out = {}
    with open(os.path.join(run_dir, "barriers.jsonl")) as f:
        for line in f:
            b = json.loads(line)
            came = [k for k in b["ranks"] if k["arrived"] is not None]
            if len(came) < 2:
                continue
            last = max(k["arrived"] for k in came)
            for k in came:
                if k["arrived"] == last:
                    out[k["rank"]] = out.get(k["rank"], 0) + sum(last - o["arrived"] for o in came if o is not k)
    return out


def case_laggards(t, chorus, root, d, bins):
    # Healthy: four ranks of 120 steps, a barrier every 10; whoever comes last does so by jitter.
    healthy = launch(chorus, root, 4, bins["worker"], "--steps", "120", "--barrier-every", "10", "--step-us", "2000")
    waits = caused(healthy)
    assert waits and max(waits.values()) > 0, waits  # some rank did come last: there is something not to flag
    # Slowed: rank 2 reaches the first barrier 2.5 s after the others.
    marker = os.path.join(root, "late")
    os.makedirs(marker)
    slowed = launch(chorus, root, 4, bins["barrier_worker"], "--dir", marker, "--late-rank", "2", "--late-ms", "2500")
    # Live: rank 3 logs its per-rank values every 25 steps only; every rank is past the last committed row.
    rows = []
    for step in range(200):
        values = {"loss": 1 / (1 + step)}
        values.update({f"grad_norm/rank-{r}": 1.0 + r for r in range(3)})
        if step % 25 == 0:
            values["eval/rank-3"] = 0.5
        rows.append(row_line(t, step, values, {"loss": 4}))
    written_run(t, root, "lag", "job-3", "sparse", rows, world=4, metrics={"loss": declared("mean")}, state="running",
                summary={"_step": 199, "loss": 0.005})
    s = t.Serve(chorus, root)
    try:
        h = laggards(t, d, s, rel(root, healthy), 4)
        assert h["barriers"] >= 10, h
        assert h["flagged"] == [] and h["totals"] == [] and h["flags"] == [], (h, waits)
        d.execute_script("document.getElementById('barriers').scrollIntoView()")
        time.sleep(0.3)
        d.save_screenshot("laggards_healthy.png")
        no_errors(t, d)

        w = laggards(t, d, s, rel(root, slowed), 4)
        assert w["flagged"] == [2] and w["totals"] == [2], w
        assert len(w["flags"]) == 1 and "the others waited" in w["flags"][0], w
        d.execute_script("document.getElementById('barriers').scrollIntoView()")
        time.sleep(0.3)
        d.save_screenshot("laggards_slowed.png")
        no_errors(t, d)

        x = laggards(t, d, s, "lag/job-3/sparse", 4)
        assert x["flagged"] == [] and x["flags"] == [], x
        d.save_screenshot("laggards_sparse.png")
        no_errors(t, d)
    finally:
        s.stop()


# ---------- 2. missing contributions ----------

CONTRIB = "contributions: fewest ranks behind a reduced value"


def missing(d):
    """The x of the points marked as missing contributions."""
    return [x for x, v in column(d, CONTRIB, "missing contributions") if v is not None and v != "NaN"]


def case_contributions(t, chorus, root, d, bins):
    metrics = {"loss": declared("mean"), "lr": declared("first")}
    def rows(short_at=()):
        out = []
        for step in range(100):
            out.append(row_line(t, step, {"loss": 2 * math.exp(-step / 30), "lr": 0.001},
                                {"loss": 3 if step in short_at else 4, "lr": 1}))
        return out
    written_run(t, root, "contrib", "job-1", "whole", rows(), metrics=metrics)
    written_run(t, root, "contrib", "job-1", "short", rows(short_at=(37, 38)), metrics=metrics)
    # The sample trainer: rank 0 logs lr (Reduce::first) alone at each epoch's end, every rank its loss.
    ddp = None
    if bins.get("ddp_train"):
        ddp = launch(chorus, root, 4, bins["ddp_train"], "--epochs", "4", "--steps-per-epoch", "30", "--val-size", "256")
    else:
        print("contributions: no ddp_train (built with Gloo only): its run left out", flush=True)
    s = t.Serve(chorus, root)
    try:
        for path in ["contrib/job-1/whole"] + ([rel(root, ddp)] if ddp else []):
            open_run(t, d, s, path)
            t.drawn(d, CONTRIB)
            show(d, CONTRIB)
            gone = missing(d)
            d.save_screenshot("contributions_whole.png" if path.endswith("whole") else "contributions_ddp_train.png")
            assert gone == [], (path, gone)
            no_errors(t, d)
        open_run(t, d, s, "contrib/job-1/short")
        t.drawn(d, CONTRIB)
        show(d, CONTRIB)
        d.save_screenshot("contributions_short.png")
        assert missing(d) == [37, 38], missing(d)
        no_errors(t, d)
    finally:
        s.stop()


# ---------- 3. NaN and infinities ----------

MARKS = """
const c = window.chorus.charts.find((c) => c.title === arguments[0]);
if (!c || !c.g) return null;
const area = c.g.getArea();
return {status: c.status.textContent, area: [area.y, area.y + area.h],
        marks: [...c.plot.querySelectorAll('.nf-mark')].map((m) => ({kind: m.dataset.kind, x: Number(m.dataset.x),
          series: m.dataset.series, text: m.textContent, title: m.title, left: m.offsetLeft, top: m.offsetTop,
          height: m.offsetHeight, box: m.firstChild.getBoundingClientRect().top - c.g.graphDiv.getBoundingClientRect().top,
          boxBottom: m.firstChild.getBoundingClientRect().bottom - c.g.graphDiv.getBoundingClientRect().top,
          visible: m.firstChild.getBoundingClientRect().height > 0}))};
"""


def case_nonfinite(t, chorus, root, d, bins):
    odd = {40: float("nan"), 70: float("inf"), 90: float("-inf")}
    rows = [row_line(t, step, {"loss": odd.get(step, 1.0 + math.sin(step / 9)), "acc": step / 120}, {"acc": 2, "loss": 2})
            for step in range(120)]
    written_run(t, root, "odd", "job-1", "nf", rows, world=2, metrics={"loss": declared("mean"), "acc": declared("mean")})
    s = t.Serve(chorus, root)
    try:
        open_run(t, d, s, "odd/job-1/nf", "loss")
        show(d, "loss")
        m = t.wait_until("loss's status", lambda: (lambda m: m if m and "points" in m["status"] else None)(
            d.execute_script(MARKS, "loss")))
        d.save_screenshot("nonfinite.png")
        assert "117 points, 1 NaN, 1 +Inf, 1 −Inf" in m["status"], m["status"]
        kinds = sorted((k["kind"], k["x"], k["text"]) for k in m["marks"])
        assert kinds == [("-inf", 90, "−Inf"), ("inf", 70, "+Inf"), ("nan", 40, "NaN")], m["marks"]
        top, bottom = m["area"]
        for k in m["marks"]:
            assert k["visible"] and k["series"] == "loss" and f"step {k['x']}" in k["title"], k
            px = d.execute_script("return window.chorus.charts.find((c) => c.title === 'loss').g.toDomXCoord(arguments[0])", k["x"])
            assert abs(k["left"] - px) <= 1.5, (k, px)
            if k["kind"] == "inf":
                assert abs(k["box"] - top) <= 2, (k, top)
            elif k["kind"] == "-inf":
                assert abs(k["boxBottom"] - bottom) <= 2, (k, bottom)
            else:
                assert k["height"] >= (bottom - top) - 2, (k, top, bottom)
        # Beside its title, the run's count of them in all (/api/run's key list).
        odd_note = d.execute_script("return window.chorus.charts.find((c) => c.title === 'loss').oddNote.textContent")
        assert odd_note.strip() == "1 NaN, 2 ±Inf in the run", odd_note
        # The line breaks there: dygraphs is given a gap (NaN) at each, not a bridge over it.
        drawn = dict((x, v) for x, v in column(d, "loss", "loss"))
        for x in odd:
            assert drawn.get(x) == "NaN", (x, drawn.get(x))
        assert drawn[39] == 1.0 + math.sin(39 / 9) and drawn[41] == 1.0 + math.sin(41 / 9), drawn
        # Zoomed in past the NaN, its mark goes with it.
        d.execute_script("const c = window.chorus.charts.find((c) => c.title === 'loss'); c.g.updateOptions({dateWindow: [60, 119]});")
        t.wait_until("the NaN's mark off the zoomed chart", lambda: sorted(
            k["kind"] for k in d.execute_script(MARKS, "loss")["marks"]) == ["-inf", "inf"])
        no_errors(t, d)
    finally:
        s.stop()


# ---------- 4. tick labels ----------

def case_ticks(t, chorus, root, d, bins):
    system = []
    for i in range(60):
        ts = t.START + 10 * i
        system.append({"_timestamp": round(ts, 6), "_runtime": float(10 * i), "_node": 0, "_rank": 0,
                       "system.cpu.percent/node-0": 40 + (i % 7) * 0.15,
                       "system.memory.used_bytes/node-0": 1_000_000_000 + i * 1_000_000,
                       "system.network.rx_bytes_per_s/node-0": 1.0e9 + (i % 5) * 2.0e7,
                       "system.proc.memory.rss_bytes/rank-0": 21_315_584 + (i % 4) * 4096})
    rows = [row_line(t, step, {"tokens_seen": 1_000_000_000 + step * 10, "samples_per_sec/rank-0": 12000 + (step % 9) * 60,
                               "loss": 1 / (1 + step)}, {"loss": 1, "tokens_seen": 1}) for step in range(60)]
    written_run(t, root, "units", "job-1", "u1", rows, world=1, system=system,
                metrics={"loss": declared("mean"), "tokens_seen": declared("sum")})
    brief = [{"_timestamp": round(t.START + at, 6), "_runtime": at, "_node": 0, "_rank": r,
              f"system.proc.cpu.percent/rank-{r}": 10.5 + r, f"system.proc.memory.rss_bytes/rank-{r}": 20_688_896 + r * 4096}
             for r, at in enumerate([0.000667, 0.001002, 0.001765, 0.002684])]
    written_run(t, root, "units", "job-1", "u2", [row_line(t, 0, {"loss": 1.0}, {"loss": 4})], world=4, system=brief,
                metrics={"loss": declared("mean")})
    # Each chart: what its labels end with.
    want = {"memory.used_bytes": ("MiB", "GiB"), "network.rx_bytes_per_s": ("MiB/s", "GiB/s"), "cpu.percent": ("%",),
            "proc.memory.rss_bytes": ("MiB", "KiB"), "samples_per_sec": ("/s",), "tokens_seen": None}
    s = t.Serve(chorus, root)
    try:
        open_run(t, d, s, "units/job-1/u1")
        for title, ends in want.items():
            t.drawn(d, title)
            show(d, title)
            labels = t.wait_until(f"{title}'s y labels", lambda: y_labels(d, title))
            assert len(labels) >= 3, (title, labels)
            assert len(set(labels)) == len(labels), (title, labels)
            if ends:
                assert all(l.endswith(ends) for l in labels), (title, labels)
            else:
                # A plain count around 1e9 that moves by 10 a step: every label its own number, to the unit.
                assert all(abs(float(l) - round(float(l))) < 1e-9 for l in labels) or all("e" in l for l in labels), labels
            d.save_screenshot(f"ticks_{title.replace('.', '_').replace('/', '_')}.png")
        no_errors(t, d)
        # A run of a few seconds: each rank's first sample a millisecond or two into the run, as the sampler
        # takes them; time into the run is labelled to the digit that tells them apart.
        open_run(t, d, s, "units/job-1/u2", "proc.cpu.percent")
        show(d, "proc.cpu.percent")
        x = d.execute_script("const c = window.chorus.charts.find((c) => c.title === 'proc.cpu.percent');"
                             "return [...c.plot.querySelectorAll('.dygraph-axis-label-x')].map((e) => e.textContent);")
        d.save_screenshot("ticks_time_into_the_run.png")
        assert len(x) >= 3 and len(set(x)) == len(x), x
        no_errors(t, d)
    finally:
        s.stop()


# ---------- 5. a smoothed constant ----------

def case_smooth(t, chorus, root, d, bins):
    rows = [row_line(t, step, {"lr": 0.001, "loss": 2 * math.exp(-step / 80)}, {"loss": 4, "lr": 1}) for step in range(400)]
    written_run(t, root, "smooth", "job-1", "s1", rows, metrics={"loss": declared("mean"), "lr": declared("first")})
    s = t.Serve(chorus, root)
    try:
        open_run(t, d, s, "smooth/job-1/s1", "lr")
        for w in (0.6, 0.9, 0.99):
            d.execute_script(f"const s = document.getElementById('smooth'); s.value = {w}; s.dispatchEvent(new Event('input'));")
            t.wait_until(f"the smoothing at {w}", lambda: d.find_element(By.ID, "smooth-value").text == str(w))
            values = [v for _, v in column(d, "lr", "lr")]
            assert len(values) == 400 and set(values) == {0.001}, (w, sorted(set(values))[:5])
            # loss is smoothed indeed.
            loss = [v for _, v in column(d, "loss", "loss")]
            assert loss[10] != 2 * math.exp(-10 / 80), loss[:12]
        show(d, "lr")
        d.save_screenshot("smooth_constant.png")
        labels = y_labels(d, "lr")
        assert labels and len(set(labels)) == len(labels), labels
        no_errors(t, d)
    finally:
        d.execute_script("const s = document.getElementById('smooth'); s.value = 0; s.dispatchEvent(new Event('input'));")
        s.stop()


# ---------- 6. the summary's numbers ----------

def case_summary(t, chorus, root, d, bins):
    ts = 1795817912.66
    summary = {"_step": 199, "_runtime": 299.517, "_timestamp": ts, "loss": 0.123456789012345, "tokens": 123456789012,
               "val/accuracy": 0.98765432109876, "start_time": 1795817600.5}
    rows = [row_line(t, step, {"loss": 1.0}, {"loss": 1}) for step in range(200)]
    written_run(t, root, "sum", "job-1", "s1", rows, world=1, summary=summary)
    s = t.Serve(chorus, root)
    try:
        open_run(t, d, s, "sum/job-1/s1")
        cells = t.wait_until("the summary", lambda: d.execute_script(
            "const t = [...document.querySelectorAll('#overview h2')].find((h) => h.textContent === 'Summary');"
            "if (!t) return null; const out = {};"
            "for (const tr of t.parentNode.querySelectorAll('tr')) out[tr.firstChild.textContent] = "
            "  {text: tr.lastChild.textContent, title: tr.lastChild.title};"
            "return Object.keys(out).length ? out : null;"))
        d.execute_script("document.getElementById('overview').scrollIntoView()")
        d.save_screenshot("summary_numbers.png")
        lt = time.localtime(int(ts))
        assert cells["_timestamp"]["text"] == time.strftime("%Y-%m-%d %H:%M:%S", lt) + ".660", cells["_timestamp"]
        assert cells["_timestamp"]["title"] == "1795817912.66", cells["_timestamp"]
        assert cells["start_time"]["text"] == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1795817600)) + ".500", cells
        assert cells["loss"]["text"] == "0.123456789012345", cells["loss"]
        assert cells["tokens"]["text"] == "123456789012", cells["tokens"]
        assert cells["val/accuracy"]["text"] == "0.98765432109876", cells
        assert cells["_runtime"]["text"] == "299.517" and cells["_step"]["text"] == "199", cells
        # The runs list shows them so too.
        d.get(s.url)
        text = t.wait_until("the runs list", lambda: (lambda r: r[0].text if r else None)(
            d.find_elements(By.CSS_SELECTOR, "#runs tr.run td.summary")))
        assert "loss=0.123456789012345" in text and "tokens=123456789012" in text, text
        assert "1795820000" not in text and "1.79582e+9" not in text, text
        no_errors(t, d)
    finally:
        s.stop()


# ---------- 7. a log scale over zeros ----------

def case_log_zeros(t, chorus, root, d, bins):
    rows = [row_line(t, step, {"grad_norm": 0.0 if step % 10 == 0 else 0.5 + step / 100,
                               "delta": math.sin(step / 7), "zeros": 0.0}, {"delta": 1, "grad_norm": 1, "zeros": 1})
            for step in range(100)]
    written_run(t, root, "log", "job-1", "l1", rows, world=1,
                metrics={k: declared("mean") for k in ("grad_norm", "delta", "zeros")})
    s = t.Serve(chorus, root)
    try:
        open_run(t, d, s, "log/job-1/l1", "grad_norm")
        for title in ("delta", "zeros"):
            show(d, title)
        t.wait_until("the three charts loaded", lambda: d.execute_script(
            "return ['grad_norm', 'delta', 'zeros'].every((k) => window.chorus.charts.find((c) => c.title === k).data)"))
        no_errors(t, d)
        d.execute_script("const l = document.getElementById('logscale'); if (!l.checked) l.click();")
        t.wait_until("grad_norm on a log scale", lambda: d.execute_script(
            "const c = window.chorus.charts.find((c) => c.title === 'grad_norm'); return c.g && c.g.getOption('logscale')"))
        time.sleep(0.5)
        no_errors(t, d)
        note = lambda title: d.execute_script(
            "const c = window.chorus.charts.find((c) => c.title === arguments[0]);"
            "const n = c.el.querySelector('.scale-note'); return n && !n.hidden ? n.textContent : '';", title)
        t.wait_until("grad_norm's note", lambda: "10 points at or below 0 left out" in note("grad_norm"))
        t.drawn(d, "grad_norm", rows=90)
        # The line breaks where a point is left out, rather than going straight across.
        g = dict((x, v) for x, v in column(d, "grad_norm", "grad_norm"))
        assert all(g[x] == "NaN" for x in range(0, 100, 10)) and g[11] == 0.5 + 11 / 100, g
        t.wait_until("delta's note", lambda: "left out" in note("delta"))
        t.wait_until("zeros said to have nothing to draw", lambda: "log scale" in d.execute_script(
            "const c = window.chorus.charts.find((c) => c.title === 'zeros'); return c.plot.textContent;"))
        show(d, "grad_norm")
        d.save_screenshot("log_zeros.png")
        time.sleep(0.5)
        no_errors(t, d)
        # Back to linear: every point again.
        d.execute_script("document.getElementById('logscale').click()")
        t.wait_until("grad_norm linear", lambda: note("grad_norm") == "" and t.drawn(d, "grad_norm", rows=100))
        t.drawn(d, "zeros", rows=100)
        no_errors(t, d)
    finally:
        d.execute_script("localStorage.removeItem('chorus.settings')")
        s.stop()


# ---------- 8. the last point ----------

def case_last_point(t, chorus, root, d, bins):
    # A key that alternates between 0 and 1, its last value between them: the smallest and the largest of every
    # pixel are other steps', so the last step is drawn only where it is kept as the last.
    steps = 3600
    rows = [row_line(t, step, {"loss": 0.5 if step == steps - 1 else float(step % 2)}, {"loss": 2}) for step in range(steps)]
    written_run(t, root, "long", "job-1", "l1", rows, world=2, metrics={"loss": declared("mean")})
    s = t.Serve(chorus, root)
    try:
        open_run(t, d, s, "long/job-1/l1", "loss")
        show(d, "loss")
        x = t.wait_until("loss drawn", lambda: (lambda x: x if x and x["rows"] > 100 else None)(t.x_of(d, "loss")))
        d.save_screenshot("last_point.png")
        assert "smallest and largest of each pixel" in x["status"], x  # downsampled indeed
        assert x["rows"] < steps, x
        drawn = column(d, "loss", "loss")
        assert drawn[-1] == [steps - 1, 0.5], drawn[-3:]
        assert x["last"] == steps - 1, x
        # So at another width of the chart too.
        d.set_window_size(1000, 1000)
        d.execute_script("window.chorus.charts.forEach((c) => c.reset())")
        t.wait_until("loss at another width", lambda: (lambda x: x and x["rows"] != len(drawn) and x["rows"] > 100)(t.x_of(d, "loss")))
        again = column(d, "loss", "loss")
        d.save_screenshot("last_point_narrow.png")
        assert again[-1] == [steps - 1, 0.5], again[-3:]
        no_errors(t, d)
    finally:
        s.stop()


CASES = {"laggards": case_laggards, "contributions": case_contributions, "nonfinite": case_nonfinite,
         "ticks": case_ticks, "smooth": case_smooth, "summary": case_summary, "log_zeros": case_log_zeros,
         "last_point": case_last_point}
